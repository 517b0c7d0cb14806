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
	if encodedSeparator(raw) {
		return bad("encoded slashes, backslashes and NUL are not allowed")
	}
	if strings.Contains(raw, `\`) {
		return bad("backslashes are not allowed")
	}
	// Every segment, without splitting the path into a new slice: this
	// runs for every request.
	first, _, _ := strings.Cut(raw[1:], "/")
	for segs := raw[1:]; ; {
		seg, after, more := strings.Cut(segs, "/")
		dec, err := url.PathUnescape(seg)
		if err != nil {
			return bad("a path segment is not valid percent-encoding")
		}
		switch {
		case dec == "." || dec == "..":
			return bad("dot segments are not allowed")
		case seg == "" && more:
			return bad("empty path segments are not allowed")
		case strings.ContainsFunc(dec, func(r rune) bool { return r < 0x20 || r == 0x7f }):
			return bad("control characters are not allowed")
		}
		if !more {
			break
		}
		segs = after
	}
	cluster, err := url.PathUnescape(first)
	if err != nil || cluster == "" {
		return bad("no cluster: the path is /<cluster>/<kubernetes path>")
	}
	if cluster != first {
		// A cluster name never needs escaping; an escaped one is a trick.
		return bad("the cluster name must not be percent-encoded")
	}
	if !isDNS1123Subdomain(cluster) {
		msgs := validation.IsDNS1123Subdomain(cluster)
		return bad(fmt.Sprintf("%q is not a cluster name: %s", cluster, strings.Join(msgs, "; ")))
	}
	rest := raw[1+len(first):]
	if rest == "" {
		rest = "/"
	}
	path, err := url.PathUnescape(rest)
	if err != nil {
		return bad("the path is not valid percent-encoding")
	}
	return Route{Cluster: cluster, Path: path, RawPath: rest}, nil
}

// encodedSeparator reports %2F, %5C or %00 in any case.
func encodedSeparator(raw string) bool {
	for i := 0; i+2 < len(raw); i++ {
		if raw[i] != '%' {
			continue
		}
		switch raw[i+1 : i+3] {
		case "2f", "2F", "5c", "5C", "00":
			return true
		}
	}
	return false
}

// isDNS1123Subdomain is validation.IsDNS1123Subdomain's verdict without
// its regular expression, for every request's cluster name: at most 253
// characters, dot-separated labels of lower-case letters, digits and
// '-', each starting and ending with a letter or digit.
func isDNS1123Subdomain(s string) bool {
	if len(s) == 0 || len(s) > validation.DNS1123SubdomainMaxLength {
		return false
	}
	alnum := func(c byte) bool { return 'a' <= c && c <= 'z' || '0' <= c && c <= '9' }
	for label := range strings.SplitSeq(s, ".") {
		if label == "" || !alnum(label[0]) || !alnum(label[len(label)-1]) {
			return false
		}
		for i := 1; i < len(label)-1; i++ {
			if c := label[i]; !alnum(c) && c != '-' {
				return false
			}
		}
	}
	return true
}
