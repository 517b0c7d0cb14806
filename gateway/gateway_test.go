package gateway

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"

	"github.com/hubsync/hubsync/tunnel"
)

// signer makes JWTs with one key, as an issuer would.
type signer struct {
	key *ecdsa.PrivateKey
	kid string
}

func newSigner(t *testing.T, kid string) signer {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return signer{key: k, kid: kid}
}

func (s signer) token(t *testing.T, claims map[string]any) string {
	t.Helper()
	sig, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: s.key},
		(&jose.SignerOptions{}).WithType("JWT").WithHeader(jose.HeaderKey("kid"), s.kid))
	if err != nil {
		t.Fatal(err)
	}
	payload, _ := json.Marshal(claims)
	obj, err := sig.Sign(payload)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := obj.CompactSerialize()
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func (s signer) jwks(t *testing.T) []byte {
	t.Helper()
	b, err := json.Marshal(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: &s.key.PublicKey, KeyID: s.kid, Algorithm: "ES256", Use: "sig"}}})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// mapReviewer knows a fixed set of hub tokens.
type mapReviewer struct {
	ids map[string]Identity
	err error
}

func (f mapReviewer) Review(_ context.Context, token string) (Identity, bool, error) {
	if f.err != nil {
		return Identity{}, false, f.err
	}
	id, ok := f.ids[token]
	return id, ok, nil
}

// fakePool serves clusters from a map of states and records every request
// that reaches "the cluster".
type fakePool struct {
	states map[string]tunnel.State
	mu     sync.Mutex
	got    []*http.Request
	msa    string
}

func (p *fakePool) Status(c string) (tunnel.Status, bool) {
	s, ok := p.states[c]
	return tunnel.Status{Cluster: c, State: s, Reason: "dial: no agent"}, ok
}

func (p *fakePool) rt(auth bool) http.RoundTripper {
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if auth {
			r.Header.Set("Authorization", "Bearer "+p.msa)
		}
		p.mu.Lock()
		p.got = append(p.got, r)
		p.mu.Unlock()
		return &http.Response{StatusCode: 200, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("{}")), Request: r}, nil
	})
}
func (p *fakePool) RoundTripper(string) http.RoundTripper              { return p.rt(false) }
func (p *fakePool) AuthenticatedRoundTripper(string) http.RoundTripper { return p.rt(true) }
func (p *fakePool) UpgradeRoundTripper(_ string, a bool) http.RoundTripper {
	return p.rt(a)
}

