// Package layout checks the shape of the module: which hubsync packages each
// package may import (docs/architecture.md draws the same table).
package layout

import (
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/hubsync/hubsync/"

// allowed lists, for each product package, the hubsync packages it may
// import directly. A package missing from the table fails the test, so a new
// package states its place before it lands. Arrows point down only: nothing
// below imports what is above it.
var allowed = map[string][]string{
	"hub":               {},
	"stream":            {},
	"stream/streamtest": {"hub", "stream"},
	"events":            {"stream", "hub"},
	"config":            {"stream", "hub"},
	"hubcache":          {"hub"},
	"syncer":            {"config", "stream", "hub", "hubcache"},
	"bus":               {"config", "stream", "events", "hub"},
	"bus/bustest":       {},
	"sinks":             {"config", "stream", "hub", "hubcache"},
	"sinks/kubeconfig":  {"config", "stream", "hub", "sinks"},
	"sinks/argocd":      {"config", "stream", "hub", "hubcache", "sinks"},
	"sinks/kueue":       {"config", "stream", "hub", "sinks"},
	"sinks/webhook":     {"config", "stream", "hub", "events", "sinks"},
	"tunnel":            {"config", "stream", "hub", "hubcache"},
	"gateway":           {"config", "tunnel", "hub", "hubcache"},
	// access is imported by consumers, not by hubsync: it may know only
	// the naming contract; access/rotations adds the event contract.
	"access":           {"hub"},
	"access/rotations": {"access", "events", "stream"},
	// status reads a daemon over HTTP, knowing it only by its metric
	// names and readiness lines.
	"status": {},
	"daemon": {"config", "stream", "hub", "hubcache", "events", "syncer", "bus", "sinks", "sinks/kubeconfig",
		"sinks/argocd", "sinks/webhook", "sinks/kueue", "tunnel", "gateway"},
	"cmd/hubsync": {"config", "stream", "hub", "hubcache", "events", "syncer", "bus", "sinks", "sinks/kubeconfig",
		"sinks/argocd", "sinks/webhook", "sinks/kueue", "tunnel", "gateway", "daemon", "status"},
}

// forbiddenDeps lists, for a package, module path prefixes that must not
// appear anywhere in its dependency graph: the event contract and the sinks
// that encode events carry no NATS, and nothing but the bus (and what wires
// it) links the NATS server.
var forbiddenDeps = map[string][]string{
	"hub":           {"github.com/nats-io/", "google.golang.org/grpc"},
	"events":        {"github.com/nats-io/", "k8s.io/client-go/", "google.golang.org/grpc"},
	"stream":        {"github.com/nats-io/"},
	"config":        {"github.com/nats-io/", "k8s.io/client-go/"},
	"hubcache":      {"github.com/nats-io/", "google.golang.org/grpc"},
	"syncer":        {"github.com/nats-io/"},
	"sinks":         {"github.com/nats-io/"},
	"sinks/webhook": {"github.com/nats-io/"},
	"sinks/argocd":  {"github.com/nats-io/"},
	"sinks/kueue":   {"github.com/nats-io/"},
	"tunnel":        {"github.com/nats-io/"},
	"gateway":       {"github.com/nats-io/"},
	// A consumer of access links neither NATS nor (with
	// access/rotations) the NATS server.
	"access":           {"github.com/nats-io/", "google.golang.org/grpc"},
	"access/rotations": {"github.com/nats-io/nats-server/", "google.golang.org/grpc"},
	"status":           {"github.com/nats-io/", "k8s.io/", "google.golang.org/grpc"},
}

type pkg struct {
	ImportPath string
	Imports    []string
	Deps       []string
}

func listPackages(t *testing.T) []pkg {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps=false", "-json=ImportPath,Imports,Deps", module+"...").Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("go list: %v\n%s", err, ee.Stderr)
		}
		t.Fatalf("go list: %v", err)
	}
	var pkgs []pkg
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p pkg
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("decode go list: %v", err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) == 0 {
		t.Fatal("go list found no packages")
	}
	return pkgs
}

// TestImportRules fails when a package imports a hubsync package its row in
// the table does not allow, when anything imports cmd, or when a forbidden
// module appears in a package's dependencies.
func TestImportRules(t *testing.T) {
	seen := map[string]bool{}
	for _, p := range listPackages(t) {
		rel := strings.TrimPrefix(p.ImportPath, module)
		for _, imp := range p.Imports {
			if !strings.HasPrefix(imp, module) {
				continue
			}
			dep := strings.TrimPrefix(imp, module)
			if strings.HasPrefix(dep, "cmd/") {
				t.Errorf("%s imports %s: nothing imports cmd", rel, dep)
			}
		}
		if strings.HasPrefix(rel, "test/") {
			continue // test support and suites may import any product package
		}
		seen[rel] = true
		allow, ok := allowed[rel]
		if !ok {
			t.Errorf("package %s has no row in the import table: add it (and to docs/architecture.md)", rel)
			continue
		}
		for _, imp := range p.Imports {
			if dep, ok := strings.CutPrefix(imp, module); ok && !slices.Contains(allow, dep) {
				t.Errorf("%s imports %s; it may import only %v", rel, dep, allow)
			}
		}
		for _, prefix := range forbiddenDeps[rel] {
			for _, d := range p.Deps {
				if strings.HasPrefix(d, prefix) {
					t.Errorf("%s depends on %s (through its imports); it must not depend on %s*", rel, d, prefix)
					break
				}
			}
		}
	}
	for rel := range allowed {
		if !seen[rel] {
			t.Errorf("the import table names %s, which no longer exists", rel)
		}
	}
}
