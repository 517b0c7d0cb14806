package gateway

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"testing"
	"time"
)

// TestGatewayStrangers: refused requests spend their address's bucket;
// an address that has spent it gets 429 without a TokenReview, while a
// client whose token was accepted lately, or another address, is not
// slowed; the bucket refills.
func TestGatewayStrangers(t *testing.T) {
	w := newWorld(t)
	now := time.Unix(1000, 0)
	pool, rev := w.pool(), w.reviewer()
	g, err := New(configured(Options{Pool: pool, Reviewer: rev, HubKeys: w.hubKeys(), PassThrough: true,
		RefusalsPerSecond: 2, RefusalBurst: 10, Now: func() time.Time { return now }}))
	if err != nil {
		t.Fatal(err)
	}
	from := func(addr, token string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodGet, "https://gw/c1/api", nil)
		req.RemoteAddr = addr
		req.Header.Set("Authorization", "Bearer "+token)
		rec := httptest.NewRecorder()
		g.ServeHTTP(rec, req)
		return rec
	}
	// A legitimate client behind the attacker's address, accepted before
	// the flood.
	if rec := from("10.0.0.1:1000", w.hubToken); rec.Code != 200 {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
	reviews := rev.reviews()
	codes := map[int]int{}
	for i := range 100 {
		token := fmt.Sprintf("forged-opaque-token-%d", i)
		if i%2 == 1 {
			token = w.stranger.token(t, map[string]any{"iss": "x", "jti": i, "exp": 1 << 40})
		}
		rec := from(fmt.Sprintf("10.0.0.1:%d", 2000+i), token)
		codes[rec.Code]++
		if rec.Code == http.StatusTooManyRequests {
			if s, _ := strconv.Atoi(rec.Header().Get("Retry-After")); s < 1 {
				t.Fatalf("429 with Retry-After %q", rec.Header().Get("Retry-After"))
			}
		}
	}
	if codes[401] != 10 || codes[429] != 90 {
		t.Fatalf("codes %v; want 10 × 401 (the burst) and 90 × 429", codes)
	}
	if n := rev.reviews() - reviews; n != 10 {
		t.Fatalf("%d TokenReviews for 100 forged tokens; want 10 (the burst)", n)
	}
	if n := len(pool.requests()); n != 1 {
		t.Fatalf("%d requests reached the cluster; want only the legitimate one", n)
	}
	// The legitimate client's token is known: it is not limited, even
	// once its cached review expires.
	now = now.Add(MaxCacheTTL)
	if rec := from("10.0.0.1:1000", w.hubToken); rec.Code != 200 {
		t.Fatalf("a known token from a limited address: %d %s", rec.Code, rec.Body)
	}
	// Nor is another address, nor a cluster's own token.
	if rec := from("10.0.0.2:1000", "forged-opaque-token-x"); rec.Code != 401 {
		t.Fatalf("another address: %d", rec.Code)
	}
	if rec := from("[2001:db8::1]:1000", w.c1Token); rec.Code != 200 {
		t.Fatalf("a cluster token from another address: %d %s", rec.Code, rec.Body)
	}
	// The bucket refills at RefusalsPerSecond.
	now = now.Add(time.Second)
	if rec := from("10.0.0.1:3000", "forged-opaque-token-y"); rec.Code != 401 {
		t.Fatalf("after a second (two refusals refilled): %d; want 401", rec.Code)
	}
}

