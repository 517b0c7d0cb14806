package stream

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-multierror"
	"github.com/prometheus/client_golang/prometheus"
)

// Consumer receives the changes of the stream. Its methods are called from
// one goroutine, the consumer's own worker, never concurrently.
type Consumer interface {
	// Deliver hands over changes in the order they were notified; no two
	// are about the same (namespace, cluster), so they may be delivered
	// concurrently. An error means the batch was not delivered: the same
	// changes come again after a backoff, so delivery must be idempotent
	// (a change delivered twice carries the same event id).
	Deliver(ctx context.Context, changes []Change) error
	// Resync brings the consumer's target to the current state: snapshot
	// holds one change per profile (profile.updated) and per credential copy
	// (credential.synced) that exists and passes the consumer's filter.
	// Anything the target holds beyond it is gone. An error retries it.
	Resync(ctx context.Context, snapshot []Change) error
}

// Control is what a consumer may ask of its worker.
type Control interface {
	// RequestResync asks for a snapshot of the current state, delivered
	// after the changes already queued (for example after a reconnect).
	RequestResync()
	// Retry ends a backoff now (for example when a connection came back).
	Retry()
}

// Attacher is implemented by consumers that want their Control.
type Attacher interface {
	Attach(Control)
}

// Options configure one consumer of a Fanout. They arrive filled
// (config.ConsumerOptions); Add refuses a queue size, batch or backoff
// left zero.
type Options struct {
	// Name identifies the consumer in logs and metrics; unique per Fanout.
	Name string
	// Type is the kind of consumer (nats, kubeconfig, ...), for logs.
	Type string
	// Filter selects the changes (and snapshot entries) the consumer gets;
	// nil selects all. It is called from Notify, so it must be cheap.
	Filter func(Change) bool
	// QueueSize bounds the changes waiting; beyond it changes are dropped,
	// counted, and a resync repairs the consumer.
	QueueSize int
	// MaxBatch bounds the changes of one Deliver.
	MaxBatch int
	// BatchWindow: while changes come less than this apart, the worker
	// waits up to it for more to join a batch. 0 delivers at once.
	BatchWindow time.Duration
	// RetryBase and RetryMax bound the exponential backoff after a failed
	// delivery.
	RetryBase, RetryMax time.Duration
	// ResyncPeriod, if set, resyncs the consumer that often, repairing
	// whatever happened to its target in between.
	ResyncPeriod time.Duration
	// Yield holds the consumer's deliveries while the producer is busy
	// converging (see Fanout.SetBusy), for at most YieldMax after the
	// oldest waiting change was notified. It suits consumers that keep a
	// state rather than report events: their work (files written, hub
	// objects written) would compete with the producer's for the same CPU
	// and API server, and after a burst a backlog costs them no more than
	// the changes one by one (a full queue becomes one resync).
	Yield bool
	// YieldMax bounds how long Yield holds a change; required with Yield.
	YieldMax time.Duration
	// YieldLimit, if set, bounds how many changes Yield holds: beyond it
	// the consumer delivers while the producer is busy, so that a burst
	// larger than its queue is not dropped and resynced. For a consumer
	// that reports events, whose dropped changes mean an outage.
	YieldLimit int
	// Log receives the consumer's own lines; default the Fanout's.
	Log *slog.Logger
}

// The worker's own timings; the options' defaults are config's
// (config.ConsumerOptions).
const (
	// yieldPoll is how often a yielding consumer looks again whether the
	// producer is still busy.
	yieldPoll = 50 * time.Millisecond
	// snapshotRetry is how soon a snapshot is asked for again while the
	// current state is not known yet.
	snapshotRetry = time.Second
)

// Status is a consumer's state, for health endpoints and the sink
// metrics. For a consumer that is a Reporter it comes from the consumer's
// own delivery record as well as from its worker (see Status.WithReport).
type Status struct {
	Name    string `json:"name"`
	Type    string `json:"type,omitempty"`
	Healthy bool   `json:"healthy"`
	// QueueDepth counts what waits for the target: the changes in the
	// stream's queue and the consumer's Backlog.
	QueueDepth int `json:"queueDepth"`
	Backlog    int `json:"backlog,omitempty"`
	// Oldest is when the oldest of what waits was queued; zero with none.
	Oldest      time.Time `json:"oldest,omitzero"`
	LastSuccess time.Time `json:"lastSuccess,omitzero"`
	// LastAttempt and LastResult are a Reporter's last try at its target.
	LastAttempt time.Time `json:"lastAttempt,omitzero"`
	LastResult  string    `json:"lastResult,omitempty"`
	// LastError is the last delivery error while unhealthy. Consumers'
	// errors never carry credentials.
	LastError string `json:"lastError,omitempty"`
	Failures  int    `json:"consecutiveFailures,omitempty"`
	// FailingSince is when a Reporter's target began to fail.
	FailingSince time.Time `json:"failingSince,omitzero"`
}

