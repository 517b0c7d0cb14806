package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	clusterv1beta2 "open-cluster-management.io/api/cluster/v1beta2"

	"github.com/hubsync/hubsync/bus"
	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/events"
	"github.com/hubsync/hubsync/hub"
	"github.com/hubsync/hubsync/stream"
	"github.com/hubsync/hubsync/syncer"
	"github.com/hubsync/hubsync/test/fleet"
	"github.com/hubsync/hubsync/test/leak"
	"github.com/hubsync/hubsync/test/testutil"
)

// event is the part of a CloudEvent the tests read.
type event struct {
	ID      string `json:"id"`
	Type    string `json:"type"`
	Subject string `json:"subject"`
	Data    struct {
		Namespace       string                    `json:"namespace"`
		Cluster         string                    `json:"cluster"`
		Name            string                    `json:"name"`
		ResourceVersion string                    `json:"resourceVersion"`
		Profile         *stream.ProfileSummary    `json:"profile"`
		Credential      *stream.CredentialSummary `json:"credential"`
	} `json:"data"`
	subject string // the NATS subject
	raw     []byte
}

// busFixture runs an embedded bus for a harness and reads what it stores.
type busFixture struct {
	t   *testing.T
	cfg config.Bus
	bus *bus.Bus
	fan *stream.Fanout
	nc  *nats.Conn
	js  jetstream.JetStream
}

// withBus gives the harness's syncer an embedded NATS bus on a free
// loopback port; the fixture is filled in when the harness starts.
func withBus(t *testing.T, f *busFixture) harnessOption {
	cfg := config.Default().Bus
	cfg.Embedded.Listen = "127.0.0.1:0"
	cfg.Embedded.DataDir = t.TempDir()
	f.t, f.cfg = t, cfg
	reg := prometheus.NewRegistry()
	b, err := bus.New(cfg, "hubsync/"+manager, slog.New(slog.DiscardHandler), reg)
	if err != nil {
		t.Fatal(err)
	}
	fan, err := stream.NewFanout(slog.New(slog.DiscardHandler), reg)
	if err != nil {
		t.Fatal(err)
	}
	if err := fan.Add(b.ConsumerOptions(), b); err != nil {
		t.Fatal(err)
	}
	f.bus, f.fan = b, fan
	return withOptions(func(o *syncer.Options) { o.Notifier = fan })
}

// start starts the bus with the syncer's snapshot and connects a reader.
func (f *busFixture) start(h *harness) {
	t := f.t
	h.must(f.bus.Start(h.ctx))
	h.must(f.fan.Start(h.ctx, h.syncer.Snapshot))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_ = f.fan.Close(ctx)
		_ = f.bus.Close()
	})
	nc, err := nats.Connect(f.bus.ClientURL())
	h.must(err)
	t.Cleanup(nc.Close)
	f.nc = nc
	f.js, err = jetstream.New(nc)
	h.must(err)
}

// followNew hands fn the events on subject from now on, as a consumer
// follows them (nats sub '<subject>' --new): through an ordered consumer
// of the consumer's copy, found by subject.
func (f *busFixture) followNew(subject string, fn nats.MsgHandler) (*nats.Subscription, error) {
	js, err := f.nc.JetStream()
	if err != nil {
		return nil, err
	}
	return js.Subscribe(subject, fn, nats.OrderedConsumer(), nats.DeliverNew())
}

// events reads every event stored in the stream, validating each against
// the published JSON Schema.
func (f *busFixture) events(ctx context.Context) []event {
	f.t.Helper()
	stream, err := f.js.Stream(ctx, f.cfg.Stream.Name)
	if err != nil {
		f.t.Fatal(err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		f.t.Fatal(err)
	}
	var out []event
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := stream.GetMsg(ctx, seq)
		if err != nil {
			continue // deleted or expired
		}
		if err := events.ValidateEvent(m.Data); err != nil {
			f.t.Fatalf("event %d does not validate: %v\n%s", seq, err, m.Data)
		}
		var e event
		if err := json.Unmarshal(m.Data, &e); err != nil {
			f.t.Fatal(err)
		}
		if m.Header.Get("Nats-Msg-Id") != e.ID {
			f.t.Fatalf("Nats-Msg-Id %q != event id %q", m.Header.Get("Nats-Msg-Id"), e.ID)
		}
		e.subject, e.raw = m.Subject, m.Data
		out = append(out, e)
	}
	return out
}