// TestKnownTokenBuysNothingElsewhere: a token accepted for one cluster
// (a cluster's own, or a hub token since revoked) is exempt from its
// address's limit for that cluster only: sent to made-up cluster names it
// is charged like any stranger's, and gets 429 once the burst is spent,
// without a TokenReview each.
func TestKnownTokenBuysNothingElsewhere(t *testing.T) {
	w := newWorld(t)
	now := time.Unix(1000, 0)
	pool, rev := w.pool(), w.reviewer()
	g, err := New(configured(Options{Pool: pool, Reviewer: rev, HubKeys: w.hubKeys(), PassThrough: true,
		RefusalsPerSecond: 1, RefusalBurst: 10, Now: func() time.Time { return now }}))
	if err != nil {
		t.Fatal(err)
	}
	from := func(cluster, token string) int {
		req := httptest.NewRequest(http.MethodGet, "https://gw/"+cluster+"/api", nil)
		req.RemoteAddr = "10.0.0.9:1000"
		req.Header.Set("Authorization", "Bearer "+token)
		rec := httptest.NewRecorder()
		g.ServeHTTP(rec, req)
		return rec.Code
	}
	for _, tt := range []struct {
		name   string
		token  string
		revoke bool
	}{
		{"a cluster's own token", w.c1Token, false},
		{"a hub token since revoked", w.hubToken, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			now = now.Add(time.Hour) // a full bucket
			if code := from("c1", tt.token); code != 200 {
				t.Fatalf("accepted for c1: %d", code)
			}
			if tt.revoke {
				delete(rev.ids, tt.token)
				now = now.Add(MaxCacheTTL) // the positive review has expired
			}
			reviews := rev.reviews()
			codes := map[int]int{}
			for i := range 100 {
				codes[from(fmt.Sprintf("made-up-%d", i), tt.token)]++
			}
			if codes[429] < 85 {
				t.Errorf("codes %v; want 429 once the burst of 10 is spent", codes)
			}
			if n := rev.reviews() - reviews; n > 10 {
				t.Errorf("%d TokenReviews for 100 made-up clusters; want at most the burst", n)
			}
		})
	}
}

// TestGatewayRefusalMemory: a token refused once is answered from memory
// (no second TokenReview), and a token a cluster refused is not sent to
// it again.
func TestGatewayRefusalMemory(t *testing.T) {
	w := newWorld(t)
	pool, rev := w.pool(), w.reviewer()
	pool.answer = func(r *http.Request) *http.Response {
		return &http.Response{StatusCode: 401, Header: http.Header{"Content-Type": {"application/json"}}, Body: http.NoBody, Request: r}
	}
	g, err := New(configured(Options{Pool: pool, Reviewer: rev, HubKeys: w.hubKeys(), PassThrough: true}))
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		serve(g, "GET", "/c1/api", bearer("forged-opaque-token"))
	}
	if n := rev.reviews(); n != 1 {
		t.Fatalf("%d TokenReviews for one refused token sent three times; want 1", n)
	}
	// The cluster refuses its own (revoked) token: it goes there once.
	for i := range 3 {
		rec := serve(g, "GET", "/c1/api", bearer(w.c1Token))
		if rec.Code != 401 {
			t.Fatalf("request %d: %d", i, rec.Code)
		}
	}
	if n := len(pool.requests()); n != 1 {
		t.Fatalf("a token the cluster refused reached it %d times; want 1", n)
	}
}

func TestClientAddress(t *testing.T) {
	for in, want := range map[string]string{
		"10.1.2.3:443":                 "10.1.2.3",
		"[::ffff:10.1.2.3]:443":        "10.1.2.3",
		"[2001:db8:1:2:3:4:5:6]:1":     "2001:db8:1:2::/64",
		"[2001:db8:1:2:ffff::1]:65000": "2001:db8:1:2::/64",
		"pipe":                         "pipe",
	} {
		if got := clientAddress(in); got != want {
			t.Errorf("clientAddress(%q) = %q; want %q", in, got, want)
		}
	}
}

