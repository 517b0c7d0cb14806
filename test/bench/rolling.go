package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	clusterv1 "open-cluster-management.io/api/cluster/v1"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/gateway"
	"github.com/hubsync/hubsync/test/controlplane"
	"github.com/hubsync/hubsync/test/fleet"
	"github.com/hubsync/hubsync/test/konnectivity"
	"github.com/hubsync/hubsync/test/lb"
	"github.com/hubsync/hubsync/test/testutil"
)

// Rolling-update figures (flags).
var (
	rollingOnly    bool
	rollingRepeats int
)

const (
	// The managed API servers' addresses (the tunnel bench's is
	// 127.0.0.21, the gateway's .22, the strangers' .24, the replicas'
	// .25).
	rollingIP1, rollingIP2 = "127.0.0.26", "127.0.0.27"
	// rollingLabel selects the two clusters for every replica's pool.
	rollingLabel = "rolling-bench"
	// rollingReplicas run at once, as a Deployment's replicas.
	rollingReplicas = 3
	// The load: rollingClients clients (half HTTP/2, half HTTP/1.1), each
	// sending a GET every rollingEvery through the balancer.
	rollingClients = 4
	rollingEvery   = 50 * time.Millisecond
	// rollingDrainDelay is gateway.drain.delay: test/lb follows /readyz
	// within its 100 ms check interval, where a Service's endpoints take
	// the readiness probe's period (the shipped default is 5s).
	rollingDrainDelay = time.Second
	// rollingWait bounds a replica's start to ready, a stop and a
	// handover.
	rollingWait = 2 * time.Minute
	// rollingPoll is how often the replicas' hubsync_leader is read while
	// a handover is timed.
	rollingPoll = 20 * time.Millisecond
	// rollingAfter GETs must succeed after a phase before it is counted,
	// so that the new replicas have served some.
	rollingAfter = 40
)

func rollingCluster(i int) string { return fmt.Sprintf("rolling-c%d", i+1) }

// rollingRig is what the rolling updates run on: the hub with hubsync's
// identity, two proxy-servers behind one address, two managed API
// servers with their agents, an external NATS, the balancer in front of
// the replicas and the replicas themselves, oldest first.
type rollingRig struct {
	binary    string
	hub       *fleet.Hub
	asHubsync *rest.Config
	logs      io.Writer
	conf      config.Config
	bal       *lb.Balancer
	url       string // the balancer's, which clients use
	roots     *x509.CertPool
	userToken string
	clusters  []string
	closers   []func()

	live    []*fleet.Daemon
	started int
	// names numbers the replicas in the order they started, as the log
	// does; pools holds what each stopped replica's pool held.
	names map[*fleet.Daemon]int
	pools []poolCheck
	// From process start to /readyz 200: first is the first replica's
	// (it takes the lease and syncs its caches), ready every other's.
	first time.Duration
	ready []time.Duration
}

// poolCheck is how many of the clusters one replica's pool held just
// before it was stopped: every replica serves every cluster, so fewer
// is a replica that answers 404 for a cluster while it is ready.
type poolCheck struct {
	replica, entries int
}

// rollingRun is what one rolling update measured.
type rollingRun struct {
	took      time.Duration
	gets      loadCounts
	handovers []time.Duration // SIGTERM of the leader -> another leads
	stops     []time.Duration // SIGTERM -> the process exited
}

// killRun is what one SIGKILL of the leader measured.
type killRun struct {
	at       time.Time
	handover time.Duration
	inFlight int64 // GETs in flight on any replica at the kill
	gets     loadCounts
}

