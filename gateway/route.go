// Package gateway is hubsync's access gateway: people and apps reach a
// managed cluster's API at https://<gateway>/<cluster>/<kubernetes path>
// through the cluster's warm tunnel, authenticated on the hub and
// impersonated on the managed cluster with a prefix. Every header, token
// and path a client sends is treated as hostile.
//
// May import tunnel, config and hub; never syncer or bus.
package gateway

import (
	"errors"
	"fmt"
	"net/url"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// Route is a request's target: the cluster, and the path (escaped form
// preserved) and query to send to the cluster's API server.
type Route struct {
	Cluster string
	// Path is the Kubernetes path, starting with "/" ("/" when the
	// request named only the cluster).
	Path string
	// RawPath is Path's escaped form, as the client sent it.
	RawPath string
}

// ErrBadPath is the class of every path the gateway refuses.
var ErrBadPath = errors.New("bad path")

// ParseRoute splits /<cluster>/<path> and refuses every path that could
// mean something else than it seems: encoded slashes or backslashes, dot
// segments (plain or percent-encoded), empty segments, control
// characters, and a cluster segment that is not a ManagedCluster name.
// The path is forwarded as the client escaped it, never re-decoded, so
// the managed API server sees exactly what was checked here.
func ParseRoute(u *url.URL) (Route, error) {
	raw := u.EscapedPath()
	bad := func(why string) (Route, error) {
		return Route{}, fmt.Errorf("%w: %s", ErrBadPath, why)
	}
	if !strings.HasPrefix(raw, "/") {
		return bad("the path must start with /<cluster>")
	}
	lower := strings.ToLower(raw)
	for _, enc := range []string{"%2f", "%5c", "%00"} {
		if strings.Contains(lower, enc) {
			return bad("encoded slashes, backslashes and NUL are not allowed")
		}
	}
	if strings.Contains(raw, `\`) {
		return bad("backslashes are not allowed")
	}
	segs := strings.Split(raw[1:], "/")
	for i, seg := range segs {
		dec, err := url.PathUnescape(seg)
		if err != nil {
			return bad("a path segment is not valid percent-encoding")
		}
		switch {
		case dec == "." || dec == "..":
			return bad("dot segments are not allowed")
		case seg == "" && i != len(segs)-1:
			return bad("empty path segments are not allowed")
		case strings.ContainsFunc(dec, func(r rune) bool { return r < 0x20 || r == 0x7f }):
			return bad("control characters are not allowed")
		}
	}
	cluster, err := url.PathUnescape(segs[0])
	if err != nil || cluster == "" {
		return bad("no cluster: the path is /<cluster>/<kubernetes path>")
	}
	if cluster != segs[0] {
		// A cluster name never needs escaping; an escaped one is a trick.
		return bad("the cluster name must not be percent-encoded")
	}
	if msgs := validation.IsDNS1123Subdomain(cluster); len(msgs) > 0 {
		return bad(fmt.Sprintf("%q is not a cluster name: %s", cluster, strings.Join(msgs, "; ")))
	}
	rest := "/" + strings.Join(segs[1:], "/")
	path, err := url.PathUnescape(rest)
	if err != nil {
		return bad("the path is not valid percent-encoding")
	}
	return Route{Cluster: cluster, Path: path, RawPath: rest}, nil
}
