package multicluster_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	cpv1alpha1 "sigs.k8s.io/cluster-inventory-api/apis/v1alpha1"
	"sigs.k8s.io/cluster-inventory-api/pkg/access"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	mcbuilder "sigs.k8s.io/multicluster-runtime/pkg/builder"
	mcmanager "sigs.k8s.io/multicluster-runtime/pkg/manager"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	"github.com/hubsync/hubsync/test/multicluster/inventory"
)

// providerFile writes the consumer's pkg/access provider file: the
// provider hubsync names in status.accessProviders, run as `hubsync creds`
// (the cp-creds drop-in) with the cluster from KUBERNETES_EXEC_INFO, and
// the copy's namespace and the hub in its environment, as a controller's
// pod would have them.
func providerFile(t *testing.T, dir, namespace, hubKubeconfig string) string {
	t.Helper()
	file := map[string]any{"providers": []any{map[string]any{
		"name": providerName,
		"execConfig": map[string]any{
			"apiVersion":         "client.authentication.k8s.io/v1",
			"command":            env.plugin,
			"args":               []string{"creds", "--managed-serviceaccount=" + msaName},
			"provideClusterInfo": true,
			"env": []map[string]string{
				{"name": "NAMESPACE", "value": namespace},
				{"name": "KUBECONFIG", "value": hubKubeconfig},
			},
		},
	}}}
	data, err := json.MarshalIndent(file, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "clusterprofile-provider-file.json")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// configMapReconciler annotates every labelled ConfigMap with the name of
// the cluster it reached it through, and counts what it did.
type configMapReconciler struct {
	mgr mcmanager.Manager

	mu       sync.Mutex
	runs     map[string]int    // reconciles per cluster
	seen     map[string]bool   // "<cluster>/<configmap>" reconciled at least once
	failures map[string]int    // failed updates per cluster
	lastErr  map[string]string // the last failure per cluster
}

func (r *configMapReconciler) Reconcile(ctx context.Context, req mcreconcile.Request) (reconcile.Result, error) {
	cl, err := r.mgr.GetCluster(ctx, req.ClusterName)
	if err != nil {
		return reconcile.Result{}, fmt.Errorf("cluster %s: %w", req.ClusterName, err)
	}
	cm := &corev1.ConfigMap{}
	if err := cl.GetClient().Get(ctx, req.NamespacedName, cm); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	r.note(req.ClusterName, cm.Name, nil)
	if cm.Annotations[reconciledBy] == req.ClusterName {
		return reconcile.Result{}, nil
	}
	if cm.Annotations == nil {
		cm.Annotations = map[string]string{}
	}
	cm.Annotations[reconciledBy] = req.ClusterName
	if err := cl.GetClient().Update(ctx, cm); err != nil {
		if !apierrors.IsConflict(err) {
			r.note(req.ClusterName, "", err)
		}
		return reconcile.Result{}, fmt.Errorf("annotate ConfigMap %s on %s: %w", req.NamespacedName, req.ClusterName, err)
	}
	return reconcile.Result{}, nil
}

func (r *configMapReconciler) note(cluster, name string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		r.failures[cluster]++
		r.lastErr[cluster] = err.Error()
		return
	}
	r.runs[cluster]++
	r.seen[cluster+"/"+name] = true
}

func (r *configMapReconciler) saw(cluster, name string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.seen[cluster+"/"+name]
}

func (r *configMapReconciler) counts() (runs, failures map[string]int, lastErr map[string]string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	runs, failures, lastErr = map[string]int{}, map[string]int{}, map[string]string{}
	for k, v := range r.runs {
		runs[k] = v
	}
	for k, v := range r.failures {
		failures[k] = v
	}
	for k, v := range r.lastErr {
		lastErr[k] = v
	}
	return runs, failures, lastErr
}

// consumer is the multicluster controller under test and its provider.
type consumer struct {
	mgr        mcmanager.Manager
	provider   *inventory.Provider
	reconciler *configMapReconciler
}

// startConsumer runs a multicluster manager on the hub with the inventory
// provider over the consumer namespace's profiles, and the ConfigMap
// controller on every engaged cluster. It stops with the test.
func startConsumer(t *testing.T, hubCfg *rest.Config, providerFilePath string) *consumer {
	t.Helper()
	conf, err := access.NewFromFile(providerFilePath)
	if err != nil {
		t.Fatal(err)
	}
	log := funcr.New(func(prefix, args string) { fmt.Fprintln(env.ctrlLogs, prefix, args) }, funcr.Options{})
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := cpv1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	prov, err := inventory.New(inventory.Options{
		Access:         conf,
		Logger:         log,
		ClusterOptions: []cluster.Option{func(o *cluster.Options) { o.Logger = log }},
	})
	if err != nil {
		t.Fatal(err)
	}
	mgr, err := mcmanager.New(hubCfg, prov, manager.Options{
		Scheme:                 scheme,
		Logger:                 log,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             ctrlconfig.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := prov.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	rec := &configMapReconciler{mgr: mgr, runs: map[string]int{}, seen: map[string]bool{}, failures: map[string]int{}, lastErr: map[string]string{}}
	labelled := predicate.NewPredicateFuncs(func(o client.Object) bool { return o.GetLabels()[watchLabel] == "true" })
	err = mcbuilder.ControllerManagedBy(mgr).
		Named("mcr-configmaps").
		For(&corev1.ConfigMap{}, mcbuilder.WithPredicates(labelled)).
		Complete(rec)
	if err != nil {
		t.Fatal(err)
	}
	runManager(t, mgr, log)
	return &consumer{mgr: mgr, provider: prov, reconciler: rec}
}

// runManager starts mgr and stops it, waiting for it, when the test ends.
func runManager(t *testing.T, mgr mcmanager.Manager, log logr.Logger) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("multicluster manager: %v", err)
		}
		log.Info("multicluster manager stopped")
	})
}
