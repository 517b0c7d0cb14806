package bus

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hubsync/hubsync/config"
)

// provisionRetry is how long the bus waits before it tries again to make
// the copies of a consumer account that it could not make.
const provisionRetry = 5 * time.Second

// provision makes or updates the copies of every consumer account
// (layout.go), each through a connection as that account's provisioning
// user (in-process on the embedded server; on an external NATS, signed
// with ProvisionerKey), once the writer's stream and bucket exist. It runs beside publishing, never on its way (watchHealth, after
// ensure kicks it), and a failure is logged and tried again after
// provisionRetry; a copy made later catches up from the start of the
// writer's stream.
func (b *Bus) provision(ctx context.Context, primary jetstream.StreamConfig) {
	b.provMu.Lock()
	defer b.provMu.Unlock()
	if !b.keepsCopies() {
		return
	}
	l := layoutOf(b.current())
	var errs []error
	for _, c := range l.Consumers {
		if err := provisionOne(ctx, b, l, c, primary); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		b.provisioned.Store(false)
		b.provisionAt = time.Now().Add(provisionRetry)
		b.log.Warn("cannot make the copies of every consumer account; trying again", "err", err, "in", provisionRetry)
		time.AfterFunc(provisionRetry, b.kickProvision)
		return
	}
	b.provisionAt = time.Time{}
	b.provisioned.Store(true)
}

// reprovision has the publishing replica make or update every copy, at
// once and beside what calls it: on a cluster whose nodes learn of a new
// application one at a time, its copies cannot be made until every node
// has its account, and a failure is tried again after provisionRetry.
func (b *Bus) reprovision() {
	b.provMu.Lock()
	b.provisionAt = time.Time{}
	b.provMu.Unlock()
	b.provisioned.Store(false)
	b.kickProvision()
}

// kickProvision has watchHealth make the copies now, if they are due.
func (b *Bus) kickProvision() {
	select {
	case b.provisionKick <- struct{}{}:
	default:
	}
}

// provisionDue reports whether the copies are to be made (again) now.
func (b *Bus) provisionDue() bool {
	if b.provisioned.Load() {
		return false
	}
	b.provMu.Lock()
	defer b.provMu.Unlock()
	return time.Now().After(b.provisionAt)
}

// current is the bus's configuration with bus.consumers as last applied.
func (b *Bus) current() config.Bus {
	cfg := b.cfg
	cfg.Consumers = *b.consumers.Load()
	return cfg
}

// inProcessJS connects to srv in-process as user: hubsync's own, or a
// consumer account's provisioning user. Close the connection when done.
func inProcessJS(srv *server.Server, name, user, password string, opts ...nats.Option) (*nats.Conn, jetstream.JetStream, error) {
	nc, err := nats.Connect("", append(opts, nats.InProcessServer(srv), nats.Name(name), nats.UserInfo(user, password))...)
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}

// keepsCopies reports whether this bus makes and watches the consumer
// accounts' copies: on the embedded server, and on an external NATS that
// hubsync signs in to with an NKey seed (ProvisionerKey).
func (b *Bus) keepsCopies() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.srv != nil {
		return b.auth != nil
	}
	return len(b.cfg.URLs) > 0 && b.cfg.NKeySeedFile != ""
}

// asProvisioner connects as c's provisioning user: in-process on the
// embedded server, else to the external NATS.
func (b *Bus) asProvisioner(c ConsumerAccess) (*nats.Conn, jetstream.JetStream, error) {
	b.mu.Lock()
	srv, auth := b.srv, b.auth
	b.mu.Unlock()
	if srv != nil && auth != nil {
		return inProcessJS(srv, "hubsync-provisioner", provisionerUser+c.Name, auth.provisionerPassword(c.Name))
	}
	return dialExternal(b.cfg, "hubsync-provisioner", &c)
}

