package bus

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hubsync/hubsync/events"
	"github.com/hubsync/hubsync/stream"
)

// errNotConnected fails a delivery while NATS is unreachable; the
// fan-out keeps the changes queued and retries, and a reconnect ends the
// wait at once.
var errNotConnected = errors.New("NATS is not connected")

// run connects and keeps the connection until ctx ends. Network failures
// are retried inside nats.go (RetryOnFailedConnect, MaxReconnect -1).
func (b *Bus) run(ctx context.Context, opts nats.Options) {
	defer close(b.done)
	nc, err := opts.Connect()
	if err != nil {
		// Only option problems get here.
		b.log.Error("cannot set up the NATS connection; events are not published", "err", err)
		<-ctx.Done()
		return
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(b.opTimeout), jetstream.WithPublishAsyncMaxPending(4*b.maxBatch))
	if err != nil {
		b.log.Error("cannot use JetStream; events are not published", "err", err)
		<-ctx.Done()
		return
	}
	b.js.Store(&js)
	b.nc.Store(nc)
	if !nc.IsConnected() {
		b.log.Warn("NATS is not reachable yet; events wait in the bus's queue and the connection is retried in the background",
			"urls", RedactURLs(b.cfg.URLs), "queueSize", b.cfg.BufferSize)
	} else {
		// Connected before the callbacks could see the JetStream context.
		b.resyncNow()
	}
	<-ctx.Done()
}

// ready checks the connection and creates the stream and bucket when
// needed (first use, reconnect, or found missing).
func (b *Bus) ready(ctx context.Context) error {
	if !b.connected() || b.jetStream() == nil {
		return errNotConnected
	}
	if b.needEnsure.Load() {
		// Cleared before the attempt: a reconnect during it asks again.
		b.needEnsure.Store(false)
		if err := b.ensure(ctx); err != nil {
			b.needEnsure.Store(true)
			return err
		}
	}
	return nil
}

// checkGone asks for the stream and bucket to be recreated, and the
// current state to be republished into them, when err says they are gone
// (a server that lost its data, or someone deleted them).
func (b *Bus) checkGone(err error) {
	if errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders) ||
		errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, jetstream.ErrBucketNotFound) {
		b.needEnsure.Store(true)
		b.resyncNow()
	}
}

// inflight is one asynchronous publish: an event or a KV write.
type inflight struct {
	fut    jetstream.PubAckFuture
	sent   time.Time
	change *stream.Change // an event; nil for a KV write
	op     kvOp           // a KV write
}

// Deliver implements stream.Consumer: it publishes a batch of changes,
// whose (namespace, cluster) pairs are all different, pipelined: every
// event and KV write is sent at once and the acks are awaited together. On
// an error the fan-out delivers the same batch again; events JetStream
// already stored are dropped as duplicates of their ids, and KV writes are
// idempotent, so per-key order holds whatever the acks' order.
func (b *Bus) Deliver(ctx context.Context, changes []stream.Change) error {
	if err := b.ready(ctx); err != nil {
		return err
	}
	now := time.Now()
	if err := b.announceUnknown(ctx, changes); err != nil {
		b.checkGone(err)
		return err
	}
	sent := make([]inflight, 0, 2*len(changes))
	var sendErr error
	for i := range changes {
		c := &changes[i]
		f, err := b.sendEvent(c)
		if err != nil {
			sendErr = err
			break
		}
		if f != nil {
			sent = append(sent, inflight{fut: f, sent: time.Now(), change: c})
		}
		if events.CheckChange(*c) != nil {
			continue
		}
		if op, ok := kvOpFor(b.recs, *c, now); ok {
			f, err := b.sendKV(op)
			if err != nil {
				sendErr = err
				break
			}
			sent = append(sent, inflight{fut: f, sent: time.Now(), op: op})
		}
	}
	err := errors.Join(sendErr, b.settle(ctx, sent))
	if err != nil {
		b.checkGone(err)
		return err
	}
	b.m.batchSize.Observe(float64(len(changes)))
	clear(b.typed)
	return nil
}

// announceUnknown types profile changes by what consumers were told: an
// update of a profile they were never told of is its creation, and a
// creation of one they were already told of (a resync announced it first)
// is an update, so that each profile is created once. Before this run's
// first resync the bus knows only what it published itself, so it asks the
// KV bucket about an update it knows nothing of: a replica that led before
// may have created the profile and been killed with its announcement still
// queued, and this replica's first write to it is an update.
func (b *Bus) announceUnknown(ctx context.Context, changes []stream.Change) error {
	if b.typed == nil {
		b.typed = map[string]string{}
	}
	// A batch holds at most one change of a (namespace, cluster).
	for i := range changes {
		c := &changes[i]
		id := events.ID(*c)
		if t, ok := b.typed[id]; ok {
			c.Type = t
			continue
		}
		r := b.recs[stream.Key{Namespace: c.Namespace, Cluster: c.Cluster}]
		known := r != nil && r.Profile != nil
		switch {
		case c.Type == stream.ProfileCreated && known:
			c.Type = stream.ProfileUpdated
		case c.Type == stream.ProfileUpdated && !known && events.CheckChange(*c) == nil:
			stored, err := b.storedProfile(ctx, stream.Key{Namespace: c.Namespace, Cluster: c.Cluster})
			if err != nil {
				return err
			}
			if !stored {
				c.Type = stream.ProfileCreated
			}
		}
		b.typed[id] = c.Type
	}
	return nil
}

