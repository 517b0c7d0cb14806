package bus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/events"
	"github.com/hubsync/hubsync/stream"
	"github.com/hubsync/hubsync/stream/streamtest"
)

// violations collects the permissions violations the server reports to a
// connection.
type violations struct {
	mu   sync.Mutex
	seen []string
}

func (v *violations) record(_ *nats.Conn, _ *nats.Subscription, err error) {
	if errors.Is(err, nats.ErrPermissionViolation) {
		v.mu.Lock()
		v.seen = append(v.seen, err.Error())
		v.mu.Unlock()
	}
}

func (v *violations) count() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return len(v.seen)
}

// publishRefusedSince reports whether, among the violations after the
// first n, one refused a publish to subject.
func (v *violations) publishRefusedSince(n int, subject string) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	// A subject ending in "." stands for every subject it starts.
	want := `Publish to "` + subject
	if !strings.HasSuffix(subject, ".") {
		want += `"`
	}
	for _, s := range v.seen[n:] {
		if strings.Contains(s, want) {
			return true
		}
	}
	return false
}

// consumerFixture is a running embedded bus with some events and records,
// a consumer's connection to it, and hubsync's own for checking state.
type consumerFixture struct {
	b       *testBus
	cfg     config.Bus
	nc      *nats.Conn
	js      jetstream.JetStream
	v       *violations
	self    *client
	changes []stream.Change // every change the bus has published
}

// publish makes the bus publish c, as hubsync does, and waits for it.
func (f *consumerFixture) publish(t *testing.T, c stream.Change) {
	t.Helper()
	f.changes = append(f.changes, c)
	f.b.Notify(c)
	flush(t, f.b)
}

// storedIDs are the event ids the stream holds, in order, each checked to
// be a valid event on the subject it names; it fails on anything else.
func (f *consumerFixture) storedIDs(t *testing.T) []string {
	t.Helper()
	var ids []string
	for _, m := range f.self.messages(t, f.cfg.Stream.Name) {
		e, err := events.Decode(m.Data)
		if err != nil {
			t.Fatalf("the stream holds a message that is not an event, on %s: %v\n%s", m.Subject, err, m.Data)
		}
		kind, _ := events.Kind(e.Type)
		if want := events.Subject(f.cfg.SubjectPrefix, e.Data.Namespace, e.Data.Cluster, kind); m.Subject != want {
			t.Fatalf("event %s stored on %s, want %s", e.ID, m.Subject, want)
		}
		ids = append(ids, e.ID)
	}
	return ids
}

// waitCopies waits until the consumer's copies hold every event and a
// record of every (namespace, cluster) hubsync published.
func (f *consumerFixture) waitCopies(t *testing.T) {
	t.Helper()
	keys := map[string]bool{}
	for _, c := range f.changes {
		keys[events.KVKey(c.Namespace, c.Cluster)] = true
	}
	eventually(t, "the consumer's copies", func() bool {
		s, err := f.js.Stream(ctxT(t), f.cfg.Stream.Name)
		if err != nil || s.CachedInfo().State.Msgs != uint64(len(f.changes)) {
			return false
		}
		kv, err := f.js.Stream(ctxT(t), "KV_"+f.cfg.KVBucket)
		return err == nil && kv.CachedInfo().State.NumSubjects == uint64(len(keys))
	})
}

func (f *consumerFixture) wantIDs() []string {
	var ids []string
	for _, c := range f.changes {
		ids = append(ids, events.ID(c))
	}
	return ids
}

