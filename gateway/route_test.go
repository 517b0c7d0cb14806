package gateway

import (
	"errors"
	"math/rand/v2"
	"net/url"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
)

func TestParseRoute(t *testing.T) {
	tests := []struct {
		name    string
		path    string // as sent on the request line
		want    Route
		wantErr bool
	}{
		{name: "a list", path: "/c1/api/v1/pods", want: Route{Cluster: "c1", Path: "/api/v1/pods", RawPath: "/api/v1/pods"}},
		{name: "cluster only", path: "/c1", want: Route{Cluster: "c1", Path: "/", RawPath: "/"}},
		{name: "cluster and slash", path: "/c1/", want: Route{Cluster: "c1", Path: "/", RawPath: "/"}},
		{name: "a cluster name with dots is one name", path: "/edge.eu-1/version", want: Route{Cluster: "edge.eu-1", Path: "/version", RawPath: "/version"}},
		{name: "escaped characters stay escaped", path: "/c1/api/v1/namespaces/a/configmaps/b%20c", want: Route{Cluster: "c1", Path: "/api/v1/namespaces/a/configmaps/b c", RawPath: "/api/v1/namespaces/a/configmaps/b%20c"}},
		{name: "traversal to another cluster", path: "/c1/../c2/api", wantErr: true},
		{name: "dot segment", path: "/c1/./api", wantErr: true},
		{name: "encoded traversal", path: "/c1/%2e%2e/c2/api", wantErr: true},
		{name: "upper-case encoded traversal", path: "/c1/%2E%2E/c2/api", wantErr: true},
		{name: "half-encoded traversal", path: "/c1/.%2e/c2", wantErr: true},
		{name: "encoded slash", path: "/c1%2F..%2Fc2/api", wantErr: true},
		{name: "encoded slash in the path", path: "/c1/api%2fv1", wantErr: true},
		{name: "backslash", path: `/c1/..\c2`, wantErr: true},
		{name: "encoded backslash", path: "/c1/..%5cc2", wantErr: true},
		{name: "NUL", path: "/c1/api%00", wantErr: true},
		{name: "control character", path: "/c1/api%0a", wantErr: true},
		{name: "double slash", path: "/c1//api", wantErr: true},
		{name: "no cluster", path: "/", wantErr: true},
		{name: "empty cluster", path: "//api", wantErr: true},
		{name: "dot-dot as the cluster", path: "/../api", wantErr: true},
		{name: "dot as the cluster", path: "/./api", wantErr: true},
		{name: "encoded cluster name", path: "/%63%31/api", wantErr: true},
		{name: "upper-case cluster name", path: "/C1/api", wantErr: true},
		{name: "cluster name with a leading dot", path: "/.c1/api", wantErr: true},
		{name: "cluster name with consecutive dots", path: "/a..b/api", wantErr: true},
		{name: "over-long cluster name", path: "/" + longName(254) + "/api", wantErr: true},
		{name: "upper-case encoded slash", path: "/c1/api%2Fv1", wantErr: true},
		{name: "encoded slash after another escape", path: "/c1/a%20b%2fc", wantErr: true},
		{name: "encoded NUL at the end", path: "/c1/api/%00", wantErr: true},
		{name: "a trailing slash after the path", path: "/c1/api/", want: Route{Cluster: "c1", Path: "/api/", RawPath: "/api/"}},
		{name: "a cluster name of 253 characters", path: "/" + longName(253) + "/api", want: Route{Cluster: longName(253), Path: "/api", RawPath: "/api"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// What net/http's server makes of the request line.
			u, err := url.ParseRequestURI(tt.path)
			if err != nil {
				t.Fatalf("the test's path %q does not parse: %v", tt.path, err)
			}
			got, err := ParseRoute(u)
			if tt.wantErr {
				if !errors.Is(err, ErrBadPath) {
					t.Fatalf("ParseRoute(%q) = %+v, %v; want ErrBadPath", tt.path, got, err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("ParseRoute(%q) = %+v, %v; want %+v", tt.path, got, err, tt.want)
			}
		})
	}
}

func longName(n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = 'a'
	}
	return string(b)
}

// TestClusterNameCheck holds the hand-written check of cluster names to
// validation.IsDNS1123Subdomain's verdict.
func TestClusterNameCheck(t *testing.T) {
	names := []string{"", "a", "c1", "edge.eu-1", "a-b", "-a", "a-", "a.-b", "a-.b", "a..b", ".a", "a.", "A", "a_b", "a b",
		"é", "0", "0-0", "a.b.c", longName(253), longName(254), "a\x00", "a/b", "a%2f"}
	rng := rand.New(rand.NewPCG(1, 2))
	const alphabet = "ab09-.A_/%"
	for range 20000 {
		b := make([]byte, 1+rng.IntN(8))
		for i := range b {
			b[i] = alphabet[rng.IntN(len(alphabet))]
		}
		names = append(names, string(b))
	}
	for _, name := range names {
		want := len(validation.IsDNS1123Subdomain(name)) == 0
		if got := isDNS1123Subdomain(name); got != want {
			t.Errorf("isDNS1123Subdomain(%q) = %v; validation says %v", name, got, want)
		}
	}
}
