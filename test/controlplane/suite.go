package controlplane

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hubsync/hubsync/test/testutil"
)

// Suite is what an end-to-end test package shares for its whole run: the
// hub control plane that Main starts, and whatever the package's setup
// adds to it.
type Suite struct {
	// Name prefixes the suite's messages ("e2e", "gateway e2e").
	Name string
	// Hub is the hub's etcd and kube-apiserver.
	Hub *ControlPlane
	// Dir is a directory for the suite's files, removed at the end.
	Dir    string
	defers []func()
	failed bool
}

// Defer registers f to run once the tests are over, before the hub
// stops; deferred functions run last first.
func (s *Suite) Defer(f func()) { s.defers = append(s.defers, f) }

// Failed reports, in a deferred function, whether the tests failed.
func (s *Suite) Failed() bool { return s.failed }

// Main is an end-to-end test package's TestMain: it starts the hub
// control plane, calls setup (nil for none) to start what else the
// package shares, registering its clean-up with Suite.Defer, runs the
// tests, then stops everything and removes the binaries testutil built.
// It returns the exit code for os.Exit:
//
//	func TestMain(m *testing.M) { os.Exit(controlplane.Main(m, "e2e", setup)) }
func Main(m *testing.M, name string, setup func(ctx context.Context, s *Suite) error) int {
	defer testutil.RemoveBinaries()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	start := time.Now()
	s := &Suite{Name: name}
	fail := func(what string, err error) int {
		fmt.Fprintf(os.Stderr, "%s: %s: %v\n", name, what, err)
		return 1
	}
	var err error
	if s.Dir, err = os.MkdirTemp("", "hubsync-"+strings.ReplaceAll(name, " ", "-")+"-"); err != nil {
		return fail("temp dir", err)
	}
	defer os.RemoveAll(s.Dir)
	if s.Hub, err = Start(ctx); err != nil {
		return fail("cannot start the control plane", err)
	}
	defer func() {
		if err := s.Hub.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		}
	}()
	// Whatever setup started before it failed is stopped too.
	defer func() {
		for _, f := range slices.Backward(s.defers) {
			f()
		}
	}()
	if setup != nil {
		if err := setup(ctx, s); err != nil {
			return fail("set-up", err)
		}
	}
	fmt.Printf("%s: ready in %s\n", name, time.Since(start).Round(time.Millisecond))
	code := m.Run()
	s.failed = code != 0
	return code
}
