//go:build tools

// Package tools pins the konnectivity (apiserver-network-proxy) proxy-server
// and agent so test/tools/build-konnectivity.sh can build them from the Go
// module proxy. Nothing imports this package; it only feeds go.mod/go.sum.
package tools

import (
	_ "sigs.k8s.io/apiserver-network-proxy/cmd/agent"
	_ "sigs.k8s.io/apiserver-network-proxy/cmd/server"
)