func (p *fakePool) requests() []*http.Request {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]*http.Request(nil), p.got...)
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestGatewayRequests(t *testing.T) {
	hub := newSigner(t, "hub-key")
	managed := newSigner(t, "managed-key")
	hubToken := "hub-alice-token"
	expiredHub := hub.token(t, map[string]any{"iss": "https://kubernetes.default.svc", "sub": "system:serviceaccount:a:b", "exp": 1})
	managedToken := managed.token(t, map[string]any{"iss": "https://kubernetes.default.svc", "sub": "system:serviceaccount:ocm:msa"})
	oidcToken := managed.token(t, map[string]any{"iss": "https://dex.example", "sub": "bob"})
	alice := Identity{Username: "alice", UID: "u-1", Groups: []string{"system:masters", "team-a", ""}, Extra: map[string][]string{"scopes": {"all"}}}

	type want struct {
		code          int
		forwarded     bool
		authorization string            // on the forwarded request
		headers       map[string]string // on the forwarded request; "" = absent
		groups        []string
		message       string // in the refusal
	}
	tests := []struct {
		name        string
		method      string
		path        string
		header      http.Header
		passThrough bool
		reviewErr   error
		keysErr     bool
		want        want
	}{
		{name: "hub identity is impersonated with the prefix", path: "/c1/api/v1/namespaces/a/pods?limit=5",
			header: http.Header{"Authorization": {"Bearer " + hubToken}, "X-Remote-User": {"admin"}},
			want: want{code: 200, forwarded: true, authorization: "Bearer msa-token",
				headers: map[string]string{"Impersonate-User": "cluster:hub:alice", "Impersonate-Uid": "", "Impersonate-Extra-Scopes": "", "X-Remote-User": ""},
				groups:  []string{"cluster:hub:system:masters", "cluster:hub:team-a"}}},
		{name: "forged Impersonate-User", path: "/c1/api", header: http.Header{"Authorization": {"Bearer " + hubToken}, "Impersonate-User": {"system:admin"}},
			want: want{code: 403, message: "Impersonate-* headers are refused"}},
		{name: "forged Impersonate-Group", path: "/c1/api", header: http.Header{"Authorization": {"Bearer " + hubToken}, "Impersonate-Group": {"system:masters"}},
			want: want{code: 403}},
		{name: "forged Impersonate-Uid", path: "/c1/api", header: http.Header{"Authorization": {"Bearer " + hubToken}, "Impersonate-Uid": {"0"}},
			want: want{code: 403}},
		{name: "forged Impersonate-Extra", path: "/c1/api", header: http.Header{"Authorization": {"Bearer " + hubToken}, "Impersonate-Extra-Scopes": {"x"}},
			want: want{code: 403}},
		{name: "forged impersonation on a pass-through token", path: "/c1/api", passThrough: true,
			header: http.Header{"Authorization": {"Bearer " + managedToken}, "Impersonate-User": {"system:admin"}},
			want:   want{code: 403}},
		{name: "token in a WebSocket subprotocol", path: "/c1/api/v1/namespaces/a/pods/p/exec", passThrough: true,
			header: http.Header{"Authorization": {"Bearer " + managedToken}, "Sec-Websocket-Protocol": {"v5.channel.k8s.io, base64url.bearer.authorization.k8s.io.aHVi"}},
			want:   want{code: 401, message: "Sec-WebSocket-Protocol"}},
		{name: "hub identity without a username", path: "/c1/api", header: http.Header{"Authorization": {"Bearer nameless"}},
			want: want{code: 401, message: "without a username"}},
		{name: "two Authorization headers", path: "/c1/api", header: http.Header{"Authorization": {"Bearer " + hubToken, "Bearer " + managedToken}},
			want: want{code: 401, message: "more than one Authorization header"}},
		{name: "no token", path: "/c1/api", want: want{code: 401, message: "no anonymous requests"}},
		{name: "basic auth", path: "/c1/api", header: http.Header{"Authorization": {"Basic YTpi"}}, want: want{code: 401}},
		{name: "managed cluster token passes through", path: "/c1/api/v1/pods", passThrough: true,
			header: http.Header{"Authorization": {"Bearer " + managedToken}},
			want:   want{code: 200, forwarded: true, authorization: "Bearer " + managedToken, headers: map[string]string{"Impersonate-User": ""}}},
		{name: "pass-through off", path: "/c1/api", header: http.Header{"Authorization": {"Bearer " + managedToken}},
			want: want{code: 401, message: "does not recognise"}},
		{name: "expired hub token is never forwarded", path: "/c1/api", passThrough: true,
			header: http.Header{"Authorization": {"Bearer " + expiredHub}}, want: want{code: 401, message: "hub tokens are never forwarded"}},
		{name: "hub OIDC issuer is never forwarded", path: "/c1/api", passThrough: true,
			header: http.Header{"Authorization": {"Bearer " + oidcToken}}, want: want{code: 401}},
		{name: "opaque unknown token", path: "/c1/api", passThrough: true,
			header: http.Header{"Authorization": {"Bearer abcdef.0123456789abcdef"}}, want: want{code: 401, message: "only a managed cluster's JWT"}},
		{name: "hub keys unavailable", path: "/c1/api", passThrough: true, keysErr: true,
			header: http.Header{"Authorization": {"Bearer " + managedToken}}, want: want{code: 503}},
		{name: "TokenReview unavailable", path: "/c1/api", reviewErr: errors.New("connection refused"),
			header: http.Header{"Authorization": {"Bearer " + hubToken}}, want: want{code: 503, message: "TokenReview could not be reached"}},
		{name: "dot-dot to another cluster", path: "/c1/../c2/api", header: http.Header{"Authorization": {"Bearer " + hubToken}}, want: want{code: 400}},
		{name: "encoded slash", path: "/c1%2Fc2/api", header: http.Header{"Authorization": {"Bearer " + hubToken}}, want: want{code: 400}},
		{name: "encoded dot-dot", path: "/c1/%2e%2e/c2/api", header: http.Header{"Authorization": {"Bearer " + hubToken}}, want: want{code: 400}},
		{name: "unknown cluster", path: "/c9/api", header: http.Header{"Authorization": {"Bearer " + hubToken}}, want: want{code: 404, message: "not served"}},
		{name: "dotted cluster name is one cluster", path: "/c1.example/api", header: http.Header{"Authorization": {"Bearer " + hubToken}},
			want: want{code: 404, message: `c1.example\"`}},
		{name: "failing cluster", path: "/down/api", header: http.Header{"Authorization": {"Bearer " + hubToken}},
			want: want{code: 503, message: "failing: dial: no agent"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pool := &fakePool{states: map[string]tunnel.State{"c1": tunnel.StateReady, "down": tunnel.StateFailing}, msa: "msa-token"}
			keys := &HubKeys{Issuers: []string{"https://dex.example"}, Fetch: func(context.Context) ([]byte, error) {
				if tt.keysErr {
					return nil, errors.New("forbidden")
				}
				return hub.jwks(t), nil
			}}
			g, err := New(Options{Pool: pool, Reviewer: mapReviewer{ids: map[string]Identity{hubToken: alice, "nameless": {Groups: []string{"g"}}}, err: tt.reviewErr},
				Tokens: keys, PassThrough: tt.passThrough})
			if err != nil {
				t.Fatal(err)
			}
			method := tt.method
			if method == "" {
				method = http.MethodGet
			}
			req := httptest.NewRequest(method, "https://gw"+tt.path, nil)
			for k, vs := range tt.header {
				for _, v := range vs {
					req.Header.Add(k, v)
				}
			}
			rec := httptest.NewRecorder()
			g.ServeHTTP(rec, req)
			got := pool.requests()
			if rec.Code != tt.want.code {
				t.Fatalf("code = %d (%s); want %d", rec.Code, rec.Body, tt.want.code)
			}
			if !strings.Contains(rec.Body.String(), tt.want.message) {
				t.Errorf("body %s does not say %q", rec.Body, tt.want.message)
			}
			if tt.want.code == 503 && rec.Header().Get("Retry-After") == "" {
				t.Errorf("503 without Retry-After")
			}
			if !tt.want.forwarded {
				if len(got) != 0 {
					t.Fatalf("forwarded %d requests; want none", len(got))
				}
				return
			}
			if len(got) != 1 {
				t.Fatalf("forwarded %d requests; want 1", len(got))
			}
			out := got[0]
			if a := out.Header.Values("Authorization"); len(a) != 1 || a[0] != tt.want.authorization {
				t.Errorf("Authorization = %q; want %q", a, tt.want.authorization)
			}
			for k, v := range tt.want.headers {
				if out.Header.Get(k) != v {
					t.Errorf("%s = %q; want %q", k, out.Header.Get(k), v)
				}
			}
			if g := out.Header.Values("Impersonate-Group"); strings.Join(g, ",") != strings.Join(tt.want.groups, ",") {
				t.Errorf("Impersonate-Group = %q; want %q", g, tt.want.groups)
			}
			if out.URL.RawQuery != req.URL.RawQuery {
				t.Errorf("query = %q; want %q", out.URL.RawQuery, req.URL.RawQuery)
			}
			if wantPath := strings.TrimPrefix(req.URL.Path, "/c1"); out.URL.Path != wantPath {
				t.Errorf("path = %q; want %q", out.URL.Path, wantPath)
			}
		})
	}
}

