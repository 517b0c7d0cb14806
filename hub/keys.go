package hub

import (
	"encoding/json"

	clusterv1 "open-cluster-management.io/api/cluster/v1"
	clusterv1beta2 "open-cluster-management.io/api/cluster/v1beta2"
	cpv1alpha1 "sigs.k8s.io/cluster-inventory-api/apis/v1alpha1"
)

// Labels of ClusterProfiles, fixed by the upstream contracts so that
// existing ClusterProfile consumers work unchanged.
const (
	LabelClusterManager = cpv1alpha1.LabelClusterManagerKey
	LabelProfileSet     = cpv1alpha1.LabelClusterSetKey
	LabelClusterName    = clusterv1.ClusterNameLabelKey
	LabelClusterSet     = clusterv1beta2.ClusterSetLabel
)

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
	// LabelSyncedFrom marks a copy with SyncedFromValue.
	LabelSyncedFrom = "authentication.open-cluster-management.io/synced-from"

	// AnnotationTokenExpiration is the copied token's expiry, RFC 3339 UTC:
	// the MSA's status.expirationTimestamp, else the JWT's exp claim.
	AnnotationTokenExpiration = "hubsync.io/token-expiration"
	// AnnotationTokenFingerprint is TokenFingerprint of the copied token.
	AnnotationTokenFingerprint = "hubsync.io/token-fingerprint"
	// AnnotationSource names the hub Secret a copy came from, SourceKey.
	AnnotationSource = "hubsync.io/source"
	// AnnotationSyncedAt is when hubsync last wrote a copy's data (its
	// token and CA) from its source, RFC 3339 UTC: the copy's creation or
	// the update that brought it a rotated token.
	AnnotationSyncedAt = "hubsync.io/synced-at"

	// TokenKey and CAKey are the data keys of MSA token Secrets and of
	// their copies.
	TokenKey = "token"
	CAKey    = "ca.crt"
)

// ExecExtensionKey is the cluster extension client-go hands to exec
// credential plugins (with provideClusterInfo); cp-creds and `hubsync creds`
// read the cluster's name from it.
const ExecExtensionKey = "client.authentication.k8s.io/exec"

// ExecClusterConfig is the value of the ExecExtensionKey extension, which
// client-go hands an exec plugin as spec.cluster.config of its
// ExecCredential: {"clusterName": <cluster>}.
type ExecClusterConfig struct {
	ClusterName string `json:"clusterName"`
}

// ExecClusterConfigJSON returns the ExecClusterConfig of cluster, encoded
// as the extension's raw value.
func ExecClusterConfigJSON(cluster string) []byte {
	// A struct of one string always encodes.
	raw, _ := json.Marshal(ExecClusterConfig{ClusterName: cluster})
	return raw
}

// Labels of the objects hubsync's sinks write on the hub (Argo CD cluster
// Secrets, Kueue MultiKueueClusters, their kubeconfig Secrets and
// MultiKueueConfigs). A sink treats an object as its own only when it
// carries LabelManagedBy=ManagedBy and LabelSink=<the sink's name>; it
// never changes or deletes any other.
const (
	LabelManagedBy = "app.kubernetes.io/managed-by"
	ManagedBy      = "hubsync"
	LabelSink      = "hubsync.io/sink"
)