// benchRolling measures rolling updates of hubsync replicas with the
// real binary: three replicas with leader election (the default lease
// timings) behind a readiness-gated round-robin balancer, over two
// proxy-servers behind one address and two managed API servers, with
// an external NATS. While clients GET through the balancer, each repeat
// replaces every replica in turn as a StatefulSet does (the oldest
// SIGTERMed, then its replacement started) and then SIGKILLs the leader and replaces it. It prints the
// failed GETs of each rolling update and kill, the leader handover after
// SIGTERM (lease released) and after SIGKILL (lease left to expire), and
// a new replica's time from process start to /readyz 200.
func benchRolling(ctx context.Context, cp *controlplane.ControlPlane, binary string, logs io.Writer) error {
	fmt.Printf("\n== rolling updates: %d replicas (leader election, default lease: leaseDuration %s, renewDeadline %s, retryPeriod %s) "+
		"behind a round-robin balancer gated on /readyz (checked every 100 ms), gateway.drain.delay %s; 2 proxy-servers (--server-count=2) "+
		"behind one address, 2 managed kube-apiservers with agents, external NATS (in-process nats-server); %d clients (half HTTP/2, half HTTP/1.1) "+
		"each GET a ConfigMap every %s through the balancer, alternating clusters\n",
		rollingReplicas, config.DefaultLeaseDuration, config.DefaultRenewDeadline, config.DefaultRetryPeriod, rollingDrainDelay,
		rollingClients, rollingEvery)
	begin := time.Now()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	r, err := newRollingRig(ctx, cp, binary, logs)
	if err != nil {
		return err
	}
	defer r.close()
	if err := r.startFleet(ctx); err != nil {
		return err
	}
	var l rollingLoad
	loadCtx, stopLoad := context.WithCancel(ctx)
	defer func() { stopLoad(); l.wg.Wait() }()
	l.run(loadCtx, r)
	var runs []rollingRun
	var kills []killRun
	for i := range rollingRepeats {
		run, err := r.rollingUpdate(ctx, &l)
		if err != nil {
			return fmt.Errorf("rolling update %d: %w", i+1, err)
		}
		run.print(i)
		runs = append(runs, run)
		kill, err := r.killLeader(ctx, &l)
		if err != nil {
			return fmt.Errorf("SIGKILL of the leader %d: %w", i+1, err)
		}
		kill.print(i)
		kills = append(kills, kill)
	}
	printRolling(runs, kills, r)
	fmt.Printf("rolling-update figures took %s\n", time.Since(begin).Round(time.Second))
	return nil
}

// newRollingRig starts everything but the replicas. On an error, what
// it started is stopped.
func newRollingRig(ctx context.Context, cp *controlplane.ControlPlane, binary string, logs io.Writer) (*rollingRig, error) {
	hub, err := fleet.NewHub(cp.Config)
	if err != nil {
		return nil, err
	}
	r := &rollingRig{binary: binary, hub: hub, logs: logs, names: map[*fleet.Daemon]int{}}
	if err := r.setUp(ctx, cp); err != nil {
		r.close()
		return nil, err
	}
	return r, nil
}

// setUp starts the proxy-servers, the managed API servers with their
// agents and NATS, and prepares the hub and the replicas' configuration.
func (r *rollingRig) setUp(ctx context.Context, cp *controlplane.ControlPlane) error {
	dir, err := os.MkdirTemp("", "hubsync-bench-rolling-")
	if err != nil {
		return err
	}
	r.closers = append(r.closers, func() { _ = os.RemoveAll(dir) })
	if r.asHubsync, err = hubsyncIdentity(ctx, cp); err != nil {
		return err
	}
	tc, servers, agents, err := r.proxyPair(ctx, dir)
	if err != nil {
		return err
	}
	userToken, id, err := benchHubIdentity(ctx, r.hub.Kube)
	if err != nil {
		return err
	}
	r.userToken = userToken
	for i, ip := range []string{rollingIP1, rollingIP2} {
		if tc.ManagedServiceAccount, err = r.join(ctx, cp, rollingCluster(i), ip, servers[0], agents, gateway.ImpersonatedUser(id)); err != nil {
			return err
		}
	}
	natsURL, err := r.startNATS(dir)
	if err != nil {
		return err
	}
	return r.configure(ctx, dir, tc, natsURL)
}

