package hubcache

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	kubefake "k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	clusterfake "open-cluster-management.io/api/client/cluster/clientset/versioned/fake"
	clusterv1 "open-cluster-management.io/api/cluster/v1"
	cpfake "sigs.k8s.io/cluster-inventory-api/client/clientset/versioned/fake"

	"github.com/hubsync/hubsync/hub"
	"github.com/hubsync/hubsync/test/testutil"
)

type fakes struct {
	kube    *kubefake.Clientset
	cluster *clusterfake.Clientset
	reg     *prometheus.Registry
	hc      *Cache
}

func newFakes(t *testing.T, objs ...runtime.Object) *fakes {
	t.Helper()
	var kubeObjs, clusterObjs []runtime.Object
	for _, o := range objs {
		if _, ok := o.(*clusterv1.ManagedCluster); ok {
			clusterObjs = append(clusterObjs, o)
		} else {
			kubeObjs = append(kubeObjs, o)
		}
	}
	f := &fakes{kube: kubefake.NewClientset(kubeObjs...), cluster: clusterfake.NewSimpleClientset(clusterObjs...), reg: prometheus.NewPedanticRegistry()}
	hc, err := New(Clients{Kube: f.kube, Cluster: f.cluster, Profiles: cpfake.NewSimpleClientset()}, 0, f.reg)
	if err != nil {
		t.Fatal(err)
	}
	f.hc = hc
	t.Cleanup(hc.Stop)
	return f
}

// watches counts the watches the fake clients were asked for, by resource.
func (f *fakes) watches() map[string]int {
	out := map[string]int{}
	for _, acts := range [][]clienttesting.Action{f.kube.Actions(), f.cluster.Actions()} {
		for _, a := range acts {
			if a.GetVerb() == "watch" {
				out[a.GetResource().Resource]++
			}
		}
	}
	return out
}

func (f *fakes) running(resource string) float64 {
	return promtest.ToFloat64(f.hc.running.WithLabelValues(resource))
}

// counter is a handler that counts what it is handed.
type counter struct{ adds, updates atomic.Int32 }

func (c *counter) handler() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { c.adds.Add(1) },
		UpdateFunc: func(_, _ any) { c.updates.Add(1) },
	}
}

// TestOneInformerPerResourceAndSelector: two parts that take the same
// resource share one informer (one watch on the hub); a part that takes
// it later is handed what the cache already holds; a released part's
// handlers hear nothing more while the informer runs on for the other;
// the last release stops it.
func TestOneInformerPerResourceAndSelector(t *testing.T) {
	mc := func(name string) *clusterv1.ManagedCluster {
		return &clusterv1.ManagedCluster{ObjectMeta: metav1.ObjectMeta{Name: name}}
	}
	f := newFakes(t, mc("c1"), mc("c2"))
	ctx := context.Background()
	f.hc.Start(ctx)

	first, err := f.hc.ManagedClusters()
	if err != nil {
		t.Fatal(err)
	}
	var a, b counter
	syncedA, err := first.AddEventHandler(a.handler())
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, 5*time.Millisecond, (func() bool)(syncedA), "the first holder's handler synced")

	second, err := f.hc.ManagedClusters()
	if err != nil {
		t.Fatal(err)
	}
	if first.Informer() != second.Informer() {
		t.Fatal("two holders of ManagedClusters got two informers")
	}
	syncedB, err := second.AddEventHandler(b.handler())
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, 5*time.Millisecond, (func() bool)(syncedB), "the later holder's handler synced")
	if got := b.adds.Load(); got != 2 {
		t.Errorf("the later holder was handed %d clusters, want the 2 the cache holds", got)
	}
	if w := f.watches()["managedclusters"]; w != 1 {
		t.Errorf("%d watches of managedclusters, want 1", w)
	}
	if r := f.running("managedclusters"); r != 1 {
		t.Errorf("hubsync_hub_informers{resource=managedclusters} = %v, want 1", r)
	}

	// The second holder goes: its handler hears no more, the first's does.
	second.Release()
	second.Release() // twice is harmless
	if _, err := f.cluster.ClusterV1().ManagedClusters().Create(ctx, mc("c3"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, 5*time.Millisecond, func() error {
		if got := a.adds.Load(); got != 3 {
			return fmt.Errorf("the remaining holder heard %d adds, want 3", got)
		}
		return nil
	}, "the informer runs on for the remaining holder")
	if got := b.adds.Load(); got != 2 {
		t.Errorf("the released holder heard %d adds, want still 2", got)
	}
	if _, err := second.AddEventHandler(b.handler()); err == nil {
		t.Error("a released hold took a handler")
	}

	// The last holder goes: the informer stops.
	first.Release()
	if r := f.running("managedclusters"); r != 0 {
		t.Errorf("hubsync_hub_informers{resource=managedclusters} = %v after the last release, want 0", r)
	}
	// A new holder gets a new informer, which lists again.
	third, err := f.hc.ManagedClusters()
	if err != nil {
		t.Fatal(err)
	}
	defer third.Release()
	if third.Informer() == first.Informer() {
		t.Error("a stopped informer was handed out again")
	}
}

