package bus

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hubsync/hubsync/syncer"
)

// run is the publisher: it connects, then publishes the queue's head in
// batches: a batch is the changes at the head, up to maxBatch and up to the
// first one about a (namespace, cluster) already in it, sent pipelined and
// only popped when every event is acknowledged and mirrored into the KV
// bucket, so events of one key are stored in the order they were notified.
// A snapshot is a batch of its own. While disconnected it waits; on errors
// it retries what is left of the same batch with backoff.
func (b *Bus) run(ctx context.Context, opts nats.Options) {
	defer close(b.done)
	nc, err := opts.Connect()
	if err != nil {
		// Only option problems get here: network failures are retried
		// inside nats.go (RetryOnFailedConnect).
		b.log.Error("cannot set up the NATS connection; events are not published", "err", err)
		<-ctx.Done()
		return
	}
	defer nc.Close()
	b.nc.Store(nc)
	if b.js, err = jetstream.New(nc, jetstream.WithPublishAsyncTimeout(b.opTimeout), jetstream.WithPublishAsyncMaxPending(4*b.maxBatch)); err != nil {
		b.log.Error("cannot use JetStream; events are not published", "err", err)
		<-ctx.Done()
		return
	}
	if !nc.IsConnected() {
		b.log.Warn("NATS is not reachable yet; events are buffered and the connection is retried in the background",
			"urls", redactURLs(b.cfg.URLs), "bufferSize", b.cfg.BufferSize)
	}

	backoff := b.retryBase
	failures := 0
	var lastAt time.Time // when the last change published was notified
	var lastWarn time.Time
	fail := func(err error) {
		failures++
		if failures == 1 || time.Since(lastWarn) > 30*time.Second {
			b.log.Warn("publishing events failed; retrying what is unacknowledged, in order", "err", err, "attempts", failures, "buffered", b.q.depth())
			lastWarn = time.Now()
		} else {
			b.log.Debug("publishing events failed; retrying", "err", err, "attempts", failures)
		}
		b.wait(ctx, backoff, nil)
		backoff = min(2*backoff, b.retryMax)
	}
	for ctx.Err() == nil {
		if !nc.IsConnected() {
			b.wait(ctx, time.Second, nil)
			continue
		}
		if b.needEnsure.Load() {
			// Cleared before the attempt: a reconnect during it asks again.
			b.needEnsure.Store(false)
			if err := b.ensure(ctx); err != nil {
				b.needEnsure.Store(true)
				fail(err)
				continue
			}
		}
		b.maybeResync()
		e := b.q.head()
		if e == nil {
			idle := time.Second
			if d := time.Until(b.nextSnapshot); d > 0 && d < idle {
				idle = d // a snapshot to ask for again
			}
			b.wait(ctx, idle, b.q.wake)
			continue
		}
		if !e.isSnap && b.batchWindow > 0 && failures == 0 && e.at.Sub(lastAt) < b.batchWindow {
			// Changes are coming close together: let the ones that follow
			// join this one's batch. A change after a quiet spell goes at
			// once.
			if d := time.Until(e.at.Add(b.batchWindow)); d > 0 && b.q.depth() < b.maxBatch {
				b.wait(ctx, d, nil)
				continue
			}
		}
		batch := b.q.batch(b.maxBatch)
		var err error
		if batch[0].isSnap {
			err = b.processSnapshot(ctx, batch[0])
		} else {
			err = b.processChanges(ctx, batch)
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders) ||
				errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, jetstream.ErrBucketNotFound) {
				// The stream or bucket is gone (a server that lost its
				// data, or someone deleted them): recreate them, and
				// republish the current state into them.
				b.needEnsure.Store(true)
				b.q.markResync()
			}
			fail(err)
			continue
		}
		if failures > 0 {
			b.log.Info("publishing events again", "failedAttempts", failures, "buffered", b.q.depth())
		}
		failures, backoff = 0, b.retryBase
		if last := batch[len(batch)-1]; !last.isSnap {
			lastAt = last.at
			b.m.batchSize.Observe(float64(len(batch)))
		}
		b.q.pop(len(batch))
	}
}