// typesFor lists the event types stored for one (namespace, cluster, kind)
// subject, in stream order.
func typesFor(evs []event, prefix, ns, cluster, kind string) []string {
	subject := events.Subject(prefix, ns, cluster, kind)
	var out []string
	for _, e := range evs {
		if e.subject == subject {
			out = append(out, strings.TrimPrefix(e.Type, "io.hubsync."))
		}
	}
	return out
}

// record reads the KV access record of (ns, cluster); nil when absent.
func (f *busFixture) record(ctx context.Context, ns, cluster string) map[string]any {
	f.t.Helper()
	kv, err := f.js.KeyValue(ctx, f.cfg.KVBucket)
	if err != nil {
		f.t.Fatal(err)
	}
	e, err := kv.Get(ctx, events.KVKey(ns, cluster))
	if err != nil {
		return nil
	}
	if err := events.ValidateRecord(e.Value()); err != nil {
		f.t.Fatalf("record %s/%s does not validate: %v", ns, cluster, err)
	}
	var r map[string]any
	if err := json.Unmarshal(e.Value(), &r); err != nil {
		f.t.Fatal(err)
	}
	return r
}

func TestEventsAndState(t *testing.T) {
	var bf busFixture
	proxyNS := fmt.Sprintf("proxy-ev-%d", testSeq.Load()+1)
	h := newHarness(t, withCredentials(t), withBus(t, &bf), withOptions(func(o *syncer.Options) {
		o.AccessProviders = []config.AccessProvider{{
			Name: "open-cluster-management", Type: config.ProviderServer,
			Server:   "https://cluster-proxy-addon-user." + proxyNS + ":9092/{{.ClusterName}}",
			CASecret: &config.SecretKeyRef{Namespace: proxyNS, Name: "ca", Key: "tls.crt"},
		}}
	}))
	bf.start(h)
	prefix := bf.cfg.SubjectPrefix
	h.must(h.hub.Namespace(h.ctx, proxyNS))
	putCA := func(ca string) {
		h.t.Helper()
		h.must(h.hub.PutSecret(h.ctx, proxyNS, "ca", map[string][]byte{"tls.crt": []byte(ca)}))
	}
	putCA("CA-1")
	ns := h.namespaces("a", "b")
	red, blue := h.name("red"), h.name("blue")
	h.must(h.hub.CreateExclusiveSet(h.ctx, red))
	h.must(h.hub.CreateExclusiveSet(h.ctx, blue))
	c := h.name("c")
	dotted := h.name("edge.eu-1") // a dot that the subject must escape
	h.cluster(c, red, nil)
	h.cluster(dotted, red, nil)
	h.must(h.hub.Bind(h.ctx, ns[0], red, true))
	h.must(h.hub.Bind(h.ctx, ns[1], red, true))
	h.expectProfiles(ns[0], c, dotted)
	h.expectProfiles(ns[1], c, dotted)
	_, err := h.hub.CreateMSA(h.ctx, c, "app", true)
	h.must(err)
	tokens := []string{fleet.FakeJWT(time.Now().Add(time.Hour)), fleet.FakeJWT(time.Now().Add(2 * time.Hour))}
	h.must(h.hub.PutToken(h.ctx, c, "app", tokens[0], nil))
	h.waitIdle()

	// Changes: a relabel (profile.updated), a rotation, a CA rotation
	// (accessprovider.updated), then an unbind (credential removed,
	// profile deleted).
	h.must(h.hub.Bind(h.ctx, ns[0], blue, true))
	h.must(h.hub.Bind(h.ctx, ns[1], blue, true))
	h.waitIdle()
	h.must(h.hub.Relabel(h.ctx, c, clusterv1beta2.ClusterSetLabel, blue))
	h.eventually("relabelled", func() error {
		if h.profile(ns[0], c).Labels["multicluster.x-k8s.io/clusterset"] != blue {
			return fmt.Errorf("not yet")
		}
		return nil
	})
	h.waitIdle()
	h.must(h.hub.PutToken(h.ctx, c, "app", tokens[1], nil))
	h.waitIdle()
	putCA("CA-2")
	h.eventually("CA rotated", func() error {
		if e := entry(h.profile(ns[1], c), "open-cluster-management"); e == nil || string(e.Cluster.CertificateAuthorityData) != "CA-2" {
			return fmt.Errorf("not yet")
		}
		return nil
	})
	h.waitIdle()
	h.must(h.hub.Unbind(h.ctx, ns[1], blue))
	h.expectProfiles(ns[1], dotted)
	h.must(h.hub.Unbind(h.ctx, ns[1], red))
	h.expectProfiles(ns[1])
	h.waitIdle()

	var evs []event
	want := map[string][]string{
		ns[0] + "/profile":    {"profile.created", "profile.updated", "profile.updated", "profile.updated"},
		ns[1] + "/profile":    {"profile.created", "profile.updated", "profile.updated", "profile.updated", "profile.deleted"},
		ns[0] + "/credential": {"credential.synced", "credential.rotated"},
		ns[1] + "/credential": {"credential.synced", "credential.rotated", "credential.removed"},
	}
	h.eventually("events stored", func() error {
		evs = bf.events(h.ctx)
		for key, types := range want {
			n, kind, _ := strings.Cut(key, "/")
			got := typesFor(evs, prefix, n, c, kind)
			// The CA Secret may be read before or after the first status
			// write, so the number of profile.updated events before the
			// final ones may vary by one; compare the kinds that matter.
			if kind == "profile" {
				got = compactUpdates(got)
				types = compactUpdates(types)
			}
			if strings.Join(got, ",") != strings.Join(types, ",") {
				return fmt.Errorf("%s: %v, want %v", key, got, types)
			}
		}
		for _, n := range ns {
			if got := typesFor(evs, prefix, n, c, "accessprovider"); len(got) == 0 {
				return fmt.Errorf("%s: no accessprovider.updated event", n)
			}
		}
		return nil
	})
	// The dotted cluster's events sit under its escaped subject.
	if !strings.Contains(events.Subject(prefix, ns[0], dotted, "profile"), "edge%2Eeu-1") {
		t.Fatalf("subject does not escape the dot: %s", events.Subject(prefix, ns[0], dotted, "profile"))
	}
	if got := typesFor(evs, prefix, ns[0], dotted, "profile"); len(got) == 0 || got[0] != "profile.created" {
		t.Fatalf("dotted cluster's events: %v", got)
	}

	// No token written to the hub anywhere in the stream or the KV.
	for _, e := range evs {
		for _, f := range leak.Tokens(string(e.raw), h.hub.Tokens()) {
			t.Errorf("%s appears in event %s", f, e.ID)
		}
	}

	// The KV holds the current state: ns[0]'s record, none for ns[1].
	h.eventually("KV matches the hub", func() error {
		r := bf.record(h.ctx, ns[0], c)
		if r == nil {
			return fmt.Errorf("no record for %s/%s", ns[0], c)
		}
		raw, _ := json.Marshal(r)
		if f := leak.Tokens(string(raw), h.hub.Tokens()); len(f) > 0 {
			t.Fatalf("%v appear in the KV record", f)
		}
		if !strings.Contains(string(raw), hub.TokenFingerprint([]byte(tokens[1]))) || !strings.Contains(string(raw), blue) {
			return fmt.Errorf("record not current: %s", raw)
		}
		if bf.record(h.ctx, ns[1], c) != nil {
			return fmt.Errorf("record of the unbound namespace still there")
		}
		return nil
	})

	// A re-published change is stored once: republishing the current state
	// twice adds only the changes whose ids the stream has not seen.
	stored := map[string]bool{}
	for _, e := range bf.events(h.ctx) {
		stored[e.ID] = true
	}
	fresh := 0
	snap := h.syncer.Snapshot()
	for _, ch := range snap {
		if !stored[events.ID(ch)] {
			fresh++
		}
		bf.fan.Notify(ch)
		bf.fan.Notify(ch)
	}
	h.eventually("snapshot published", func() error {
		if n := len(bf.events(h.ctx)); n != len(stored)+fresh {
			return fmt.Errorf("%d events, want %d (%d new, each once)", n, len(stored)+fresh, fresh)
		}
		return nil
	})
	if fresh == len(snap) {
		t.Fatalf("every snapshot change was new: nothing showed de-duplication of a republished change")
	}

	// A consumer that subscribes late replays everything, in order.
	late := replay(t, bf.js, bf.cfg.Stream.Name, prefix+"."+events.EscapeToken(ns[0])+".>")
	var mine []event
	for _, e := range bf.events(h.ctx) {
		if strings.HasPrefix(e.subject, prefix+"."+events.EscapeToken(ns[0])+".") {
			mine = append(mine, e)
		}
	}
	if len(late) != len(mine) {
		t.Fatalf("late consumer replayed %d events, want %d", len(late), len(mine))
	}
	for i := range late {
		if late[i] != mine[i].ID {
			t.Fatalf("replay order differs at %d", i)
		}
	}
}

