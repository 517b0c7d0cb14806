// Package gateway tests hubsync's access gateway end to end: the real
// hubsync binary serving the gateway over its tunnel pool, the real
// konnectivity proxy-server and agent, a real managed kube-apiserver, a
// real hub kube-apiserver for TokenReview, and the real kubectl.
package gateway

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/hubsync/hubsync/test/controlplane"
	"github.com/hubsync/hubsync/test/konnectivity"
	"github.com/hubsync/hubsync/test/testutil"
)

// env is what the package's tests share.
var env struct {
	hub     *controlplane.ControlPlane
	server  *konnectivity.Server
	managed *controlplane.Managed
	agent   *konnectivity.Agent
	// managed2 is a second cluster, for the tests of several replicas.
	managed2 *controlplane.Managed
	agent2   *konnectivity.Agent
	hubsync  string // the binary
	kubectl  string
}

// managedIP is the managed API server's address (distinct from the other
// e2e packages', which may run before or after this one).
const managedIP, managed2IP = "127.0.0.21", "127.0.0.22"

func TestMain(m *testing.M) {
	os.Exit(controlplane.Main(m, "gateway e2e", boot))
}

// boot starts the proxy-server, the managed kube-apiserver and its agent
// beside the suite's hub, and finds kubectl and the hubsync binary.
func boot(ctx context.Context, s *controlplane.Suite) error {
	env.hub = s.Hub
	var err error
	if env.kubectl, err = controlplane.KubectlPath(); err != nil {
		return fmt.Errorf("kubectl: %w", err)
	}
	if env.hubsync, err = testutil.HubsyncPath(); err != nil {
		return fmt.Errorf("hubsync: %w", err)
	}
	if env.server, err = konnectivity.StartServer(ctx, s.Dir); err != nil {
		return fmt.Errorf("cannot start the proxy-server: %w", err)
	}
	s.Defer(env.server.Kill)
	if env.managed, err = controlplane.StartManaged(ctx, env.hub.EtcdURL(), "gwmanaged", managedIP); err != nil {
		return fmt.Errorf("cannot start the managed kube-apiserver: %w", err)
	}
	s.Defer(func() { _ = env.managed.Close() })
	if env.agent, err = env.server.StartAgent("gw-agent", managedIP); err != nil {
		return fmt.Errorf("cannot start the agent: %w", err)
	}
	s.Defer(env.agent.Kill)
	if env.managed2, err = controlplane.StartManaged(ctx, env.hub.EtcdURL(), "gwmanaged2", managed2IP); err != nil {
		return fmt.Errorf("cannot start the second managed kube-apiserver: %w", err)
	}
	s.Defer(func() { _ = env.managed2.Close() })
	if env.agent2, err = env.server.StartAgent("gw-agent2", managed2IP); err != nil {
		return fmt.Errorf("cannot start the second agent: %w", err)
	}
	s.Defer(env.agent2.Kill)
	return nil
}