// wait sleeps for d, returning early when ctx is done, the connection's
// state changes or wake fires.
func (b *Bus) wait(ctx context.Context, d time.Duration, wake <-chan struct{}) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	case <-b.state:
	case <-wake:
	}
}

// maybeResync inserts a snapshot of the current state into the queue when
// one is wanted: after the changes notified before it, before the ones
// notified after.
func (b *Bus) maybeResync() {
	if time.Now().Before(b.nextSnapshot) {
		return
	}
	want, after := b.q.takeResync()
	if !want || b.snapshot == nil {
		return
	}
	snap := b.snapshot()
	if snap == nil {
		b.log.Debug("current state not known yet; republishing it later")
		b.nextSnapshot = time.Now().Add(b.snapshotRetry)
		b.q.markResync()
		return
	}
	b.q.insertSnapshot(after, snap)
	b.m.resyncs.Inc()
	b.log.Info("republishing the current state", "changes", len(snap), "buffered", b.q.depth())
}

// inflight is one asynchronous publish of a batch: an event or a KV write
// of an entry.
type inflight struct {
	e      *entry
	fut    jetstream.PubAckFuture
	sent   time.Time
	change *syncer.Change // an event; nil for a KV write
	op     kvOp           // a KV write
}

// processChanges does what is left of a batch of change entries, whose
// (namespace, cluster) pairs are all different: every event and KV write
// is sent at once and the acks are awaited together. Progress is kept in
// the entries, so after an error the retry resends only what was not
// acknowledged; as no two entries of the batch share a key, per-key order
// holds whatever the acks' order.
func (b *Bus) processChanges(ctx context.Context, batch []*entry) error {
	now := time.Now()
	var sent []inflight
	var sendErr error
	for _, e := range batch {
		if e.published == 0 {
			f, err := b.sendEvent(&e.change)
			if err != nil {
				sendErr = err
				break
			}
			if f == nil {
				e.published = 1 // cannot become an event: logged and skipped
			} else {
				sent = append(sent, inflight{e: e, fut: f, sent: time.Now(), change: &e.change})
			}
		}
		if !e.applied {
			if validChange(e.change) == nil {
				if op, ok := b.recs.apply(e.change, now); ok {
					e.ops = []kvOp{op}
				}
			}
			e.applied = true
		}
		if len(e.ops) > 0 {
			f, err := b.sendKV(e.ops[0])
			if err != nil {
				sendErr = err
				break
			}
			sent = append(sent, inflight{e: e, fut: f, sent: time.Now(), op: e.ops[0]})
		}
	}
	err := b.settle(ctx, sent, func(i inflight) {
		if i.change != nil {
			i.e.published = 1
		} else {
			i.e.ops = nil
		}
	})
	return errors.Join(sendErr, err)
}

// processSnapshot does what is left of a snapshot entry: it plans the
// entry's events and KV writes once, then sends them, each pipelined in
// chunks of maxBatch. A failed chunk is resent whole: the events JetStream
// already stored are dropped as duplicates of their ids, and KV writes are
// idempotent. A snapshot holds at most one change per subject, so order
// per key is kept.
func (b *Bus) processSnapshot(ctx context.Context, e *entry) error {
	if !e.applied {
		if err := b.planSnapshot(ctx, e); err != nil {
			return err
		}
		e.applied = true
	}
	for e.published < len(e.events) {
		chunk := e.events[e.published:min(e.published+b.maxBatch, len(e.events))]
		if err := b.sendAll(ctx, len(chunk), func(i int) (inflight, error) {
			f, err := b.sendEvent(&chunk[i])
			return inflight{e: e, fut: f, sent: time.Now(), change: &chunk[i]}, err
		}); err != nil {
			return err
		}
		e.published += len(chunk)
	}
	for len(e.ops) > 0 {
		chunk := e.ops[:min(b.maxBatch, len(e.ops))]
		if err := b.sendAll(ctx, len(chunk), func(i int) (inflight, error) {
			f, err := b.sendKV(chunk[i])
			return inflight{e: e, fut: f, sent: time.Now(), op: chunk[i]}, err
		}); err != nil {
			return err
		}
		clear(chunk)
		e.ops = e.ops[len(chunk):]
	}
	return nil
}

