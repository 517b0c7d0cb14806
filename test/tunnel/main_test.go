// Package tunnel tests hubsync's tunnel pool end to end: a real hub
// kube-apiserver, two real kube-apiservers standing for managed clusters
// on their own loopback addresses, and the real konnectivity proxy-server
// with one agent per managed cluster.
package tunnel

import (
	"context"
	"fmt"
	"os"
	"testing"

	"k8s.io/client-go/rest"

	"github.com/hubsync/hubsync/test/controlplane"
	"github.com/hubsync/hubsync/test/konnectivity"
)

// env is what the package's tests share.
var env struct {
	hub     *rest.Config
	server  *konnectivity.Server
	managed []*controlplane.Managed
	agents  []*konnectivity.Agent
}

// managedIPs are the managed API servers' addresses: distinct hosts, as
// konnectivity's destHost strategy tells agents apart by host.
var managedIPs = []string{"127.0.0.11", "127.0.0.12"}

func TestMain(m *testing.M) {
	os.Exit(controlplane.Main(m, "tunnel e2e", boot))
}

// boot starts the proxy-server and, beside the suite's hub, a managed
// kube-apiserver and an agent for each of managedIPs.
func boot(ctx context.Context, s *controlplane.Suite) error {
	env.hub = s.Hub.Config
	var err error
	if env.server, err = konnectivity.StartServer(ctx, s.Dir); err != nil {
		return fmt.Errorf("cannot start the proxy-server: %w", err)
	}
	s.Defer(env.server.Kill)
	s.Defer(func() {
		if s.Failed() {
			fmt.Fprintf(os.Stderr, "tunnel e2e: proxy-server log: %s\n", env.server.Log())
		}
	})
	for i, ip := range managedIPs {
		mc, err := controlplane.StartManaged(ctx, s.Hub.EtcdURL(), fmt.Sprintf("managed%d", i+1), ip)
		if err != nil {
			return fmt.Errorf("cannot start a managed kube-apiserver: %w", err)
		}
		s.Defer(func() { _ = mc.Close() })
		env.managed = append(env.managed, mc)
		a, err := env.server.StartAgent(fmt.Sprintf("agent%d", i+1), ip)
		if err != nil {
			return fmt.Errorf("cannot start an agent: %w", err)
		}
		s.Defer(a.Kill)
		env.agents = append(env.agents, a)
	}
	return nil
}
