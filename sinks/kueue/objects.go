package kueue

import (
	"bytes"
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	cpv1alpha1 "sigs.k8s.io/cluster-inventory-api/apis/v1alpha1"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/hub"
	"github.com/hubsync/hubsync/stream"
)

// The Kueue API the sink writes: kueue.x-k8s.io/v1beta2, Kueue's storage
// version since v0.15 (v1beta1 is still served, with another shape). The
// sink uses the dynamic client, so hubsync does not depend on Kueue's
// module.
const (
	Group      = "kueue.x-k8s.io"
	Version    = "v1beta2"
	KindMKC    = "MultiKueueCluster"
	KindConfig = "MultiKueueConfig"
	// KubeconfigKey is the Secret key Kueue reads a kubeconfig from.
	KubeconfigKey = "kubeconfig"
	// LocationTypeSecret is kubeConfig.locationType for a Secret in
	// Kueue's namespace.
	LocationTypeSecret = "Secret"
)

var (
	// MultiKueueClusters is the resource of MultiKueueClusters (cluster-scoped).
	MultiKueueClusters = schema.GroupVersionResource{Group: Group, Version: Version, Resource: "multikueueclusters"}
	// MultiKueueConfigs is the resource of MultiKueueConfigs (cluster-scoped).
	MultiKueueConfigs = schema.GroupVersionResource{Group: Group, Version: Version, Resource: "multikueueconfigs"}
	// clusterProfiles is read for the profiles' UIDs, which the kubeconfig
	// Secrets' owner references need.
	clusterProfiles = cpv1alpha1.SchemeGroupVersion.WithResource("clusterprofiles")
)

// ownLabels are the labels of every object the sink writes: the
// configured ones, then the sink's own, which win (they are how it
// recognises its objects).
func ownLabels(sink string, extra map[string]string, cluster string) map[string]string {
	l := maps.Clone(extra)
	if l == nil {
		l = map[string]string{}
	}
	l[hub.LabelManagedBy] = hub.ManagedBy
	l[hub.LabelSink] = sink
	if cluster != "" {
		l[hub.LabelClusterName] = hub.ClusterNameLabelValue(cluster)
	}
	return l
}

// owned reports whether an object with these labels is sink's: written by
// hubsync, by this sink. Anything else is never changed or deleted.
func owned(labels map[string]string, sink string) bool {
	return labels[hub.LabelManagedBy] == hub.ManagedBy && labels[hub.LabelSink] == sink
}

// clusterSource is the spec.clusterSource of the MultiKueueCluster of
// profile: the kubeconfig Secret hubsync writes, or the profile itself.
func clusterSource(source, profile string) map[string]any {
	if source == config.KueueSourceClusterProfile {
		return map[string]any{"clusterProfileRef": map[string]any{"name": profile}}
	}
	return map[string]any{"kubeConfig": map[string]any{
		"location":     hub.KubeconfigSecretName(profile),
		"locationType": LocationTypeSecret,
	}}
}

// desiredMKC is the MultiKueueCluster the sink wants for profile: named
// after it, labelled as the sink's.
func desiredMKC(sink string, cfg config.KueueSink, profile string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{
		"spec": map[string]any{"clusterSource": clusterSource(cfg.Source, profile)},
	}}
	u.SetAPIVersion(Group + "/" + Version)
	u.SetKind(KindMKC)
	u.SetName(profile)
	u.SetLabels(ownLabels(sink, cfg.Labels, profile))
	return u
}

// mkcUpToDate reports whether cur has want's spec and labels.
func mkcUpToDate(cur, want *unstructured.Unstructured) bool {
	return equality.Semantic.DeepEqual(cur.Object["spec"], want.Object["spec"]) &&
		maps.Equal(cur.GetLabels(), want.GetLabels())
}

// mkcUpdated returns cur with want's spec and labels, keeping cur's
// identity, resource version (so the update fails if cur changed
// meanwhile), annotations and status.
func mkcUpdated(cur, want *unstructured.Unstructured) *unstructured.Unstructured {
	out := cur.DeepCopy()
	out.Object["spec"] = want.DeepCopy().Object["spec"]
	out.SetLabels(want.GetLabels())
	return out
}

