package inventory

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	cpv1alpha1 "sigs.k8s.io/cluster-inventory-api/apis/v1alpha1"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache/informertest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	mcmanager "sigs.k8s.io/multicluster-runtime/pkg/manager"
)

// stubCluster is a cluster whose cache is always synced and whose Start
// waits for its context.
type stubCluster struct {
	cluster.Cluster
	cache cache.Cache
}

func (c *stubCluster) GetCache() cache.Cache { return c.cache }

func (c *stubCluster) Start(ctx context.Context) error {
	<-ctx.Done()
	return nil
}

// engageRecorder is a manager that only records the contexts clusters
// are engaged with.
type engageRecorder struct {
	mcmanager.Manager
	contexts []context.Context
}

func (m *engageRecorder) Engage(ctx context.Context, _ string, _ cluster.Cluster) error {
	m.contexts = append(m.contexts, ctx)
	return nil
}

// step is one state of the profile and what the provider must have done.
type step struct {
	name string
	// health is the ControlPlaneHealthy status; "" deletes the profile.
	health   metav1.ConditionStatus
	mutate   func(*cpv1alpha1.ClusterProfile)
	requeue  time.Duration
	engaged  bool
	rebuilds int
}

// TestReconcileFollowsUpstream walks one profile through the steps of the
// upstream provider: not engaged while unhealthy, engaged once healthy,
// rebuilt on every later event under upstream's comparison (only on a
// real change under the one ignoring funcs), left engaged when it turns
// unhealthy, disengaged when it goes.
func TestReconcileFollowsUpstream(t *testing.T) {
	relabel := func(p *cpv1alpha1.ClusterProfile) { p.Labels["env"] = "prod" }
	rotateCA := func(p *cpv1alpha1.ClusterProfile) {
		relabel(p)
		p.Status.AccessProviders[0].Cluster.CertificateAuthorityData = []byte("CA-2")
	}
	steps := func(relabelRebuilds int) []step {
		return []step{
			{"unhealthy", metav1.ConditionFalse, nil, notReadyRequeue, false, 0},
			{"healthy", metav1.ConditionTrue, nil, 0, true, 0},
			{"relabelled", metav1.ConditionTrue, relabel, 0, true, relabelRebuilds},
			{"CA changed", metav1.ConditionTrue, rotateCA, 0, true, relabelRebuilds + 1},
			{"unhealthy again", metav1.ConditionUnknown, rotateCA, notReadyRequeue, true, relabelRebuilds + 1},
			{"deleted", "", nil, 0, false, relabelRebuilds + 1},
		}
	}
	t.Run("upstream's comparison", func(t *testing.T) { runSteps(t, nil, steps(1)) })
	t.Run("ignoring funcs", func(t *testing.T) { runSteps(t, SameConfigIgnoringFuncs, steps(0)) })
}

func runSteps(t *testing.T, same func(a, b *rest.Config) bool, steps []step) {
	scheme := runtime.NewScheme()
	if err := cpv1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(testProfile()).Build()
	p, err := New(Options{
		Access:     testAccess(),
		SameConfig: same,
		NewCluster: func(context.Context, *cpv1alpha1.ClusterProfile, *rest.Config, ...cluster.Option) (cluster.Cluster, error) {
			return &stubCluster{cache: &informertest.FakeInformers{}}, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	mgr := &engageRecorder{}
	p.client, p.mgr = c, mgr
	ctx := t.Context()
	req := reconcile.Request{NamespacedName: client.ObjectKeyFromObject(testProfile())}
	for _, s := range steps {
		applyStep(t, c, s)
		res, err := p.Reconcile(ctx, req)
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		_, engaged := p.Engaged()[req.String()]
		st := p.Stats()
		if res.RequeueAfter != s.requeue || engaged != s.engaged || st.Rebuilds != s.rebuilds {
			t.Errorf("%s: requeue %v engaged %v rebuilds %d, want %v %v %d", s.name, res.RequeueAfter, engaged, st.Rebuilds, s.requeue, s.engaged, s.rebuilds)
		}
	}
	// Every engagement but the live one (none, after the delete) was
	// cancelled: a rebuild or the delete disengaged it.
	for i, ctx := range mgr.contexts {
		if ctx.Err() == nil {
			t.Errorf("engagement %d still live after the profile was deleted", i)
		}
	}
}

// applyStep writes the step's profile to the fake client.
func applyStep(t *testing.T, c client.Client, s step) {
	t.Helper()
	ctx := t.Context()
	cur := &cpv1alpha1.ClusterProfile{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(testProfile()), cur); err != nil {
		t.Fatal(err)
	}
	if s.health == "" {
		if err := c.Delete(ctx, cur); err != nil {
			t.Fatal(err)
		}
		return
	}
	want := testProfile()
	want.ResourceVersion = cur.ResourceVersion
	want.Status.Conditions = []metav1.Condition{{Type: cpv1alpha1.ClusterConditionControlPlaneHealthy, Status: s.health, Reason: "R"}}
	if s.mutate != nil {
		s.mutate(want)
	}
	if err := c.Update(ctx, want); err != nil {
		t.Fatal(err)
	}
}
