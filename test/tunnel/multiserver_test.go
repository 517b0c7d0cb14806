package tunnel

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	clusterv1 "open-cluster-management.io/api/cluster/v1"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/test/fleet"
	"github.com/hubsync/hubsync/test/konnectivity"
	"github.com/hubsync/hubsync/test/lb"
	"github.com/hubsync/hubsync/test/testutil"
	"github.com/hubsync/hubsync/tunnel"
)

// agentlessIP is the host of a cluster whose agent reaches no
// proxy-server.
const agentlessIP = "127.0.0.13"

// multiServer is two proxy-servers deployed as OCM cluster-proxy deploys
// its replicas: clients (hubsync) and agents each reach them through one
// round-robin address.
type multiServer struct {
	a, b          *konnectivity.Server
	front, agents *lb.Balancer
}

// startMultiServer starts the two servers and their balancers, and
// agents: agent 1 (managed API server 1) through the agents' balancer,
// so connected to both servers; agent 2 (managed API server 2) to server
// A only; agent 3 (agentlessIP) through a balancer with no backend, so
// connected to none.
func startMultiServer(ctx context.Context, t *testing.T) *multiServer {
	t.Helper()
	dir := t.TempDir()
	servers, err := konnectivity.StartServers(ctx, dir, 2)
	if err != nil {
		t.Fatal(err)
	}
	ms := &multiServer{a: servers[0], b: servers[1]}
	t.Cleanup(func() {
		ms.a.Kill()
		ms.b.Kill()
		if t.Failed() {
			t.Logf("proxy-server logs: %s, %s; agent logs in %s", ms.a.Log(), ms.b.Log(), dir)
		}
	})
	balance := func(backends ...string) *lb.Balancer {
		var bs []lb.Backend
		for _, addr := range backends {
			bs = append(bs, lb.Backend{Addr: addr})
		}
		b := lb.New(lb.Options{}, bs...)
		if err := b.Start(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.Close() })
		return b
	}
	ms.front = balance(ms.a.ClientAddress, ms.b.ClientAddress)
	ms.agents = balance(ms.a.AgentAddress, ms.b.AgentAddress)
	nowhere := balance()
	start := func(via, id, host string) {
		a, err := ms.a.StartAgentVia(via, id, host)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(a.Kill)
	}
	start(ms.agents.Addr(), "ms-agent1", managedIPs[0])
	start(ms.a.AgentAddress, "ms-agent2", managedIPs[1])
	start(nowhere.Addr(), "ms-agent3", agentlessIP)
	return ms
}

