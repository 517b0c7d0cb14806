package gateway

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/events"
	"github.com/hubsync/hubsync/test/fleet"
	"github.com/hubsync/hubsync/test/konnectivity"
	"github.com/hubsync/hubsync/test/kubelet"
	"github.com/hubsync/hubsync/test/lb"
	"github.com/hubsync/hubsync/test/testutil"
)

const cluster2 = "gw-c2"

// runPrefix names what one run of a test creates, so that repeated runs
// against the same hub (-count) do not collide.
func runPrefix() string { return fmt.Sprintf("r%d-", time.Now().UnixNano()%1e6) }

// replicaSet is several hubsync replicas with leader election behind a
// round-robin TCP balancer that sends new connections only to replicas
// whose /readyz answers 200, as a Service in front of a Deployment does.
type replicaSet struct {
	t    *testing.T
	s    *setup
	conf config.Config
	lb   *lb.Balancer
	mu   sync.Mutex
	live []*fleet.Daemon
	n    int
}

// startReplica starts one more replica, waits until it is ready and puts
// it behind the balancer.
func (r *replicaSet) startReplica(ctx context.Context) *fleet.Daemon {
	r.t.Helper()
	conf := r.conf
	conf.Gateway.Listen = freeAddr(r.t)
	r.n++
	d, err := fleet.StartDaemon(ctx, env.hubsync, env.hub.Config, conf, &prefixed{w: r.s.logs, prefix: fmt.Sprintf("[replica %d] ", r.n)})
	if err != nil {
		r.t.Fatal(err)
	}
	if err := d.WaitReady(ctx, 2*time.Minute); err != nil {
		r.t.Fatal(err)
	}
	r.lb.Add(lb.Backend{Addr: conf.Gateway.Listen, ReadyURL: "http://" + d.Address + "/readyz"})
	r.mu.Lock()
	r.live = append(r.live, d)
	r.mu.Unlock()
	return d
}

// replace stops the oldest replica with SIGTERM (or SIGKILL), then
// starts its replacement, as the chart's StatefulSet does in a rolling
// update (one pod at a time, the old one gone before the new one starts;
// or a lost node), and returns how long the stop took.
func (r *replicaSet) replace(ctx context.Context, kill bool) time.Duration {
	r.t.Helper()
	defer r.startReplica(ctx)
	r.mu.Lock()
	old := r.live[0]
	r.live = r.live[1:]
	r.mu.Unlock()
	start := time.Now()
	var err error
	if kill {
		err = old.Kill()
	} else {
		err = old.Stop()
	}
	if err != nil {
		r.t.Errorf("stopping a replica: %v", err)
	}
	took := time.Since(start)
	r.lb.Remove(old.Conf.Gateway.Listen)
	return took
}

func (r *replicaSet) stopAll() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, d := range r.live {
		_ = d.Stop()
	}
	r.live = nil
}

// prefixed writes each whole line written to it to w, with a prefix; a
// partial line waits for its end. exec copies a child's output from one
// goroutine, so it needs no lock.
type prefixed struct {
	w       io.Writer
	prefix  string
	pending []byte
}

func (p *prefixed) Write(b []byte) (int, error) {
	p.pending = append(p.pending, b...)
	for {
		line, rest, ok := bytes.Cut(p.pending, []byte("\n"))
		if !ok {
			break
		}
		if _, err := io.WriteString(p.w, p.prefix+string(line)+"\n"); err != nil {
			return 0, err
		}
		p.pending = rest
	}
	return len(b), nil
}

// load sends GETs to both clusters through the balancer until stopped,
// each client every interval, over HTTP/2 and HTTP/1.1 connections, and
// counts what failed.
type load struct {
	ok, failed atomic.Int64
	mu         sync.Mutex
	failures   []string
	wg         sync.WaitGroup
}

func (l *load) run(ctx context.Context, s *setup, clients int, interval time.Duration) {
	for i := range clients {
		tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: s.ca}, ForceAttemptHTTP2: i%2 == 0}
		if i%2 == 1 {
			tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
		}
		c := &http.Client{Transport: tr, Timeout: 30 * time.Second}
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			defer tr.CloseIdleConnections()
			tick := time.NewTicker(interval)
			defer tick.Stop()
			for n := 0; ; n++ {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				name := []string{cluster, cluster2}[n%2]
				l.get(ctx, c, s, name)
			}
		}()
	}
}

