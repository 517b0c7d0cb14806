package bus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/events"
	"github.com/hubsync/hubsync/stream"
	"github.com/hubsync/hubsync/stream/streamtest"
	"github.com/hubsync/hubsync/test/testutil"
)

// testLog discards logs unless HUBSYNC_TEST_LOG is set.
func testLog() *slog.Logger {
	if os.Getenv("HUBSYNC_TEST_LOG") == "" {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func busConfig(t testing.TB) config.Bus {
	c := config.Default().Bus
	c.Stream.MaxAge, c.Stream.DuplicateWindow = metav1.Duration{Duration: time.Hour}, metav1.Duration{Duration: time.Minute}
	c.Embedded = config.BusEmbedded{Listen: "127.0.0.1:0", DataDir: filepath.Join(t.TempDir(), "nats")}
	return c
}

// testBus is a bus as hubsync runs it: the one consumer of a change
// stream's fan-out.
type testBus struct {
	*Bus
	f *stream.Fanout
}

// Notify sends a change down the stream to the bus.
func (tb *testBus) Notify(c stream.Change) { tb.f.Notify(c) }

// Flush waits until the bus has published every change notified so far.
func (tb *testBus) Flush(ctx context.Context) error { return tb.f.Flush(ctx) }

// Start starts the bus and the fan-out's worker.
func (tb *testBus) Start(ctx context.Context, snapshot func() []stream.Change) error {
	if err := tb.Bus.Start(ctx); err != nil {
		return err
	}
	return tb.f.Start(ctx, snapshot)
}

// Close delivers what is queued for a few seconds, as hubsync does on
// shutdown, then closes the bus.
func (tb *testBus) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	err := tb.f.Close(ctx)
	return errors.Join(err, tb.Bus.Close())
}

// depth is the number of changes queued for the bus.
func (tb *testBus) depth() int { return tb.f.Statuses()[0].QueueDepth }

// newBus makes a bus with short retry intervals in a fan-out, closed at
// the end of the test.
func newBus(t *testing.T, cfg config.Bus) (*testBus, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	b, err := New(cfg, "hubsync/test", testLog(), reg)
	if err != nil {
		t.Fatal(err)
	}
	b.reconnectWait, b.reconnectJitter = 50*time.Millisecond, 50*time.Millisecond
	f, err := stream.NewFanout(testLog(), reg)
	if err != nil {
		t.Fatal(err)
	}
	opts := b.ConsumerOptions()
	opts.RetryBase, opts.RetryMax = 10*time.Millisecond, 100*time.Millisecond
	if err := f.Add(opts, b); err != nil {
		t.Fatal(err)
	}
	tb := &testBus{Bus: b, f: f}
	t.Cleanup(func() { _ = tb.Close() })
	return tb, reg
}

func start(t *testing.T, b *testBus, snapshot func() []stream.Change) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := b.Start(ctx, snapshot); err != nil {
		t.Fatal(err)
	}
}