// dialer returns a konnectivity dialer for the proxy-server(s) at addr.
func (ms *multiServer) dialer(t *testing.T, addr string) *tunnel.KonnectivityDialer {
	t.Helper()
	d, err := tunnel.NewKonnectivityDialer(tunnel.KonnectivityConfig{
		Address: addr, CAFile: ms.a.CAFile, CertFile: ms.a.CertFile, KeyFile: ms.a.KeyFile,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return d
}

func dialOnce(ctx context.Context, d tunnel.Dialer, address string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	c, err := d.Dial(ctx, "", address)
	if err != nil {
		return err
	}
	return c.Close()
}

// waitAgents waits until agent 1 is connected to both servers and agent
// 2 to server A, and checks that server B has no agent for managed API
// server 2: the situation the pool must cope with.
func (ms *multiServer) waitAgents(ctx context.Context, t *testing.T) {
	t.Helper()
	viaA, viaB := ms.dialer(t, ms.a.ClientAddress), ms.dialer(t, ms.b.ClientAddress)
	testutil.Eventually(t, 30*time.Second, 50*time.Millisecond, func() error {
		for _, c := range []struct {
			d    tunnel.Dialer
			via  string
			addr string
		}{{viaA, "A", env.managed[0].Address}, {viaB, "B", env.managed[0].Address}, {viaA, "A", env.managed[1].Address}} {
			if err := dialOnce(ctx, c.d, c.addr); err != nil {
				return fmt.Errorf("%s through server %s: %w", c.addr, c.via, err)
			}
		}
		return nil
	}, "agents connected")
	err := dialOnce(ctx, viaB, env.managed[1].Address)
	if err == nil || !strings.Contains(err.Error(), "No agent available") {
		t.Fatalf("dial of managed API server 2 through server B: %v, want no agent", err)
	}
	t.Logf("server B alone: %v", err)
}

// TestPoolThroughSeveralProxyServers: hubsync's konnectivity address is
// a round-robin balancer over two proxy-servers. Cluster 1's agent is
// connected to both, cluster 2's to server A only: both clusters become
// ready at their first dial and serve requests, and every dial to
// cluster 2 succeeds although some of the connections the tunnels share
// landed on server B, which answers "No agent available" (the dial moves
// to another one). A cluster whose agent reaches no server is failing,
// with a reason that says so.
func TestPoolThroughSeveralProxyServers(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ms := startMultiServer(ctx, t)
	ms.waitAgents(ctx, t)

	h, err := fleet.NewHub(env.hub)
	if err != nil {
		t.Fatal(err)
	}
	run := runSeq.Add(1)
	sel := map[string]string{"tunnel-test": fmt.Sprintf("multiserver%d", run)}
	c1, c2, c3 := fmt.Sprintf("ms%d-c1", run), fmt.Sprintf("ms%d-c2", run), fmt.Sprintf("ms%d-c3", run)
	joinCluster(t, h, c1, env.managed[0], sel)
	joinCluster(t, h, c2, env.managed[1], sel)

	kd := ms.dialer(t, ms.front.Addr())
	opts := tunnel.OptionsFor(config.Default().Tunnel)
	opts.Dialer, opts.Transport, opts.Log = kd, tunnel.TransportKonnectivity, testLog(t)
	opts.ProbeInterval, opts.ProbeTimeout, opts.DialTimeout = time.Second, 900*time.Millisecond, 5*time.Second
	opts.BackoffBase, opts.BackoffMax = 100*time.Millisecond, time.Second
	pool := startPool(t, ctx, h, opts, sel)

	t.Log("--- both clusters ready at their first dial")
	for _, c := range []string{c1, c2} {
		waitState(t, pool, c, tunnel.StateReady, 30*time.Second)
		if st, _ := pool.Status(c); st.Dials != 1 {
			t.Fatalf("cluster %s: %d dials, want ready at the first: %+v", c, st.Dials, st)
		}
	}

	t.Log("--- requests reach the right API server")
	for range 5 {
		for c, want := range map[string]string{c1: env.managed[0].Name, c2: env.managed[1].Name} {
			if got, err := identity(ctx, pool, c); err != nil || got != want {
				t.Fatalf("cluster %s: answered by %q, %v; want %s", c, got, err, want)
			}
		}
	}

	t.Log("--- every dial to cluster 2 succeeds, though some of the shared connections reached server B")
	if n := ms.front.Routed(ms.b.ClientAddress); n == 0 {
		t.Fatal("no connection went to server B: the balancer does not alternate")
	}
	const dials = 6
	for i := range dials {
		if err := dialOnce(ctx, kd, env.managed[1].Address); err != nil {
			t.Fatalf("dial %d of cluster 2 through the balancer: %v", i+1, err)
		}
	}

	t.Log("--- a cluster whose agent reaches no server fails, saying so")
	joinCluster(t, h, c3, env.managed[0], nil)
	_, port, err := net.SplitHostPort(env.managed[0].Address)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.UpdateCluster(ctx, c3, func(mc *clusterv1.ManagedCluster) {
		mc.Spec.ManagedClusterClientConfigs[0].URL = "https://" + net.JoinHostPort(agentlessIP, port)
	}); err != nil {
		t.Fatal(err)
	}
	for k, v := range sel {
		if err := h.Relabel(ctx, c3, k, v); err != nil {
			t.Fatal(err)
		}
	}
	waitState(t, pool, c3, tunnel.StateFailing, 30*time.Second)
	st, _ := pool.Status(c3)
	want := "no agent for this cluster on the proxy-server(s) reached at " + ms.front.Addr() + fmt.Sprintf(" (%d connections tried): No agent available", config.DefaultTunnelProxyConns+1)
	if !strings.Contains(st.Reason, want) {
		t.Fatalf("failing reason %q, want it to contain %q", st.Reason, want)
	}
	t.Logf("failing reason: %s", st.Reason)
	for _, c := range []string{c1, c2} {
		if st, _ := pool.Status(c); st.State != tunnel.StateReady {
			t.Fatalf("cluster %s disturbed: %+v", c, st)
		}
	}
}
