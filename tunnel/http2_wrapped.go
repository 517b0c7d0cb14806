//go:build go1.27 && !http2legacy

package tunnel

import "errors"

// errWrappedHTTP2 is returned by New in a build that takes golang.org/x/net's
// HTTP/2 client as a wrapper around net/http's (x/net v0.60 and later on Go
// 1.27). That wrapper reports a GOAWAY to the pool only once the connection
// has closed, and after the entry may have moved on, so the pool would send
// requests to a connection that is going away and redial lost ones without
// its backoff. The build tag http2legacy keeps x/net's own client, with the
// same fixes; the Makefile, the Dockerfile and CI set it.
var errWrappedHTTP2 = errors.New("the tunnel pool needs golang.org/x/net's own HTTP/2 client: build with -tags http2legacy (make build and the Dockerfile do)")
