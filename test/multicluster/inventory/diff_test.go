package inventory

import (
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientcmdv1 "k8s.io/client-go/tools/clientcmd/api/v1"
	cpv1alpha1 "sigs.k8s.io/cluster-inventory-api/apis/v1alpha1"
)

func withConditions(p *cpv1alpha1.ClusterProfile) *cpv1alpha1.ClusterProfile {
	at := metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	p.Status.Conditions = []metav1.Condition{
		{Type: cpv1alpha1.ClusterConditionControlPlaneHealthy, Status: metav1.ConditionTrue, Reason: "ManagedClusterAvailable", Message: "ok", LastTransitionTime: at},
		{Type: "Joined", Status: metav1.ConditionTrue, Reason: "ManagedClusterJoined", Message: "joined", LastTransitionTime: at},
	}
	p.Status.Version.Kubernetes = "v1.35.4"
	return p
}

func TestClassifyUpdate(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(*cpv1alpha1.ClusterProfile)
		class  Class
		fields []string
	}{
		{"nothing but the resourceVersion", func(*cpv1alpha1.ClusterProfile) {}, Invisible, []string{"metadata.resourceVersion only"}},
		{"managedFields only", func(p *cpv1alpha1.ClusterProfile) {
			p.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "hubsync", Operation: metav1.ManagedFieldsOperationUpdate}}
		}, Invisible, []string{"metadata.managedFields"}},
		{"lastTransitionTime without status", func(p *cpv1alpha1.ClusterProfile) {
			p.Status.Conditions[1].LastTransitionTime = metav1.NewTime(time.Date(2026, 1, 2, 0, 0, 0, 0, time.UTC))
		}, Invisible, []string{"status.conditions[Joined].lastTransitionTime"}},
		{"extension re-encoded", func(p *cpv1alpha1.ClusterProfile) {
			p.Status.AccessProviders[0].Cluster.Extensions[0].Extension.Raw = []byte(`{ "clusterName": "east" }`)
		}, Invisible, []string{"status.accessProviders[open-cluster-management].extensions (re-encoded, same meaning)"}},
		{"clusterset label", func(p *cpv1alpha1.ClusterProfile) {
			p.Labels["multicluster.x-k8s.io/clusterset"] = "green"
		}, ConsumerVisible, []string{"metadata.labels[multicluster.x-k8s.io/clusterset]"}},
		{"claim", func(p *cpv1alpha1.ClusterProfile) {
			p.Status.Properties = []cpv1alpha1.Property{{Name: "region", Value: "eu"}}
		}, ConsumerVisible, []string{"status.properties"}},
		{"health message", func(p *cpv1alpha1.ClusterProfile) {
			p.Status.Conditions[0].Message = "still ok"
		}, ConsumerVisible, []string{"status.conditions[ControlPlaneHealthy].message"}},
		{"another provider's server", func(p *cpv1alpha1.ClusterProfile) {
			p.Status.AccessProviders = append(p.Status.AccessProviders, cpv1alpha1.AccessProvider{Name: "gateway", Cluster: clientcmdv1.Cluster{Server: "https://gw"}})
		}, ConsumerVisible, []string{"status.accessProviders[gateway]"}},
		{"health turns False", func(p *cpv1alpha1.ClusterProfile) {
			p.Status.Conditions[0].Status = metav1.ConditionFalse
			p.Status.Conditions[0].LastTransitionTime = metav1.NewTime(time.Date(2026, 1, 2, 0, 0, 0, 0, time.UTC))
		}, ProviderRead, []string{"status.conditions[ControlPlaneHealthy].lastTransitionTime", "status.conditions[ControlPlaneHealthy].status"}},
		{"exec extension changed", func(p *cpv1alpha1.ClusterProfile) {
			p.Status.AccessProviders[0].Cluster.Extensions[0].Extension.Raw = []byte(`{"clusterName":"west"}`)
		}, ProviderRead, []string{"status.accessProviders[open-cluster-management].extensions"}},
		{"CA changed", func(p *cpv1alpha1.ClusterProfile) {
			p.Status.AccessProviders[0].Cluster.CertificateAuthorityData = []byte("CA-2")
		}, AccessConfig, []string{"status.accessProviders[open-cluster-management].certificate-authority-data"}},
		{"provider removed", func(p *cpv1alpha1.ClusterProfile) {
			p.Status.AccessProviders = nil
		}, AccessConfig, []string{`status.accessProviders (picked "open-cluster-management", now "")`, "status.accessProviders[open-cluster-management]"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := withConditions(testProfile())
			after := before.DeepCopy()
			after.ResourceVersion = "11"
			tc.mutate(after)
			got := ClassifyUpdate(testAccess(), before, after)
			if got.Class != tc.class || !slices.Equal(got.Fields, tc.fields) {
				t.Errorf("got %s %q, want %s %q", got.Class, got.Fields, tc.class, tc.fields)
			}
		})
	}
}