// proxyPair runs two proxy-servers as OCM cluster-proxy deploys its
// replicas (--server-count=2), behind one round-robin address for
// clients and one for agents, and returns the tunnel configuration that
// reaches them through the clients' address, with the shipped probe
// interval and backoff.
func (r *rollingRig) proxyPair(ctx context.Context, dir string) (config.Tunnel, []*konnectivity.Server, string, error) {
	servers, err := konnectivity.StartServers(ctx, dir, 2)
	if err != nil {
		return config.Tunnel{}, nil, "", err
	}
	r.closers = append(r.closers, func() {
		for _, s := range servers {
			s.Kill()
		}
	})
	balance := func(addrs ...string) (*lb.Balancer, error) {
		var bs []lb.Backend
		for _, a := range addrs {
			bs = append(bs, lb.Backend{Addr: a})
		}
		b := lb.New(lb.Options{}, bs...)
		if err := b.Start(ctx); err != nil {
			return nil, err
		}
		r.closers = append(r.closers, func() { _ = b.Close() })
		return b, nil
	}
	front, err := balance(servers[0].ClientAddress, servers[1].ClientAddress)
	if err != nil {
		return config.Tunnel{}, nil, "", err
	}
	agents, err := balance(servers[0].AgentAddress, servers[1].AgentAddress)
	if err != nil {
		return config.Tunnel{}, nil, "", err
	}
	tc := servers[0].TunnelConfig("")
	tc.Konnectivity.Address = front.Addr()
	tc.ProbeInterval, tc.ProbeTimeout, tc.Backoff = metav1.Duration{}, metav1.Duration{}, config.Retry{}
	tc.ClusterSelector = &metav1.LabelSelector{MatchLabels: map[string]string{rollingLabel: "yes"}}
	return tc, servers, agents.Addr(), nil
}

// join starts a managed API server named name on ip and its agent, which
// reaches both proxy-servers through their agents' address, and joins it
// to the hub as the cluster name: its impersonating ManagedServiceAccount
// granted with deploy/gateway/managed-cluster-rbac.yaml and its token on
// the hub, the hub identity allowed to read the ConfigMap the clients
// GET. It returns the ManagedServiceAccount's name.
func (r *rollingRig) join(ctx context.Context, cp *controlplane.ControlPlane, name, ip string, srv *konnectivity.Server, agents, user string) (string, error) {
	m, err := controlplane.StartManaged(ctx, cp.EtcdURL(), name, ip)
	if err != nil {
		return "", err
	}
	r.closers = append(r.closers, func() { _ = m.Close() })
	agent, err := srv.StartAgentVia(agents, name+"-agent", ip)
	if err != nil {
		return "", err
	}
	r.closers = append(r.closers, agent.Kill)
	mg, err := kubernetes.NewForConfig(m.Config)
	if err != nil {
		return "", err
	}
	msaNS, msa, err := applyGatewayRBAC(ctx, mg)
	if err != nil {
		return "", err
	}
	token, err := m.ServiceAccountToken(ctx, msaNS, msa, 2*time.Hour)
	if err != nil {
		return "", err
	}
	if err := readable(ctx, mg, m, user); err != nil {
		return "", err
	}
	if err := r.hub.Namespace(ctx, name); err != nil {
		return "", err
	}
	if err := r.hub.PutToken(ctx, name, msa, token, map[string][]byte{"token": []byte(token), "ca.crt": m.CA}); err != nil {
		return "", err
	}
	cfgs := []clusterv1.ClientConfig{{URL: "https://" + m.Address, CABundle: m.CA}}
	if _, err := r.hub.CreateCluster(ctx, fleet.ClusterSpec{Name: name, Labels: map[string]string{rollingLabel: "yes"}, ClientConfigs: cfgs}); err != nil {
		return "", err
	}
	r.clusters = append(r.clusters, name)
	// The full run's later fleet binds a {} set: the clusters go with the
	// section.
	r.closers = append(r.closers, func() { _ = r.hub.DeleteCluster(context.WithoutCancel(ctx), name) })
	return msa, nil
}