// runServer starts an external nats-server with JetStream on dir; port 0
// picks a free one. tweaks adjust the options (authentication, TLS).
func runServer(t *testing.T, dir string, port int, tweaks ...func(*server.Options)) *server.Server {
	t.Helper()
	if port == 0 {
		port = server.RANDOM_PORT
	}
	o := &server.Options{Host: "127.0.0.1", Port: port, JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true}
	for _, tweak := range tweaks {
		tweak(o)
	}
	s, err := server.NewServer(o)
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(5 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	return s
}

func stopServer(s *server.Server) {
	s.Shutdown()
	s.WaitForShutdown()
}

func freePort(t *testing.T) int {
	t.Helper()
	return freePorts(t, 1)[0]
}

// client is a consumer's view of the bus.
type client struct {
	js jetstream.JetStream
}

func connect(t *testing.T, url string) *client {
	t.Helper()
	return connectWith(t, url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
}

// selfConnect connects to the embedded server as hubsync itself does:
// in-process, with the password it was started with.
func selfConnect(t *testing.T, b *testBus) *client {
	t.Helper()
	return connectWith(t, "", nats.InProcessServer(b.srv), nats.UserInfo(selfUser, selfPassword(b)))
}

func connectWith(t *testing.T, url string, opts ...nats.Option) *client {
	t.Helper()
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return &client{js: js}
}

// selfPassword is the password of hubsync's own user on b's embedded
// server.
func selfPassword(b *testBus) string { return b.auth.selfPassword }

// ctxT bounds one request of a test (a poll's attempt among them).
func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// messages reads the whole stream in order.
func (c *client) messages(t *testing.T, stream string) []*jetstream.RawStreamMsg {
	t.Helper()
	ctx := ctxT(t)
	s, err := c.js.Stream(ctx, stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, m)
	}
	return out
}

// records reads every record in the KV bucket, by key, the way hubsync
// state does (Client.Records), which works on a consumer's copy too.
func (c *client) records(t *testing.T, bucket string) map[string]Record {
	t.Helper()
	stored, err := (&Client{js: c.js, timeout: 5 * time.Second}).Records(ctxT(t), bucket, "")
	if err != nil {
		if strings.Contains(err.Error(), "not found") {
			return map[string]Record{}
		}
		t.Fatal(err)
	}
	out := map[string]Record{}
	for _, r := range stored {
		if err := events.ValidateRecord(r.Value); err != nil {
			t.Errorf("record %s: %v", r.Key, err)
		}
		if r.Record != nil {
			out[r.Key] = *r.Record
		}
	}
	return out
}

// writerView connects to read what hubsync wrote: in-process as hubsync
// on the embedded server, else on the external server's URL.
func writerView(t *testing.T, b *testBus) *client {
	t.Helper()
	if b.srv != nil {
		return selfConnect(t, b)
	}
	return connect(t, b.ClientURL())
}

// consumerConnect connects to b's embedded server as the local consumer,
// on its listener, and waits until its copies have caught up with
// hubsync's stream and bucket.
func consumerConnect(t *testing.T, b *testBus, cfg config.Bus) *client {
	t.Helper()
	cl, self := connect(t, b.ClientURL()), selfConnect(t, b)
	eventually(t, "the local consumer's copies", func() bool {
		return len(cl.messages(t, cfg.Stream.Name)) == len(self.messages(t, cfg.Stream.Name)) &&
			len(cl.records(t, cfg.KVBucket)) == len(self.records(t, cfg.KVBucket))
	})
	return cl
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testutil.Eventually(t, 4*time.Second, 20*time.Millisecond, cond, "timed out waiting for %s", what)
}

// value reads a counter or gauge.
func value(m prometheus.Metric) float64 {
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		panic(err)
	}
	if d.Counter != nil {
		return d.Counter.GetValue()
	}
	return d.Gauge.GetValue()
}

// flush waits until b has published what it was told, generously: under
// the race detector, with other packages' tests on the same two cores, a
// first publish (the server's start, the stream's creation) has taken
// over 5 s.
func flush(t *testing.T, b *testBus) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := b.Flush(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestPublishInOrderPerSubject(t *testing.T) {
	for _, window := range []time.Duration{0, config.DefaultBatchWindow} {
		t.Run("batchWindow="+window.String(), func(t *testing.T) {
			testPublishInOrderPerSubject(t, window)
		})
	}
}

func testPublishInOrderPerSubject(t *testing.T, window time.Duration) {
	cfg := busConfig(t)
	cfg.BatchWindow = &metav1.Duration{Duration: window}
	b, reg := newBus(t, cfg)
	start(t, b, nil)
	keys := [][2]string{{"team-a", "c1"}, {"team-a", "edge.eu-1"}, {"team-b", "c1"}, {"team-b", "a.b.c"}}
	const perKey = 40
	for i := range perKey {
		for _, k := range keys {
			c := streamtest.Profile(stream.ProfileUpdated, k[0], k[1], strconv.Itoa(i))
			if i%4 == 3 {
				c = streamtest.Credential(stream.CredentialRotated, k[0], k[1], "kueue", strconv.Itoa(i))
			}
			b.Notify(c)
		}
	}
	flush(t, b)

	// A consumer on the embedded server's listener, not the in-process link.
	cl := consumerConnect(t, b, cfg)
	msgs := cl.messages(t, cfg.Stream.Name)
	if len(msgs) != perKey*len(keys) {
		t.Fatalf("stream holds %d events, want %d", len(msgs), perKey*len(keys))
	}
	last := map[string]int{}
	for _, m := range msgs {
		e, err := events.Decode(m.Data)
		if err != nil {
			t.Fatal(err)
		}
		if err := events.ValidateEvent(m.Data); err != nil {
			t.Error(err)
		}
		kind, _ := events.Kind(e.Type)
		if want := events.Subject("hubsync", e.Data.Namespace, e.Data.Cluster, kind); m.Subject != want {
			t.Errorf("subject %s, want %s", m.Subject, want)
		}
		if id := m.Header.Get(jetstream.MsgIDHeader); id != e.ID {
			t.Errorf("Nats-Msg-Id %q, event id %q", id, e.ID)
		}
		if ct := m.Header.Get("Content-Type"); ct != events.ContentType {
			t.Errorf("Content-Type %q", ct)
		}
		// Order per key: resourceVersions go up across both kinds.
		k := e.Data.Namespace + "/" + e.Data.Cluster
		rv, _ := strconv.Atoi(e.Data.ResourceVersion)
		if prev, ok := last[k]; ok && rv != prev+1 {
			t.Fatalf("%s: resourceVersion %d after %d", k, rv, prev)
		}
		last[k] = rv
	}
	// Each key's first word is an update of a profile consumers were never
	// told of: it is announced as its creation.
	if got := value(b.m.published.WithLabelValues(stream.ProfileCreated)); got != float64(len(keys)) {
		t.Errorf("published{profile.created} = %v, want %d", got, len(keys))
	}
	if got := value(b.m.published.WithLabelValues(stream.ProfileUpdated)); got != 3*perKey/4*float64(len(keys))-float64(len(keys)) {
		t.Errorf("published{profile.updated} = %v", got)
	}
	if got := value(b.m.connected); got != 1 {
		t.Errorf("hubsync_bus_connected = %v", got)
	}
	names := map[string]bool{}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		names[mf.GetName()] = true
	}
	for _, n := range []string{"hubsync_bus_events_published_total", "hubsync_sink_queue_depth", "hubsync_sink_delivered_total", "hubsync_bus_publish_duration_seconds",
		"hubsync_bus_connected", "hubsync_bus_kv_writes_total"} {
		if !names[n] {
			t.Errorf("metric %s not registered", n)
		}
	}
	// The KV bucket holds one record per key with the last of each.
	recs := cl.records(t, cfg.KVBucket)
	if len(recs) != len(keys) {
		t.Fatalf("%d records, want %d", len(recs), len(keys))
	}
	for _, k := range keys {
		r := recs[events.KVKey(k[0], k[1])]
		if r.Profile == nil || len(r.Credentials) != 1 || r.Credentials[0].ResourceVersion != strconv.Itoa(perKey-1) {
			t.Errorf("record %v: %+v", k, r)
		}
	}
}

