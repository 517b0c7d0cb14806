// Package chart renders hubsync's Helm chart (charts/hubsync) with Helm's
// own Go library, as `helm template` does, and generates deploy/ from it:
// the kustomize manifests are the chart rendered with its default values,
// so there is one source for both. Its tests lint the chart, render it
// with a table of values, decode every object strictly into its Go type,
// apply it to a real kube-apiserver and run hubsync as it configures it.
// It is a module of its own because Helm needs newer Kubernetes libraries
// than hubsync pins.
package chart

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/hubsync/hubsync/test/testutil"
)

// What deploy/ is rendered as: the release name and namespace it has
// always used.
const (
	Release   = "hubsync"
	Namespace = "open-cluster-management-hub"
)

// KubeVersion is the Kubernetes version the chart is rendered and linted
// for: the chart needs 1.30 (ValidatingAdmissionPolicy v1), and Helm's
// default capabilities claim 1.20.
var KubeVersion = chartutil.KubeVersion{Version: "v1.35.0", Major: "1", Minor: "35"}

// Dir returns charts/hubsync in the hubsync checkout.
func Dir() (string, error) {
	root, err := testutil.ModuleDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(root, "charts", "hubsync"), nil
}

// Load loads the chart from dir.
func Load(dir string) (*chart.Chart, error) {
	ch, err := loader.Load(dir)
	if err != nil {
		return nil, fmt.Errorf("load chart %s: %w", dir, err)
	}
	return ch, nil
}

// LoadCheckout loads charts/hubsync from the hubsync checkout.
func LoadCheckout() (*chart.Chart, error) {
	dir, err := Dir()
	if err != nil {
		return nil, err
	}
	return Load(dir)
}

// Render renders ch as `helm template --namespace namespace` does:
// values merged over the chart's values.yaml and checked against its
// values.schema.json, then every template executed. It returns each
// template's output by its path in the chart (templates/rbac.yaml),
// leaving out templates that render nothing.
func Render(ch *chart.Chart, values map[string]any, namespace string) (map[string]string, error) {
	caps := chartutil.DefaultCapabilities.Copy()
	caps.KubeVersion = KubeVersion
	opts := chartutil.ReleaseOptions{Name: Release, Namespace: namespace, Revision: 1, IsInstall: true}
	vals, err := chartutil.ToRenderValues(ch, values, opts, caps)
	if err != nil {
		return nil, fmt.Errorf("render %s: %w", ch.Name(), err)
	}
	// Strict: a template reading a value that does not exist is an error,
	// not an empty string.
	out, err := engine.Engine{Strict: true}.Render(ch, vals)
	if err != nil {
		return nil, fmt.Errorf("render %s: %w", ch.Name(), err)
	}
	rendered := map[string]string{}
	for name, text := range out {
		name = strings.TrimPrefix(name, ch.Name()+"/")
		if path.Ext(name) != ".yaml" || strings.TrimSpace(text) == "" {
			continue
		}
		rendered[name] = text
	}
	return rendered, nil
}

// Documents splits a rendered template (or a manifest file) into its YAML
// documents, dropping those that hold only comments.
func Documents(text string) ([][]byte, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(strings.NewReader(text)))
	var docs [][]byte
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("split documents: %w", err)
		}
		js, err := yaml.YAMLToJSON(doc)
		if err != nil {
			return nil, fmt.Errorf("parse document: %w", err)
		}
		if s := strings.TrimSpace(string(js)); s == "null" || s == "" {
			continue
		}
		docs = append(docs, doc)
	}
}

// Header is the first line of every file Manifests generates.
const Header = "# Generated from charts/hubsync by `make manifests`: edit the chart, not this file.\n"

// deployFile is one file of deploy/ and where it comes from: the
// templates' outputs, in order, of one rendering of the chart.
type deployFile struct {
	path      string
	values    string
	templates []string
}

// renderings are the values deploy/ is rendered with, by name: the
// defaults (but the bus's TLS Secret, which the chart makes at random and
// kubectl users provide), the gateway on (with the ClusterPermission for a placeholder
// cluster), and credentials off. Helm's own labels are left out: deploy/
// is applied with kubectl, not by Helm.
var renderings = map[string]string{
	"default": "chartLabels: false\nbus: {tls: {generate: false}}",
	"gateway": `
chartLabels: false
clusterPermission: {clusters: [CLUSTER]}
config:
  gateway: {enabled: true}
  tunnel: {enabled: true, managedServiceAccount: hubsync-gateway}
`,
	"without-credentials": `
chartLabels: false
config: {credentials: {enabled: false}}
`,
}

// deployFiles are the files of deploy/ that are generated. deploy/ also
// holds kustomization.yaml and gateway/managed-cluster-rbac.yaml (applied
// on managed clusters; the chart distributes the same rules with
// ClusterPermissions), which are not.
var deployFiles = []deployFile{
	{"serviceaccount.yaml", "default", []string{"templates/serviceaccount.yaml"}},
	{"rbac.yaml", "default", []string{"templates/rbac.yaml"}},
	{"config.yaml", "default", []string{"templates/configmap.yaml"}},
	{"statefulset.yaml", "default", []string{"templates/statefulset.yaml"}},
	{"bus.yaml", "default", []string{"templates/bus/service.yaml"}},
	{"pdb.yaml", "default", []string{"templates/pdb.yaml"}},
	{"admission-policy.yaml", "default", []string{"templates/admission-policy.yaml"}},
	{"networkpolicy.yaml", "default", []string{"templates/networkpolicy.yaml"}},
	{"gateway/hub-rbac.yaml", "gateway", []string{"templates/gateway/hub-rbac.yaml", "templates/gateway/service.yaml"}},
	{"gateway/flowcontrol.yaml", "gateway", []string{"templates/gateway/flowcontrol.yaml"}},
	{"gateway/clusterpermission.yaml", "gateway", []string{"templates/gateway/clusterpermission.yaml"}},
	{"without-credentials/ca-secret-role.yaml", "without-credentials", []string{"templates/without-credentials/ca-secret-role.yaml"}},
}

// Manifests renders ch into the generated files of deploy/, by their
// paths relative to deploy/.
func Manifests(ch *chart.Chart) (map[string][]byte, error) {
	rendered := map[string]map[string]string{}
	for name, text := range renderings {
		var values map[string]any
		if err := yaml.Unmarshal([]byte(text), &values); err != nil {
			return nil, fmt.Errorf("values %s: %w", name, err)
		}
		out, err := Render(ch, values, Namespace)
		if err != nil {
			return nil, fmt.Errorf("values %s: %w", name, err)
		}
		rendered[name] = out
	}
	files := map[string][]byte{}
	for _, f := range deployFiles {
		var b bytes.Buffer
		b.WriteString(Header)
		for i, tpl := range f.templates {
			text, ok := rendered[f.values][tpl]
			if !ok {
				return nil, fmt.Errorf("deploy/%s: %s renders nothing with the %s values", f.path, tpl, f.values)
			}
			text = strings.TrimPrefix(strings.TrimLeft(text, "\n"), "---\n")
			if i > 0 {
				b.WriteString("---\n")
			}
			b.WriteString(strings.TrimRight(text, "\n") + "\n")
		}
		files[f.path] = b.Bytes()
	}
	return files, nil
}

// ManifestPaths are the paths, relative to deploy/, that Manifests writes.
func ManifestPaths() []string {
	var paths []string
	for _, f := range deployFiles {
		paths = append(paths, f.path)
	}
	slices.Sort(paths)
	return paths
}
