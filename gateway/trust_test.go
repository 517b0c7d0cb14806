package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// These tests hold the gateway to what a token proved: a token it
// verified for one cluster buys nothing for another identity of that
// cluster, a hub token is the hub's before any cluster's keys are asked,
// the gateway's own impersonating credential never acts as itself, and a
// token a cluster signed travels on the connection every client shares
// only once that cluster has accepted it.

// TestImpersonatorTokenNeverPassesThrough: the ManagedServiceAccount's
// token, which the gateway impersonates with, is refused as a bearer
// token even though the cluster signed it.
func TestImpersonatorTokenNeverPassesThrough(t *testing.T) {
	w := newWorld(t)
	pool := w.pool()
	pool.msa = w.c1Token
	g, err := New(configured(Options{Pool: pool, Reviewer: w.reviewer(), HubKeys: w.hubKeys(), PassThrough: true}))
	if err != nil {
		t.Fatal(err)
	}
	rec := serve(g, http.MethodGet, "/c1/api", bearer(w.c1Token))
	if rec.Code != http.StatusUnauthorized || !strings.Contains(rec.Body.String(), "may not pass through") {
		t.Fatalf("%d %s; want 401", rec.Code, rec.Body)
	}
	if n := len(pool.requests()); n != 0 {
		t.Fatalf("%d requests reached the cluster", n)
	}
	// Nor does another token of the same ServiceAccount.
	sibling := w.c1.token(t, map[string]any{"iss": "https://kubernetes.default.svc", "sub": "system:serviceaccount:ocm:msa", "exp": 1 << 41})
	if rec := serve(g, http.MethodGet, "/c1/api", bearer(sibling)); rec.Code != http.StatusUnauthorized {
		t.Fatalf("another token of the impersonator: %d %s; want 401", rec.Code, rec.Body)
	}
	// Another ServiceAccount's token of the cluster still passes.
	app := w.c1.token(t, map[string]any{"iss": "https://kubernetes.default.svc", "sub": "system:serviceaccount:apps:app", "exp": 1 << 40})
	if rec := serve(g, http.MethodGet, "/c1/api", bearer(app)); rec.Code != http.StatusOK {
		t.Fatalf("another ServiceAccount's token: %d %s", rec.Code, rec.Body)
	}
}

