package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/hubsync/hubsync/tunnel"
)

// TestGatewayRequests sends each request to the gateway and compares the
// whole header set of what reached the cluster, or checks that nothing
// did.
func TestGatewayRequests(t *testing.T) {
	w := newWorld(t)
	// What a client sends besides its credential, and what is forwarded
	// of it.
	plain := http.Header{"Accept": {"application/json"}, "User-Agent": {"kubectl/v1.35.4 (linux/amd64) kubernetes/abcdef0"}}
	with := func(h ...http.Header) http.Header {
		out := plain.Clone()
		for _, x := range h {
			for k, vs := range x {
				out[k] = append(out[k], vs...)
			}
		}
		return out
	}
	impersonated := with(http.Header{"Authorization": {"Bearer msa-token"}, "Impersonate-User": {"cluster:hub:alice"},
		"Impersonate-Group": {"cluster:hub:system:masters", "cluster:hub:team-a"}})
	passed := func(token string) http.Header { return with(bearer(token)) }

	tests := []struct {
		name        string
		path        string
		header      http.Header
		passThrough bool
		reviewErr   error
		hubKeysErr  bool
		code        int
		says        string
		forwarded   http.Header // the whole header set that reached the cluster; nil: nothing did
	}{
		{name: "hub identity is impersonated with the prefix", path: "/c1/api/v1/namespaces/a/pods?limit=5",
			header: with(bearer(w.hubToken)), code: 200, forwarded: impersonated},
		{name: "forwarding headers are not the client's to set", path: "/c1/api",
			header: with(bearer(w.hubToken), http.Header{"X-Forwarded-For": {"10.0.0.1"}, "Forwarded": {"for=10.0.0.1"}}),
			code:   200, forwarded: impersonated},
		{name: "a cluster's own token passes through, verified against its keys", path: "/c1/api/v1/pods", passThrough: true,
			header: with(bearer(w.c1Token)), code: 200, forwarded: passed(w.c1Token)},
		{name: "a hub OIDC token the hub accepts is impersonated, not passed", path: "/c1/api", passThrough: true,
			header: with(bearer(w.hubToken)), code: 200, forwarded: impersonated},

		// The hop-by-hop trick, on every path and in both modes.
		{name: "Connection names Authorization (pass-through)", path: "/c1/api/v1/namespaces", passThrough: true,
			header: with(bearer(w.selfSigned), http.Header{"Connection": {"keep-alive, Authorization"}}), code: 400, says: `names \"authorization\"`},
		{name: "Connection names Authorization (impersonation)", path: "/c1/api",
			header: with(bearer(w.hubToken), http.Header{"Connection": {"Authorization"}}), code: 400, says: "may name only keep-alive, close, upgrade and te"},
		{name: "Connection names Impersonate-User", path: "/c1/api",
			header: with(bearer(w.hubToken), http.Header{"Connection": {"close", "Impersonate-User"}}), code: 400},
		{name: "an upgrade whose Connection names Authorization", path: "/c1/api/v1/namespaces/a/pods/p/exec", passThrough: true,
			header: with(bearer(w.c1Token), http.Header{"Connection": {"Upgrade, Authorization"}, "Upgrade": {"websocket"}}), code: 400},
		{name: "Connection names a bad path's header too", path: "/c1/../c2/api",
			header: with(bearer(w.hubToken), http.Header{"Connection": {"X-Anything"}}), code: 400, says: "Connection header"},
		{name: "Connection with only allowed names", path: "/c1/api",
			header: with(bearer(w.hubToken), http.Header{"Connection": {"keep-alive, close, TE"}, "Te": {"trailers"}}),
			code:   200, forwarded: set(impersonated, "Te", "trailers")},

		// Identity headers a client sends.
		{name: "forged Impersonate-User", path: "/c1/api", header: with(bearer(w.hubToken), http.Header{"Impersonate-User": {"system:admin"}}),
			code: 403, says: "Impersonate-* headers are refused"},
		{name: "forged Impersonate-Group", path: "/c1/api", header: with(bearer(w.hubToken), http.Header{"Impersonate-Group": {"system:masters"}}), code: 403},
		{name: "forged Impersonate-Uid", path: "/c1/api", header: with(bearer(w.hubToken), http.Header{"Impersonate-Uid": {"0"}}), code: 403},
		{name: "forged Impersonate-Extra", path: "/c1/api", header: with(bearer(w.hubToken), http.Header{"Impersonate-Extra-Scopes": {"x"}}), code: 403},
		{name: "forged impersonation, lower case", path: "/c1/api", header: with(bearer(w.hubToken), http.Header{"impersonate-user": {"system:admin"}}), code: 403},
		{name: "forged impersonation on a pass-through token", path: "/c1/api", passThrough: true,
			header: with(bearer(w.c1Token), http.Header{"Impersonate-User": {"system:admin"}}), code: 403},
		{name: "request-header identity", path: "/c1/api", header: with(bearer(w.hubToken), http.Header{"X-Remote-User": {"admin"}}),
			code: 403, says: "X-Remote-* headers are refused"},
		{name: "request-header group", path: "/c1/api", passThrough: true, header: with(bearer(w.c1Token), http.Header{"X-Remote-Group": {"system:masters"}}), code: 403},
		{name: "token in a WebSocket subprotocol", path: "/c1/api/v1/namespaces/a/pods/p/exec", passThrough: true,
			header: with(bearer(w.c1Token), http.Header{"Sec-Websocket-Protocol": {"v5.channel.k8s.io, base64url.bearer.authorization.k8s.io.aHVi"}}),
			code:   401, says: "Sec-WebSocket-Protocol"},
		{name: "two Authorization headers", path: "/c1/api", header: with(http.Header{"Authorization": {"Bearer " + w.hubToken, "Bearer " + w.c1Token}}),
			code: 401, says: "more than one Authorization header"},
		{name: "two Authorization headers, two spellings", path: "/c1/api",
			header: with(bearer(w.hubToken), http.Header{"authorization": {"Bearer " + w.c1Token}}), code: 401, says: "more than one"},
		{name: "no token", path: "/c1/api", header: plain, code: 401, says: "no anonymous requests"},
		{name: "basic auth", path: "/c1/api", header: with(http.Header{"Authorization": {"Basic YTpi"}}), code: 401},
		{name: "hub identity without a username", path: "/c1/api", header: with(bearer("nameless-token-0123")), code: 401, says: "without a username"},

		// Credentials elsewhere in the request.
		{name: "access_token in the query", path: "/c1/api?access_token=anything", header: with(bearer(w.hubToken)), code: 400, says: "access_token"},
		{name: "the hub token in a query value", path: "/c1/api?labelSelector=" + w.hubToken, header: with(bearer(w.hubToken)), code: 400, says: "the URL carries a credential"},
		{name: "a JWT in a query value", path: "/c1/api?fieldSelector=x%3D" + w.expiredHub, header: with(bearer(w.hubToken)), code: 400},
		{name: "a base64 JWT in a query value", path: "/c1/api?x=" + base64.StdEncoding.EncodeToString([]byte(w.expiredHub)), header: with(bearer(w.hubToken)), code: 400},
		{name: "the hub token in the path", path: "/c1/api/v1/namespaces/" + w.hubToken, header: with(bearer(w.hubToken)), code: 400, says: "in the path"},
		{name: "the hub token in another header", path: "/c1/api", header: with(bearer(w.hubToken), http.Header{"X-Debug": {w.hubToken}}),
			code: 400, says: `the \"X-Debug\" header carries a bearer token`},
		{name: "the hub token base64 in another header", path: "/c1/api",
			header: with(bearer(w.hubToken), http.Header{"Cookie": {"s=" + base64.RawURLEncoding.EncodeToString([]byte(w.hubToken))}}), code: 400},
		{name: "a JWT in the user agent", path: "/c1/api", header: with(bearer(w.hubToken), http.Header{"User-Agent": {"x " + w.expiredHub}}), code: 400},
		{name: "a JWT right after other text", path: "/c1/api", header: with(bearer(w.hubToken), http.Header{"X-Data": {"abc" + w.expiredHub}}), code: 400},
		{name: "a base64url JWT one byte off the grid in a header", path: "/c1/api",
			header: with(bearer(w.hubToken), http.Header{"X-Data": {"q" + base64.RawURLEncoding.EncodeToString([]byte(w.expiredHub))}}), code: 400},
		{name: "a base64 JWT two bytes off the grid in a header", path: "/c1/api",
			header: with(bearer(w.hubToken), http.Header{"X-Data": {"qq" + base64.StdEncoding.EncodeToString([]byte(w.expiredHub))}}), code: 400},
		{name: "a base64url JWT three bytes off the grid in the query", path: "/c1/api?x=qqq" + base64.RawURLEncoding.EncodeToString([]byte(w.expiredHub)),
			header: with(bearer(w.hubToken)), code: 400, says: "the URL carries a credential"},
		{name: "a base64url JWT in a service-proxy path", path: "/c1/api/v1/namespaces/a/services/s:80/proxy/" + base64.RawURLEncoding.EncodeToString([]byte(w.expiredHub)),
			header: with(bearer(w.hubToken)), code: 400, says: "in the path"},
		{name: "a base64 JWT off the grid after a path's segments", path: "/c1/api/v1/namespaces/a/services/s/proxy/x" + base64.RawStdEncoding.EncodeToString([]byte(w.expiredHub)),
			header: with(bearer(w.hubToken)), code: 400, says: "in the path"},
		{name: "a long base64 path segment holding no token", path: "/c1/api/v1/namespaces/a/configmaps/" + base64.RawURLEncoding.EncodeToString([]byte(strings.Repeat("not a token. ", 8))),
			header: with(bearer(w.hubToken)), code: 200, forwarded: impersonated},

		// Identity headers of other authenticating proxies.
		{name: "X-Forwarded-User", path: "/c1/api", header: with(bearer(w.hubToken), http.Header{"X-Forwarded-User": {"admin"}}),
			code: 403, says: "an authenticating proxy's identity headers"},
		{name: "X-Auth-Request-Groups", path: "/c1/api", passThrough: true, header: with(bearer(w.c1Token), http.Header{"X-Auth-Request-Groups": {"system:masters"}}), code: 403},
		{name: "Remote-User", path: "/c1/api", header: with(bearer(w.hubToken), http.Header{"Remote-User": {"admin"}}), code: 403},

		// Tokens and who signed them.
		{name: "a self-signed JWT gets 401 from the gateway", path: "/c1/api", passThrough: true,
			header: with(bearer(w.selfSigned)), code: 401, says: `not signed by the service-account keys of cluster \"c1\"`},
		{name: "the same for a cluster that does not exist", path: "/nowhere/api", passThrough: true,
			header: with(bearer(w.selfSigned)), code: 401, says: `not signed by the service-account keys of cluster \"nowhere\"`},
		{name: "one cluster's token is not another's", path: "/c2/api", passThrough: true, header: with(bearer(w.c1Token)), code: 401},
		{name: "an expired cluster token", path: "/c1/api", passThrough: true, header: with(bearer(w.expiredC1)), code: 401, says: "expired"},
		{name: "pass-through off", path: "/c1/api", header: with(bearer(w.c1Token)), code: 401, says: "does not recognise"},
		{name: "expired hub token is never forwarded", path: "/c1/api", passThrough: true,
			header: with(bearer(w.expiredHub)), code: 401, says: "hub tokens are never forwarded"},
		{name: "a hub OIDC issuer is never forwarded", path: "/c1/api", passThrough: true, header: with(bearer(w.oidc)), code: 401},
		{name: "opaque unknown token", path: "/c1/api", passThrough: true,
			header: with(bearer("abcdef.0123456789abcdef")), code: 401, says: "only a managed cluster's JWT"},
		{name: "hub keys unavailable", path: "/c1/api", passThrough: true, hubKeysErr: true, header: with(bearer(w.c1Token)), code: 503},
		{name: "TokenReview unavailable", path: "/c1/api", reviewErr: errors.New("connection refused"),
			header: with(bearer(w.hubToken)), code: 503, says: "TokenReview could not be reached"},

		// Paths.
		{name: "dot-dot to another cluster", path: "/c1/../c2/api", header: with(bearer(w.hubToken)), code: 400},
		{name: "encoded slash", path: "/c1%2Fc2/api", header: with(bearer(w.hubToken)), code: 400},
		{name: "encoded dot-dot", path: "/c1/%2e%2e/c2/api", header: with(bearer(w.hubToken)), code: 400},
		{name: "unknown cluster", path: "/c9/api", header: with(bearer(w.hubToken)), code: 404, says: "not served"},
		{name: "dotted cluster name is one cluster", path: "/c1.example/api", header: with(bearer(w.hubToken)), code: 404, says: `c1.example\"`},
		{name: "failing cluster", path: "/down/api", header: with(bearer(w.hubToken)), code: 503, says: "failing: dial: no agent"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pool := w.pool()
			keys := w.hubKeys()
			if tt.hubKeysErr {
				keys.Fetch = func(context.Context) ([]byte, error) { return nil, errors.New("forbidden") }
			}
			rev := w.reviewer()
			rev.err = tt.reviewErr
			g, err := New(configured(Options{Pool: pool, Reviewer: rev, HubKeys: keys, HubIssuers: []string{"https://dex.example"}, PassThrough: tt.passThrough}))
			if err != nil {
				t.Fatal(err)
			}
			rec := serve(g, http.MethodGet, tt.path, tt.header)
			if rec.Code != tt.code || !strings.Contains(rec.Body.String(), tt.says) {
				t.Fatalf("%d %s; want %d saying %q", rec.Code, rec.Body, tt.code, tt.says)
			}
			if tt.code >= 400 && !strings.Contains(rec.Body.String(), `"kind":"Status"`) {
				t.Errorf("the refusal is not a Kubernetes Status: %s", rec.Body)
			}
			if tt.code == 503 && rec.Header().Get("Retry-After") == "" {
				t.Errorf("503 without Retry-After")
			}
			got := pool.requests()
			if tt.forwarded == nil {
				if len(got) != 0 {
					t.Fatalf("forwarded %d requests; want none", len(got))
				}
				return
			}
			if len(got) != 1 {
				t.Fatalf("forwarded %d requests; want 1", len(got))
			}
			out := got[0]
			if !reflect.DeepEqual(out.Header, tt.forwarded) {
				t.Errorf("forwarded headers\n got %v\nwant %v", out.Header, tt.forwarded)
			}
			path, query, _ := strings.Cut(strings.TrimPrefix(tt.path, "/c1"), "?")
			if out.URL.Path != path || out.URL.RawQuery != query || out.URL.Host != "c1" || out.URL.User != nil {
				t.Errorf("forwarded URL %s; want https://c1%s?%s", out.URL, path, query)
			}
			for _, f := range pool.keyFetches() {
				if want := (http.Header{"Accept": {"application/jwk-set+json, application/json"}, "Authorization": {"Bearer msa-token"}}); !reflect.DeepEqual(f.Header, want) {
					t.Errorf("key fetch headers %v; want %v", f.Header, want)
				}
			}
		})
	}
}

