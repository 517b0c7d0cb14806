package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "open-cluster-management.io/api/cluster/v1"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/test/controlplane"
	"github.com/hubsync/hubsync/test/fleet"
	"github.com/hubsync/hubsync/test/konnectivity"
	"github.com/hubsync/hubsync/test/testutil"
)

const (
	tunnelMSA = "hubsync-tunnel"
	// edgeCluster sits behind an agent of its own, which the demo stops.
	edgeCluster = "eu-prod-02"
)

// demoTunnels is the reach side of the demo: a real konnectivity
// proxy-server, two real kube-apiservers standing for managed clusters on
// their own loopback addresses, and an agent for each. edgeCluster's
// ManagedCluster points at the second; every other simulated cluster
// shares the first (agents tell clusters apart by the dialed host).
type demoTunnels struct {
	srv     *konnectivity.Server
	managed []*controlplane.Managed
	agents  []*konnectivity.Agent
}

func startDemoTunnels(ctx context.Context, cp *controlplane.ControlPlane, hub *fleet.Hub, m *model, dir string) (*demoTunnels, config.Tunnel, error) {
	t := &demoTunnels{}
	var err error
	if t.srv, err = konnectivity.StartServer(ctx, dir); err != nil {
		return nil, config.Tunnel{}, err
	}
	tokens := map[int]string{}
	for i, ip := range []string{"127.0.0.31", "127.0.0.32"} {
		mc, err := controlplane.StartManaged(ctx, cp.EtcdURL(), fmt.Sprintf("managed-%d", i+1), ip)
		if err != nil {
			t.close()
			return nil, config.Tunnel{}, err
		}
		t.managed = append(t.managed, mc)
		a, err := t.srv.StartAgent(fmt.Sprintf("agent-%d", i+1), ip)
		if err != nil {
			t.close()
			return nil, config.Tunnel{}, err
		}
		t.agents = append(t.agents, a)
		// The ManagedServiceAccount's token: a ServiceAccount token of
		// that API server, as the managed-serviceaccount agent reports it.
		if tokens[i], err = mc.ServiceAccountToken(ctx, "open-cluster-management-agent-addon", tunnelMSA, time.Hour); err != nil {
			t.close()
			return nil, config.Tunnel{}, err
		}
		hub.NoteToken(tokens[i])
	}
	for name := range m.clusters {
		i := 0
		if name == edgeCluster {
			i = 1
		}
		mc := t.managed[i]
		if err := hub.UpdateCluster(ctx, name, func(c *clusterv1.ManagedCluster) {
			c.Spec.ManagedClusterClientConfigs = []clusterv1.ClientConfig{{URL: "https://" + mc.Address, CABundle: mc.CA}}
		}); err != nil {
			t.close()
			return nil, config.Tunnel{}, err
		}
		if err := hub.Namespace(ctx, name); err != nil {
			t.close()
			return nil, config.Tunnel{}, err
		}
		if err := hub.PutToken(ctx, name, tunnelMSA, tokens[i], map[string][]byte{"token": []byte(tokens[i]), "ca.crt": mc.CA}); err != nil {
			t.close()
			return nil, config.Tunnel{}, err
		}
	}
	// cluster-proxy dials <cluster>:443 and resolves it on the managed
	// side; here each cluster's own URL stands for it ({{.ServerHost}}).
	conf := t.srv.TunnelConfig(tunnelMSA)
	conf.ProbeInterval = metav1.Duration{Duration: 2 * time.Second}
	conf.ProbeTimeout = metav1.Duration{Duration: time.Second}
	conf.Backoff = config.Retry{BaseDelay: metav1.Duration{Duration: 200 * time.Millisecond}, MaxDelay: metav1.Duration{Duration: 2 * time.Second}}
	return t, conf, nil
}

func (t *demoTunnels) close() {
	for _, a := range t.agents {
		a.Kill()
	}
	for _, m := range t.managed {
		_ = m.Close()
	}
	if t.srv != nil {
		t.srv.Kill()
	}
}

// tunnelLines returns hubsync's /readyz?verbose tunnel lines.
func tunnelLines(d *fleet.Daemon) ([]string, error) {
	resp, err := http.Get("http://" + d.Address + "/readyz?verbose")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "tunnel") {
			out = append(out, l)
		}
	}
	return out, nil
}

