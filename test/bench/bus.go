package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/hubsync/hubsync/bus"
	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/stream"
	"github.com/hubsync/hubsync/stream/streamtest"
	"github.com/hubsync/hubsync/test/pki"
	"github.com/hubsync/hubsync/test/testutil"
)

// The clustered bus's figures (--bus-only, and part of the full run):
// hubsync's bus package as the daemon runs it (a change stream's fan-out
// feeding the bus, whose embedded nats-server is one node of a JetStream
// cluster, or the only node), with an application reading its copy of the
// stream with its own NKey on another node. Each repeat builds both rigs
// afresh, in alternating order, and compares them in the same conditions:
//   - publish throughput: busBurst changes notified at once, until the
//     bus has published them all;
//   - event latency: busSteady changes notified at busRate, each timed from
//     its notification to its arrival at the application;
//   - on the cluster only, the longest gap between events arriving at the
//     application while changes flow at busRate and a node that is not the
//     publisher's goes away, and while the publisher goes away with its
//     node and another replica starts publishing (the bus's part of a
//     leader change; the Lease's own pause is the rolling-update figures').
var (
	busOnly    bool
	busRepeats int
)

const (
	busBurst   = 10000
	busSteady  = 1000
	busRate    = 200 // changes per second
	busFaultRT = 6 * time.Second
)

// busRig is one bus as the replicas run it: nodes[0] publishes, the
// application reads on the last node.
type busRig struct {
	dir   string
	nodes []*busNode
	pub   int // the publishing node
	app   *nats.Conn
	confs []config.Bus
	mu    sync.Mutex
	seen  map[string]time.Time // cluster -> first arrival at the application
}

type busNode struct {
	reg    *prometheus.Registry
	b      *bus.Bus
	f      *stream.Fanout
	cancel context.CancelFunc
	closed bool
}

func (n *busNode) close() {
	if n.closed {
		return
	}
	n.closed = true
	if n.cancel != nil {
		// A publisher delivers what is queued for a few seconds, as
		// hubsync does on shutdown.
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_ = n.f.Close(ctx)
	}
	_ = n.b.Close()
	if n.cancel != nil {
		n.cancel()
	}
}

func benchBus(ctx context.Context) error {
	fmt.Printf("== clustered bus: 3 embedded nodes (stream, bucket and copies at R3, routes over mutual TLS) beside a single node; %d repeats\n", busRepeats)
	var thrSingle, thrCluster, thrRatio []float64
	var latSingle, latCluster []time.Duration
	var latRatio []float64
	var faults []busFaults
	for i := range busRepeats {
		order := []int{1, 3}
		if i%2 == 1 {
			order = []int{3, 1}
		}
		var thr [4]float64
		var p99 [4]time.Duration
		for _, n := range order {
			r, err := newBusRig(ctx, n)
			if err != nil {
				return fmt.Errorf("%d-node bus: %w", n, err)
			}
			thr[n], err = r.throughput(ctx)
			if err == nil {
				p99[n], err = r.latency(ctx)
			}
			if err == nil && n == 3 {
				var f busFaults
				if f, err = r.faults(ctx); err == nil {
					faults = append(faults, f)
				}
			}
			r.close()
			if err != nil {
				return fmt.Errorf("%d-node bus: %w", n, err)
			}
		}
		thrSingle, thrCluster = append(thrSingle, thr[1]), append(thrCluster, thr[3])
		thrRatio = append(thrRatio, thr[3]/thr[1])
		latSingle, latCluster = append(latSingle, p99[1]), append(latCluster, p99[3])
		latRatio = append(latRatio, ratio(p99[3], p99[1]))
	}
	fmt.Printf("bus publish throughput (%d changes at once): single node %s events/s, 3-node cluster %s events/s; cluster/single %s\n",
		busBurst, floatSpread(thrSingle, "%.0f"), floatSpread(thrCluster, "%.0f"), ratioSpread(thrRatio))
	fmt.Printf("bus event latency p99 (notified -> at the application on another node, %d changes at %d/s): single node %s, 3-node cluster %s; cluster/single %s\n",
		busSteady, busRate, durSpread(latSingle), durSpread(latCluster), ratioSpread(latRatio))
	for i, where := range []string{"at the application (its copy, on another node)", "of publishing (JetStream's acknowledgements)"} {
		var quiet, loss, change []time.Duration
		for _, f := range faults {
			quiet, loss, change = append(quiet, f.quiet[i]), append(loss, f.loss[i]), append(change, f.change[i])
		}
		fmt.Printf("bus longest pause %s, changes at %d/s on the 3-node cluster: no fault %s; a node lost (not the publisher's) %s; the publisher's node lost and another replica publishing %s\n",
			where, busRate, durSpread(quiet), durSpread(loss), durSpread(change))
	}
	return nil
}