// TestGatewayNoReviewForClusterTokens: a cluster's own token costs no hub
// TokenReview, and its key set is fetched once.
func TestGatewayNoReviewForClusterTokens(t *testing.T) {
	w := newWorld(t)
	pool, rev := w.pool(), w.reviewer()
	g, err := New(configured(Options{Pool: pool, Reviewer: rev, HubKeys: w.hubKeys(), PassThrough: true}))
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		if rec := serve(g, http.MethodGet, "/c1/api", bearer(w.c1Token)); rec.Code != 200 {
			t.Fatalf("%d %s", rec.Code, rec.Body)
		}
	}
	if n := rev.reviews(); n != 0 {
		t.Fatalf("%d TokenReviews for a cluster's own token; want 0", n)
	}
	if n := len(pool.keyFetches()); n != 1 {
		t.Fatalf("c1's keys fetched %d times; want 1", n)
	}
}

func TestGatewayNotServingReplica(t *testing.T) {
	w := newWorld(t)
	pool := w.pool()
	g, err := New(configured(Options{Pool: pool, Reviewer: w.reviewer(), Serving: func() (bool, string) { return false, "it is a standby" }}))
	if err != nil {
		t.Fatal(err)
	}
	rec := serve(g, http.MethodGet, "/c1/api", bearer(w.hubToken))
	if rec.Code != 503 || !strings.Contains(rec.Body.String(), "standby") || len(pool.requests()) != 0 {
		t.Fatalf("code %d body %s forwarded %d; want 503 saying standby, nothing forwarded", rec.Code, rec.Body, len(pool.requests()))
	}
}