// readable lets the hub identity's prefixed name (user) read the small
// ConfigMap the clients GET on the managed API server m (a token request
// makes its namespace).
func readable(ctx context.Context, mg kubernetes.Interface, m *controlplane.Managed, user string) error {
	if _, err := m.ServiceAccountToken(ctx, gatewayNS, "direct-reader", time.Hour); err != nil {
		return err
	}
	if err := grantGatewayReaders(ctx, mg, user, "direct-reader"); err != nil {
		return err
	}
	small := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "small"}, Data: map[string]string{"key": "value"}}
	if _, err := mg.CoreV1().ConfigMaps(gatewayNS).Create(ctx, small, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	return nil
}

// startNATS runs a NATS server with JetStream in this process: the
// replicas' external bus, shared by all of them as in a highly available
// install.
func (r *rollingRig) startNATS(dir string) (string, error) {
	ns, err := natsserver.NewServer(&natsserver.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: dir + "/nats", NoSigs: true})
	if err != nil {
		return "", err
	}
	go ns.Start()
	r.closers = append(r.closers, ns.Shutdown)
	if !ns.ReadyForConnections(20 * time.Second) {
		return "", errors.New("nats-server not ready")
	}
	return ns.ClientURL(), nil
}

// configure starts the replicas' balancer and writes their configuration:
// the gateway behind the balancer, leader election with the default
// lease, the external bus.
func (r *rollingRig) configure(ctx context.Context, dir string, tc config.Tunnel, natsURL string) error {
	ca, certFile, keyFile, err := gatewayCert(dir, "bench-rolling-ca")
	if err != nil {
		return err
	}
	r.roots = x509.NewCertPool()
	r.roots.AppendCertsFromPEM(ca.PEM)
	r.bal = lb.New(lb.Options{})
	if err := r.bal.Start(ctx); err != nil {
		return err
	}
	r.closers = append(r.closers, func() { _ = r.bal.Close() })
	r.url = "https://" + r.bal.Addr()
	r.conf.Tunnel = tc
	r.conf.LeaderElection.Enabled = true // the default lease timings
	r.conf.Bus.URLs = []string{natsURL}
	r.conf.Gateway = config.Gateway{Enabled: true, URL: r.url, TLS: config.GatewayTLS{CertFile: certFile, KeyFile: keyFile},
		Drain: config.GatewayDrain{Delay: &metav1.Duration{Duration: rollingDrainDelay}}}
	return nil
}

// close stops every replica (SIGTERM, so that the lease is released) and
// what setUp started, in reverse order.
func (r *rollingRig) close() {
	for _, d := range r.live {
		_ = d.Stop()
	}
	r.live = nil
	for i := len(r.closers) - 1; i >= 0; i-- {
		r.closers[i]()
	}
	r.closers = nil
}

// startFleet starts the replicas one after the other, and waits until
// both clusters answer through the balancer.
func (r *rollingRig) startFleet(ctx context.Context) error {
	for range rollingReplicas {
		if _, err := r.startReplica(ctx); err != nil {
			return err
		}
	}
	c := r.client(true)
	defer c.CloseIdleConnections()
	for _, name := range r.clusters {
		err := testutil.Poll(ctx, time.Minute, 100*time.Millisecond, func() error {
			return r.get(ctx, c, name)
		})
		if err != nil {
			return fmt.Errorf("%s through the balancer: %w", name, err)
		}
	}
	fmt.Printf("%d replicas ready (the first, which leads, %.2fs after its start; the others %s); both clusters answer through the balancer\n",
		rollingReplicas, r.first.Seconds(), durationSpread(r.ready))
	return nil
}