func TestGatewayNotServingReplica(t *testing.T) {
	pool := &fakePool{states: map[string]tunnel.State{"c1": tunnel.StateReady}}
	g, err := New(Options{Pool: pool, Reviewer: mapReviewer{ids: map[string]Identity{"t": {Username: "a"}}},
		Serving: func() (bool, string) { return false, "it is a standby" }})
	if err != nil {
		t.Fatal(err)
	}
	req := httptest.NewRequest(http.MethodGet, "https://gw/c1/api", nil)
	req.Header.Set("Authorization", "Bearer t")
	rec := httptest.NewRecorder()
	g.ServeHTTP(rec, req)
	if rec.Code != 503 || !strings.Contains(rec.Body.String(), "standby") || len(pool.requests()) != 0 {
		t.Fatalf("code %d body %s forwarded %d; want 503 saying standby, nothing forwarded", rec.Code, rec.Body, len(pool.requests()))
	}
}

func TestHubKeysRefetchesForANewKey(t *testing.T) {
	old, rotated := newSigner(t, "k1"), newSigner(t, "k2")
	now := time.Unix(1000, 0)
	serve := old
	fetches := 0
	keys := &HubKeys{Now: func() time.Time { return now }, Fetch: func(context.Context) ([]byte, error) {
		fetches++
		return serve.jwks(t), nil
	}}
	ctx := context.Background()
	if k, err := keys.Classify(ctx, old.token(t, map[string]any{"iss": "x"})); err != nil || k != TokenHub {
		t.Fatalf("old key: %v, %v; want hub", k, err)
	}
	// The hub adds a key: a token signed with it names a kid the cached
	// set lacks, which fetches again (not more than every MinRefetch).
	serve = rotated
	now = now.Add(time.Minute)
	if k, _ := keys.Classify(ctx, rotated.token(t, map[string]any{"iss": "x"})); k != TokenHub || fetches != 2 {
		t.Fatalf("rotated key: %v after %d fetches; want hub after 2", k, fetches)
	}
	stranger := newSigner(t, "k3")
	for range 3 {
		if k, _ := keys.Classify(ctx, stranger.token(t, map[string]any{"iss": "x"})); k != TokenForeign {
			t.Fatalf("stranger: %v; want foreign", k)
		}
	}
	if fetches != 2 {
		t.Fatalf("%d fetches; unknown keys must not fetch more than every MinRefetch", fetches)
	}
	if k, _ := keys.Classify(ctx, "not-a-jwt"); k != TokenOpaque {
		t.Fatalf("opaque: %v", k)
	}
}