func newBusRig(ctx context.Context, n int) (*busRig, error) {
	dir, err := os.MkdirTemp("", "hubsync-bench-bus-")
	if err != nil {
		return nil, err
	}
	r := &busRig{dir: dir, seen: map[string]time.Time{}}
	kp, err := nkeys.CreateUser()
	if err != nil {
		return nil, err
	}
	pub, err := kp.PublicKey()
	if err != nil {
		return nil, err
	}
	confs, err := busConfigs(dir, n, pub)
	if err != nil {
		return nil, err
	}
	r.confs = confs
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for i, c := range confs {
		node, err := newBusNode(c, log)
		if err != nil {
			r.close()
			return nil, err
		}
		r.nodes = append(r.nodes, node)
		if i > 0 {
			if err := node.b.StartNode(); err != nil {
				r.close()
				return nil, err
			}
		}
	}
	if err := r.startPublishing(ctx, 0); err != nil {
		r.close()
		return nil, err
	}
	// The first publish waits for the cluster's leaders.
	r.nodes[0].f.Notify(streamtest.Profile(stream.ProfileCreated, "bench", "warm-up", "1"))
	if err := r.flush(ctx); err != nil {
		r.close()
		return nil, err
	}
	if err := r.follow(kp, pub); err != nil {
		r.close()
		return nil, err
	}
	return r, nil
}

// busConfigs are the bus configurations of n replicas (one: a single
// node), whose application "bench" signs in with key.
func busConfigs(dir string, n int, key string) ([]config.Bus, error) {
	ca, err := pki.NewCA("hubsync-bus")
	if err != nil {
		return nil, err
	}
	caFile, err := ca.WriteCA(dir, "ca")
	if err != nil {
		return nil, err
	}
	addrs := make([]string, 0, 2*n)
	var held []net.Listener
	for range 2 * n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		held = append(held, l)
		addrs = append(addrs, l.Addr().String())
	}
	for _, l := range held {
		_ = l.Close()
	}
	var routes []string
	for i := range n {
		routes = append(routes, "nats://"+addrs[n+i])
	}
	var out []config.Bus
	for i := range n {
		c := config.Default().Bus
		c.Embedded = config.BusEmbedded{Listen: addrs[i], DataDir: filepath.Join(dir, fmt.Sprintf("nats-%d", i))}
		c.Stream.Replicas = n
		c.Consumers = []config.BusConsumer{{Name: "bench", NKeys: []string{key}}}
		if n > 1 {
			pair, err := ca.Serving("127.0.0.1", "localhost")
			if err != nil {
				return nil, err
			}
			cert, keyFile, err := pair.Write(dir, fmt.Sprintf("node-%d", i))
			if err != nil {
				return nil, err
			}
			c.Embedded.Cluster = config.BusCluster{
				Name: "hubsync", Listen: addrs[n+i], Routes: routes, ServerName: fmt.Sprintf("hubsync-%d", i),
				TLS: config.BusClusterTLS{CertFile: cert, KeyFile: keyFile, CAFile: caFile},
			}
		}
		out = append(out, c)
	}
	return out, nil
}

func newBusNode(c config.Bus, log *slog.Logger) (*busNode, error) {
	reg := prometheus.NewRegistry()
	b, err := bus.New(c, "hubsync/bench", log, reg)
	if err != nil {
		return nil, err
	}
	f, err := stream.NewFanout(log, reg)
	if err != nil {
		return nil, err
	}
	if err := f.Add(b.ConsumerOptions(), b); err != nil {
		return nil, err
	}
	return &busNode{reg: reg, b: b, f: f}, nil
}

