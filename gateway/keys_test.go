package gateway

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
)

func jwsOf(t *testing.T, token string) *jose.JSONWebSignature {
	t.Helper()
	j := parseJWT(token)
	if j == nil {
		t.Fatal("not a JWT")
	}
	return j.jws
}

// TestKeySet: a set is fetched when first needed, again for a key id it
// lacks (at most every MinRefetch), keeps its keys through a failed
// routine refresh, and fails a refetch it cannot make.
func TestKeySet(t *testing.T) {
	old, rotated, stranger := newSigner(t, "k1"), newSigner(t, "k2"), newSigner(t, "k3")
	now := time.Unix(1000, 0)
	serve, fail := old, false
	fetches := 0
	keys := &KeySet{Now: func() time.Time { return now }, Fetch: func(context.Context) ([]byte, error) {
		fetches++
		if fail {
			return nil, errors.New("connection refused")
		}
		return serve.jwks(), nil
	}}
	ctx := context.Background()
	verify := func(s signer) (bool, error) {
		_, ok, err := keys.Verify(ctx, jwsOf(t, s.token(t, map[string]any{"iss": "x"})))
		return ok, err
	}
	steps := []struct {
		name        string
		do          func()
		token       signer
		wantOK      bool
		wantErr     bool
		wantFetches int
	}{
		{name: "first use fetches", token: old, wantOK: true, wantFetches: 1},
		{name: "then the set answers", token: old, wantOK: true, wantFetches: 1},
		{name: "a key the issuer just added: fetched again", do: func() { serve = rotated; now = now.Add(time.Minute) },
			token: rotated, wantOK: true, wantFetches: 2},
		{name: "an unknown key right after: not fetched again within MinRefetch", token: stranger, wantFetches: 2},
		{name: "and again", token: stranger, wantFetches: 2},
		{name: "after MinRefetch an unknown key fetches once more", do: func() { now = now.Add(31 * time.Second) }, token: stranger, wantFetches: 3},
		{name: "a refetch that fails is an error, never an answer", do: func() { fail = true; now = now.Add(31 * time.Second) },
			token: stranger, wantErr: true, wantFetches: 4},
		{name: "a failing issuer is not asked once per request", token: stranger, wantErr: true, wantFetches: 4},
		{name: "known keys still verify while it fails", token: rotated, wantOK: true, wantFetches: 4},
		{name: "a routine refresh that fails keeps the set", do: func() { now = now.Add(11 * time.Minute) }, token: rotated, wantOK: true, wantFetches: 5},
	}
	for _, s := range steps {
		if s.do != nil {
			s.do()
		}
		ok, err := verify(s.token)
		if ok != s.wantOK || (err != nil) != s.wantErr || fetches != s.wantFetches {
			t.Fatalf("%s: %v, %v after %d fetches; want %v, error %v after %d", s.name, ok, err, fetches, s.wantOK, s.wantErr, s.wantFetches)
		}
	}
	never := &KeySet{Fetch: func(context.Context) ([]byte, error) { return nil, errors.New("forbidden") }}
	if _, _, err := never.Verify(ctx, jwsOf(t, old.token(t, nil))); err == nil {
		t.Fatal("a set never fetched verified a token")
	}
}

// TestGatewayHubKeyAddedLately: a hub token signed with a key the hub
// published after the gateway's last fetch is never passed through: its
// key id is unknown, so the hub's set is fetched again; when that fetch
// fails, 503.
func TestGatewayHubKeyAddedLately(t *testing.T) {
	w := newWorld(t)
	now := time.Unix(1000, 0)
	newHubKey := newSigner(t, "hub-key-2")
	published := w.hub
	hubFails := false
	hub := &KeySet{Now: func() time.Time { return now }, Fetch: func(context.Context) ([]byte, error) {
		if hubFails {
			return nil, errors.New("hub away")
		}
		return published.jwks(), nil
	}}
	pool := w.pool()
	g, err := New(configured(Options{Pool: pool, Reviewer: w.reviewer(), HubKeys: hub, PassThrough: true, Now: func() time.Time { return now }}))
	if err != nil {
		t.Fatal(err)
	}
	// The gateway fetches the hub's keys (one key).
	if rec := serve(g, "GET", "/c1/api", bearer(w.c1Token)); rec.Code != 200 {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
	// The hub adds a key and signs a token (expired, revoked: refused by
	// the TokenReview) with it, within seconds.
	published = newHubKey
	tok := newHubKey.token(t, map[string]any{"iss": "https://kubernetes.default.svc", "exp": 1 << 40})
	now = now.Add(40 * time.Second)
	hubFails = true
	if rec := serve(g, "GET", "/c1/api", bearer(tok)); rec.Code != 503 {
		t.Fatalf("a token with a key id nobody knows, while the hub's keys cannot be fetched: %d %s; want 503", rec.Code, rec.Body)
	}
	hubFails = false
	now = now.Add(2 * time.Second)
	if rec := serve(g, "GET", "/c1/api", bearer(tok)); rec.Code != 401 {
		t.Fatalf("once the hub's new key is fetched: %d %s; want 401", rec.Code, rec.Body)
	}
	if n := len(pool.requests()); n != 1 {
		t.Fatalf("%d requests reached the cluster; want only the first", n)
	}
}

// TestGatewayLogsUnidentifiedHubIssuers: a JWT the hub accepts that no
// hub key signs and whose issuer is not in HubIssuers names an issuer the
// operator should list; it is logged once.
func TestGatewayLogsUnidentifiedHubIssuers(t *testing.T) {
	w := newWorld(t)
	var logs strings.Builder
	rev := w.reviewer()
	rev.ids[w.oidc] = Identity{Username: "bob"}
	g, err := New(configured(Options{Pool: w.pool(), Reviewer: rev, HubKeys: w.hubKeys(), PassThrough: true, ReviewCacheTTL: time.Nanosecond,
		Log: slog.New(slog.NewTextHandler(&logs, nil))}))
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if rec := serve(g, "GET", "/c2/api", bearer(w.oidc)); rec.Code != 200 {
			t.Fatalf("%d %s", rec.Code, rec.Body)
		}
	}
	if n := strings.Count(logs.String(), "add it to gateway.hubIssuers"); n != 1 || !strings.Contains(logs.String(), "https://dex.example") {
		t.Fatalf("logged %d times; want once, naming the issuer:\n%s", n, logs.String())
	}
}
