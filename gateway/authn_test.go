package gateway

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hubsync/hubsync/config"
)

// fakeReviewer answers from a table and counts the reviews it was asked.
type fakeReviewer struct {
	mu    sync.Mutex
	users map[string]string // token -> username
	down  bool
	calls int
}

func (f *fakeReviewer) Review(_ context.Context, token string) (Identity, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.down {
		return Identity{}, false, errors.New("hub unreachable")
	}
	u, ok := f.users[token]
	if !ok {
		return Identity{}, false, nil
	}
	return Identity{Username: u}, true, nil
}

func TestCachedReviewer(t *testing.T) {
	now := time.Unix(1000, 0)
	clock := func() time.Time { return now }
	f := &fakeReviewer{users: map[string]string{"alice-token": "alice", "bob-token": "bob", "carol-token": "carol"}}
	hits := 0
	c := newCached(t, f, ReviewCacheOptions{TTL: time.Hour, Size: 2, MaxInFlight: config.DefaultGatewayMaxInFlightReviews,
		Now: clock, OnHit: func() { hits++ }}) // the TTL is capped at 10s
	ctx := context.Background()
	review := func(token string) (string, bool, error) {
		id, ok, err := c.Review(ctx, token)
		return id.Username, ok, err
	}

	steps := []struct {
		name      string
		do        func()
		token     string
		wantUser  string
		wantOK    bool
		wantErr   bool
		wantCalls int
	}{
		{name: "first review asks the hub", token: "alice-token", wantUser: "alice", wantOK: true, wantCalls: 1},
		{name: "again within the TTL: cached", token: "alice-token", wantUser: "alice", wantOK: true, wantCalls: 1},
		{name: "an unknown token asks the hub", token: "stranger", wantCalls: 2},
		{name: "and is never cached", token: "stranger", wantCalls: 3},
		{name: "revoked on the hub: still cached within the TTL", do: func() { delete(f.users, "alice-token"); now = now.Add(9 * time.Second) },
			token: "alice-token", wantUser: "alice", wantOK: true, wantCalls: 3},
		{name: "after 10s the revocation holds, whatever TTL was asked for", do: func() { now = now.Add(2 * time.Second) },
			token: "alice-token", wantCalls: 4},
		{name: "a hub outage is an error", do: func() { f.down = true }, token: "bob-token", wantErr: true, wantCalls: 5},
		{name: "and is never cached", do: func() { f.down = false }, token: "bob-token", wantUser: "bob", wantOK: true, wantCalls: 6},
		{name: "a second identity cached", token: "carol-token", wantUser: "carol", wantOK: true, wantCalls: 7},
		{name: "a third evicts the least recently used (bob)", do: func() { f.users["dave-token"] = "dave" }, token: "dave-token", wantUser: "dave", wantOK: true, wantCalls: 8},
		{name: "carol still cached", token: "carol-token", wantUser: "carol", wantOK: true, wantCalls: 8},
		{name: "bob asked again", token: "bob-token", wantUser: "bob", wantOK: true, wantCalls: 9},
	}
	for _, s := range steps {
		if s.do != nil {
			s.do()
		}
		u, ok, err := review(s.token)
		if u != s.wantUser || ok != s.wantOK || (err != nil) != s.wantErr || f.calls != s.wantCalls {
			t.Fatalf("%s: %q, %v, %v after %d hub reviews; want %q, %v, error %v after %d",
				s.name, u, ok, err, f.calls, s.wantUser, s.wantOK, s.wantErr, s.wantCalls)
		}
		if c.Len() > 2 {
			t.Fatalf("%s: %d reviews cached, bound 2", s.name, c.Len())
		}
	}
	if hits != 3 {
		t.Fatalf("%d cache hits counted, want 3", hits)
	}
}

// blockingReviewer counts reviews and holds each until release closes.
type blockingReviewer struct {
	n       atomic.Int32
	release chan struct{}
}

func (b *blockingReviewer) Review(context.Context, string) (Identity, bool, error) {
	b.n.Add(1)
	<-b.release
	return Identity{Username: "a"}, true, nil
}

func TestCachedReviewerOneReviewPerTokenInFlight(t *testing.T) {
	next := &blockingReviewer{release: make(chan struct{})}
	c := newCached(t, next, ReviewCacheOptions{TTL: time.Second, Size: 10, MaxInFlight: config.DefaultGatewayMaxInFlightReviews})
	var wg sync.WaitGroup
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, ok, err := c.Review(context.Background(), "tok"); !ok || err != nil {
				t.Errorf("review: %v %v", ok, err)
			}
		}()
	}
	// Wait until the one review is in flight, then let it answer.
	for next.n.Load() == 0 {
		runtime.Gosched()
	}
	close(next.release)
	wg.Wait()
	if n := next.n.Load(); n != 1 {
		t.Fatalf("%d TokenReviews for 50 concurrent requests of one token; want 1", n)
	}
}

// TestCachedReviewerInFlightBound: beyond MaxInFlight reviews waiting for
// the hub, a review fails at once with ErrReviewsBusy instead of queueing.
func TestCachedReviewerInFlightBound(t *testing.T) {
	next := &blockingReviewer{release: make(chan struct{})}
	c := newCached(t, next, ReviewCacheOptions{TTL: config.DefaultGatewayReviewCacheTTL, Size: config.DefaultGatewayReviewCacheSize, MaxInFlight: 2})
	var wg sync.WaitGroup
	for _, tok := range []string{"a", "b"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _, _ = c.Review(context.Background(), tok)
		}()
	}
	for next.n.Load() < 2 {
		runtime.Gosched()
	}
	if _, _, err := c.Review(context.Background(), "c"); !errors.Is(err, ErrReviewsBusy) {
		t.Fatalf("a third review with two in flight: %v; want ErrReviewsBusy", err)
	}
	close(next.release)
	wg.Wait()
	if _, ok, err := c.Review(context.Background(), "c"); !ok || err != nil {
		t.Fatalf("once the hub answered, a review goes through: %v %v", ok, err)
	}
}

// newCached builds a CachedReviewer from options the test fills.
func newCached(t *testing.T, next Reviewer, o ReviewCacheOptions) *CachedReviewer {
	t.Helper()
	c, err := NewCachedReviewer(next, o)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestTokenKeys: a token's key is its SHA-256 at every length around the
// hasher's buffer, from concurrent callers, and leaves no byte of the
// token in the pooled buffer.
func TestTokenKeys(t *testing.T) {
	var keys keyHashers
	var wg sync.WaitGroup
	for _, n := range []int{0, 1, 511, 512, 513, 1024, 1500, 4096} {
		token := strings.Repeat("t", n)
		want := tokenKey(sha256.Sum256([]byte(token)))
		for range 4 {
			wg.Go(func() {
				if got := keys.key(token); got != want {
					t.Errorf("key of a %d-byte token = %x, want %x", n, got, want)
				}
			})
		}
	}
	wg.Wait()
	k := &keyHasher{h: sha256.New()}
	if got, want := k.sum(strings.Repeat("s", 700)), tokenKey(sha256.Sum256([]byte(strings.Repeat("s", 700)))); got != want {
		t.Errorf("sum = %x, want %x", got, want)
	}
	if bytes.ContainsRune(k.buf[:], 's') {
		t.Error("the token stayed in the hasher's buffer")
	}
}