// kubeconfigFor is the kubeconfig Kueue reads for profile: the access
// provider's server and CA data, and the token inline (Kueue refuses exec
// plugins and token files). The user is named after the credential copy
// the token comes from.
func kubeconfigFor(profile, msa string, p stream.AccessProviderSummary, token string) *clientcmdapi.Config {
	cfg := clientcmdapi.NewConfig()
	user := hub.CopyName(profile, msa)
	cfg.Clusters[profile] = &clientcmdapi.Cluster{Server: p.Server, CertificateAuthorityData: p.CAData}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts[profile] = &clientcmdapi.Context{Cluster: profile, AuthInfo: user}
	cfg.CurrentContext = profile
	return cfg
}

// desiredSecret is the kubeconfig Secret of profile, holding kubeconfig
// (the encoded file, with the token whose fingerprint is fingerprint),
// owned by the profile (uid) so that it goes with it.
func desiredSecret(sink string, cfg config.KueueSink, profile string, uid types.UID, kubeconfig []byte, fingerprint string) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name:        hub.KubeconfigSecretName(profile),
			Namespace:   cfg.Namespace,
			Labels:      ownLabels(sink, cfg.Labels, profile),
			Annotations: map[string]string{hub.AnnotationTokenFingerprint: fingerprint},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: cpv1alpha1.SchemeGroupVersion.String(),
				Kind:       "ClusterProfile",
				Name:       profile,
				UID:        uid,
			}},
		},
		Type: corev1.SecretTypeOpaque,
		Data: map[string][]byte{KubeconfigKey: kubeconfig},
	}
}

// secretUpToDate reports whether cur holds what want says: the same data,
// labels and owner references, and want's annotations (others may add
// their own).
func secretUpToDate(cur, want *corev1.Secret) bool {
	for k, v := range want.Annotations {
		if cur.Annotations[k] != v {
			return false
		}
	}
	return cur.Type == want.Type &&
		maps.EqualFunc(cur.Data, want.Data, bytes.Equal) &&
		maps.Equal(cur.Labels, want.Labels) &&
		slices.EqualFunc(cur.OwnerReferences, want.OwnerReferences, func(a, b metav1.OwnerReference) bool {
			return equality.Semantic.DeepEqual(a, b)
		})
}

// secretUpdated returns cur with want's content, keeping its identity,
// resource version and the annotations others wrote.
func secretUpdated(cur, want *corev1.Secret) *corev1.Secret {
	out := cur.DeepCopy()
	out.Data = want.Data
	out.StringData = nil
	out.Labels = maps.Clone(want.Labels)
	if out.Annotations == nil {
		out.Annotations = map[string]string{}
	}
	maps.Copy(out.Annotations, want.Annotations)
	out.OwnerReferences = slices.Clone(want.OwnerReferences)
	return out
}

// configClusters returns the spec.clusters the MultiKueueConfig should
// have when the sink keeps the MultiKueueClusters ours and the config
// lists current: the order is Kueue's preference (its incremental
// dispatcher tries clusters in it), so clusters already listed keep their
// places and new ones follow, by name. At most KueueMaxClusters fit; the
// others are returned as left out.
func configClusters(current, ours []string) (clusters, leftOut []string) {
	want := map[string]bool{}
	for _, c := range ours {
		want[c] = true
	}
	for _, c := range current {
		if want[c] {
			clusters = append(clusters, c)
			delete(want, c)
		}
	}
	clusters = append(clusters, slices.Sorted(maps.Keys(want))...)
	if len(clusters) > config.KueueMaxClusters {
		return clusters[:config.KueueMaxClusters], clusters[config.KueueMaxClusters:]
	}
	return clusters, nil
}

// specClusters reads spec.clusters of a MultiKueueConfig.
func specClusters(u *unstructured.Unstructured) []string {
	l, _, _ := unstructured.NestedStringSlice(u.Object, "spec", "clusters")
	return l
}

// desiredConfig is the MultiKueueConfig listing clusters: cur's with the
// new list and the sink's labels, or a new one when cur is nil.
func desiredConfig(sink string, cfg config.KueueSink, cur *unstructured.Unstructured, clusters []string) *unstructured.Unstructured {
	var u *unstructured.Unstructured
	if cur != nil {
		u = cur.DeepCopy()
	} else {
		u = &unstructured.Unstructured{Object: map[string]any{}}
		u.SetAPIVersion(Group + "/" + Version)
		u.SetKind(KindConfig)
		u.SetName(cfg.MultiKueueConfig)
	}
	list := make([]any, len(clusters))
	for i, c := range clusters {
		list[i] = c
	}
	// Other spec fields (quotaManagement) are kept as they are.
	_ = unstructured.SetNestedSlice(u.Object, list, "spec", "clusters")
	u.SetLabels(ownLabels(sink, cfg.Labels, ""))
	return u
}