// A server that goes away with batches in flight and comes back: every
// change is stored once, in order per key, and the KV holds the last of
// each.
func TestServerRestartMidBurstKeepsOrder(t *testing.T) {
	cfg := busConfig(t)
	port := freePort(t)
	dir := t.TempDir()
	cfg.URLs = []string{fmt.Sprintf("nats://127.0.0.1:%d", port)}
	s := runServer(t, dir, port)
	b, _ := newBus(t, cfg)
	start(t, b, nil)
	eventually(t, "connected", func() bool { return value(b.m.connected) == 1 })

	keys := [][2]string{{"team-a", "c1"}, {"team-a", "c2"}, {"team-b", "c1"}, {"team-b", "c2"}, {"team-c", "c3"}}
	const perKey = 400
	total := perKey * len(keys)
	published := func() float64 { return value(b.m.published.WithLabelValues(stream.ProfileUpdated)) }
	for i := range perKey {
		for _, k := range keys {
			c := streamtest.Profile(stream.ProfileUpdated, k[0], k[1], strconv.Itoa(i))
			c.Profile.KubernetesVersion = fmt.Sprintf("v1.%d.0", i)
			b.Notify(c)
		}
		if i == perKey/2 {
			// Mid-burst: once some of it is stored, the server goes away
			// with the rest queued or in flight.
			eventually(t, "part of the burst published", func() bool { return published() >= 50 })
			stopServer(s)
			if got := published(); got >= float64(total) {
				t.Fatalf("the whole burst was published before the server stopped (%v)", got)
			}
		}
	}
	eventually(t, "the bus sees the server gone", func() bool { return value(b.m.connected) == 0 })
	runServer(t, dir, port)
	flush(t, b)

	cl := writerView(t, b)
	msgs := cl.messages(t, cfg.Stream.Name)
	next := map[string]int{}
	for _, m := range msgs {
		e, err := events.Decode(m.Data)
		if err != nil {
			t.Fatal(err)
		}
		k := e.Data.Namespace + "/" + e.Data.Cluster
		rv, _ := strconv.Atoi(e.Data.ResourceVersion)
		if rv != next[k] {
			t.Fatalf("%s: resourceVersion %d where %d was due (lost, repeated or reordered)", k, rv, next[k])
		}
		next[k]++
	}
	if len(msgs) != perKey*len(keys) {
		t.Fatalf("stream holds %d events, want %d", len(msgs), perKey*len(keys))
	}
	recs := cl.records(t, cfg.KVBucket)
	for _, k := range keys {
		if r := recs[events.KVKey(k[0], k[1])]; r.Profile == nil || r.Profile.KubernetesVersion != fmt.Sprintf("v1.%d.0", perKey-1) {
			t.Errorf("record %v: %+v", k, r.Profile)
		}
	}
}