func TestGatewayReviewCacheTTL(t *testing.T) {
	now := time.Unix(1000, 0)
	rev := &mapReviewer{ids: map[string]Identity{"token-t-0123": {Username: "a"}}}
	pool := newWorld(t).pool()
	g, err := New(configured(Options{Pool: pool, Reviewer: rev, ReviewCacheTTL: 2 * time.Second, RefusalCacheTTL: time.Second, Now: func() time.Time { return now }}))
	if err != nil {
		t.Fatal(err)
	}
	do := func() int { return serve(g, http.MethodGet, "/c1/api", bearer("token-t-0123")).Code }
	if do() != 200 || do() != 200 || rev.reviews() != 1 {
		t.Fatalf("two requests: %d reviews; want 1 (cached)", rev.reviews())
	}
	delete(rev.ids, "token-t-0123") // revoked on the hub
	if do() != 200 {
		t.Fatal("within the TTL the cached review answers")
	}
	now = now.Add(2 * time.Second)
	if c := do(); c != 401 {
		t.Fatalf("after the TTL: %d; want 401", c)
	}
	if c := do(); c != 401 || rev.reviews() != 2 {
		t.Fatalf("a refusal is remembered for RefusalCacheTTL: %d reviews; want 2", rev.reviews())
	}
	now = now.Add(time.Second)
	if c := do(); c != 401 || rev.reviews() != 3 {
		t.Fatalf("after RefusalCacheTTL the hub is asked again: %d reviews; want 3", rev.reviews())
	}
}

