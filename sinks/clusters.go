package sinks

import (
	"maps"

	"github.com/hubsync/hubsync/stream"
)

// ClusterState is what a sink that keeps objects per cluster (Argo CD
// cluster Secrets, Kueue's MultiKueueClusters) knows of one cluster from
// the stream.
type ClusterState struct {
	// Profile is the cluster's profile summary; nil while there is none.
	Profile *stream.ProfileSummary
	// Credential says the credential copy of the sink's
	// ManagedServiceAccount exists.
	Credential bool
}

// Clusters is such a sink's ClusterState of each cluster of the namespace
// it serves. Deliver and Resync both compute every decision from it, so
// that they decide alike.
type Clusters map[string]*ClusterState

// Applied says what Clusters.Apply recorded of a change.
type Applied int

const (
	// AppliedNothing: the change does not concern the sink.
	AppliedNothing Applied = iota
	// AppliedProfile: the cluster's profile came, changed or went.
	AppliedProfile
	// AppliedCredential: the credential copy of the sink's
	// ManagedServiceAccount came, was rotated or went.
	AppliedCredential
)

// Apply records c, a change of the cluster c.Cluster, and says what it
// recorded. Credential changes count only for the ManagedServiceAccount
// msa; with msa "" they are ignored, for a sink whose output does not
// depend on credentials.
func (cs Clusters) Apply(c stream.Change, msa string) Applied {
	st := cs[c.Cluster]
	if st == nil {
		st = &ClusterState{}
	}
	applied := AppliedNothing
	switch c.Type {
	case stream.ProfileCreated, stream.ProfileUpdated, stream.AccessProviderUpdated:
		if c.Profile != nil {
			st.Profile, applied = c.Profile, AppliedProfile
		}
	case stream.ProfileDeleted:
		st.Profile, applied = nil, AppliedProfile
	case stream.CredentialSynced, stream.CredentialRotated, stream.CredentialRemoved:
		if msa != "" && c.Credential != nil && c.Credential.ManagedServiceAccount == msa {
			st.Credential, applied = c.Type != stream.CredentialRemoved, AppliedCredential
		}
	}
	if applied != AppliedNothing {
		cs[c.Cluster] = st
	}
	return applied
}

// ForgetIfGone drops cluster once nothing is known of it (no profile, no
// credential copy) and reports whether it did.
func (cs Clusters) ForgetIfGone(cluster string) bool {
	st := cs[cluster]
	if st == nil || st.Profile != nil || st.Credential {
		return false
	}
	delete(cs, cluster)
	return true
}

// RetrySet holds the clusters of the deliveries that failed. A sink's
// state takes a batch's changes before it writes, so the same batch
// delivered again no longer shows which clusters it concerned (nor, for
// Argo CD, which other clusters competed for a server it freed): they are
// kept here and decided again with the next delivery. The zero value is
// empty.
type RetrySet struct{ clusters map[string]bool }

// Begin returns the set of clusters a new delivery decides, to which it
// adds those of its changes: at first the clusters of failed deliveries.
func (r *RetrySet) Begin() map[string]bool {
	out := maps.Clone(r.clusters)
	if out == nil {
		out = map[string]bool{}
	}
	return out
}

// End records the outcome of a delivery that decided clusters: after
// err they are decided again with the next delivery; after a success
// nothing is left to retry.
func (r *RetrySet) End(clusters map[string]bool, err error) {
	if err == nil {
		r.Clear()
		return
	}
	if r.clusters == nil {
		r.clusters = map[string]bool{}
	}
	maps.Copy(r.clusters, clusters)
}

// Clear leaves nothing to retry: after a resync, which decided every
// cluster.
func (r *RetrySet) Clear() { clear(r.clusters) }
