package stream

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	poll "github.com/hubsync/hubsync/test/testutil"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// recorder is a consumer that records what it gets and can be made to
// fail or block.
type recorder struct {
	mu        sync.Mutex
	delivered []Change
	batches   [][]Change
	resyncs   [][]Change
	failing   error
	block     chan struct{} // while non-nil, Deliver waits for it to close
	control   Control
}

func (r *recorder) Attach(c Control) { r.control = c }

func (r *recorder) Deliver(ctx context.Context, changes []Change) error {
	r.mu.Lock()
	block, failing := r.block, r.failing
	r.mu.Unlock()
	if block != nil {
		select {
		case <-block:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if failing != nil {
		return failing
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.delivered = append(r.delivered, changes...)
	r.batches = append(r.batches, slices.Clone(changes))
	return nil
}

func (r *recorder) Resync(_ context.Context, snapshot []Change) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.failing != nil {
		return r.failing
	}
	r.resyncs = append(r.resyncs, slices.Clone(snapshot))
	return nil
}

func (r *recorder) set(f func(r *recorder)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	f(r)
}

func (r *recorder) names() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, c := range r.delivered {
		out = append(out, c.Namespace+"/"+c.Cluster+"@"+c.ResourceVersion)
	}
	return out
}

func (r *recorder) resyncCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.resyncs)
}

func change(ns, cluster, rv string) Change {
	return Change{Type: ProfileUpdated, Namespace: ns, Cluster: cluster, Name: cluster, ResourceVersion: rv, Time: time.Now()}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	poll.Eventually(t, 10*time.Second, 5*time.Millisecond, cond, "timed out waiting for %s", what)
}

func newFanout(t *testing.T, snapshot func() []Change) (*Fanout, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	f, err := NewFanout(nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() {
		c, done := context.WithTimeout(context.Background(), time.Second)
		defer done()
		_ = f.Close(c)
		cancel()
	})
	if err := f.Start(ctx, snapshot); err != nil {
		t.Fatal(err)
	}
	return f, reg
}

// fast fills every option a consumer needs (config.ConsumerOptions does in
// hubsync), with a short backoff.
func fast(name string) Options {
	return Options{Name: name, QueueSize: 10000, MaxBatch: 256, RetryBase: time.Millisecond, RetryMax: 10 * time.Millisecond}
}

