package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/hubsync/hubsync/config"
	"golang.org/x/sync/singleflight"
)

// signatureAlgorithms are those Kubernetes service-account and OIDC
// issuers use.
var signatureAlgorithms = []jose.SignatureAlgorithm{
	jose.RS256, jose.RS384, jose.RS512, jose.PS256, jose.PS384, jose.PS512,
	jose.ES256, jose.ES384, jose.ES512, jose.EdDSA,
}

// failedFetchBackoff keeps a key set that cannot be fetched from being
// asked for once per request.
const failedFetchBackoff = time.Second

// KeySet is one issuer's service-account public keys: the JWKS document
// a kube-apiserver serves at /openid/v1/jwks. It is fetched when first
// needed, again every RefreshEvery, and again (at most every MinRefetch)
// when a token names a key id the set lacks, since an issuer that rotates
// its keys publishes the new one before signing with it. No lock is held
// while fetching: concurrent callers share one fetch.
type KeySet struct {
	// Fetch returns the JWKS document; required.
	Fetch func(ctx context.Context) ([]byte, error)
	// RefreshEvery and MinRefetch, when zero, are hubsync's
	// (config.DefaultGatewayKeyRefresh, DefaultGatewayKeyMinRefetch), so
	// that a key set stands on its own (the hub's, a test's).
	RefreshEvery, MinRefetch time.Duration
	// Now is the clock; time.Now when nil.
	Now func() time.Time
	// OnFetch, if set, is called after every fetch with its error.
	OnFetch func(error)

	mu        sync.Mutex
	keys      *jose.JSONWebKeySet
	fetched   time.Time
	attempted time.Time
	lastErr   error
	flight    singleflight.Group
}

func (k *KeySet) now() time.Time {
	if k.Now != nil {
		return k.Now()
	}
	return time.Now()
}

// Verify checks the token's signature against the set. A signature no
// key verifies, from a token naming a key id the set lacks, makes the set
// be fetched again (unless it is younger than MinRefetch) and checked
// once more. payload is the verified payload. err means the set could not
// be had (never fetched, or a refetch for an unknown key id failed): the
// caller cannot tell who signed the token and must not trust it either
// way.
func (k *KeySet) Verify(ctx context.Context, jws *jose.JSONWebSignature) (payload []byte, ok bool, err error) {
	return k.verify(ctx, jws, true)
}

// verify is Verify; refetchUnknown false checks only the set as it is
// (fetched when missing or older than RefreshEvery).
func (k *KeySet) verify(ctx context.Context, jws *jose.JSONWebSignature, refetchUnknown bool) ([]byte, bool, error) {
	keys, err := k.get(ctx, false)
	if err != nil {
		return nil, false, err
	}
	if p, ok := verifyWith(jws, keys); ok {
		return p, true, nil
	}
	if refetchUnknown && !k.Knows(jws) {
		return k.verifyRefetched(ctx, jws)
	}
	return nil, false, nil
}

// verifyRefetched checks the token against the set fetched again (unless
// it is younger than MinRefetch), for a token naming a key id the set
// lacks and already checked against the set as it was.
func (k *KeySet) verifyRefetched(ctx context.Context, jws *jose.JSONWebSignature) ([]byte, bool, error) {
	keys, err := k.get(ctx, true)
	if err != nil {
		return nil, false, err
	}
	p, ok := verifyWith(jws, keys)
	return p, ok, nil
}

// verifyFetchedSince checks the token against the set as fetched at or
// after since, fetching it again first when it is older, whatever
// MinRefetch says (the caller bounds how often since moves).
func (k *KeySet) verifyFetchedSince(ctx context.Context, jws *jose.JSONWebSignature, since time.Time) ([]byte, bool, error) {
	keys, err := k.getSince(ctx, false, since)
	if err != nil {
		return nil, false, err
	}
	p, ok := verifyWith(jws, keys)
	return p, ok, nil
}

// fetchedAt is when the set was last fetched.
func (k *KeySet) fetchedAt() time.Time {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.fetched
}

