package argocd

import (
	"context"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/hubsync/hubsync/hubcache"
	"github.com/hubsync/hubsync/stream"
)

// The argoproj-labs ClusterProfile integration for Argo CD
// (github.com/argoproj-labs/clusterprofile-integration-for-argocd) turns
// ClusterProfiles into Argo CD cluster Secrets too: "cluster-<profile>",
// labelled LabelProfileOrigin. Where it already gives Argo CD a cluster,
// the sink writes none (and deletes its own), so that Argo CD never sees
// one cluster twice, nor two Secrets with one server, whichever of the two
// came first; once the integration's Secret is gone, the sink writes its
// own again.

// LabelProfileOrigin is the label the integration puts on each Secret it
// writes, valued "<profile namespace>-<profile name>".
const LabelProfileOrigin = "argocd.argoproj.io/cluster-profile-origin"

// Reasons a cluster is left to the integration, the reason label of
// hubsync_argocd_clusters_skipped.
const (
	// SkipIntegrationProfile: an integration Secret comes from the same
	// ClusterProfile (origin label and cluster name match).
	SkipIntegrationProfile = "integration-profile"
	// SkipIntegrationServer: an integration Secret has the server the
	// sink's Secret would have.
	SkipIntegrationServer = "integration-server"
)

// skipReasons lists every reason, for the gauge's series.
var skipReasons = []string{SkipIntegrationProfile, SkipIntegrationServer}

// skip says why a cluster is left to another writer, and to which Secret.
type skip struct {
	reason, secret string
}

// integrationSecrets are the integration's cluster Secrets in Argo CD's
// namespace, indexed the two ways they can cover a cluster.
type integrationSecrets struct {
	byOrigin map[string][]*corev1.Secret
	byServer map[string][]*corev1.Secret
}

func newIntegrationSecrets() integrationSecrets {
	return integrationSecrets{byOrigin: map[string][]*corev1.Secret{}, byServer: map[string][]*corev1.Secret{}}
}

// isIntegrationSecret reports whether sec carries the integration's label.
func isIntegrationSecret(sec *corev1.Secret) bool {
	_, ok := sec.Labels[LabelProfileOrigin]
	return ok
}

// add indexes sec, one of the integration's Secrets.
func (in integrationSecrets) add(sec *corev1.Secret) {
	origin := sec.Labels[LabelProfileOrigin]
	in.byOrigin[origin] = append(in.byOrigin[origin], sec)
	srv := trimServer(string(sec.Data["server"]))
	in.byServer[srv] = append(in.byServer[srv], sec)
}

// covering returns why the integration already gives Argo CD the cluster
// of the profile namespace/cluster whose Secret would have server, or nil
// when it does not. The origin label alone is ambiguous ("a-b" + "c" and
// "a" + "b-c" give one value), so a Secret of the same profile must also
// name the cluster; the name then fixes the namespace.
func (in integrationSecrets) covering(namespace, cluster, server string) *skip {
	for _, sec := range sortedByAge(in.byOrigin[namespace+"-"+cluster]) {
		if string(sec.Data["name"]) == cluster {
			return &skip{reason: SkipIntegrationProfile, secret: sec.Name}
		}
	}
	if server == "" {
		return nil
	}
	if same := sortedByAge(in.byServer[server]); len(same) > 0 {
		return &skip{reason: SkipIntegrationServer, secret: same[0].Name}
	}
	return nil
}

// sortedByAge returns secrets oldest first, so that the Secret a skip
// names is the same on every run.
func sortedByAge(secrets []*corev1.Secret) []*corev1.Secret {
	if len(secrets) < 2 {
		return secrets
	}
	out := slices.Clone(secrets)
	slices.SortFunc(out, func(a, b *corev1.Secret) int {
		switch {
		case olderThan(a, b):
			return -1
		case olderThan(b, a):
			return 1
		}
		return 0
	})
	return out
}