func TestGatewayReviewCacheTTL(t *testing.T) {
	now := time.Unix(1000, 0)
	rev := &countingReviewer{ids: map[string]Identity{"t": {Username: "a"}}}
	pool := &fakePool{states: map[string]tunnel.State{"c1": tunnel.StateReady}}
	g, err := New(Options{Pool: pool, Reviewer: rev, ReviewCacheTTL: 2 * time.Second, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	do := func() int {
		req := httptest.NewRequest(http.MethodGet, "https://gw/c1/api", nil)
		req.Header.Set("Authorization", "Bearer t")
		rec := httptest.NewRecorder()
		g.ServeHTTP(rec, req)
		return rec.Code
	}
	if do() != 200 || do() != 200 || rev.n != 1 {
		t.Fatalf("two requests: %d reviews; want 1 (cached)", rev.n)
	}
	delete(rev.ids, "t") // revoked on the hub
	if do() != 200 {
		t.Fatal("within the TTL the cached review answers")
	}
	now = now.Add(2 * time.Second)
	if c := do(); c != 401 {
		t.Fatalf("after the TTL: %d; want 401", c)
	}
	if c := do(); c != 401 || rev.n != 3 {
		t.Fatalf("refusals are not cached: %d reviews; want 3", rev.n)
	}
}

type countingReviewer struct {
	ids map[string]Identity
	n   int
}

func (c *countingReviewer) Review(_ context.Context, token string) (Identity, bool, error) {
	c.n++
	id, ok := c.ids[token]
	return id, ok, nil
}

func TestGatewayForwardGroups(t *testing.T) {
	pool := &fakePool{states: map[string]tunnel.State{"c1": tunnel.StateReady}, msa: "m"}
	g, err := New(Options{Pool: pool, ForwardGroups: []string{"team-a", "system:authenticated"},
		Reviewer: mapReviewer{ids: map[string]Identity{"t": {Username: "a", Groups: []string{"system:masters", "team-a", "system:authenticated"}}}}})
	if err != nil {
		t.Fatal(err)
	}
	req := httptest.NewRequest(http.MethodGet, "https://gw/c1/api", nil)
	req.Header.Set("Authorization", "Bearer t")
	g.ServeHTTP(httptest.NewRecorder(), req)
	got := pool.requests()
	if len(got) != 1 {
		t.Fatalf("forwarded %d; want 1", len(got))
	}
	if gr := strings.Join(got[0].Header.Values("Impersonate-Group"), ","); gr != "cluster:hub:team-a,cluster:hub:system:authenticated" {
		t.Fatalf("groups %q; want only the allowed ones, prefixed", gr)
	}
}

// TestGatewaySlowBody: a client that stops sending its body is cut off
// after BodyTimeout with a 408, on a real HTTP server.
func TestGatewaySlowBody(t *testing.T) {
	pool := &fakePool{states: map[string]tunnel.State{"c1": tunnel.StateReady}, msa: "m"}
	var readErr error
	reading := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		_, readErr = io.ReadAll(r.Body) // as the transport sends the body upstream
		return nil, readErr
	})
	g, err := New(Options{Pool: fixedPool{fakePool: pool, rt: reading}, BodyTimeout: 200 * time.Millisecond,
		Reviewer: mapReviewer{ids: map[string]Identity{"t": {Username: "a"}}}})
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
	if _, err := io.WriteString(conn, "POST /c1/api/v1/namespaces/a/configmaps HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer t\r\n"+
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

// fixedPool is fakePool with one round tripper for every mode.
type fixedPool struct {
	*fakePool
	rt http.RoundTripper
}

func (p fixedPool) RoundTripper(string) http.RoundTripper              { return p.rt }
func (p fixedPool) AuthenticatedRoundTripper(string) http.RoundTripper { return p.rt }