func TestGatewayForwardGroups(t *testing.T) {
	w := newWorld(t)
	pool := w.pool()
	g, err := New(configured(Options{Pool: pool, ForwardGroups: []string{"team-a", "system:authenticated"},
		Reviewer: &mapReviewer{ids: map[string]Identity{"token-t-0123": {Username: "a", Groups: []string{"system:masters", "team-a", "system:authenticated"}}}}}))
	if err != nil {
		t.Fatal(err)
	}
	serve(g, http.MethodGet, "/c1/api", bearer("token-t-0123"))
	got := pool.requests()
	if len(got) != 1 {
		t.Fatalf("forwarded %d; want 1", len(got))
	}
	if gr := strings.Join(got[0].Header.Values("Impersonate-Group"), ","); gr != "cluster:hub:team-a,cluster:hub:system:authenticated" {
		t.Fatalf("groups %q; want only the allowed ones, prefixed", gr)
	}
}

// TestGatewayTrailers: a request that declares trailers is refused on a
// real server, before anything is sent.
func TestGatewayTrailers(t *testing.T) {
	w := newWorld(t)
	pool := w.pool()
	g, err := New(configured(Options{Pool: pool, Reviewer: w.reviewer()}))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(g)
	defer srv.Close()
	for _, trailer := range []string{"Authorization", "Impersonate-User", "X-Anything"} {
		resp := rawHTTP1(t, srv.Listener.Addr().String(), "POST /c1/api/v1/namespaces/a/configmaps HTTP/1.1\r\nHost: gw\r\n"+
			"Authorization: Bearer "+w.hubToken+"\r\nTrailer: "+trailer+"\r\nTransfer-Encoding: chunked\r\n\r\n"+
			"2\r\n{}\r\n0\r\n"+trailer+": Bearer "+w.c1Token+"\r\n\r\n")
		if resp.StatusCode != 400 {
			t.Errorf("trailer %s: %d; want 400", trailer, resp.StatusCode)
		}
	}
	if n := len(pool.requests()); n != 0 {
		t.Fatalf("%d requests with trailers reached the cluster", n)
	}
}

