package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	clusterv1 "open-cluster-management.io/api/cluster/v1"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/gateway"
	"github.com/hubsync/hubsync/test/controlplane"
	"github.com/hubsync/hubsync/test/fleet"
	"github.com/hubsync/hubsync/test/testutil"
)

// Replica figures (flags).
var (
	replicasOnly     bool
	replicaRepeats   int
	replicaSizes     string
	replicaOnDemand  int
	replicaUsed      int
	replicaIdle      time.Duration
	replicaSettle    time.Duration
	replicaFleetConc int
	replicaProfiles  string
	replicaMemLimit  string
	replicaAgents    int
)

// restWindow is how long a settled replica's CPU at rest is measured.
const restWindow = 10 * time.Second

const (
	// replicaIP is the managed API server every simulated cluster of the
	// replica figures points to (the tunnel bench's is 127.0.0.21, the
	// gateway's .22, the strangers' .24).
	replicaIP = "127.0.0.25"
	// The fleet: every cluster in one exclusive set, bound in one
	// consumer namespace, so that each cluster has one profile and the
	// pool of every replica serves it.
	replicaAgent     = "bench-replicas"
	replicaSet       = "replicas"
	replicaConsumers = "replica-consumers"
	// replicaReady bounds a replica's start to /readyz 200 and to every
	// entry ready; replicaConverge bounds the leader's profiles.
	replicaReady    = 3 * time.Minute
	replicaConverge = 10 * time.Minute
	// replicaRelease is how long after the on-demand entries closed the
	// last sample is taken: past the pool's HTTP/2 ReadIdleTimeout (30s),
	// whose timer keeps a closed connection's memory until it fires.
	replicaRelease = 35 * time.Second
)

func replicaName(i int) string { return fmt.Sprintf("rep-%05d", i) }

// replicaRig is the hub, the one managed API server behind a real
// proxy-server and agent, and the fleet built so far.
type replicaRig struct {
	cp     *controlplane.ControlPlane
	hub    *fleet.Hub
	reach  *reach
	binary string
	logs   io.Writer
	built  int // clusters rep-00000 .. on the hub
	// msa is the impersonating ManagedServiceAccount (deploy/gateway's)
	// whose token authenticates every probe: the managed API server sends
	// an anonymous HTTP/2 request a GOAWAY with its answer
	// (UnauthenticatedHTTP2DOSMitigation, on by default since Kubernetes
	// 1.29), so that without a token no entry would stay connected.
	msa   string
	token string
}

// benchReplicas measures what the tunnel pool costs each replica, with
// the real hubsync binary, a real konnectivity proxy-server and agent,
// and one real managed kube-apiserver that every simulated cluster points
// to: the time a new standby takes from process start to /readyz 200 with
// every served cluster warm, at each fleet size of --replica-clusters;
// its RSS against a standby with the tunnel off on the same fleet (and the
// leader's); then, on a fleet grown to --replica-ondemand clusters with
// tunnel.warm: onDemand, a standby's RSS when ready, after
// --replica-used clusters were used through its gateway, and after their
// entries closed idle.
func benchReplicas(ctx context.Context, cp *controlplane.ControlPlane, binary string, logs io.Writer) (err error) {
	sizes, err := parseSizes(replicaSizes)
	if err != nil {
		return err
	}
	fmt.Printf("\n== replicas: every replica runs the tunnel pool; one real proxy-server, managed kube-apiserver (%s) and %d agents for it behind every simulated cluster\n", replicaIP, replicaAgents)
	begin := time.Now()
	r, err := newReplicaRig(ctx, cp, binary, logs)
	if err != nil {
		return err
	}
	defer r.stop()
	defer func() {
		if err != nil {
			r.keepLogs()
		}
	}()
	var leader *fleet.Daemon
	defer func() {
		if leader != nil {
			_ = leader.Stop()
		}
	}()
	var warm replicaMemory
	for _, n := range sizes {
		from := r.built
		grew, err := r.grow(ctx, n)
		if err != nil {
			return err
		}
		start := time.Now()
		if leader == nil {
			if leader, err = r.startLeader(ctx, r.conf(config.WarmAll)); err != nil {
				return err
			}
		}
		if err := r.waitConverged(ctx, leader, n, true); err != nil {
			return err
		}
		fmt.Printf("fleet: %d clusters, each a ManagedCluster with status, its namespace and the impersonator's token Secret, %d writers: %s (%.0f clusters/s); "+
			"the leader (tunnel.warm: all) had their %d profiles and %d entries ready %s later\n",
			n, replicaFleetConc, grew.Round(10*time.Millisecond), float64(n-from)/grew.Seconds(), n, n, time.Since(start).Round(10*time.Millisecond))
		if warm, err = r.standbys(ctx, n); err != nil {
			return err
		}
	}
	n := sizes[len(sizes)-1]
	if replicaMemLimit != "" {
		if err := r.variantStandby(ctx, n, warm, "GOMEMLIMIT="+replicaMemLimit, "the chart sets it to the memory limit"); err != nil {
			return err
		}
	}
	// The same run's baseline for hubsync's GC target (GOGC=50 unless
	// the environment sets one).
	if err := r.variantStandby(ctx, n, warm, "GOGC=100", "Go's default"); err != nil {
		return err
	}
	lm, err := sampleMemory(ctx, leader)
	if err != nil {
		return err
	}
	fmt.Printf("  the leader at %d warm (its syncer's caches and the bus too): %s\n", n, lm)
	warm.leader = lm
	if err := leader.Stop(); err != nil {
		return fmt.Errorf("stop the leader: %w", err)
	}
	leader = nil
	od, err := r.onDemand(ctx)
	if err != nil {
		return err
	}
	printSizing(n, warm, od)
	fmt.Printf("replica figures took %s\n", time.Since(begin).Round(time.Second))
	return checkGoals(n, warm)
}

