package bus

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hubsync/hubsync/bus/bustest"
	"github.com/hubsync/hubsync/test/testutil"
)

// layoutRig is a real nats-server running a Layout's configuration, with
// hubsync's stream and bucket in the writer account and the copies of
// two consumers: app-a reads namespace team-a, app-b every namespace.
type layoutRig struct {
	t       *testing.T
	srv     *server.Server
	layout  Layout
	primary jetstream.StreamConfig
	writer  jetstream.JetStream
	kv      jetstream.KeyValue
}

const layoutPassword = "pw-not-a-secret"

func newLayoutRig(t *testing.T) *layoutRig {
	t.Helper()
	l := Layout{Prefix: "hubsync", Stream: "HUBSYNC_EVENTS", Bucket: "hubsync-access", Consumers: []ConsumerAccess{
		{Name: "app-a", Namespaces: []string{"team-a"}},
		{Name: "app-b"},
	}}
	users := Users{Writer: User{Name: "hubsync", Password: layoutPassword}, Consumers: map[string][]User{}, Provisioners: map[string]User{}}
	for _, c := range l.Consumers {
		users.Provisioners[c.Name] = User{Name: "provision-" + c.Name, Password: layoutPassword}
		users.Consumers[c.Name] = []User{{Name: c.Name, Password: layoutPassword}}
	}
	conf, err := l.Config(users)
	if err != nil {
		t.Fatal(err)
	}
	opts := &server.Options{}
	if err := opts.ProcessConfigString(string(conf)); err != nil {
		t.Fatalf("the layout's configuration: %v", err)
	}
	opts.ServerName, opts.Host, opts.Port, opts.NoSigs = "layout", "127.0.0.1", server.RANDOM_PORT, true
	opts.JetStream, opts.StoreDir = true, t.TempDir()
	srv, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	t.Cleanup(srv.Shutdown)
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("server not ready")
	}
	r := &layoutRig{t: t, srv: srv, layout: l}
	r.writer = r.js("hubsync")
	ctx := t.Context()
	r.primary = jetstream.StreamConfig{Name: l.Stream, Subjects: []string{"hubsync.>"}, Storage: jetstream.FileStorage,
		MaxAge: time.Hour, MaxBytes: -1, Duplicates: time.Minute, Replicas: 1}
	if _, err := r.writer.CreateOrUpdateStream(ctx, r.primary); err != nil {
		t.Fatal(err)
	}
	if r.kv, err = r.writer.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: l.Bucket, History: 1, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	for _, c := range l.Consumers {
		if err := l.Provision(ctx, r.js("provision-"+c.Name), c, r.primary); err != nil {
			t.Fatal(err)
		}
	}
	return r
}

// conn connects as user; its permissions violations go to errs.
func (r *layoutRig) conn(user string, errs bustest.Errors) *nats.Conn {
	r.t.Helper()
	opts := []nats.Option{nats.UserInfo(user, layoutPassword)}
	if errs != nil {
		opts = append(opts, errs.Handler())
	}
	nc, err := nats.Connect(r.srv.ClientURL(), opts...)
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(nc.Close)
	return nc
}

func (r *layoutRig) js(user string) jetstream.JetStream {
	r.t.Helper()
	js, err := jetstream.New(r.conn(user, nil))
	if err != nil {
		r.t.Fatal(err)
	}
	return js
}

// write publishes an event and puts a record as hubsync does.
func (r *layoutRig) write(ns, cluster string) {
	r.t.Helper()
	subject := fmt.Sprintf("hubsync.%s.%s.profile", ns, cluster)
	if _, err := r.writer.Publish(r.t.Context(), subject, []byte(`{"ns":"`+ns+`"}`)); err != nil {
		r.t.Fatal(err)
	}
	if _, err := r.kv.Put(r.t.Context(), ns+"."+cluster, []byte(`{"namespace":"`+ns+`"}`)); err != nil {
		r.t.Fatal(err)
	}
}