func (l *load) get(ctx context.Context, c *http.Client, s *setup, name string) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.url+"/"+name+"/api/v1/namespaces/apps/configmaps/cm-0", nil)
	req.Header.Set("Authorization", "Bearer "+s.userToken)
	resp, err := c.Do(req)
	if ctx.Err() != nil {
		return
	}
	var why string
	switch {
	case err != nil:
		why = err.Error()
	case resp.StatusCode != http.StatusOK:
		body, _ := io.ReadAll(resp.Body)
		why = fmt.Sprintf("%s: %s", resp.Status, body)
	}
	if resp != nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
	}
	if why == "" {
		l.ok.Add(1)
		return
	}
	l.failed.Add(1)
	l.mu.Lock()
	l.failures = append(l.failures, time.Now().Format("15:04:05.000")+" "+name+": "+why)
	l.mu.Unlock()
}

func (l *load) reset() (ok, failed int64, failures []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	failures, l.failures = l.failures, nil
	return l.ok.Swap(0), l.failed.Swap(0), failures
}

// startProxyPair runs two proxy-servers as OCM cluster-proxy deploys its
// replicas (--server-count=2), behind one round-robin address for
// clients and one for agents, and returns the tunnel configuration that
// reaches them through the clients' address. The first
// cluster's agent reaches both servers through the agents' address; the
// second cluster's agent reaches the first server only, so that half the
// dials for it land on a server that answers "No agent available".
func startProxyPair(t *testing.T, ctx context.Context) config.Tunnel {
	t.Helper()
	servers, err := konnectivity.StartServers(ctx, t.TempDir(), 2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, srv := range servers {
			srv.Kill()
		}
	})
	balance := func(addrs ...string) *lb.Balancer {
		var bs []lb.Backend
		for _, a := range addrs {
			bs = append(bs, lb.Backend{Addr: a})
		}
		b := lb.New(lb.Options{}, bs...)
		if err := b.Start(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.Close() })
		return b
	}
	front := balance(servers[0].ClientAddress, servers[1].ClientAddress)
	agents := balance(servers[0].AgentAddress, servers[1].AgentAddress)
	for _, a := range []struct{ via, id, host string }{
		{agents.Addr(), "pair-agent1", managedIP},
		{servers[0].AgentAddress, "pair-agent2", managed2IP},
	} {
		agent, err := servers[0].StartAgentVia(a.via, a.id, a.host)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(agent.Kill)
	}
	tc := servers[0].TunnelConfig(msaName)
	tc.Konnectivity.Address = front.Addr()
	return tc
}