// storedProfile reports whether, before this run's first resync, the KV
// bucket holds a record with a profile for k (after it, recs know all).
func (b *Bus) storedProfile(ctx context.Context, k stream.Key) (bool, error) {
	if b.readStored {
		return false, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	entry, err := b.kv.Get(ctx, events.KVKey(k.Namespace, k.Cluster))
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("read the KV bucket: %w", err)
	}
	var r Record
	return json.Unmarshal(entry.Value(), &r) == nil && r.Profile != nil, nil
}

// Resync implements stream.Consumer: it compares the current state with
// what consumers were told (the records built from this run's events and,
// for pairs only the KV bucket knows, its records from an earlier run),
// then publishes the snapshot's events, a removal for every profile or
// credential consumers were told of that no longer exists (its change was
// dropped, or happened while hubsync was not running), and the KV writes
// that make the bucket equal to the snapshot, each pipelined in chunks. A
// failed resync is retried whole: the events JetStream already stored are
// dropped as duplicates of their ids, and KV writes are idempotent.
func (b *Bus) Resync(ctx context.Context, snapshot []stream.Change) error {
	if err := b.ready(ctx); err != nil {
		return err
	}
	// Only the first resync of a run can meet records of an earlier run.
	stored, err := b.kvRecords(ctx, !b.readStored)
	if err != nil {
		b.checkGone(err)
		return err
	}
	p := planResync(b.recs, stored, snapshot, time.Now())
	if n := len(p.events) - len(snapshot); n > 0 {
		b.log.Info("announcing removals consumers missed", "removals", n)
	}
	b.log.Info("republishing the current state", "changes", len(snapshot))
	if err := b.sendBatched(ctx, len(p.events), func(j int) (inflight, error) {
		f, err := b.sendEvent(&p.events[j])
		return inflight{fut: f, sent: time.Now(), change: &p.events[j]}, err
	}); err != nil {
		return err
	}
	if err := b.sendBatched(ctx, len(p.ops), func(j int) (inflight, error) {
		f, err := b.sendKV(p.ops[j])
		return inflight{fut: f, sent: time.Now(), op: p.ops[j]}, err
	}); err != nil {
		return err
	}
	b.recs, b.readStored = p.records, true
	b.m.resyncs.Inc()
	return nil
}

// resyncPlan is what a resync publishes: the events of the snapshot and of
// the removals consumers missed, the KV writes and deletes, and the records
// consumers hold once both are stored.
type resyncPlan struct {
	events  []stream.Change
	ops     []kvOp
	records stream.Records
}

// planResync compares what consumers were told (told: this run's records;
// stored: the KV bucket's, from an earlier run) with the snapshot.
func planResync(told stream.Records, stored map[string]*Record, snapshot []stream.Change, now time.Time) resyncPlan {
	valid := make([]stream.Change, 0, len(snapshot))
	for _, c := range snapshot {
		if events.CheckChange(c) == nil {
			valid = append(valid, c)
		}
	}
	told = maps.Clone(told)
	for _, r := range stored {
		if r == nil {
			continue
		}
		if k := (stream.Key{Namespace: r.Namespace, Cluster: r.Cluster}); told[k] == nil {
			told[k] = r // from an earlier run
		}
	}
	fresh, planned := stream.Plan(told, valid, now)
	// A profile the KV has no record of was never announced (a replica
	// that led before was killed with it still queued, or the bucket was
	// lost): announce it as created. Its id is the one the earlier
	// announcement would have had, so JetStream keeps one of the two.
	for i := range valid {
		if e := &planned[i]; e.Type == stream.ProfileUpdated {
			if r := told[stream.Key{Namespace: e.Namespace, Cluster: e.Cluster}]; r == nil || r.Profile == nil {
				e.Type = stream.ProfileCreated
			}
		}
	}
	// Changes that cannot become events are still offered (and skipped
	// with a log line), as a delivery would.
	for _, c := range snapshot {
		if events.CheckChange(c) != nil {
			planned = append(planned, c)
		}
	}
	ops := make([]kvOp, 0, len(fresh))
	freshKeys := make(map[string]bool, len(fresh))
	for _, k := range slices.SortedFunc(maps.Keys(fresh), compareKeys) {
		key := events.KVKey(k.Namespace, k.Cluster)
		freshKeys[key] = true
		ops = append(ops, putRecord(key, fresh[k]))
	}
	for _, key := range slices.Sorted(maps.Keys(stored)) {
		if !freshKeys[key] {
			ops = append(ops, kvOp{key: key})
		}
	}
	return resyncPlan{events: planned, ops: ops, records: fresh}
}

