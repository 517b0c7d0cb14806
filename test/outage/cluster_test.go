package outage

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "open-cluster-management.io/api/cluster/v1"

	"github.com/hubsync/hubsync/bus/bustest"
	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/events"
	"github.com/hubsync/hubsync/test/controlplane"
	"github.com/hubsync/hubsync/test/fleet"
	"github.com/hubsync/hubsync/test/pki"
	"github.com/hubsync/hubsync/test/testutil"
)

// clusterRig is three hubsync replicas whose embedded NATS servers form one
// JetStream cluster (routes over mutual TLS, the stream and bucket at three
// replicas), with leader election, and an application with an NKey of its
// own.
type clusterRig struct {
	t     *testing.T
	ctx   context.Context
	bin   string
	cp    *controlplane.ControlPlane
	hub   *fleet.Hub
	confs []config.Config
	ds    []*fleet.Daemon
	logs  []*fleet.LogBuffer
	// seedFile signs the application in; urls are the nodes' client URLs.
	seedFile string
	seed     nkeys.KeyPair
	urls     []string
}

func newClusterRig(ctx context.Context, t *testing.T) *clusterRig {
	t.Helper()
	r := &clusterRig{t: t, ctx: ctx, bin: testutil.Hubsync(t)}
	var err error
	r.cp, err = controlplane.Start(ctx)
	r.must(err)
	t.Cleanup(func() { _ = r.cp.Stop() })
	r.hub, err = fleet.NewHub(r.cp.Config)
	r.must(err)
	r.must(r.hub.Namespace(ctx, "open-cluster-management-hub"))
	r.must(r.hub.CreateExclusiveSet(ctx, "fleet"))
	r.must(r.hub.Namespace(ctx, "team-a"))
	r.must(r.hub.Bind(ctx, "team-a", "fleet", true))

	dir := t.TempDir()
	ca, err := pki.NewCA("hubsync-bus")
	r.must(err)
	caFile, err := ca.WriteCA(dir, "ca")
	r.must(err)
	r.seed, err = nkeys.CreateUser()
	r.must(err)
	pub, err := r.seed.PublicKey()
	r.must(err)
	seed, err := r.seed.Seed()
	r.must(err)
	r.seedFile = filepath.Join(dir, "app.nk")
	r.must(os.WriteFile(r.seedFile, seed, 0o600))

	var routes []string
	var routeAddrs, clientAddrs []string
	for range 3 {
		routeAddrs = append(routeAddrs, freeAddr(t))
		clientAddrs = append(clientAddrs, freeAddr(t))
	}
	for _, a := range routeAddrs {
		routes = append(routes, "nats://"+a)
	}
	for i := range 3 {
		pair, err := ca.Serving("127.0.0.1", "localhost")
		r.must(err)
		cert, key, err := pair.Write(dir, fmt.Sprintf("node-%d", i))
		r.must(err)
		conf := config.Config{}
		conf.LeaderElection.Enabled = true
		conf.LeaderElection.LeaseDuration.Duration = 6 * time.Second
		conf.LeaderElection.RenewDeadline.Duration = 4 * time.Second
		conf.LeaderElection.RetryPeriod.Duration = 500 * time.Millisecond
		conf.Bus.Stream.Replicas = 3
		conf.Bus.Embedded.Listen = clientAddrs[i]
		conf.Bus.Embedded.DataDir = filepath.Join(dir, fmt.Sprintf("nats-%d", i))
		conf.Bus.Embedded.Cluster = config.BusCluster{
			Name: "hubsync", Listen: routeAddrs[i], Routes: routes, ServerName: fmt.Sprintf("hubsync-%d", i),
			TLS: config.BusClusterTLS{CertFile: cert, KeyFile: key, CAFile: caFile},
		}
		conf.Bus.Consumers = []config.BusConsumer{{Name: "app", NKeys: []string{pub}, Namespaces: []string{"team-a"}}}
		r.confs = append(r.confs, conf)
		r.urls = append(r.urls, "nats://"+clientAddrs[i])
	}
	r.ds = make([]*fleet.Daemon, 3)
	r.logs = make([]*fleet.LogBuffer, 3)
	// Started together, as a StatefulSet with podManagementPolicy
	// Parallel starts its pods: a node is ready once the cluster has
	// formed around it.
	for i := range 3 {
		r.start(i)
	}
	for i := range 3 {
		r.waitReady(i)
	}
	t.Cleanup(func() {
		for _, d := range r.ds {
			if d != nil {
				_ = d.Stop()
			}
		}
		if t.Failed() {
			for i, l := range r.logs {
				t.Logf("replica %d's logs:\n%s", i, l.String())
			}
		}
	})
	return r
}

func (r *clusterRig) must(err error) {
	r.t.Helper()
	if err != nil {
		r.t.Fatal(err)
	}
}

// start starts replica i with its configuration and data.
func (r *clusterRig) start(i int) {
	r.t.Helper()
	r.logs[i] = &fleet.LogBuffer{}
	d, err := fleet.StartDaemon(r.ctx, r.bin, r.cp.Config, r.confs[i], r.logs[i])
	r.must(err)
	r.ds[i] = d
}

