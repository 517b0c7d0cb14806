package hub

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
	cpv1alpha1 "sigs.k8s.io/cluster-inventory-api/apis/v1alpha1"
)

// CopyName is the name of a credential copy, fixed by the cp-creds
// contract: consumers' exec plugins look for "<cluster>-<msa>".
func CopyName(cluster, msa string) string { return cluster + "-" + msa }

// SourceKey identifies a (cluster, ManagedServiceAccount) pair,
// "<cluster>/<msa>": the hub Secret a copy comes from.
func SourceKey(cluster, msa string) string { return cluster + "/" + msa }

// SyncedFromValue is the synced-from label value of a copy: "<cluster>-<msa>"
// when that is a valid label value, else (over 63 characters) its first 52
// characters and "-" with the first 10 hex digits of the SHA-256 of
// "<cluster>/<msa>", which also keeps apart the pairs whose plain values
// collide.
func SyncedFromValue(cluster, msa string) string {
	return labelValue(CopyName(cluster, msa), SourceKey(cluster, msa))
}

// ClusterNameLabelValue returns the value of the cluster-name label for a
// cluster. Cluster names may be 253 characters long but label values only
// 63, so a longer name is cut to 52 characters and suffixed with a hash of
// the whole name; the profile's own name always holds the full name.
func ClusterNameLabelValue(name string) string { return labelValue(name, name) }

// labelValue is v when it is a valid label value, else v cut to 52
// characters and suffixed with 10 hex digits of the SHA-256 of hashed.
func labelValue(v, hashed string) string {
	if len(validation.IsValidLabelValue(v)) == 0 {
		return v
	}
	if len(v) > 52 {
		v = v[:52]
	}
	sum := sha256.Sum256([]byte(hashed))
	return strings.TrimRight(v, "-_.") + "-" + hex.EncodeToString(sum[:])[:10]
}

// IsOwned reports whether a profile carries the manager label of manager.
func IsOwned(p *cpv1alpha1.ClusterProfile, manager string) bool {
	return p.Labels[LabelClusterManager] == manager
}

// kubeconfigSecretPrefix starts the name of every kubeconfig Secret the
// Kueue sink writes; a shortened name has a dot instead of its last dash.
const kubeconfigSecretPrefix = "hubsync-kubeconfig"

// maxSecretName is the longest a Secret name (a DNS-1123 subdomain) may be.
const maxSecretName = 253

// KubeconfigSecretName is the name of the Secret holding the kubeconfig of
// the ClusterProfile named profile for Kueue's MultiKueue:
// "hubsync-kubeconfig-<profile>". When that is longer than a Secret name
// may be, it is "hubsync-kubeconfig." with 32 hex digits of the SHA-256 of
// the profile name, "-" and the start of the profile name. The dot at the
// prefix's end cannot come from a profile name, so shortened names never
// equal full ones, and the hash keeps shortened names apart.
func KubeconfigSecretName(profile string) string {
	name := kubeconfigSecretPrefix + "-" + profile
	if len(name) <= maxSecretName {
		return name
	}
	sum := sha256.Sum256([]byte(profile))
	short := kubeconfigSecretPrefix + "." + hex.EncodeToString(sum[:])[:32] + "-" + profile
	// The cut may leave a dot or dash at the end, which a name must not have.
	return strings.TrimRight(short[:maxSecretName], "-.")
}
