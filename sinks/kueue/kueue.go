// Package kueue is the Kueue sink: it keeps one Kueue MultiKueueCluster
// per ClusterProfile of Kueue's namespace, so that Kueue's MultiKueue can
// dispatch to every cluster that namespace may use, and optionally a
// MultiKueueConfig listing them.
//
// Each MultiKueueCluster (cluster-scoped, kueue.x-k8s.io/v1beta2) is named
// after its profile. With source secret (the default) it reads the
// kubeconfig Secret "hubsync-kubeconfig-<profile>" (hub.KubeconfigSecretName)
// that the sink keeps in Kueue's namespace: the configured access
// provider's server and CA data and, inline, the token of the credential
// copy of the configured ManagedServiceAccount there, since Kueue refuses
// kubeconfigs that run exec plugins or read files. The Secret is owned by
// the profile and rewritten when the token rotates (only when its bytes
// change); a kubeconfig Kueue would refuse (sinks.CheckKueueKubeconfig) is
// reported and not written. With source clusterProfile the
// MultiKueueCluster names the profile (clusterProfileRef) and Kueue builds
// the client itself, with its multiKueue.clusterProfile.accessProviders.
//
// The sink never changes or deletes an object that lacks its labels
// (app.kubernetes.io/managed-by=hubsync, hubsync.io/sink=<sink>): a
// MultiKueueCluster, Secret or MultiKueueConfig of the name it would write
// that is someone else's is reported (a log line, the
// hubsync_kueue_conflicts gauge and the sink's health) and left alone.
// What the sink wrote for a profile goes when the profile goes; a resync
// also removes the sink's objects whose profile no longer exists.
//
// May import sinks, config, stream and hub; never syncer or bus.
package kueue

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/sinks"
	"github.com/hubsync/hubsync/stream"
)

// Sink keeps the MultiKueueClusters of Kueue's namespace's profiles.
type Sink struct {
	name    string
	cfg     config.KueueSink
	kube    kubernetes.Interface
	dyn     dynamic.Interface
	log     *slog.Logger
	metrics metrics
	now     func() time.Time

	// mu guards what follows. The stream calls Deliver and Resync from one
	// goroutine; Report and Close may come from others.
	mu sync.Mutex
	// clusters is what the stream said about each profile of Kueue's
	// namespace: every decision is computed from it.
	clusters sinks.Clusters
	// uids are the profiles' UIDs, for the Secrets' owner references,
	// read by one list when a Secret needs one the sink does not know. A
	// profile created or deleted forgets its entry.
	uids map[string]types.UID
	// retry holds the profiles of a delivery that failed, decided again
	// with the next one.
	retry sinks.RetrySet
	// obs is what the last look at the hub showed, kept up to date with
	// the sink's own writes, reused for obsMaxAge.
	obs sinks.Observed[*observed]
	// health is the record Report reads.
	health health
	closed bool
}

var _ sinks.Sink = (*Sink)(nil)
var _ stream.Reporter = (*Sink)(nil)

// New makes a Kueue sink from its configuration. It is a sinks.Factory.
func New(cfg config.Sink, deps sinks.Deps) (sinks.Sink, error) {
	if cfg.Kueue == nil {
		return nil, fmt.Errorf("kueue sink %s: no kueue section", cfg.Name)
	}
	k := *cfg.Kueue
	// config fills every default; a missing value here is a caller's bug.
	switch {
	case cfg.Name == "":
		return nil, errors.New("kueue sink: no name")
	case deps.Kube == nil || deps.Dynamic == nil:
		return nil, fmt.Errorf("kueue sink %s: no hub client", cfg.Name)
	case k.Namespace == "":
		return nil, fmt.Errorf("kueue sink %s: no namespace (config.SetDefaults fills it)", cfg.Name)
	case k.Source != config.KueueSourceSecret && k.Source != config.KueueSourceClusterProfile:
		return nil, fmt.Errorf("kueue sink %s: source %q is neither %s nor %s", cfg.Name, k.Source, config.KueueSourceSecret, config.KueueSourceClusterProfile)
	case k.Source == config.KueueSourceSecret && (k.AccessProvider == "" || k.ManagedServiceAccount == ""):
		return nil, fmt.Errorf("kueue sink %s: source %s needs an accessProvider and a managedServiceAccount", cfg.Name, k.Source)
	}
	// The map is the configuration's: a caller reusing it cannot change a
	// running sink.
	k.Labels = maps.Clone(k.Labels)
	m, err := newMetrics(deps.Registerer, cfg.Name)
	if err != nil {
		return nil, fmt.Errorf("kueue sink %s: %w", cfg.Name, err)
	}
	log := deps.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Sink{
		name:     cfg.Name,
		cfg:      k,
		kube:     deps.Kube,
		dyn:      deps.Dynamic,
		log:      log.With("kueueNamespace", k.Namespace, "source", k.Source),
		metrics:  m,
		now:      time.Now,
		clusters: sinks.Clusters{},
		uids:     map[string]types.UID{},
		obs:      sinks.Observed[*observed]{MaxAge: obsMaxAge},
		health:   health{problems: map[string]problem{}},
	}, nil
}

