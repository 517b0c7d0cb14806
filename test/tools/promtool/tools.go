//go:build tools

// Package promtool pins the promtool version the alert tests use; the file
// is never compiled, it only makes go mod tidy keep the command's
// dependencies. test/tools/build-promtool.sh builds the binary.
package promtool

import _ "github.com/prometheus/prometheus/cmd/promtool"