// Knows reports whether the set (as last fetched) holds the key id the
// token names. A token that names none is "known": there is nothing to
// refetch for.
func (k *KeySet) Knows(jws *jose.JSONWebSignature) bool {
	kid := jws.Signatures[0].Header.KeyID
	if kid == "" {
		return true
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.keys != nil && len(k.keys.Key(kid)) > 0
}

// verifyWith tries every key of the set, whatever key id the token names
// (the API server does not require one).
func verifyWith(jws *jose.JSONWebSignature, keys *jose.JSONWebKeySet) ([]byte, bool) {
	for _, key := range keys.Keys {
		if p, err := jws.Verify(key.Key); err == nil {
			return p, true
		}
	}
	return nil, false
}

// get returns the set, fetching it when it is missing or older than
// RefreshEvery, or (refetch) older than MinRefetch. A routine refresh that
// fails keeps the previous set (issuers rarely change keys, and refusing
// every request while the issuer is away helps no one); a refetch that
// fails is an error.
func (k *KeySet) get(ctx context.Context, refetch bool) (*jose.JSONWebKeySet, error) {
	return k.getSince(ctx, refetch, time.Time{})
}

// getSince is get, with a set fetched before since stale too.
func (k *KeySet) getSince(ctx context.Context, refetch bool, since time.Time) (*jose.JSONWebKeySet, error) {
	every, minimum := k.RefreshEvery, k.MinRefetch
	if every <= 0 {
		every = config.DefaultGatewayKeyRefresh
	}
	if minimum <= 0 {
		minimum = config.DefaultGatewayKeyMinRefetch
	}
	now := k.now()
	k.mu.Lock()
	keys, age, sinceAttempt, lastErr := k.keys, now.Sub(k.fetched), now.Sub(k.attempted), k.lastErr
	older := k.fetched.Before(since)
	k.mu.Unlock()
	stale := keys == nil || age >= every || older
	if !stale && (!refetch || age < minimum) {
		return keys, nil
	}
	if lastErr != nil && sinceAttempt < failedFetchBackoff {
		if keys != nil && !refetch && !older {
			return keys, nil
		}
		return nil, lastErr
	}
	v, err, _ := k.flight.Do("", func() (any, error) {
		// Shared by every waiter: one client going away must not fail
		// the others' fetch.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), reviewTimeout)
		defer cancel()
		data, err := k.Fetch(ctx)
		var set jose.JSONWebKeySet
		if err == nil {
			if err = json.Unmarshal(data, &set); err != nil {
				err = fmt.Errorf("not a JSON Web Key Set: %w", err)
			}
		}
		if k.OnFetch != nil {
			k.OnFetch(err)
		}
		k.mu.Lock()
		defer k.mu.Unlock()
		k.attempted = now
		if err != nil {
			k.lastErr = fmt.Errorf("fetching service-account keys: %w", err)
			return nil, k.lastErr
		}
		k.keys, k.fetched, k.lastErr = &set, now, nil
		return &set, nil
	})
	if err != nil {
		if keys != nil && !refetch && !older {
			return keys, nil
		}
		return nil, err
	}
	return v.(*jose.JSONWebKeySet), nil
}

// jwt is a bearer token that parses as a compact JWS with one signature,
// with the claims the gateway reads. The claims are only trusted once a
// key set has verified the signature.
type jwt struct {
	jws    *jose.JSONWebSignature
	claims jwtClaims
}

type jwtClaims struct {
	Issuer    string   `json:"iss"`
	Subject   string   `json:"sub"`
	Expiry    *float64 `json:"exp"`
	NotBefore *float64 `json:"nbf"`
}

// parseJWT returns nil for a token that is not a JWT.
func parseJWT(token string) *jwt {
	jws, err := jose.ParseSigned(token, signatureAlgorithms)
	if err != nil || len(jws.Signatures) != 1 {
		return nil
	}
	t := &jwt{jws: jws}
	if err := json.Unmarshal(jws.UnsafePayloadWithoutVerification(), &t.claims); err != nil {
		return nil
	}
	return t
}

// clockSkew is how far the gateway's clock may be from an issuer's when
// it reads a token's validity.
const clockSkew = time.Minute

// expired reports a token past its exp (or before its nbf) at now. A
// token without exp never expires by its claims.
func (c jwtClaims) expired(now time.Time) bool {
	at := float64(now.Unix())
	return c.Expiry != nil && at >= *c.Expiry || c.NotBefore != nil && at+clockSkew.Seconds() < *c.NotBefore
}

// expiry is the token's exp, or zero.
func (c jwtClaims) expiry() time.Time {
	if c.Expiry == nil {
		return time.Time{}
	}
	return time.Unix(int64(*c.Expiry), 0)
}

// issuedBy reports whether the claims name one of issuers.
func (c jwtClaims) issuedBy(issuers []string) bool {
	return c.Issuer != "" && slices.Contains(issuers, c.Issuer)
}