// TestEvictionNeverRefills: with every bucket in use, a new address does
// not evict a spent bucket (which would refill it): it shares an overflow
// bucket with every address that found no room.
func TestEvictionNeverRefills(t *testing.T) {
	now := time.Unix(1000, 0)
	s := newStrangers(1, 3, 2, func() time.Time { return now })
	spend := func(addr string) (refused int) {
		for range 10 {
			if _, _, ok := s.admit(addr); !ok {
				refused++
			}
		}
		return refused
	}
	if n := spend("10.0.0.1"); n != 7 {
		t.Fatalf("10.0.0.1: %d of 10 refused; want 7 past the burst of 3", n)
	}
	spend("10.0.0.2")
	// Addresses rotated past the map's size: they share the overflow.
	for i := range 5 {
		s.admit(fmt.Sprintf("10.1.0.%d", i))
	}
	if _, _, ok := s.admit("10.0.0.1"); ok {
		t.Fatal("10.0.0.1's spent bucket was refilled by other addresses")
	}
	if _, _, ok := s.admit("10.1.0.9"); ok {
		t.Fatal("a new address without room got a full bucket of its own")
	}
	// Once the spent buckets would be full again, new addresses get room.
	now = now.Add(time.Minute)
	if _, _, ok := s.admit("10.2.0.1"); !ok {
		t.Fatal("a new address after the buckets refilled was refused")
	}
}

// TestClientOf: behind a trusted front proxy, the client a request is
// keyed by is the rightmost address the proxies did not add themselves;
// a connection from anywhere else is its own address, whatever it sends.
func TestClientOf(t *testing.T) {
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8")}
	for _, tt := range []struct {
		name, header, peer string
		values             []string
		want               string
	}{
		{name: "no header configured", peer: "10.1.1.1:5", values: []string{"203.0.113.7"}, want: "10.1.1.1"},
		{name: "a stranger names another client", header: "X-Forwarded-For", peer: "198.51.100.9:5", values: []string{"203.0.113.7"}, want: "198.51.100.9"},
		{name: "the proxy names the client", header: "X-Forwarded-For", peer: "10.1.1.1:5", values: []string{"203.0.113.7"}, want: "203.0.113.7"},
		{name: "two proxies", header: "X-Forwarded-For", peer: "10.1.1.1:5", values: []string{"203.0.113.7, 10.2.2.2"}, want: "203.0.113.7"},
		{name: "a client's own prefix is not believed", header: "X-Forwarded-For", peer: "10.1.1.1:5",
			values: []string{"192.0.2.1", "203.0.113.7"}, want: "203.0.113.7"},
		{name: "IPv6 by /64", header: "X-Real-Ip", peer: "[fd00::1]:5", values: []string{"2001:db8:1:2::9"}, want: "2001:db8:1:2::/64"},
		{name: "the proxy sets nothing", header: "X-Forwarded-For", peer: "10.1.1.1:5", want: "10.1.1.1"},
		{name: "not an address", header: "X-Forwarded-For", peer: "10.1.1.1:5", values: []string{"unknown"}, want: "10.1.1.1"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodGet, "https://gw/c1/api", nil)
			r.RemoteAddr = tt.peer
			for _, v := range tt.values {
				r.Header.Add("X-Forwarded-For", v)
				r.Header.Add("X-Real-Ip", v)
			}
			if got := clientOf(r, tt.header, trusted); got != tt.want {
				t.Errorf("clientOf = %q; want %q", got, tt.want)
			}
		})
	}
}

// TestAdmissionGivenBack: a check that passes gives its address's token
// back, also when time has moved on since it was taken (a TokenReview
// takes milliseconds).
func TestAdmissionGivenBack(t *testing.T) {
	now := time.Unix(1000, 0)
	s := newStrangers(0.0001, 1, 10, func() time.Time { return now })
	for i := range 5 {
		release, _, ok := s.admit("10.0.0.1")
		if !ok {
			t.Fatalf("check %d: refused, though every check before passed and gave its token back", i)
		}
		now = now.Add(50 * time.Millisecond)
		release()
		release() // at most once
	}
	if _, _, ok := s.admit("10.0.0.1"); !ok {
		t.Fatal("the bucket is empty after checks that passed")
	}
	if _, _, ok := s.admit("10.0.0.1"); ok {
		t.Fatal("a second token was taken from a bucket of one: giving back twice refilled it")
	}
}
