package gateway

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	jose "github.com/go-jose/go-jose/v4"

	"github.com/hubsync/hubsync/test/pki"
	"github.com/hubsync/hubsync/tunnel"
)

// signer makes JWTs with one key, as an issuer would.
type signer struct {
	key *ecdsa.PrivateKey
	kid string
}

func newSigner(t testing.TB, kid string) signer {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return signer{key: k, kid: kid}
}

func (s signer) token(t testing.TB, claims map[string]any) string {
	t.Helper()
	tok, err := pki.SignJWT(s.key, s.kid, claims)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func (s signer) jwks() []byte {
	b, err := json.Marshal(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: &s.key.PublicKey, KeyID: s.kid, Algorithm: "ES256", Use: "sig"}}})
	if err != nil {
		panic(err)
	}
	return b
}

// mapReviewer knows a fixed set of hub tokens and counts its reviews.
type mapReviewer struct {
	ids map[string]Identity
	err error

	mu sync.Mutex
	n  int
}

func (f *mapReviewer) Review(_ context.Context, token string) (Identity, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n++
	if f.err != nil {
		return Identity{}, false, f.err
	}
	id, ok := f.ids[token]
	return id, ok, nil
}

func (f *mapReviewer) reviews() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.n
}

// fakePool serves clusters from a map of states, answers each cluster's
// /openid/v1/jwks from keys, and records every other request that
// reaches "the cluster", as the pool's round trippers receive it.
type fakePool struct {
	states map[string]tunnel.State
	sets   map[string]string // cluster -> its ManagedClusterSet
	msa    string
	keys   map[string][]byte // cluster -> JWKS
	// answer, if set, makes the cluster's answers; fail, if set, is the
	// round trip's error instead.
	answer func(*http.Request) *http.Response
	fail   error
	// dials holds the clusters whose entry becomes ready when waited for.
	dials map[string]bool
	// ids are the clusters' identities (tunnel.Target.Identity); "" by
	// default.
	ids map[string]string

	mu      sync.Mutex
	got     []*http.Request
	alone   []bool          // per request in got: sent on a connection of its own
	fetched []*http.Request // key fetches
}

func (p *fakePool) Status(c string) (tunnel.Status, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s, ok := p.states[c]
	return tunnel.Status{Cluster: c, ClusterSet: p.sets[c], State: s, Reason: "dial: no agent", Identity: p.ids[c]}, ok
}

// WaitReady: a cluster named in dials becomes ready when asked (its dial
// succeeds); any other one not ready waits until ctx ends.
func (p *fakePool) WaitReady(ctx context.Context, c string) error {
	p.mu.Lock()
	if p.dials[c] {
		p.states[c] = tunnel.StateReady
	}
	s := p.states[c]
	p.mu.Unlock()
	if s == tunnel.StateReady {
		return nil
	}
	<-ctx.Done()
	return fmt.Errorf("cluster %s: %w", c, tunnel.ErrNotReady)
}

func (p *fakePool) rt(cluster string, alone bool) http.RoundTripper {
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		p.mu.Lock()
		defer p.mu.Unlock()
		if r.URL.Path == "/openid/v1/jwks" {
			p.fetched = append(p.fetched, r)
			if k, ok := p.keys[cluster]; ok {
				return &http.Response{StatusCode: 200, Header: http.Header{}, Body: io.NopCloser(strings.NewReader(string(k))), Request: r}, nil
			}
			return &http.Response{StatusCode: 404, Status: "404 Not Found", Header: http.Header{}, Body: io.NopCloser(strings.NewReader("")), Request: r}, nil
		}
		p.got = append(p.got, r)
		p.alone = append(p.alone, alone)
		if p.fail != nil {
			return nil, p.fail
		}
		if answer := p.answer; answer != nil {
			// The answer may take its time: the pool is not held meanwhile.
			p.mu.Unlock()
			defer p.mu.Lock()
			return answer(r), nil
		}
		return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"application/json"}},
			Body: io.NopCloser(strings.NewReader("{}")), Request: r}, nil
	})
}