// Fanout delivers every notified change to each of its consumers through
// the consumer's own queue and worker. It implements Notifier.
type Fanout struct {
	log *slog.Logger
	m   *metrics

	mu        sync.RWMutex
	consumers map[string]*worker
	snapshot  func() []Change
	busy      func() bool     // nil: never busy
	ctx       context.Context // set by Start
	closed    bool
}

var _ Notifier = (*Fanout)(nil)

// NewFanout makes a fan-out with no consumers. Metrics are registered on
// reg unless it is nil.
func NewFanout(log *slog.Logger, reg prometheus.Registerer) (*Fanout, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	f := &Fanout{log: log, consumers: map[string]*worker{}}
	m, err := newMetrics(reg, f.statuses)
	if err != nil {
		return nil, fmt.Errorf("stream: register metrics: %w", err)
	}
	f.m = m
	return f, nil
}

// Start runs the workers of the consumers added so far, and of those added
// later, until ctx ends. snapshot returns the current state (see
// Consumer.Resync); nil from it means "not known yet", and the worker asks
// again shortly. A nil snapshot function turns resyncs off.
func (f *Fanout) Start(ctx context.Context, snapshot func() []Change) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ctx != nil || f.closed {
		return errors.New("stream: fan-out already started or closed")
	}
	f.ctx, f.snapshot = ctx, snapshot
	for _, c := range f.consumers {
		c.start(ctx)
	}
	return nil
}

// SetBusy tells the fan-out how to ask whether the producer is busy
// converging (a backlog of work it has not done yet); consumers with Yield
// hold their deliveries while it is. It must be cheap: yielding consumers
// call it every few tens of milliseconds.
func (f *Fanout) SetBusy(busy func() bool) {
	f.mu.Lock()
	f.busy = busy
	f.mu.Unlock()
}

// producerBusy reports what the busy function says; false without one,
// and once the fan-out is closing, so that Close delivers what is queued.
func (f *Fanout) producerBusy() bool {
	f.mu.RLock()
	busy, closed := f.busy, f.closed
	f.mu.RUnlock()
	return busy != nil && !closed && busy()
}

// Add adds a consumer. Its first delivery is a resync, so it starts from
// the current state, followed by the changes notified since.
func (f *Fanout) Add(opts Options, c Consumer) error {
	if opts.Name == "" {
		return errors.New("stream: a consumer needs a name")
	}
	if c == nil {
		return fmt.Errorf("stream: consumer %s is nil", opts.Name)
	}
	opts, err := checkOptions(opts, f.log)
	if err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return errors.New("stream: fan-out closed")
	}
	if _, ok := f.consumers[opts.Name]; ok {
		return fmt.Errorf("stream: consumer %s already exists", opts.Name)
	}
	w := &worker{
		f: f, opts: opts, sink: c, q: newQueue(opts.QueueSize),
		retry: make(chan struct{}, 1), done: make(chan struct{}),
	}
	w.healthy.Store(true)
	w.q.markResync()
	if a, ok := c.(Attacher); ok {
		a.Attach(w)
	}
	f.consumers[opts.Name] = w
	f.m.track(opts.Name)
	if f.ctx != nil {
		w.start(f.ctx)
	}
	return nil
}

// Remove stops a consumer's worker, waiting for a delivery under way to
// end, and forgets the consumer and its metrics. Changes still queued for
// it are discarded.
func (f *Fanout) Remove(name string) error {
	f.mu.Lock()
	w, ok := f.consumers[name]
	delete(f.consumers, name)
	f.mu.Unlock()
	if !ok {
		return fmt.Errorf("stream: no consumer %s", name)
	}
	w.stop()
	f.m.forget(name)
	return nil
}

// Has reports whether a consumer of that name exists.
func (f *Fanout) Has(name string) bool {
	f.mu.RLock()
	defer f.mu.RUnlock()
	_, ok := f.consumers[name]
	return ok
}