// counts returns the messages of the writer's stream and bucket.
func (r *layoutRig) counts(js jetstream.JetStream) (uint64, uint64) {
	r.t.Helper()
	var out [2]uint64
	for i, name := range []string{r.layout.Stream, r.layout.kvStream()} {
		s, err := js.Stream(r.t.Context(), name)
		if err != nil {
			r.t.Fatalf("%s: %v", name, err)
		}
		out[i] = s.CachedInfo().State.Msgs
	}
	return out[0], out[1]
}

// until polls until fn succeeds.
func until(t *testing.T, what string, fn func() error) {
	t.Helper()
	testutil.Eventually(t, 20*time.Second, 20*time.Millisecond, fn, what)
}

// TestConsumerCopiesHoldTheirNamespaces: each consumer's account holds
// copies of the events and records of its namespaces, kept current by the
// server, and a NATS user's habits work on them: a JetStream subscribe by
// subject without naming the stream, an ordered consumer, a KV get.
func TestConsumerCopiesHoldTheirNamespaces(t *testing.T) {
	r := newLayoutRig(t)
	r.write("team-a", "c1")
	r.write("team-b", "c2")
	for _, c := range []struct {
		user         string
		events, recs uint64
	}{{"app-a", 1, 1}, {"app-b", 2, 2}} {
		js := r.js(c.user)
		until(t, c.user+"'s copies", func() error {
			if ev, recs := r.counts(js); ev != c.events || recs != c.recs {
				return fmt.Errorf("%d events and %d records, want %d and %d", ev, recs, c.events, c.recs)
			}
			return nil
		})
	}

	// nats sub 'hubsync.>' --all: a legacy subscribe by subject, which
	// looks the stream up by subject.
	nc := r.conn("app-a", nil)
	legacy, err := nc.JetStream()
	if err != nil {
		t.Fatal(err)
	}
	sub, err := legacy.SubscribeSync("hubsync.>", nats.DeliverAll(), nats.OrderedConsumer())
	if err != nil {
		t.Fatalf("subscribe by subject: %v", err)
	}
	m, err := sub.NextMsg(5 * time.Second)
	if err != nil || m.Subject != "hubsync.team-a.c1.profile" {
		t.Fatalf("subscribe by subject: %v, %v", m, err)
	}
	r.write("team-a", "c3")
	if m, err = sub.NextMsg(5 * time.Second); err != nil || m.Subject != "hubsync.team-a.c3.profile" {
		t.Fatalf("subscribe by subject, a new event: %v, %v", m, err)
	}
	if m, err := sub.NextMsg(200 * time.Millisecond); err == nil {
		t.Fatalf("app-a got %s, of a namespace it does not read", m.Subject)
	}

	kv, err := r.js("app-a").KeyValue(t.Context(), r.layout.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	until(t, "app-a's record of c3", func() error {
		_, err := kv.Get(t.Context(), "team-a.c3")
		return err
	})
	if _, err := kv.Get(t.Context(), "team-b.c2"); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("app-a reads team-b's record: %v", err)
	}
}