// Someone deletes the stream and the bucket while hubsync is connected:
// the next change recreates them, and the bucket is refilled with the
// whole current state, not just that change.
func TestDeletedStreamAndBucketAreRecreated(t *testing.T) {
	cfg := busConfig(t)
	b, _ := newBus(t, cfg)
	syn := &snapshotOf{}
	start(t, b, syn.snapshot)
	var state []stream.Change
	for i := range 3 {
		c := streamtest.Profile(stream.ProfileCreated, "team-a", fmt.Sprintf("c%d", i), "1")
		state = append(state, c)
		syn.set(state)
		b.Notify(c)
	}
	flush(t, b)
	// Only hubsync itself may delete them on the embedded server.
	cl := selfConnect(t, b)
	eventually(t, "three records", func() bool { return len(cl.records(t, cfg.KVBucket)) == 3 })

	ctx := ctxT(t)
	if err := cl.js.DeleteStream(ctx, cfg.Stream.Name); err != nil {
		t.Fatal(err)
	}
	if err := cl.js.DeleteKeyValue(ctx, cfg.KVBucket); err != nil {
		t.Fatal(err)
	}
	c := streamtest.Profile(stream.ProfileCreated, "team-a", "c3", "1")
	state = append(state, c)
	syn.set(state)
	b.Notify(c)
	eventually(t, "the bucket refilled with all four", func() bool { return len(cl.records(t, cfg.KVBucket)) == 4 })
	eventually(t, "the new event in the recreated stream", func() bool {
		for _, m := range cl.messages(t, cfg.Stream.Name) {
			if e, err := events.Decode(m.Data); err == nil && e.Data.Cluster == "c3" {
				return true
			}
		}
		return false
	})
}

// eventTypes lists the types of the stored events about one pair, in order.
func eventTypes(t *testing.T, cl *client, cfg config.Bus, ns, cluster string) []string {
	t.Helper()
	var out []string
	for _, m := range cl.messages(t, cfg.Stream.Name) {
		e, err := events.Decode(m.Data)
		if err != nil {
			t.Fatal(err)
		}
		if err := events.ValidateEvent(m.Data); err != nil {
			t.Error(err)
		}
		if e.Data.Namespace == ns && e.Data.Cluster == cluster {
			out = append(out, e.Type)
		}
	}
	return out
}

// hubsync restarts after a profile and a credential went away while it was
// not running: the resync removes their records and announces both
// removals, with what consumers last knew of them, and nothing else.
func TestRestartAnnouncesRemovalsMissedWhileDown(t *testing.T) {
	cfg := busConfig(t)
	cfg.URLs = []string{runServer(t, t.TempDir(), 0).ClientURL()}
	first, _ := newBus(t, cfg)
	start(t, first, nil)
	for _, c := range []stream.Change{
		streamtest.Profile(stream.ProfileCreated, "team-a", "stays", "1"),
		streamtest.Credential(stream.CredentialSynced, "team-a", "stays", "kueue", "2"),
		streamtest.Credential(stream.CredentialSynced, "team-a", "stays", "argocd", "3"),
		streamtest.Profile(stream.ProfileCreated, "team-a", "goes", "4"),
	} {
		first.Notify(c)
	}
	flush(t, first)
	_ = first.Close()

	// Meanwhile "goes" lost its profile and "stays" its argocd copy.
	now := []stream.Change{
		streamtest.Profile(stream.ProfileUpdated, "team-a", "stays", "1"),
		streamtest.Credential(stream.CredentialSynced, "team-a", "stays", "kueue", "2"),
	}
	second, _ := newBus(t, cfg)
	start(t, second, func() []stream.Change { return now })
	cl := connect(t, cfg.URLs[0])
	eventually(t, "the bucket to match the new state", func() bool {
		recs := cl.records(t, cfg.KVBucket)
		r, ok := recs[events.KVKey("team-a", "stays")]
		return len(recs) == 1 && ok && len(r.Credentials) == 1
	})
	flush(t, second)
	if got := eventTypes(t, cl, cfg, "team-a", "goes"); !slices.Equal(got, []string{stream.ProfileCreated, stream.ProfileDeleted}) {
		t.Errorf("goes: %v", got)
	}
	// The snapshot's kueue copy is the change stored before: a duplicate.
	want := []string{stream.ProfileCreated, stream.CredentialSynced, stream.CredentialSynced,
		stream.ProfileUpdated, stream.CredentialRemoved}
	if got := eventTypes(t, cl, cfg, "team-a", "stays"); !slices.Equal(got, want) {
		t.Errorf("stays: %v, want %v", got, want)
	}
	for _, m := range cl.messages(t, cfg.Stream.Name) {
		e, _ := events.Decode(m.Data)
		switch e.Type {
		case stream.ProfileDeleted:
			if e.Data.Profile == nil || e.Data.Profile.KubernetesVersion != "v1.35.4" {
				t.Errorf("the deletion does not carry what consumers knew: %+v", e.Data.Profile)
			}
		case stream.CredentialRemoved:
			if e.Data.Credential == nil || e.Data.Credential.ManagedServiceAccount != "argocd" || e.Data.Name != "stays-argocd" {
				t.Errorf("wrong removal: %+v", e.Data)
			}
		}
	}
}

