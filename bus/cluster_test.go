package bus

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/stream"
	"github.com/hubsync/hubsync/stream/streamtest"
	testpki "github.com/hubsync/hubsync/test/pki"
	"github.com/hubsync/hubsync/test/testutil"
)

// freePorts returns n TCP ports free on loopback a moment ago, below
// Linux's ephemeral range (32768 up): a node restarted on its port must
// not find it taken by an outgoing connection, its peers' routes
// included, which the kernel gives ports from that range.
func freePorts(t *testing.T, n int) []int {
	t.Helper()
	var out []int
	for tries := 0; len(out) < n; tries++ {
		if tries == 1000 {
			t.Fatalf("no free port below 32768 after %d tries", tries)
		}
		p := 20000 + rand.IntN(12768)
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil || slices.Contains(out, p) {
			continue
		}
		out = append(out, p)
		defer l.Close()
	}
	return out
}

// clusterConfigs are the bus configurations of n replicas whose embedded
// servers form one cluster over mutual TLS, with the stream and bucket at
// n replicas and one consuming application with key.
func clusterConfigs(t *testing.T, n int, key string) []config.Bus {
	t.Helper()
	dir := t.TempDir()
	ca, err := testpki.NewCA("hubsync-bus")
	if err != nil {
		t.Fatal(err)
	}
	caFile, err := ca.WriteCA(dir, "ca")
	if err != nil {
		t.Fatal(err)
	}
	ports := freePorts(t, n)
	var routes []string
	for _, p := range ports {
		routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", p))
	}
	var out []config.Bus
	for i := range n {
		pair, err := ca.Serving("127.0.0.1", "localhost")
		if err != nil {
			t.Fatal(err)
		}
		cert, keyFile, err := pair.Write(dir, fmt.Sprintf("node-%d", i))
		if err != nil {
			t.Fatal(err)
		}
		c := busConfig(t)
		c.Stream.Replicas = n
		c.Embedded.DataDir = filepath.Join(dir, fmt.Sprintf("data-%d", i))
		c.Embedded.Cluster = config.BusCluster{
			Name: "hubsync", Listen: fmt.Sprintf("127.0.0.1:%d", ports[i]), Routes: routes, ServerName: fmt.Sprintf("hubsync-%d", i),
			TLS: config.BusClusterTLS{CertFile: cert, KeyFile: keyFile, CAFile: caFile},
		}
		c.Consumers = []config.BusConsumer{{Name: "app", NKeys: []string{key}}}
		out = append(out, c)
	}
	return out
}

// startCluster starts three replicas' buses as one cluster: the first
// publishes (started), the others run their nodes; one application signs
// in with key. Every bus is closed at the end of the test.
func startCluster(t *testing.T) (key consumerKey, cfgs []config.Bus, leader *testBus, nodes []*Bus) {
	t.Helper()
	key = newConsumerKey(t)
	cfgs = clusterConfigs(t, 3, key.pub)
	leader, _ = newBus(t, cfgs[0])
	nodes = []*Bus{leader.Bus}
	for _, c := range cfgs[1:] {
		b, _ := newBus(t, c)
		nodes = append(nodes, b.Bus)
		if err := b.StartNode(); err != nil {
			t.Fatal(err)
		}
	}
	start(t, leader, nil)
	return key, cfgs, leader, nodes
}