// Close forgets the sink's metric series. What it wrote stays: a sink taken
// out of the configuration leaves its output as it is.
func (s *Sink) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		s.closed = true
		s.metrics.forget()
	}
	return nil
}

// Deliver applies changes. Changes of other namespaces are ignored. It
// returns the failures joined; delivering the same changes again is
// harmless.
func (s *Sink) Deliver(ctx context.Context, changes []stream.Change) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("kueue sink closed")
	}
	touched := s.retry.Begin()
	for _, c := range changes {
		if c.Namespace == s.cfg.Namespace && c.Cluster != "" && s.apply(c) {
			touched[c.Cluster] = true
		}
	}
	if len(touched) == 0 {
		return nil
	}
	err := s.reconcile(ctx, slices.Sorted(maps.Keys(touched)), false)
	s.recordAttempt(err)
	s.retry.End(touched, err)
	if err != nil {
		s.obs.Forget()
		return err
	}
	for cluster := range touched {
		s.clusters.ForgetIfGone(cluster)
	}
	return nil
}

// apply records c in the sink's state and reports whether it concerns the
// sink.
func (s *Sink) apply(c stream.Change) bool {
	msa := s.cfg.ManagedServiceAccount
	if s.cfg.Source != config.KueueSourceSecret {
		// With source clusterProfile Kueue reads credentials itself.
		msa = ""
	}
	applied := s.clusters.Apply(c, msa)
	if applied == sinks.AppliedProfile && (c.Type == stream.ProfileCreated || c.Type == stream.ProfileDeleted) {
		// A new profile of the same name has a new UID.
		delete(s.uids, c.Cluster)
	}
	return applied != sinks.AppliedNothing
}

// Resync makes Kueue's objects match snapshot: it writes those missing or
// outdated and deletes the sink's own objects of profiles not in it.
func (s *Sink) Resync(ctx context.Context, snapshot []stream.Change) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("kueue sink closed")
	}
	s.clusters = sinks.Clusters{}
	for _, c := range snapshot {
		if c.Namespace == s.cfg.Namespace && c.Cluster != "" {
			s.apply(c)
		}
	}
	clear(s.uids)
	s.obs.Forget()
	err := s.reconcile(ctx, slices.Sorted(maps.Keys(s.clusters)), true)
	s.recordAttempt(err)
	if err != nil {
		s.obs.Forget()
		return err
	}
	s.retry.Clear()
	return nil
}

// wanted returns whether profile should have a MultiKueueCluster and, for
// source secret, the access provider its kubeconfig uses: with source
// clusterProfile, every profile; with source secret, a profile that has
// the access provider and whose credential copy exists.
func (s *Sink) wanted(profile string) (stream.AccessProviderSummary, bool) {
	st := s.clusters[profile]
	if st == nil || st.Profile == nil {
		return stream.AccessProviderSummary{}, false
	}
	if s.cfg.Source == config.KueueSourceClusterProfile {
		return stream.AccessProviderSummary{}, true
	}
	p, ok := st.Profile.Provider(s.cfg.AccessProvider)
	return p, ok && st.Credential
}

// Report is the sink's health: failing while a profile is blocked by an
// object hubsync did not create or has a kubeconfig Kueue would refuse.
func (s *Sink) Report() stream.Report {
	return s.health.report()
}