// waitTunnels polls /readyz?verbose until cond holds on its lines.
func waitTunnels(ctx context.Context, d *fleet.Daemon, within time.Duration, cond func(lines []string) bool) ([]string, error) {
	var lines []string
	err := testutil.Poll(ctx, within, 20*time.Millisecond, func() error {
		var err error
		if lines, err = tunnelLines(d); err != nil {
			return err
		}
		if !cond(lines) {
			return fmt.Errorf("%v", lines)
		}
		return nil
	})
	if err != nil {
		return lines, fmt.Errorf("tunnels not as expected: %w", err)
	}
	return lines, nil
}

func hasLine(lines []string, prefix string) bool {
	for _, l := range lines {
		if strings.HasPrefix(l, prefix) {
			return true
		}
	}
	return false
}

// show prints the pool's state, then stops the edge cluster's agent and
// starts it again.
func (t *demoTunnels) show(ctx context.Context, d *fleet.Daemon, m *model, tail *eventTail) error {
	step(fmt.Sprintf("Tunnel pool: a warm HTTP/2 connection per cluster through the real konnectivity proxy-server (%s)", t.srv.ClientAddress))
	want := fmt.Sprintf("tunnels: %d ready, 0 failing", len(m.clusters))
	lines, err := waitTunnels(ctx, d, 60*time.Second, func(l []string) bool { return hasLine(l, want) })
	if err != nil {
		return err
	}
	fmt.Printf("   %d clusters warm before anyone asked: %s shares %s with every cluster but %s, which has %s to itself\n",
		len(m.clusters), t.agents[0].ID, t.managed[0].Address, edgeCluster, t.managed[1].Address)
	// The summary first, then the clusters in order.
	sort.Slice(lines, func(i, j int) bool {
		si, sj := strings.HasPrefix(lines[i], "tunnels:"), strings.HasPrefix(lines[j], "tunnels:")
		if si != sj {
			return si
		}
		return lines[i] < lines[j]
	})
	for _, l := range lines {
		if strings.HasPrefix(l, "tunnels:") || strings.HasPrefix(l, "tunnel "+edgeCluster) || strings.HasPrefix(l, "tunnel eu-prod-01") {
			fmt.Println("   /readyz?verbose: " + l)
		}
	}
	tail.skip()

	step(fmt.Sprintf("Stop the konnectivity agent of %s (its site loses the hub)", edgeCluster))
	t0 := time.Now()
	t.agents[1].Kill()
	if _, err := waitTunnels(ctx, d, 30*time.Second, func(l []string) bool { return hasLine(l, "tunnel "+edgeCluster+": failing") }); err != nil {
		return err
	}
	fmt.Printf("   reported failing %s after the agent stopped; every other cluster stays ready:\n", since(t0))
	lines, _ = tunnelLines(d)
	for _, l := range lines {
		if strings.HasPrefix(l, "tunnels:") || strings.HasPrefix(l, "tunnel "+edgeCluster) {
			fmt.Println("   /readyz?verbose: " + l)
		}
	}
	tail.flush(6)

	step(fmt.Sprintf("Start the agent of %s again (no hubsync restart)", edgeCluster))
	t0 = time.Now()
	if err := t.agents[1].Start(); err != nil {
		return err
	}
	if _, err := waitTunnels(ctx, d, 60*time.Second, func(l []string) bool { return hasLine(l, "tunnel "+edgeCluster+": ready") }); err != nil {
		return err
	}
	fmt.Printf("   ready again %s after the agent started (the pool redials with backoff, at most %s apart here)\n", since(t0), "2s")
	tail.flush(6)
	if text, err := d.Metrics(); err == nil {
		for _, line := range strings.Split(text, "\n") {
			for _, p := range []string{"hubsync_tunnel_entries{", "hubsync_tunnel_dials_total{", "hubsync_tunnel_transitions_total{"} {
				if strings.HasPrefix(line, p) {
					fmt.Println("   " + line)
				}
			}
		}
	}
	fmt.Fprintln(os.Stdout, "   (per cluster: hubsync_tunnel_state{cluster,state}, hubsync_tunnel_state_since_timestamp_seconds{cluster})")
	return nil
}