func (p *fakePool) RoundTripper(c string) http.RoundTripper        { return p.rt(c, false) }
func (p *fakePool) UpgradeRoundTripper(c string) http.RoundTripper { return p.rt(c, true) }

// sentAlone reports, per request that reached a cluster, whether it went
// on a connection of its own.
func (p *fakePool) sentAlone() []bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]bool(nil), p.alone...)
}

func (p *fakePool) Authorization(c string) (string, error) {
	p.mu.Lock()
	_, ok := p.states[c]
	p.mu.Unlock()
	if !ok {
		return "", fmt.Errorf("cluster %s: %w", c, tunnel.ErrNotServed)
	}
	if p.msa == "" {
		return "", fmt.Errorf("cluster %s: %w", c, tunnel.ErrNoCredential)
	}
	return "Bearer " + p.msa, nil
}

func (p *fakePool) requests() []*http.Request {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]*http.Request(nil), p.got...)
}

func (p *fakePool) keyFetches() []*http.Request {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]*http.Request(nil), p.fetched...)
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// world is a hub, two managed clusters and the tokens of each, as the
// gateway's unit tests see them.
type world struct {
	hub, c1, c2, stranger signer
	hubToken              string // a hub identity's (opaque to the gateway: only the reviewer knows it)
	alice                 Identity
	c1Token, c2Token      string // each cluster's own ServiceAccount token
	expiredHub            string // signed by the hub, expired
	expiredC1             string
	selfSigned            string // a JWT signed by nobody the gateway knows
	oidc                  string // a hub OIDC issuer's
}

func newWorld(t testing.TB) *world {
	w := &world{hub: newSigner(t, "hub-key"), c1: newSigner(t, "c1-key"), c2: newSigner(t, "c2-key"), stranger: newSigner(t, "c1-key")}
	sa := func(sub string, exp int64) map[string]any {
		return map[string]any{"iss": "https://kubernetes.default.svc", "sub": sub, "exp": exp}
	}
	const future = 1 << 40
	w.hubToken = "hub-alice-token-0123456789"
	w.alice = Identity{Username: "alice", UID: "u-1", Groups: []string{"system:masters", "team-a", ""}, Extra: map[string][]string{"scopes": {"all"}}}
	w.c1Token = w.c1.token(t, sa("system:serviceaccount:ocm:msa", future))
	w.c2Token = w.c2.token(t, sa("system:serviceaccount:ocm:msa", future))
	w.expiredHub = w.hub.token(t, sa("system:serviceaccount:a:b", 1))
	w.expiredC1 = w.c1.token(t, sa("system:serviceaccount:ocm:msa", 1))
	// The same key id as c1's, another key: a forgery.
	w.selfSigned = w.stranger.token(t, sa("system:serviceaccount:kube-system:admin", future))
	w.oidc = w.c1.token(t, map[string]any{"iss": "https://dex.example", "sub": "bob", "exp": future})
	return w
}

func (w *world) pool() *fakePool {
	return &fakePool{states: map[string]tunnel.State{"c1": tunnel.StateReady, "c2": tunnel.StateReady, "down": tunnel.StateFailing},
		msa: "msa-token", keys: map[string][]byte{"c1": w.c1.jwks(), "c2": w.c2.jwks()}, sets: map[string]string{"c1": "prod", "down": "edge"}}
}

func (w *world) reviewer() *mapReviewer {
	return &mapReviewer{ids: map[string]Identity{w.hubToken: w.alice, "nameless-token-0123": {Groups: []string{"g"}}}}
}

func (w *world) hubKeys() *KeySet {
	return &KeySet{Fetch: func(context.Context) ([]byte, error) { return w.hub.jwks(), nil }}
}

// serve sends one request to g as a server would hand it over.
func serve(g http.Handler, method, target string, header http.Header) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, "https://gw"+target, nil)
	for k, vs := range header {
		req.Header[k] = append(req.Header[k], vs...)
	}
	rec := httptest.NewRecorder()
	g.ServeHTTP(rec, req)
	return rec
}

func bearer(token string) http.Header { return http.Header{"Authorization": {"Bearer " + token}} }
