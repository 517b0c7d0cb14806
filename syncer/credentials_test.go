package syncer

import (
	"testing"

	"github.com/hubsync/hubsync/hub"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	cpv1alpha1 "sigs.k8s.io/cluster-inventory-api/apis/v1alpha1"
)

func TestCopyPair(t *testing.T) {
	profileRef := func(name string, controller bool) []metav1.OwnerReference {
		return []metav1.OwnerReference{{APIVersion: "multicluster.x-k8s.io/v1alpha1", Kind: "ClusterProfile", Name: name, UID: "u", Controller: ptr.To(controller)}}
	}
	secret := func(name string, labels, annotations map[string]string, refs []metav1.OwnerReference) *corev1.Secret {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "team-a", Labels: labels, Annotations: annotations, OwnerReferences: refs}}
	}
	from := func(v string) map[string]string { return map[string]string{hub.LabelSyncedFrom: v} }
	tests := []struct {
		name   string
		secret *corev1.Secret
		want   string // "" for none
	}{
		{name: "hubsync's copy", secret: secret("a-b-c", from("a-b-c"), map[string]string{hub.AnnotationSource: "a-b/c"}, profileRef("a-b", true)), want: "a-b/c"},
		{name: "upstream copy", secret: secret("edge-1-kueue", from("edge-1-kueue"), nil, profileRef("edge-1", true)), want: "edge-1/kueue"},
		{name: "upstream copy, dashed names split by the owner", secret: secret("a-b-c", from("a-b-c"), nil, profileRef("a", true)), want: "a/b-c"},
		{name: "no controller reference", secret: secret("edge-1-kueue", from("edge-1-kueue"), nil, nil)},
		{name: "owner is not the controller", secret: secret("edge-1-kueue", from("edge-1-kueue"), nil, profileRef("edge-1", false))},
		{name: "owner of another kind", secret: secret("edge-1-kueue", from("edge-1-kueue"), nil, []metav1.OwnerReference{{Kind: "Deployment", Name: "edge-1", Controller: ptr.To(true)}})},
		{name: "label differs from the name", secret: secret("renamed", from("edge-1-kueue"), nil, profileRef("edge-1", true))},
		{name: "owner does not prefix the label", secret: secret("edge-1-kueue", from("edge-1-kueue"), nil, profileRef("edge-2", true))},
		{name: "nothing after the owner", secret: secret("edge-1-", from("edge-1-"), nil, profileRef("edge-1", true))},
		{name: "no label", secret: secret("edge-1-kueue", nil, nil, profileRef("edge-1", true))},
		{name: "hubsync's marks without a controller", secret: secret("a-b-c", from("a-b-c"), map[string]string{hub.AnnotationSource: "a-b/c"}, nil)},
		{name: "hubsync's marks, controller of another cluster", secret: secret("a-b-c", from("a-b-c"), map[string]string{hub.AnnotationSource: "a-b/c"}, profileRef("x", true))},
		{name: "ClusterProfile kind of another group", secret: secret("edge-1-kueue", from("edge-1-kueue"), nil, []metav1.OwnerReference{{APIVersion: "example.com/v1", Kind: "ClusterProfile", Name: "edge-1", Controller: ptr.To(true)}})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := copyPair(tt.secret)
			if ok != (tt.want != "") || got != tt.want {
				t.Errorf("copyPair = %q, %v; want %q", got, ok, tt.want)
			}
		})
	}
}

func TestCopyOwnership(t *testing.T) {
	const manager = "open-cluster-management"
	profile := func(uid, mgr string) *cpv1alpha1.ClusterProfile {
		return &cpv1alpha1.ClusterProfile{ObjectMeta: metav1.ObjectMeta{Name: "c1", Namespace: "team-a", UID: types.UID(uid), Labels: map[string]string{hub.LabelClusterManager: mgr}}}
	}
	ref := func(uid string) []metav1.OwnerReference {
		return []metav1.OwnerReference{{APIVersion: "multicluster.x-k8s.io/v1alpha1", Kind: "ClusterProfile", Name: "c1", UID: types.UID(uid), Controller: ptr.To(true)}}
	}
	secret := func(labels, annotations map[string]string, refs []metav1.OwnerReference) *corev1.Secret {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "c1-app", Namespace: "team-a", Labels: labels, Annotations: annotations, OwnerReferences: refs}}
	}
	ours := map[string]string{hub.AnnotationSource: "c1/app"}
	upstream := map[string]string{hub.LabelSyncedFrom: "c1-app"}
	tests := []struct {
		name   string
		secret *corev1.Secret
		live   *cpv1alpha1.ClusterProfile
		want   ownership
	}{
		{"hubsync's copy of the live profile", secret(upstream, ours, ref("u1")), profile("u1", manager), ownedLive},
		{"upstream copy of the live profile", secret(upstream, nil, ref("u1")), profile("u1", manager), ownedLive},
		{"marks but no owner reference", secret(upstream, ours, nil), profile("u1", manager), foreign},
		{"marks, owner reference not the controller", secret(upstream, ours, []metav1.OwnerReference{{APIVersion: "multicluster.x-k8s.io/v1alpha1", Kind: "ClusterProfile", Name: "c1", UID: "u1"}}), profile("u1", manager), foreign},
		{"controller is another cluster's profile", secret(upstream, ours, []metav1.OwnerReference{{APIVersion: "multicluster.x-k8s.io/v1alpha1", Kind: "ClusterProfile", Name: "c2", UID: "u1", Controller: ptr.To(true)}}), profile("u1", manager), foreign},
		{"another pair's annotation", secret(upstream, map[string]string{hub.AnnotationSource: "c1/other"}, ref("u1")), profile("u1", manager), foreign},
		{"no marks", secret(nil, nil, ref("u1")), profile("u1", manager), foreign},
		{"profile recreated: old uid", secret(upstream, ours, ref("u0")), profile("u1", manager), ownedDangling},
		{"profile gone", secret(upstream, ours, ref("u1")), nil, ownedDangling},
		{"controller is a live profile of another manager", secret(upstream, ours, ref("u1")), profile("u1", "someone-else"), foreign},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := copyOwnership(tt.secret, "c1", "app", tt.live, manager); got != tt.want {
				t.Errorf("copyOwnership = %v, want %v", got, tt.want)
			}
		})
	}
}