// TestConsumerPermissions connects to the embedded server as a consumer
// would, with the real client library: a consumer reads the events (live,
// replayed by consumers of its own) and the KV bucket (values and a
// watch), and cannot write anything; hubsync keeps publishing. A client
// without the configured token, or passing itself off as hubsync, is
// refused.
func TestConsumerPermissions(t *testing.T) {
	const token = "c0nsumer-t0ken-0123456789abcdef"
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		token bool // the server is configured with the token
		opts  func(b *testBus) []nats.Option
		works bool
	}{
		{name: "no token configured, no credential", works: true},
		{name: "no token configured, some token", opts: withOpts(nats.Token("anything")), works: true},
		{name: "the configured token", token: true, opts: withOpts(nats.Token(token)), works: true},
		{name: "token configured, no credential", token: true},
		{name: "token configured, a wrong token", token: true, opts: withOpts(nats.Token("guess"))},
		{name: "hubsync's user name, from outside", opts: withOpts(nats.UserInfo("hubsync", ""))},
		{name: "hubsync's own password, from outside", token: true, opts: func(b *testBus) []nats.Option {
			return []nats.Option{nats.UserInfo("hubsync", selfPassword(b))}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := busConfig(t)
			if tt.token {
				cfg.Embedded.AuthTokenFile = tokenFile
			}
			b, _ := newBus(t, cfg)
			start(t, b, nil)
			f := &consumerFixture{b: b, cfg: cfg, v: &violations{}}
			for _, c := range []stream.Change{
				streamtest.Profile(stream.ProfileCreated, "team-a", "c1", "1"),
				streamtest.Profile(stream.ProfileCreated, "team-a", "c2", "1"),
				streamtest.Profile(stream.ProfileCreated, "team-b", "edge.eu-1", "1"),
			} {
				f.publish(t, c)
			}
			f.self = selfConnect(t, b)
			var opts []nats.Option
			if tt.opts != nil {
				opts = tt.opts(b)
			}
			nc, err := nats.Connect(b.ClientURL(), append(opts, nats.Timeout(2*time.Second), nats.ErrorHandler(f.v.record))...)
			if !tt.works {
				if err == nil {
					nc.Close()
					t.Fatal("connected")
				}
				if !errors.Is(err, nats.ErrAuthorization) {
					t.Fatalf("refused with %v, want an authorization violation", err)
				}
				if strings.Contains(err.Error(), token) || strings.Contains(err.Error(), selfPassword(b)) {
					t.Errorf("the error holds a secret: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(nc.Close)
			f.nc = nc
			if f.js, err = jetstream.New(nc); err != nil {
				t.Fatal(err)
			}
			f.waitCopies(t)
			t.Run("may", func(t *testing.T) {
				for _, op := range consumerMay {
					t.Run(op.name, func(t *testing.T) { op.run(t, f) })
				}
			})
			t.Run("may not", func(t *testing.T) {
				for _, op := range consumerMayNot {
					t.Run(op.name, func(t *testing.T) { refused(t, f, op.subject(cfg), op.run) })
				}
			})
			t.Run("state unchanged and hubsync still publishes", func(t *testing.T) {
				f.publish(t, streamtest.Profile(stream.ProfileUpdated, "team-a", "c1", "2"))
				if got, want := f.storedIDs(t), f.wantIDs(); !slices.Equal(got, want) {
					t.Errorf("stored events %v, want %v", got, want)
				}
				s, err := f.self.js.Stream(ctxT(t), cfg.Stream.Name)
				if err != nil {
					t.Fatal(err)
				}
				if got := s.CachedInfo().Config.MaxAge; got != cfg.Stream.MaxAge.Duration {
					t.Errorf("the stream's maxAge is %v, want %v", got, cfg.Stream.MaxAge.Duration)
				}
				recs := f.self.records(t, cfg.KVBucket)
				var keys []string
				for k, r := range recs {
					keys = append(keys, k)
					if r.Namespace == "" || r.Profile == nil {
						t.Errorf("record %s was changed: %+v", k, r)
					}
				}
				slices.Sort(keys)
				if want := []string{"team-a.c1", "team-a.c2", "team-b.edge=2Eeu-1", "team-c.c1"}; !slices.Equal(keys, want) {
					t.Errorf("records %v, want %v", keys, want)
				}
			})
		})
	}
}

func withOpts(opts ...nats.Option) func(*testBus) []nats.Option {
	return func(*testBus) []nats.Option { return opts }
}

// consumerMay is what a consumer does; each must work. They run in order,
// and some publish: a later one sees what an earlier one published.
var consumerMay = []struct {
	name string
	run  func(t *testing.T, f *consumerFixture)
}{
	{name: "account, stream and bucket information", run: func(t *testing.T, f *consumerFixture) {
		ctx := ctxT(t)
		if _, err := f.js.AccountInfo(ctx); err != nil {
			t.Fatal(err)
		}
		s, err := f.js.Stream(ctx, f.cfg.Stream.Name)
		if err != nil {
			t.Fatal(err)
		}
		if info, err := s.Info(ctx); err != nil || info.State.Msgs != uint64(len(f.changes)) {
			t.Fatalf("stream info %+v, %v; want %d messages", info, err, len(f.changes))
		}
		kv, err := f.js.KeyValue(ctx, f.cfg.KVBucket)
		if err != nil {
			t.Fatal(err)
		}
		if st, err := kv.Status(ctx); err != nil || st.Values() != 3 {
			t.Fatalf("bucket status %v, %v; want 3 values", st, err)
		}
	}},
	{name: "read an event by sequence", run: func(t *testing.T, f *consumerFixture) {
		ctx := ctxT(t)
		s, err := f.js.Stream(ctx, f.cfg.Stream.Name)
		if err != nil {
			t.Fatal(err)
		}
		m, err := s.GetMsg(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		if err := events.ValidateEvent(m.Data); err != nil {
			t.Fatal(err)
		}
	}},
	{name: "replay with an ordered consumer", run: func(t *testing.T, f *consumerFixture) {
		ctx := ctxT(t)
		cons, err := f.js.OrderedConsumer(ctx, f.cfg.Stream.Name, jetstream.OrderedConsumerConfig{
			FilterSubjects: []string{f.cfg.SubjectPrefix + ".>"}, DeliverPolicy: jetstream.DeliverAllPolicy,
		})
		if err != nil {
			t.Fatal(err)
		}
		if got, want := readIDs(t, len(f.changes), func() (jetstream.Msg, error) { return cons.Next(jetstream.FetchMaxWait(2 * time.Second)) }), f.wantIDs(); !slices.Equal(got, want) {
			t.Errorf("replayed %v, want %v", got, want)
		}
	}},
	{name: "replay with a durable consumer, acknowledge, delete it", run: func(t *testing.T, f *consumerFixture) {
		ctx := ctxT(t)
		s, err := f.js.Stream(ctx, f.cfg.Stream.Name)
		if err != nil {
			t.Fatal(err)
		}
		cons, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
			Durable: "my-app", AckPolicy: jetstream.AckExplicitPolicy, DeliverPolicy: jetstream.DeliverAllPolicy,
		})
		if err != nil {
			t.Fatal(err)
		}
		got := readIDs(t, len(f.changes), func() (jetstream.Msg, error) {
			m, err := cons.Next(jetstream.FetchMaxWait(2 * time.Second))
			if err == nil {
				err = m.DoubleAck(ctx)
			}
			return m, err
		})
		if want := f.wantIDs(); !slices.Equal(got, want) {
			t.Errorf("replayed %v, want %v", got, want)
		}
		info, err := cons.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.AckFloor.Stream != uint64(len(f.changes)) || info.NumAckPending != 0 {
			t.Errorf("ack floor %d, %d pending; want %d, 0", info.AckFloor.Stream, info.NumAckPending, len(f.changes))
		}
		if err := s.DeleteConsumer(ctx, "my-app"); err != nil {
			t.Fatal(err)
		}
	}},
	{name: "replay with a legacy push subscription", run: func(t *testing.T, f *consumerFixture) {
		js, err := f.nc.JetStream()
		if err != nil {
			t.Fatal(err)
		}
		// By subject, without naming the stream (nats sub '<prefix>.>'
		// --all): the lookup finds the consumer's copy.
		sub, err := js.SubscribeSync(f.cfg.SubjectPrefix+".>", nats.DeliverAll(), nats.AckNone())
		if err != nil {
			t.Fatal(err)
		}
		got := readIDs(t, len(f.changes), func() (rawMsg, error) {
			m, err := sub.NextMsg(2 * time.Second)
			return rawMsg{m}, err
		})
		if want := f.wantIDs(); !slices.Equal(got, want) {
			t.Errorf("replayed %v, want %v", got, want)
		}
		if err := sub.Unsubscribe(); err != nil {
			t.Fatal(err)
		}
	}},
	{name: "read the bucket", run: func(t *testing.T, f *consumerFixture) {
		ctx := ctxT(t)
		kv, err := f.js.KeyValue(ctx, f.cfg.KVBucket)
		if err != nil {
			t.Fatal(err)
		}
		recs, err := (&Client{nc: f.nc, js: f.js, timeout: 5 * time.Second}).Records(ctx, f.cfg.KVBucket, "")
		if err != nil {
			t.Fatal(err)
		}
		var keys []string
		for _, r := range recs {
			keys = append(keys, r.Key)
			if r.Record == nil {
				t.Errorf("%s: not an access record", r.Key)
			}
		}
		if want := []string{"team-a.c1", "team-a.c2", "team-b.edge=2Eeu-1"}; !slices.Equal(keys, want) {
			t.Fatalf("keys %v, want %v", keys, want)
		}
		for _, k := range keys {
			e, err := kv.Get(ctx, k)
			if err != nil {
				t.Fatal(err)
			}
			if err := events.ValidateRecord(e.Value()); err != nil {
				t.Errorf("%s: %v", k, err)
			}
			if _, err := kv.GetRevision(ctx, k, e.Revision()); err != nil {
				t.Errorf("%s at revision %d: %v", k, e.Revision(), err)
			}
		}
	}},
	{name: "follow new events by subject, and their records", run: func(t *testing.T, f *consumerFixture) {
		ctx := ctxT(t)
		js, err := f.nc.JetStream()
		if err != nil {
			t.Fatal(err)
		}
		// nats sub '<prefix>.>' --new
		sub, err := js.SubscribeSync(f.cfg.SubjectPrefix+".>", nats.DeliverNew(), nats.AckNone())
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = sub.Unsubscribe() }()
		c := streamtest.Profile(stream.ProfileCreated, "team-c", "c1", "1")
		f.publish(t, c)
		m, err := sub.NextMsg(4 * time.Second)
		if err != nil {
			t.Fatalf("no new event: %v", err)
		}
		if e, err := events.Decode(m.Data); err != nil || e.ID != events.ID(c) || m.Subject != events.Subject(f.cfg.SubjectPrefix, "team-c", "c1", "profile") {
			t.Errorf("new event %s on %s (%v), want %s on %s", m.Data, m.Subject, err, events.ID(c), events.Subject(f.cfg.SubjectPrefix, "team-c", "c1", "profile"))
		}
		kv, err := f.js.KeyValue(ctx, f.cfg.KVBucket)
		if err != nil {
			t.Fatal(err)
		}
		eventually(t, "the record of the new profile", func() bool {
			_, err := kv.Get(ctx, events.KVKey("team-c", "c1"))
			return err == nil
		})
	}},
	{name: "a push consumer aimed at the event subjects is refused", run: func(t *testing.T, f *consumerFixture) {
		// A push consumer delivers to any subject that has a subscriber,
		// whatever its creator may publish to: aimed at the stream's own
		// subjects, the server refuses it as a cycle; the bucket's copy
		// takes no consumer at all (consumerMayNot).
		s, err := f.js.Stream(ctxT(t), f.cfg.Stream.Name)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.CreateOrUpdatePushConsumer(ctxT(t), jetstream.ConsumerConfig{
			DeliverSubject: f.cfg.SubjectPrefix + ".forged.copy.profile", DeliverPolicy: jetstream.DeliverAllPolicy, AckPolicy: jetstream.AckNonePolicy,
		}); err == nil {
			t.Fatal("created")
		}
	}},
}

