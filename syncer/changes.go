package syncer

import (
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	cpv1alpha1 "sigs.k8s.io/cluster-inventory-api/apis/v1alpha1"
)

// Change types: what happened to one (namespace, cluster). They are the
// CloudEvents types of the public event contract (see docs/events.md).
const (
	ChangeProfileCreated        = "io.hubsync.profile.created"
	ChangeProfileUpdated        = "io.hubsync.profile.updated"
	ChangeProfileDeleted        = "io.hubsync.profile.deleted"
	ChangeCredentialSynced      = "io.hubsync.credential.synced"
	ChangeCredentialRotated     = "io.hubsync.credential.rotated"
	ChangeCredentialRemoved     = "io.hubsync.credential.removed"
	ChangeAccessProviderUpdated = "io.hubsync.accessprovider.updated"
)

// Change is one change hubsync made (or, in a snapshot, the current state)
// for one cluster in one consumer namespace. It never carries a token.
type Change struct {
	Type      string
	Namespace string
	Cluster   string
	// Name is the object written: the profile's name, or the credential
	// copy's Secret name.
	Name string
	// ResourceVersion of the object after the write (before, for a delete).
	// With Type, Namespace and Name it identifies the change, so a change
	// published twice carries the same event id.
	ResourceVersion string
	Time            time.Time
	// Profile is set for profile and access provider changes.
	Profile *ProfileSummary
	// Credential is set for credential changes.
	Credential *CredentialSummary
}

// ProfileSummary is what a consumer needs to know about a profile.
type ProfileSummary struct {
	Labels            map[string]string       `json:"labels,omitempty"`
	KubernetesVersion string                  `json:"kubernetesVersion,omitempty"`
	Healthy           string                  `json:"healthy,omitempty"` // ControlPlaneHealthy: True, False, Unknown or ""
	Joined            string                  `json:"joined,omitempty"`
	AccessProviders   []AccessProviderSummary `json:"accessProviders,omitempty"`
}

// AccessProviderSummary names a provider and its server, never its CA.
type AccessProviderSummary struct {
	Name   string `json:"name"`
	Server string `json:"server"`
}

// CredentialSummary describes a credential copy without its token.
type CredentialSummary struct {
	ManagedServiceAccount string     `json:"managedServiceAccount"`
	Secret                string     `json:"secret"`
	ResourceVersion       string     `json:"resourceVersion,omitempty"`
	Fingerprint           string     `json:"fingerprint,omitempty"`
	Expiration            *time.Time `json:"expiration,omitempty"`
}

// Notifier receives every change. Notify must not block: reconciliation
// never waits for the event bus.
type Notifier interface {
	Notify(Change)
}

// SummarizeProfile builds the summary of a profile.
func SummarizeProfile(p *cpv1alpha1.ClusterProfile) *ProfileSummary {
	s := &ProfileSummary{KubernetesVersion: p.Status.Version.Kubernetes}
	if len(p.Labels) > 0 {
		s.Labels = make(map[string]string, len(p.Labels))
		for k, v := range p.Labels {
			s.Labels[k] = v
		}
	}
	if c := meta.FindStatusCondition(p.Status.Conditions, ConditionControlPlaneHealthy); c != nil {
		s.Healthy = string(c.Status)
	}
	if c := meta.FindStatusCondition(p.Status.Conditions, ConditionJoined); c != nil {
		s.Joined = string(c.Status)
	}
	for _, a := range p.Status.AccessProviders {
		s.AccessProviders = append(s.AccessProviders, AccessProviderSummary{Name: a.Name, Server: a.Cluster.Server})
	}
	return s
}

// nopNotifier drops changes; it stands in when no bus is configured.
type nopNotifier struct{}

func (nopNotifier) Notify(Change) {}

func (s *Syncer) notifyProfile(typ string, p *cpv1alpha1.ClusterProfile) {
	s.notifier.Notify(Change{
		Type: typ, Namespace: p.Namespace, Cluster: p.Name, Name: p.Name,
		ResourceVersion: p.ResourceVersion, Time: time.Now().UTC(), Profile: SummarizeProfile(p),
	})
}

func (s *Syncer) notifyCredential(typ string, sec *corev1.Secret) {
	s.notifier.Notify(credentialChange(typ, sec))
}

func credentialChange(typ string, sec *corev1.Secret) Change {
	cluster, msa, _ := strings.Cut(sec.Annotations[AnnotationSource], "/")
	c := &CredentialSummary{
		ManagedServiceAccount: msa, Secret: sec.Name, ResourceVersion: sec.ResourceVersion,
		Fingerprint: sec.Annotations[AnnotationTokenFingerprint],
	}
	if t, err := time.Parse(time.RFC3339, sec.Annotations[AnnotationTokenExpiration]); err == nil {
		c.Expiration = &t
	}
	return Change{
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
// non-nil, possibly empty, slice once it is.
func (s *Syncer) Snapshot() []Change {
	if !s.Ready() {
		return nil
	}
	out := []Change{}
	for _, o := range s.profileIdx.List() {
		if p, ok := o.(*cpv1alpha1.ClusterProfile); ok && IsOwned(p, s.opts.ClusterManager) {
			out = append(out, Change{
				Type: ChangeProfileUpdated, Namespace: p.Namespace, Cluster: p.Name, Name: p.Name,
				ResourceVersion: p.ResourceVersion, Time: time.Now().UTC(), Profile: SummarizeProfile(p),
			})
		}
	}
	if s.creds != nil {
		for _, o := range s.creds.copyIdx.List() {
			if sec, ok := o.(*corev1.Secret); ok && sec.Annotations[AnnotationSource] != "" {
				out = append(out, credentialChange(ChangeCredentialSynced, sec))
			}
		}
	}
	return out
}