// startReplica starts one more replica, times it from process start to
// /readyz 200 and puts it behind the balancer.
func (r *rollingRig) startReplica(ctx context.Context) (*fleet.Daemon, error) {
	conf := r.conf
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	conf.Gateway.Listen = ln.Addr().String()
	_ = ln.Close()
	r.started++
	start := time.Now()
	d, err := fleet.StartDaemon(ctx, r.binary, r.asHubsync, conf, prefixLines(r.logs, fmt.Sprintf("[replica %d] ", r.started)))
	if err != nil {
		return nil, err
	}
	rctx, cancel := context.WithTimeout(ctx, rollingWait)
	defer cancel()
	select {
	case at := <-d.ReadyAt(rctx):
		if r.started == 1 {
			r.first = at.Sub(start)
		} else {
			r.ready = append(r.ready, at.Sub(start))
		}
	case err := <-d.Done():
		return nil, fmt.Errorf("replica %d exited before it was ready: %v", r.started, err)
	case <-rctx.Done():
		_ = d.Stop()
		return nil, fmt.Errorf("replica %d not ready within %s", r.started, rollingWait)
	}
	r.bal.Add(lb.Backend{Addr: conf.Gateway.Listen, ReadyURL: "http://" + d.Address + "/readyz"})
	r.live = append(r.live, d)
	r.names[d] = r.started
	return d, nil
}

// checkPool records how many of the clusters d's pool holds, in any
// state.
func (r *rollingRig) checkPool(d *fleet.Daemon) {
	m, err := d.Scrape()
	if err != nil {
		return
	}
	n := 0
	for _, state := range []string{"connecting", "ready", "failing"} {
		n += int(m.Value("hubsync_tunnel_entries", testutil.Labels{"state": state}))
	}
	r.pools = append(r.pools, poolCheck{replica: r.names[d], entries: n})
}

// rollingUpdate replaces every replica in turn, oldest first, as the
// chart's StatefulSet's rolling update does (one pod at a time: the old
// one gone before its replacement starts), and counts the GETs from
// its start until rollingAfter more have succeeded after the last
// replacement.
func (r *rollingRig) rollingUpdate(ctx context.Context, l *rollingLoad) (rollingRun, error) {
	var run rollingRun
	l.reset()
	start := time.Now()
	for range rollingReplicas {
		led, handover, stop, err := r.replace(ctx)
		if err != nil {
			return run, err
		}
		if led {
			run.handovers = append(run.handovers, handover)
		}
		run.stops = append(run.stops, stop)
	}
	run.took = time.Since(start)
	if err := l.waitMore(ctx, rollingAfter); err != nil {
		return run, err
	}
	run.gets = l.reset()
	return run, nil
}

// replace stops the oldest replica with SIGTERM and, once it has
// exited, starts its replacement and waits until it is ready. When the
// oldest led, it times the handover: from the SIGTERM to another replica
// reporting hubsync_leader 1. It returns whether the oldest led, the
// handover, and how long the oldest took to exit.
func (r *rollingRig) replace(ctx context.Context) (led bool, handover, took time.Duration, err error) {
	led, handover, took, err = r.stopOldest(ctx)
	if err != nil {
		return led, handover, took, err
	}
	_, err = r.startReplica(ctx)
	return led, handover, took, err
}

// stopOldest stops the oldest replica with SIGTERM; see replace.
func (r *rollingRig) stopOldest(ctx context.Context) (bool, time.Duration, time.Duration, error) {
	old := r.live[0]
	r.live = r.live[1:]
	r.checkPool(old)
	led := old.Leading()
	type stopped struct {
		took time.Duration
		err  error
	}
	done := make(chan stopped, 1)
	sigterm := time.Now()
	go func() {
		err := old.Stop()
		done <- stopped{time.Since(sigterm), err}
	}()
	var handover time.Duration
	var err error
	if led {
		handover, err = r.waitLeader(ctx, sigterm)
	}
	s := <-done
	r.bal.Remove(old.Conf.Gateway.Listen)
	if s.err != nil {
		return led, handover, s.took, fmt.Errorf("a replica stopped with SIGTERM: %w", s.err)
	}
	return led, handover, s.took, err
}

