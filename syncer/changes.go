package syncer

import (
	"time"

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
