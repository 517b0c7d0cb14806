package gateway

import (
	"container/list"
	"context"
	"crypto/sha256"
	"fmt"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Reviewer asks whether a token is a hub identity. ok is false for a
// token the hub does not recognise; err is for a review that could not be
// made (the hub unreachable), which must never be taken as either answer.
type Reviewer interface {
	Review(ctx context.Context, token string) (id Identity, ok bool, err error)
}

// TokenReviewer asks the hub's TokenReview API.
type TokenReviewer struct {
	Kube kubernetes.Interface
}

// Review sends a TokenReview for token.
func (r TokenReviewer) Review(ctx context.Context, token string) (Identity, bool, error) {
	tr, err := r.Kube.AuthenticationV1().TokenReviews().Create(ctx,
		&authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: token}}, metav1.CreateOptions{})
	if err != nil {
		// The error is the API server's; it never holds the token.
		return Identity{}, false, fmt.Errorf("hub TokenReview: %w", err)
	}
	if !tr.Status.Authenticated {
		return Identity{}, false, nil
	}
	u := tr.Status.User
	id := Identity{Username: u.Username, UID: u.UID, Groups: u.Groups}
	if len(u.Extra) > 0 {
		id.Extra = make(map[string][]string, len(u.Extra))
		for k, v := range u.Extra {
			id.Extra[k] = v
		}
	}
	return id, true, nil
}

// reviewTimeout bounds one TokenReview.
const reviewTimeout = 10 * time.Second

// MaxCacheTTL bounds how long a positive review is trusted: a revoked or
// expired hub token stops working within it.
const MaxCacheTTL = 10 * time.Second

// CachedReviewer remembers positive reviews for at most TTL (never more
// than MaxCacheTTL) and at most Size tokens, least recently used first out.
// Refusals and errors are never cached. Tokens are kept only as their
// SHA-256.
type CachedReviewer struct {
	next Reviewer
	ttl  time.Duration
	size int
	now  func() time.Time

	mu      sync.Mutex
	entries map[[32]byte]*list.Element
	order   *list.List // front: most recently used
	hits    func()
	// flight makes concurrent misses of one token (every request in
	// flight when its entry expires) send one TokenReview.
	flight singleflight.Group
}

type cached struct {
	key     [32]byte
	id      Identity
	expires time.Time
}

// NewCachedReviewer wraps next. now is the clock (time.Now when nil);
// onHit, if set, is called on every cache hit (for a metric).
func NewCachedReviewer(next Reviewer, ttl time.Duration, size int, now func() time.Time, onHit func()) *CachedReviewer {
	if ttl <= 0 || ttl > MaxCacheTTL {
		ttl = MaxCacheTTL
	}
	if size <= 0 {
		size = 10000
	}
	if now == nil {
		now = time.Now
	}
	if onHit == nil {
		onHit = func() {}
	}
	return &CachedReviewer{next: next, ttl: ttl, size: size, now: now, hits: onHit,
		entries: map[[32]byte]*list.Element{}, order: list.New()}
}

// Review answers from the cache when a positive review of token is fresh,
// else asks next.
func (c *CachedReviewer) Review(ctx context.Context, token string) (Identity, bool, error) {
	key := sha256.Sum256([]byte(token))
	now := c.now()
	c.mu.Lock()
	if el, ok := c.entries[key]; ok {
		e := el.Value.(*cached)
		if now.Before(e.expires) {
			c.order.MoveToFront(el)
			c.mu.Unlock()
			c.hits()
			return e.id, true, nil
		}
		c.order.Remove(el)
		delete(c.entries, key)
	}
	c.mu.Unlock()
	v, err, _ := c.flight.Do(string(key[:]), func() (any, error) {
		// A flight that ended just before this one may have cached it.
		if id, ok := c.fresh(key); ok {
			return reviewed{id: id, ok: true}, nil
		}
		// Shared by every waiter: one client going away must not fail
		// the others' review.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), reviewTimeout)
		defer cancel()
		asked := c.now()
		id, ok, err := c.next.Review(ctx, token)
		if err == nil && ok {
			// Trusted for ttl from when the hub was asked; refusals and
			// errors are never cached.
			c.store(key, id, asked.Add(c.ttl))
		}
		return reviewed{id: id, ok: ok}, err
	})
	if err != nil {
		return Identity{}, false, err
	}
	r := v.(reviewed)
	return r.id, r.ok, nil
}

// store caches a positive review, evicting the least recently used.
func (c *CachedReviewer) store(key [32]byte, id Identity, expires time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.entries[key]; ok {
		c.order.Remove(el)
	}
	c.entries[key] = c.order.PushFront(&cached{key: key, id: id, expires: expires})
	for c.order.Len() > c.size {
		oldest := c.order.Back()
		c.order.Remove(oldest)
		delete(c.entries, oldest.Value.(*cached).key)
	}
}

// fresh returns the cached identity for key while it is fresh.
func (c *CachedReviewer) fresh(key [32]byte) (Identity, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.entries[key]; ok {
		if e := el.Value.(*cached); c.now().Before(e.expires) {
			return e.id, true
		}
	}
	return Identity{}, false
}

type reviewed struct {
	id Identity
	ok bool
}

// Len is how many reviews are cached.
func (c *CachedReviewer) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.order.Len()
}