// TestReviewEndsAtTheTokensExpiry: a positive review is not used past
// the token's exp, even within the cache's TTL.
func TestReviewEndsAtTheTokensExpiry(t *testing.T) {
	w := newWorld(t)
	now := time.Unix(1_000_000, 0)
	token := w.hub.token(t, map[string]any{"iss": "https://kubernetes.default.svc", "sub": "alice", "exp": now.Unix() + 3})
	rev := &mapReviewer{ids: map[string]Identity{token: w.alice}}
	c, err := NewCachedReviewer(rev, ReviewCacheOptions{TTL: MaxCacheTTL, Size: 10, MaxInFlight: 1, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	for _, step := range []struct {
		after   time.Duration
		reviews int
	}{{0, 1}, {2 * time.Second, 1}, {2 * time.Second, 2}} {
		now = now.Add(step.after)
		if _, ok, err := c.Review(context.Background(), token); err != nil || !ok {
			t.Fatalf("review: %v %v", ok, err)
		}
		if got := rev.reviews(); got != step.reviews {
			t.Fatalf("at +%s: %d reviews, want %d", step.after, got, step.reviews)
		}
	}
}

// TestClusterKeysFollowTheCluster: a cluster deleted and registered again
// under its name (another identity in the pool) has new keys: the old
// cluster's token, verified before, is refused at once, and the new keys
// are fetched.
func TestClusterKeysFollowTheCluster(t *testing.T) {
	w := newWorld(t)
	pool := w.pool()
	pool.ids = map[string]string{"c1": "first"}
	g, err := New(configured(Options{Pool: pool, Reviewer: w.reviewer(), HubKeys: w.hubKeys(), PassThrough: true}))
	if err != nil {
		t.Fatal(err)
	}
	if rec := serve(g, http.MethodGet, "/c1/api", bearer(w.c1Token)); rec.Code != http.StatusOK {
		t.Fatalf("before: %d %s", rec.Code, rec.Body)
	}
	reborn := newSigner(t, "c1-key")
	pool.mu.Lock()
	pool.ids["c1"], pool.keys["c1"] = "second", reborn.jwks()
	pool.mu.Unlock()
	fetches := len(pool.keyFetches())
	if rec := serve(g, http.MethodGet, "/c1/api", bearer(w.c1Token)); rec.Code != http.StatusUnauthorized {
		t.Fatalf("the old cluster's token after re-registration: %d %s; want 401", rec.Code, rec.Body)
	}
	if got := len(pool.keyFetches()) - fetches; got != 1 {
		t.Errorf("%d key fetches for the new cluster; want 1", got)
	}
	newToken := reborn.token(t, map[string]any{"iss": "https://kubernetes.default.svc", "sub": "system:serviceaccount:a:b", "exp": 1 << 40})
	if rec := serve(g, http.MethodGet, "/c1/api", bearer(newToken)); rec.Code != http.StatusOK {
		t.Fatalf("the new cluster's token: %d %s", rec.Code, rec.Body)
	}
}

// TestHubKeyFirstWhateverTheOrderOfRefreshes: the hub rotates its key
// after the gateway fetched the hub's set; a cluster that trusts the
// hub's keys (a local-cluster) lists the new key, and its set is fetched
// after the rotation, while the gateway's copy of the hub's set is still
// within its refresh period. A hub token signed with the new key is the
// hub's: impersonated, never passed through.
func TestHubKeyFirstWhateverTheOrderOfRefreshes(t *testing.T) {
	w := newWorld(t)
	now := time.Unix(1_000_000, 0)
	rotated := newSigner(t, "hub-key-2")
	hubSet := w.hub.jwks()
	hubKeys := &KeySet{Fetch: func(context.Context) ([]byte, error) { return hubSet, nil }, Now: func() time.Time { return now }}
	pool, rev := w.pool(), w.reviewer()
	g, err := New(configured(Options{Pool: pool, Reviewer: rev, HubKeys: hubKeys, PassThrough: true, Now: func() time.Time { return now }}))
	if err != nil {
		t.Fatal(err)
	}
	// The hub's set is fetched (with c2's), not c1's.
	if rec := serve(g, http.MethodGet, "/c2/api", bearer(w.c2Token)); rec.Code != http.StatusOK {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
	// A minute later the hub rotates; c1, a local-cluster, lists the new
	// hub key; its set is fetched a minute after that.
	now = now.Add(time.Minute)
	hubSet = joinSets(t, w.hub.jwks(), rotated.jwks())
	pool.mu.Lock()
	pool.keys["c1"] = joinSets(t, w.c1.jwks(), rotated.jwks())
	pool.mu.Unlock()
	now = now.Add(time.Minute)
	hubToken := rotated.token(t, map[string]any{"iss": "https://kubernetes.default.svc", "sub": "system:serviceaccount:ops:bot", "exp": 1 << 40})
	rev.mu.Lock()
	rev.ids[hubToken] = w.alice
	rev.mu.Unlock()
	rec := serve(g, http.MethodGet, "/c1/api", bearer(hubToken))
	if rec.Code != http.StatusOK {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
	got := pool.requests()
	last := got[len(got)-1]
	if a := last.Header.Get("Authorization"); a != "Bearer msa-token" || last.Header.Get("Impersonate-User") != Prefix+"alice" {
		t.Fatalf("the new hub key's token reached the cluster as itself: %t (impersonating %q); want the hub identity impersonated",
			a == "Bearer "+hubToken, last.Header.Get("Impersonate-User"))
	}
}

func joinSets(t *testing.T, sets ...[]byte) []byte {
	t.Helper()
	var all jose.JSONWebKeySet
	for _, s := range sets {
		var one jose.JSONWebKeySet
		if err := json.Unmarshal(s, &one); err != nil {
			t.Fatal(err)
		}
		all.Keys = append(all.Keys, one.Keys...)
	}
	b, err := json.Marshal(all)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestUnfetchableKeysTellNothing: a stranger's JWT for a served cluster
// whose keys cannot be fetched is answered as for a cluster that does
// not exist (401, the same words), and charged.
func TestUnfetchableKeysTellNothing(t *testing.T) {
	w := newWorld(t)
	pool := w.pool()
	delete(pool.keys, "c1") // its JWKS answers 404
	g, err := New(configured(Options{Pool: pool, Reviewer: w.reviewer(), HubKeys: w.hubKeys(), PassThrough: true,
		RefusalsPerSecond: 0.001, RefusalBurst: 3}))
	if err != nil {
		t.Fatal(err)
	}
	from := func(path string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodGet, "https://gw"+path, nil)
		req.RemoteAddr = "10.9.9.9:1"
		req.Header.Set("Authorization", "Bearer "+w.selfSigned)
		rec := httptest.NewRecorder()
		g.ServeHTTP(rec, req)
		return rec
	}
	served, nowhere := from("/c1/api"), from("/nowhere/api")
	if served.Code != http.StatusUnauthorized || nowhere.Code != http.StatusUnauthorized ||
		strings.ReplaceAll(served.Body.String(), `\"c1\"`, `\"nowhere\"`) != nowhere.Body.String() {
		t.Fatalf("served cluster without keys: %d %s\ncluster that does not exist: %d %s", served.Code, served.Body, nowhere.Code, nowhere.Body)
	}
	if rec := from("/c2/api"); rec.Code != http.StatusUnauthorized {
		t.Fatalf("third refusal: %d", rec.Code)
	}
	if rec := from("/c9/api"); rec.Code != http.StatusTooManyRequests {
		t.Fatalf("after the burst of 3 refusals: %d; want 429", rec.Code)
	}
}

// TestFirstPassThroughGoesAlone: a token passed through goes on a
// connection of its own until the cluster has accepted it, then on the
// shared one; one the cluster refuses never reaches the shared
// connection, and is answered from memory after.
func TestFirstPassThroughGoesAlone(t *testing.T) {
	w := newWorld(t)
	pool := w.pool()
	refused := w.c1.token(t, map[string]any{"iss": "https://kubernetes.default.svc", "sub": "system:serviceaccount:gone:sa", "aud": "other", "exp": 1 << 40})
	pool.answer = func(r *http.Request) *http.Response {
		code := http.StatusOK
		if r.Header.Get("Authorization") == "Bearer "+refused {
			code = http.StatusUnauthorized
		}
		return &http.Response{StatusCode: code, Header: http.Header{"Content-Type": {"application/json"}}, Body: http.NoBody, Request: r}
	}
	reg := prometheus.NewRegistry()
	g, err := New(configured(Options{Pool: pool, Reviewer: w.reviewer(), HubKeys: w.hubKeys(), PassThrough: true, Registerer: reg}))
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		serve(g, http.MethodGet, "/c1/api", bearer(w.c1Token))
	}
	for range 3 {
		if rec := serve(g, http.MethodGet, "/c1/api", bearer(refused)); rec.Code != http.StatusUnauthorized {
			t.Fatalf("a refused token: %d", rec.Code)
		}
	}
	// The hub identity shares the connection from the start.
	serve(g, http.MethodGet, "/c1/api", bearer(w.hubToken))
	if got, want := pool.sentAlone(), []bool{true, false, false, true, false}; !slices.Equal(got, want) {
		t.Fatalf("sent alone: %v; want %v (c1's token alone once, then shared; the refused token alone once, then not at all; the hub identity shared)", got, want)
	}
	for result, want := range map[string]float64{trialAccepted: 1, trialRefused: 1, trialError: 0} {
		if got := testutil.ToFloat64(g.m.trials.WithLabelValues(result)); got != want {
			t.Errorf("hubsync_gateway_trials_total{result=%q} = %v; want %v", result, got, want)
		}
	}
}

// TestClusterRefusalEndsTheExemption: a token the cluster refused is not
// "accepted lately" any more: once its refusal is forgotten, it pays its
// address's bucket like any stranger's instead of reaching the cluster
// again for free.
func TestClusterRefusalEndsTheExemption(t *testing.T) {
	w := newWorld(t)
	now := time.Unix(1_000_000, 0)
	pool := w.pool()
	pool.answer = func(r *http.Request) *http.Response {
		return &http.Response{StatusCode: http.StatusUnauthorized, Header: http.Header{}, Body: http.NoBody, Request: r}
	}
	g, err := New(configured(Options{Pool: pool, Reviewer: w.reviewer(), HubKeys: w.hubKeys(), PassThrough: true,
		RefusalsPerSecond: 0.0001, RefusalBurst: 2, Now: func() time.Time { return now }})) // a trial holds 2
	if err != nil {
		t.Fatal(err)
	}
	from := func() int {
		req := httptest.NewRequest(http.MethodGet, "https://gw/c1/api", nil)
		req.RemoteAddr = "10.7.7.7:1"
		req.Header.Set("Authorization", "Bearer "+w.c1Token)
		rec := httptest.NewRecorder()
		g.ServeHTTP(rec, req)
		return rec.Code
	}
	if code := from(); code != http.StatusUnauthorized {
		t.Fatalf("first: %d; want the cluster's 401", code)
	}
	now = now.Add(time.Minute) // the refusal is forgotten, the bucket still empty
	if code := from(); code != http.StatusTooManyRequests {
		t.Fatalf("after the refusal expired: %d; want 429", code)
	}
	if n := len(pool.requests()); n != 1 {
		t.Fatalf("the refused token reached the cluster %d times; want once", n)
	}
}

// TestTrialsHoldTheirAdmission: a token the cluster signed but has not
// accepted yet holds two tokens of its address's bucket (the check, and
// the connection of its own it costs the cluster) until the cluster
// answers: a stranger with many such tokens has at most half its
// bucket's worth at the cluster at once, and the rest get 429 without
// reaching it.
func TestTrialsHoldTheirAdmission(t *testing.T) {
	w := newWorld(t)
	pool := w.pool()
	gate := make(chan struct{})
	arrived := make(chan struct{}, 100)
	pool.answer = func(r *http.Request) *http.Response {
		arrived <- struct{}{}
		<-gate
		return &http.Response{StatusCode: http.StatusUnauthorized, Header: http.Header{}, Body: http.NoBody, Request: r}
	}
	g, err := New(configured(Options{Pool: pool, Reviewer: w.reviewer(), HubKeys: w.hubKeys(), PassThrough: true,
		RefusalsPerSecond: 0.0001, RefusalBurst: 10}))
	if err != nil {
		t.Fatal(err)
	}
	// One at a time: each either reaches the cluster (and waits there) or
	// is answered, before the next is sent.
	codes := make(chan int, 20)
	limited := 0
	for i := range 20 {
		tok := w.c1.token(t, map[string]any{"iss": "https://kubernetes.default.svc", "sub": fmt.Sprintf("system:serviceaccount:a:s%d", i), "aud": "other", "exp": 1 << 40})
		go func() {
			req := httptest.NewRequest(http.MethodGet, "https://gw/c1/api", nil)
			req.RemoteAddr = "10.8.8.8:1"
			req.Header.Set("Authorization", "Bearer "+tok)
			rec := httptest.NewRecorder()
			g.ServeHTTP(rec, req)
			codes <- rec.Code
		}()
		select {
		case <-arrived:
		case code := <-codes:
			if code != http.StatusTooManyRequests {
				t.Fatalf("request %d was answered %d while trials were at the cluster", i, code)
			}
			limited++
		case <-time.After(10 * time.Second):
			t.Fatalf("request %d neither reached the cluster nor was answered", i)
		}
	}
	if limited != 15 {
		t.Fatalf("%d of 20 requests limited; want 15, while 5 trials hold the bucket of 10", limited)
	}
	close(gate)
	for range 5 {
		if code := <-codes; code != http.StatusUnauthorized {
			t.Fatalf("a trial: %d; want the cluster's 401", code)
		}
	}
}