func TestDeliversInOrderAndStartsWithResync(t *testing.T) {
	state := []Change{change("a", "c1", "1")}
	f, reg := newFanout(t, func() []Change { return state })
	r := &recorder{}
	if err := f.Add(fast("r"), r); err != nil {
		t.Fatal(err)
	}
	var want []string
	for i := range 50 {
		c := change("a", fmt.Sprintf("c%d", i%3), fmt.Sprint(i))
		f.Notify(c)
		want = append(want, fmt.Sprintf("a/c%d@%d", i%3, i))
	}
	if err := f.Flush(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if got := r.names(); !slices.Equal(got, want) {
		t.Fatalf("delivered %v\nwant %v", got, want)
	}
	if r.resyncCount() != 1 || len(r.resyncs[0]) != 1 {
		t.Fatalf("resyncs %v, want one of the current state first", r.resyncs)
	}
	for _, b := range r.batches {
		keys := map[Key]bool{}
		for _, c := range b {
			if keys[c.Key()] {
				t.Fatalf("batch %v holds two changes of %v", b, c.Key())
			}
			keys[c.Key()] = true
		}
	}
	if got := testutil.ToFloat64(f.m.delivered.WithLabelValues("r")); got != 50 {
		t.Errorf("delivered metric %v, want 50", got)
	}
	if n := testutil.CollectAndCount(f.m.lag); n != 1 {
		t.Errorf("lag series %d, want 1", n)
	}
	if _, err := reg.Gather(); err != nil {
		t.Fatal(err)
	}
}

func TestSlowOrFailingConsumerDelaysNoOther(t *testing.T) {
	f, _ := newFanout(t, func() []Change { return []Change{} })
	stuck := &recorder{block: make(chan struct{})}
	failing := &recorder{failing: errors.New("endpoint down")}
	healthy := &recorder{}
	for name, c := range map[string]*recorder{"stuck": stuck, "failing": failing, "healthy": healthy} {
		if err := f.Add(fast(name), c); err != nil {
			t.Fatal(err)
		}
	}
	begin := time.Now()
	for i := range 100 {
		f.Notify(change("a", fmt.Sprintf("c%d", i), "1")) // must never block
	}
	if err := f.FlushConsumer(ctxT(t), "healthy"); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(begin); d > 5*time.Second {
		t.Fatalf("the healthy consumer took %s", d)
	}
	if n := len(healthy.names()); n != 100 {
		t.Fatalf("healthy consumer got %d, want 100", n)
	}
	eventually(t, "failing consumer reported", func() bool {
		for _, s := range f.Statuses() {
			if s.Name == "failing" {
				return !s.Healthy && s.Failures > 1 && strings.Contains(s.LastError, "endpoint down")
			}
		}
		return false
	})
	// The failing one catches up, in order, once it works.
	failing.set(func(r *recorder) { r.failing = nil })
	if err := f.FlushConsumer(ctxT(t), "failing"); err != nil {
		t.Fatal(err)
	}
	if got, want := failing.names(), healthy.names(); !slices.Equal(got, want) {
		t.Fatalf("recovered consumer got %v, want %v", got, want)
	}
	close(stuck.block)
	if err := f.FlushConsumer(ctxT(t), "stuck"); err != nil {
		t.Fatal(err)
	}
}

func TestFullQueueDropsThenResyncs(t *testing.T) {
	var mu sync.Mutex
	state := []Change{}
	f, _ := newFanout(t, func() []Change {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(state)
	})
	r := &recorder{block: make(chan struct{})}
	opts := fast("small")
	opts.QueueSize = 3
	if err := f.Add(opts, r); err != nil {
		t.Fatal(err)
	}
	// The first resync passes the block (it is not Deliver); the first
	// delivery then holds the worker while ten changes arrive.
	eventually(t, "initial resync", func() bool { return r.resyncCount() == 1 })
	for i := range 10 {
		c := change("a", fmt.Sprintf("c%d", i), "1")
		mu.Lock()
		state = append(state, c)
		mu.Unlock()
		f.Notify(c)
	}
	if got := testutil.ToFloat64(f.m.dropped.WithLabelValues("small")); got < 6 {
		t.Fatalf("dropped %v, want at least 6", got)
	}
	close(r.block)
	// A drop may resync before all ten exist; a later resync, after the
	// start's, then brings all of them.
	eventually(t, "a resync with all ten", func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return len(r.resyncs) >= 2 && len(r.resyncs[len(r.resyncs)-1]) == 10
	})
}

