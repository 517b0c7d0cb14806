package kueue_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	inventoryv1alpha1 "sigs.k8s.io/cluster-inventory-api/apis/v1alpha1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	configapi "sigs.k8s.io/kueue/apis/config/v1beta2"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"
	"sigs.k8s.io/kueue/pkg/controller/admissionchecks/multikueue"
	"sigs.k8s.io/kueue/pkg/controller/core/indexer"
	"sigs.k8s.io/kueue/pkg/features"

	"github.com/hubsync/hubsync/test/fleet"
	"github.com/hubsync/hubsync/test/testutil"
)

// gcInterval is how often Kueue's garbage collector lists each worker's
// Workloads through its remote client: those lists are how the test sees
// that the client still works.
const gcInterval = time.Second

// kueueController is Kueue's MultiKueue controllers running in this
// process against the hub, as Kueue's manager runs them: the
// MultiKueueCluster reconciler (which keeps a remote client per cluster
// and reports it in the Active condition), the AdmissionCheck reconciler
// and the Workload reconciler, with Kueue's indexes.
type kueueController struct {
	// c reads and writes Kueue's objects on the hub, uncached.
	c    client.Client
	logs *fleet.LogBuffer
}

// startKueue starts Kueue's MultiKueue controllers with Kueue's
// MultiKueueClusterProfile feature gate on (MultiKueueClusters naming a
// ClusterProfile are refused otherwise) and providers as its
// multiKueue.clusterProfile.accessProviders configuration. They stop when
// t ends.
func startKueue(t *testing.T, providers []configapi.ClusterProfileAccessProvider) *kueueController {
	t.Helper()
	features.SetFeatureGateDuringTest(t, features.MultiKueueClusterProfile, true)
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, kueue.AddToScheme, inventoryv1alpha1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	k := &kueueController{logs: &fleet.LogBuffer{}}
	// Kueue logs through controller-runtime's logger, a process-wide one.
	ctrl.SetLogger(funcr.New(func(prefix, args string) {
		fmt.Fprintf(k.logs, "%s %s %s\n", time.Now().Format("15:04:05.000"), prefix, args)
	}, funcr.Options{Verbosity: 2}))
	cfg := *suite.hub.Config
	mgr, err := ctrl.NewManager(&cfg, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             ctrlconfig.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		t.Fatalf("Kueue's manager: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := indexer.Setup(ctx, mgr.GetFieldIndexer()); err != nil {
		t.Fatalf("Kueue's indexes: %v", err)
	}
	if err := multikueue.SetupIndexer(ctx, mgr.GetFieldIndexer(), kueueNS); err != nil {
		t.Fatalf("Kueue's MultiKueue indexes: %v", err)
	}
	err = multikueue.SetupControllers(mgr, kueueNS,
		multikueue.WithGCInterval(gcInterval),
		multikueue.WithClusterProfiles(&configapi.ClusterProfile{AccessProviders: providers}))
	if err != nil {
		t.Fatalf("Kueue's MultiKueue controllers: %v", err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := mgr.Start(ctx); err != nil {
			t.Errorf("Kueue's manager: %v", err)
		}
	})
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		if t.Failed() {
			t.Logf("Kueue's log:\n%s", k.logs.String())
		}
	})
	if !mgr.GetCache().WaitForCacheSync(ctx) {
		t.Fatal("Kueue's cache did not sync")
	}
	k.c, err = client.New(&cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// mkc reads a MultiKueueCluster; nil when there is none.
func (k *kueueController) mkc(ctx context.Context, name string) (*kueue.MultiKueueCluster, error) {
	m := &kueue.MultiKueueCluster{}
	err := k.c.Get(ctx, client.ObjectKey{Name: name}, m)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	return m, err
}

// active returns the Active condition Kueue's reconciler wrote on a
// MultiKueueCluster, or an error saying why there is none yet.
func (k *kueueController) active(ctx context.Context, name string) (*metav1.Condition, error) {
	m, err := k.mkc(ctx, name)
	switch {
	case err != nil:
		return nil, err
	case m == nil:
		return nil, fmt.Errorf("no MultiKueueCluster %s", name)
	}
	c := apimeta.FindStatusCondition(m.Status.Conditions, kueue.MultiKueueClusterActive)
	if c == nil {
		return nil, fmt.Errorf("MultiKueueCluster %s has no Active condition yet", name)
	}
	return c, nil
}

// waitActive waits until Kueue reports the MultiKueueCluster Active and
// returns the condition.
func (k *kueueController) waitActive(t *testing.T, name string) *metav1.Condition {
	t.Helper()
	var cond *metav1.Condition
	testutil.Eventually(t, 90*time.Second, 200*time.Millisecond, func() error {
		c, err := k.active(t.Context(), name)
		if err != nil {
			return err
		}
		if c.Status != metav1.ConditionTrue {
			return fmt.Errorf("Active %s: %s: %s", c.Status, c.Reason, c.Message)
		}
		cond = c
		return nil
	}, "Kueue reports MultiKueueCluster %s Active", name)
	return cond
}

// waitInactive waits until Kueue reports the MultiKueueCluster inactive
// for reason and returns the condition.
func (k *kueueController) waitInactive(t *testing.T, name, reason string) *metav1.Condition {
	t.Helper()
	var cond *metav1.Condition
	testutil.Eventually(t, 60*time.Second, 200*time.Millisecond, func() error {
		c, err := k.active(t.Context(), name)
		if err != nil {
			return err
		}
		if c.Status != metav1.ConditionFalse || c.Reason != reason {
			return fmt.Errorf("Active %s: %s: %s", c.Status, c.Reason, c.Message)
		}
		cond = c
		return nil
	}, "Kueue reports MultiKueueCluster %s inactive (%s)", name, reason)
	return cond
}

// waitGone waits until the MultiKueueCluster does not exist.
func (k *kueueController) waitGone(t *testing.T, name string) {
	t.Helper()
	testutil.Eventually(t, 60*time.Second, 200*time.Millisecond, func() error {
		m, err := k.mkc(t.Context(), name)
		if err != nil {
			return err
		}
		if m != nil {
			return fmt.Errorf("MultiKueueCluster %s still exists", name)
		}
		return nil
	}, "MultiKueueCluster %s deleted", name)
}

// activeWatch polls the Active condition of some MultiKueueClusters in
// the background and records every observation that is not True, so a
// test can say Kueue kept them Active all along.
type activeWatch struct {
	stop func()
	mu   sync.Mutex
	bad  []string
	n    int
}

func (k *kueueController) watchActive(names ...string) *activeWatch {
	ctx, cancel := context.WithCancel(context.Background())
	w := &activeWatch{}
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			for _, name := range names {
				c, err := k.active(ctx, name)
				if ctx.Err() != nil {
					return
				}
				w.mu.Lock()
				w.n++
				switch {
				case err != nil:
					w.bad = append(w.bad, fmt.Sprintf("%s %s: %v", time.Now().Format(time.RFC3339Nano), name, err))
				case c.Status != metav1.ConditionTrue:
					w.bad = append(w.bad, fmt.Sprintf("%s %s: Active %s: %s: %s", time.Now().Format(time.RFC3339Nano), name, c.Status, c.Reason, c.Message))
				}
				w.mu.Unlock()
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	})
	w.stop = func() { cancel(); wg.Wait() }
	return w
}

