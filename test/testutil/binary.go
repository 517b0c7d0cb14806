package testutil

import (
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
)

// HubsyncPackage is the import path of the hubsync command.
const HubsyncPackage = "github.com/hubsync/hubsync/cmd/hubsync"

// BinaryEnv names the environment variable that, when set, gives the
// hubsync binary the tests run instead of one built from the source (for
// example the one `make build` made, or a release candidate's).
const BinaryEnv = "HUBSYNC_BINARY"

// builds holds the binaries built by this process: one per package, in
// one temporary directory.
var builds struct {
	mu    sync.Mutex
	dir   string
	names map[string]bool
	byPkg map[string]*build
}

// build is one package's binary, built at most once.
type build struct {
	once sync.Once
	path string
	err  error
}

// Hubsync returns the hubsync binary to test: $HUBSYNC_BINARY when set,
// else the one built from this checkout once per process. It fails t when
// there is none.
func Hubsync(t testing.TB) string {
	t.Helper()
	bin, err := HubsyncPath()
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// HubsyncPath is Hubsync for callers without a testing.TB (a TestMain,
// the benchmarks, the demo).
func HubsyncPath() (string, error) {
	if bin := os.Getenv(BinaryEnv); bin != "" {
		abs, err := filepath.Abs(bin)
		if err != nil {
			return "", fmt.Errorf("%s: %w", BinaryEnv, err)
		}
		if fi, err := os.Stat(abs); err != nil || fi.IsDir() || fi.Mode().Perm()&0o111 == 0 {
			return "", fmt.Errorf("%s=%s is not an executable file (%v)", BinaryEnv, bin, err)
		}
		return abs, nil
	}
	return BuildBinary(HubsyncPackage)
}

// Binary returns the binary of the main package pkg, built once per
// process, failing t when it does not build.
func Binary(t testing.TB, pkg string) string {
	t.Helper()
	bin, err := BuildBinary(pkg)
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// BuildBinary builds the main package pkg (an import path) with `go
// build`, in the hubsync module, so that the hubsync module's go.mod pins
// its dependencies even when the caller is another module (test/argocd).
// It builds each package at most once per process, into one temporary
// directory that RemoveBinaries removes, and returns the binary's path.
func BuildBinary(pkg string) (string, error) {
	builds.mu.Lock()
	if builds.byPkg == nil {
		builds.byPkg, builds.names = map[string]*build{}, map[string]bool{}
	}
	b := builds.byPkg[pkg]
	if b == nil {
		b = &build{}
		builds.byPkg[pkg] = b
	}
	builds.mu.Unlock()
	b.once.Do(func() { b.path, b.err = buildOnce(pkg) })
	return b.path, b.err
}

// majorSuffix is a module's major version element at the end of an
// import path ("/v2").
var majorSuffix = regexp.MustCompile(`/v[0-9]+$`)

func buildOnce(pkg string) (string, error) {
	root, err := ModuleDir()
	if err != nil {
		return "", err
	}
	builds.mu.Lock()
	if builds.dir == "" {
		if builds.dir, err = os.MkdirTemp("", "hubsync-test-bin-"); err != nil {
			builds.mu.Unlock()
			return "", err
		}
	}
	name := path.Base(majorSuffix.ReplaceAllString(pkg, ""))
	for i := 2; builds.names[name]; i++ {
		name = fmt.Sprintf("%s-%d", path.Base(majorSuffix.ReplaceAllString(pkg, "")), i)
	}
	builds.names[name] = true
	bin := filepath.Join(builds.dir, name)
	builds.mu.Unlock()
	cmd := exec.Command("go", "build", "-o", bin, pkg)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s: %w\n%s", pkg, err, out)
	}
	return bin, nil
}

// ModuleDir returns the directory of the hubsync checkout (the hubsync
// module's), from the main module or from the replace directive of a
// module that requires it (test/argocd), for files the tests read from
// the tree (deploy/, test/tools/).
func ModuleDir() (string, error) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/hubsync/hubsync").Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		return "", fmt.Errorf("find the hubsync module (go list -m): %w\n%s", err, stderr)
	}
	dir := strings.TrimSpace(string(out))
	if dir == "" {
		return "", fmt.Errorf("the hubsync module has no directory here: run from inside the hubsync checkout")
	}
	return dir, nil
}

// RemoveBinaries removes every binary BuildBinary built. A test package
// calls it once its tests are over, through Main or
// controlplane.Main; a binary path handed out before is gone after it.
func RemoveBinaries() {
	builds.mu.Lock()
	defer builds.mu.Unlock()
	if builds.dir != "" {
		_ = os.RemoveAll(builds.dir)
	}
	builds.dir, builds.names, builds.byPkg = "", nil, nil
}

// Main runs a test package's tests and then removes what testutil made
// for the whole process (the built binaries). A package whose TestMain
// does nothing else uses it as
//
//	func TestMain(m *testing.M) { os.Exit(testutil.Main(m)) }
func Main(m *testing.M) int {
	defer RemoveBinaries()
	return m.Run()
}

// InstallPlugin is what every recipe of docs/consumers.md does in a
// consumer's pod, into dir instead of the pod's /plugins: it runs
// `hubsync install dir` with the binary to test, and returns the plugin's
// path in dir, for the consumer's own code to run.
func InstallPlugin(dir string) (string, error) {
	bin, err := HubsyncPath()
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	if out, err := exec.Command(bin, "install", dir).CombinedOutput(); err != nil {
		return "", fmt.Errorf("hubsync install %s: %w: %s", dir, err, out)
	}
	return filepath.Join(dir, "hubsync"), nil
}

// Plugin is InstallPlugin into a directory of t's, failing t on an error.
func Plugin(t testing.TB) string {
	t.Helper()
	p, err := InstallPlugin(filepath.Join(t.TempDir(), "plugins"))
	if err != nil {
		t.Fatal(err)
	}
	return p
}