// publishAndClose runs a bus (an earlier leader, an earlier run) that
// publishes changes and stops.
func publishAndClose(t *testing.T, cfg config.Bus, changes ...stream.Change) {
	t.Helper()
	b, _ := newBus(t, cfg)
	start(t, b, nil)
	for _, c := range changes {
		b.Notify(c)
	}
	flush(t, b)
	_ = b.Close()
}

// A replica that led before was killed with a profile's creation still
// queued: the next leader's resync finds no KV record of it and announces
// it as created, with the id the lost announcement would have had; a
// profile the KV knows is announced as updated.
func TestResyncAnnouncesUnknownProfilesAsCreated(t *testing.T) {
	cfg := busConfig(t)
	cfg.URLs = []string{runServer(t, t.TempDir(), 0).ClientURL()}
	publishAndClose(t, cfg, streamtest.Profile(stream.ProfileCreated, "team-a", "known", "1"))

	now := []stream.Change{
		streamtest.Profile(stream.ProfileUpdated, "team-a", "known", "1"),
		streamtest.Profile(stream.ProfileUpdated, "team-a", "lost", "2"),
	}
	second, _ := newBus(t, cfg)
	start(t, second, func() []stream.Change { return now })
	cl := connect(t, cfg.URLs[0])
	eventually(t, "both records in the bucket", func() bool { return len(cl.records(t, cfg.KVBucket)) == 2 })
	flush(t, second)
	// The syncer's own word on it comes after the resync's: not a second
	// creation.
	second.Notify(streamtest.Profile(stream.ProfileCreated, "team-a", "lost", "3"))
	flush(t, second)
	// Then, like every profile, re-announced as it is when the bus connects.
	if got := eventTypes(t, cl, cfg, "team-a", "lost"); len(got) == 0 || got[0] != stream.ProfileCreated || slices.Contains(got[1:], stream.ProfileCreated) {
		t.Errorf("lost: %v, want one creation first", got)
	}
	if got := eventTypes(t, cl, cfg, "team-a", "known"); !slices.Equal(got, []string{stream.ProfileCreated, stream.ProfileUpdated}) {
		t.Errorf("known: %v", got)
	}
	want := streamtest.Profile(stream.ProfileCreated, "team-a", "lost", "2")
	for _, m := range cl.messages(t, cfg.Stream.Name) {
		if e, _ := events.Decode(m.Data); e.Data.Cluster == "lost" && e.Type == stream.ProfileCreated && e.ID != events.ID(want) {
			t.Errorf("the creation's id %s is not the id of the lost announcement %s", e.ID, events.ID(want))
		}
	}
}

// The same, when the next leader's first word on such a profile is an
// update (it finished the status write the killed replica began) before
// any resync: the bus asks the KV bucket and announces a creation.
func TestDeliverAnnouncesUnknownProfilesAsCreated(t *testing.T) {
	cfg := busConfig(t)
	cfg.URLs = []string{runServer(t, t.TempDir(), 0).ClientURL()}
	publishAndClose(t, cfg, streamtest.Profile(stream.ProfileCreated, "team-a", "known", "1"))

	second, _ := newBus(t, cfg)
	start(t, second, nil) // no snapshot: no resync
	for _, c := range []stream.Change{
		streamtest.Profile(stream.ProfileUpdated, "team-a", "known", "2"),
		streamtest.Profile(stream.ProfileUpdated, "team-a", "lost", "3"),
		streamtest.Profile(stream.ProfileUpdated, "team-a", "lost", "4"),
		streamtest.Profile(stream.ProfileCreated, "team-a", "new", "5"),
		streamtest.Profile(stream.ProfileUpdated, "team-a", "new", "6"),
		streamtest.Profile(stream.ProfileDeleted, "team-a", "new", "7"),
		streamtest.Profile(stream.ProfileCreated, "team-a", "new", "8"),
	} {
		second.Notify(c)
	}
	flush(t, second)
	cl := connect(t, cfg.URLs[0])
	for cluster, want := range map[string][]string{
		"known": {stream.ProfileCreated, stream.ProfileUpdated},
		"lost":  {stream.ProfileCreated, stream.ProfileUpdated},
		"new":   {stream.ProfileCreated, stream.ProfileUpdated, stream.ProfileDeleted, stream.ProfileCreated},
	} {
		if got := eventTypes(t, cl, cfg, "team-a", cluster); !slices.Equal(got, want) {
			t.Errorf("%s: %v, want %v", cluster, got, want)
		}
	}
}