// startNATS runs a NATS server with JetStream in the test process: the
// replicas' external bus, shared by all of them as in a highly available
// install.
func startNATS(t *testing.T) *natsserver.Server {
	t.Helper()
	ns, err := natsserver.NewServer(&natsserver.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(20 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	t.Cleanup(ns.Shutdown)
	return ns
}

// TestRollingUpdate runs three replicas behind a readiness-gated
// balancer, with a client sending GETs to two clusters every 100 ms, an
// informer and `kubectl get -w` watching through the gateway, an exec
// session open, and the hub changing; then replaces every replica in turn
// as a StatefulSet does (the old one SIGTERMed, then its replacement
// started), and finally SIGKILLs one.
// During the rolling update no GET fails, every watch end is clean and
// the watches see every change, the exec session on a draining replica
// ends, profiles keep being written across the leader changes, and every
// change is in the event stream.
func TestRollingUpdate(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	s, conf := prepare(t, ctx)
	s.join(t, ctx, cluster2, env.managed2)
	selector := conf.Tunnel.ClusterSelector
	conf.Tunnel = startProxyPair(t, ctx)
	conf.Tunnel.ClusterSelector = selector
	ns := startNATS(t)
	conf.Bus.URLs = []string{ns.ClientURL()}
	conf.LeaderElection = config.LeaderElection{Enabled: true, Namespace: "default", Name: runPrefix() + "hubsync",
		LeaseDuration: metav1.Duration{Duration: 4 * time.Second}, RenewDeadline: metav1.Duration{Duration: 3 * time.Second},
		RetryPeriod: metav1.Duration{Duration: 500 * time.Millisecond}}
	// Endpoints here follow readiness within 100 ms; the drain delay
	// covers that, and watches end at once.
	conf.Gateway.Drain = config.GatewayDrain{Delay: &metav1.Duration{Duration: time.Second}, Timeout: metav1.Duration{Duration: 5 * time.Second}}
	conf.Logging.Level = "info"

	bal := lb.New(lb.Options{})
	if err := bal.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer bal.Close()
	s.url = "https://" + bal.Addr()
	r := &replicaSet{t: t, s: s, conf: conf, lb: bal}
	defer r.stopAll()
	t.Cleanup(func() { s.checkLogs(t) })
	for range 3 {
		r.startReplica(ctx)
	}
	s.waitServed(t, cluster)
	s.waitServed(t, cluster2)

	w := startWatchers(t, ctx, s)
	ex := startExec(t, ctx, s)
	hub := startHubWrites(t, ctx, s)
	var l load
	loadCtx, stopLoad := context.WithCancel(ctx)
	l.run(loadCtx, s, 4, 100*time.Millisecond)

	t.Log("--- rolling update: each replica replaced in turn")
	for i := range 3 {
		took := r.replace(ctx, false)
		t.Logf("replica %d replaced; its stop took %s", i+1, took.Round(time.Millisecond))
	}
	// A few more GETs on the new replicas.
	testutil.Eventually(t, 10*time.Second, 50*time.Millisecond, func() error {
		if l.ok.Load() < 20 {
			return errors.New("too few GETs since the last replacement")
		}
		return nil
	})
	ok, failed, failures := l.reset()
	t.Logf("rolling update: %d GETs succeeded, %d failed", ok, failed)
	if failed != 0 {
		t.Errorf("%d GETs failed during the rolling update:\n%s", failed, strings.Join(failures, "\n"))
	}
	w.check(t, ctx, s)
	ex.check(t)
	hub.check(t, ctx, ns, conf, strings.Count(s.logs.String(), `msg="became leader"`))

	t.Log("--- a replica SIGKILLed")
	r.replace(ctx, true)
	testutil.Eventually(t, 10*time.Second, 50*time.Millisecond, func() error {
		if l.ok.Load() < 20 {
			return errors.New("too few GETs since the kill")
		}
		return nil
	})
	stopLoad()
	l.wg.Wait()
	ok, failed, failures = l.reset()
	t.Logf("replica killed: %d GETs succeeded, %d failed (the requests in flight on the killed replica)", ok, failed)
	if failed > 4 {
		t.Errorf("%d GETs failed after a replica was killed; want at most the 4 clients' requests in flight on it:\n%s", failed, strings.Join(failures, "\n"))
	}
}

// watchers watch ConfigMaps in "apps" of the first cluster through the
// gateway: a client-go informer (a controller's way) and `kubectl get -w`,
// run again whenever it ends; a writer adds a ConfigMap every 200 ms on
// the managed cluster.
type watchers struct {
	stop      context.CancelFunc
	done      chan struct{}
	seen      sync.Map // ConfigMap name -> true, from the informer
	kubectlMu sync.Mutex
	kubectl   []string // names kubectl saw
	exits     []string // each kubectl exit that was not clean
	runs      atomic.Int32
	written   []string
}

func startWatchers(t *testing.T, ctx context.Context, s *setup) *watchers {
	t.Helper()
	kc := s.gatewayKubeconfig(t, ctx)
	cfg, err := clientcmd.BuildConfigFromFlags("", kc)
	if err != nil {
		t.Fatal(err)
	}
	kube := kubernetes.NewForConfigOrDie(cfg)
	ctx, stop := context.WithCancel(ctx)
	w := &watchers{stop: stop, done: make(chan struct{})}
	prefix := runPrefix()
	lw := &cache.ListWatch{
		ListFunc: func(o metav1.ListOptions) (runtime.Object, error) {
			return kube.CoreV1().ConfigMaps("apps").List(ctx, o)
		},
		WatchFunc: func(o metav1.ListOptions) (watch.Interface, error) {
			return kube.CoreV1().ConfigMaps("apps").Watch(ctx, o)
		},
	}
	inf := cache.NewSharedIndexInformer(lw, &corev1.ConfigMap{}, 0, cache.Indexers{})
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: func(obj any) {
		w.seen.Store(obj.(*corev1.ConfigMap).Name, true)
	}}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(3)
	go func() { defer wg.Done(); inf.Run(ctx.Done()) }()
	go func() { defer wg.Done(); w.runKubectl(ctx, kc) }()
	go func() {
		defer wg.Done()
		mg := kubernetes.NewForConfigOrDie(env.managed.Config)
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ctx.Err() == nil; i++ {
			name := fmt.Sprintf("%scm-%03d", prefix, i)
			if _, err := mg.CoreV1().ConfigMaps("apps").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err == nil {
				w.kubectlMu.Lock()
				w.written = append(w.written, name)
				w.kubectlMu.Unlock()
			}
			select {
			case <-ctx.Done():
			case <-tick.C:
			}
		}
	}()
	go func() { wg.Wait(); close(w.done) }()
	testutil.Eventually(t, 30*time.Second, 50*time.Millisecond, func() error {
		if !inf.HasSynced() {
			return errors.New("informer not synced")
		}
		return nil
	})
	return w
}

// runKubectl runs `kubectl get -w` until ctx ends, again each time it
// exits, as a person or a script watching would.
func (w *watchers) runKubectl(ctx context.Context, kc string) {
	for ctx.Err() == nil {
		w.runs.Add(1)
		cmd := exec.CommandContext(ctx, env.kubectl, "--kubeconfig", kc, "get", "configmaps", "-n", "apps", "-w",
			"--output-watch-events", "-o", "name", "--request-timeout=0")
		out, err := cmd.StdoutPipe()
		if err != nil {
			return
		}
		var stderr strings.Builder
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			return
		}
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			w.kubectlMu.Lock()
			w.kubectl = append(w.kubectl, sc.Text())
			w.kubectlMu.Unlock()
		}
		err = cmd.Wait()
		if ctx.Err() == nil && err != nil {
			w.kubectlMu.Lock()
			w.exits = append(w.exits, fmt.Sprintf("%v: %s", err, strings.TrimSpace(stderr.String())))
			w.kubectlMu.Unlock()
		}
	}
}

