package gateway

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
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
		// status.error says why ("invalid bearer token"): a refusal all
		// the same.
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

// ErrReviewsBusy is a review refused because MaxInFlight reviews are
// already waiting for the hub: the client is told to come back, and the
// hub is not asked more than it can answer.
var ErrReviewsBusy = errors.New("too many hub TokenReviews in flight")

// ReviewCacheOptions configure a CachedReviewer. TTL, Size and
// MaxInFlight are required.
type ReviewCacheOptions struct {
	// TTL bounds how long a positive review is trusted; more than
	// MaxCacheTTL is cut to MaxCacheTTL.
	TTL time.Duration
	// Size bounds how many reviews are kept.
	Size int
	// MaxInFlight bounds the TokenReviews waiting for the hub at once;
	// beyond it Review fails with ErrReviewsBusy.
	MaxInFlight int
	// Now is the clock; time.Now when nil.
	Now func() time.Time
	// OnHit, if set, is called on every cache hit (for a metric).
	OnHit func()
	// OnReview, if set, is called after every review sent to next (the
	// hub), with its result (ReviewAuthenticated, ReviewUnauthenticated
	// or ReviewError) and how long it took by Now (for a metric).
	OnReview func(result string, took time.Duration)
}

// The results OnReview reports.
const (
	ReviewAuthenticated   = "authenticated"
	ReviewUnauthenticated = "unauthenticated"
	ReviewError           = "error"
)

// CachedReviewer remembers positive reviews for at most TTL and at most
// Size tokens, least recently used first out. Refusals and errors are
// never cached here (the gateway keeps refusals apart, briefly). Tokens
// are kept only as their SHA-256.
type CachedReviewer struct {
	next     Reviewer
	o        ReviewCacheOptions
	reviews  *expiring[tokenKey, Identity]
	inFlight chan struct{}
	keys     keyHashers
	// flight makes concurrent misses of one token (every request in
	// flight when its entry expires) send one TokenReview.
	flight singleflight.Group
}

// tokenKey identifies a token without holding it.
type tokenKey [sha256.Size]byte

// keyHashers compute a token's key, its SHA-256, on the hot path without
// allocating: sha256.Sum256([]byte(token)) allocates both the hasher (an
// interface) and the token's copy, which escapes through it.
type keyHashers struct{ pool sync.Pool }

// keyHasher is a hasher with a buffer it reads a token through.
type keyHasher struct {
	h   hash.Hash
	buf [512]byte
}

func (p *keyHashers) key(token string) tokenKey {
	k, _ := p.pool.Get().(*keyHasher)
	if k == nil {
		k = &keyHasher{h: sha256.New()}
	}
	defer p.pool.Put(k)
	return k.sum(token)
}

// sum is token's SHA-256; no part of the token stays behind in k.
func (k *keyHasher) sum(token string) tokenKey {
	k.h.Reset()
	for rest := token; len(rest) > 0; {
		n := copy(k.buf[:], rest)
		_, _ = k.h.Write(k.buf[:n])
		rest = rest[n:]
	}
	clear(k.buf[:min(len(token), len(k.buf))])
	var key tokenKey
	k.h.Sum(key[:0])
	return key
}

// NewCachedReviewer wraps next.
func NewCachedReviewer(next Reviewer, o ReviewCacheOptions) (*CachedReviewer, error) {
	if err := missing("review cache", []requirement{{"TTL", o.TTL > 0}, {"Size", o.Size > 0}, {"MaxInFlight", o.MaxInFlight > 0}}); err != nil {
		return nil, err
	}
	// A revoked hub token must stop working quickly, whatever the caller
	// asked for.
	o.TTL = min(o.TTL, MaxCacheTTL)
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.OnHit == nil {
		o.OnHit = func() {}
	}
	if o.OnReview == nil {
		o.OnReview = func(string, time.Duration) {}
	}
	return &CachedReviewer{next: next, o: o, reviews: newExpiring[tokenKey, Identity](o.Size),
		inFlight: make(chan struct{}, o.MaxInFlight)}, nil
}

// Review answers from the cache when a positive review of token is fresh,
// else asks next.
func (c *CachedReviewer) Review(ctx context.Context, token string) (Identity, bool, error) {
	return c.review(ctx, c.keys.key(token), token)
}

// cached returns the identity of a fresh positive review of key.
func (c *CachedReviewer) cached(key tokenKey) (Identity, bool) {
	id, ok := c.reviews.get(key, c.o.Now())
	if ok {
		c.o.OnHit()
	}
	return id, ok
}

func (c *CachedReviewer) review(ctx context.Context, key tokenKey, token string) (Identity, bool, error) {
	if id, ok := c.cached(key); ok {
		return id, true, nil
	}
	v, err, _ := c.flight.Do(string(key[:]), func() (any, error) {
		// A flight that ended just before this one may have cached it.
		if id, ok := c.reviews.get(key, c.o.Now()); ok {
			return reviewed{id: id, ok: true}, nil
		}
		select {
		case c.inFlight <- struct{}{}:
			defer func() { <-c.inFlight }()
		default:
			return nil, ErrReviewsBusy
		}
		// Shared by every waiter: one client going away must not fail
		// the others' review.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), reviewTimeout)
		defer cancel()
		asked := c.o.Now()
		id, ok, err := c.next.Review(ctx, token)
		c.o.OnReview(reviewResult(ok, err), c.o.Now().Sub(asked))
		if err == nil && ok {
			// Trusted for TTL from when the hub was asked, and never past
			// the token's own expiry (read unverified: it can only
			// shorten the trust).
			until := asked.Add(c.o.TTL)
			if t := parseJWT(token); t != nil {
				if exp := t.claims.expiry(); !exp.IsZero() && exp.Before(until) {
					until = exp
				}
			}
			c.reviews.put(key, id, until)
		}
		return reviewed{id: id, ok: ok}, err
	})
	if err != nil {
		return Identity{}, false, err
	}
	r := v.(reviewed)
	return r.id, r.ok, nil
}

// reviewResult names what came of a review sent to the hub.
func reviewResult(ok bool, err error) string {
	switch {
	case err != nil:
		return ReviewError
	case ok:
		return ReviewAuthenticated
	}
	return ReviewUnauthenticated
}

type reviewed struct {
	id Identity
	ok bool
}

// Len is how many reviews are cached.
func (c *CachedReviewer) Len() int { return c.reviews.len() }