// rawHTTP1 sends raw bytes over a new connection and reads one response.
func rawHTTP1(t testing.TB, addr, raw string) *http.Response {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	if _, err := io.WriteString(conn, raw); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp
}

// TestGatewaySlowBody: a client that stops sending its body is cut off
// after BodyTimeout with a 408, on a real HTTP server.
func TestGatewaySlowBody(t *testing.T) {
	w := newWorld(t)
	var readErr error
	reading := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		_, readErr = io.ReadAll(r.Body) // as the transport sends the body upstream
		return nil, readErr
	})
	g, err := New(configured(Options{Pool: fixedPool{fakePool: w.pool(), rt: reading}, BodyTimeout: 200 * time.Millisecond, Reviewer: w.reviewer()}))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(g)
	defer srv.Close()
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "POST /c1/api/v1/namespaces/a/configmaps HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer "+w.hubToken+"\r\n"+
		"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"kind\":"); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	start := time.Now()
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer to a stalled body after %s: %v", time.Since(start), err)
	}
	if resp.StatusCode != http.StatusRequestTimeout {
		t.Fatalf("code %d; want 408", resp.StatusCode)
	}
	if !errors.Is(readErr, os.ErrDeadlineExceeded) {
		t.Fatalf("the body read ended with %v; want the deadline", readErr)
	}
}