// check stops the watchers and checks that the informer saw every
// ConfigMap written, and that kubectl's watch always ended cleanly.
func (w *watchers) check(t *testing.T, ctx context.Context, s *setup) {
	t.Helper()
	testutil.Eventually(t, 20*time.Second, 50*time.Millisecond, func() error {
		w.kubectlMu.Lock()
		written := append([]string(nil), w.written...)
		w.kubectlMu.Unlock()
		for _, name := range written {
			if _, ok := w.seen.Load(name); !ok {
				return fmt.Errorf("the informer through the gateway never saw ConfigMap %s (of %d written)", name, len(written))
			}
		}
		return nil
	})
	w.stop()
	<-w.done
	w.kubectlMu.Lock()
	defer w.kubectlMu.Unlock()
	t.Logf("watches: %d ConfigMaps written and all seen by the informer; kubectl get -w ran %d times, saw %d events",
		len(w.written), w.runs.Load(), len(w.kubectl))
	if len(w.exits) > 0 {
		t.Errorf("kubectl get -w did not end cleanly:\n%s", strings.Join(w.exits, "\n"))
	}
	if w.runs.Load() < 2 {
		t.Errorf("kubectl get -w ran %d times: its watch was never ended by a draining replica", w.runs.Load())
	}
}

// session is an exec session through the gateway (`kubectl exec -i --
// cat`), sent a line every 100 ms.
type session struct {
	done  chan struct{}
	err   error
	sent  atomic.Int32
	echo  atomic.Int32
	ended time.Time
}

func startExec(t *testing.T, ctx context.Context, s *setup) *session {
	t.Helper()
	k, err := kubelet.Start(ctx, kubelet.Options{IP: managedIP})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k.Close() })
	pod := runPrefix() + "exec"
	if _, err := k.Register(ctx, env.managed.Config, kubelet.Pod{Namespace: "apps", Name: pod, Container: "main"}); err != nil {
		t.Fatal(err)
	}
	kc := s.gatewayKubeconfig(t, ctx)
	cmd := exec.CommandContext(ctx, env.kubectl, "--kubeconfig", kc, "exec", "-i", "-n", "apps", pod, "--", "cat")
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	x := &session{done: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			x.echo.Add(1)
		}
	}()
	go func() {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-x.done:
				return
			case <-tick.C:
			}
			if _, err := fmt.Fprintf(in, "line %d\n", x.sent.Add(1)); err != nil {
				return
			}
		}
	}()
	go func() {
		x.err = cmd.Wait()
		x.ended = time.Now()
		close(x.done)
	}()
	testutil.Eventually(t, 30*time.Second, 50*time.Millisecond, func() error {
		if x.echo.Load() < 3 {
			return errors.New("the exec session does not echo")
		}
		return nil
	})
	return x
}

