package chart_test

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	helmchart "helm.sh/helm/v3/pkg/chart"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	msav1beta1 "open-cluster-management.io/managed-serviceaccount/apis/authentication/v1beta1"
	"sigs.k8s.io/yaml"

	"github.com/hubsync/hubsync/test/chart"
	"github.com/hubsync/hubsync/test/controlplane"
)

// TestMain starts the real kube-apiserver and etcd that TestInstall
// applies the chart to; the other tests need only the chart.
func TestMain(m *testing.M) {
	os.Exit(controlplane.Main(m, "chart", func(ctx context.Context, s *controlplane.Suite) error {
		suite = s
		return nil
	}))
}

// suite is the control plane controlplane.Main started.
var suite *controlplane.Suite

// loadChart loads charts/hubsync from the checkout.
func loadChart(t *testing.T) *helmchart.Chart {
	t.Helper()
	dir, err := chart.Dir()
	if err != nil {
		t.Fatal(err)
	}
	ch, err := chart.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

// parseValues parses values written as YAML in a test table.
func parseValues(t *testing.T, text string) map[string]any {
	t.Helper()
	var v map[string]any
	if err := yaml.Unmarshal([]byte(text), &v); err != nil {
		t.Fatalf("values %q: %v", text, err)
	}
	return v
}

// object is one rendered object: the template it came from, its typed
// form (nil for a kind without Go types here) and its YAML.
type object struct {
	template string
	gvk      schema.GroupVersionKind
	name     string
	ns       string
	typed    runtime.Object
	yaml     []byte
}

func (o object) String() string {
	return fmt.Sprintf("%s %s/%s (%s)", o.gvk.Kind, o.ns, o.name, o.template)
}

// untyped are the kinds the chart renders that have no Go types in any
// module hubsync requires: OCM's ClusterPermission (its rules are compared
// with deploy/gateway/managed-cluster-rbac.yaml's instead, and the API
// server checks it wherever the cluster-permission addon runs),
// cert-manager's Certificate and OpenShift's Route (their fields are
// checked as YAML in TestChartValues).
var untyped = map[schema.GroupKind]bool{
	{Group: "rbac.open-cluster-management.io", Kind: "ClusterPermission"}: true,
	{Group: "cert-manager.io", Kind: "Certificate"}:                       true,
	{Group: "route.openshift.io", Kind: "Route"}:                          true,
}

// scheme knows every other kind the chart renders: Kubernetes' own, the
// prometheus-operator's (v0.95.2) and OCM's ManagedServiceAccount.
func scheme(t *testing.T) *runtime.Scheme {
	t.Helper()
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, monitoringv1.AddToScheme, msav1beta1.AddToScheme} {
		if err := add(s); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// decode splits rendered templates into objects, each decoded strictly
// into its Go type, failing t on any error (decodeObjects).
func decode(t *testing.T, rendered map[string]string) []object {
	t.Helper()
	objs, err := decodeObjects(scheme(t), rendered)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// decodeObjects splits rendered templates into objects, each decoded
// strictly into its Go type: an unknown or duplicated field, a wrong type
// or an unknown kind is an error.
func decodeObjects(s *runtime.Scheme, rendered map[string]string) ([]object, error) {
	dec := serializer.NewCodecFactory(s, serializer.EnableStrict).UniversalDeserializer()
	var objs []object
	names := make([]string, 0, len(rendered))
	for name := range rendered {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		docs, err := chart.Documents(rendered[name])
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		for i, doc := range docs {
			var meta struct {
				APIVersion string `json:"apiVersion"`
				Kind       string `json:"kind"`
				Metadata   struct {
					Name      string `json:"name"`
					Namespace string `json:"namespace"`
				} `json:"metadata"`
			}
			if err := yaml.Unmarshal(doc, &meta); err != nil {
				return nil, fmt.Errorf("%s document %d: %w", name, i+1, err)
			}
			o := object{template: name, gvk: schema.FromAPIVersionAndKind(meta.APIVersion, meta.Kind),
				name: meta.Metadata.Name, ns: meta.Metadata.Namespace, yaml: doc}
			if !untyped[o.gvk.GroupKind()] {
				obj, _, err := dec.Decode(doc, nil, nil)
				if err != nil {
					return nil, fmt.Errorf("%s document %d (%s): %w", name, i+1, o.gvk.Kind, err)
				}
				o.typed = obj
			}
			objs = append(objs, o)
		}
	}
	return objs, nil
}

// render renders the chart with values (YAML) in namespace and decodes
// every object, failing t on any error.
func render(t *testing.T, ch *helmchart.Chart, values, namespace string) []object {
	t.Helper()
	out, err := chart.Render(ch, parseValues(t, values), namespace)
	if err != nil {
		t.Fatal(err)
	}
	return decode(t, out)
}

// find returns the object of kind named name, or nil.
func find[T runtime.Object](objs []object, name string) T {
	var zero T
	for _, o := range objs {
		if v, ok := o.typed.(T); ok && o.name == name {
			return v
		}
	}
	return zero
}

// kinds lists the objects as "Kind/name", for messages and comparisons.
func kinds(objs []object) []string {
	var out []string
	for _, o := range objs {
		out = append(out, o.gvk.Kind+"/"+o.name)
	}
	sort.Strings(out)
	return out
}

// has reports whether objs hold an object "Kind/name".
func has(objs []object, kindName string) bool {
	for _, k := range kinds(objs) {
		if k == kindName {
			return true
		}
	}
	return false
}

// contains reports whether s holds every one of subs.
func contains(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