// The goals of the replica figures (docs/availability.md, "Sizing"). A
// goal that is met fails the bench when it slips; the others are printed
// against it.
const (
	goalProxyConns = 8               // per replica, whatever the fleet
	goalEntryKiB   = 64              // RSS per warm entry
	goalFleet      = 3000            // the fleet the next two are for
	goalStandbyMiB = 300             // a standby with goalFleet warm
	goalWarmup     = 6 * time.Second // a new standby's goalFleet entries
)

// checkGoals prints the figures of the largest fleet against the goals and
// returns an error for a met goal that slipped.
func checkGoals(n int, warm replicaMemory) error {
	conns := 0
	rss, all := make([]float64, len(warm.warm)), make([]time.Duration, len(warm.runs))
	for i, s := range warm.warm {
		conns = max(conns, s.proxyConns)
		rss[i] = mib(s.rss)
	}
	for i, r := range warm.runs {
		all[i] = r.all
	}
	verdict := func(ok bool) string {
		if ok {
			return "met"
		}
		return "not met"
	}
	entry := median(sorted64(warm.perEntry)) / 1024
	fmt.Printf("goals: proxy-server connections per replica %d (<= %d): %s; RSS per warm entry %.0f KiB (<= %d): %s",
		conns, goalProxyConns, verdict(conns <= goalProxyConns), entry, goalEntryKiB, verdict(entry <= goalEntryKiB))
	if n == goalFleet {
		standby, warmup := median(sorted64(rss)), median(slices.Sorted(slices.Values(all)))
		fmt.Printf("; a standby with %d warm %.0f MiB (<= %d): %s; %d warm in %.2fs (<= %s, with the fleet on the same cores): %s",
			n, standby, goalStandbyMiB, verdict(standby <= goalStandbyMiB), n, warmup.Seconds(), goalWarmup, verdict(warmup <= goalWarmup))
	}
	fmt.Println()
	if conns > goalProxyConns {
		return fmt.Errorf("a warm standby held %d connections to the proxy-server; the goal is at most %d whatever the fleet", conns, goalProxyConns)
	}
	return nil
}

func parseSizes(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("--replica-clusters %q: want increasing positive numbers separated by commas", s)
		}
		if len(out) > 0 && n <= out[len(out)-1] {
			return nil, fmt.Errorf("--replica-clusters %q: want increasing sizes", s)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("--replica-clusters: no size")
	}
	return out, nil
}

// newReplicaRig starts the proxy-server, managed API server and agent,
// and makes the set, its binding and the leader election's namespace.
func newReplicaRig(ctx context.Context, cp *controlplane.ControlPlane, binary string, logs io.Writer) (*replicaRig, error) {
	hub, err := fleet.NewHub(cp.Config)
	if err != nil {
		return nil, err
	}
	re, err := startReach(ctx, cp, replicaAgent, replicaIP)
	if err != nil {
		return nil, err
	}
	if err := re.addAgents(replicaAgent, replicaIP, replicaAgents-1); err != nil {
		re.stop()
		return nil, err
	}
	r := &replicaRig{cp: cp, hub: hub, reach: re, binary: binary, logs: logs}
	mg, err := kubernetes.NewForConfig(re.managed.Config)
	if err != nil {
		r.stop()
		return nil, err
	}
	for _, step := range []func() error{
		func() error {
			var ns string
			if ns, r.msa, err = applyGatewayRBAC(ctx, mg); err != nil {
				return err
			}
			r.token, err = re.managed.ServiceAccountToken(ctx, ns, r.msa, 2*time.Hour)
			return err
		},
		func() error { return hub.Namespace(ctx, config.DefaultLeaseNamespace) },
		func() error { return hub.CreateExclusiveSet(ctx, replicaSet) },
		func() error { return hub.Namespace(ctx, replicaConsumers) },
		func() error { return hub.Bind(ctx, replicaConsumers, replicaSet, true) },
	} {
		if err := step(); err != nil {
			r.stop()
			return nil, err
		}
	}
	return r, nil
}

func (r *replicaRig) stop() { r.reach.stop() }

// keepLogs copies the proxy-server's and the agent's logs out of the
// directory stop removes, and says where, for a run that failed.
func (r *replicaRig) keepLogs() {
	dir, err := os.MkdirTemp("", "hubsync-bench-replicas-logs-")
	if err != nil {
		return
	}
	for _, src := range append([]string{r.reach.server.Log()}, r.reach.agentLogs()...) {
		if data, err := os.ReadFile(src); err == nil {
			_ = os.WriteFile(filepath.Join(dir, filepath.Base(src)), data, 0o600)
		}
	}
	fmt.Fprintf(os.Stderr, "bench: the proxy-server's and agent's logs are in %s\n", dir)
}