// TestConsumersCannotWriteEraseOrSpy: a consumer's user tries every way
// to write, erase or read another's deliveries; the server refuses each,
// and the writer's stream and bucket and every copy are as they were.
func TestConsumersCannotWriteEraseOrSpy(t *testing.T) {
	r := newLayoutRig(t)
	r.write("team-a", "c1")
	r.write("team-b", "c2")
	aJS, bJS := r.js("app-a"), r.js("app-b")
	until(t, "the copies", func() error {
		if a, _ := r.counts(aJS); a != 1 {
			return fmt.Errorf("app-a: %d events", a)
		}
		if b, _ := r.counts(bJS); b != 2 {
			return fmt.Errorf("app-b: %d events", b)
		}
		return nil
	})

	errs := bustest.NewErrors()
	nc := r.conn("app-a", errs)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	names := bustest.Names{Prefix: r.layout.Prefix, Stream: r.layout.Stream, Bucket: r.layout.Bucket, Namespace: "team-a"}
	if allowed := bustest.Attack(ctx, nc, errs, names); len(allowed) > 0 {
		t.Errorf("the server allowed app-a:\n%s", strings.Join(allowed, "\n"))
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(t.Context(), r.layout.Stream)
	if err != nil {
		t.Fatal(err)
	}
	// A consumer of app-a's, which app-b must not see.
	if _, err := s.CreateOrUpdatePushConsumer(t.Context(), jetstream.ConsumerConfig{
		Durable: "to-kv", DeliverSubject: "$KV.hubsync-access.team-a.planted", DeliverPolicy: jetstream.DeliverAllPolicy,
		AckPolicy: jetstream.AckNonePolicy, IdleHeartbeat: 100 * time.Millisecond,
	}); err != nil {
		t.Fatal(err)
	}
	// app-b cannot see app-a's consumer, nor read its deliveries.
	if _, err := bJS.Consumer(t.Context(), r.layout.Stream, "to-kv"); !errors.Is(err, jetstream.ErrConsumerNotFound) {
		t.Errorf("app-b looks up app-a's consumer: %v", err)
	}
	spy := r.conn("app-b", nil)
	inbox, err := spy.SubscribeSync("_INBOX.>")
	if err != nil {
		t.Fatal(err)
	}
	_ = spy.Flush()
	pull, err := s.CreateOrUpdateConsumer(t.Context(), jetstream.ConsumerConfig{Durable: "a-pull", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := pull.Fetch(1, jetstream.FetchMaxWait(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for m := range batch.Messages() {
		if err := m.Ack(); err != nil {
			t.Fatal(err)
		}
	}
	if m, err := inbox.NextMsg(500 * time.Millisecond); err == nil {
		t.Errorf("app-b read app-a's delivery on %s", m.Subject)
	}

	// Nothing new is stored anywhere.
	if ev, recs := r.counts(r.writer); ev != 2 || recs != 2 {
		t.Errorf("the writer's stream and bucket hold %d events and %d records, want 2 and 2", ev, recs)
	}
	if ev, recs := r.counts(aJS); ev != 1 || recs != 1 {
		t.Errorf("app-a's copies hold %d events and %d records, want 1 and 1", ev, recs)
	}
	if ev, recs := r.counts(bJS); ev != 2 || recs != 2 {
		t.Errorf("app-b's copies hold %d events and %d records, want 2 and 2", ev, recs)
	}
}

// TestProvisionReplacesACopyWhoseNamespacesChanged: a consumer that may
// no longer read a namespace loses its events and records too.
func TestProvisionReplacesACopyWhoseNamespacesChanged(t *testing.T) {
	r := newLayoutRig(t)
	r.write("team-a", "c1")
	r.write("team-b", "c2")
	bJS := r.js("app-b")
	until(t, "app-b's copies", func() error {
		if ev, recs := r.counts(bJS); ev != 2 || recs != 2 {
			return fmt.Errorf("%d events, %d records", ev, recs)
		}
		return nil
	})
	narrowed := ConsumerAccess{Name: "app-b", Namespaces: []string{"team-b"}}
	if err := r.layout.Provision(context.Background(), r.js("provision-app-b"), narrowed, r.primary); err != nil {
		t.Fatal(err)
	}
	until(t, "app-b's narrowed copies", func() error {
		if ev, recs := r.counts(bJS); ev != 1 || recs != 1 {
			return fmt.Errorf("%d events, %d records", ev, recs)
		}
		return nil
	})
}

func TestLayoutValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cs   []ConsumerAccess
		want string
	}{
		{"ok", []ConsumerAccess{{Name: "kueue"}, {Name: "argo-cd", Namespaces: []string{"argocd"}}}, ""},
		{"upper case", []ConsumerAccess{{Name: "Kueue"}}, "lowercase"},
		{"dot", []ConsumerAccess{{Name: "a.b"}}, "lowercase"},
		{"twice", []ConsumerAccess{{Name: "a"}, {Name: "a"}}, "twice"},
		{"empty namespace", []ConsumerAccess{{Name: "a", Namespaces: []string{""}}}, "empty namespace"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Layout{Prefix: "hubsync", Stream: "S", Bucket: "b", Consumers: tc.cs}.Validate()
			if (err == nil) != (tc.want == "") || (err != nil && !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
		})
	}
}
