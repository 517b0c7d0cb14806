package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	jose "github.com/go-jose/go-jose/v4"
)

// TokenKind is what a token the hub's TokenReview refused turned out to be.
type TokenKind int

const (
	// TokenOpaque is not a JWT: the gateway cannot tell whose it is, so it
	// never passes one through.
	TokenOpaque TokenKind = iota
	// TokenHub is a JWT the hub signed (its service-account keys) or one
	// naming a configured hub issuer: an expired, revoked or
	// wrong-audience hub token. Never forwarded.
	TokenHub
	// TokenForeign is a JWT the hub did not sign, such as a managed
	// cluster's ServiceAccount token: it may pass through and act as itself.
	TokenForeign
)

// signatureAlgorithms are those Kubernetes service-account and OIDC
// issuers use.
var signatureAlgorithms = []jose.SignatureAlgorithm{
	jose.RS256, jose.RS384, jose.RS512, jose.PS256, jose.PS384, jose.PS512,
	jose.ES256, jose.ES384, jose.ES512, jose.EdDSA,
}

// HubKeys tells a hub token from any other. The hub's service-account
// public keys come from its /openid/v1/jwks endpoint (readable by every
// ServiceAccount by default), fetched again every RefreshEvery and at most
// every MinRefetch when a token names a key the set lacks (the hub rotated
// its keys). A token is the hub's when a hub key verifies its signature,
// or when its issuer is one of Issuers (the hub's OIDC issuers, whose keys
// the hub does not publish). Expiry and audience are deliberately not
// checked: an expired hub token is still the hub's.
type HubKeys struct {
	// Fetch returns the hub's JWKS document.
	Fetch func(ctx context.Context) ([]byte, error)
	// Issuers are further issuers whose tokens are hub tokens.
	Issuers []string
	// RefreshEvery and MinRefetch default to 10m and 30s.
	RefreshEvery, MinRefetch time.Duration
	// Now is the clock; time.Now when nil.
	Now func() time.Time

	mu        sync.Mutex
	keys      *jose.JSONWebKeySet
	fetched   time.Time
	attempted time.Time
	lastErr   error
}

func (h *HubKeys) now() time.Time {
	if h.Now != nil {
		return h.Now()
	}
	return time.Now()
}

// Classify says what a token the hub refused is. err is for a key set
// that could not be fetched: the caller must then refuse the request,
// since it cannot tell a hub token from another.
func (h *HubKeys) Classify(ctx context.Context, token string) (TokenKind, error) {
	jws, err := jose.ParseSigned(token, signatureAlgorithms)
	if err != nil || len(jws.Signatures) != 1 {
		return TokenOpaque, nil
	}
	var claims struct {
		Issuer string `json:"iss"`
	}
	if err := json.Unmarshal(jws.UnsafePayloadWithoutVerification(), &claims); err != nil {
		return TokenOpaque, nil
	}
	for _, iss := range h.Issuers {
		if claims.Issuer == iss {
			return TokenHub, nil
		}
	}
	keys, err := h.keySet(ctx, false)
	if err != nil {
		return TokenOpaque, err
	}
	if signedBy(jws, keys) {
		return TokenHub, nil
	}
	// A key the set lacks may be one the hub has just added.
	if kid := jws.Signatures[0].Header.KeyID; kid != "" && len(keys.Key(kid)) == 0 {
		if keys, err = h.keySet(ctx, true); err != nil {
			return TokenOpaque, err
		}
		if signedBy(jws, keys) {
			return TokenHub, nil
		}
	}
	return TokenForeign, nil
}

// signedBy reports whether any key of the set verifies the signature,
// whatever key id the token names (the API server does not require one).
func signedBy(jws *jose.JSONWebSignature, keys *jose.JSONWebKeySet) bool {
	for _, k := range keys.Keys {
		if _, err := jws.Verify(k.Key); err == nil {
			return true
		}
	}
	return false
}

// keySet returns the cached key set, fetching it when it is older than
// RefreshEvery, or (refetch) older than MinRefetch.
func (h *HubKeys) keySet(ctx context.Context, refetch bool) (*jose.JSONWebKeySet, error) {
	every, minimum := h.RefreshEvery, h.MinRefetch
	if every <= 0 {
		every = 10 * time.Minute
	}
	if minimum <= 0 {
		minimum = 30 * time.Second
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.now()
	age := now.Sub(h.fetched)
	if h.keys != nil && (age < every && (!refetch || age < minimum)) {
		return h.keys, nil
	}
	// A failed fetch is not tried again for a while, so that a hub that
	// is away is not asked once per request.
	if since := now.Sub(h.attempted); h.lastErr != nil && since < time.Second || h.keys != nil && since < minimum {
		if h.keys != nil {
			return h.keys, nil
		}
		return nil, h.lastErr
	}
	h.attempted = now
	data, err := h.Fetch(ctx)
	if err == nil {
		var set jose.JSONWebKeySet
		if err = json.Unmarshal(data, &set); err == nil {
			h.keys, h.fetched, h.lastErr = &set, now, nil
			return h.keys, nil
		}
		err = fmt.Errorf("the hub's JWKS is not a key set: %w", err)
	}
	h.lastErr = fmt.Errorf("fetching the hub's service-account keys: %w", err)
	if h.keys != nil {
		// Keep answering with the last good set; the hub's keys rarely
		// change, and refusing everything while it is away helps no one.
		return h.keys, nil
	}
	return nil, h.lastErr
}