// grow creates clusters up to n, each pointing at the managed API server
// (its URL and CA, as the registration agent reports them), with status,
// its namespace on the hub and there the impersonator's token Secret, as
// the managed-serviceaccount agent writes it.
func (r *replicaRig) grow(ctx context.Context, n int) (time.Duration, error) {
	m := r.reach.managed
	cfgs := []clusterv1.ClientConfig{{URL: "https://" + m.Address, CABundle: m.CA}}
	data := map[string][]byte{"token": []byte(r.token), "ca.crt": m.CA}
	from := r.built
	start := time.Now()
	err := parallel(n-from, replicaFleetConc, func(i int) error {
		name := replicaName(from + i)
		if _, err := r.hub.CreateCluster(ctx, fleet.ClusterSpec{
			Name: name, Labels: fleet.ExclusiveSetLabels(replicaSet, nil), ClientConfigs: cfgs,
		}); err != nil {
			return err
		}
		if err := r.hub.Namespace(ctx, name); err != nil {
			return err
		}
		_, err := r.hub.Kube.CoreV1().Secrets(name).Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: r.msa, Namespace: name, Labels: map[string]string{fleet.LabelIsMSA: "true"}},
			Type:       corev1.SecretTypeOpaque, Data: data,
		}, metav1.CreateOptions{})
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("grow the fleet to %d: %w", n, err)
	}
	r.built = n
	return time.Since(start), nil
}

// conf is a replica's configuration: leader election on, the pool through
// the proxy-server with its default probe interval, backoff and dial
// bound, each cluster dialed at its ManagedCluster URL's host:port, the
// impersonator's token authenticating probes; warm "" turns the tunnel
// off.
func (r *replicaRig) conf(warm string) config.Config {
	c := config.Config{}
	c.LeaderElection.Enabled = true
	// pprof serves /debug/pprof/heap?gc=1, which forces a GC before a
	// memory sample.
	c.Server.Pprof = true
	if warm == "" {
		return c
	}
	c.Tunnel = r.reach.server.TunnelConfig(r.msa)
	// The defaults, not the tests' short probe interval and backoff.
	c.Tunnel.ProbeInterval, c.Tunnel.ProbeTimeout, c.Tunnel.Backoff = metav1.Duration{}, metav1.Duration{}, config.Retry{}
	c.Tunnel.Warm = warm
	if warm == config.WarmOnDemand {
		c.Tunnel.IdleTimeout = metav1.Duration{Duration: replicaIdle}
	}
	return c
}

// startLeader starts the first replica, which takes the lease.
func (r *replicaRig) startLeader(ctx context.Context, conf config.Config) (*fleet.Daemon, error) {
	d, err := fleet.StartDaemon(ctx, r.binary, r.cp.Config, conf, r.logs)
	if err != nil {
		return nil, err
	}
	err = testutil.Poll(ctx, time.Minute, 50*time.Millisecond, func() error {
		if !d.Leading() {
			return fmt.Errorf("not leading")
		}
		return nil
	})
	if err != nil {
		_ = d.Stop()
		return nil, fmt.Errorf("the first replica: %w", err)
	}
	return d, nil
}