// rawMsg reads a legacy message as a jetstream.Msg for readIDs.
type rawMsg struct{ *nats.Msg }

func (m rawMsg) Data() []byte { return m.Msg.Data }

// readIDs reads n events with next and returns their ids.
func readIDs[M interface{ Data() []byte }](t *testing.T, n int, next func() (M, error)) []string {
	t.Helper()
	var ids []string
	for range n {
		m, err := next()
		if err != nil {
			t.Fatalf("after %d of %d: %v", len(ids), n, err)
		}
		e, err := events.Decode(m.Data())
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, e.ID)
	}
	return ids
}

// consumerMayNot is what a consumer must not do: each is refused with a
// permissions violation for publishing to the subject.
var consumerMayNot = []struct {
	name    string
	subject func(config.Bus) string
	run     func(ctx context.Context, f *consumerFixture) error
}{
	{name: "publish an event",
		subject: func(c config.Bus) string { return events.Subject(c.SubjectPrefix, "team-a", "c9", "profile") },
		run: func(_ context.Context, f *consumerFixture) error {
			return forgedPublish(f, events.Subject(f.cfg.SubjectPrefix, "team-a", "c9", "profile"))
		}},
	{name: "publish an event through JetStream",
		subject: func(c config.Bus) string { return events.Subject(c.SubjectPrefix, "team-a", "c9", "credential") },
		run: func(ctx context.Context, f *consumerFixture) error {
			_, err := f.js.Publish(ctx, events.Subject(f.cfg.SubjectPrefix, "team-a", "c9", "credential"), forgedEvent(f))
			return err
		}},
	{name: "put a record",
		subject: func(c config.Bus) string { return "$KV." + c.KVBucket + ".team-a.c1" },
		run: func(_ context.Context, f *consumerFixture) error {
			return f.nc.Publish("$KV."+f.cfg.KVBucket+".team-a.c1", []byte(`{}`))
		}},
	{name: "put a record through the bucket",
		subject: func(c config.Bus) string { return "$KV." + c.KVBucket + ".team-a.c1" },
		run: func(ctx context.Context, f *consumerFixture) error {
			kv, err := f.js.KeyValue(ctx, f.cfg.KVBucket)
			if err != nil {
				return err
			}
			_, err = kv.Put(ctx, "team-a.c1", []byte(`{}`))
			return err
		}},
	{name: "delete a record",
		subject: func(c config.Bus) string { return "$KV." + c.KVBucket + ".team-a.c2" },
		run: func(_ context.Context, f *consumerFixture) error {
			return f.nc.PublishMsg(&nats.Msg{Subject: "$KV." + f.cfg.KVBucket + ".team-a.c2", Header: nats.Header{"KV-Operation": []string{"DEL"}}})
		}},
	{name: "watch the bucket",
		subject: func(c config.Bus) string { return "$JS.API.CONSUMER.CREATE.KV_" + c.KVBucket + "." },
		run: func(ctx context.Context, f *consumerFixture) error {
			kv, err := f.js.KeyValue(ctx, f.cfg.KVBucket)
			if err != nil {
				return err
			}
			w, err := kv.WatchAll(ctx)
			if err == nil {
				<-ctx.Done()
				_ = w.Stop()
			}
			return err
		}},
	{name: "make a consumer through hubsync's account",
		subject: func(c config.Bus) string { return importedAPI + ".CONSUMER.CREATE." + c.Stream.Name },
		run: func(_ context.Context, f *consumerFixture) error {
			return f.nc.Publish(importedAPI+".CONSUMER.CREATE."+f.cfg.Stream.Name, []byte(`{}`))
		}},
	{name: "delete the stream",
		subject: func(c config.Bus) string { return "$JS.API.STREAM.DELETE." + c.Stream.Name },
		run:     func(ctx context.Context, f *consumerFixture) error { return f.js.DeleteStream(ctx, f.cfg.Stream.Name) }},
	{name: "purge the stream",
		subject: func(c config.Bus) string { return "$JS.API.STREAM.PURGE." + c.Stream.Name },
		run: func(ctx context.Context, f *consumerFixture) error {
			s, err := f.js.Stream(ctx, f.cfg.Stream.Name)
			if err != nil {
				return err
			}
			return s.Purge(ctx)
		}},
	{name: "update the stream",
		subject: func(c config.Bus) string { return "$JS.API.STREAM.UPDATE." + c.Stream.Name },
		run: func(ctx context.Context, f *consumerFixture) error {
			s, err := f.js.Stream(ctx, f.cfg.Stream.Name)
			if err != nil {
				return err
			}
			cfg := s.CachedInfo().Config
			cfg.MaxAge = time.Second
			_, err = f.js.UpdateStream(ctx, cfg)
			return err
		}},
	{name: "delete an event",
		subject: func(c config.Bus) string { return "$JS.API.STREAM.MSG.DELETE." + c.Stream.Name },
		run: func(ctx context.Context, f *consumerFixture) error {
			s, err := f.js.Stream(ctx, f.cfg.Stream.Name)
			if err != nil {
				return err
			}
			return s.DeleteMsg(ctx, 1)
		}},
	{name: "create a stream",
		subject: func(config.Bus) string { return "$JS.API.STREAM.CREATE.FORGED" },
		run: func(ctx context.Context, f *consumerFixture) error {
			_, err := f.js.CreateStream(ctx, jetstream.StreamConfig{Name: "FORGED", Subjects: []string{"forged.>"}})
			return err
		}},
	{name: "update the bucket",
		subject: func(c config.Bus) string { return "$JS.API.STREAM.UPDATE.KV_" + c.KVBucket },
		run: func(ctx context.Context, f *consumerFixture) error {
			_, err := f.js.UpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: f.cfg.KVBucket, History: 5})
			return err
		}},
	{name: "purge the bucket",
		subject: func(c config.Bus) string { return "$JS.API.STREAM.PURGE.KV_" + c.KVBucket },
		run: func(ctx context.Context, f *consumerFixture) error {
			s, err := f.js.Stream(ctx, "KV_"+f.cfg.KVBucket)
			if err != nil {
				return err
			}
			return s.Purge(ctx)
		}},
	{name: "delete the bucket",
		subject: func(c config.Bus) string { return "$JS.API.STREAM.DELETE.KV_" + c.KVBucket },
		run:     func(ctx context.Context, f *consumerFixture) error { return f.js.DeleteKeyValue(ctx, f.cfg.KVBucket) }},
}

