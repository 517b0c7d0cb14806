package tunnel

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	clusterv1 "open-cluster-management.io/api/cluster/v1"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/stream"
	"github.com/hubsync/hubsync/test/controlplane"
	"github.com/hubsync/hubsync/test/fleet"
	"github.com/hubsync/hubsync/test/leak"
	"github.com/hubsync/hubsync/test/testutil"
	"github.com/hubsync/hubsync/tunnel"
)

const (
	msaName      = "hubsync-tunnel"
	msaNamespace = "open-cluster-management-agent-addon"
)

// trackingDialer counts the connections a dialer opened and has not
// closed, so a test can see that the pool closes what it no longer needs.
type trackingDialer struct {
	tunnel.Dialer
	open, dials atomic.Int32
}

func (d *trackingDialer) Dial(ctx context.Context, cluster, address string) (net.Conn, error) {
	c, err := d.Dialer.Dial(ctx, cluster, address)
	if err != nil {
		return nil, err
	}
	d.open.Add(1)
	d.dials.Add(1)
	return &trackedConn{Conn: c, d: d}, nil
}

type trackedConn struct {
	net.Conn
	d    *trackingDialer
	once sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() { c.d.open.Add(-1) })
	return c.Conn.Close()
}

// joinCluster makes hub cluster name stand for managed API server m: a
// ServiceAccount on m whose token the hub holds as the
// ManagedServiceAccount's Secret <name>/hubsync-tunnel, allowed to read
// the ConfigMap default/identity that names m, and a ManagedCluster with
// m's URL and CA.
func joinCluster(t *testing.T, h *fleet.Hub, name string, m *controlplane.Managed, lbls map[string]string) {
	t.Helper()
	ctx := context.Background()
	token, err := m.ServiceAccountToken(ctx, msaNamespace, msaName, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	h.NoteToken(token)
	kube := kubernetes.NewForConfigOrDie(m.Config)
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "identity", Namespace: "default"}, Data: map[string]string{"cluster": m.Name}}
	if _, err := kube.CoreV1().ConfigMaps("default").Create(ctx, cm, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "read-identity", Namespace: "default"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, ResourceNames: []string{"identity"}, Verbs: []string{"get"}}}}
	if _, err := kube.RbacV1().Roles("default").Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "read-identity", Namespace: "default"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "read-identity"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: msaName, Namespace: msaNamespace}}}
	if _, err := kube.RbacV1().RoleBindings("default").Create(ctx, rb, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if err := h.Namespace(ctx, name); err != nil {
		t.Fatal(err)
	}
	if err := h.PutToken(ctx, name, msaName, token, map[string][]byte{"token": []byte(token), "ca.crt": m.CA}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.CreateCluster(ctx, fleet.ClusterSpec{Name: name, Labels: lbls}); err != nil {
		t.Fatal(err)
	}
	if err := h.UpdateCluster(ctx, name, func(mc *clusterv1.ManagedCluster) {
		mc.Spec.ManagedClusterClientConfigs = []clusterv1.ClientConfig{{URL: "https://" + m.Address, CABundle: m.CA}}
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.DeleteCluster(context.Background(), name) })
}

// identity reads default/identity on the cluster through the pool, with
// the pool's token, and returns which managed API server answered.
func identity(ctx context.Context, p *tunnel.Pool, cluster string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+cluster+"/api/v1/namespaces/default/configmaps/identity", nil)
	if err != nil {
		return "", err
	}
	auth, err := p.Authorization(cluster)
	if err != nil {
		return "", err
	}
	req.Header.Set("Authorization", auth)
	resp, err := p.RoundTripper(cluster).RoundTrip(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET identity: %s: %s", resp.Status, body)
	}
	var cm corev1.ConfigMap
	if err := json.Unmarshal(body, &cm); err != nil {
		return "", err
	}
	return cm.Data["cluster"], nil
}

// waitState waits until the pool has cluster in state want, and returns
// how long that took.
func waitState(t *testing.T, p *tunnel.Pool, cluster string, want tunnel.State, within time.Duration) time.Duration {
	t.Helper()
	return testutil.Eventually(t, within, 10*time.Millisecond, func() error {
		if st, ok := p.Status(cluster); !ok || st.State != want {
			return fmt.Errorf("%+v (present %v)", st, ok)
		}
		return nil
	}, "cluster %s, want %s", cluster, want)
}

// startPool runs a pool with opts, its targets from the hub's
// ManagedClusters that sel matches (dialed at their API server URL's
// host:port, authenticated with the ManagedServiceAccount msaName),
// closed when the test ends.
func startPool(t *testing.T, ctx context.Context, h *fleet.Hub, opts tunnel.Options, sel map[string]string) *tunnel.Pool {
	t.Helper()
	pool, err := tunnel.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	hc := h.Cache(t)
	src, err := tunnel.NewSource(hc, tunnel.SourceOptions{
		Transport: tunnel.TransportKonnectivity, DialAddress: "{{.ServerHost}}", ClusterManager: "hubsync-pool-test",
		ManagedServiceAccount: msaName, Selector: labels.SelectorFromSet(sel), ResyncPeriod: time.Hour,
	}, pool, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	hc.Start(ctx)
	if err := src.Run(ctx); err != nil {
		t.Fatal(err)
	}
	pool.Start(ctx)
	t.Cleanup(pool.Close)
	return pool
}

func testLog(t *testing.T) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, nil)).With("test", t.Name())
	}
	return slog.New(slog.DiscardHandler)
}

