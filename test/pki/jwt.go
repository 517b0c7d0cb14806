package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	jose "github.com/go-jose/go-jose/v4"
)

// SignJWT signs claims as a compact JWT with key (an *rsa.PrivateKey or
// *ecdsa.PrivateKey), naming kid in its header when it is set.
func SignJWT(key any, kid string, claims map[string]any) (string, error) {
	alg := jose.RS256
	if _, ok := key.(*ecdsa.PrivateKey); ok {
		alg = jose.ES256
	}
	opts := (&jose.SignerOptions{}).WithType("JWT")
	if kid != "" {
		opts = opts.WithHeader(jose.HeaderKey("kid"), kid)
	}
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: alg, Key: key}, opts)
	if err != nil {
		return "", err
	}
	payload, err := json.Marshal(claims)
	if err != nil {
		return "", err
	}
	obj, err := signer.Sign(payload)
	if err != nil {
		return "", err
	}
	return obj.CompactSerialize()
}

// SelfSignedJWT is what a forger can make: a ServiceAccount-shaped token
// for issuer and sub, valid for an hour, signed with a new key of its own
// that names kid.
func SelfSignedJWT(issuer, sub, kid string) (string, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", err
	}
	now := time.Now()
	return SignJWT(key, kid, map[string]any{"iss": issuer, "aud": []string{issuer}, "sub": sub,
		"exp": now.Add(time.Hour).Unix(), "iat": now.Unix(), "nbf": now.Unix()})
}

// JWTID returns the jti claim of token, a compact JWT, without verifying
// it: tests tell tokens apart by it, as kube-apiserver does in the
// credential id of the requests made with them.
func JWTID(token string) (string, error) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return "", errors.New("not a JWT")
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return "", fmt.Errorf("JWT payload: %w", err)
	}
	var claims struct {
		JTI string `json:"jti"`
	}
	if err := json.Unmarshal(payload, &claims); err != nil || claims.JTI == "" {
		return "", errors.New("JWT without jti")
	}
	return claims.JTI, nil
}
