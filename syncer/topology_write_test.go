package syncer

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubefake "k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"
	clusterfake "open-cluster-management.io/api/client/cluster/clientset/versioned/fake"
	clusterv1 "open-cluster-management.io/api/cluster/v1"
	cpv1alpha1 "sigs.k8s.io/cluster-inventory-api/apis/v1alpha1"
	cpfake "sigs.k8s.io/cluster-inventory-api/client/clientset/versioned/fake"

	"github.com/hubsync/hubsync/hub"
)

// TestCreateSendsStatusOnlyToTheSubresource: a new profile's create
// carries its labels and spec and no status (the server would drop it,
// after decoding it); the status write that follows carries all of it.
func TestCreateSendsStatusOnlyToTheSubresource(t *testing.T) {
	cluster := &clusterv1.ManagedCluster{
		ObjectMeta: metav1.ObjectMeta{Name: "c1", Labels: map[string]string{"cluster.open-cluster-management.io/clusterset": "set-1"}},
		Status: clusterv1.ManagedClusterStatus{
			Version:       clusterv1.ManagedClusterVersion{Kubernetes: "v1.35.4"},
			ClusterClaims: []clusterv1.ManagedClusterClaim{{Name: "region.open-cluster-management.io", Value: "eu"}},
			Conditions: []metav1.Condition{{Type: clusterv1.ManagedClusterConditionAvailable, Status: metav1.ConditionTrue,
				Reason: "ManagedClusterAvailable", LastTransitionTime: metav1.Unix(1, 0)}},
		},
	}
	profiles := cpfake.NewSimpleClientset()
	s, err := New(Clients{Kube: kubefake.NewSimpleClientset(), Cluster: clusterfake.NewSimpleClientset(), Profiles: profiles},
		Options{ClusterManager: "open-cluster-management", Workers: 1, RetryBase: time.Millisecond, RetryMax: time.Second,
			RequestTimeout: time.Second, ForeignWriters: ForeignOptions{HoldOff: time.Second, MaxHoldOff: time.Minute}},
		slog.New(slog.NewTextHandler(io.Discard, nil)), prometheus.NewRegistry(), record.NewFakeRecorder(10))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.watch(); err != nil { // the listers, not run
		t.Fatal(err)
	}
	t.Cleanup(func() { s.holds.Release() })
	if err := s.create(context.Background(), "team-a", cluster); err != nil {
		t.Fatal(err)
	}
	var created, status *cpv1alpha1.ClusterProfile
	for _, a := range profiles.Actions() {
		w, ok := a.(clienttesting.CreateAction) // an update has an object too
		if !ok {
			continue
		}
		switch p := w.GetObject().(*cpv1alpha1.ClusterProfile); {
		case a.GetVerb() == "create":
			created = p
		case a.GetVerb() == "update" && a.GetSubresource() == "status":
			status = p
		}
	}
	if created == nil || status == nil {
		t.Fatalf("actions %v: want a create and a status write", profiles.Actions())
	}
	if !statusEmpty(created.Status) {
		t.Errorf("the create carries a status: %+v", created.Status)
	}
	if created.Labels[hub.LabelClusterManager] == "" || created.Spec.DisplayName != "c1" {
		t.Errorf("the create lacks labels or spec: %+v", created.ObjectMeta)
	}
	want := NewProfile("open-cluster-management", "team-a", cluster, nil).Status
	if status.Status.Version != want.Version || len(status.Status.Conditions) != len(want.Conditions) || len(status.Status.Properties) != len(want.Properties) {
		t.Errorf("status write %+v, want %+v", status.Status, want)
	}
}
