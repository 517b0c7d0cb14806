package syncer

import (
	"context"
	"log/slog"
	"time"

	"k8s.io/client-go/tools/cache"
)

// controller is one of the syncer's reconcilers (topology, credentials) as
// the worker loop sees it: a queue of keys and what to do with one.
type controller struct {
	// name is the controller label of hubsync_reconcile_total and
	// hubsync_reconcile_duration_seconds.
	name      string
	queue     *trackedQueue
	reconcile func(ctx context.Context, key string) error
	// steady reports an error that is a reported, lasting state rather
	// than work in progress (a conflict with another cluster manager's
	// profile): it is retried with backoff, logged at debug level only, and
	// does not keep the syncer from being idle while it waits.
	steady  func(error) bool
	log     *slog.Logger
	metrics *metrics
}

// run is the syncer's one worker loop, for every controller: Get, then
// reconcile, then Forget on success or AddRateLimited on failure, then
// Done. It returns once the queue is shut down and drained.
func (c *controller) run(ctx context.Context) {
	for c.next(ctx) {
	}
}

func (c *controller) next(ctx context.Context) bool {
	key, shutdown := c.queue.Get()
	if shutdown {
		return false
	}
	defer c.queue.Done(key)
	start := time.Now()
	err := c.reconcile(ctx, key)
	c.metrics.reconcileSeconds.WithLabelValues(c.name).Observe(time.Since(start).Seconds())
	if err == nil {
		c.metrics.reconciles.WithLabelValues(c.name, "success").Inc()
		c.queue.Forget(key)
		return true
	}
	c.metrics.reconciles.WithLabelValues(c.name, "error").Inc()
	switch {
	case ctx.Err() != nil:
		// Shutting down: the error is the cancellation, not the hub's.
	case c.steady != nil && c.steady(err):
		c.log.Debug("reconcile failed, will retry", "key", key, "retries", c.queue.NumRequeues(key), "err", err)
		c.queue.AddRateLimitedSteady(key)
	default:
		c.log.Warn("reconcile failed, will retry", "key", key, "retries", c.queue.NumRequeues(key), "err", err)
		c.queue.AddRateLimited(key)
	}
	return true
}

// eventObject returns the object an informer event carries as a T,
// unwrapping the tombstone a deletion arrives as when the watch missed it
// (its last known state is then all there is).
func eventObject[T any](obj any) (T, bool) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	t, ok := obj.(T)
	return t, ok
}