// planSnapshot compares a snapshot of the current state with what
// consumers were told: the records built from this run's events, and, for
// pairs only the KV bucket knows, its records from an earlier run. The
// entry's events are the snapshot's, then a removal for every profile or
// credential consumers were told of that no longer exists (its change was
// dropped, or happened while hubsync was not running); its KV writes make
// the bucket equal to the snapshot.
func (b *Bus) planSnapshot(ctx context.Context, e *entry) error {
	now := time.Now()
	fresh := records{}
	for _, c := range e.snapshot {
		if validChange(c) == nil {
			fresh.apply(c, now)
		}
	}
	// Only the first snapshot of a run can meet records of an earlier run.
	stored, err := b.kvRecords(ctx, !b.readStored)
	if err != nil {
		return err
	}
	b.readStored = true
	told := maps.Clone(b.recs)
	for key, r := range stored {
		if told[key] == nil && r != nil {
			told[key] = r // from an earlier run
		}
	}
	events := slices.Clone(e.snapshot)
	for _, key := range slices.Sorted(maps.Keys(told)) {
		events = append(events, removals(told[key], fresh[key], now)...)
	}
	ops := make([]kvOp, 0, len(fresh))
	for _, key := range slices.Sorted(maps.Keys(fresh)) {
		ops = append(ops, fresh[key].put(key))
	}
	for _, key := range slices.Sorted(maps.Keys(stored)) {
		if fresh[key] == nil {
			ops = append(ops, kvOp{key: key})
		}
	}
	if n := len(events) - len(e.snapshot); n > 0 {
		b.log.Info("announcing removals consumers missed", "removals", n)
	}
	e.events, e.ops = events, ops
	b.recs = fresh
	return nil
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
	return errors.Join(sendErr, b.settle(ctx, sent, nil))
}

// sendEvent publishes one change asynchronously. A change that cannot
// become an event is logged and skipped: it returns a nil future.
func (b *Bus) sendEvent(c *syncer.Change) (jetstream.PubAckFuture, error) {
	kind, err := Kind(c.Type)
	var data []byte
	if err == nil {
		data, err = Encode(*c, b.source)
	}
	if err != nil {
		b.m.publishErrors.Inc()
		b.log.Error("skipping a change that cannot be published", "err", err, "type", c.Type, "namespace", c.Namespace, "cluster", c.Cluster)
		return nil, nil
	}
	subject := Subject(b.cfg.SubjectPrefix, c.Namespace, c.Cluster, kind)
	msg := &nats.Msg{Subject: subject, Data: data, Header: nats.Header{}}
	msg.Header.Set("Content-Type", ContentType)
	f, err := b.js.PublishMsgAsync(msg, jetstream.WithMsgID(EventID(*c)))
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
	msg := nats.NewMsg(b.kvPrefix + op.key)
	if op.value == nil {
		msg.Header.Set(kvOperationHeader, kvOperationDelete)
	} else {
		msg.Data = op.value
	}
	f, err := b.js.PublishMsgAsync(msg)
	if err != nil {
		b.m.kvErrors.Inc()
		return nil, fmt.Errorf("KV %s %s: %w", op.name(), op.key, err)
	}
	return f, nil
}

// settle waits for the acks of sent, counting each, and calls done for
// every one acknowledged. It returns the first error; an ack that does not
// come within the operation timeout is an error (the future's own
// timeout), and so is ctx ending.
func (b *Bus) settle(ctx context.Context, sent []inflight, done func(inflight)) error {
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
		if done != nil {
			done(i)
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
