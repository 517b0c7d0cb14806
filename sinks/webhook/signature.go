package webhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Standard Webhooks 1.0 headers and secret format.
const (
	HeaderID        = "webhook-id"
	HeaderTimestamp = "webhook-timestamp"
	HeaderSignature = "webhook-signature"
	// SecretPrefix starts every signing secret; the rest is the base64 of
	// the HMAC key.
	SecretPrefix = "whsec_"
	// Tolerance is how far a webhook-timestamp may be from the receiver's
	// clock, either way, for Verify to accept it: it bounds replays of a
	// captured request.
	Tolerance = 5 * time.Minute
	// signatureVersion prefixes each signature in webhook-signature.
	signatureVersion = "v1"
)

// Errors of Verify.
var (
	ErrNoSignature = errors.New("webhook: no signature matches")
	ErrTimestamp   = errors.New("webhook: timestamp too far from now")
)

// errBadSecret never carries the secret: it is only ever said where the
// secret came from.
var errBadSecret = errors.New("not a signing secret (whsec_ followed by base64)")

// decodeSecret returns the HMAC key of a secret. The whsec_ prefix is
// optional, as in the Standard Webhooks libraries.
func decodeSecret(secret string) ([]byte, error) {
	s := strings.TrimPrefix(strings.TrimSpace(secret), SecretPrefix)
	key, err := base64.StdEncoding.DecodeString(s)
	if err != nil || len(key) == 0 {
		return nil, errBadSecret
	}
	return key, nil
}

// signature is the v1 signature of one request with one key.
func signature(key []byte, id, timestamp string, body []byte) string {
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(id))
	mac.Write([]byte{'.'})
	mac.Write([]byte(timestamp))
	mac.Write([]byte{'.'})
	mac.Write(body)
	return signatureVersion + "," + base64.StdEncoding.EncodeToString(mac.Sum(nil))
}

// signatureHeader is the webhook-signature value for every key.
func signatureHeader(keys [][]byte, id, timestamp string, body []byte) string {
	sigs := make([]string, len(keys))
	for i, k := range keys {
		sigs[i] = signature(k, id, timestamp, body)
	}
	return strings.Join(sigs, " ")
}

// Sign returns the webhook-signature entry ("v1,<base64>") of a request
// with one secret (whsec_<base64>). Join the entries of several secrets
// with spaces.
func Sign(secret, id, timestamp string, body []byte) (string, error) {
	key, err := decodeSecret(secret)
	if err != nil {
		return "", fmt.Errorf("webhook: sign: %w", err)
	}
	return signature(key, id, timestamp, body), nil
}

// Verify checks a received request: its webhook-timestamp must be within
// Tolerance of now, and one of the v1 signatures of webhook-signature must
// be that of one of the secrets. Receivers should then drop a webhook-id
// they have already processed.
func Verify(secrets []string, id, timestamp string, body []byte, signatureHeader string) error {
	return verifyAt(time.Now(), secrets, id, timestamp, body, signatureHeader)
}

func verifyAt(now time.Time, secrets []string, id, timestamp string, body []byte, header string) error {
	if id == "" {
		return errors.New("webhook: empty webhook-id")
	}
	ts, err := strconv.ParseInt(timestamp, 10, 64)
	if err != nil {
		return fmt.Errorf("webhook: webhook-timestamp %q is not unix seconds", timestamp)
	}
	if d := now.Sub(time.Unix(ts, 0)); d > Tolerance || d < -Tolerance {
		return fmt.Errorf("%w: %s off", ErrTimestamp, d.Round(time.Second))
	}
	if len(secrets) == 0 {
		return errors.New("webhook: no secrets to verify with")
	}
	for i, s := range secrets {
		key, err := decodeSecret(s)
		if err != nil {
			return fmt.Errorf("webhook: secret %d: %w", i+1, err)
		}
		want := []byte(signature(key, id, timestamp, body))
		for _, got := range strings.Fields(header) {
			if hmac.Equal(want, []byte(got)) {
				return nil
			}
		}
	}
	return ErrNoSignature
}