func TestFilterAndRequestResync(t *testing.T) {
	state := []Change{change("a", "c1", "1"), change("b", "c2", "1")}
	f, _ := newFanout(t, func() []Change { return state })
	r := &recorder{}
	opts := fast("only-a")
	opts.Filter = func(c Change) bool { return c.Namespace == "a" }
	if err := f.Add(opts, r); err != nil {
		t.Fatal(err)
	}
	f.Notify(change("b", "c2", "2"))
	f.Notify(change("a", "c1", "2"))
	if err := f.Flush(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if got := r.names(); !slices.Equal(got, []string{"a/c1@2"}) {
		t.Fatalf("delivered %v", got)
	}
	r.control.RequestResync()
	eventually(t, "second resync", func() bool { return r.resyncCount() == 2 })
	for _, snap := range r.resyncs {
		if len(snap) != 1 || snap[0].Namespace != "a" {
			t.Fatalf("filtered snapshot %v", snap)
		}
	}
}

func TestSnapshotNotKnownYetIsRetried(t *testing.T) {
	var mu sync.Mutex
	var state []Change // nil: not known
	f, _ := newFanout(t, func() []Change {
		mu.Lock()
		defer mu.Unlock()
		return state
	})
	r := &recorder{}
	if err := f.Add(fast("r"), r); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	state = []Change{change("a", "c1", "1")}
	mu.Unlock()
	eventually(t, "resync once the state is known", func() bool { return r.resyncCount() == 1 })
}

func TestAddRemove(t *testing.T) {
	f, reg := newFanout(t, nil)
	r := &recorder{}
	if err := f.Add(fast("r"), r); err != nil {
		t.Fatal(err)
	}
	if err := f.Add(fast("r"), r); err == nil {
		t.Fatal("a second consumer named r was added")
	}
	f.Notify(change("a", "c1", "1"))
	if err := f.Flush(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if err := f.Remove("r"); err != nil {
		t.Fatal(err)
	}
	if f.Has("r") {
		t.Fatal("removed consumer still there")
	}
	f.Notify(change("a", "c1", "2"))
	if got := r.names(); len(got) != 1 {
		t.Fatalf("removed consumer got %v", got)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "sink" && l.GetValue() == "r" {
					t.Errorf("metric %s still has sink=r", mf.GetName())
				}
			}
		}
	}
	if err := f.Remove("r"); err == nil {
		t.Error("removing twice succeeded")
	}
}

func TestBatchWindowGathersABurst(t *testing.T) {
	f, _ := newFanout(t, nil)
	r := &recorder{}
	opts := fast("batched")
	opts.BatchWindow = 200 * time.Millisecond
	if err := f.Add(opts, r); err != nil {
		t.Fatal(err)
	}
	f.Notify(change("a", "first", "1")) // after a quiet spell: at once
	eventually(t, "first change", func() bool { return len(r.names()) == 1 })
	for i := range 20 {
		f.Notify(change("a", fmt.Sprintf("c%d", i), "1"))
	}
	if err := f.Flush(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.batches) > 3 {
		t.Errorf("a burst of 20 took %d batches", len(r.batches)-1)
	}
}

// TestYieldHoldsWhileProducerBusy: a yielding consumer gets nothing while
// the producer says it is busy, everything once it is not, and a change
// held YieldMax goes out even while the producer stays busy; a consumer
// that does not yield is never held.
func TestYieldHoldsWhileProducerBusy(t *testing.T) {
	f, _ := newFanout(t, nil)
	var busy atomic.Bool
	var asked atomic.Int64
	busy.Store(true)
	f.SetBusy(func() bool { asked.Add(1); return busy.Load() })
	state, events, bounded := &recorder{}, &recorder{}, &recorder{}
	yielding := fast("state")
	yielding.Yield = true
	yielding.YieldMax = time.Hour
	short := fast("bounded")
	short.Yield = true
	short.YieldMax = 150 * time.Millisecond
	for _, c := range []struct {
		opts Options
		r    *recorder
	}{{yielding, state}, {fast("events"), events}, {short, bounded}} {
		if err := f.Add(c.opts, c.r); err != nil {
			t.Fatal(err)
		}
	}
	notified := time.Now()
	f.Notify(change("a", "c1", "1"))
	eventually(t, "the consumer that does not yield", func() bool { return len(events.names()) == 1 })
	eventually(t, "the bounded consumer, after YieldMax", func() bool { return len(bounded.names()) == 1 })
	if held := time.Since(notified); held < short.YieldMax {
		t.Errorf("the bounded consumer got the change after %s, before YieldMax %s", held, short.YieldMax)
	}
	// The yielding consumer has asked several times and still holds it.
	n := asked.Load()
	eventually(t, "the yielding consumer to ask again", func() bool { return asked.Load() >= n+3 })
	if got := state.names(); len(got) != 0 {
		t.Fatalf("a yielding consumer got %v while the producer was busy", got)
	}
	busy.Store(false)
	eventually(t, "the yielding consumer once the producer is done", func() bool { return len(state.names()) == 1 })
}