func (r *clusterRig) waitReady(i int) {
	r.t.Helper()
	if err := r.ds[i].WaitReady(r.ctx, 2*time.Minute); err != nil {
		r.t.Fatalf("replica %d not ready: %v\n%s", i, err, r.logs[i].String())
	}
}

// replace stops replica i (SIGTERM, or SIGKILL when kill) and starts it
// again with its data, as a StatefulSet replaces a pod.
func (r *clusterRig) replace(i int, kill bool) {
	r.t.Helper()
	if kill {
		r.must(r.ds[i].Kill())
	} else {
		r.must(r.ds[i].Stop())
	}
	r.start(i)
	r.waitReady(i)
}

// app connects as the application, to every node, with opts.
func (r *clusterRig) app(opts ...nats.Option) *nats.Conn {
	r.t.Helper()
	opt, err := nats.NkeyOptionFromSeed(r.seedFile)
	r.must(err)
	nc, err := nats.Connect(strings.Join(r.urls, ","), append(opts, opt, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))...)
	r.must(err)
	r.t.Cleanup(nc.Close)
	return nc
}

// storedEvents reads the events of the local consumer's copy on a node,
// which holds every event hubsync's stream holds.
func (r *clusterRig) storedEvents() ([]events.Event, error) {
	nc, err := nats.Connect(strings.Join(r.urls, ","))
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(r.ctx, 30*time.Second)
	defer cancel()
	cons, err := js.OrderedConsumer(ctx, config.DefaultStreamName, jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy})
	if err != nil {
		return nil, err
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return nil, err
	}
	// One consumer read with its iterator (Next on an ordered consumer
	// would make a new consumer for every message).
	it, err := cons.Messages()
	if err != nil {
		return nil, err
	}
	defer it.Stop()
	var out []events.Event
	for range info.NumPending {
		m, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			return nil, err
		}
		e, err := events.Decode(m.Data())
		if err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, nil
}

