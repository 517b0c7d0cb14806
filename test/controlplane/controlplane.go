// Package controlplane starts a real etcd and kube-apiserver, built from
// pinned Go modules by test/tools/build-kube-binaries.sh, with the CRDs hubsync
// works with installed straight from the pinned API modules, and boots the
// end-to-end suites on it: Main is every suite's TestMain.
package controlplane

import (
	"bytes"
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	clusterclient "open-cluster-management.io/api/client/cluster/clientset/versioned"
	// The ManagedServiceAccount CRD is installed from this module, so the
	// module must stay in go.mod even before hubsync uses its types.
	clusterv1 "open-cluster-management.io/api/cluster/v1"
	_ "open-cluster-management.io/managed-serviceaccount/apis/authentication/v1beta1"
	cpv1alpha1 "sigs.k8s.io/cluster-inventory-api/apis/v1alpha1"
	cpclient "sigs.k8s.io/cluster-inventory-api/client/clientset/versioned"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/hubsync/hubsync/test/testutil"
)

// crdFiles are the CRD manifests installed, relative to each module's
// directory in the module cache; go.mod pins the module versions.
var crdFiles = map[string][]string{
	"sigs.k8s.io/cluster-inventory-api": {
		"config/crd/bases/multicluster.x-k8s.io_clusterprofiles.yaml",
	},
	"open-cluster-management.io/api": {
		"cluster/v1/0000_00_clusters.open-cluster-management.io_managedclusters.crd.yaml",
		"cluster/v1beta2/0000_00_clusters.open-cluster-management.io_managedclustersets.crd.yaml",
		"cluster/v1beta2/0000_01_clusters.open-cluster-management.io_managedclustersetbindings.crd.yaml",
	},
	"open-cluster-management.io/managed-serviceaccount": {
		"config/crd/bases/authentication.open-cluster-management.io_managedserviceaccounts.yaml",
	},
}

// ControlPlane is a running etcd + kube-apiserver.
type ControlPlane struct {
	// Config is an admin rest.Config for the API server.
	Config   *rest.Config
	env      *envtest.Environment
	auditDir string
}