func TestRepublishedChangeIsStoredOnce(t *testing.T) {
	cfg := busConfig(t)
	b, _ := newBus(t, cfg)
	start(t, b, nil)
	c := streamtest.Profile(stream.ProfileCreated, "team-a", "c1", "7")
	for range 3 {
		b.Notify(c)
	}
	later := c
	later.Time = streamtest.Time.Add(time.Minute) // not part of the identity
	b.Notify(later)
	b.Notify(streamtest.Profile(stream.ProfileUpdated, "team-a", "c1", "7"))
	flush(t, b)
	msgs := writerView(t, b).messages(t, cfg.Stream.Name)
	if len(msgs) != 2 {
		t.Fatalf("stream holds %d events, want 2 (created once, updated once)", len(msgs))
	}
	if got := value(b.m.duplicates); got != 3 {
		t.Errorf("duplicates = %v, want 3", got)
	}
}

func TestKVFollowsChanges(t *testing.T) {
	cfg := busConfig(t)
	b, _ := newBus(t, cfg)
	start(t, b, nil)
	cl := writerView(t, b)
	key := events.KVKey("team-a", "edge.eu-1")
	step := func(c stream.Change) Record {
		t.Helper()
		b.Notify(c)
		flush(t, b)
		return cl.records(t, cfg.KVBucket)[key]
	}
	r := step(streamtest.Profile(stream.ProfileCreated, "team-a", "edge.eu-1", "1"))
	if r.Profile == nil || r.Profile.KubernetesVersion != "v1.35.4" || len(r.Credentials) != 0 || r.Credentials == nil {
		t.Fatalf("after create: %+v", r)
	}
	step(streamtest.Credential(stream.CredentialSynced, "team-a", "edge.eu-1", "kueue", "2"))
	r = step(streamtest.Credential(stream.CredentialSynced, "team-a", "edge.eu-1", "argocd", "3"))
	if len(r.Credentials) != 2 || r.Credentials[0].ManagedServiceAccount != "argocd" {
		t.Fatalf("after two syncs: %+v", r.Credentials)
	}
	rot := streamtest.Credential(stream.CredentialRotated, "team-a", "edge.eu-1", "kueue", "4")
	rot.Credential.Fingerprint = "sha256:fedcba9876543210"
	r = step(rot)
	if len(r.Credentials) != 2 || r.Credentials[1].Fingerprint != "sha256:fedcba9876543210" {
		t.Fatalf("after rotation: %+v", r.Credentials)
	}
	r = step(streamtest.Credential(stream.CredentialRemoved, "team-a", "edge.eu-1", "argocd", "5"))
	if len(r.Credentials) != 1 || r.Credentials[0].ManagedServiceAccount != "kueue" || r.Profile == nil {
		t.Fatalf("after removal: %+v", r)
	}
	step(streamtest.Profile(stream.ProfileDeleted, "team-a", "edge.eu-1", "6"))
	kv, err := cl.js.KeyValue(ctxT(t), cfg.KVBucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Get(ctxT(t), key); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("after profile deleted: Get = %v, want ErrKeyNotFound", err)
	}
	if got := value(b.m.kvWrites.WithLabelValues("delete")); got != 1 {
		t.Errorf("kv deletes = %v, want 1", got)
	}
}

// snapshotOf is a syncer whose current state a test sets.
type snapshotOf struct {
	mu    sync.Mutex
	state []stream.Change
	calls int
}

func (s *snapshotOf) set(c []stream.Change) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.state = c
}

func (s *snapshotOf) snapshot() []stream.Change {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	return slices.Clone(s.state)
}

