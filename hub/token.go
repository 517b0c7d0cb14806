package hub

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// TokenFingerprint is "sha256:" and 16 hex digits of the token's SHA-256:
// enough to tell two tokens apart, useless for recovering one.
func TokenFingerprint(token []byte) string {
	sum := sha256.Sum256(token)
	return "sha256:" + hex.EncodeToString(sum[:])[:16]
}

// JWTExpiry reads the exp claim of a JWT without verifying it. ok is false
// when the token is not a JWT or has no usable exp claim.
func JWTExpiry(token []byte) (time.Time, bool) {
	parts := bytes.Split(bytes.TrimSpace(token), []byte("."))
	if len(parts) != 3 {
		return time.Time{}, false
	}
	payload, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(string(parts[1]), "="))
	if err != nil {
		return time.Time{}, false
	}
	var claims struct {
		Exp *json.Number `json:"exp"`
	}
	if err := json.Unmarshal(payload, &claims); err != nil || claims.Exp == nil {
		return time.Time{}, false
	}
	sec, err := claims.Exp.Float64()
	if err != nil || sec <= 0 {
		return time.Time{}, false
	}
	return time.Unix(int64(sec), 0).UTC(), true
}

// CopyExpiry is when a credential copy's token expires: its
// AnnotationTokenExpiration, else the token's JWT exp claim, else zero
// (unknown). The error reports an annotation that is not an RFC 3339 time;
// the JWT's claim is used then.
func CopyExpiry(annotations map[string]string, token []byte) (time.Time, error) {
	var err error
	if v, ok := annotations[AnnotationTokenExpiration]; ok {
		t, perr := time.Parse(time.RFC3339, strings.TrimSpace(v))
		if perr == nil {
			return t, nil
		}
		err = fmt.Errorf("annotation %s=%q is not an RFC 3339 time; using the token's exp claim", AnnotationTokenExpiration, v)
	}
	exp, _ := JWTExpiry(token)
	return exp, err
}