// Notify queues a change for every consumer whose filter selects it. It
// never blocks: a full queue drops the change, counts it, and resyncs that
// consumer.
func (f *Fanout) Notify(c Change) {
	now := time.Now()
	f.mu.RLock()
	defer f.mu.RUnlock()
	for _, w := range f.consumers {
		if w.opts.Filter != nil && !w.opts.Filter(c) {
			continue
		}
		ok, first := w.q.push(c, now)
		if ok {
			continue
		}
		f.m.dropped.WithLabelValues(w.opts.Name).Inc()
		if first {
			w.opts.Log.Warn("sink queue full: dropping changes until it catches up; it will be resynced from the current state",
				"queueSize", w.opts.QueueSize)
		}
	}
}

// Flush waits until every consumer has delivered every change notified
// before the call, or ctx ends. A consumer that cannot deliver makes Flush
// wait for ctx; the error names every consumer still behind.
func (f *Fanout) Flush(ctx context.Context) error {
	f.mu.RLock()
	ws := slices.Collect(maps.Values(f.consumers))
	f.mu.RUnlock()
	var g multierror.Group
	for _, w := range ws {
		seq := w.q.lastSeq()
		g.Go(func() error { return w.flush(ctx, seq) })
	}
	return g.Wait().ErrorOrNil()
}

// FlushConsumer is Flush for one consumer.
func (f *Fanout) FlushConsumer(ctx context.Context, name string) error {
	f.mu.RLock()
	w, ok := f.consumers[name]
	f.mu.RUnlock()
	if !ok {
		return fmt.Errorf("stream: no consumer %s", name)
	}
	return w.flush(ctx, w.q.lastSeq())
}

// Close delivers what is queued until ctx ends, then stops every worker.
// Changes notified afterwards are ignored. It returns the consumers that
// were left behind, all of them.
func (f *Fanout) Close(ctx context.Context) error {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return nil
	}
	f.closed = true
	started := f.ctx != nil
	f.mu.Unlock()
	var err error
	if started {
		err = f.Flush(ctx)
	}
	f.mu.Lock()
	ws := slices.Collect(maps.Values(f.consumers))
	f.mu.Unlock()
	for _, w := range ws {
		w.stop()
	}
	return err
}

// Statuses returns every consumer's state, sorted by name.
func (f *Fanout) Statuses() []Status { return f.statuses() }

func (f *Fanout) statuses() []Status {
	f.mu.RLock()
	ws := slices.Collect(maps.Values(f.consumers))
	f.mu.RUnlock()
	out := make([]Status, 0, len(ws))
	for _, w := range ws {
		out = append(out, statusOf(w))
	}
	slices.SortFunc(out, func(a, b Status) int {
		switch {
		case a.Name < b.Name:
			return -1
		case a.Name > b.Name:
			return 1
		}
		return 0
	})
	return out
}

// checkOptions refuses options left unset, since the defaults are
// config's (config.ConsumerOptions): a zero queue would hold nothing and a
// zero backoff would spin on a failing target.
func checkOptions(o Options, log *slog.Logger) (Options, error) {
	var missing []string
	if o.QueueSize <= 0 {
		missing = append(missing, "QueueSize")
	}
	if o.MaxBatch <= 0 {
		missing = append(missing, "MaxBatch")
	}
	if o.RetryBase <= 0 {
		missing = append(missing, "RetryBase")
	}
	if o.RetryMax < o.RetryBase {
		missing = append(missing, "RetryMax (at least RetryBase)")
	}
	if o.Yield && o.YieldMax <= 0 {
		missing = append(missing, "YieldMax (with Yield)")
	}
	if len(missing) > 0 {
		return o, fmt.Errorf("stream: consumer %s: %s not set (config.ConsumerOptions fills every option)", o.Name, strings.Join(missing, ", "))
	}
	if o.Log == nil {
		o.Log = log
	}
	o.Log = o.Log.With("sink", o.Name)
	return o, nil
}

// snapshotFor returns the current state as the consumer sees it: nil while
// it is not known, else the snapshot's changes its filter selects.
func (f *Fanout) snapshotFor(filter func(Change) bool) []Change {
	f.mu.RLock()
	snap := f.snapshot
	f.mu.RUnlock()
	if snap == nil {
		return nil
	}
	all := snap()
	if all == nil || filter == nil {
		return all
	}
	out := make([]Change, 0, len(all))
	for _, c := range all {
		if filter(c) {
			out = append(out, c)
		}
	}
	return out
}
