package stream

import (
	"context"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// worker is one consumer's queue and the goroutine that delivers it, in
// order, with retry and resync.
type worker struct {
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

	// Owned by the worker's goroutine.
	nextSnapshot time.Time // while the state is not known, when to ask again
	lastResync   time.Time
	lastAt       time.Time // when the last change delivered was notified
	lastWarn     time.Time // when a failed delivery was last a warning
	backoff      wait.Backoff
}

var _ Control = (*worker)(nil)

// RequestResync implements Control.
func (w *worker) RequestResync() { w.q.markResync() }

// Retry implements Control.
func (w *worker) Retry() {
	select {
	case w.retry <- struct{}{}:
	default:
	}
	w.q.signal()
}

func (w *worker) start(ctx context.Context) {
	w.startOnce.Do(func() {
		ctx, w.cancel = context.WithCancel(ctx)
		w.started.Store(true)
		go w.run(ctx)
	})
}

// stop ends the worker and waits for it; a worker never started is done.
func (w *worker) stop() {
	w.q.close()
	w.startOnce.Do(func() {}) // a later start is a no-op
	if w.started.Load() {
		w.cancel()
		<-w.done
	}
}

func (w *worker) flush(ctx context.Context, seq uint64) error {
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

func (w *worker) status() Status {
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
func (w *worker) run(ctx context.Context) {
	defer close(w.done)
	w.backoff = retryBackoff(w.opts.RetryBase, w.opts.RetryMax)
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
		if d := w.hold(e); d > 0 {
			w.wait(ctx, d, nil)
			continue
		}
		batch := w.q.batch(w.opts.MaxBatch)
		if err := w.deliver(ctx, batch); err != nil {
			if ctx.Err() != nil {
				return
			}
			d := w.backoff.Step()
			w.failed(err, d)
			w.wait(ctx, d, w.retry)
			continue
		}
		w.backoff = retryBackoff(w.opts.RetryBase, w.opts.RetryMax)
		w.delivered(batch)
		w.q.pop(len(batch))
	}
}

// retryBackoff is the wait after each failed delivery: base, doubling up
// to max. There is no jitter: a consumer retries only its own target, so
// there is no herd of retries to spread.
func retryBackoff(base, max time.Duration) wait.Backoff {
	return wait.Backoff{Duration: base, Factor: 2, Cap: max, Steps: math.MaxInt32}
}

// hold returns how long to hold the head e before delivering it; 0
// delivers now.
func (w *worker) hold(e *entry) time.Duration {
	if w.opts.Yield && time.Since(e.at) < w.opts.YieldMax && (w.opts.YieldLimit <= 0 || w.q.depth() < w.opts.YieldLimit) && w.f.producerBusy() {
		// The producer is converging: let it have the CPU and the API
		// server, and take what piled up once it is done.
		return min(yieldPoll, w.opts.YieldMax-time.Since(e.at))
	}
	if !e.isSnap && w.opts.BatchWindow > 0 && w.failures.Load() == 0 && e.at.Sub(w.lastAt) < w.opts.BatchWindow {
		// Changes are coming close together: let the ones that follow
		// join this one's batch. A change after a quiet spell goes at
		// once.
		if d := time.Until(e.at.Add(w.opts.BatchWindow)); d > 0 && w.q.depth() < w.opts.MaxBatch {
			return d
		}
	}
	return 0
}

// deliver hands a batch to the consumer: a snapshot as a resync, changes
// as one delivery.
func (w *worker) deliver(ctx context.Context, batch []*entry) error {
	if batch[0].isSnap {
		return w.sink.Resync(ctx, batch[0].snapshot)
	}
	changes := make([]Change, len(batch))
	for i, e := range batch {
		changes[i] = e.change
	}
	return w.sink.Deliver(ctx, changes)
}

// failed records a failed delivery, to be retried after retryIn. The
// first failure of a run is a warning, then one every 30s, so that a
// consumer down for hours does not flood the log.
func (w *worker) failed(err error, retryIn time.Duration) {
	n := w.failures.Add(1)
	w.healthy.Store(false)
	w.mu.Lock()
	w.lastErr = err.Error()
	w.mu.Unlock()
	w.f.m.failures.WithLabelValues(w.opts.Name).Inc()
	log := w.opts.Log
	if n == 1 || time.Since(w.lastWarn) > 30*time.Second {
		log.Warn("sink delivery failed; retrying in order with backoff", "err", err, "attempts", n,
			"queued", w.q.depth(), "retryIn", retryIn)
		w.lastWarn = time.Now()
		return
	}
	log.Debug("sink delivery failed; retrying", "err", err, "attempts", n)
}

// delivered records a delivered batch.
func (w *worker) delivered(batch []*entry) {
	m, name := w.f.m, w.opts.Name
	now := time.Now()
	if n := w.failures.Swap(0); n > 0 {
		w.opts.Log.Info("sink delivering again", "failedAttempts", n, "queued", w.q.depth())
	}
	w.healthy.Store(true)
	w.lastSuccess.Store(now.UnixNano())
	if batch[0].isSnap {
		m.resyncs.WithLabelValues(name).Inc()
		w.lastResync = now
		return
	}
	lag := m.lag.WithLabelValues(name)
	for _, e := range batch {
		lag.Observe(now.Sub(e.at).Seconds())
	}
	m.delivered.WithLabelValues(name).Add(float64(len(batch)))
	w.lastAt = batch[len(batch)-1].at
}

// idle is how long the worker may wait with nothing queued.
func (w *worker) idle() time.Duration {
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
func (w *worker) maybeResync() {
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
func (w *worker) wait(ctx context.Context, d time.Duration, wake <-chan struct{}) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	case <-wake:
	}
}
