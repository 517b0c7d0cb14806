//go:build tools

// Package tools names the helm command this wrapper module builds.
package tools

import _ "helm.sh/helm/v4/cmd/helm"