// sendBatched sends n messages in batches of at most maxBatch in flight,
// waiting for each batch's acknowledgements.
func (b *Bus) sendBatched(ctx context.Context, n int, send func(i int) (inflight, error)) error {
	for i := 0; i < n; i += b.maxBatch {
		base := i
		if err := b.sendAll(ctx, min(b.maxBatch, n-i), func(j int) (inflight, error) { return send(base + j) }); err != nil {
			b.checkGone(err)
			return err
		}
	}
	return nil
}

func compareKeys(a, b stream.Key) int {
	return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Cluster, b.Cluster))
}

// sendAll sends n messages with send, then waits for their acks; it
// stops sending at the first error, still waiting for what was sent. An
// inflight without a future (a change that cannot become an event) is
// not waited for.
func (b *Bus) sendAll(ctx context.Context, n int, send func(i int) (inflight, error)) error {
	sent := make([]inflight, 0, n)
	var sendErr error
	for i := range n {
		f, err := send(i)
		if err != nil {
			sendErr = err
			break
		}
		if f.fut != nil {
			sent = append(sent, f)
		}
	}
	return errors.Join(sendErr, b.settle(ctx, sent))
}

// sendEvent publishes one change asynchronously. A change that cannot
// become an event is logged and skipped: it returns a nil future.
func (b *Bus) sendEvent(c *stream.Change) (jetstream.PubAckFuture, error) {
	js := b.jetStream()
	if js == nil {
		return nil, errNotConnected
	}
	kind, err := events.Kind(c.Type)
	var data []byte
	if err == nil {
		data, err = events.Encode(*c, b.source)
	}
	if err != nil {
		b.m.publishErrors.Inc()
		b.log.Error("skipping a change that cannot be published", "err", err, "type", c.Type, "namespace", c.Namespace, "cluster", c.Cluster)
		return nil, nil
	}
	subject := events.Subject(b.cfg.SubjectPrefix, c.Namespace, c.Cluster, kind)
	msg := &nats.Msg{Subject: subject, Data: data, Header: nats.Header{}}
	msg.Header.Set("Content-Type", events.ContentType)
	f, err := js.PublishMsgAsync(msg, jetstream.WithMsgID(events.ID(*c)))
	if err != nil {
		b.m.publishErrors.Inc()
		return nil, fmt.Errorf("publish %s to %s: %w", c.Type, subject, err)
	}
	return f, nil
}

// sendKV writes one KV op asynchronously, as the KV API does: a put is a
// message on the key's subject, a delete one with a KV-Operation: DEL
// header and no data.
func (b *Bus) sendKV(op kvOp) (jetstream.PubAckFuture, error) {
	js := b.jetStream()
	if js == nil {
		return nil, errNotConnected
	}
	msg := nats.NewMsg(b.kvPrefix + op.key)
	if op.value == nil {
		msg.Header.Set(kvOperationHeader, kvOperationDelete)
	} else {
		msg.Data = op.value
	}
	f, err := js.PublishMsgAsync(msg)
	if err != nil {
		b.m.kvErrors.Inc()
		return nil, fmt.Errorf("KV %s %s: %w", op.name(), op.key, err)
	}
	return f, nil
}

// settle waits for the acks of sent, counting each. It returns the first
// error; an ack that does not come within the operation timeout is an
// error (the future's own timeout), and so is ctx ending.
func (b *Bus) settle(ctx context.Context, sent []inflight) error {
	var first error
	for _, i := range sent {
		var ack *jetstream.PubAck
		var err error
		select {
		case ack = <-i.fut.Ok():
		case err = <-i.fut.Err():
		case <-ctx.Done():
			err = ctx.Err()
		}
		if i.change != nil {
			subject := i.fut.Msg().Subject
			if err != nil {
				b.m.publishErrors.Inc()
				first = cmp.Or(first, fmt.Errorf("publish %s to %s: %w", i.change.Type, subject, err))
				continue
			}
			b.m.publishDuration.Observe(time.Since(i.sent).Seconds())
			b.m.published.WithLabelValues(i.change.Type).Inc()
			if ack.Duplicate {
				b.m.duplicates.Inc()
			}
		} else {
			if err != nil {
				b.m.kvErrors.Inc()
				first = cmp.Or(first, fmt.Errorf("KV %s %s: %w", i.op.name(), i.op.key, err))
				continue
			}
			b.m.kvWrites.WithLabelValues(i.op.name()).Inc()
		}
	}
	return first
}

// The KV API's operation header, as nats.go writes it.
const (
	kvOperationHeader = "KV-Operation"
	kvOperationDelete = "DEL"
)

func (op kvOp) name() string {
	if op.value == nil {
		return "delete"
	}
	return "put"
}
