package syncer

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cpv1alpha1 "sigs.k8s.io/cluster-inventory-api/apis/v1alpha1"
)

func TestDesiredCopyKeys(t *testing.T) {
	profile := &cpv1alpha1.ClusterProfile{ObjectMeta: metav1.ObjectMeta{Name: "c1", Namespace: "team", UID: "p-uid"}}
	tests := []struct {
		name string
		data map[string][]byte
		want []string
	}{
		{"token and CA", map[string][]byte{TokenKey: []byte("t"), CAKey: []byte("ca")}, []string{TokenKey, CAKey}},
		{"other keys stay on the hub", map[string][]byte{TokenKey: []byte("t"), CAKey: []byte("ca"), "kubeconfig": []byte("admin"), "note": nil},
			[]string{TokenKey, CAKey}},
		{"no CA", map[string][]byte{TokenKey: []byte("t")}, []string{TokenKey}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			hub := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "msa", Namespace: "c1"}, Data: tt.data}
			got := DesiredCopy("c1", "msa", nil, hub, profile)
			if len(got.Data) != len(tt.want) {
				t.Fatalf("copy keys %v; want %v", keysOf(got.Data), tt.want)
			}
			for _, k := range tt.want {
				if string(got.Data[k]) != string(tt.data[k]) {
					t.Errorf("%s = %q; want %q", k, got.Data[k], tt.data[k])
				}
			}
			if got.Type != corev1.SecretTypeOpaque {
				t.Errorf("type %q", got.Type)
			}
		})
	}
}

func keysOf(m map[string][]byte) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