// waitConverged waits until the leader's cache holds n profiles, its
// queue is empty and, when warm, its pool has n entries ready.
func (r *replicaRig) waitConverged(ctx context.Context, d *fleet.Daemon, n int, warm bool) error {
	err := testutil.Poll(ctx, replicaConverge, 100*time.Millisecond, func() error {
		m, err := d.Scrape()
		if err != nil {
			return err
		}
		profiles, queued := m.Value("hubsync_profiles_managed", nil), m.Value("hubsync_queue_depth", nil)
		ready := m.Value("hubsync_tunnel_entries", testutil.Labels{"state": "ready"})
		if int(profiles) != n || queued > 0 || (warm && int(ready) != n) {
			return fmt.Errorf("%.0f profiles, %.0f queued, %.0f entries ready", profiles, queued, ready)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("the leader at %d clusters: %w", n, err)
	}
	return nil
}

// readyRun is one standby's start.
type readyRun struct {
	took time.Duration // process start to /readyz 200
	// The pool's entries at that moment.
	ready, failing, connecting int
	cpu                        time.Duration // CPU time to /readyz 200
	all                        time.Duration // process start to every entry ready
	// dials made by then and their mean time (tunnel, TLS, HTTP/2).
	dials    int
	dialMean time.Duration
	// busy is the machine's CPU use from process start to every entry
	// ready: every process, the proxy-server, agent and API servers too
	// (1 = every core busy).
	busy float64
}

// machineCPU returns the machine's busy and total CPU time so far, in
// clock ticks, from /proc/stat.
func machineCPU() (busy, total float64) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	for i, v := range f[1:] {
		x, _ := strconv.ParseFloat(v, 64)
		total += x
		if i != 3 && i != 4 { // idle, iowait
			busy += x
		}
	}
	return busy, total
}

// startTimed starts a standby and times it from process start to /readyz
// 200 and, with n > 0, to n entries ready.
func (r *replicaRig) startTimed(ctx context.Context, conf config.Config, n int, env []string) (*fleet.Daemon, readyRun, error) {
	var run readyRun
	start := time.Now()
	busy0, total0 := machineCPU()
	d, err := fleet.StartDaemonEnv(ctx, r.binary, r.cp.Config, conf, r.logs, env)
	if err != nil {
		return nil, run, err
	}
	fail := func(err error) (*fleet.Daemon, readyRun, error) {
		_ = d.Stop()
		return nil, run, err
	}
	if replicaProfiles != "" && n > 0 {
		go func() {
			_ = fetchProfile(d, "/debug/pprof/profile?seconds=20", filepath.Join(replicaProfiles, fmt.Sprintf("start-%d-%d.pprof", n, start.Unix())))
		}()
	}
	rctx, cancel := context.WithTimeout(ctx, replicaReady)
	defer cancel()
	select {
	case at := <-d.ReadyAt(rctx):
		run.took = at.Sub(start)
	case <-rctx.Done():
		return fail(fmt.Errorf("a standby was not ready within %s", replicaReady))
	}
	run.cpu, _ = d.CPUTime()
	m, err := d.Scrape()
	if err != nil {
		return fail(err)
	}
	entries := func(state string) int {
		return int(m.Value("hubsync_tunnel_entries", testutil.Labels{"state": state}))
	}
	run.ready, run.failing, run.connecting = entries("ready"), entries("failing"), entries("connecting")
	if n == 0 {
		return d, run, nil
	}
	err = testutil.Poll(ctx, replicaReady, 20*time.Millisecond, func() error {
		if m, err = d.Scrape(); err != nil {
			return err
		}
		if ready := m.Value("hubsync_tunnel_entries", testutil.Labels{"state": "ready"}); int(ready) != n {
			return fmt.Errorf("%.0f of %d entries ready", ready, n)
		}
		return nil
	})
	if err != nil {
		return fail(fmt.Errorf("a standby's pool: %w", err))
	}
	run.all = time.Since(start)
	if busy1, total1 := machineCPU(); total1 > total0 {
		run.busy = (busy1 - busy0) / (total1 - total0)
	}
	if h := m["hubsync_tunnel_dial_duration_seconds"]; h != nil && len(h.GetMetric()) == 1 {
		hist := h.GetMetric()[0].GetHistogram()
		if run.dials = int(hist.GetSampleCount()); run.dials > 0 {
			run.dialMean = time.Duration(hist.GetSampleSum() / float64(run.dials) * float64(time.Second))
		}
	}
	return d, run, nil
}

// replicaMemory is what the standbys of one fleet size measured, pair by
// pair, and the leader's sample at the largest size.
type replicaMemory struct {
	off, warm    []memSample
	perEntry     []float64 // bytes of RSS
	perEntryHeap []float64 // bytes of live heap
	leader       memSample
	// runs are the warm standbys' starts.
	runs []readyRun
}

// standbys starts --replica-repeats standbys with every cluster warm and
// times each to /readyz 200; each is paired with a standby with the
// tunnel off on the same fleet (alternating which starts first), and both
// are sampled once settled, after a forced GC.
func (r *replicaRig) standbys(ctx context.Context, n int) (replicaMemory, error) {
	var mem replicaMemory
	var runs []readyRun
	for i := range replicaRepeats {
		order := []bool{false, true} // tunnel on?
		if i%2 == 1 {
			order = []bool{true, false}
		}
		for _, on := range order {
			// A standby with the tunnel off waits for no entry.
			warm, entries := "", 0
			if on {
				warm, entries = config.WarmAll, n
			}
			d, run, err := r.startTimed(ctx, r.conf(warm), entries, nil)
			if err != nil {
				return mem, err
			}
			s, err := sampleMemory(ctx, d)
			if err == nil {
				s.proxyConns, err = d.TCPConnections(r.reach.server.ClientAddress)
			}
			if err == nil && on && replicaProfiles != "" {
				err = saveProfiles(d, filepath.Join(replicaProfiles, fmt.Sprintf("standby-%d-%d", n, i+1)))
			}
			if err == nil && on {
				s.restCPU, err = restCPU(ctx, d)
			}
			if stopErr := d.Stop(); err == nil && stopErr != nil {
				err = fmt.Errorf("stop a standby: %w", stopErr)
			}
			if err != nil {
				return mem, err
			}
			if on {
				runs, mem.warm = append(runs, run), append(mem.warm, s)
			} else {
				mem.off = append(mem.off, s)
			}
		}
		w, o := mem.warm[i], mem.off[i]
		mem.perEntry = append(mem.perEntry, float64(w.rss-o.rss)/float64(n))
		mem.perEntryHeap = append(mem.perEntryHeap, float64(w.live-o.live)/float64(n))
	}
	printStandbys(n, runs, mem)
	mem.runs = runs
	return mem, nil
}

func printStandbys(n int, runs []readyRun, mem replicaMemory) {
	var took, all, cpu, dial []time.Duration
	var busy []float64
	counts := map[string]bool{}
	dials := 0
	for _, r := range runs {
		took, all, cpu, dial = append(took, r.took), append(all, r.all), append(cpu, r.cpu), append(dial, r.dialMean)
		busy = append(busy, 100*r.busy)
		counts[fmt.Sprintf("%d ready, %d failing, %d connecting", r.ready, r.failing, r.connecting)] = true
		dials = max(dials, r.dials)
	}
	fmt.Printf("  a new standby (tunnel.warm: all), %d repeats: process start -> /readyz 200 %s; its pool then: %s; every entry ready %s; its CPU time to /readyz 200 %s\n",
		len(runs), secSpread(took), strings.Join(slices.Sorted(maps.Keys(counts)), " / "), secSpread(all), secSpread(cpu))
	fmt.Printf("    %d dials, %d at a time: mean %s per dial (a stream on a shared connection to the proxy-server, DIAL_REQ, TLS + HTTP/2 to the API server, under the load of the run); the machine's CPU %s%% busy until every entry was ready (every process)\n",
		dials, config.DefaultTunnelMaxDials, msSpread(dial), floatSpread(busy, "%.0f"))
	ratio := make([]float64, len(mem.warm))
	for i := range mem.warm {
		ratio[i] = float64(mem.warm[i].rss) / float64(mem.off[i].rss)
	}
	fmt.Printf("  RSS after %s settled and a forced GC, standbys in pairs (tunnel off and warm, alternating order):\n", replicaSettle)
	fmt.Printf("    tunnel off: %s\n", memSpread(mem.off))
	fmt.Printf("    warm:       %s\n", memSpread(mem.warm))
	stacks, goroutines := make([]float64, len(mem.warm)), make([]float64, len(mem.warm))
	for i := range mem.warm {
		stacks[i] = float64(mem.warm[i].stacks-mem.off[i].stacks) / 1024 / float64(n)
		goroutines[i] = float64(mem.warm[i].goroutines-mem.off[i].goroutines) / float64(n)
	}
	rest, conns := make([]float64, len(mem.warm)), make([]float64, len(mem.warm))
	for i := range mem.warm {
		rest[i] = mem.perEntry[i]/1024 - mem.perEntryHeap[i]/1024 - stacks[i]
		conns[i] = float64(mem.warm[i].proxyConns)
	}
	fmt.Printf("    warm / off RSS: %s; per warm entry (warm - off) / %d: %s KiB of RSS: %s KiB live heap, %s KiB goroutine stacks (%s goroutines), %s KiB rest (heap not live, runtime)\n",
		floatSpread(ratio, "%.2fx"), n, floatSpread(scale(mem.perEntry, 1.0/1024), "%.0f"), floatSpread(scale(mem.perEntryHeap, 1.0/1024), "%.0f"),
		floatSpread(stacks, "%.0f"), floatSpread(goroutines, "%.1f"), floatSpread(rest, "%.0f"))
	idle := make([]float64, len(mem.warm))
	for i := range mem.warm {
		idle[i] = 100 * mem.warm[i].restCPU
	}
	fmt.Printf("    TCP connections a warm standby holds to the proxy-server: %s; its CPU at rest (probes every 10s) %s%% of a core\n",
		floatSpread(conns, "%.0f"), floatSpread(idle, "%.1f"))
}

// restCPU returns the share of a core d uses over restWindow.
func restCPU(ctx context.Context, d *fleet.Daemon) (float64, error) {
	c0, err := d.CPUTime()
	if err != nil {
		return 0, err
	}
	start := time.Now()
	select {
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-time.After(restWindow):
	}
	c1, err := d.CPUTime()
	if err != nil {
		return 0, err
	}
	return float64(c1-c0) / float64(time.Since(start)), nil
}

// variantStandby starts one more warm standby on the fleet of n clusters
// with env set (GOMEMLIMIT=--replica-memlimit, as the chart sets it from
// the pod's memory limit; or another GOGC) and prints its time to every
// entry ready, its RSS at rest (no forced GC: the runtime's own), its
// peak, and its CPU at rest against the standbys' measured before it.
func (r *replicaRig) variantStandby(ctx context.Context, n int, warm replicaMemory, env, why string) error {
	d, run, err := r.startTimed(ctx, r.conf(config.WarmAll), n, []string{env})
	if err != nil {
		return fmt.Errorf("a standby with %s: %w", env, err)
	}
	defer func() { _ = d.Stop() }()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(replicaSettle):
	}
	rss, err := d.RSS()
	if err != nil {
		return err
	}
	cpu, err := restCPU(ctx, d)
	if err != nil {
		return err
	}
	peak, err := d.PeakRSS()
	if err != nil {
		return err
	}
	m, err := d.Scrape()
	if err != nil {
		return err
	}
	var rssWarm, cpuWarm []float64
	for _, s := range warm.warm {
		rssWarm = append(rssWarm, mib(s.rss))
		cpuWarm = append(cpuWarm, 100*s.restCPU)
	}
	fmt.Printf("  a warm standby with %s (%s): every entry ready %.2fs; RSS at rest %.1f MiB (peak %.1f; the standbys above: %s), live heap %.1f MiB; CPU at rest %.1f%% of a core (the standbys above: %s%%)\n",
		env, why, run.all.Seconds(), mib(rss), mib(peak), floatSpread(rssWarm, "%.1f"), mib(int64(m.Value("go_gc_heap_live_bytes", nil))), 100*cpu, floatSpread(cpuWarm, "%.1f"))
	return nil
}

