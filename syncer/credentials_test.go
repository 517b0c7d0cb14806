package syncer

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

func TestCopyPair(t *testing.T) {
	profileRef := func(name string, controller bool) []metav1.OwnerReference {
		return []metav1.OwnerReference{{APIVersion: "multicluster.x-k8s.io/v1alpha1", Kind: "ClusterProfile", Name: name, UID: "u", Controller: ptr.To(controller)}}
	}
	secret := func(name string, labels, annotations map[string]string, refs []metav1.OwnerReference) *corev1.Secret {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "team-a", Labels: labels, Annotations: annotations, OwnerReferences: refs}}
	}
	from := func(v string) map[string]string { return map[string]string{LabelSyncedFrom: v} }
	tests := []struct {
		name   string
		secret *corev1.Secret
		want   string // "" for none
	}{
		{name: "hubsync's copy", secret: secret("a-b-c", from("a-b-c"), map[string]string{AnnotationSource: "a-b/c"}, profileRef("a-b", true)), want: "a-b/c"},
		{name: "upstream copy", secret: secret("edge-1-kueue", from("edge-1-kueue"), nil, profileRef("edge-1", true)), want: "edge-1/kueue"},
		{name: "upstream copy, dashed names split by the owner", secret: secret("a-b-c", from("a-b-c"), nil, profileRef("a", true)), want: "a/b-c"},
		{name: "no controller reference", secret: secret("edge-1-kueue", from("edge-1-kueue"), nil, nil)},
		{name: "owner is not the controller", secret: secret("edge-1-kueue", from("edge-1-kueue"), nil, profileRef("edge-1", false))},
		{name: "owner of another kind", secret: secret("edge-1-kueue", from("edge-1-kueue"), nil, []metav1.OwnerReference{{Kind: "Deployment", Name: "edge-1", Controller: ptr.To(true)}})},
		{name: "label differs from the name", secret: secret("renamed", from("edge-1-kueue"), nil, profileRef("edge-1", true))},
		{name: "owner does not prefix the label", secret: secret("edge-1-kueue", from("edge-1-kueue"), nil, profileRef("edge-2", true))},
		{name: "nothing after the owner", secret: secret("edge-1-", from("edge-1-"), nil, profileRef("edge-1", true))},
		{name: "no label", secret: secret("edge-1-kueue", nil, nil, profileRef("edge-1", true))},
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