func TestStartDoesNotWaitForALateServer(t *testing.T) {
	cfg := busConfig(t)
	port := freePort(t)
	cfg.URLs = []string{fmt.Sprintf("nats://127.0.0.1:%d", port)}
	b, _ := newBus(t, cfg)
	begin := time.Now()
	start(t, b, nil)
	if d := time.Since(begin); d > 500*time.Millisecond {
		t.Fatalf("Start took %v with NATS down", d)
	}
	for i := range 5 {
		b.Notify(streamtest.Profile(stream.ProfileUpdated, "team-a", "c1", strconv.Itoa(i)))
	}
	// The bus tries, fails, and keeps the changes queued.
	eventually(t, "a failed connection attempt", func() bool { return b.reconnectFailures.Load() >= 1 })
	if got := b.depth(); got != 5 {
		t.Fatalf("%d changes queued while NATS is down, want 5", got)
	}
	runServer(t, t.TempDir(), port)
	flush(t, b)
	msgs := writerView(t, b).messages(t, cfg.Stream.Name)
	if len(msgs) != 5 {
		t.Fatalf("stream holds %d events, want 5", len(msgs))
	}
	for i, m := range msgs {
		if e, _ := events.Decode(m.Data); e.Data.ResourceVersion != strconv.Itoa(i) {
			t.Errorf("event %d has resourceVersion %s", i, e.Data.ResourceVersion)
		}
	}
	eventually(t, "hubsync_bus_connected 1", func() bool { return value(b.m.connected) == 1 })
}

func TestFullBufferDropsAndResyncs(t *testing.T) {
	cfg := busConfig(t)
	cfg.BufferSize = 3
	port := freePort(t)
	cfg.URLs = []string{fmt.Sprintf("nats://127.0.0.1:%d", port)}
	b, reg := newBus(t, cfg)
	syn := &snapshotOf{}
	start(t, b, syn.snapshot)

	// NATS is down: ten clusters appear, only three fit in the buffer.
	var state []stream.Change
	for i := range 10 {
		c := streamtest.Profile(stream.ProfileCreated, "team-a", fmt.Sprintf("c%d.example", i), "1")
		state = append(state, c)
		b.Notify(c)
	}
	syn.set(state)
	if got := sinkMetric(t, reg, "hubsync_sink_dropped_total"); got != 7 {
		t.Fatalf("dropped = %v, want 7", got)
	}
	if got := b.depth(); got != 3 {
		t.Fatalf("buffer depth = %d, want 3", got)
	}

	dir := t.TempDir()
	srv := runServer(t, dir, port)
	cl := connect(t, cfg.URLs[0])
	eventually(t, "all ten records", func() bool { return len(cl.records(t, cfg.KVBucket)) == 10 })
	flush(t, b)
	// The buffered three and the snapshot's ten are the same changes: the
	// ids make JetStream keep each once.
	if msgs := cl.messages(t, cfg.Stream.Name); len(msgs) != 10 {
		t.Errorf("stream holds %d events, want 10", len(msgs))
	}
	if got := value(b.m.resyncs); got < 1 {
		t.Errorf("resyncs = %v", got)
	}

	// While NATS is down, c0 loses its profile and c10 appears. After the
	// reconnect the KV bucket shows exactly the current state.
	stopServer(srv)
	eventually(t, "disconnected", func() bool { return value(b.m.connected) == 0 })
	state = append(state[1:], streamtest.Profile(stream.ProfileCreated, "team-a", "c10.example", "1"))
	syn.set(state)
	resyncs := value(b.m.resyncs)
	srv = runServer(t, dir, port)
	eventually(t, "a resync after the reconnect", func() bool { return value(b.m.resyncs) > resyncs })
	eventually(t, "the KV bucket to show the new state", func() bool {
		recs := cl.records(t, cfg.KVBucket)
		_, gone := recs[events.KVKey("team-a", "c0.example")]
		_, added := recs[events.KVKey("team-a", "c10.example")]
		return len(recs) == 10 && !gone && added
	})
	// c0's deletion was never notified (a dropped change): the resync
	// tells event consumers it is gone.
	flush(t, b)
	if got := eventTypes(t, cl, cfg, "team-a", "c0.example"); !slices.Equal(got, []string{stream.ProfileCreated, stream.ProfileDeleted}) {
		t.Errorf("c0's events: %v", got)
	}

	// A server that lost its data: stream and bucket are recreated and
	// refilled.
	stopServer(srv)
	eventually(t, "disconnected", func() bool { return value(b.m.connected) == 0 })
	runServer(t, t.TempDir(), port)
	eventually(t, "records on the new server", func() bool { return len(cl.records(t, cfg.KVBucket)) == 10 })
	eventually(t, "events on the new server", func() bool { return len(cl.messages(t, cfg.Stream.Name)) == 10 })
}

func TestSnapshotNotReadyIsRetried(t *testing.T) {
	cfg := busConfig(t)
	b, _ := newBus(t, cfg)
	syn := &snapshotOf{} // nil state: not known yet
	start(t, b, syn.snapshot)
	cl := writerView(t, b)
	eventually(t, "the state asked for while unknown", func() bool {
		syn.mu.Lock()
		defer syn.mu.Unlock()
		return syn.calls >= 1
	})
	syn.set([]stream.Change{streamtest.Profile(stream.ProfileCreated, "team-a", "c1", "1")})
	eventually(t, "the record once the state is known", func() bool { return len(cl.records(t, cfg.KVBucket)) == 1 })
	syn.mu.Lock()
	calls := syn.calls
	syn.mu.Unlock()
	if calls < 2 {
		t.Errorf("snapshot called %d times, want a retry", calls)
	}
}