// TestClusteredBusKeepsEveryEvent: while the fleet changes continuously,
// one replica (its NATS node with it) is killed with SIGKILL and
// restarted, then every replica is replaced in turn (SIGTERM), as a
// rolling update does. Afterwards every change has exactly one event in
// the stream, the application (an NKey of its own, reading through any
// node) has received every event of its namespace, the bucket equals the
// hub, and hubsync events and hubsync state work against the cluster as
// the application.
func TestClusteredBusKeepsEveryEvent(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	r := newClusterRig(ctx, t)
	const clusters = 20
	for i := range clusters {
		_, err := r.hub.CreateCluster(ctx, fleet.ClusterSpec{Name: fmt.Sprintf("c%02d", i), Labels: fleet.ExclusiveSetLabels("fleet", nil)})
		r.must(err)
	}

	// The application follows its namespace with a durable consumer,
	// through whichever node it reaches.
	js, err := jetstream.New(r.app())
	r.must(err)
	var received sync.Map
	var cons jetstream.Consumer
	r.must(testutil.Poll(ctx, time.Minute, 200*time.Millisecond, func() error {
		var err error
		cons, err = js.CreateOrUpdateConsumer(ctx, config.DefaultStreamName, jetstream.ConsumerConfig{
			Durable: "app", AckPolicy: jetstream.AckExplicitPolicy, DeliverPolicy: jetstream.DeliverAllPolicy,
		})
		return err
	}))
	cc, err := cons.Consume(func(m jetstream.Msg) {
		if e, err := events.Decode(m.Data()); err == nil {
			received.Store(e.ID, true)
		}
		_ = m.Ack()
	})
	r.must(err)
	defer cc.Stop()

	// The fleet changes continuously: four writers each change a
	// cluster's version every 100 ms.
	var changes, failed atomic.Int64
	churnCtx, stopChurn := context.WithCancel(ctx)
	var churn sync.WaitGroup
	for range 4 {
		churn.Go(func() {
			for churnCtx.Err() == nil {
				name := fmt.Sprintf("c%02d", rand.IntN(clusters))
				if err := r.hub.UpdateClusterStatus(churnCtx, name, func(st *clusterv1.ManagedClusterStatus) {
					st.Version.Kubernetes = fmt.Sprintf("v1.35.%d", rand.IntN(1000))
				}); err != nil {
					failed.Add(1)
				} else {
					changes.Add(1)
				}
				select {
				case <-churnCtx.Done():
				case <-time.After(100 * time.Millisecond):
				}
			}
		})
	}
	churned := make(chan struct{})
	go func() { churn.Wait(); close(churned) }()

	r.replace(1, true)
	t.Logf("replica 1 killed (SIGKILL) and back; %d changes so far", changes.Load())
	for i := range 3 {
		r.replace(i, false)
		t.Logf("replica %d replaced (SIGTERM); %d changes so far", i, changes.Load())
	}
	stopChurn()
	<-churned

	// The hub converges: every profile has its cluster's last version.
	// Then the stream holds an event of each profile's current
	// resourceVersion, exactly once per id.
	want := map[string]string{}
	mcs, err := r.hub.Cluster.ClusterV1().ManagedClusters().List(ctx, metav1.ListOptions{})
	r.must(err)
	for _, mc := range mcs.Items {
		want[mc.Name] = mc.Status.Version.Kubernetes
	}
	var profiles, versions map[string]string
	r.must(testutil.Poll(ctx, 2*time.Minute, 200*time.Millisecond, func() error {
		ps, err := r.hub.ProfilesIn(ctx, "team-a")
		if err != nil {
			return err
		}
		profiles, versions = map[string]string{}, map[string]string{}
		for name, p := range ps {
			if v := p.Status.Version.Kubernetes; v != want[name] {
				return fmt.Errorf("%s's profile has version %q, its cluster %q", name, v, want[name])
			}
			profiles[name], versions[name] = p.ResourceVersion, p.Status.Version.Kubernetes
		}
		if len(profiles) != clusters {
			return fmt.Errorf("%d profiles", len(profiles))
		}
		return nil
	}))
	var stored []events.Event
	r.must(testutil.Poll(ctx, 2*time.Minute, 500*time.Millisecond, func() error {
		var err error
		if stored, err = r.storedEvents(); err != nil {
			return err
		}
		has := map[string]bool{}
		for _, e := range stored {
			if e.Data.Namespace == "team-a" && strings.HasPrefix(e.Type, "io.hubsync.profile.") {
				has[e.Data.Cluster+"@"+e.Data.ResourceVersion] = true
			}
		}
		for name, rv := range profiles {
			if !has[name+"@"+rv] {
				return fmt.Errorf("no event of %s at resourceVersion %s", name, rv)
			}
		}
		return nil
	}))
	ids := map[string]int{}
	for _, e := range stored {
		ids[e.ID]++
	}
	for id, n := range ids {
		if n > 1 {
			t.Errorf("event %s stored %d times", id, n)
		}
	}
	t.Logf("%d changes (%d failed writes), %d events stored, %d profiles", changes.Load(), failed.Load(), len(stored), len(profiles))

	// The application received every event of its namespace.
	r.must(testutil.Poll(ctx, time.Minute, 200*time.Millisecond, func() error {
		for _, e := range stored {
			if e.Data.Namespace != "team-a" {
				continue
			}
			if _, ok := received.Load(e.ID); !ok {
				return fmt.Errorf("event %s (%s %s) not received", e.ID, e.Type, e.Subject)
			}
		}
		return nil
	}))

	// hubsync state as the application: its copy of the bucket comes to
	// equal the hub (the server sources it, a node's restart holds it back
	// a moment).
	r.must(testutil.Poll(ctx, 2*time.Minute, 500*time.Millisecond, func() error {
		out, err := exec.CommandContext(ctx, r.bin, "state", "--server", strings.Join(r.urls, ","), "--nkey", r.seedFile, "-o", "json").Output()
		if err != nil {
			return fmt.Errorf("hubsync state: %w", err)
		}
		var records []struct {
			Cluster string `json:"cluster"`
			Profile struct {
				KubernetesVersion string `json:"kubernetesVersion"`
			} `json:"profile"`
		}
		if err := json.Unmarshal(out, &records); err != nil {
			return testutil.Stop(fmt.Errorf("hubsync state -o json: %w\n%s", err, out))
		}
		if len(records) != clusters {
			return fmt.Errorf("hubsync state: %d records, want %d", len(records), clusters)
		}
		for _, rec := range records {
			if v, ok := versions[rec.Cluster]; !ok || v != rec.Profile.KubernetesVersion {
				return fmt.Errorf("record of %s says %q; the hub's profile says %q", rec.Cluster, rec.Profile.KubernetesVersion, v)
			}
		}
		return nil
	}))
	// On the cluster too, the application's key writes and erases
	// nothing: every attempt is refused, and the stream holds what it
	// held.
	before, err := r.storedEvents()
	r.must(err)
	errs := bustest.NewErrors()
	names := bustest.Names{Prefix: config.DefaultSubjectPrefix, Stream: config.DefaultStreamName, Bucket: config.DefaultKVBucket, Namespace: "team-a"}
	if allowed := bustest.Attack(ctx, r.app(errs.Handler()), errs, names); len(allowed) > 0 {
		t.Errorf("the cluster allowed the application:\n%s", strings.Join(allowed, "\n"))
	}
	after, err := r.storedEvents()
	r.must(err)
	if len(after) != len(before) {
		t.Errorf("the stream held %d events before the application's attempts, %d after", len(before), len(after))
	}
	// hubsync events as the application.
	out, err := exec.CommandContext(ctx, r.bin, "events", "--server", strings.Join(r.urls, ","), "--nkey", r.seedFile,
		"--all", "--follow=false", "-o", "json").Output()
	r.must(err)
	if lines := strings.Count(string(out), "\n"); lines < len(profiles) {
		t.Errorf("hubsync events printed %d events", lines)
	}
}