// check: the session ended when its replica drained, having echoed what
// was sent until then.
func (x *session) check(t *testing.T) {
	t.Helper()
	select {
	case <-x.done:
	default:
		t.Fatal("the exec session is still open after every replica was replaced")
	}
	t.Logf("exec session ended at %s (%v) after %d lines sent, %d echoed", x.ended.Format("15:04:05.000"), x.err, x.sent.Load(), x.echo.Load())
	if x.echo.Load() < 3 {
		t.Errorf("the exec session echoed %d lines", x.echo.Load())
	}
}

// hubWrites adds a cluster to the consumer namespace's set every 300 ms,
// and times its profile's arrival.
type hubWrites struct {
	kube    kubernetes.Interface
	stop    context.CancelFunc
	done    chan struct{}
	mu      sync.Mutex
	created map[string]time.Time
	arrived map[string]time.Duration
}

func startHubWrites(t *testing.T, ctx context.Context, s *setup) *hubWrites {
	t.Helper()
	ctx, stop := context.WithCancel(ctx)
	h := &hubWrites{kube: s.hubKube, stop: stop, done: make(chan struct{}), created: map[string]time.Time{}, arrived: map[string]time.Duration{}}
	pw, err := s.h.Profiles.ApisV1alpha1().ClusterProfiles(consumerNS).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for ev := range pw.ResultChan() {
			if ev.Type != watch.Added {
				continue
			}
			name := ev.Object.(metav1.Object).GetName()
			h.mu.Lock()
			if c, ok := h.created[name]; ok {
				h.arrived[name] = time.Since(c)
			}
			h.mu.Unlock()
		}
	}()
	go func() {
		defer close(h.done)
		defer pw.Stop()
		tick := time.NewTicker(300 * time.Millisecond)
		defer tick.Stop()
		prefix := runPrefix()
		for i := 0; ctx.Err() == nil; i++ {
			name := fmt.Sprintf("%scluster-%03d", prefix, i)
			h.mu.Lock()
			h.created[name] = time.Now()
			h.mu.Unlock()
			if _, err := s.h.CreateCluster(ctx, fleet.ClusterSpec{Name: name, Labels: fleet.ExclusiveSetLabels(consumerSet, nil)}); err != nil && ctx.Err() == nil {
				t.Errorf("creating cluster %s: %v", name, err)
			}
			select {
			case <-ctx.Done():
			case <-tick.C:
			}
		}
	}()
	return h
}

// check stops the writes and checks that every cluster's profile arrived
// within a bound across the leader changes, and that every profile is in
// the event stream.
func (h *hubWrites) check(t *testing.T, ctx context.Context, ns *natsserver.Server, conf config.Config, leaders int) {
	t.Helper()
	testutil.Eventually(t, 30*time.Second, 50*time.Millisecond, func() error {
		h.mu.Lock()
		defer h.mu.Unlock()
		if len(h.arrived) < len(h.created)-1 {
			return fmt.Errorf("%d of %d profiles arrived", len(h.arrived), len(h.created))
		}
		return nil
	})
	h.stop()
	<-h.done
	h.mu.Lock()
	defer h.mu.Unlock()
	var worst time.Duration
	var worstName string
	for name, d := range h.arrived {
		if d > worst {
			worst, worstName = d, name
		}
	}
	// The bound: a lease released on SIGTERM is taken by the next
	// replica at its next retry (500 ms), which then syncs its caches.
	const bound = 8 * time.Second
	t.Logf("hub writes: %d clusters added during the rolling update; slowest profile %s after its cluster (%s), bound %s",
		len(h.created), worst.Round(time.Millisecond), worstName, bound)
	if worst > bound {
		t.Errorf("a profile took %s to be written across the leader changes; want ≤ %s", worst, bound)
	}
	// A new leader publishes once its NATS connection is up, retrying
	// in order meanwhile: every profile's profile.created is there
	// within a bound.
	testutil.Eventually(t, 30*time.Second, 200*time.Millisecond, func() error {
		seen := streamedProfiles(t, ctx, ns, conf)
		for name := range h.arrived {
			if seen[name] == 0 {
				return fmt.Errorf("no profile.created event for cluster %s in the stream", name)
			}
		}
		return nil
	})
	h.checkEvents(t, ctx, leaders)
}