// saveProfiles writes a settled replica's heap and goroutine profiles
// into dir.
func saveProfiles(d *fleet.Daemon, dir string) error {
	for _, kind := range []string{"heap", "goroutine"} {
		if err := fetchProfile(d, "/debug/pprof/"+kind, filepath.Join(dir, kind+".pprof")); err != nil {
			return err
		}
	}
	return nil
}

func scale(f []float64, k float64) []float64 {
	out := make([]float64, len(f))
	for i, v := range f {
		out[i] = v * k
	}
	return out
}

// msSpread prints the median of durations and their range, in milliseconds.
func msSpread(d []time.Duration) string {
	s := sorted(d)
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	return fmt.Sprintf("%.0fms [%.0f-%.0f]", ms(median(s)), ms(s[0]), ms(s[len(s)-1]))
}

// secSpread prints the median of durations and their range, in seconds.
func secSpread(d []time.Duration) string {
	s := sorted(d)
	return fmt.Sprintf("%.2fs [%.2f-%.2f]", median(s).Seconds(), s[0].Seconds(), s[len(s)-1].Seconds())
}

// memSample is a replica's memory, read after a forced GC.
type memSample struct {
	rss, peak  int64 // VmRSS, VmHWM
	live       int64 // the heap the forced GC kept
	heapInuse  int64
	stacks     int64
	goroutines int
	// proxyConns is how many TCP connections the replica holds to the
	// proxy-server.
	proxyConns int
	// restCPU is the share of a core the replica used at rest, over
	// restWindow after the sample.
	restCPU float64
}

