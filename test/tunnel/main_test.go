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
	"time"

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
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	start := time.Now()
	cp, err := controlplane.Start(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "tunnel e2e: cannot start the hub:", err)
		return 1
	}
	defer func() { _ = cp.Stop() }()
	env.hub = cp.Config
	dir, err := os.MkdirTemp("", "hubsync-konnectivity-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	if env.server, err = konnectivity.StartServer(ctx, dir); err != nil {
		fmt.Fprintln(os.Stderr, "tunnel e2e: cannot start the proxy-server:", err)
		return 1
	}
	defer env.server.Kill()
	for i, ip := range managedIPs {
		mc, err := controlplane.StartManaged(ctx, cp.EtcdURL(), fmt.Sprintf("managed%d", i+1), ip)
		if err != nil {
			fmt.Fprintln(os.Stderr, "tunnel e2e: cannot start a managed kube-apiserver:", err)
			return 1
		}
		defer mc.Close()
		env.managed = append(env.managed, mc)
		a, err := env.server.StartAgent(fmt.Sprintf("agent%d", i+1), ip)
		if err != nil {
			fmt.Fprintln(os.Stderr, "tunnel e2e: cannot start an agent:", err)
			return 1
		}
		defer a.Kill()
		env.agents = append(env.agents, a)
	}
	fmt.Printf("tunnel e2e: hub, proxy-server, %d managed kube-apiservers and agents ready in %s\n",
		len(env.managed), time.Since(start).Round(time.Millisecond))
	code := m.Run()
	if code != 0 {
		fmt.Fprintf(os.Stderr, "tunnel e2e: proxy-server log: %s\n", env.server.Log())
	}
	return code
}
