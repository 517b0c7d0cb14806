// Package multicluster_test proves that multicluster-runtime engages and
// keeps working with the clusters described by the ClusterProfiles that
// hubsync writes: a multicluster controller (mcmanager + mcbuilder) runs
// over a provider built on cluster-inventory-api's pkg/access (package
// inventory, which reproduces the upstream provider that the module proxy
// does not serve), with `hubsync creds` as the exec plugin, against a real
// hub kube-apiserver and two real managed kube-apiservers, while the real
// hubsync binary runs. It lives in a module of its own because
// multicluster-runtime is not a dependency of hubsync.
package multicluster_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/go-logr/logr/funcr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/hubsync/hubsync/test/controlplane"
	"github.com/hubsync/hubsync/test/fleet"
	"github.com/hubsync/hubsync/test/testutil"
)

// env is what the package's tests share.
var env struct {
	hub     *controlplane.ControlPlane
	managed []*controlplane.Managed
	hubsync string
	// plugin is hubsync as `hubsync install` puts it where the
	// controller runs it (docs/consumers.md).
	plugin string
	// ctrlLogs holds what controller-runtime, multicluster-runtime and
	// the provider log; it is printed when a test fails and checked for
	// tokens.
	ctrlLogs *fleet.LogBuffer
}

// managedIPs are the managed API servers' addresses, distinct from those
// of the other end-to-end packages.
var managedIPs = []string{"127.0.0.41", "127.0.0.42"}

// clusterNames are the managed clusters' names, on the hub and in the
// managed servers' certificates.
var clusterNames = []string{"mcr-east", "mcr-west"}

func TestMain(m *testing.M) {
	os.Exit(controlplane.Main(m, "multicluster proof", boot))
}

// boot starts the two managed kube-apiservers beside the suite's hub and
// finds the hubsync binary (built from this checkout, in the hubsync
// module, unless HUBSYNC_BINARY names one).
func boot(ctx context.Context, s *controlplane.Suite) error {
	env.hub = s.Hub
	env.ctrlLogs = &fleet.LogBuffer{}
	// controller-runtime's components that are handed no logger use this
	// one; the test binary is its only user.
	ctrllog.SetLogger(funcr.New(func(prefix, args string) {
		fmt.Fprintln(env.ctrlLogs, prefix, args)
	}, funcr.Options{Verbosity: 1}))
	var err error
	if env.hubsync, err = testutil.HubsyncPath(); err != nil {
		return fmt.Errorf("hubsync: %w", err)
	}
	if env.plugin, err = testutil.InstallPlugin(filepath.Join(s.Dir, "plugins")); err != nil {
		return err
	}
	for i, ip := range managedIPs {
		m, err := controlplane.StartManaged(ctx, s.Hub.EtcdURL(), clusterNames[i], ip)
		if err != nil {
			return fmt.Errorf("cannot start managed kube-apiserver %s: %w", clusterNames[i], err)
		}
		s.Defer(func() { _ = m.Close() })
		env.managed = append(env.managed, m)
	}
	return nil
}
