package chart_test

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/test/controlplane"
	"github.com/hubsync/hubsync/test/fleet"
	"github.com/hubsync/hubsync/test/testutil"
)

// releaseVersion is the version the lifecycle test releases the checkout
// as; the chart it upgrades from is the checkout's chart as it stands
// (Chart.yaml's version, older).
const releaseVersion = "v0.1.1-rc.1"

// clusterProfileCRD is the CRD the chart carries.
const clusterProfileCRD = "clusterprofiles.multicluster.x-k8s.io"

// TestHelmLifecycle plays a platform engineer adopting hubsync with the
// real helm CLI, v3 and v4 in turn, on a real kube-apiserver: build the
// release (`make release`), verify its checksums and SBOMs, install the
// chart of the checkout, upgrade to the release's packaged chart (its
// image by digest), run the release's own binary with the installed
// configuration as the chart's ServiceAccount, then uninstall and find
// nothing of hubsync's left but the ClusterProfile CRD. The first
// install also proves the chart installs that CRD where it is missing.
func TestHelmLifecycle(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	dist := t.TempDir()
	ref := buildRelease(ctx, t, dist)
	chartTgz := filepath.Join(dist, "hubsync-"+strings.TrimPrefix(releaseVersion, "v")+".tgz")
	bin := filepath.Join(dist, "hubsync-"+runtime.GOOS+"-"+runtime.GOARCH)

	hub, err := fleet.NewHub(suite.Hub.Config)
	if err != nil {
		t.Fatal(err)
	}
	// Where the chart must install the CRD itself: a hub without it.
	ext := apiextensionsclient.NewForConfigOrDie(suite.Hub.Config).ApiextensionsV1().CustomResourceDefinitions()
	if err := ext.Delete(ctx, clusterProfileCRD, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	testutil.Eventually(t, time.Minute, 100*time.Millisecond, func() error {
		if _, err := ext.Get(ctx, clusterProfileCRD, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("the CRD is still there (%v)", err)
		}
		return nil
	}, "the ClusterProfile CRD gone")

	for i, major := range []string{"3", "4"} {
		t.Run("helm v"+major, func(t *testing.T) {
			h := newHelm(ctx, t, major)
			ns := "hubsync-helm" + major
			h.run(t, "lint", chartTgz)
			h.run(t, "install", "hubsync", "../../charts/hubsync", "-n", ns, "--create-namespace", "--set", "replicas=1")
			if i == 0 {
				testutil.Eventually(t, time.Minute, 100*time.Millisecond, func() error {
					_, err := ext.Get(ctx, clusterProfileCRD, metav1.GetOptions{})
					return err
				}, "the chart's ClusterProfile CRD")
			}
			h.run(t, "upgrade", "hubsync", chartTgz, "-n", ns, "--set", "replicas=1")
			objs := decode(t, map[string]string{"manifest": h.run(t, "get", "manifest", "hubsync", "-n", ns)})
			sts := find[*appsv1.StatefulSet](objs, "hubsync")
			if sts == nil || sts.Spec.Template.Spec.Containers[0].Image != ref {
				t.Fatalf("the upgraded StatefulSet runs %v; want the release's image %s", sts.Spec.Template.Spec.Containers[0].Image, ref)
			}
			runInstalled(ctx, t, hub, bin, objs, ns)
			h.run(t, "uninstall", "hubsync", "-n", ns)
			nothingLeft(ctx, t, objs)
			if _, err := ext.Get(ctx, clusterProfileCRD, metav1.GetOptions{}); err != nil {
				t.Errorf("helm uninstall removed the ClusterProfile CRD: %v", err)
			}
		})
	}
}

// buildRelease builds the release into dist as `make release` does,
// checks it as its user would (sha256sum -c, the SBOMs) and returns the
// image reference with its digest.
func buildRelease(ctx context.Context, t *testing.T, dist string) string {
	t.Helper()
	root, err := testutil.ModuleDir()
	if err != nil {
		t.Fatal(err)
	}
	commit := strings.Repeat("0", 40)
	cmd := exec.CommandContext(ctx, "go", "run", ".", "-root", root, "-out", dist,
		"-version", releaseVersion, "-commit", commit, "-date", "2026-11-29T00:00:00Z")
	cmd.Dir = filepath.Join(root, "test", "tools", "release")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make release: %v\n%s", err, out)
	}
	f, err := os.Open(filepath.Join(dist, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	n := 0
	for sc.Scan() {
		sum, name, _ := strings.Cut(sc.Text(), "  ")
		data, err := os.ReadFile(filepath.Join(dist, name))
		if err != nil {
			t.Fatal(err)
		}
		if h := sha256.Sum256(data); hex.EncodeToString(h[:]) != sum {
			t.Errorf("%s does not match SHA256SUMS", name)
		}
		if strings.HasSuffix(name, ".cdx.json") {
			var bom struct {
				BOMFormat string `json:"bomFormat"`
				Metadata  struct {
					Component struct{ Version string } `json:"component"`
				} `json:"metadata"`
				Components []json.RawMessage `json:"components"`
			}
			if err := json.Unmarshal(data, &bom); err != nil || bom.BOMFormat != "CycloneDX" ||
				bom.Metadata.Component.Version != releaseVersion || len(bom.Components) < 50 {
				t.Errorf("%s is not the release's SBOM (%v): format %q, version %q, %d components", name, err, bom.BOMFormat, bom.Metadata.Component.Version, len(bom.Components))
			}
		}
		n++
	}
	if n < 9 {
		t.Fatalf("SHA256SUMS lists %d files; want the 4 binaries, their SBOMs and the chart", n)
	}
	ref, err := os.ReadFile(filepath.Join(dist, "image.txt"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(ref))
}

// helmCLI runs one helm binary against the suite's API server, with its
// own cache, configuration and data directories.
type helmCLI struct {
	bin string
	env []string
}

func newHelm(ctx context.Context, t *testing.T, major string) *helmCLI {
	t.Helper()
	out, err := exec.CommandContext(ctx, "bash", "../tools/build-helm.sh", major).Output()
	if err != nil {
		t.Fatalf("build-helm.sh %s: %v", major, err)
	}
	dir := t.TempDir()
	kubeconfig, err := controlplane.WriteKubeconfig(dir, "admin.kubeconfig", suite.Hub.Config)
	if err != nil {
		t.Fatal(err)
	}
	h := &helmCLI{bin: strings.TrimSpace(string(out)), env: append(os.Environ(), "KUBECONFIG="+kubeconfig,
		"HELM_CACHE_HOME="+filepath.Join(dir, "cache"), "HELM_CONFIG_HOME="+filepath.Join(dir, "config"),
		"HELM_DATA_HOME="+filepath.Join(dir, "data"))}
	if v := h.run(t, "version", "--short"); !strings.HasPrefix(v, "v"+major+".") {
		t.Fatalf("helm version %q; want v%s", v, major)
	}
	return h
}

// run runs helm with args and returns its standard output, failing t with
// everything helm said when it fails.
func (h *helmCLI) run(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command(h.bin, args...)
	cmd.Env = h.env
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm %s: %v\n%s%s", strings.Join(args, " "), err, out, stderr.String())
	}
	return string(out)
}

// runInstalled runs the release's binary as the pod would: with the
// ConfigMap helm installed and the chart's ServiceAccount, until it
// leads and projects a bound namespace's clusters.
func runInstalled(ctx context.Context, t *testing.T, hub *fleet.Hub, bin string, objs []object, ns string) {
	t.Helper()
	_, text := renderedConfig(t, objs)
	text = strings.ReplaceAll(text, "/etc/hubsync/bus-tls/", writeBusTLS(t, objs)+"/")
	conf, err := config.Decode([]byte(text))
	if err != nil {
		t.Fatal(err)
	}
	consumer, set := ns+"-consumer", ns+"-set"
	if err := hub.Namespace(ctx, consumer); err != nil {
		t.Fatal(err)
	}
	if err := hub.CreateExclusiveSet(ctx, set); err != nil {
		t.Fatal(err)
	}
	cluster := ns + "-c1"
	if _, err := hub.CreateCluster(ctx, fleet.ClusterSpec{Name: cluster, Labels: fleet.ExclusiveSetLabels(set, nil), Version: "v1.35.0"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = hub.DeleteCluster(context.Background(), cluster) })
	if err := hub.Bind(ctx, consumer, set, true); err != nil {
		t.Fatal(err)
	}
	asHubsync := serviceAccountConfigIn(ctx, t, hub, ns)
	logs := &fleet.LogBuffer{}
	d, err := fleet.StartDaemon(ctx, bin, asHubsync, *conf, logs)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = d.Stop()
		if strings.Contains(strings.ToLower(logs.String()), "forbidden") || t.Failed() {
			t.Errorf("hubsync's log (a refused request, or the test failed):\n%s", logs.String())
		}
	}()
	if err := d.WaitReady(ctx, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, time.Minute, 100*time.Millisecond, func() error {
		names, err := hub.ProfileNames(ctx, consumer)
		if err != nil {
			return err
		}
		if !slices.Equal(names, []string{cluster}) {
			return fmt.Errorf("profiles in %s: %v", consumer, names)
		}
		return nil
	}, "the profile of the bound cluster")
}

// nothingLeft: every object the release installed is gone, and nothing
// else labelled as hubsync's is left in the cluster but what hubsync
// wrote for consumers (profiles and their copies) and Events.
func nothingLeft(ctx context.Context, t *testing.T, objs []object) {
	t.Helper()
	dyn := dynamic.NewForConfigOrDie(suite.Hub.Config)
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(discovery.NewDiscoveryClientForConfigOrDie(suite.Hub.Config)))
	testutil.Eventually(t, time.Minute, 200*time.Millisecond, func() error {
		var left []string
		for _, o := range objs {
			m, err := mapper.RESTMapping(o.gvk.GroupKind(), o.gvk.Version)
			if err != nil {
				return testutil.Stop(fmt.Errorf("%s: %w", o, err))
			}
			var r dynamic.ResourceInterface = dyn.Resource(m.Resource)
			if o.ns != "" {
				r = dyn.Resource(m.Resource).Namespace(o.ns)
			}
			if _, err := r.Get(ctx, o.name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				left = append(left, o.String())
			}
		}
		if len(left) > 0 {
			return fmt.Errorf("left after helm uninstall: %v", left)
		}
		return nil
	}, "every installed object gone")
	for _, gvr := range []schema.GroupVersionResource{
		{Version: "v1", Resource: "configmaps"}, {Version: "v1", Resource: "secrets"}, {Version: "v1", Resource: "services"},
		{Version: "v1", Resource: "serviceaccounts"}, {Group: "apps", Version: "v1", Resource: "statefulsets"},
		{Group: "coordination.k8s.io", Version: "v1", Resource: "leases"},
		{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "roles"},
		{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "rolebindings"},
		{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "clusterroles"},
		{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "clusterrolebindings"},
	} {
		list, err := dyn.Resource(gvr).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=hubsync"})
		if err != nil {
			t.Fatal(err)
		}
		for _, it := range list.Items {
			t.Errorf("left after helm uninstall: %s %s/%s", gvr.Resource, it.GetNamespace(), it.GetName())
		}
	}
}

// serviceAccountConfigIn returns a client configuration that
// authenticates as the ServiceAccount of the chart installed in ns, with a
// token the API server issues for it, as the pod's projected token would.
func serviceAccountConfigIn(ctx context.Context, t *testing.T, hub *fleet.Hub, ns string) *rest.Config {
	t.Helper()
	expiry := int64(600)
	tr, err := hub.Kube.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "hubsync", &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &expiry},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("a token of the chart's ServiceAccount: %v", err)
	}
	admin := suite.Hub.Config
	return &rest.Config{Host: admin.Host, BearerToken: tr.Status.Token, TLSClientConfig: rest.TLSClientConfig{CAData: admin.CAData}}
}
