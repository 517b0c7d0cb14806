// Package kueue_test proves, with Kueue v0.19.2's own MultiKueue
// controllers, that what hubsync writes for Kueue works: the hubsync
// binary runs a kueue sink (or kubeconfig sinks) against a real hub
// kube-apiserver, and Kueue's MultiKueueCluster and AdmissionCheck
// reconcilers run in this process against the same hub, reaching a second
// real kube-apiserver (the worker cluster) with the credentials hubsync
// handed them. It lives in its own module because Kueue's dependency
// graph is much heavier than hubsync's.
package kueue_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/hubsync/hubsync/test/controlplane"
)

const (
	// kueueNS is Kueue's namespace on the hub: its ClusterProfiles become
	// MultiKueueClusters, and its kubeconfig Secrets live there.
	kueueNS = "kueue-system"
	// workerIP is the worker kube-apiserver's loopback address.
	workerIP = "127.0.0.71"
	// workerRole lets a worker identity do what Kueue's remote client
	// does with it here: watch and list (for garbage collection) the
	// Workloads of its origin.
	workerRole = "multikueue-worker"
)

// suite is what the package's tests share: the hub (started by
// controlplane.Main) and the worker cluster.
var suite struct {
	hub    *controlplane.ControlPlane
	worker *worker
}

func TestMain(m *testing.M) {
	os.Exit(controlplane.Main(m, "kueue proof", setup))
}

// setup installs Kueue's CRDs on the hub, straight from the Kueue module
// this module pins, and starts the worker cluster with Kueue's Workload
// CRD, the only Kueue API Kueue's remote client uses there.
func setup(ctx context.Context, s *controlplane.Suite) error {
	suite.hub = s.Hub
	dir, err := kueueModuleDir()
	if err != nil {
		return err
	}
	bases := filepath.Join(dir, "config", "components", "crd", "bases")
	if _, err := envtest.InstallCRDs(s.Hub.Config, envtest.CRDInstallOptions{Paths: []string{bases}, ErrorIfPathMissing: true}); err != nil {
		return fmt.Errorf("install Kueue's CRDs on the hub: %w", err)
	}
	m, err := controlplane.StartManaged(ctx, s.Hub.EtcdURL(), "worker", workerIP)
	if err != nil {
		return err
	}
	s.Defer(func() {
		if err := m.Close(); err != nil {
			fmt.Fprintf(os.Stderr, "kueue proof: worker: %v\n", err)
		}
	})
	workloads := filepath.Join(bases, "kueue.x-k8s.io_workloads.yaml")
	if _, err := envtest.InstallCRDs(m.Config, envtest.CRDInstallOptions{Paths: []string{workloads}, ErrorIfPathMissing: true}); err != nil {
		return fmt.Errorf("install Kueue's Workload CRD on the worker: %w", err)
	}
	kube, err := kubernetes.NewForConfig(m.Config)
	if err != nil {
		return err
	}
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: workerRole},
		Rules: []rbacv1.PolicyRule{{
			APIGroups: []string{"kueue.x-k8s.io"}, Resources: []string{"workloads"},
			Verbs: []string{"get", "list", "watch", "delete"},
		}},
	}
	if _, err := kube.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("worker role: %w", err)
	}
	suite.worker = &worker{m: m, kube: kube}
	return nil
}

// kueueModuleDir is the directory of the Kueue module in the module
// cache (go list -m), so the CRDs installed are those of the code that
// runs.
func kueueModuleDir() (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/kueue").Output()
	if err != nil {
		return "", fmt.Errorf("find the Kueue module (go list -m sigs.k8s.io/kueue): %w", err)
	}
	dir := strings.TrimSpace(string(out))
	if dir == "" {
		return "", fmt.Errorf("the Kueue module is not downloaded (run go mod download in test/kueue)")
	}
	return dir, nil
}