// TestSecretsBySelector: Secrets are watched only by a selector, one
// informer per selector and kept keys, and the cache keeps of each Secret
// only the keys its selector names, without managedFields.
func TestSecretsBySelector(t *testing.T) {
	token := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "msa", Namespace: "c1", Labels: map[string]string{hub.LabelIsManagedServiceAccount: "true"},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "agent"}}},
		Data: map[string][]byte{hub.TokenKey: []byte("tok"), hub.CAKey: []byte("ca"), "other": []byte("x")},
	}
	f := newFakes(t, token)
	if _, err := f.hc.Secrets(Secrets{Namespace: "c1"}); err == nil {
		t.Error("a Secret informer without a selector was made")
	}
	f.hc.Start(context.Background())
	one, err := f.hc.Secrets(TokenSecrets())
	if err != nil {
		t.Fatal(err)
	}
	defer one.Release()
	two, err := f.hc.Secrets(TokenSecrets())
	if err != nil {
		t.Fatal(err)
	}
	defer two.Release()
	whole, err := f.hc.Secrets(Secrets{LabelSelector: TokenSecrets().LabelSelector})
	if err != nil {
		t.Fatal(err)
	}
	defer whole.Release()
	if one.Informer() != two.Informer() || one.Informer() == whole.Informer() {
		t.Fatal("informers not shared by selector and kept keys")
	}
	var got *corev1.Secret
	testutil.Eventually(t, 10*time.Second, 5*time.Millisecond, func() error {
		obj, ok, err := one.Informer().GetIndexer().GetByKey("c1/msa")
		if err != nil || !ok {
			return errors.New("not cached yet")
		}
		got = obj.(*corev1.Secret)
		return nil
	}, "the token Secret cached")
	if len(got.Data) != 2 || string(got.Data[hub.TokenKey]) != "tok" || string(got.Data[hub.CAKey]) != "ca" {
		t.Errorf("kept data %v, want the token and CA only", got.Data)
	}
	if got.ManagedFields != nil {
		t.Error("managedFields kept")
	}
	if w := f.watches()["secrets"]; w != 2 {
		t.Errorf("%d watches of secrets, want 2 (two selectors)", w)
	}
}

// TestClustersKeepWhatTheRoomsRead: a cached ManagedCluster keeps its
// identity, labels, deletion, client configs, version, claims and the
// conditions the syncer mirrors, and nothing else. (The syncer's and the
// tunnel's tests check that what they make from it is what they make from
// the whole.)
func TestClustersKeepWhatTheRoomsRead(t *testing.T) {
	now := metav1.Now()
	mc := &clusterv1.ManagedCluster{
		ObjectMeta: metav1.ObjectMeta{Name: "c1", UID: "u1", ResourceVersion: "7", Labels: map[string]string{"a": "b"},
			Annotations: map[string]string{"x": "y"}, DeletionTimestamp: &now, Finalizers: []string{"f"},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "registration"}}},
		Spec: clusterv1.ManagedClusterSpec{HubAcceptsClient: true, LeaseDurationSeconds: 60,
			ManagedClusterClientConfigs: []clusterv1.ClientConfig{{URL: "https://10.0.0.1", CABundle: []byte("ca")}}},
		Status: clusterv1.ManagedClusterStatus{
			Version:       clusterv1.ManagedClusterVersion{Kubernetes: "v1.35.0"},
			ClusterClaims: []clusterv1.ManagedClusterClaim{{Name: "id.k8s.io", Value: "c1"}},
			Conditions: []metav1.Condition{
				{Type: clusterv1.ManagedClusterConditionAvailable, Status: metav1.ConditionTrue, Message: "ok"},
				{Type: clusterv1.ManagedClusterConditionJoined, Status: metav1.ConditionTrue},
				{Type: clusterv1.ManagedClusterConditionHubAccepted, Status: metav1.ConditionTrue},
				{Type: clusterv1.ManagedClusterConditionClockSynced, Status: metav1.ConditionTrue},
			},
			Capacity:    clusterv1.ResourceList{"cpu": resource.MustParse("8")},
			Allocatable: clusterv1.ResourceList{"cpu": resource.MustParse("7")},
		},
	}
	want := &clusterv1.ManagedCluster{
		ObjectMeta: metav1.ObjectMeta{Name: "c1", UID: "u1", ResourceVersion: "7", Labels: mc.Labels, DeletionTimestamp: &now},
		Spec:       clusterv1.ManagedClusterSpec{ManagedClusterClientConfigs: mc.Spec.ManagedClusterClientConfigs},
		Status: clusterv1.ManagedClusterStatus{Version: mc.Status.Version, ClusterClaims: mc.Status.ClusterClaims,
			Conditions: mc.Status.Conditions[:2]},
	}
	got, err := TrimCluster(mc.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	if !equality.Semantic.DeepEqual(got, want) {
		t.Errorf("kept %+v, want %+v", got, want)
	}
	tomb := cache.DeletedFinalStateUnknown{Key: "c1"}
	if got, _ := TrimCluster(tomb); got != tomb {
		t.Errorf("a tombstone became %v", got)
	}
}