// result stops the watch and returns how many observations it made and
// those that were not Active.
func (w *activeWatch) result() (int, []string) {
	w.stop()
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n, w.bad
}

// admissionCheck creates a MultiKueue AdmissionCheck whose parameters
// name the MultiKueueConfig config, as a Kueue user sets one up.
func (k *kueueController) admissionCheck(t *testing.T, name, config string) {
	t.Helper()
	ac := &kueue.AdmissionCheck{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: kueue.AdmissionCheckSpec{
			ControllerName: kueue.MultiKueueControllerName,
			Parameters:     &kueue.AdmissionCheckParametersReference{APIGroup: kueue.SchemeGroupVersion.Group, Kind: "MultiKueueConfig", Name: config},
		},
	}
	if err := k.c.Create(t.Context(), ac); err != nil {
		t.Fatalf("create AdmissionCheck %s: %v", name, err)
	}
}

// waitCheck waits until Kueue's AdmissionCheck reconciler reports the
// check's Active condition with status and reason, and a message that
// contains message.
func (k *kueueController) waitCheck(t *testing.T, name string, status metav1.ConditionStatus, reason, message string) {
	t.Helper()
	testutil.Eventually(t, 60*time.Second, 200*time.Millisecond, func() error {
		ac := &kueue.AdmissionCheck{}
		if err := k.c.Get(t.Context(), client.ObjectKey{Name: name}, ac); err != nil {
			return err
		}
		c := apimeta.FindStatusCondition(ac.Status.Conditions, kueue.AdmissionCheckActive)
		if c == nil {
			return fmt.Errorf("no Active condition yet")
		}
		if c.Status != status || c.Reason != reason || !strings.Contains(c.Message, message) {
			return fmt.Errorf("Active %s: %s: %q", c.Status, c.Reason, c.Message)
		}
		return nil
	}, "Kueue's AdmissionCheck %s: Active %s, %s: message with %q", name, status, reason, message)
}

// userConfig creates a MultiKueueConfig listing clusters, as a Kueue user
// who names the clusters themselves would.
func (k *kueueController) userConfig(t *testing.T, name string, clusters ...string) {
	t.Helper()
	c := &kueue.MultiKueueConfig{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: kueue.MultiKueueConfigSpec{Clusters: clusters}}
	if err := k.c.Create(t.Context(), c); err != nil {
		t.Fatalf("create MultiKueueConfig %s: %v", name, err)
	}
}

// pathCluster creates a MultiKueueCluster reading the kubeconfig file at
// path (locationType Path), Kueue's route for files.
func (k *kueueController) pathCluster(t *testing.T, name, path string) {
	t.Helper()
	m := &kueue.MultiKueueCluster{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: kueue.MultiKueueClusterSpec{ClusterSource: kueue.ClusterSource{
			KubeConfig: &kueue.KubeConfig{LocationType: kueue.PathLocationType, Location: path},
		}},
	}
	if err := k.c.Create(t.Context(), m); err != nil {
		t.Fatalf("create MultiKueueCluster %s: %v", name, err)
	}
	t.Cleanup(func() { _ = k.c.Delete(context.Background(), m) })
}

// secret reads a Secret in Kueue's namespace; nil when there is none.
func (k *kueueController) secret(ctx context.Context, name string) (*corev1.Secret, error) {
	s := &corev1.Secret{}
	err := k.c.Get(ctx, client.ObjectKey{Namespace: kueueNS, Name: name}, s)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	return s, err
}
