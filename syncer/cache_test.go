package syncer

import (
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "open-cluster-management.io/api/cluster/v1"
	cpv1alpha1 "sigs.k8s.io/cluster-inventory-api/apis/v1alpha1"

	"github.com/hubsync/hubsync/hubcache"
)

// TestProfilesFromTheCachedCluster: the profile (labels, spec, status with
// every kind of access provider) made from a ManagedCluster as the hub
// cache keeps it is the one made from the whole object, so the cache
// drops nothing the syncer reads.
func TestProfilesFromTheCachedCluster(t *testing.T) {
	server, err := ParseServerTemplate("https://proxy.example/{{.ClusterName}}")
	if err != nil {
		t.Fatal(err)
	}
	providers := []Provider{{Name: "direct", Direct: true, ClusterNameExtension: true}, {Name: "proxy", Server: server, CA: []byte("ca")}}
	mc := &clusterv1.ManagedCluster{
		ObjectMeta: metav1.ObjectMeta{Name: "c1", UID: "u1", ResourceVersion: "3",
			Labels:      map[string]string{"cluster.open-cluster-management.io/clusterset": "prod", "region": "eu"},
			Annotations: map[string]string{"open-cluster-management.io/note": "x"}},
		Spec: clusterv1.ManagedClusterSpec{HubAcceptsClient: true, LeaseDurationSeconds: 60,
			ManagedClusterClientConfigs: []clusterv1.ClientConfig{{URL: ""}, {URL: "https://10.0.0.1:6443", CABundle: []byte("cluster-ca")}}},
		Status: clusterv1.ManagedClusterStatus{
			Version:       clusterv1.ManagedClusterVersion{Kubernetes: "v1.35.4"},
			ClusterClaims: []clusterv1.ManagedClusterClaim{{Name: "id.k8s.io", Value: "c1"}, {Name: "platform.open-cluster-management.io", Value: "AWS"}},
			Conditions: []metav1.Condition{
				{Type: clusterv1.ManagedClusterConditionHubAccepted, Status: metav1.ConditionTrue, Reason: "HubClusterAdminAccepted"},
				{Type: clusterv1.ManagedClusterConditionJoined, Status: metav1.ConditionTrue, Reason: "ManagedClusterJoined", LastTransitionTime: metav1.Unix(5, 0)},
				{Type: clusterv1.ManagedClusterConditionAvailable, Status: metav1.ConditionFalse, Reason: "ManagedClusterLeaseUpdateStopped",
					Message: "lease not updated", LastTransitionTime: metav1.Unix(7, 0)},
				{Type: clusterv1.ManagedClusterConditionClockSynced, Status: metav1.ConditionTrue, Reason: "ManagedClusterClockSynced"},
			},
		},
	}
	obj, err := hubcache.TrimCluster(mc.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	cached := obj.(*clusterv1.ManagedCluster)
	whole, kept := NewProfile(testManager, "team-a", mc, providers), NewProfile(testManager, "team-a", cached, providers)
	if !equality.Semantic.DeepEqual(whole, kept) {
		t.Errorf("profile from the cached cluster %+v, from the whole %+v", kept, whole)
	}
	var cur cpv1alpha1.ClusterProfileStatus
	if a, b := DesiredStatus(cur, mc, providers), DesiredStatus(cur, cached, providers); !equality.Semantic.DeepEqual(a, b) {
		t.Errorf("status from the cached cluster %+v, from the whole %+v", b, a)
	}
	if len(DesiredStatus(cur, cached, providers).Conditions) != 2 {
		t.Error("the mirrored conditions are not both there: the test's cluster lacks what it must cover")
	}
}