// TestPoolThroughKonnectivity takes two clusters behind real agents
// through joining, requests, agent, proxy-server and API server failures,
// a token rotation, leaving, and 100 up/down cycles.
func TestPoolThroughKonnectivity(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	h, err := fleet.NewHub(env.hub)
	if err != nil {
		t.Fatal(err)
	}
	run := runSeq.Add(1)
	sel := map[string]string{"tunnel-test": "pool"}
	c1, c2 := fmt.Sprintf("pool%d-c1", run), fmt.Sprintf("pool%d-c2", run)
	joinCluster(t, h, c1, env.managed[0], sel)
	joinCluster(t, h, c2, env.managed[1], sel)

	kd, err := tunnel.NewKonnectivityDialer(tunnel.KonnectivityConfig{
		Address: env.server.ClientAddress, CAFile: env.server.CAFile, CertFile: env.server.CertFile, KeyFile: env.server.KeyFile,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = kd.Close() })
	dialer := &trackingDialer{Dialer: kd}
	rec := &testutil.Recorder[stream.Change]{}
	const probeInterval = time.Second
	opts := tunnel.OptionsFor(config.Default().Tunnel)
	opts.Dialer, opts.Transport, opts.Notifier, opts.Log = dialer, tunnel.TransportKonnectivity, rec, testLog(t)
	opts.ProbeInterval, opts.ProbeTimeout, opts.DialTimeout = probeInterval, 900*time.Millisecond, 5*time.Second
	opts.BackoffBase, opts.BackoffMax, opts.RetireGrace = 100*time.Millisecond, time.Second, time.Second
	pool := startPool(t, ctx, h, opts, sel)
	// A namespace has a profile for each cluster, so that it hears of
	// their tunnels.
	pool.SetProfile("team", c1, true)
	pool.SetProfile("team", c2, true)

	step := func(name string) { t.Logf("--- %s", name) }

	step("clusters join: ready without any request")
	waitState(t, pool, c1, tunnel.StateReady, 30*time.Second)
	waitState(t, pool, c2, tunnel.StateReady, 30*time.Second)
	if n := dialer.dials.Load(); n != 2 {
		t.Fatalf("%d dials for two clusters", n)
	}
	for _, c := range []string{c1, c2} {
		if st, _ := pool.Status(c); st.Credential == "" || st.ProbeLatency <= 0 {
			t.Fatalf("status %+v: want the MSA token's fingerprint and a probe latency", st)
		}
	}

	step("requests reach the right API server, as the ManagedServiceAccount, on the one connection")
	for c, want := range map[string]string{c1: env.managed[0].Name, c2: env.managed[1].Name} {
		var wg sync.WaitGroup
		errs := make(chan error, 32)
		for range 32 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				got, err := identity(ctx, pool, c)
				if err == nil && got != want {
					err = fmt.Errorf("cluster %s answered by %s, want %s", c, got, want)
				}
				errs <- err
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	if n := dialer.dials.Load(); n != 2 {
		t.Fatalf("%d dials after 64 requests, want the 2 warm connections reused", n)
	}

	step("agent killed: that cluster fails within two probe intervals, the other is untouched")
	c2Before, _ := pool.Status(c2)
	env.agents[0].Kill()
	took := waitState(t, pool, c1, tunnel.StateFailing, 2*probeInterval)
	t.Logf("failing %s after the agent was killed", took.Round(time.Millisecond))
	if _, err := identity(ctx, pool, c1); err == nil || !strings.Contains(err.Error(), "not ready") {
		t.Fatalf("request to the failing cluster: %v, want an immediate not-ready error", err)
	}
	if got, err := identity(ctx, pool, c2); err != nil || got != env.managed[1].Name {
		t.Fatalf("other cluster: %q, %v", got, err)
	}
	if st, _ := pool.Status(c2); st.State != tunnel.StateReady || !st.Since.Equal(c2Before.Since) || st.Dials != c2Before.Dials {
		t.Fatalf("other cluster disturbed: %+v, was %+v", st, c2Before)
	}
	failing := func(cluster string) int {
		return rec.Count(func(c stream.Change) bool { return c.Type == stream.TunnelFailing && c.Cluster == cluster })
	}
	if failing(c1) != 1 || failing(c2) != 0 {
		t.Fatal("want one tunnel.failing change, for the killed agent's cluster only")
	}

	step("agent back: ready again without a restart")
	if err := env.agents[0].Start(); err != nil {
		t.Fatal(err)
	}
	waitState(t, pool, c1, tunnel.StateReady, 30*time.Second)
	if got, err := identity(ctx, pool, c1); err != nil || got != env.managed[0].Name {
		t.Fatalf("after the agent came back: %q, %v", got, err)
	}

	step("proxy-server restarted: every entry recovers")
	env.server.Kill()
	waitState(t, pool, c1, tunnel.StateFailing, 2*probeInterval)
	waitState(t, pool, c2, tunnel.StateFailing, 2*probeInterval)
	if err := env.server.Start(ctx); err != nil {
		t.Fatal(err)
	}
	waitState(t, pool, c1, tunnel.StateReady, 60*time.Second)
	waitState(t, pool, c2, tunnel.StateReady, 60*time.Second)

	step("managed API server restarted")
	if err := env.managed[1].Stop(); err != nil {
		t.Fatal(err)
	}
	waitState(t, pool, c2, tunnel.StateFailing, 2*probeInterval)
	if err := env.managed[1].Start(ctx); err != nil {
		t.Fatal(err)
	}
	waitState(t, pool, c2, tunnel.StateReady, 30*time.Second)
	if got, err := identity(ctx, pool, c2); err != nil || got != env.managed[1].Name {
		t.Fatalf("after the API server restarted: %q, %v", got, err)
	}

	step("token rotated on the hub: used from the next request, no redial")
	before, _ := pool.Status(c1)
	token, err := env.managed[0].ServiceAccountToken(ctx, msaNamespace, msaName, 2*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	h.NoteToken(token)
	if err := h.PutToken(ctx, c1, msaName, token, map[string][]byte{"token": []byte(token), "ca.crt": env.managed[0].CA}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, 10*time.Millisecond, func() bool {
		st, _ := pool.Status(c1)
		return st.Credential != before.Credential
	}, "the rotated token never reached the pool")
	if got, err := identity(ctx, pool, c1); err != nil || got != env.managed[0].Name {
		t.Fatalf("with the rotated token: %q, %v", got, err)
	}
	if st, _ := pool.Status(c1); st.Dials != before.Dials {
		t.Fatalf("a token rotation redialed (%d dials, was %d)", st.Dials, before.Dials)
	}

	step("cluster removed from the hub: its connection is closed")
	if err := h.DeleteCluster(ctx, c2); err != nil {
		t.Fatal(err)
	}
	// Only c1's connection stays open (a connection c1 replaced earlier
	// closes within RetireGrace).
	testutil.Eventually(t, 10*time.Second, 10*time.Millisecond, func() error {
		if _, ok := pool.Status(c2); ok || dialer.open.Load() != 1 {
			return fmt.Errorf("entry still there (%v) or connections still open (%d, want c1's only)", ok, dialer.open.Load())
		}
		return nil
	})

	step("100 up/down cycles through the hub: goroutines and file descriptors back to their baseline")
	cycle := func() {
		if err := h.Relabel(ctx, c1, "tunnel-test", "off"); err != nil {
			t.Fatal(err)
		}
		// The profile keeps the cluster in the pool: take it away too.
		pool.SetProfile("team", c1, false)
		testutil.Eventually(t, 10*time.Second, 5*time.Millisecond, func() error {
			if _, ok := pool.Status(c1); ok || dialer.open.Load() != 0 {
				return fmt.Errorf("cluster still in the pool (%v) or a connection open (%d)", ok, dialer.open.Load())
			}
			return nil
		})
		if err := h.Relabel(ctx, c1, "tunnel-test", "pool"); err != nil {
			t.Fatal(err)
		}
		waitState(t, pool, c1, tunnel.StateReady, 30*time.Second)
		if got, err := identity(ctx, pool, c1); err != nil || got != env.managed[0].Name {
			t.Fatalf("cycle: %q, %v", got, err)
		}
	}
	cycle()
	baseG, baseFD := leak.Baseline(), openFDs(t)
	start := time.Now()
	for range 100 {
		cycle()
	}
	g := leak.Goroutines(baseG + leakSlack)
	fd := openFDs(t)
	t.Logf("100 cycles in %s: goroutines %d -> %d, open fds %d -> %d", time.Since(start).Round(time.Millisecond), baseG, g, baseFD, fd)
	if g > baseG+leakSlack {
		t.Fatalf("goroutines: %d after 100 cycles, %d before", g, baseG)
	}
	if fd > baseFD+leakSlack {
		t.Fatalf("open file descriptors: %d after 100 cycles, %d before", fd, baseFD)
	}
}

// leakSlack absorbs goroutines and descriptors that come and go on their
// own (informer watches renewing, HTTP keep-alives to the hub); a leak of
// one per cycle would be 100.
const leakSlack = 5

func openFDs(t *testing.T) int {
	t.Helper()
	n, err := leak.OpenFDs()
	if err != nil {
		t.Fatalf("count file descriptors: %v", err)
	}
	return n
}