// setSkip records why cluster is left to the integration (nil: it is
// not), logging when that starts, changes or ends.
func (s *Sink) setSkip(cluster string, sk *skip) {
	old, had := s.skipped[cluster]
	switch {
	case sk == nil && had:
		delete(s.skipped, cluster)
		s.skips.add(old.reason, -1)
		s.log.Info("Argo CD cluster no longer covered by the ClusterProfile integration: hubsync writes its own Secret",
			"cluster", cluster, "secret", old.secret)
	case sk != nil && (!had || old != *sk):
		if had {
			s.skips.add(old.reason, -1)
		}
		s.skipped[cluster] = *sk
		s.skips.add(sk.reason, 1)
		// The integration's Secret wins whatever came first: the sink
		// yields, so Argo CD never holds the cluster twice.
		s.log.Info("Argo CD cluster left to the ClusterProfile integration: its Secret already gives Argo CD this cluster, so hubsync keeps none",
			"cluster", cluster, "secret", sk.secret, "reason", sk.reason)
	}
}

// integrationWatch watches the integration's Secrets in Argo CD's
// namespace and asks the sink's worker for a resync when one appears,
// changes what it covers, or goes: the resync decides again, level-based,
// which clusters the sink writes.
type integrationWatch struct {
	mu     sync.Mutex
	hold   *hubcache.Informer
	own    *hubcache.Cache // the cache the sink made, without a shared one
	closed bool
}

// integrationSelector selects the integration's Secrets in ns, and of them
// only what decides coverage: the cache holds no credential.
func integrationSelector(ns string) hubcache.Secrets {
	return hubcache.Secrets{Namespace: ns, LabelSelector: LabelProfileOrigin, Keep: []string{"name", "server"}}
}

// Attach implements stream.Attacher: once the sink has a worker to ask
// for resyncs, it starts watching the integration's Secrets, through the
// daemon's hub cache (sinks.Deps.Cache) or, without one, a cache of its
// own.
func (s *Sink) Attach(c stream.Control) {
	w := &s.watch
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed || w.hold != nil {
		return
	}
	hc := s.cache
	if hc == nil {
		var err error
		if hc, err = hubcache.New(hubcache.Clients{Kube: s.kube}, 0, nil); err != nil {
			s.log.Warn("cannot watch the ClusterProfile integration's Secrets; its changes are seen at the next resync", "err", err)
			return
		}
		w.own = hc
	}
	hold, err := hc.Secrets(integrationSelector(s.cfg.Namespace))
	if err == nil {
		_, err = hold.AddEventHandler(cache.ResourceEventHandlerDetailedFuncs{
			AddFunc: func(obj any, initial bool) {
				// The sink's first delivery is a resync, which sees what
				// existed before it started.
				if !initial && isIntegration(obj) {
					c.RequestResync()
				}
			},
			UpdateFunc: func(old, cur any) {
				if (isIntegration(old) || isIntegration(cur)) && coverageChanged(old, cur) {
					c.RequestResync()
				}
			},
			DeleteFunc: func(obj any) {
				if isIntegration(obj) {
					c.RequestResync()
				}
			},
		})
	}
	if err != nil {
		// The periodic resync still finds the integration's changes.
		s.log.Warn("cannot watch the ClusterProfile integration's Secrets; its changes are seen at the next resync", "err", err)
		if hold != nil {
			hold.Release()
		}
		w.own = nil
		return
	}
	w.hold = hold
	if w.own != nil {
		w.own.Start(context.Background())
	}
}

// stopWatch stops the watch, if it runs, and waits for it.
func (s *Sink) stopWatch() {
	w := &s.watch
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closed = true
	if w.hold != nil {
		w.hold.Release()
		w.hold = nil
	}
	if w.own != nil {
		w.own.Stop()
		w.own = nil
	}
}

// isIntegration reports whether a watched object (or tombstone) is one of
// the integration's Secrets.
func isIntegration(obj any) bool {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	sec, ok := obj.(*corev1.Secret)
	return ok && isIntegrationSecret(sec)
}

// coverageChanged reports whether an update changed what the Secret
// covers or whether Argo CD reads it at all.
func coverageChanged(old, cur any) bool {
	a, okA := old.(*corev1.Secret)
	b, okB := cur.(*corev1.Secret)
	if !okA || !okB {
		return true
	}
	return a.Labels[LabelProfileOrigin] != b.Labels[LabelProfileOrigin] ||
		a.Labels[LabelSecretType] != b.Labels[LabelSecretType] ||
		isIntegrationSecret(a) != isIntegrationSecret(b) ||
		string(a.Data["name"]) != string(b.Data["name"]) ||
		trimServer(string(a.Data["server"])) != trimServer(string(b.Data["server"]))
}