// startPublishing makes node i the publisher, as a replica that takes the
// Lease does.
func (r *busRig) startPublishing(ctx context.Context, i int) error {
	node := r.nodes[i]
	nctx, cancel := context.WithCancel(ctx)
	node.cancel = cancel
	if err := node.b.Start(nctx); err != nil {
		return err
	}
	if err := node.f.Start(nctx, nil); err != nil {
		return err
	}
	r.mu.Lock()
	r.pub = i
	r.mu.Unlock()
	return nil
}

func (r *busRig) publisher() *busNode {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.nodes[r.pub]
}

func (r *busRig) flush(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return r.publisher().f.Flush(ctx)
}

// follow subscribes as the application, on the last node, to its copy of
// the stream from now on.
func (r *busRig) follow(kp nkeys.KeyPair, pub string) error {
	url := r.nodes[len(r.nodes)-1].b.ClientURL()
	nc, err := nats.Connect(url, nats.Nkey(pub, kp.Sign), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		return err
	}
	r.app = nc
	js, err := nc.JetStream()
	if err != nil {
		return err
	}
	handle := func(m *nats.Msg) {
		at := time.Now()
		var e struct {
			Subject string `json:"subject"` // <namespace>/<cluster>
		}
		_ = json.Unmarshal(m.Data, &e)
		cluster := strings.TrimPrefix(e.Subject, "bench/")
		r.mu.Lock()
		defer r.mu.Unlock()
		if _, dup := r.seen[cluster]; !dup {
			r.seen[cluster] = at
		}
	}
	return followNew(js, handle)
}

func (r *busRig) close() {
	if r.app != nil {
		r.app.Close()
	}
	for i := len(r.nodes) - 1; i >= 0; i-- {
		r.nodes[i].close()
	}
	_ = os.RemoveAll(r.dir)
}

// throughput notifies busBurst changes at once and returns the events per
// second until the bus has published them all.
func (r *busRig) throughput(ctx context.Context) (float64, error) {
	f := r.publisher().f
	start := time.Now()
	for i := range busBurst {
		f.Notify(streamtest.Profile(stream.ProfileCreated, "bench", fmt.Sprintf("burst-%05d", i), "1"))
	}
	if err := r.flush(ctx); err != nil {
		return 0, err
	}
	return float64(busBurst) / time.Since(start).Seconds(), nil
}

// steady notifies n changes named prefix-<i> at busRate, calling during
// (if given) once a third of them are out, and returns when each was
// notified.
func (r *busRig) steady(ctx context.Context, prefix string, n int, during func() error) (map[string]time.Time, error) {
	sent := make(map[string]time.Time, n)
	tick := time.NewTicker(time.Second / busRate)
	defer tick.Stop()
	// The fault has run its course (a node fully stopped) before the
	// next step, which may start that node again.
	faultDone := make(chan struct{})
	if during == nil {
		close(faultDone)
	}
	defer func() { <-faultDone }()
	for i := range n {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-tick.C:
		}
		name := fmt.Sprintf("%s-%05d", prefix, i)
		sent[name] = time.Now()
		r.publisher().f.Notify(streamtest.Profile(stream.ProfileCreated, "bench", name, "1"))
		if during != nil && i == n/3 {
			go func() {
				defer close(faultDone)
				if err := during(); err != nil {
					fmt.Printf("  fault: %v\n", err)
				}
			}()
		}
	}
	// Every event at the application.
	var missing []string
	err := testutil.Poll(ctx, 3*time.Minute, 20*time.Millisecond, func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		missing = missing[:0]
		for name := range sent {
			if _, ok := r.seen[name]; !ok {
				missing = append(missing, name)
			}
		}
		return len(missing) == 0
	})
	if err != nil {
		slices.Sort(missing)
		return nil, fmt.Errorf("%d of %d %s events never reached the application (first %s, last %s): %w",
			len(missing), len(sent), prefix, missing[0], missing[len(missing)-1], err)
	}
	return sent, nil
}