// fixedPool is fakePool with one round tripper for every request.
type fixedPool struct {
	*fakePool
	rt http.RoundTripper
}

func (p fixedPool) RoundTripper(string) http.RoundTripper        { return p.rt }
func (p fixedPool) UpgradeRoundTripper(string) http.RoundTripper { return p.rt }

var _ Pool = fixedPool{}
var _ = tunnel.StateReady

// TestConnectingClusterWaits: a request for a cluster whose entry is
// still dialing waits for it (bounded by TunnelWait) instead of failing at
// once; one that never connects gets 503 after the wait, and a failing
// one at once.
func TestConnectingClusterWaits(t *testing.T) {
	w := newWorld(t)
	const wait = 200 * time.Millisecond
	tests := []struct {
		name    string
		state   tunnel.State
		dials   bool
		code    int
		minTook time.Duration
		maxTook time.Duration
	}{
		{name: "connecting, then ready", state: tunnel.StateConnecting, dials: true, code: 200, maxTook: wait},
		{name: "connecting past the wait", state: tunnel.StateConnecting, code: 503, minTook: wait, maxTook: 10 * wait},
		{name: "failing answers at once", state: tunnel.StateFailing, dials: true, code: 503, maxTook: wait},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pool := w.pool()
			pool.states["new"] = tt.state
			pool.dials = map[string]bool{"new": tt.dials}
			g, err := New(configured(Options{Pool: pool, Reviewer: w.reviewer(), HubKeys: w.hubKeys(), TunnelWait: wait}))
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			rec := serve(g, http.MethodGet, "/new/api", bearer(w.hubToken))
			took := time.Since(start)
			if rec.Code != tt.code {
				t.Fatalf("%d %s; want %d", rec.Code, rec.Body, tt.code)
			}
			if took < tt.minTook || took > tt.maxTook {
				t.Errorf("answered in %s; want between %s and %s", took, tt.minTook, tt.maxTook)
			}
			if forwarded := len(pool.requests()); (tt.code == 200) != (forwarded == 1) {
				t.Errorf("forwarded %d requests with answer %d", forwarded, tt.code)
			}
		})
	}
}