// TestClusteredBus runs three replicas' embedded servers as one JetStream
// cluster: the leader publishes through its own node, the stream and
// bucket have three replicas, an application reads its copy on another
// node, and losing a node (not the leader's) loses nothing: publishing
// goes on, and the node catches up when it is back.
func TestClusteredBus(t *testing.T) {
	if testing.Short() {
		t.Skip("three servers")
	}
	key, cfgs, leader, nodes := startCluster(t)
	publish := func(ns string, from, to int) {
		for i := from; i < to; i++ {
			leader.Notify(streamtest.Profile(stream.ProfileCreated, ns, fmt.Sprintf("c%02d", i), "1"))
		}
		// The first publish waits for the cluster to elect its leaders.
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		if err := leader.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	publish("team-a", 0, 10)

	self := selfConnect(t, leader)
	s, err := self.js.Stream(ctxT(t), cfgs[0].Stream.Name)
	if err != nil {
		t.Fatal(err)
	}
	if info := s.CachedInfo(); info.Config.Replicas != 3 || info.Cluster == nil || len(info.Cluster.Replicas) != 2 {
		t.Fatalf("the stream: %d replicas, cluster %+v; want 3 replicas on 3 nodes", info.Config.Replicas, info.Cluster)
	}
	// The application on another node than the leader's.
	nc, err := key.dial(nodes[2].ClientURL(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	copyHas := func(n uint64) func() error {
		return func() error {
			s, err := js.Stream(ctxT(t), cfgs[0].Stream.Name)
			if err != nil {
				return err
			}
			if got := s.CachedInfo().State.Msgs; got != n {
				return fmt.Errorf("%d events in the application's copy, want %d", got, n)
			}
			return nil
		}
	}
	testutil.Eventually(t, 30*time.Second, 50*time.Millisecond, copyHas(10), "the application's copy")
	testutil.Eventually(t, 30*time.Second, 100*time.Millisecond, func() error {
		for _, st := range leader.Copies(ctxT(t)) {
			if st.Records != 10 || st.Err != nil {
				return fmt.Errorf("%s's copies: %+v", st.Consumer, st)
			}
		}
		return nil
	}, "every application's copy of the records")

	// A node that is not the leader's goes away: publishing goes on.
	if err := nodes[1].Close(); err != nil {
		t.Fatal(err)
	}
	publish("team-a", 10, 20)
	testutil.Eventually(t, 30*time.Second, 50*time.Millisecond, copyHas(20), "the application's copy with a node down")
	// The metrics say the stream has lost a replica.
	testutil.Eventually(t, 30*time.Second, 100*time.Millisecond, func() error {
		leader.refreshHealth(ctxT(t))
		if off := value(leader.m.streamReplicas.WithLabelValues("offline")); off != 1 {
			return fmt.Errorf("%v replicas offline, want 1", off)
		}
		return nil
	}, "hubsync_bus_stream_replicas{state=offline} 1")
	// So does /readyz?verbose, while the leader stays ready.
	lines := strings.Join(leader.HealthLines(time.Now()), "\n")
	for _, want := range []string{"bus node: current with the cluster", "bus stream: degraded, replicas 2 current, 0 behind, 1 offline", "bus copy app: "} {
		if !strings.Contains(lines, want) {
			t.Errorf("the bus's /readyz?verbose lines lack %q:\n%s", want, lines)
		}
	}

	// Back with its data: it catches up.
	back, _ := newBus(t, cfgs[1])
	t.Cleanup(func() { _ = back.Close() })
	if err := back.StartNode(); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, 100*time.Millisecond, func() error {
		s, err := self.js.Stream(ctxT(t), cfgs[0].Stream.Name)
		if err != nil {
			return err
		}
		for _, r := range s.CachedInfo().Cluster.Replicas {
			if !r.Current || r.Offline {
				return fmt.Errorf("replica %s: current %t, offline %t", r.Name, r.Current, r.Offline)
			}
		}
		return nil
	}, "every replica of the stream current")
	testutil.Eventually(t, 30*time.Second, 100*time.Millisecond, func() error {
		if ok, why := back.NodeReady(); !ok {
			return fmt.Errorf("not ready: %s", why)
		}
		return nil
	}, "the node back counts as ready once it has caught up")
	leader.refreshHealth(ctxT(t))
	if cur, off := value(leader.m.streamReplicas.WithLabelValues("current")), value(leader.m.streamReplicas.WithLabelValues("offline")); cur != 3 || off != 0 {
		t.Errorf("hubsync_bus_stream_replicas: %v current, %v offline; want 3 and 0", cur, off)
	}
	if f := value(leader.m.copyFailing.WithLabelValues("app")); f != 0 {
		t.Errorf("hubsync_bus_copy_failing{consumer=app} %v", f)
	}

	// A node back under its name with nothing on disk (a pod's emptyDir
	// after it was rescheduled): the cluster gives it everything again.
	if err := nodes[2].Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(cfgs[2].Embedded.DataDir); err != nil {
		t.Fatal(err)
	}
	publish("team-a", 20, 25)
	wiped, _ := newBus(t, cfgs[2])
	t.Cleanup(func() { _ = wiped.Close() })
	if err := wiped.StartNode(); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 60*time.Second, 100*time.Millisecond, func() error {
		if ok, why := wiped.NodeReady(); !ok {
			return fmt.Errorf("not ready: %s", why)
		}
		return nil
	}, "the node back without its data counts as ready once it has caught up")
	nc2, err := key.dial(wiped.ClientURL(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer nc2.Close()
	if js, err = jetstream.New(nc2); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 60*time.Second, 100*time.Millisecond, copyHas(25), "the application's copy, read on the node that lost its data")
	testutil.Eventually(t, 60*time.Second, 100*time.Millisecond, func() error {
		s, err := self.js.Stream(ctxT(t), cfgs[0].Stream.Name)
		if err != nil {
			return err
		}
		info := s.CachedInfo()
		for _, r := range info.Cluster.Replicas {
			if !r.Current || r.Offline {
				return fmt.Errorf("replica %s: current %t, offline %t", r.Name, r.Current, r.Offline)
			}
		}
		if info.State.Msgs != 25 {
			return fmt.Errorf("%d events in the stream, want 25", info.State.Msgs)
		}
		return nil
	}, "every replica of the stream current after a node lost its data")
}

// TestClosingNodeHandsOverItsStreams: a node that stops (a replica's
// SIGTERM) first hands the leadership of the streams it leads to another
// node, so that the stream has a leader again within moments rather than
// after an election that starts only once its heartbeats stop (at least
// 4 s in nats-server).
func TestClosingNodeHandsOverItsStreams(t *testing.T) {
	if testing.Short() {
		t.Skip("three servers")
	}
	_, cfgs, leader, nodes := startCluster(t)
	leader.Notify(streamtest.Profile(stream.ProfileCreated, "team-a", "c1", "1"))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := leader.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	self := selfConnect(t, leader)
	nc, err := nats.Connect("", nats.InProcessServer(leader.srv), nats.UserInfo(selfUser, selfPassword(leader)), nats.CustomInboxPrefix(selfInboxPrefix))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	name := cfgs[0].Stream.Name
	streamLeader := func() string {
		s, err := self.js.Stream(ctxT(t), name)
		if err != nil || s.CachedInfo().Cluster == nil {
			return ""
		}
		return s.CachedInfo().Cluster.Leader
	}
	// The stream led by a node other than the publisher's.
	testutil.Eventually(t, 30*time.Second, 200*time.Millisecond, func() error {
		switch l := streamLeader(); l {
		case "hubsync-1", "hubsync-2":
			return nil
		case "hubsync-0":
			_, _ = nc.Request("$JS.API.STREAM.LEADER.STEPDOWN."+name, nil, 2*time.Second)
			return fmt.Errorf("led by the publisher's node")
		default:
			return fmt.Errorf("no leader")
		}
	}, "the stream led by another node than the publisher's")
	victim := streamLeader()
	i := map[string]int{"hubsync-1": 1, "hubsync-2": 2}[victim]
	stopping := time.Now()
	if err := nodes[i].Close(); err != nil {
		t.Fatal(err)
	}
	closed := time.Now()
	// The hand-over waits for the new leader; a wait that hangs on a
	// question asked during the election runs out its whole bound.
	if took := closed.Sub(stopping); took >= handOverTimeout {
		t.Errorf("the node took %s to stop: its hand-over ran out its %s bound", took.Round(time.Millisecond), handOverTimeout)
	}
	testutil.Eventually(t, 2*time.Second, 20*time.Millisecond, func() error {
		if l := streamLeader(); l == "" || l == victim {
			return fmt.Errorf("led by %q", l)
		}
		return nil
	}, "a new leader of the stream within moments of the node's stop")
	t.Logf("the stream was led by %s; led by %s %s after its stop", victim, streamLeader(), time.Since(closed).Round(time.Millisecond))
}

// TestConsumerAddedWhileTheClusterRuns: the replicas reload an edited
// bus.consumers one after another, as the kubelet updates each pod's
// ConfigMap at its own moment, the publishing replica first. The new
// application's copies are made at the cluster's replica count once
// every node has its account, and it reads them on any node.
func TestConsumerAddedWhileTheClusterRuns(t *testing.T) {
	if testing.Short() {
		t.Skip("three servers")
	}
	_, cfgs, leader, nodes := startCluster(t)
	for i := range 5 {
		leader.Notify(streamtest.Profile(stream.ProfileCreated, "team-a", fmt.Sprintf("c%d", i), "1"))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := leader.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	late := newConsumerKey(t)
	consumers := append(cfgs[0].Consumers, config.BusConsumer{Name: "late", NKeys: []string{late.pub}})
	for _, i := range []int{0, 2, 1} {
		if err := nodes[i].SetConsumers(ctx, consumers); err != nil {
			t.Fatalf("node %d: %v", i, err)
		}
		t.Logf("node %d applied the consumers after %v", i, time.Since(t0))
		if i != 0 {
			continue
		}
		// The other pods' kubelets come later: meanwhile the copies
		// cannot be made (the leader has tried and will try again), and
		// the leader says so.
		testutil.Eventually(t, time.Minute, 100*time.Millisecond, func() error {
			leader.provMu.Lock()
			failed := !leader.provisionAt.IsZero()
			leader.provMu.Unlock()
			if st, ok := copyOf(leader.Copies(ctx), "late"); !failed || !ok || st.Err == nil {
				return fmt.Errorf("late's copies: %+v (watched: %t, a failed attempt: %t)", st, ok, failed)
			}
			return nil
		}, "the new application's copies reported failing while other nodes lack its account")
	}
	leader.Notify(streamtest.Profile(stream.ProfileCreated, "team-a", "c5", "1"))
	if err := leader.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, time.Minute, 200*time.Millisecond, func() error {
		st, _ := copyOf(leader.Copies(ctx), "late")
		if st.Err != nil || st.Events != 6 || st.Records != 6 {
			return fmt.Errorf("late's copies: %+v", st)
		}
		return nil
	}, "the new application's copies")
	t.Logf("the new application's copies after %v", time.Since(t0))
	for i, n := range nodes {
		nc, err := late.dial(n.ClientURL(), nil)
		if err != nil {
			t.Fatalf("node %d: %v", i, err)
		}
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, 30*time.Second, 100*time.Millisecond, func() error {
			s, err := js.Stream(ctx, cfgs[0].Stream.Name)
			if err != nil {
				return err
			}
			info := s.CachedInfo()
			if info.Config.Replicas != 3 || info.State.Msgs != 6 {
				return fmt.Errorf("%d replicas, %d events; want 3 and 6", info.Config.Replicas, info.State.Msgs)
			}
			return nil
		}, fmt.Sprintf("the new application's copy read on node %d", i))
		nc.Close()
	}
}
