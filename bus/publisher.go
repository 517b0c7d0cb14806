package bus

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hubsync/hubsync/syncer"
)

// run is the publisher: it connects, then publishes the queue's head until
// it is acknowledged and mirrored into the KV bucket, and only then moves
// on, so events of one key are stored in the order they were notified.
// While disconnected it waits; on errors it retries the same head with
// backoff.
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
	if b.js, err = jetstream.New(nc); err != nil {
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
	var lastWarn time.Time
	fail := func(err error) {
		failures++
		if failures == 1 || time.Since(lastWarn) > 30*time.Second {
			b.log.Warn("publishing events failed; retrying the same event", "err", err, "attempts", failures, "buffered", b.q.depth())
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
		if err := b.process(ctx, e); err != nil {
			if ctx.Err() != nil {
				return
			}
			if errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders) ||
				errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, jetstream.ErrBucketNotFound) {
				// The stream or bucket is gone (a server that lost its
				// data, or someone deleted them): recreate them.
				b.needEnsure.Store(true)
			}
			fail(err)
			continue
		}
		if failures > 0 {
			b.log.Info("publishing events again", "failedAttempts", failures, "buffered", b.q.depth())
		}
		failures, backoff = 0, b.retryBase
		b.q.pop()
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

// process does what is left of one queue entry. Progress is kept in the
// entry, so after an error the next call resumes where this one stopped.
func (b *Bus) process(ctx context.Context, e *entry) error {
	now := time.Now()
	if !e.isSnap {
		if e.published == 0 {
			if err := b.publish(ctx, e.change); err != nil {
				return err
			}
			e.published = 1
		}
		if !e.applied {
			if validChange(e.change) == nil {
				if op, ok := b.recs.apply(e.change, now); ok {
					e.ops = []kvOp{op}
				}
			}
			e.applied = true
		}
		return b.write(ctx, e)
	}
	for e.published < len(e.snapshot) {
		if err := b.publish(ctx, e.snapshot[e.published]); err != nil {
			return err
		}
		e.published++
	}
	if !e.applied {
		fresh := records{}
		for _, c := range e.snapshot {
			if validChange(c) == nil {
				fresh.apply(c, now)
			}
		}
		b.recs = fresh
		for _, key := range sortedKeys(fresh) {
			e.ops = append(e.ops, fresh[key].put(key))
		}
		e.applied = true
	}
	if !e.pruned {
		// Records of pairs the snapshot does not mention are stale (an
		// earlier run, or changes missed while disconnected).
		keys, err := b.kvKeys(ctx)
		if err != nil {
			return err
		}
		for key := range keys {
			if b.recs[key] == nil {
				e.ops = append(e.ops, kvOp{key: key})
			}
		}
		e.pruned = true
	}
	return b.write(ctx, e)
}

// publish sends one change and waits for JetStream's ack. A change that
// cannot become an event is logged and skipped.
func (b *Bus) publish(ctx context.Context, c syncer.Change) error {
	kind, err := Kind(c.Type)
	var data []byte
	if err == nil {
		data, err = Encode(c, b.source)
	}
	if err != nil {
		b.m.publishErrors.Inc()
		b.log.Error("skipping a change that cannot be published", "err", err, "type", c.Type, "namespace", c.Namespace, "cluster", c.Cluster)
		return nil
	}
	subject := Subject(b.cfg.SubjectPrefix, c.Namespace, c.Cluster, kind)
	msg := &nats.Msg{Subject: subject, Data: data, Header: nats.Header{}}
	msg.Header.Set("Content-Type", ContentType)
	ctx, cancel := context.WithTimeout(ctx, b.opTimeout)
	defer cancel()
	start := time.Now()
	ack, err := b.js.PublishMsg(ctx, msg, jetstream.WithMsgID(EventID(c)))
	b.m.publishDuration.Observe(time.Since(start).Seconds())
	if err != nil {
		b.m.publishErrors.Inc()
		return fmt.Errorf("publish %s to %s: %w", c.Type, subject, err)
	}
	b.m.published.WithLabelValues(c.Type).Inc()
	if ack.Duplicate {
		b.m.duplicates.Inc()
	}
	return nil
}

// write performs the entry's pending KV writes in order.
func (b *Bus) write(ctx context.Context, e *entry) error {
	for len(e.ops) > 0 {
		op := e.ops[0]
		opCtx, cancel := context.WithTimeout(ctx, b.opTimeout)
		var err error
		name := "put"
		if op.value == nil {
			name = "delete"
			err = b.kv.Delete(opCtx, op.key)
		} else {
			_, err = b.kv.Put(opCtx, op.key, op.value)
		}
		cancel()
		if err != nil {
			b.m.kvErrors.Inc()
			return fmt.Errorf("KV %s %s: %w", name, op.key, err)
		}
		b.m.kvWrites.WithLabelValues(name).Inc()
		e.ops[0] = kvOp{}
		e.ops = e.ops[1:]
	}
	return nil
}
