package webhook

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/hubsync/hubsync/config"
)

// keySource gives the HMAC keys to sign an attempt with. Only the sender
// goroutine calls it.
type keySource interface {
	keys(ctx context.Context) ([][]byte, error)
	// stale makes the next keys read the source again: an attempt failed,
	// perhaps because the endpoint already wants a rotated secret.
	stale()
}

// parseSecrets reads one secret per line, skipping blank lines and
// comments. Errors say where a bad secret is, never what it is.
func parseSecrets(data []byte, origin string) ([][]byte, error) {
	var keys [][]byte
	for i, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		key, err := decodeSecret(line)
		if err != nil {
			return nil, fmt.Errorf("%s, line %d: %w", origin, i+1, err)
		}
		keys = append(keys, key)
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("%s holds no signing secret", origin)
	}
	return keys, nil
}

// fileSecrets reads the secrets file at most once per ttl, and again
// after a failed attempt, so a rotated file (a Kubernetes Secret volume
// swaps a symlink) is used within seconds without a file read per event;
// it parses it again only when its content changed.
type fileSecrets struct {
	path string
	ttl  time.Duration
	now  func() time.Time
	log  *slog.Logger

	read   time.Time
	sum    [sha256.Size]byte
	cached [][]byte
}

func (f *fileSecrets) stale() { f.read = time.Time{} }

func (f *fileSecrets) keys(context.Context) ([][]byte, error) {
	now := f.now()
	if f.cached != nil && !f.read.IsZero() && now.Sub(f.read) < f.ttl {
		return f.cached, nil
	}
	data, err := os.ReadFile(f.path)
	if err != nil {
		return nil, fmt.Errorf("read signing secrets: %w", err)
	}
	sum := sha256.Sum256(data)
	if f.cached != nil && sum == f.sum {
		f.read = now
		return f.cached, nil
	}
	keys, err := parseSecrets(data, "signing secrets file "+f.path)
	if err != nil {
		return nil, err
	}
	if f.cached != nil {
		f.log.Info("webhook signing secrets changed; signing with the new set", "file", f.path, "secrets", len(keys))
	}
	f.read, f.sum, f.cached = now, sum, keys
	return keys, nil
}

// refSecrets reads the secrets from a key of a hub Secret, at most once
// per ttl: signing every attempt must not cost an API request.
type refSecrets struct {
	kube kubernetes.Interface
	ref  config.SecretKeyRef
	ttl  time.Duration
	now  func() time.Time
	log  *slog.Logger

	fetched time.Time
	sum     [sha256.Size]byte
	cached  [][]byte
}

func (r *refSecrets) stale() { r.fetched = time.Time{} }

func (r *refSecrets) keys(ctx context.Context) ([][]byte, error) {
	now := r.now()
	if r.cached != nil && !r.fetched.IsZero() && now.Sub(r.fetched) < r.ttl {
		return r.cached, nil
	}
	where := fmt.Sprintf("secret %s/%s key %q", r.ref.Namespace, r.ref.Name, r.ref.Key)
	keys, sum, err := r.fetch(ctx, where)
	if err != nil {
		if r.cached == nil {
			return nil, err
		}
		// A hiccup of the API server must not stop deliveries: keep
		// signing with what was read last, and try again after ttl.
		r.log.Warn("cannot re-read webhook signing secrets; signing with the ones read before", "secret", where, "err", err)
		r.fetched = now
		return r.cached, nil
	}
	if r.cached != nil && sum != r.sum {
		r.log.Info("webhook signing secrets changed; signing with the new set", "secret", where, "secrets", len(keys))
	}
	r.fetched, r.sum, r.cached = now, sum, keys
	return keys, nil
}

func (r *refSecrets) fetch(ctx context.Context, where string) ([][]byte, [sha256.Size]byte, error) {
	sec, err := r.kube.CoreV1().Secrets(r.ref.Namespace).Get(ctx, r.ref.Name, metav1.GetOptions{})
	if err != nil {
		return nil, [sha256.Size]byte{}, fmt.Errorf("read signing secrets from %s: %w", where, err)
	}
	data, ok := sec.Data[r.ref.Key]
	if !ok {
		return nil, [sha256.Size]byte{}, fmt.Errorf("read signing secrets: %s is missing", where)
	}
	keys, err := parseSecrets(data, where)
	if err != nil {
		return nil, [sha256.Size]byte{}, err
	}
	return keys, sha256.Sum256(data), nil
}

// tokenFile reads the bearer token like the secrets file: at most once per
// ttl, and again after a failed attempt, so a rotated token is used within
// seconds.
type tokenFile struct {
	path string
	ttl  time.Duration
	now  func() time.Time

	read   time.Time
	cached string
}

func (t *tokenFile) stale() { t.read = time.Time{} }

func (t *tokenFile) token() (string, error) {
	now := t.now()
	if t.cached != "" && !t.read.IsZero() && now.Sub(t.read) < t.ttl {
		return t.cached, nil
	}
	data, err := os.ReadFile(t.path)
	if err != nil {
		return "", fmt.Errorf("read bearer token: %w", err)
	}
	tok := string(bytes.TrimSpace(data))
	if tok == "" {
		return "", fmt.Errorf("bearer token file %s is empty", t.path)
	}
	if strings.ContainsAny(tok, "\r\n") {
		return "", errors.New("bearer token file " + t.path + " holds more than one line")
	}
	t.read, t.cached = now, tok
	return tok, nil
}
