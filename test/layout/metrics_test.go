package layout

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// metricPrefix names, for a package whose metrics all share one prefix,
// that prefix: a dashboard or an alert finds everything the package
// reports with one selector.
var metricPrefix = map[string]string{
	"bus":           "hubsync_bus_",
	"tunnel":        "hubsync_tunnel_",
	"gateway":       "hubsync_gateway_",
	"stream":        "hubsync_sink_",
	"sinks/webhook": "hubsync_webhook_",
	"sinks/argocd":  "hubsync_argocd_",
	"sinks/kueue":   "hubsync_kueue_",
}

// metricDef is one metric name written in product code.
type metricDef struct {
	name, pkg, pos string
	constLabels    bool
}

// metricDefs finds every metric name in the module's product code: the Name
// of a prometheus.*Opts literal and the first argument of prometheus.NewDesc.
func metricDefs(t *testing.T) []metricDef {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	var defs []metricDef
	fset := token.NewFileSet()
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if rel == "test" || rel == "docs" || strings.HasPrefix(d.Name(), ".") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		pkg := filepath.ToSlash(filepath.Dir(rel))
		ast.Inspect(f, func(n ast.Node) bool {
			if def, ok := metricDefIn(n); ok {
				def.pkg, def.pos = pkg, fset.Position(n.Pos()).String()
				defs = append(defs, def)
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(defs) < 20 {
		t.Fatalf("found only %d metric names: the scan is broken", len(defs))
	}
	return defs
}

func metricDefIn(n ast.Node) (metricDef, bool) {
	switch n := n.(type) {
	case *ast.CompositeLit:
		sel, ok := n.Type.(*ast.SelectorExpr)
		if !ok || !isPrometheus(sel) || !strings.HasSuffix(sel.Sel.Name, "Opts") {
			return metricDef{}, false
		}
		var def metricDef
		for _, e := range n.Elts {
			kv, ok := e.(*ast.KeyValueExpr)
			if !ok {
				continue
			}
			switch key, _ := kv.Key.(*ast.Ident); {
			case key == nil:
			case key.Name == "Name":
				def.name = stringLit(kv.Value)
			case key.Name == "ConstLabels":
				def.constLabels = true
			}
		}
		return def, def.name != ""
	case *ast.CallExpr:
		sel, ok := n.Fun.(*ast.SelectorExpr)
		if !ok || !isPrometheus(sel) || sel.Sel.Name != "NewDesc" || len(n.Args) == 0 {
			return metricDef{}, false
		}
		name := stringLit(n.Args[0])
		return metricDef{name: name}, name != ""
	}
	return metricDef{}, false
}

func isPrometheus(sel *ast.SelectorExpr) bool {
	x, ok := sel.X.(*ast.Ident)
	return ok && x.Name == "prometheus"
}

func stringLit(e ast.Expr) string {
	lit, ok := e.(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return ""
	}
	s, err := strconv.Unquote(lit.Value)
	if err != nil {
		return ""
	}
	return s
}

// TestMetricNames fails when a metric breaks the naming rules operators
// rely on: hubsync_ first; a package's own prefix (metricPrefix); a time in
// seconds is either a span (_duration_seconds) or a point in time
// (_timestamp_seconds); one family is defined in one place, as one Vec with
// its labels, never as collectors with ConstLabels registered side by side.
func TestMetricNames(t *testing.T) {
	seen := map[string]string{}
	for _, d := range metricDefs(t) {
		if !strings.HasPrefix(d.name, "hubsync_") {
			t.Errorf("%s: metric %s: want the prefix hubsync_", d.pos, d.name)
		}
		if p, ok := metricPrefix[d.pkg]; ok && !strings.HasPrefix(d.name, p) {
			t.Errorf("%s: metric %s of package %s: want the package's prefix %s", d.pos, d.name, d.pkg, p)
		}
		if strings.HasSuffix(d.name, "_seconds") && !strings.HasSuffix(d.name, "_duration_seconds") && !strings.HasSuffix(d.name, "_timestamp_seconds") {
			t.Errorf("%s: metric %s: a time in seconds ends in _duration_seconds (a span) or _timestamp_seconds (a point in time)", d.pos, d.name)
		}
		if d.constLabels {
			t.Errorf("%s: metric %s uses ConstLabels: make it one Vec labelled by what varies, registered once", d.pos, d.name)
		}
		if first, ok := seen[d.name]; ok {
			t.Errorf("%s: metric %s is also defined at %s: define a family once", d.pos, d.name, first)
		}
		seen[d.name] = d.pos
	}
}
