package daemon

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

func TestMissingAPIs(t *testing.T) {
	all := []*metav1.APIResourceList{
		{GroupVersion: "multicluster.x-k8s.io/v1alpha1", APIResources: []metav1.APIResource{{Name: "clusterprofiles"}}},
		{GroupVersion: "cluster.open-cluster-management.io/v1", APIResources: []metav1.APIResource{{Name: "managedclusters"}}},
		{GroupVersion: "cluster.open-cluster-management.io/v1beta2", APIResources: []metav1.APIResource{{Name: "managedclustersets"}, {Name: "managedclustersetbindings"}}},
	}
	for _, tc := range []struct {
		name      string
		resources []*metav1.APIResourceList
		want      []string
	}{
		{name: "all served", resources: all},
		{name: "no cluster inventory CRD", resources: all[1:], want: []string{"clusterprofiles.multicluster.x-k8s.io/v1alpha1"}},
		{name: "no bindings", resources: []*metav1.APIResourceList{all[0], all[1], {
			GroupVersion: "cluster.open-cluster-management.io/v1beta2", APIResources: []metav1.APIResource{{Name: "managedclustersets"}},
		}}, want: []string{"managedclustersetbindings.cluster.open-cluster-management.io/v1beta2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kube := fake.NewClientset()
			kube.Resources = tc.resources
			got, err := missingAPIs(kube, requiredAPIs)
			if err != nil {
				t.Fatal(err)
			}
			if strings.Join(got, ",") != strings.Join(tc.want, ",") {
				t.Fatalf("missing = %v, want %v", got, tc.want)
			}
		})
	}
}
