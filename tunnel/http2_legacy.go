//go:build !(go1.27 && !http2legacy)

package tunnel

// errWrappedHTTP2 is nil: this build has golang.org/x/net's own HTTP/2
// client, whose GOAWAY and dead-connection reports the pool relies on
// (http2_wrapped.go says why the other one will not do).
var errWrappedHTTP2 error