// waitLeader waits until a live replica reports hubsync_leader 1 and
// returns the time since from.
func (r *rollingRig) waitLeader(ctx context.Context, from time.Time) (time.Duration, error) {
	var at time.Time
	err := testutil.Poll(ctx, rollingWait, rollingPoll, func() error {
		for _, d := range r.live {
			if d.Leading() {
				at = time.Now()
				return nil
			}
		}
		return errors.New("no replica leads")
	})
	if err != nil {
		return 0, fmt.Errorf("leader handover: %w", err)
	}
	return at.Sub(from), nil
}

// killLeader SIGKILLs the leader, as a lost node or the OOM killer would
// (no lease release, no drain), times the handover, which waits for the
// lease to expire, and starts a replica in its place. The balancer drops
// the killed replica when its /readyz check fails.
func (r *rollingRig) killLeader(ctx context.Context, l *rollingLoad) (killRun, error) {
	var run killRun
	if _, err := r.waitLeader(ctx, time.Now()); err != nil {
		return run, err
	}
	leader := -1
	for i, d := range r.live {
		if d.Leading() {
			leader = i
		}
	}
	if leader < 0 {
		return run, errors.New("no replica leads")
	}
	d := r.live[leader]
	r.live = append(r.live[:leader:leader], r.live[leader+1:]...)
	r.checkPool(d)
	l.reset()
	run.inFlight = l.inFlight.Load()
	run.at = time.Now()
	if err := d.Kill(); err != nil {
		return run, err
	}
	handover, err := r.waitLeader(ctx, run.at)
	if err != nil {
		return run, err
	}
	run.handover = handover
	r.bal.Remove(d.Conf.Gateway.Listen)
	if _, err := r.startReplica(ctx); err != nil {
		return run, err
	}
	if err := l.waitMore(ctx, rollingAfter); err != nil {
		return run, err
	}
	run.gets = l.reset()
	return run, nil
}

// client is a gateway client through the balancer, over HTTP/2 or
// HTTP/1.1 only.
func (r *rollingRig) client(h2 bool) *http.Client {
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: r.roots}, ForceAttemptHTTP2: h2}
	if !h2 {
		tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
	}
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

// get GETs the small ConfigMap of cluster through the balancer.
func (r *rollingRig) get(ctx context.Context, c *http.Client, cluster string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.url+"/"+cluster+gatewaySmallPath, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+r.userToken)
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %.200s", resp.Status, bytes.TrimSpace(body))
	}
	return nil
}

// rollingLoad is the clients: each sends a GET every rollingEvery
// through the balancer, alternating clusters, until stopped, and counts
// what succeeded (with its latency) and what failed.
type rollingLoad struct {
	ok, inFlight atomic.Int64
	mu           sync.Mutex
	counts       loadCounts
	wg           sync.WaitGroup
}

// loadCounts is what the clients saw since the last reset.
type loadCounts struct {
	latencies []time.Duration // of the GETs that succeeded
	failures  []failure
}

// failure is a GET that failed.
type failure struct {
	at   time.Time
	what string
}

func (c loadCounts) total() int { return len(c.latencies) + len(c.failures) }

// latency prints the successful GETs' p50, p99 and maximum.
func (c loadCounts) latency() string {
	if len(c.latencies) == 0 {
		return "none succeeded"
	}
	s := sorted(c.latencies)
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	return fmt.Sprintf("p50 %.1f ms, p99 %.1f ms, max %.0f ms", ms(percentile(s, 50)), ms(percentile(s, 99)), ms(s[len(s)-1]))
}

func (l *rollingLoad) run(ctx context.Context, r *rollingRig) {
	for i := range rollingClients {
		c := r.client(i%2 == 0)
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			defer c.CloseIdleConnections()
			tick := time.NewTicker(rollingEvery)
			defer tick.Stop()
			for n := i; ; n++ {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				name := r.clusters[n%len(r.clusters)]
				l.inFlight.Add(1)
				start := time.Now()
				err := r.get(ctx, c, name)
				took := time.Since(start)
				l.inFlight.Add(-1)
				if ctx.Err() != nil {
					return
				}
				l.count(i, name, took, err)
			}
		}()
	}
}