func provisionOne(ctx context.Context, b *Bus, l Layout, c ConsumerAccess, primary jetstream.StreamConfig) error {
	nc, js, err := b.asProvisioner(c)
	if err != nil {
		return fmt.Errorf("consumer %s: connect: %w", c.Name, err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(b.untilAnswered(ctx), 5*time.Second)
	defer cancel()
	return l.Provision(ctx, js, c, primary)
}

// CopyState is how far a consumer account's copies are, for health and
// status: how many events and records each holds, and how many the
// server last counted as still to come from hubsync's stream and bucket.
type CopyState struct {
	Consumer string
	// Events and Records are the messages of the events copy and the keys
	// of the records copy.
	Events, Records uint64
	// EventsLag and RecordsLag are the server's last count of the
	// messages still to come: it is updated as messages arrive, so it
	// can read 0 for a moment after hubsync published.
	EventsLag, RecordsLag uint64
	// Err is why the copies could not be read (not made yet, say).
	Err error
}

// Copies reports the copies of every consumer account; nil when this bus
// does not keep them (keepsCopies).
func (b *Bus) Copies(ctx context.Context) []CopyState {
	if !b.keepsCopies() {
		return nil
	}
	l := layoutOf(b.current())
	out := make([]CopyState, 0, len(l.Consumers))
	for _, c := range l.Consumers {
		st := CopyState{Consumer: c.Name}
		st.Err = b.readCopies(ctx, l, c, &st)
		out = append(out, st)
	}
	return out
}

func (b *Bus) readCopies(ctx context.Context, l Layout, c ConsumerAccess, st *CopyState) error {
	nc, js, err := b.asProvisioner(c)
	if err != nil {
		return err
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	ev, err := js.Stream(ctx, l.Stream)
	if err != nil {
		return fmt.Errorf("events copy: %w", err)
	}
	info := ev.CachedInfo()
	st.Events = info.State.Msgs
	var errs []error
	for _, s := range info.Sources {
		st.EventsLag += s.Lag
		if s.Error != nil {
			errs = append(errs, fmt.Errorf("events copy: %w", s.Error))
		}
	}
	kv, err := js.Stream(ctx, l.kvStream())
	if err != nil {
		return fmt.Errorf("records copy: %w", err)
	}
	info = kv.CachedInfo()
	st.Records = info.State.NumSubjects
	for _, s := range info.Sources {
		st.RecordsLag += s.Lag
		if s.Error != nil {
			errs = append(errs, fmt.Errorf("records copy: %w", s.Error))
		}
	}
	return errors.Join(errs...)
}

// SetConsumers applies a new bus.consumers while the bus runs. On the
// embedded server: the copies of a consumer no longer listed are deleted;
// a new consumer's account is registered; the connections of a removed
// consumer, or signed in with a key no longer listed, are closed. The
// other connections, hubsync's own among them, are not touched. On an
// external NATS the accounts are the operator's (AccountsConfig): the
// copies of a removed consumer are deleted, where hubsync signs in with
// an NKey seed. Either way the publishing replica then makes or updates
// every copy, beside this call (reprovision).
func (b *Bus) SetConsumers(ctx context.Context, cs []config.BusConsumer) error {
	b.consumersMu.Lock()
	defer b.consumersMu.Unlock()
	b.mu.Lock()
	srv, auth := b.srv, b.auth
	b.mu.Unlock()
	old := b.current()
	next := old
	next.Consumers = cs
	external := srv == nil || auth == nil
	if external && !b.keepsCopies() {
		b.consumers.Store(&cs)
		return nil
	}
	oldL, nextL := layoutOf(old), layoutOf(next)
	kept := map[string]bool{}
	for _, c := range nextL.Consumers {
		kept[c.Name] = true
	}
	var removed []ConsumerAccess
	for _, c := range oldL.Consumers {
		if !kept[c.Name] {
			removed = append(removed, c)
		}
	}
	for _, c := range removed {
		if err := b.deleteCopies(ctx, oldL, c); err != nil {
			b.log.Warn("cannot delete the copies of a removed consumer; they stay on disk", "consumer", c.Name, "err", err)
		}
	}
	if external {
		b.consumers.Store(&cs)
		b.reprovision()
		b.log.Info("bus consumers applied", "consumers", len(cs), "removed", len(removed))
		return nil
	}
	// The writer account does not change: new accounts are registered
	// beside it, and no other connection notices.
	for _, c := range nextL.Consumers {
		if err := nextL.Register(srv, c); err != nil {
			return err
		}
	}
	if err := auth.setConsumers(next); err != nil {
		return err
	}
	b.consumers.Store(&cs)
	closed := b.closeStale(srv, nextL, next)
	b.reprovision()
	names := make([]string, 0, len(cs))
	for _, c := range cs {
		names = append(names, c.Name)
	}
	b.log.Info("bus consumers applied", "consumers", names, "removed", len(removed), "connectionsClosed", closed)
	return nil
}

// deleteCopies deletes c's copies.
func (b *Bus) deleteCopies(ctx context.Context, l Layout, c ConsumerAccess) error {
	nc, js, err := b.asProvisioner(c)
	if err != nil {
		return err
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var errs []error
	for _, name := range []string{l.Stream, l.kvStream()} {
		if err := js.DeleteStream(ctx, name); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// closeStale closes the consumer connections that cfg no longer admits:
// those in an account that is gone, and those signed in with an NKey no
// longer listed. It returns how many it closed.
func (b *Bus) closeStale(srv *server.Server, l Layout, cfg config.Bus) int {
	accounts := map[string]bool{WriterAccount: true}
	for _, c := range l.Consumers {
		accounts[c.Account()] = true
	}
	keys := map[string]bool{}
	for _, c := range cfg.Consumers {
		for _, k := range c.NKeys {
			keys[k] = true
		}
	}
	conns, err := srv.Connz(&server.ConnzOptions{Username: true, Limit: 1 << 20})
	if err != nil {
		b.log.Warn("cannot list the embedded server's connections", "err", err)
		return 0
	}
	n := 0
	for _, ci := range conns.Conns {
		stale := !accounts[ci.Account] && strings.HasPrefix(ci.Account, "HUBSYNC_CONSUMER_")
		stale = stale || (strings.HasPrefix(ci.AuthorizedUser, "U") && len(ci.AuthorizedUser) == 56 && !keys[ci.AuthorizedUser])
		if stale && srv.DisconnectClientByID(ci.Cid) == nil {
			n++
		}
	}
	return n
}

// healthEvery is how often the embedded server's health metrics are
// refreshed.
const healthEvery = 15 * time.Second

// watchHealth makes the copies when they are due (the publisher's stream
// and bucket made, or a failure's retry) and refreshes the copies' and the
// stream's health metrics every healthEvery, until ctx ends; then it
// closes done.
func (b *Bus) watchHealth(ctx context.Context, done chan<- struct{}) {
	defer close(done)
	t := time.NewTicker(healthEvery)
	defer t.Stop()
	b.refreshHealth(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-b.provisionKick:
			b.provisionIfDue(ctx)
		case <-t.C:
			b.provisionIfDue(ctx)
			b.refreshHealth(ctx)
		}
	}
}

// provisionIfDue makes the copies when this replica publishes and they
// are due.
func (b *Bus) provisionIfDue(ctx context.Context) {
	b.mu.Lock()
	publishing := b.started
	b.mu.Unlock()
	if publishing && b.provisionDue() {
		b.provision(ctx, b.primaryConfig())
	}
}

// refreshHealth reads every application's copies and the event stream's
// replicas into the metrics.
func (b *Bus) refreshHealth(ctx context.Context) {
	b.m.copyLag.Reset()
	b.m.copyFailing.Reset()
	copies := b.Copies(ctx)
	for _, st := range copies {
		failing := 0.0
		if st.Err != nil {
			failing = 1
		}
		b.m.copyFailing.WithLabelValues(st.Consumer).Set(failing)
		b.m.copyLag.WithLabelValues(st.Consumer, "events").Set(float64(st.EventsLag))
		b.m.copyLag.WithLabelValues(st.Consumer, "records").Set(float64(st.RecordsLag))
	}
	h := &Health{At: time.Now(), Copies: copies}
	defer b.health.Store(h)
	current, behind, offline, err := b.StreamReplicas(ctx)
	if err != nil {
		h.StreamErr = err
		return // not made yet, or no quorum: the copies say so too
	}
	h.Current, h.Behind, h.Offline = current, behind, offline
	b.m.streamReplicas.WithLabelValues("current").Set(float64(current))
	b.m.streamReplicas.WithLabelValues("behind").Set(float64(behind))
	b.m.streamReplicas.WithLabelValues("offline").Set(float64(offline))
}

// StreamReplicas counts the event stream's replicas: current (the leader
// among them), behind and offline. An external NATS is read through
// hubsync's own connection.
func (b *Bus) StreamReplicas(ctx context.Context) (current, behind, offline int, err error) {
	b.mu.Lock()
	srv, auth := b.srv, b.auth
	b.mu.Unlock()
	var js jetstream.JetStream
	if srv != nil && auth != nil {
		nc, inproc, err := inProcessJS(srv, "hubsync-health", selfUser, auth.selfPassword, nats.CustomInboxPrefix(selfInboxPrefix))
		if err != nil {
			return 0, 0, 0, err
		}
		defer nc.Close()
		js = inproc
	} else if js = b.jetStream(); js == nil {
		return 0, 0, 0, errNotConnected
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, b.cfg.Stream.Name)
	if err != nil {
		return 0, 0, 0, err
	}
	info := s.CachedInfo()
	if info.Cluster == nil {
		return 1, 0, 0, nil
	}
	if info.Cluster.Leader != "" {
		current++
	}
	for _, r := range info.Cluster.Replicas {
		switch {
		case r.Offline:
			offline++
		case r.Current:
			current++
		default:
			behind++
		}
	}
	return current, behind, offline, nil
}

// nodeReadyTimeout bounds how long a clustered node keeps its replica
// unready while it catches up with the cluster.
const nodeReadyTimeout = 2 * time.Minute

// NodeReady reports whether this replica's node lets it count as ready:
// at once for a single node or an external NATS; a clustered node once its
// JetStream has caught up with the cluster since it started, so that a
// rolling update replaces the next replica only then and the cluster never
// has two nodes behind; or once nodeReadyTimeout has passed, because a
// cluster without quorum must not take the gateway down with it.
func (b *Bus) NodeReady() (bool, string) {
	b.mu.Lock()
	srv, started := b.srv, b.nodeStarted
	b.mu.Unlock()
	if srv == nil || !b.cfg.Embedded.Clustered() || b.nodeCurrent.Load() {
		return true, ""
	}
	// nats-server's own health check (its /healthz): the cluster's meta
	// layer has a leader this node follows, and every stream and
	// consumer replica placed on this node is current. (JetStreamIsCurrent
	// alone says yes to a restarted node that has not heard from any
	// leader yet.)
	h := srv.Healthz(&server.HealthzOptions{})
	if h.StatusCode == http.StatusOK {
		b.nodeCurrent.Store(true)
		b.log.Info("the bus node has caught up with its cluster", "after", time.Since(started).Round(time.Millisecond))
		return true, ""
	}
	if time.Since(started) > nodeReadyTimeout {
		b.nodeCurrent.Store(true)
		b.log.Warn("the bus node has not caught up with its cluster; counting this replica ready anyway", "after", nodeReadyTimeout)
		return true, ""
	}
	return false, "the bus node is catching up with its cluster: " + cmp.Or(h.Error, h.Status)
}

// Health is the embedded bus's last health reading on the publishing
// replica (every healthInterval): the event stream's replicas and every
// application's copies.
type Health struct {
	At                       time.Time
	Current, Behind, Offline int
	// StreamErr is why the stream could not be read (not made yet, or
	// the cluster has no quorum).
	StreamErr error
	Copies    []CopyState
}

// Health returns the last reading; false before the first, or on a
// replica that does not publish.
func (b *Bus) Health() (Health, bool) {
	h := b.health.Load()
	if h == nil {
		return Health{}, false
	}
	return *h, true
}

// HealthLines are /readyz?verbose's lines about the bus: this replica's
// node, and on the publisher the stream's replicas and each copy. A
// degraded bus never makes hubsync unready (but a node catching up
// does): it is reported here, in the metrics and by the alerts.
func (b *Bus) HealthLines(now time.Time) []string {
	var out []string
	if b.cfg.Embedded.Clustered() {
		if ok, why := b.NodeReady(); ok {
			out = append(out, "bus node: current with the cluster")
		} else {
			out = append(out, "bus node: "+why)
		}
	}
	h, ok := b.Health()
	if !ok {
		return out
	}
	age := now.Sub(h.At).Round(time.Second)
	if h.StreamErr != nil {
		out = append(out, fmt.Sprintf("bus stream: cannot be read (%s ago): %v", age, h.StreamErr))
	} else {
		state := "healthy"
		if h.Behind+h.Offline > 0 {
			state = "degraded"
		}
		out = append(out, fmt.Sprintf("bus stream: %s, replicas %d current, %d behind, %d offline (%s ago)", state, h.Current, h.Behind, h.Offline, age))
	}
	for _, c := range h.Copies {
		if c.Err != nil {
			out = append(out, fmt.Sprintf("bus copy %s: failing: %v", c.Consumer, c.Err))
			continue
		}
		out = append(out, fmt.Sprintf("bus copy %s: %d events, %d records; lag %d events, %d records", c.Consumer, c.Events, c.Records, c.EventsLag, c.RecordsLag))
	}
	return out
}

// handOver moves the leadership of every stream this node leads (the
// event stream, the bucket, every application's copies) to another node
// before the node stops, so that publishing and the copies go on at once
// instead of after an election (4 to 9 s) that only starts once its
// heartbeats stop. When the event stream or the bucket moved, every
// application's copy of it changes leader too: a copy's new leader sets
// its source up at once against the new one, where the old leader would
// notice the source gone only at nats-server's 10-second source health
// check. Best effort, within handOverTimeout: what it could not move is
// elected anew as after a crash.
func (b *Bus) handOver(srv *server.Server) {
	b.mu.Lock()
	auth := b.auth
	b.mu.Unlock()
	if auth == nil || !b.cfg.Embedded.Clustered() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), handOverTimeout)
	defer cancel()
	l := layoutOf(b.current())
	me := srv.Name()
	var movedEvents, movedRecords bool
	if nc, js, err := inProcessJS(srv, "hubsync-handover", selfUser, auth.selfPassword, nats.CustomInboxPrefix(selfInboxPrefix)); err == nil {
		movedEvents = b.stepDown(ctx, nc, js, me, l.Stream, false)
		movedRecords = b.stepDown(ctx, nc, js, me, l.kvStream(), false)
		nc.Close()
	}
	for _, c := range l.Consumers {
		if nc, js, err := inProcessJS(srv, "hubsync-handover", provisionerUser+c.Name, auth.provisionerPassword(c.Name)); err == nil {
			b.stepDown(ctx, nc, js, me, l.Stream, movedEvents)
			b.stepDown(ctx, nc, js, me, l.kvStream(), movedRecords)
			nc.Close()
		}
	}
}

// stepDown moves the leadership of stream name away from node me, or
// with always wherever it is, and waits for the new leader so that me
// does not stop in the middle of the election. It reports whether the
// leadership moved.
func (b *Bus) stepDown(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, me, name string, always bool) bool {
	s, err := js.Stream(ctx, name)
	if err != nil || s.CachedInfo().Cluster == nil {
		return false
	}
	was := s.CachedInfo().Cluster.Leader
	if was == "" || (!always && was != me) {
		return false
	}
	if _, err := nc.RequestWithContext(ctx, "$JS.API.STREAM.LEADER.STEPDOWN."+name, nil); err != nil {
		b.log.Debug("could not hand the stream's leadership over", "stream", name, "err", err)
		return false
	}
	for ctx.Err() == nil {
		// Only a stream's leader answers its info: asked during the
		// election, nobody does, and a request bounded by ctx alone would
		// spend the whole hand-over waiting for an answer that never comes.
		pctx, cancel := context.WithTimeout(ctx, handOverPoll)
		info, err := s.Info(pctx)
		cancel()
		if err == nil && info.Cluster != nil && info.Cluster.Leader != "" && info.Cluster.Leader != was && info.Cluster.Leader != me {
			return true
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
	return false
}

const (
	// handOverTimeout bounds handOver.
	handOverTimeout = 5 * time.Second
	// handOverPoll bounds each question of handOver's wait for a new
	// leader.
	handOverPoll = 250 * time.Millisecond
)
