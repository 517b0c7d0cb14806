package chart_test

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"

	"github.com/hubsync/hubsync/test/chart"
	"github.com/hubsync/hubsync/test/testutil"
)

// deployDir is deploy/ in the checkout.
func deployDir(t *testing.T) string {
	t.Helper()
	root, err := testutil.ModuleDir()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, "deploy")
}

// TestDeployGenerated checks that deploy/ is what `make manifests` writes
// from the chart now, byte for byte, without Helm's labels.
func TestDeployGenerated(t *testing.T) {
	files, err := chart.Manifests(loadChart(t))
	if err != nil {
		t.Fatal(err)
	}
	dir := deployDir(t)
	for _, name := range chart.ManifestPaths() {
		got, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Errorf("deploy/%s: %v: run make manifests", name, err)
			continue
		}
		if want := files[name]; !bytes.Equal(got, want) {
			t.Errorf("deploy/%s differs from the chart: run make manifests\n%s", name, firstDifference(string(got), string(want)))
		}
		if !bytes.HasPrefix(got, []byte(chart.Header)) {
			t.Errorf("deploy/%s does not start with the generated header", name)
		}
		for _, helm := range []string{"helm.sh/chart", "app.kubernetes.io/managed-by: Helm", "app.kubernetes.io/instance"} {
			if bytes.Contains(got, []byte(helm)) {
				t.Errorf("deploy/%s carries Helm's label %s", name, helm)
			}
		}
	}
}

// firstDifference shows the first line where two texts differ.
func firstDifference(got, want string) string {
	g, w := strings.Split(got, "\n"), strings.Split(want, "\n")
	for i := 0; i < max(len(g), len(w)); i++ {
		var gl, wl string
		if i < len(g) {
			gl = g[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if gl != wl {
			return "line " + strconv.Itoa(i+1) + ":\n  deploy/: " + gl + "\n  chart:   " + wl
		}
	}
	return ""
}

// TestClusterPermissionRules checks that the ClusterPermission the chart
// distributes grants what deploy/gateway/managed-cluster-rbac.yaml, which
// is applied on managed clusters by hand and not generated, grants: the
// same rules to the same ServiceAccount.
func TestClusterPermissionRules(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(deployDir(t), "gateway", "managed-cluster-rbac.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	objs := decode(t, map[string]string{"managed-cluster-rbac.yaml": string(data)})
	role := find[*rbacv1.ClusterRole](objs, "hubsync-gateway-impersonator")
	binding := find[*rbacv1.ClusterRoleBinding](objs, "hubsync-gateway-impersonator")
	if role == nil || binding == nil || len(binding.Subjects) != 1 {
		t.Fatalf("managed-cluster-rbac.yaml: want the ClusterRole and ClusterRoleBinding hubsync-gateway-impersonator, got %v", kinds(objs))
	}

	rendered := render(t, loadChart(t), `
clusterPermission: {clusters: [cluster-a]}
config:
  gateway: {enabled: true}
  tunnel: {enabled: true, managedServiceAccount: hubsync-gateway}
`, chart.Namespace)
	var cp struct {
		Spec struct {
			ClusterRole struct {
				Rules []rbacv1.PolicyRule `json:"rules"`
			} `json:"clusterRole"`
			ClusterRoleBinding struct {
				Subject rbacv1.Subject `json:"subject"`
			} `json:"clusterRoleBinding"`
		} `json:"spec"`
	}
	found := false
	for _, o := range rendered {
		if o.gvk.Kind == "ClusterPermission" {
			found = true
			if err := yaml.Unmarshal(o.yaml, &cp); err != nil {
				t.Fatal(err)
			}
		}
	}
	if !found {
		t.Fatal("no ClusterPermission rendered")
	}
	if !reflect.DeepEqual(cp.Spec.ClusterRole.Rules, role.Rules) {
		t.Errorf("ClusterPermission rules %+v; managed-cluster-rbac.yaml grants %+v", cp.Spec.ClusterRole.Rules, role.Rules)
	}
	want := binding.Subjects[0]
	if got := cp.Spec.ClusterRoleBinding.Subject; got.Kind != want.Kind || got.Name != want.Name || got.Namespace != want.Namespace {
		t.Errorf("ClusterPermission subject %+v; managed-cluster-rbac.yaml binds %+v", got, want)
	}
}