func TestCloseDrains(t *testing.T) {
	srv := runServer(t, t.TempDir(), 0)
	cfg := busConfig(t)
	cfg.URLs = []string{srv.ClientURL()}
	b, _ := newBus(t, cfg)
	start(t, b, nil)
	eventually(t, "connected", func() bool { return b.connected() })
	for i := range 50 {
		b.Notify(streamtest.Profile(stream.ProfileUpdated, "team-a", "c1", strconv.Itoa(i)))
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if msgs := connect(t, srv.ClientURL()).messages(t, cfg.Stream.Name); len(msgs) != 50 {
		t.Errorf("stream holds %d events after Close, want 50", len(msgs))
	}
	b.Notify(streamtest.Profile(stream.ProfileUpdated, "team-a", "c1", "late")) // ignored, no panic
}

func TestUnpublishableChangeIsSkipped(t *testing.T) {
	cfg := busConfig(t)
	b, _ := newBus(t, cfg)
	start(t, b, nil)
	b.Notify(stream.Change{Type: stream.ProfileUpdated, Cluster: "c1"}) // no namespace
	b.Notify(stream.Change{Type: "bogus", Namespace: "n", Cluster: "c1"})
	b.Notify(streamtest.Profile(stream.ProfileUpdated, "team-a", "c1", "1"))
	flush(t, b)
	if msgs := writerView(t, b).messages(t, cfg.Stream.Name); len(msgs) != 1 {
		t.Errorf("stream holds %d events, want 1", len(msgs))
	}
	if got := value(b.m.publishErrors); got != 2 {
		t.Errorf("publish errors = %v, want 2", got)
	}
}

func TestNewAndStartErrors(t *testing.T) {
	def := config.Default().Bus
	if _, err := New(def, "", testLog(), nil); err == nil {
		t.Error("New accepted an empty source")
	}
	// The bus has no defaults of its own: it names what was left unset.
	if _, err := New(config.Bus{}, "s", testLog(), nil); err == nil || !strings.Contains(err.Error(), "bus.kvBucket") {
		t.Errorf("New(an empty configuration) = %v; want an error naming bus.kvBucket", err)
	}
	reg := prometheus.NewRegistry()
	if _, err := New(def, "s", testLog(), reg); err != nil {
		t.Fatal(err)
	}
	if _, err := New(def, "s", testLog(), reg); err == nil {
		t.Error("New registered the same metrics twice")
	}
	for name, mutate := range map[string]func(*config.Bus){
		"missing nkey seed": func(c *config.Bus) {
			c.URLs = []string{"nats://127.0.0.1:1"}
			c.NKeySeedFile = filepath.Join(t.TempDir(), "missing.nk")
		},
		"missing CA": func(c *config.Bus) {
			c.URLs = []string{"tls://127.0.0.1:1"}
			c.TLS.CAFile = filepath.Join(t.TempDir(), "missing.pem")
		},
		"bad listen address": func(c *config.Bus) { c.Embedded.Listen = "nope" },
		"data dir is a file": func(c *config.Bus) {
			f := filepath.Join(t.TempDir(), "file")
			if err := os.WriteFile(f, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			c.Embedded.DataDir = f
		},
	} {
		t.Run(name, func(t *testing.T) {
			cfg := busConfig(t)
			mutate(&cfg)
			b, _ := newBus(t, cfg)
			err := b.Start(context.Background(), nil)
			if err == nil {
				t.Fatal("Start succeeded")
			}
			if strings.Contains(err.Error(), "BEGIN") {
				t.Errorf("error shows file contents: %v", err)
			}
		})
	}
}

func TestRedactURLs(t *testing.T) {
	got := RedactURLs([]string{"nats://user:secret@h:4222", "nats://s3cr3tt0ken@h:4222", "tls://h:4222"})
	if strings.Contains(got, "secret") || strings.Contains(got, "s3cr3tt0ken") || !strings.Contains(got, "tls://h:4222") {
		t.Errorf("RedactURLs = %s", got)
	}
}

// sinkMetric reads the bus's series of a per-sink counter.
func sinkMetric(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	m, err := testutil.Gather(reg)
	if err != nil {
		t.Fatal(err)
	}
	return m.Value(name, map[string]string{"sink": Name})
}
