package stream

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// consumer is one consumer's queue and worker.
type consumer struct {
	f    *Fanout
	opts Options
	sink Consumer
	q    *queue

	retry chan struct{} // ends a backoff early
	done  chan struct{} // closed when the worker has stopped

	startOnce sync.Once
	cancel    context.CancelFunc
	started   atomic.Bool

	healthy     atomic.Bool
	failures    atomic.Int64
	lastSuccess atomic.Int64 // unix nanoseconds
	mu          sync.Mutex
	lastErr     string

	// Owned by the worker.
	nextSnapshot time.Time // while the state is not known, when to ask again
	lastResync   time.Time
}

var _ Control = (*consumer)(nil)

// RequestResync implements Control.
func (w *consumer) RequestResync() { w.q.markResync() }

// Retry implements Control.
func (w *consumer) Retry() {
	select {
	case w.retry <- struct{}{}:
	default:
	}
	w.q.signal()
}

func (w *consumer) start(ctx context.Context) {
	w.startOnce.Do(func() {
		ctx, w.cancel = context.WithCancel(ctx)
		w.started.Store(true)
		go w.run(ctx)
	})
}

// stop ends the worker and waits for it; a worker never started is done.
func (w *consumer) stop() {
	w.q.close()
	w.startOnce.Do(func() {}) // a later start is a no-op
	if w.started.Load() {
		w.cancel()
		<-w.done
	}
}

func (w *consumer) flush(ctx context.Context, seq uint64) error {
	for {
		done, changed := w.q.doneUpTo(seq)
		if done {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("sink %s: %d changes not delivered: %w", w.opts.Name, w.q.depth(), ctx.Err())
		}
	}
}

func (w *consumer) status() Status {
	s := Status{
		Name: w.opts.Name, Type: w.opts.Type, Healthy: w.healthy.Load(),
		QueueDepth: w.q.depth(), Failures: int(w.failures.Load()),
	}
	if ns := w.lastSuccess.Load(); ns > 0 {
		s.LastSuccess = time.Unix(0, ns).UTC()
	}
	if !s.Healthy {
		w.mu.Lock()
		s.LastError = w.lastErr
		w.mu.Unlock()
	}
	return s
}

// run is the worker: it delivers the queue's head in batches, a snapshot
// alone, and pops a batch only once it is delivered, so a consumer sees
// every key's changes in order. After a failure it retries the same batch
// with exponential backoff.
func (w *consumer) run(ctx context.Context) {
	defer close(w.done)
	m, name, log := w.f.m, w.opts.Name, w.opts.Log
	backoff := w.opts.RetryBase
	var lastAt time.Time // when the last change delivered was notified
	var lastWarn time.Time
	w.lastResync = time.Now()
	for ctx.Err() == nil {
		if p := w.opts.ResyncPeriod; p > 0 && time.Since(w.lastResync) >= p {
			w.lastResync = time.Now()
			w.q.markResync()
		}
		w.maybeResync()
		e := w.q.head()
		if e == nil {
			w.wait(ctx, w.idle(), w.q.wake)
			continue
		}
		if w.opts.Yield && time.Since(e.at) < w.opts.YieldMax && (w.opts.YieldLimit <= 0 || w.q.depth() < w.opts.YieldLimit) && w.f.producerBusy() {
			// The producer is converging: let it have the CPU and the API
			// server, and take what piled up once it is done.
			w.wait(ctx, min(yieldPoll, w.opts.YieldMax-time.Since(e.at)), nil)
			continue
		}
		if !e.isSnap && w.opts.BatchWindow > 0 && w.failures.Load() == 0 && e.at.Sub(lastAt) < w.opts.BatchWindow {
			// Changes are coming close together: let the ones that follow
			// join this one's batch. A change after a quiet spell goes at
			// once.
			if d := time.Until(e.at.Add(w.opts.BatchWindow)); d > 0 && w.q.depth() < w.opts.MaxBatch {
				w.wait(ctx, d, nil)
				continue
			}
		}
		batch := w.q.batch(w.opts.MaxBatch)
		var err error
		if batch[0].isSnap {
			err = w.sink.Resync(ctx, batch[0].snapshot)
		} else {
			changes := make([]Change, len(batch))
			for i, e := range batch {
				changes[i] = e.change
			}
			err = w.sink.Deliver(ctx, changes)
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			n := w.failures.Add(1)
			w.healthy.Store(false)
			w.mu.Lock()
			w.lastErr = err.Error()
			w.mu.Unlock()
			m.failures.WithLabelValues(name).Inc()
			if n == 1 || time.Since(lastWarn) > 30*time.Second {
				log.Warn("sink delivery failed; retrying in order with backoff", "err", err, "attempts", n,
					"queued", w.q.depth(), "retryIn", backoff)
				lastWarn = time.Now()
			} else {
				log.Debug("sink delivery failed; retrying", "err", err, "attempts", n)
			}
			w.wait(ctx, backoff, w.retry)
			backoff = min(2*backoff, w.opts.RetryMax)
			continue
		}
		now := time.Now()
		if n := w.failures.Swap(0); n > 0 {
			log.Info("sink delivering again", "failedAttempts", n, "queued", w.q.depth())
		}
		backoff = w.opts.RetryBase
		w.healthy.Store(true)
		w.lastSuccess.Store(now.UnixNano())
		if batch[0].isSnap {
			m.resyncs.WithLabelValues(name).Inc()
			w.lastResync = now
		} else {
			lag := m.lag.WithLabelValues(name)
			for _, e := range batch {
				lag.Observe(now.Sub(e.at).Seconds())
			}
			m.delivered.WithLabelValues(name).Add(float64(len(batch)))
			lastAt = batch[len(batch)-1].at
		}
		w.q.pop(len(batch))
	}
}

// idle is how long the worker may wait with nothing queued.
func (w *consumer) idle() time.Duration {
	d := time.Minute
	if until := time.Until(w.nextSnapshot); until > 0 && until < d {
		d = until
	}
	if p := w.opts.ResyncPeriod; p > 0 {
		d = min(d, max(time.Until(w.lastResync.Add(p)), time.Millisecond))
	}
	return d
}

// maybeResync inserts a snapshot of the current state when one is wanted:
// after the changes notified before it, before the ones notified after.
func (w *consumer) maybeResync() {
	if time.Now().Before(w.nextSnapshot) {
		return
	}
	want, after := w.q.takeResync()
	if !want {
		return
	}
	snap := w.f.snapshotFor(w.opts.Filter)
	if snap == nil {
		w.f.mu.RLock()
		known := w.f.snapshot != nil
		w.f.mu.RUnlock()
		if !known {
			return // resyncs are off
		}
		w.opts.Log.Debug("current state not known yet; resyncing later")
		w.nextSnapshot = time.Now().Add(snapshotRetry)
		w.q.markResync()
		return
	}
	w.q.insertSnapshot(after, snap)
	w.opts.Log.Debug("resyncing the sink from the current state", "changes", len(snap), "queued", w.q.depth())
}

// wait sleeps for d, returning early when ctx is done or wake fires.
func (w *consumer) wait(ctx context.Context, d time.Duration, wake <-chan struct{}) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	case <-wake:
	}
}