// latency returns the p99 from notification to arrival of busSteady
// changes at busRate.
func (r *busRig) latency(ctx context.Context) (time.Duration, error) {
	sent, err := r.steady(ctx, "steady", busSteady, nil)
	if err != nil {
		return 0, err
	}
	r.mu.Lock()
	lat := make([]time.Duration, 0, len(sent))
	for name, at := range sent {
		lat = append(lat, r.seen[name].Sub(at))
	}
	r.mu.Unlock()
	slices.Sort(lat)
	return pct(lat, 99), nil
}

// faults returns the longest gaps (busFaults) with no fault, while a node that is not the publisher's goes away, and
// while the publisher goes away with its node and another replica
// publishes in its place.
func (r *busRig) faults(ctx context.Context) (f busFaults, err error) {
	n := int(busFaultRT.Seconds() * busRate)
	if f.quiet[0], f.quiet[1], err = r.longestGap(ctx, "quiet", n, nil); err != nil {
		return f, err
	}
	// Node 1: neither the publisher's nor the application's.
	if f.loss[0], f.loss[1], err = r.longestGap(ctx, "loss", n, func() error { r.nodes[1].close(); return nil }); err != nil {
		return f, err
	}
	// Node 1 back with its data, so that losing the publisher's node
	// leaves two of three.
	back, err := newBusNode(r.confs[1], slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		return f, err
	}
	r.nodes[1] = back
	if err := back.b.StartNode(); err != nil {
		return f, err
	}
	if err := testutil.Poll(ctx, time.Minute, 100*time.Millisecond, func() bool { ok, _ := back.b.NodeReady(); return ok }); err != nil {
		return f, errors.New("the node back never caught up")
	}
	// The changes go on at the hub meanwhile: from the moment the old
	// publisher stops taking them they queue for the new one, which
	// publishes them once it has started, as a new leader works through
	// what its informers deliver.
	change := func() error {
		r.mu.Lock()
		r.pub = 1
		r.mu.Unlock()
		r.nodes[0].close()
		return r.startPublishing(ctx, 1)
	}
	f.change[0], f.change[1], err = r.longestGap(ctx, "handover", n, change)
	return f, err
}

// busFaults are the longest gaps of a fault run: [0] between arrivals at
// the application, [1] between JetStream's acknowledgements to the
// publisher.
type busFaults struct {
	quiet, loss, change [2]time.Duration
}

// published is the number of events JetStream has acknowledged to every
// node that has published, as hubsync_bus_events_published_total counts
// them.
func published(nodes []*busNode) float64 {
	var sum float64
	for _, n := range nodes {
		mfs, err := n.reg.Gather()
		if err != nil {
			continue
		}
		for _, mf := range mfs {
			if mf.GetName() != "hubsync_bus_events_published_total" {
				continue
			}
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// longestGap runs n changes at busRate (with fault, if given, a third of
// the way) and returns the longest gap between consecutive arrivals of
// theirs at the application.
func (r *busRig) longestGap(ctx context.Context, prefix string, n int, fault func() error) (gap, acked time.Duration, err error) {
	// The publishing side: the longest time without an acknowledgement
	// from JetStream, sampled every 2ms.
	nodes := slices.Clone(r.nodes)
	stop := make(chan struct{})
	done := make(chan time.Duration)
	go func() {
		last, lastAt, longest := published(nodes), time.Now(), time.Duration(0)
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				done <- longest
				return
			case now := <-tick.C:
				if v := published(nodes); v != last {
					longest = max(longest, now.Sub(lastAt))
					last, lastAt = v, now
				}
			}
		}
	}()
	sent, err := r.steady(ctx, prefix, n, fault)
	close(stop)
	acked = (<-done).Round(time.Millisecond)
	if err != nil {
		return 0, 0, err
	}
	r.mu.Lock()
	at := make([]time.Time, 0, len(sent))
	for name := range sent {
		at = append(at, r.seen[name])
	}
	r.mu.Unlock()
	slices.SortFunc(at, func(a, b time.Time) int { return a.Compare(b) })
	for i := 1; i < len(at); i++ {
		gap = max(gap, at[i].Sub(at[i-1]))
	}
	return gap.Round(time.Millisecond), acked, nil
}