// checkEvents: the clusters added have no API server URL, so every
// replica's pool finds them failing. Only a leader posts TunnelFailing
// Events, once when its entry starts failing while it leads: a cluster
// has at most one per leader of the test, where every replica posting
// gives one per replica that saw it.
func (h *hubWrites) checkEvents(t *testing.T, ctx context.Context, leaders int) {
	t.Helper()
	evs, err := h.kube.CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{FieldSelector: "reason=TunnelFailing"})
	if err != nil {
		t.Fatal(err)
	}
	per := map[string]int{}
	for _, ev := range evs.Items {
		if _, ok := h.created[ev.InvolvedObject.Name]; ok {
			per[ev.InvolvedObject.Name]++
		}
	}
	most := 0
	for name, n := range per {
		most = max(most, n)
		if n > leaders {
			t.Errorf("cluster %s has %d TunnelFailing Events, more than the %d leaders could post", name, n, leaders)
		}
	}
	t.Logf("TunnelFailing Events: %d clusters of %d have one, at most %d each (%d leaders)", len(per), len(h.created), most, leaders)
	if len(per) == 0 {
		t.Error("no TunnelFailing Event for any cluster without an API server URL")
	}
}

// streamedProfiles reads the whole event stream and returns, per cluster
// of the consumer namespace, how many distinct profile.created events it
// holds; an event id seen twice must be the same change.
func streamedProfiles(t *testing.T, ctx context.Context, ns *natsserver.Server, conf config.Config) map[string]int {
	t.Helper()
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx, conf.Bus.Stream.Name)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cons, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	byID := map[string]string{}
	created := map[string]int{}
	for i := uint64(0); i < info.State.Msgs; i++ {
		msg, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil {
			t.Fatalf("reading event %d of %d: %v", i+1, info.State.Msgs, err)
		}
		ev, err := events.Decode(msg.Data())
		if err != nil {
			t.Fatal(err)
		}
		change := ev.Type + "/" + ev.Data.Namespace + "/" + ev.Data.Cluster + "/" + ev.Data.ResourceVersion
		if prev, ok := byID[ev.ID]; ok && prev != change {
			t.Errorf("event id %s names two changes: %s and %s", ev.ID, prev, change)
		}
		if _, dup := byID[ev.ID]; !dup && ev.Type == events.TypePrefix+"profile.created" && ev.Data.Namespace == consumerNS {
			created[ev.Data.Cluster]++
		}
		byID[ev.ID] = change
	}
	return created
}

// TestOnDemand runs the gateway with tunnel.warm: onDemand: the replica
// is ready with no tunnel open, the first request for a cluster dials it
// and succeeds, the entry closes after idleTimeout without requests, and
// the next request dials again.
func TestOnDemand(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	s, conf := prepare(t, ctx)
	conf.Tunnel.Warm = config.WarmOnDemand
	conf.Tunnel.IdleTimeout = metav1.Duration{Duration: 2 * time.Second}
	s.run(t, ctx, conf)
	ready := func() float64 {
		m, err := s.d.Scrape()
		if err != nil {
			t.Fatal(err)
		}
		return m.Value("hubsync_tunnel_state", testutil.Labels{"cluster": cluster, "state": "ready"})
	}
	// The profile reaches the pool a moment after readiness.
	testutil.Eventually(t, 30*time.Second, 50*time.Millisecond, func() error {
		code, body := s.get(t, "/"+cluster+"/api/v1/namespaces/apps/configmaps", "Bearer "+s.userToken, nil)
		if code != http.StatusOK {
			return fmt.Errorf("%d: %s", code, body)
		}
		return nil
	})
	for round := 1; round <= 2; round++ {
		if ready() != 1 {
			t.Fatalf("round %d: no ready entry right after a request", round)
		}
		testutil.Eventually(t, 30*time.Second, 100*time.Millisecond, func() error {
			if ready() != 0 {
				return errors.New("the entry is still open")
			}
			return nil
		})
		// Closed when idle: the next request dials again, and waits for it.
		if code, body := s.get(t, "/"+cluster+"/api/v1/namespaces/apps/configmaps", "Bearer "+s.userToken, nil); code != http.StatusOK {
			t.Fatalf("round %d: %d %s after the entry closed idle", round, code, body)
		}
	}
	if n := s.metric(t, "hubsync_gateway_tunnel_wait_duration_seconds", nil); n < 2 {
		t.Errorf("%v requests waited for a tunnel; want the first of each round", n)
	}
}