func (s memSample) String() string {
	return fmt.Sprintf("RSS %.1f MiB (peak %.1f), live heap %.1f MiB, heap in use %.1f MiB, stacks %.1f MiB, %d goroutines",
		mib(s.rss), mib(s.peak), mib(s.live), mib(s.heapInuse), mib(s.stacks), s.goroutines)
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

// memSpread prints the median and range of each figure of the samples.
func memSpread(ss []memSample) string {
	pick := func(f func(memSample) int64) []float64 {
		out := make([]float64, len(ss))
		for i, s := range ss {
			out[i] = mib(f(s))
		}
		return out
	}
	g := make([]float64, len(ss))
	for i, s := range ss {
		g[i] = float64(s.goroutines)
	}
	return fmt.Sprintf("RSS %s MiB (peak %s), live heap %s MiB, stacks %s MiB, goroutines %s",
		floatSpread(pick(func(s memSample) int64 { return s.rss }), "%.1f"), floatSpread(pick(func(s memSample) int64 { return s.peak }), "%.1f"),
		floatSpread(pick(func(s memSample) int64 { return s.live }), "%.1f"), floatSpread(pick(func(s memSample) int64 { return s.stacks }), "%.1f"),
		floatSpread(g, "%.0f"))
}

// sampleMemory lets the replica settle for --replica-settle (its informers
// and pool quiet, the probes on their interval), forces two GCs through
// pprof and reads its RSS and the runtime's figures.
func sampleMemory(ctx context.Context, d *fleet.Daemon) (memSample, error) {
	var s memSample
	// A fixed interval, not a condition: what is measured is the replica
	// at rest, and nothing says when a process's memory has settled.
	select {
	case <-ctx.Done():
		return s, ctx.Err()
	case <-time.After(replicaSettle):
	}
	for range 2 {
		resp, err := http.Get("http://" + d.Address + "/debug/pprof/heap?gc=1")
		if err != nil {
			return s, fmt.Errorf("force a GC: %w", err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
	}
	var err error
	if s.rss, err = d.RSS(); err != nil {
		return s, err
	}
	if s.peak, err = d.PeakRSS(); err != nil {
		return s, err
	}
	m, err := d.Scrape()
	if err != nil {
		return s, err
	}
	s.live = int64(m.Value("go_gc_heap_live_bytes", nil))
	s.heapInuse = int64(m.Value("go_memstats_heap_inuse_bytes", nil))
	s.stacks = int64(m.Value("go_memstats_stack_inuse_bytes", nil))
	s.goroutines = int(m.Value("go_goroutines", nil))
	return s, nil
}

// onDemandFigures is what the on-demand standby measured.
type onDemandFigures struct {
	n                int
	leader, off      memSample
	ready, used      memSample
	closed, released memSample
	first, second    []time.Duration
	closedAfter      time.Duration
	startToReady     time.Duration
	entriesAfterUse  int
}

// onDemand grows the fleet to --replica-ondemand clusters under a leader
// with tunnel.warm: onDemand, samples a standby with the tunnel off, then
// a standby with the pool on demand and the gateway: once ready, after
// --replica-used clusters were read through its gateway (each first
// request dials), and after their entries closed idle.
func (r *replicaRig) onDemand(ctx context.Context) (onDemandFigures, error) {
	f := onDemandFigures{n: replicaOnDemand}
	fmt.Printf("== %d clusters, tunnel.warm: onDemand (idleTimeout %s)\n", f.n, replicaIdle)
	gw, err := r.gatewaySide(ctx)
	if err != nil {
		return f, err
	}
	leader, err := r.startLeader(ctx, r.conf(config.WarmOnDemand))
	if err != nil {
		return f, err
	}
	defer func() { _ = leader.Stop() }()
	from := r.built
	grew, err := r.grow(ctx, f.n)
	if err != nil {
		return f, err
	}
	start := time.Now()
	if err := r.waitConverged(ctx, leader, f.n, false); err != nil {
		return f, err
	}
	fmt.Printf("fleet: grown to %d clusters in %s (%.0f clusters/s); the leader (tunnel.warm: onDemand) had their profiles %s later\n",
		f.n, grew.Round(10*time.Millisecond), float64(f.n-from)/grew.Seconds(), time.Since(start).Round(10*time.Millisecond))
	if f.leader, err = sampleMemory(ctx, leader); err != nil {
		return f, err
	}
	off, _, err := r.startTimed(ctx, r.conf(""), 0, nil)
	if err != nil {
		return f, err
	}
	f.off, err = sampleMemory(ctx, off)
	if stopErr := off.Stop(); err == nil && stopErr != nil {
		err = stopErr
	}
	if err != nil {
		return f, err
	}
	conf := r.conf(config.WarmOnDemand)
	conf.Gateway = gw.conf
	d, run, err := r.startTimed(ctx, conf, 0, nil)
	if err != nil {
		return f, err
	}
	defer func() { _ = d.Stop() }()
	f.startToReady = run.took
	if f.ready, err = sampleMemory(ctx, d); err != nil {
		return f, err
	}
	if err := r.use(ctx, d, gw, &f); err != nil {
		return f, err
	}
	printOnDemand(f)
	return f, nil
}

// use reads one object of each of the first --replica-used clusters
// through the standby's gateway, twice (the first request dials the
// entry, the second finds it warm), samples the standby, waits for every
// entry to close idle and samples it again.
func (r *replicaRig) use(ctx context.Context, d *fleet.Daemon, gw replicaGateway, f *onDemandFigures) error {
	get := func(i int) (time.Duration, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, gw.url+"/"+replicaName(i)+gatewaySmallPath, nil)
		if err != nil {
			return 0, err
		}
		req.Header.Set("Authorization", "Bearer "+gw.userToken)
		start := time.Now()
		resp, err := gw.client.RoundTrip(req)
		if err != nil {
			return 0, err
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return 0, fmt.Errorf("GET %s through the gateway: %s: %.200s", replicaName(i), resp.Status, body)
		}
		return time.Since(start), nil
	}
	var err error
	if f.first, err = timeAll(replicaUsed, get); err != nil {
		return err
	}
	if f.second, err = timeAll(replicaUsed, get); err != nil {
		return err
	}
	last := time.Now()
	m, err := d.Scrape()
	if err != nil {
		return err
	}
	f.entriesAfterUse = int(m.Value("hubsync_tunnel_entries", testutil.Labels{"state": "ready"}))
	if f.used, err = sampleMemory(ctx, d); err != nil {
		return err
	}
	err = testutil.Poll(ctx, time.Minute+replicaIdle, 50*time.Millisecond, func() error {
		m, err := d.Scrape()
		if err != nil {
			return err
		}
		if n := m.Value("hubsync_tunnel_entries", nil); n > 0 {
			return fmt.Errorf("%.0f entries open", n)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("entries dialed on demand never closed: %w", err)
	}
	f.closedAfter = time.Since(last)
	if f.closed, err = sampleMemory(ctx, d); err != nil {
		return err
	}
	// A closed connection stays reachable from its HTTP/2 health-check
	// timer until the timer fires: x/net's read loop does not stop it on
	// the way out, and the pool sets ReadIdleTimeout to 30s.
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(replicaRelease):
	}
	f.released, err = sampleMemory(ctx, d)
	return err
}

// timeAll runs get for 0..n-1 from 10 goroutines and returns each
// request's time, sorted.
func timeAll(n int, get func(int) (time.Duration, error)) ([]time.Duration, error) {
	out := make([]time.Duration, n)
	var mu sync.Mutex
	err := parallel(n, 10, func(i int) error {
		d, err := get(i)
		mu.Lock()
		out[i] = d
		mu.Unlock()
		return err
	})
	slices.Sort(out)
	return out, err
}

func printOnDemand(f onDemandFigures) {
	fmt.Printf("  the leader (its syncer's caches and the bus too): %s\n", f.leader)
	fmt.Printf("  a standby with the tunnel off: %s\n", f.off)
	fmt.Printf("  a standby on demand, with the gateway: /readyz 200 %.2fs after process start; %s (%.2fx the tunnel-off standby's RSS)\n",
		f.startToReady.Seconds(), f.ready, float64(f.ready.rss)/float64(f.off.rss))
	fmt.Printf("  %d clusters read through its gateway, 10 at a time: first GET (dials on demand) p50 %s p99 %s; second GET (warm) p50 %s p99 %s; then %d entries ready\n",
		replicaUsed, quantile(f.first, 50), quantile(f.first, 99), quantile(f.second, 50), quantile(f.second, 99), f.entriesAfterUse)
	fmt.Printf("    %s: +%.1f MiB over ready, %.0f KiB of RSS and %.0f KiB of live heap per entry in use\n", f.used,
		mib(f.used.rss-f.ready.rss), float64(f.used.rss-f.ready.rss)/1024/float64(replicaUsed), float64(f.used.live-f.ready.live)/1024/float64(replicaUsed))
	fmt.Printf("  every entry closed %.1fs after the last request (idleTimeout %s); then %s\n", f.closedAfter.Seconds(), replicaIdle, f.closed)
	fmt.Printf("    %s later (the closed connections' HTTP/2 health-check timers, 30s, have fired): %s\n", replicaRelease, f.released)
}

// printSizing states the memory a replica needs, from the figures above:
// the highest peak RSS seen (a memory limit must hold it), and what each
// cluster in use adds on demand, taken from the warm entries' cost (the
// conservative figure: the on-demand standby's first entries grow into
// heap its informers' lists left free).
func printSizing(n int, warm replicaMemory, od onDemandFigures) {
	peak := func(ss ...memSample) float64 {
		var p int64
		for _, s := range ss {
			p = max(p, s.peak)
		}
		return mib(p)
	}
	rss := func(ss []memSample) float64 {
		v := make([]float64, len(ss))
		for i, s := range ss {
			v[i] = mib(s.rss)
		}
		return median(sorted64(v))
	}
	perEntry := median(sorted64(warm.perEntry)) / 1024
	fmt.Printf("sizing (RSS at rest, peak RSS in brackets): %d clusters warm need %.0f MiB (%.0f) on a standby and %.0f MiB (%.0f) on the leader; "+
		"%d clusters on demand fit in %.0f MiB (%.0f) on a standby and %.0f MiB (%.0f) on the leader, plus about %.0f KiB per cluster in use at once\n",
		n, rss(warm.warm), peak(warm.warm...), mib(warm.leader.rss), peak(warm.leader),
		od.n, mib(od.ready.rss), peak(od.ready, od.used, od.closed, od.released), mib(od.leader.rss), peak(od.leader), perEntry)
	fmt.Printf("  memory per replica: a standby needs about %.0f MiB + %.0f KiB per warm cluster (RSS at rest); the leader adds its syncer's caches (%.0f MiB at %d clusters)\n",
		rss(warm.off), perEntry, mib(warm.leader.rss)-rss(warm.warm), n)
}

// replicaGateway is what the on-demand standby's gateway needs and its
// client uses.
type replicaGateway struct {
	conf      config.Gateway
	url       string
	userToken string
	client    http.RoundTripper
}

// gatewaySide prepares the gateway's reads: a hub identity, a ConfigMap
// on the managed API server that its impersonated name may read, and the
// gateway's serving certificate. The impersonator and its token Secret in
// every cluster's namespace are the rig's.
func (r *replicaRig) gatewaySide(ctx context.Context) (replicaGateway, error) {
	var gw replicaGateway
	m := r.reach.managed
	mg, err := kubernetes.NewForConfig(m.Config)
	if err != nil {
		return gw, err
	}
	userToken, id, err := benchHubIdentity(ctx, r.hub.Kube)
	if err != nil {
		return gw, err
	}
	gw.userToken = userToken
	if _, err := m.ServiceAccountToken(ctx, gatewayNS, "direct-reader", time.Hour); err != nil {
		return gw, err
	}
	if err := grantGatewayReaders(ctx, mg, gateway.ImpersonatedUser(id), "direct-reader"); err != nil {
		return gw, err
	}
	small := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "small"}, Data: map[string]string{"key": "value"}}
	if _, err := mg.CoreV1().ConfigMaps(gatewayNS).Create(ctx, small, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return gw, err
	}
	return gw, r.gatewayServing(&gw)
}

// gatewayServing makes the gateway's serving certificate and address, and
// the client that trusts it.
func (r *replicaRig) gatewayServing(gw *replicaGateway) error {
	ca, certFile, keyFile, err := gatewayCert(r.reach.dir, "bench-replicas-ca")
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	gw.url = "https://" + addr
	noDrain := metav1.Duration{}
	gw.conf = config.Gateway{Enabled: true, Listen: addr, URL: gw.url, TLS: config.GatewayTLS{CertFile: certFile, KeyFile: keyFile},
		Drain: config.GatewayDrain{Delay: &noDrain}}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.PEM)
	gw.client = &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}, ForceAttemptHTTP2: true}
	return nil
}

// replicasOnFreshHub runs the replica figures on a control plane of their
// own: the full run's hub holds a fleet whose namespaces bind a {} set,
// which would give every cluster of the replica fleet profiles there too.
func replicasOnFreshHub(ctx context.Context, binary string, logs io.Writer) error {
	fmt.Println("\n== replicas: starting a kube-apiserver + etcd of their own")
	cp, err := controlplane.Start(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = cp.Stop() }()
	return benchReplicas(ctx, cp, binary, logs)
}