// TestYieldLimitDeliversRatherThanDrops: a yielding consumer with a
// YieldLimit holds no more than that many changes while the producer stays
// busy: a burst of twice its queue is delivered whole, nothing dropped and
// no resync; without the limit the same burst overflows the queue.
func TestYieldLimitDeliversRatherThanDrops(t *testing.T) {
	tests := []struct {
		name        string
		limit       int
		wantDropped bool
	}{
		{name: "limit at half the queue", limit: 10},
		{name: "no limit", limit: 0, wantDropped: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f, _ := newFanout(t, func() []Change { return nil })
			var busy atomic.Bool
			busy.Store(true)
			f.SetBusy(busy.Load)
			r := &recorder{}
			opts := fast("events")
			opts.QueueSize, opts.Yield, opts.YieldMax, opts.YieldLimit = 20, true, time.Hour, tc.limit
			if err := f.Add(opts, r); err != nil {
				t.Fatal(err)
			}
			const burst = 40
			for i := range burst {
				f.Notify(change("a", fmt.Sprintf("c%02d", i), "1"))
				if tc.limit > 0 {
					// The consumer keeps up at its own pace: wait until it
					// holds no more than the limit before the next change.
					eventually(t, "the held changes within the limit", func() bool { return f.consumers["events"].q.depth() <= tc.limit })
				}
			}
			dropped := testutil.ToFloat64(f.m.dropped.WithLabelValues("events"))
			if tc.wantDropped {
				if dropped == 0 {
					t.Errorf("a burst of %d into a queue of %d held without a limit dropped nothing", burst, opts.QueueSize)
				}
				return
			}
			if dropped != 0 {
				t.Errorf("dropped %v changes", dropped)
			}
			if got := len(r.names()); got < burst-tc.limit {
				t.Errorf("%d of %d changes delivered while the producer was busy; want all but at most %d", got, burst, tc.limit)
			}
			busy.Store(false)
			eventually(t, "every change of the burst once the producer is done", func() bool { return len(r.names()) == burst })
		})
	}
}

// TestCloseDeliversWhatYieldHolds: closing the fan-out ends the yielding,
// so a held change is delivered before the consumer stops.
func TestCloseDeliversWhatYieldHolds(t *testing.T) {
	f, err := NewFanout(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	f.SetBusy(func() bool { return true })
	if err := f.Start(ctxT(t), nil); err != nil {
		t.Fatal(err)
	}
	r := &recorder{}
	opts := fast("state")
	opts.Yield, opts.YieldMax = true, time.Hour
	if err := f.Add(opts, r); err != nil {
		t.Fatal(err)
	}
	f.Notify(change("a", "c1", "1"))
	if err := f.Close(ctxT(t)); err != nil {
		t.Fatalf("close: %v", err)
	}
	if got := r.names(); len(got) != 1 {
		t.Errorf("delivered %v before the consumer stopped, want the held change", got)
	}
}

// A consumer's counters have their series from its start, so that rate()
// and an alert on failures or drops see 0 before the first one; removing
// the consumer removes them.
func TestConsumerSeriesFromStart(t *testing.T) {
	f, reg := newFanout(t, func() []Change { return nil })
	names := []string{"hubsync_sink_delivered_total", "hubsync_sink_delivery_failures_total", "hubsync_sink_dropped_total", "hubsync_sink_resyncs_total"}
	count := func(want int) {
		t.Helper()
		for _, name := range names {
			n, err := testutil.GatherAndCount(reg, name)
			if err != nil {
				t.Fatal(err)
			}
			if n != want {
				t.Errorf("%s has %d series; want %d", name, n, want)
			}
		}
	}
	if err := f.Add(fast("r"), &recorder{}); err != nil {
		t.Fatal(err)
	}
	count(1)
	if err := f.Remove("r"); err != nil {
		t.Fatal(err)
	}
	count(0)
}