// watchAuditPolicy audits every watch (at its start and its end) and
// nothing else: what a test needs to count a client's watches, at no cost
// to the other requests.
const watchAuditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  verbs: [watch]
- level: None
`

// Start builds (or reuses the cached) binaries, starts etcd and
// kube-apiserver on free loopback ports, installs the CRDs and waits until
// custom resources can be listed and created.
func Start(ctx context.Context) (*ControlPlane, error) {
	assets, err := AssetsDir()
	if err != nil {
		return nil, err
	}
	paths, err := CRDPaths()
	if err != nil {
		return nil, err
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDInstallOptions: envtest.CRDInstallOptions{
			Paths:              paths,
			ErrorIfPathMissing: true,
		},
		ErrorIfCRDPathMissing: true,
	}
	// Tests and benchmarks throw the data away; skipping fsync keeps etcd
	// from being the bottleneck on a small machine. The raw-write floor that
	// benchmarks compare against is measured on this same server.
	env.ControlPlane.Etcd = &envtest.Etcd{}
	env.ControlPlane.Etcd.Configure().Set("unsafe-no-fsync", "true")
	api := env.ControlPlane.GetAPIServer().Configure()
	api.Set("max-requests-inflight", "1000")
	api.Set("max-mutating-requests-inflight", "1000")
	auditDir, err := os.MkdirTemp("", "hub-audit-")
	if err != nil {
		return nil, err
	}
	policy := filepath.Join(auditDir, "policy.yaml")
	if err := os.WriteFile(policy, []byte(watchAuditPolicy), 0o600); err != nil {
		return nil, err
	}
	api.Set("audit-policy-file", policy)
	api.Set("audit-log-path", filepath.Join(auditDir, "audit.log"))
	api.Set("audit-log-format", "json")
	api.Set("audit-log-mode", "blocking")
	cfg, err := env.Start()
	if err != nil {
		_ = os.RemoveAll(auditDir)
		return nil, fmt.Errorf("start control plane: %w", err)
	}
	cp := &ControlPlane{Config: cfg, env: env, auditDir: auditDir}
	if err := cp.waitForCRDs(ctx); err != nil {
		_ = cp.Stop()
		return nil, err
	}
	return cp, nil
}

// waitForCRDs waits out the API server's short delay after a CRD install,
// during which lists may be throttled and creates held back, by polling a
// list and a server-side dry-run create of each kind.
func (c *ControlPlane) waitForCRDs(ctx context.Context) error {
	cc := clusterclient.NewForConfigOrDie(c.Config)
	pc := cpclient.NewForConfigOrDie(c.Config)
	err := testutil.Poll(ctx, 60*time.Second, 100*time.Millisecond, func() error {
		if _, err := cc.ClusterV1().ManagedClusters().List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
			return err
		}
		if _, err := cc.ClusterV1beta2().ManagedClusterSets().List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
			return err
		}
		if _, err := cc.ClusterV1beta2().ManagedClusterSetBindings("").List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
			return err
		}
		if _, err := pc.ApisV1alpha1().ClusterProfiles("").List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
			return err
		}
		// Creates are held back for a moment after a CRD install; a
		// dry-run create returns once they are not.
		probe := &cpv1alpha1.ClusterProfile{
			ObjectMeta: metav1.ObjectMeta{Name: "probe", Namespace: "default"},
			Spec:       cpv1alpha1.ClusterProfileSpec{ClusterManager: cpv1alpha1.ClusterManager{Name: "probe"}},
		}
		if _, err := pc.ApisV1alpha1().ClusterProfiles("default").Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
			return err
		}
		mc := &clusterv1.ManagedCluster{ObjectMeta: metav1.ObjectMeta{Name: "probe"}}
		if _, err := cc.ClusterV1().ManagedClusters().Create(ctx, mc, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
			return err
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("wait for the CRDs to serve: %w", err)
	}
	return nil
}

// Stop stops the API server and etcd and removes their data.
func (c *ControlPlane) Stop() error {
	defer os.RemoveAll(c.auditDir)
	if err := c.env.Stop(); err != nil {
		return fmt.Errorf("stop control plane: %w", err)
	}
	return nil
}

// Watch is one watch a client opened on the API server.
type Watch struct {
	// Resource is the request's path with its selectors, no other
	// parameter: "/api/v1/secrets?labelSelector=…".
	Resource string
	// Open is whether the watch still runs (its end is not audited yet).
	Open bool
}

// Watches lists the watches opened by clients whose user agent starts
// with userAgent, from the API server's audit log.
func (c *ControlPlane) Watches(userAgent string) ([]Watch, error) {
	events, err := readAudit(filepath.Join(c.auditDir, "audit.log"), func(e AuditEvent) bool {
		return e.Verb == "watch" && strings.HasPrefix(e.UserAgent, userAgent)
	}, userAgent)
	if err != nil {
		return nil, err
	}
	var out []Watch
	index := map[string]int{} // auditID -> index in out
	for _, e := range events {
		i, seen := index[e.AuditID]
		if !seen {
			res, err := watchedResource(e.RequestURI)
			if err != nil {
				return nil, err
			}
			i = len(out)
			index[e.AuditID] = i
			out = append(out, Watch{Resource: res, Open: true})
		}
		if e.Stage == "ResponseComplete" || e.Stage == "Panic" {
			out[i].Open = false
		}
	}
	return out, nil
}

// watchedResource is a watch's path with its selectors, no other
// parameter.
func watchedResource(uri string) (string, error) {
	u, err := url.Parse(uri)
	if err != nil {
		return "", fmt.Errorf("audit log URI %q: %w", uri, err)
	}
	q := url.Values{}
	for _, k := range []string{"labelSelector", "fieldSelector"} {
		if v := u.Query().Get(k); v != "" {
			q.Set(k, v)
		}
	}
	if len(q) == 0 {
		return u.Path, nil
	}
	return u.Path + "?" + q.Encode(), nil
}

// AssetsDir returns the directory holding kube-apiserver and etcd:
// $KUBEBUILDER_ASSETS when set, else the output of the repository's cached
// builder (a no-op when the binaries for the pinned versions exist).
func AssetsDir() (string, error) {
	return ToolDir("KUBEBUILDER_ASSETS", "build-kube-binaries.sh")
}

// ToolDir returns $env when it is set, else the directory printed by the
// cached builder test/tools/<script>, which builds the binaries from
// pinned modules on first use.
func ToolDir(env, script string) (string, error) {
	if dir := os.Getenv(env); dir != "" {
		return dir, nil
	}
	root, err := testutil.ModuleDir()
	if err != nil {
		return "", fmt.Errorf("%w; or set KUBEBUILDER_ASSETS and KONNECTIVITY_ASSETS", err)
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.Command("bash", filepath.Join(root, "test", "tools", script))
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%s: %w\n%s", script, err, stderr.String())
	}
	return strings.TrimSpace(stdout.String()), nil
}

// CRDPaths resolves the CRD manifests in the module cache.
func CRDPaths() ([]string, error) {
	var paths []string
	for mod, files := range crdFiles {
		dir, err := goList("-m", "-f", "{{.Dir}}", mod)
		if err != nil {
			return nil, err
		}
		if dir == "" {
			return nil, fmt.Errorf("module %s is not downloaded (run go mod download)", mod)
		}
		for _, f := range files {
			paths = append(paths, filepath.Join(dir, f))
		}
	}
	return paths, nil
}

func goList(args ...string) (string, error) {
	out, err := exec.Command("go", append([]string{"list"}, args...)...).Output()
	if err != nil {
		var ee *exec.ExitError
		if ok := asExit(err, &ee); ok {
			return "", fmt.Errorf("go list %s: %w: %s", strings.Join(args, " "), err, ee.Stderr)
		}
		return "", fmt.Errorf("go list %s: %w", strings.Join(args, " "), err)
	}
	return strings.TrimSpace(string(out)), nil
}

func asExit(err error, target **exec.ExitError) bool {
	e, ok := err.(*exec.ExitError)
	if ok {
		*target = e
	}
	return ok
}

// IgnoreNotFound returns nil for a NotFound error.
func IgnoreNotFound(err error) error {
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// ServiceAccountSigner returns the PEM file of the key the API server
// signs ServiceAccount tokens with, and the issuer it names in them, so
// that a test can make a token the hub signed but refuses (an expired
// one).
func (c *ControlPlane) ServiceAccountSigner() (keyFile, issuer string) {
	api := c.env.ControlPlane.GetAPIServer()
	return filepath.Join(api.CertDir, "sa-signer.key"), api.SecureServing.URL("https", "/").String()
}
