package syncer

// Labels and annotations of ManagedServiceAccount token Secrets and of the
// credential copies hubsync writes into consumer namespaces. The label keys
// are OCM's (managed-serviceaccount); the annotations are hubsync's own and
// carry nothing secret, so a consumer can read them without the token.
const (
	// LabelIsManagedServiceAccount marks the hub token Secret of an MSA
	// (namespace = cluster, name = MSA name).
	LabelIsManagedServiceAccount = "authentication.open-cluster-management.io/is-managed-serviceaccount"
	// LabelSyncToClusterProfile on a ManagedServiceAccount asks for its token
	// to be copied next to every ClusterProfile of its cluster.
	LabelSyncToClusterProfile = "authentication.open-cluster-management.io/sync-to-clusterprofile"
	// LabelSyncedFrom marks a copy with "<cluster>-<msa>" (or, when that is
	// longer than a label value may be, a shortened form with a hash).
	LabelSyncedFrom = "authentication.open-cluster-management.io/synced-from"

	// AnnotationTokenExpiration is the copied token's expiry, RFC 3339 UTC:
	// the MSA's status.expirationTimestamp, else the JWT's exp claim.
	AnnotationTokenExpiration = "hubsync.io/token-expiration"
	// AnnotationTokenFingerprint is "sha256:" and the first 16 hex digits of
	// the SHA-256 of the token: enough to tell tokens apart, useless to
	// recover one.
	AnnotationTokenFingerprint = "hubsync.io/token-fingerprint"
	// AnnotationSource names the hub Secret a copy came from,
	// "<cluster>/<msa>".
	AnnotationSource = "hubsync.io/source"

	// TokenKey and CAKey are the data keys of MSA token Secrets.
	TokenKey = "token"
	CAKey    = "ca.crt"
)