func (l *rollingLoad) count(client int, cluster string, took time.Duration, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err == nil {
		l.ok.Add(1)
		l.counts.latencies = append(l.counts.latencies, took)
		return
	}
	proto := "HTTP/2"
	if client%2 == 1 {
		proto = "HTTP/1.1"
	}
	l.counts.failures = append(l.counts.failures, failure{at: time.Now(), what: fmt.Sprintf("client %d (%s) %s after %s: %v",
		client, proto, cluster, took.Round(time.Millisecond), err)})
}

// reset returns what the clients saw since the last reset and starts
// again.
func (l *rollingLoad) reset() loadCounts {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.counts
	l.counts = loadCounts{}
	return c
}

// waitMore waits until n more GETs have succeeded.
func (l *rollingLoad) waitMore(ctx context.Context, n int64) error {
	from := l.ok.Load()
	err := testutil.Poll(ctx, time.Minute, 20*time.Millisecond, func() error {
		if got := l.ok.Load() - from; got < n {
			return fmt.Errorf("%d of %d GETs succeeded", got, n)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("GETs through the balancer: %w", err)
	}
	return nil
}

func (run rollingRun) print(i int) {
	fmt.Printf("rolling update %d/%d: %d replicas replaced in %.1fs; %d GETs, %d failed (%s); leader handovers after SIGTERM %s; SIGTERM -> exit %s\n",
		i+1, rollingRepeats, rollingReplicas, run.took.Seconds(), run.gets.total(), len(run.gets.failures), run.gets.latency(),
		secList(run.handovers), secList(run.stops))
	printFailures(run.gets.failures, time.Time{})
}

func (run killRun) print(i int) {
	fmt.Printf("leader SIGKILLed %d/%d: another replica led %.2fs later; %d GETs until a replacement served, %d failed (%s); %d in flight on any replica at the kill\n",
		i+1, rollingRepeats, run.handover.Seconds(), run.gets.total(), len(run.gets.failures), run.gets.latency(), run.inFlight)
	printFailures(run.gets.failures, run.at)
}

// printFailures prints the first failures, for diagnosis, with the time
// each failed at, or its time since from when from is set.
func printFailures(failures []failure, from time.Time) {
	const most = 8
	for i, f := range failures {
		if i == most {
			fmt.Printf("    ... and %d more\n", len(failures)-most)
			return
		}
		at := f.at.Format("15:04:05.000")
		if !from.IsZero() {
			at = fmt.Sprintf("%d ms after the kill", f.at.Sub(from).Milliseconds())
		}
		fmt.Printf("    %s: %s\n", at, f.what)
	}
}

func secList(d []time.Duration) string {
	if len(d) == 0 {
		return "none"
	}
	parts := make([]string, len(d))
	for i, v := range d {
		parts[i] = fmt.Sprintf("%.2fs", v.Seconds())
	}
	return strings.Join(parts, " ")
}

// printRolling prints the figures over every repeat against their goals.
func printRolling(runs []rollingRun, kills []killRun, r *rollingRig) {
	var failed, killFailed, inFlight []float64
	var total int64
	var handovers, stops, killHandovers []time.Duration
	for _, run := range runs {
		failed = append(failed, float64(len(run.gets.failures)))
		total += int64(run.gets.total())
		handovers = append(handovers, run.handovers...)
		stops = append(stops, run.stops...)
	}
	var latest time.Duration // the last failure after a kill
	for _, k := range kills {
		killFailed = append(killFailed, float64(len(k.gets.failures)))
		inFlight = append(inFlight, float64(k.inFlight))
		killHandovers = append(killHandovers, k.handover)
		for _, f := range k.gets.failures {
			latest = max(latest, f.at.Sub(k.at))
		}
	}
	verdict := "met"
	if sorted64(failed)[len(failed)-1] > 0 {
		verdict = "NOT MET"
	}
	fmt.Printf("failed GETs per rolling update (every replica replaced as a StatefulSet does: the oldest SIGTERMed, then its replacement started): %s over %d repeats, %d GETs in all; goal 0: %s\n",
		floatSpread(failed, "%.0f"), len(runs), total, verdict)
	// client-go retries a released lease every retryPeriod, jittered by
	// up to 1.2x, so a standby takes it within 2.2 retry periods.
	bound := time.Duration(2.2 * float64(config.DefaultRetryPeriod))
	fmt.Printf("leader handover after SIGTERM (the lease released), SIGTERM -> another replica reports hubsync_leader 1: %s over %d handovers; "+
		"bound %.1fs (retryPeriod %s + client-go's jitter of up to 1.2x)\n",
		durationSpread(handovers), len(handovers), bound.Seconds(), config.DefaultRetryPeriod)
	fmt.Printf("leader handover after SIGKILL (the lease left to expire, leaseDuration %s): %s over %d repeats\n",
		config.DefaultLeaseDuration, durationSpread(killHandovers), len(kills))
	fmt.Printf("a new replica joining (2 clusters warm through the proxy-servers, a standby), process start -> /readyz 200: %s over %d starts\n",
		durationSpread(r.ready), len(r.ready))
	fmt.Printf("a SIGTERMed replica, SIGTERM -> exit (drain delay %s, then the drain): %s over %d stops\n",
		rollingDrainDelay, durationSpread(stops), len(stops))
	fmt.Printf("failed GETs when the leader is SIGKILLed: %s over %d repeats, the last %d ms after the kill (GETs in flight on any replica at the kill: %s); "+
		"goal: only those on its connections (in flight, or sent before the client saw them closed or the balancer's check, every 100 ms, dropped it)\n",
		floatSpread(killFailed, "%.0f"), len(kills), latest.Milliseconds(), floatSpread(inFlight, "%.0f"))
	printPools(r.pools, len(r.clusters))
}

// printPools prints the replicas whose pool lacked a cluster when they
// were stopped.
func printPools(pools []poolCheck, clusters int) {
	var short []string
	for _, pc := range pools {
		if pc.entries < clusters {
			short = append(short, fmt.Sprintf("replica %d held %d", pc.replica, pc.entries))
		}
	}
	verdict, detail := "met", ""
	if len(short) > 0 {
		verdict, detail = "NOT MET", " ("+strings.Join(short, ", ")+")"
	}
	fmt.Printf("replicas whose pool lacked one of the %d clusters just before their stop (a ready replica without a cluster answers 404 for it): %d of %d%s; goal 0: %s\n",
		clusters, len(short), len(pools), detail, verdict)
}

// prefixLines writes each line to w with a prefix; io.Discard stays as it
// is.
func prefixLines(w io.Writer, prefix string) io.Writer {
	if w == io.Discard {
		return w
	}
	return &lineWriter{w: w, prefix: prefix}
}

// lineWriter prefixes each complete line written to it.
type lineWriter struct {
	mu     sync.Mutex
	w      io.Writer
	prefix string
	buf    []byte
}

func (lw *lineWriter) Write(p []byte) (int, error) {
	lw.mu.Lock()
	defer lw.mu.Unlock()
	lw.buf = append(lw.buf, p...)
	for {
		i := bytes.IndexByte(lw.buf, '\n')
		if i < 0 {
			return len(p), nil
		}
		if _, err := io.WriteString(lw.w, lw.prefix+string(lw.buf[:i+1])); err != nil {
			return len(p), err
		}
		lw.buf = lw.buf[i+1:]
	}
}

// durationSpread prints the median of durations and their range, in
// seconds; "none" for no durations.
func durationSpread(d []time.Duration) string {
	if len(d) == 0 {
		return "none"
	}
	s := sorted(d)
	return fmt.Sprintf("%.2fs [%.2f-%.2f]", median(s).Seconds(), s[0].Seconds(), s[len(s)-1].Seconds())
}
