package gateway

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"
)

// fuzzRig is the gateway the identity fuzzers attack over a real server,
// the pool that records what reaches the cluster, and the tokens a fuzzed
// request authenticates with.
type fuzzRig struct {
	w                    *world
	pool                 *fakePool
	g                    *Gateway
	tokens               []string
	impersonated, passed http.Header
}

func newFuzzRig(f *testing.F) *fuzzRig {
	w := newWorld(f)
	r := &fuzzRig{w: w, pool: w.pool(),
		tokens: []string{w.hubToken, w.c1Token, w.selfSigned, "opaque-token-0123456789", w.expiredHub, ""},
		impersonated: http.Header{"Authorization": {"Bearer msa-token"}, "Impersonate-User": {"cluster:hub:alice"},
			"Impersonate-Group": {"cluster:hub:system:masters", "cluster:hub:team-a"}},
		passed: http.Header{"Authorization": {"Bearer " + w.c1Token}}}
	var err error
	r.g, err = New(configured(Options{Pool: r.pool, Reviewer: w.reviewer(), HubKeys: w.hubKeys(), PassThrough: true,
		// The fuzzer is one address refused over and over: never limit it,
		// or nothing would reach the cluster past the first refusals.
		RefusalsPerSecond: 1e9, RefusalBurst: 1 << 30}))
	if err != nil {
		f.Fatal(err)
	}
	return r
}

// token is the request's token for a fuzzed kind.
func (r *fuzzRig) token(kind uint8) string { return r.tokens[int(kind)%len(r.tokens)] }

// check holds every request that reached the cluster since before to the
// invariant: exactly the identity the gateway decided (a hub identity
// impersonated with the prefix, or a cluster's own verified token), and
// never the hub token the request authenticated with, in any header or
// the URL. The world's hub token is opaque: sent as data beside another
// token, it cannot be told from any other string (a real hub
// ServiceAccount token is a JWT, refused anywhere), so it is looked for
// only when it is the request's. sent describes the request.
func (r *fuzzRig) check(t *testing.T, before int, token, sent string) {
	t.Helper()
	ownHub := "\x00never"
	if token == r.w.hubToken {
		ownHub = r.w.hubToken
	}
	for _, out := range r.pool.requests()[before:] {
		id := http.Header{}
		for k, vs := range out.Header {
			if identityHeader(k) {
				id[k] = vs
			}
			for _, v := range vs {
				// The API server reads a subprotocol token only from
				// Sec-WebSocket-Protocol; elsewhere the prefix is data.
				subprotocol := strings.EqualFold(k, "Sec-WebSocket-Protocol") && strings.Contains(strings.ToLower(v), protocolTokenPrefix)
				if strings.Contains(v, ownHub) || subprotocol {
					t.Fatalf("a credential reached the cluster in %s", k)
				}
			}
		}
		if strings.Contains(out.URL.String(), ownHub) {
			t.Fatal("the hub token reached the cluster in the URL")
		}
		if !reflect.DeepEqual(id, r.impersonated) && !reflect.DeepEqual(id, r.passed) {
			t.Fatalf("the cluster saw an identity the gateway did not decide: %v\nrequest:\n%q", id, sent)
		}
		if len(out.Trailer) > 0 || out.URL.User != nil {
			t.Fatalf("trailers %v or user info %v reached the cluster", out.Trailer, out.URL.User)
		}
	}
}

// FuzzGatewayIdentity sends raw HTTP/1.1 requests, with headers the fuzzer
// writes, to the gateway on a real server, and checks the invariant
// (fuzzRig.check).
func FuzzGatewayIdentity(f *testing.F) {
	r := newFuzzRig(f)
	w := r.w
	srv := httptest.NewServer(r.g)
	f.Cleanup(srv.Close)

	for _, seed := range []struct {
		kind    uint8
		path    string
		headers string
		body    string
	}{
		{2, "", "Connection: keep-alive, Authorization\r\n", ""},
		{1, "", "Connection: keep-alive, Authorization\r\n", ""},
		{2, "/v1/namespaces/a/pods/p/exec", "Connection: Upgrade, Authorization\r\nUpgrade: websocket\r\n", ""},
		{0, "", "Connection: Impersonate-User\r\nImpersonate-User: system:admin\r\n", ""},
		{0, "", "X-Remote-User: admin\r\nX-Remote-Group: system:masters\r\n", ""},
		{5, "", "Authorization: Bearer hub-alice-token-0123456789\r\n", ""},
		{0, "", "authorization: Bearer " + w.c1Token + "\r\n", ""},
		{0, "", "Transfer-Encoding: chunked\r\nTrailer: Authorization\r\n", "2\r\n{}\r\n0\r\nAuthorization: Bearer x\r\n\r\n"},
		{0, "", "Transfer-Encoding: chunked\r\n", "2\r\n{}\r\n0\r\nImpersonate-User: admin\r\n\r\n"},
		{1, "", "Sec-WebSocket-Protocol: base64url.bearer.authorization.k8s.io.eA\r\n", ""},
		{0, "", "Proxy-Authorization: Basic eDp5\r\nProxy-Connection: Authorization\r\n", ""},
		{0, "", "Te: trailers\r\nConnection: te, close\r\n", ""},
		{0, "?access_token=hub-alice-token-0123456789", "", ""},
		{0, "?labelSelector=a", "X-Forwarded-For: 1.2.3.4\r\n", ""},
		{1, "/v1/pods", "Accept: application/json\r\n", ""},
	} {
		f.Add(seed.kind, seed.path, seed.headers, seed.body)
	}
	f.Fuzz(func(t *testing.T, kind uint8, path, headers, body string) {
		token := r.token(kind)
		var raw strings.Builder
		raw.WriteString("GET /c1/api" + path + " HTTP/1.1\r\nHost: gw\r\n")
		if token != "" {
			raw.WriteString("Authorization: Bearer " + token + "\r\n")
		}
		raw.WriteString(headers)
		if headers != "" && !strings.HasSuffix(headers, "\r\n") {
			raw.WriteString("\r\n")
		}
		raw.WriteString("\r\n")
		raw.WriteString(body)
		before := len(r.pool.requests())
		conn, err := net.Dial("tcp", srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(conn, raw.String()); err != nil {
			return
		}
		// A request whose headers promise more body than it has is cut
		// short here, not after the deadline.
		_ = conn.(*net.TCPConn).CloseWrite()
		if resp, err := http.ReadResponse(bufio.NewReader(conn), nil); err == nil {
			_ = resp.Body.Close()
		}
		r.check(t, before, token, raw.String())
	})
}