// compactUpdates collapses runs of profile.updated into one.
func compactUpdates(types []string) []string {
	var out []string
	for _, t := range types {
		if t == "profile.updated" && len(out) > 0 && out[len(out)-1] == t {
			continue
		}
		out = append(out, t)
	}
	return out
}

// replay reads every event on filter from the start with an ordered
// consumer, as a consumer that was offline would, and returns their ids.
func replay(t *testing.T, js jetstream.JetStream, stream, filter string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cons, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}, DeliverPolicy: jetstream.DeliverAllPolicy})
	if err != nil {
		t.Fatal(err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pending := int(info.NumPending)
	var mu sync.Mutex
	var ids []string
	for len(ids) < pending {
		msg, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil {
			t.Fatalf("replay after %d of %d: %v", len(ids), pending, err)
		}
		var e event
		_ = json.Unmarshal(msg.Data(), &e)
		mu.Lock()
		ids = append(ids, e.ID)
		mu.Unlock()
	}
	return ids
}

// TestBusHoldsEventsWhileConverging: with the syncer's Busy wired as in
// the daemon, a burst (a namespace bound to a set of many clusters at once)
// is written to the hub before the bus publishes any of its events, and
// every event then arrives; a single change afterwards is published at
// once, not held. Without the bus's yield the first event arrives while
// most profiles are still unwritten.
func TestBusHoldsEventsWhileConverging(t *testing.T) {
	const n = 120
	var bf busFixture
	h := newHarness(t, withBus(t, &bf))
	bf.fan.SetBusy(h.syncer.Busy)
	bf.start(h)
	ns := h.namespaces("burst")[0]
	set := h.name("many")
	h.must(h.hub.CreateExclusiveSet(h.ctx, set))
	clusters := make([]string, n)
	for i := range clusters {
		clusters[i] = h.name(fmt.Sprintf("m%03d", i))
		h.cluster(clusters[i], set, nil)
	}
	h.waitIdle()

	type firstSeen struct {
		profiles int // profiles in the namespace when the first event came
		err      error
	}
	first := make(chan firstSeen, 1)
	var created atomic.Int64
	sub, err := bf.followNew(bf.cfg.SubjectPrefix+"."+ns+".>", func(m *nats.Msg) {
		var e event
		if json.Unmarshal(m.Data, &e) != nil || e.Type != stream.ProfileCreated {
			return
		}
		if created.Add(1) == 1 {
			names, err := h.hub.ProfileNames(h.ctx, ns)
			first <- firstSeen{profiles: len(names), err: err}
		}
	})
	h.must(err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })

	h.must(h.hub.Bind(h.ctx, ns, set, true)) // every cluster of the set at once
	h.expectProfiles(ns, clusters...)
	var got firstSeen
	select {
	case got = <-first:
	case <-time.After(time.Minute):
		t.Fatal("no profile.created event within a minute")
	}
	h.must(got.err)
	if got.profiles < n*9/10 {
		t.Errorf("the first event came when %d of %d profiles were written: the bus did not hold its events while the syncer converged", got.profiles, n)
	}
	h.eventually("an event for every profile", func() error {
		if c := created.Load(); c != n {
			return fmt.Errorf("%d of %d profile.created events", c, n)
		}
		return nil
	})

	// A single change is not held: its event follows at once.
	h.waitIdle()
	late := h.name("late")
	updated := make(chan time.Time, 1)
	sub2, err := bf.followNew(bf.cfg.SubjectPrefix+"."+ns+"."+events.EscapeToken(late)+".>", func(m *nats.Msg) {
		select {
		case updated <- time.Now():
		default:
		}
	})
	h.must(err)
	t.Cleanup(func() { _ = sub2.Unsubscribe() })
	start := time.Now()
	h.cluster(late, set, nil)
	select {
	case at := <-updated:
		// A generous sanity bound: held events would wait for yieldMax (1m).
		if d := at.Sub(start); d > 10*time.Second {
			t.Errorf("a single change's event took %s", d)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no event for a single new cluster within 30s")
	}
}

// TestDaemonBusConsumersOnlyRead runs the real binary with its embedded
// NATS and connects to it as any local consumer would (a process in the
// pod, or kubectl port-forward), without a credential: it reads the events
// and the access records, and its forged event, record write and stream
// deletion are refused, with nothing of them stored, while hubsync keeps
// publishing.
func TestDaemonBusConsumersOnlyRead(t *testing.T) {
	h := newHarnessWithoutSyncer(t)
	bin := testutil.Hubsync(t)
	h.must(h.hub.Namespace(h.ctx, "open-cluster-management-hub"))
	ns := h.namespaces("consumer")[0]
	set := h.name("set")
	h.must(h.hub.CreateExclusiveSet(h.ctx, set))
	h.must(h.hub.Bind(h.ctx, ns, set, true))
	first, second, forged := h.name("first"), h.name("second"), h.name("forged")
	h.cluster(first, set, nil)

	var logs fleet.LogBuffer
	d, err := fleet.StartDaemon(h.ctx, bin, hubConfig, config.Config{}, &logs)
	h.must(err)
	defer func() {
		if err := d.Stop(); err != nil {
			t.Errorf("hubsync did not stop cleanly: %v", err)
		}
		if t.Failed() {
			t.Logf("hubsync's log:\n%s", logs.String())
		}
	}()
	if err := d.WaitReady(h.ctx, 30*time.Second); err != nil {
		t.Fatalf("%v\n%s", err, logs.String())
	}
	h.expectProfiles(ns, first)

	var mu sync.Mutex
	var refused []string
	nc, err := nats.Connect(d.NATSURL, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		if errors.Is(err, nats.ErrPermissionViolation) {
			mu.Lock()
			refused = append(refused, err.Error())
			mu.Unlock()
		}
	}))
	h.must(err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	h.must(err)
	cfg := config.Default().Bus
	f := &busFixture{t: t, cfg: cfg, nc: nc, js: js}
	// events and record read as this consumer: they must work.
	hasEvent := func(cluster string) error {
		for _, e := range f.events(h.ctx) {
			if e.Data.Cluster == cluster && e.Type == stream.ProfileCreated {
				return nil
			}
		}
		return fmt.Errorf("no profile.created event for %s", cluster)
	}
	// The consumer's copies are made beside publishing (and a failed
	// attempt is tried again after 5 s): wait for them before reading.
	h.eventually("the consumer's copies of the events and the records", func() error {
		for _, name := range []string{cfg.Stream.Name, "KV_" + cfg.KVBucket} {
			if _, err := js.Stream(h.ctx, name); err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
		}
		return nil
	})
	h.eventually("the consumer reads the first cluster's event and record", func() error {
		if err := hasEvent(first); err != nil {
			return err
		}
		if f.record(h.ctx, ns, first) == nil {
			return fmt.Errorf("no record for %s/%s", ns, first)
		}
		return nil
	})
	if ids := replay(t, js, cfg.Stream.Name, cfg.SubjectPrefix+".>"); len(ids) == 0 {
		t.Fatal("an ordered consumer replayed nothing")
	}

	change := stream.Change{
		Type: stream.ProfileDeleted, Namespace: ns, Cluster: forged, Name: forged, ResourceVersion: "1",
		Time: time.Now(), Profile: &stream.ProfileSummary{},
	}
	forgedEvent, err := events.Encode(change, "hubsync/forged")
	h.must(err)
	subject := events.Subject(cfg.SubjectPrefix, ns, forged, "profile")
	msg := nats.NewMsg(subject)
	msg.Data = forgedEvent
	msg.Header.Set("Nats-Msg-Id", events.ID(change)) // as hubsync sends it
	h.must(nc.PublishMsg(msg))
	h.must(nc.Publish("$KV."+cfg.KVBucket+"."+events.KVKey(ns, forged), forgedEvent))
	h.must(nc.Flush())
	kv, err := js.KeyValue(h.ctx, cfg.KVBucket)
	h.must(err)
	attempt := func(what string, op func(ctx context.Context) error) {
		t.Helper()
		ctx, cancel := context.WithTimeout(h.ctx, 2*time.Second)
		defer cancel()
		if err := op(ctx); err == nil {
			t.Errorf("a consumer could %s", what)
		}
	}
	attempt("publish an event through JetStream", func(ctx context.Context) error {
		_, err := js.Publish(ctx, subject, forgedEvent, jetstream.WithMsgID(events.ID(change)))
		return err
	})
	attempt("write a record", func(ctx context.Context) error {
		_, err := kv.Put(ctx, events.KVKey(ns, forged), forgedEvent)
		return err
	})

	// A change after the forgeries: once its event is stored, the stream
	// has seen everything published before it.
	h.cluster(second, set, nil)
	h.expectProfiles(ns, first, second)
	h.eventually("the second cluster's event", func() error { return hasEvent(second) })
	for _, e := range f.events(h.ctx) {
		if e.subject == subject || strings.Contains(string(e.raw), "hubsync/forged") {
			t.Errorf("the stream stored a consumer's forged event on %s: %s", e.subject, e.raw)
		}
	}
	if f.record(h.ctx, ns, forged) != nil {
		t.Errorf("the bucket holds a consumer's record for %s/%s", ns, forged)
	}

	attempt("delete the stream", func(ctx context.Context) error { return js.DeleteStream(ctx, cfg.Stream.Name) })
	if _, err := js.Stream(h.ctx, cfg.Stream.Name); err != nil {
		t.Errorf("the stream after a consumer tried to delete it: %v", err)
	}
	h.eventually("the server's refusals reported to the consumer", func() error {
		mu.Lock()
		defer mu.Unlock()
		for _, want := range []string{subject, "$KV." + cfg.KVBucket + ".", "$JS.API.STREAM.DELETE." + cfg.Stream.Name} {
			found := false
			for _, r := range refused {
				found = found || strings.Contains(r, `Publish to "`+want)
			}
			if !found {
				return fmt.Errorf("no permissions violation for publishing to %s among %q", want, refused)
			}
		}
		return nil
	})
	if !strings.Contains(logs.String(), "refused a NATS client") {
		t.Errorf("hubsync's log does not record the refusals")
	}
}
