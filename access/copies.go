package access

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hubsync/hubsync/hub"
)

// credentialFor returns the credential of cluster's copy, made on first
// use and seeded from the informer's cache when it holds the copy.
func (s *Source) credentialFor(cluster string) *credential {
	name := hub.CopyName(cluster, s.opts.ManagedServiceAccount)
	source := hub.SourceKey(cluster, s.opts.ManagedServiceAccount)
	s.mu.Lock()
	defer s.mu.Unlock()
	if c := s.creds[name]; c != nil {
		return c
	}
	c := &credential{
		secret:    s.opts.Namespace + "/" + name,
		source:    source,
		read:      s.readCopy(name, source),
		minReread: s.minReread,
		now:       s.now,
		stats:     &s.stats,
		log:       s.log,
	}
	// The informer updates its cache before it calls s.observe, and
	// s.observe finds the credential only under s.mu: whatever version
	// the cache holds now, later versions reach the credential.
	if obj, ok, _ := s.informer.GetStore().GetByKey(s.opts.Namespace + "/" + name); ok {
		if sec, ok := obj.(*corev1.Secret); ok {
			if tok, err := tokenOf(sec, source); err == nil {
				c.offer(tok)
			}
		}
	}
	s.creds[name] = c
	return c
}

// observe hands a copy the informer saw to its credential, if a config
// was handed out for it.
func (s *Source) observe(obj any) {
	sec, ok := obj.(*corev1.Secret)
	if !ok {
		return
	}
	s.mu.Lock()
	c := s.creds[sec.Name]
	s.mu.Unlock()
	if c == nil {
		return
	}
	tok, err := tokenOf(sec, c.source)
	if err != nil {
		s.log.Info("ignoring a credential copy", "secret", c.secret, "err", err)
		return
	}
	if c.offer(tok) {
		s.log.Info("switched to the credential copy's new token", "secret", c.secret, "fingerprint", hub.TokenFingerprint([]byte(tok.token)))
	}
}

// readCopy returns the function that reads the copy name, made for source
// ("<cluster>/<msa>"), from the API server.
func (s *Source) readCopy(name, source string) func(ctx context.Context) (copyToken, error) {
	return func(ctx context.Context) (copyToken, error) {
		sec, err := s.clients.Kube.CoreV1().Secrets(s.opts.Namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return copyToken{}, fmt.Errorf("read credential copy %s/%s: %w", s.opts.Namespace, name, err)
		}
		return tokenOf(sec, source)
	}
}

// tokenOf is the token of a copy made for source. hubsync names a copy's
// source in an annotation: "a-b" + "c" and "a" + "b-c" share a copy name,
// and a copy of the other pair must never be sent to this cluster.
// Copies without the annotation (written by OCM's own syncer) are taken
// by name.
func tokenOf(sec *corev1.Secret, source string) (copyToken, error) {
	if got, ok := sec.Annotations[hub.AnnotationSource]; ok && got != source {
		return copyToken{}, fmt.Errorf("credential copy %s/%s is the token of %s, not of %s", sec.Namespace, sec.Name, got, source)
	}
	token := string(sec.Data[hub.TokenKey])
	if token == "" {
		return copyToken{}, fmt.Errorf("credential copy %s/%s has no %q key", sec.Namespace, sec.Name, hub.TokenKey)
	}
	return copyToken{token: token, resourceVersion: sec.ResourceVersion}, nil
}

// stripSecret keeps of a copy only what a Source reads: its name,
// resourceVersion, source annotation and token. The informer's cache then
// holds no CA, labels or managed fields.
func stripSecret(obj any) (any, error) {
	sec, ok := obj.(*corev1.Secret)
	if !ok {
		return obj, nil
	}
	out := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{
		Name: sec.Name, Namespace: sec.Namespace, UID: sec.UID, ResourceVersion: sec.ResourceVersion,
	}}
	if v, ok := sec.Annotations[hub.AnnotationSource]; ok {
		out.Annotations = map[string]string{hub.AnnotationSource: v}
	}
	if t, ok := sec.Data[hub.TokenKey]; ok {
		out.Data = map[string][]byte{hub.TokenKey: t}
	}
	return out, nil
}
