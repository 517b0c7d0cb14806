// Package stream is hubsync's change stream: the contract between the code
// that changes things on the hub (the syncer, later the tunnel pool) and
// every consumer of those changes (the NATS bus, the sinks, the tunnel
// pool), and the fan-out between them.
//
// A producer calls Notify with each Change it made; Notify never blocks.
// The Fanout gives every consumer its own bounded queue, its own retries
// with backoff and its own resync from a snapshot of the current state, so
// a slow, failing or dead consumer never delays the producer or another
// consumer. Producers do not know which consumers exist.
//
// It imports no other hubsync package: producers and consumers both depend
// on it, never on each other (docs/architecture.md; TestImportRules).
package stream

import (
	"time"
)

// Change types: what happened to one (namespace, cluster). They are the
// CloudEvents types of the public event contract (see docs/events.md).
const (
	ProfileCreated        = "io.hubsync.profile.created"
	ProfileUpdated        = "io.hubsync.profile.updated"
	ProfileDeleted        = "io.hubsync.profile.deleted"
	CredentialSynced      = "io.hubsync.credential.synced"
	CredentialRotated     = "io.hubsync.credential.rotated"
	CredentialRemoved     = "io.hubsync.credential.removed"
	AccessProviderUpdated = "io.hubsync.accessprovider.updated"
	// TunnelReady: the cluster's warm connection in the tunnel pool is
	// open and its probe succeeds.
	TunnelReady = "io.hubsync.tunnel.ready"
	// TunnelFailing: the cluster cannot be reached through the pool; the
	// pool is redialing with backoff.
	TunnelFailing = "io.hubsync.tunnel.failing"
)

// Types lists every change type, in the order of the contract.
var Types = []string{
	ProfileCreated, ProfileUpdated, ProfileDeleted,
	CredentialSynced, CredentialRotated, CredentialRemoved,
	AccessProviderUpdated,
	TunnelReady, TunnelFailing,
}

// Change is one change hubsync made (or, in a snapshot, the current state)
// for one cluster in one consumer namespace. It never carries a token.
// Consumers share one Change value and must not modify it or what its
// pointers and maps reach.
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
	// Tunnel is set for tunnel changes.
	Tunnel *TunnelSummary
	// ClusterLabels are the ManagedCluster's labels when the change was
	// made, for consumers that select clusters by label. They are not part
	// of the published event.
	ClusterLabels map[string]string
}

// Key identifies the (namespace, cluster) a change is about. Changes of
// one key reach every consumer in the order they were notified.
type Key struct {
	Namespace, Cluster string
}

// Key returns the change's (namespace, cluster).
func (c Change) Key() Key { return Key{c.Namespace, c.Cluster} }

// ProfileSummary is what a consumer needs to know about a profile.
type ProfileSummary struct {
	Labels            map[string]string       `json:"labels,omitempty"`
	KubernetesVersion string                  `json:"kubernetesVersion,omitempty"`
	Healthy           string                  `json:"healthy,omitempty"` // ControlPlaneHealthy: True, False, Unknown or ""
	Joined            string                  `json:"joined,omitempty"`
	AccessProviders   []AccessProviderSummary `json:"accessProviders,omitempty"`
}

// Provider returns the access provider of that name, if the profile has it.
func (p *ProfileSummary) Provider(name string) (AccessProviderSummary, bool) {
	if p == nil {
		return AccessProviderSummary{}, false
	}
	for _, a := range p.AccessProviders {
		if a.Name == name {
			return a, true
		}
	}
	return AccessProviderSummary{}, false
}

// AccessProviderSummary names a provider and its server. Events and
// records carry only those two; CAData is there for sinks that write
// client configurations (kubeconfig files, Argo CD cluster Secrets).
type AccessProviderSummary struct {
	Name   string `json:"name"`
	Server string `json:"server"`
	// CAData is the provider's certificate-authority-data (PEM). Not a
	// secret, but not part of the event contract either.
	CAData []byte `json:"-"`
}

// CredentialSummary describes a credential copy without its token.
type CredentialSummary struct {
	ManagedServiceAccount string     `json:"managedServiceAccount"`
	Secret                string     `json:"secret"`
	ResourceVersion       string     `json:"resourceVersion,omitempty"`
	Fingerprint           string     `json:"fingerprint,omitempty"`
	Expiration            *time.Time `json:"expiration,omitempty"`
}

// TunnelSummary is a tunnel pool entry's state. A tunnel change is about a
// cluster, not a profile: the pool sends one per namespace that has a
// profile for the cluster, Name is the cluster, and ResourceVersion is
// the pool's sequence number of the transition.
type TunnelSummary struct {
	// State is ready or failing.
	State string `json:"state"`
	// Reason says why a failing tunnel fails.
	Reason string `json:"reason,omitempty"`
	// Transport is konnectivity or direct.
	Transport string `json:"transport,omitempty"`
	// Since is when the entry entered the state.
	Since time.Time `json:"since"`
	// ProbeMillis is the last successful probe's round trip in
	// milliseconds (ready only).
	ProbeMillis float64 `json:"probeMillis,omitempty"`
}

// Notifier receives every change. Notify must not block: reconciliation
// never waits for a consumer.
type Notifier interface {
	Notify(Change)
}

// Nop drops every change; it stands in when nothing consumes them.
type Nop struct{}

// Notify does nothing.
func (Nop) Notify(Change) {}