func forgedEvent(f *consumerFixture) []byte {
	data, err := events.Encode(streamtest.Profile(stream.ProfileDeleted, "team-a", "c9", "666"), "hubsync/forged")
	if err != nil {
		panic(err)
	}
	return data
}

// forgedPublish publishes a valid-looking event on subject, without
// JetStream: the server says no only asynchronously.
func forgedPublish(f *consumerFixture, subject string) error {
	msg := &nats.Msg{Subject: subject, Data: forgedEvent(f), Header: nats.Header{}}
	msg.Header.Set("Nats-Msg-Id", fmt.Sprintf("forged-%d", time.Now().UnixNano()))
	if err := f.nc.PublishMsg(msg); err != nil {
		return err
	}
	return f.nc.Flush()
}

// refused runs op and waits for the server to refuse its publish to
// subject; a JetStream request then waits for an answer that never
// comes, so it is cancelled.
func refused(t *testing.T, f *consumerFixture, subject string, op func(context.Context, *consumerFixture) error) {
	t.Helper()
	before := f.v.count()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- op(ctx, f) }()
	eventually(t, "a permissions violation for publishing to "+subject, func() bool { return f.v.publishRefusedSince(before, subject) })
	cancel()
	<-done
	if !f.nc.IsConnected() {
		t.Fatal("the consumer's connection was closed")
	}
}

// TestServerLogRefusals: the server's refusals of a client are the
// client's errors, logged as warnings; other errors stay errors.
func TestServerLogRefusals(t *testing.T) {
	for _, tc := range []struct {
		line  string
		level string
	}{
		{line: `127.0.0.1:40000 - cid:7 - "v1.47.0:go" - Publish Violation - Subject "hubsync.a.b.profile"`, level: "WARN"},
		{line: `127.0.0.1:40000 - cid:7 - "v1.47.0:go" - Subscription Violation - Subject "$KV.>", SID 1`, level: "WARN"},
		{line: `127.0.0.1:40000 - cid:8 - authentication error - Token "[REDACTED]"`, level: "WARN"},
		{line: `JetStream failed to store a msg on stream 'HUBSYNC_EVENTS': disk full`, level: "ERROR"},
	} {
		var out strings.Builder
		l := &serverLog{log: slog.New(slog.NewTextHandler(&out, nil))}
		l.Errorf("%s", tc.line)
		if !strings.Contains(out.String(), "level="+tc.level) {
			t.Errorf("%q logged as %s, want level %s", tc.line, out.String(), tc.level)
		}
	}
}
