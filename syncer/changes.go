package syncer

import (
	"maps"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	cpv1alpha1 "sigs.k8s.io/cluster-inventory-api/apis/v1alpha1"

	"github.com/hubsync/hubsync/hub"
	"github.com/hubsync/hubsync/stream"
)

// SummarizeProfile builds the summary of a profile.
func SummarizeProfile(p *cpv1alpha1.ClusterProfile) *stream.ProfileSummary {
	s := &stream.ProfileSummary{KubernetesVersion: p.Status.Version.Kubernetes}
	if len(p.Labels) > 0 {
		s.Labels = maps.Clone(p.Labels)
	}
	if c := meta.FindStatusCondition(p.Status.Conditions, ConditionControlPlaneHealthy); c != nil {
		s.Healthy = string(c.Status)
	}
	if c := meta.FindStatusCondition(p.Status.Conditions, ConditionJoined); c != nil {
		s.Joined = string(c.Status)
	}
	for _, a := range p.Status.AccessProviders {
		s.AccessProviders = append(s.AccessProviders, stream.AccessProviderSummary{
			Name: a.Name, Server: a.Cluster.Server, CAData: a.Cluster.CertificateAuthorityData,
		})
	}
	return s
}

func (s *Syncer) notifyProfile(typ string, p *cpv1alpha1.ClusterProfile) {
	c := s.profileChange(typ, p)
	s.notified.note(c)
	s.notifier.Notify(c)
}

func (s *Syncer) profileChange(typ string, p *cpv1alpha1.ClusterProfile) stream.Change {
	return stream.Change{
		Type: typ, Namespace: p.Namespace, Cluster: p.Name, Name: p.Name,
		ResourceVersion: p.ResourceVersion, Time: time.Now().UTC(), Profile: SummarizeProfile(p),
		ClusterLabels: s.clusterLabels(p.Name),
	}
}

func (s *Syncer) notifyCredential(typ string, sec *corev1.Secret) {
	c := credentialChange(typ, sec)
	c.ClusterLabels = s.clusterLabels(c.Cluster)
	s.notified.note(c)
	s.notifier.Notify(c)
}

// clusterLabels are the labels of a ManagedCluster as the cache has them
// (nil for a cluster it does not know). The cache's map is shared, never
// modified.
func (s *Syncer) clusterLabels(name string) map[string]string {
	if c, err := s.clusters.Get(name); err == nil {
		return c.Labels
	}
	return nil
}

func credentialChange(typ string, sec *corev1.Secret) stream.Change {
	cluster, msa, _ := strings.Cut(sec.Annotations[hub.AnnotationSource], "/")
	c := &stream.CredentialSummary{
		ManagedServiceAccount: msa, Secret: sec.Name, ResourceVersion: sec.ResourceVersion,
		Fingerprint: sec.Annotations[hub.AnnotationTokenFingerprint],
	}
	if t, err := time.Parse(time.RFC3339, sec.Annotations[hub.AnnotationTokenExpiration]); err == nil {
		c.Expiration = &t
	}
	return stream.Change{
		Type: typ, Namespace: sec.Namespace, Cluster: cluster, Name: sec.Name,
		ResourceVersion: sec.ResourceVersion, Time: time.Now().UTC(), Credential: c,
	}
}

// providersChanged reports whether the access providers a consumer sees
// (names and servers) differ between two profiles.
func providersChanged(a, b *cpv1alpha1.ClusterProfile) bool {
	if len(a.Status.AccessProviders) != len(b.Status.AccessProviders) {
		return true
	}
	for i := range a.Status.AccessProviders {
		x, y := a.Status.AccessProviders[i], b.Status.AccessProviders[i]
		if !sameProvider(x, y) {
			return true
		}
	}
	return false
}

// Snapshot returns the current state as changes: every profile of ours and
// every credential copy, as a bus republishes it after an outage. It
// returns nil while the state is not known (caches not synced), and a
// non-nil, possibly empty, slice once it is. It is never older than the
// changes already notified: where the cache lags hubsync's own writes, the
// last notified change of an object stands in for it.
func (s *Syncer) Snapshot() []stream.Change {
	if !s.Ready() {
		return nil
	}
	out := []stream.Change{}
	for _, o := range s.profileIdx.List() {
		if p, ok := o.(*cpv1alpha1.ClusterProfile); ok && hub.IsOwned(p, s.opts.ClusterManager) {
			out = append(out, s.profileChange(stream.ProfileUpdated, p))
		}
	}
	if s.creds != nil {
		for _, o := range s.creds.copyIdx.List() {
			if sec, ok := o.(*corev1.Secret); ok && sec.Annotations[hub.AnnotationSource] != "" {
				c := credentialChange(stream.CredentialSynced, sec)
				c.ClusterLabels = s.clusterLabels(c.Cluster)
				out = append(out, c)
			}
		}
	}
	return s.notified.overlay(out, time.Now())
}