// TestGatewayEdges: a CONNECT is refused before anything is spent on it;
// an upstream failure's text (addresses of the hub's network) stays in
// the log; a refused path holding a token is not written to the log.
func TestGatewayEdges(t *testing.T) {
	w := newWorld(t)
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	pool, rev := w.pool(), w.reviewer()
	g, err := New(configured(Options{Pool: pool, Reviewer: rev, Log: log}))
	if err != nil {
		t.Fatal(err)
	}
	if rec := serve(g, http.MethodConnect, "/c1/api", bearer(w.hubToken)); rec.Code != http.StatusMethodNotAllowed || !strings.Contains(rec.Body.String(), "CONNECT is refused") {
		t.Errorf("CONNECT: %d %s", rec.Code, rec.Body)
	}
	if n := rev.reviews(); n != 0 || len(pool.requests()) != 0 {
		t.Errorf("CONNECT cost %d reviews and %d requests", n, len(pool.requests()))
	}

	pool.fail = errors.New("dial tcp 10.96.7.7:8090: connect: connection refused")
	rec := serve(g, http.MethodGet, "/c1/api", bearer(w.hubToken))
	if rec.Code != http.StatusBadGateway || strings.Contains(rec.Body.String(), "10.96.7.7") || !strings.Contains(rec.Body.String(), "could not be reached") {
		t.Errorf("upstream failure: %d %s", rec.Code, rec.Body)
	}
	if !strings.Contains(logs.String(), "10.96.7.7") {
		t.Errorf("the log does not say why the cluster could not be reached:\n%s", logs.String())
	}

	serve(g, http.MethodGet, "/c1/api/v1/namespaces/"+w.hubToken, bearer(w.hubToken))
	serve(g, http.MethodGet, "/c1/api/"+w.expiredHub, bearer(w.hubToken))
	for _, secret := range []string{w.hubToken, w.expiredHub} {
		if strings.Contains(logs.String(), secret) {
			t.Errorf("the log holds a token from a refused path:\n%s", logs.String())
		}
	}
}

// TestRefusalsWithABodyEnd: a refused request that announces a body and
// sends it slowly is answered at once, and its connection closed, instead
// of net/http reading the body (up to 256 KiB, before an HTTP/1.1 answer
// and after any answer) for as long as the client likes; the handler's
// goroutine ends too.
func TestRefusalsWithABodyEnd(t *testing.T) {
	w := newWorld(t)
	g, err := New(configured(Options{Pool: w.pool(), Reviewer: w.reviewer()}))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(g)
	defer srv.Close()
	for _, tt := range []struct {
		name, head string
	}{
		{"no token, 1 MiB announced", "POST /c1/api/v1/namespaces/a/configmaps HTTP/1.1\r\nHost: gw\r\nContent-Length: 1048576\r\n\r\n{"},
		{"no token, 100 KiB announced", "POST /c1/api/v1/namespaces/a/configmaps HTTP/1.1\r\nHost: gw\r\nContent-Length: 102400\r\n\r\n{"},
		{"a forged impersonation, chunked", "PUT /c1/api/v1/namespaces/a/configmaps/x HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer " + w.hubToken +
			"\r\nImpersonate-User: admin\r\nTransfer-Encoding: chunked\r\n\r\n1\r\n{\r\n"},
		{"an unknown cluster", "POST /c9/api/v1/namespaces/a/configmaps HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer " + w.hubToken +
			"\r\nContent-Length: 1000\r\n\r\n{"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", srv.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if _, err := io.WriteString(conn, tt.head); err != nil {
				t.Fatal(err)
			}
			// The client sends nothing more (1 byte/s at best): the
			// answer must not wait for it.
			_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
			br := bufio.NewReader(conn)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("no answer: %v", err)
			}
			if resp.StatusCode < 400 || !resp.Close {
				t.Errorf("code %d, Connection: close %t; want a refusal closing the connection", resp.StatusCode, resp.Close)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			if _, err := br.ReadByte(); !errors.Is(err, io.EOF) {
				t.Errorf("after the refusal the connection gave %v; want EOF (closed by the server)", err)
			}
		})
	}
	// HTTP/2: the stream is answered at once too.
	srv2 := httptest.NewUnstartedServer(g)
	srv2.EnableHTTP2 = true
	srv2.StartTLS()
	defer srv2.Close()
	pr, pw := io.Pipe()
	defer pw.Close()
	req, _ := http.NewRequest(http.MethodPost, srv2.URL+"/c1/api/v1/namespaces/a/configmaps", pr)
	req.ContentLength = 1 << 20
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := srv2.Client().Do(req.WithContext(ctx))
	if err != nil {
		t.Fatalf("HTTP/2: %v", err)
	}
	resp.Body.Close()
	if resp.ProtoMajor != 2 || resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("HTTP/2: %s %d; want a 401", resp.Proto, resp.StatusCode)
	}
}
