package syncer

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/tools/cache"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/hubcache"
)

// providerSet holds the configured access providers and their current CA
// bundles. CA sources are watched (one Secret each, by name) or polled
// (files); a change re-queues every cluster so that every profile carries
// the new CA within moments.
type providerSet struct {
	mu        sync.RWMutex
	providers []Provider
	sources   []caSource
}

type caSource struct {
	provider int // index into providers
	secret   *config.SecretKeyRef
	file     string
}

func (s *Syncer) newProviderSet(cfgs []config.AccessProvider) (*providerSet, error) {
	ps := &providerSet{}
	for i, c := range cfgs {
		p := Provider{Name: c.Name, Direct: c.Type == config.ProviderDirect, ClusterNameExtension: c.WantsClusterNameExtension()}
		if !p.Direct {
			t, err := ParseServerTemplate(c.Server)
			if err != nil {
				return nil, fmt.Errorf("access provider %q: %w", c.Name, err)
			}
			p.Server = t
		}
		ps.providers = append(ps.providers, p)
		switch {
		case c.CASecret != nil:
			ref := *c.CASecret
			ps.sources = append(ps.sources, caSource{provider: i, secret: &ref})
		case c.CAFile != "":
			ps.sources = append(ps.sources, caSource{provider: i, file: c.CAFile})
		}
	}
	return ps, nil
}

// snapshot returns the providers with their current CAs.
func (ps *providerSet) snapshot() []Provider {
	ps.mu.RLock()
	defer ps.mu.RUnlock()
	return append([]Provider(nil), ps.providers...)
}

// setCA stores a provider's CA and reports whether it changed.
func (ps *providerSet) setCA(i int, ca []byte) bool {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if bytes.Equal(ps.providers[i].CA, ca) {
		return false
	}
	ps.providers[i].CA = append([]byte(nil), ca...)
	return true
}

func (ps *providerSet) name(i int) string {
	ps.mu.RLock()
	defer ps.mu.RUnlock()
	return ps.providers[i].Name
}

// watch takes from the hub cache the informer of each CA Secret (that
// one Secret, by name, and of it only the key the provider reads) and
// reads the CA files once; pollFiles polls the files while Run runs.
func (ps *providerSet) watch(s *Syncer) (hubcache.Holds, []cache.InformerSynced, error) {
	var holds hubcache.Holds
	var synced []cache.InformerSynced
	for _, src := range ps.sources {
		if src.secret == nil {
			s.readCAFile(src.provider, src.file)
			continue
		}
		ref, idx := *src.secret, src.provider
		inf, err := s.cache.Secrets(hubcache.Secrets{
			Namespace:     ref.Namespace,
			FieldSelector: fields.OneTermEqualSelector("metadata.name", ref.Name).String(),
			Keep:          []string{ref.Key},
		})
		if err != nil {
			return holds, nil, err
		}
		holds = append(holds, inf)
		has, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { s.onCASecret(idx, ref, obj, false) },
			UpdateFunc: func(_, obj any) { s.onCASecret(idx, ref, obj, false) },
			DeleteFunc: func(obj any) { s.onCASecret(idx, ref, obj, true) },
		})
		if err != nil {
			return holds, nil, fmt.Errorf("watch CA secret of provider %q: %w", ps.name(idx), err)
		}
		synced = append(synced, has)
	}
	return holds, synced, nil
}

func (ps *providerSet) pollFiles(ctx context.Context, s *Syncer, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			for _, src := range ps.sources {
				if src.file != "" {
					s.readCAFile(src.provider, src.file)
				}
			}
		}
	}
}

func (s *Syncer) readCAFile(i int, path string) {
	ca, err := os.ReadFile(path)
	if err != nil || len(ca) == 0 {
		s.log.Warn("cannot read access provider CA file; keeping the last CA", "provider", s.providers.name(i), "file", path, "err", err)
		return
	}
	if s.providers.setCA(i, ca) {
		s.log.Info("access provider CA changed", "provider", s.providers.name(i), "file", path)
		s.enqueueAllClusters()
	}
}

func (s *Syncer) onCASecret(i int, ref config.SecretKeyRef, obj any, deleted bool) {
	name := s.providers.name(i)
	if deleted {
		s.log.Warn("access provider CA Secret deleted; profiles keep the last CA until it is back",
			"provider", name, "secret", ref.Namespace+"/"+ref.Name)
		return
	}
	sec, ok := eventObject[*corev1.Secret](obj)
	if !ok {
		return
	}
	ca := sec.Data[ref.Key]
	if len(ca) == 0 {
		s.log.Warn("access provider CA Secret has no such key; keeping the last CA",
			"provider", name, "secret", ref.Namespace+"/"+ref.Name, "key", ref.Key)
		return
	}
	if s.providers.setCA(i, ca) {
		s.log.Info("access provider CA changed; updating every profile", "provider", name, "secret", ref.Namespace+"/"+ref.Name)
		s.metrics.caRotations.Inc()
		s.enqueueAllClusters()
	}
}

// enqueueAllClusters re-checks every cluster, for a change that touches
// every profile (a CA rotation).
func (s *Syncer) enqueueAllClusters() {
	for _, key := range s.clusterIdx.ListKeys() {
		s.queue.Add(key)
	}
}
