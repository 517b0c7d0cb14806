package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/tools/cache"
)

// tracker times what a consumer sees through a watch: how many objects in
// the consumer namespaces have reached their complete state, and when one
// cluster's object shows an expected value in every namespace.
type tracker struct {
	ctx        context.Context
	cancel     context.CancelFunc
	namespaces int

	mu       sync.Mutex
	complete map[string]bool
	// completedAt holds when each object became complete, in order, for
	// the timeline of a run (start, pace, tail).
	completedAt []time.Time
	// floorSeen is when the watch last saw a floor profile with its
	// status: the floor's end as a consumer sees it.
	floorSeen time.Time
	notify    chan struct{}
	pending   map[string]*expectation // cluster -> what to wait for
}

type expectation struct {
	value     string
	remaining map[string]bool
	done      chan time.Time
}

func newTracker(ctx context.Context, namespaces int) *tracker {
	ctx, cancel := context.WithCancel(ctx)
	return &tracker{ctx: ctx, cancel: cancel, namespaces: namespaces,
		complete: map[string]bool{}, notify: make(chan struct{}, 1), pending: map[string]*expectation{}}
}

// informerStarter is what the typed informer factories have in common.
type informerStarter interface{ Start(<-chan struct{}) }

// run feeds an informer's adds and updates to observe and waits for its
// cache.
func (t *tracker) run(f informerStarter, inf cache.SharedIndexInformer, observe func(any)) error {
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    observe,
		UpdateFunc: func(_, obj any) { observe(obj) },
	})
	f.Start(t.ctx.Done())
	if !cache.WaitForCacheSync(t.ctx.Done(), inf.HasSynced) {
		t.cancel()
		return fmt.Errorf("watch did not sync")
	}
	return nil
}

func (t *tracker) stop() { t.cancel() }

// reset forgets which objects were complete, for a second run.
func (t *tracker) reset() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.complete = map[string]bool{}
	t.completedAt = nil
}

// timeline is when the objects became complete since the last reset.
func (t *tracker) timeline() []time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Clone(t.completedAt)
}

// sawFloor records that the watch saw a floor profile with its status.
func (t *tracker) sawFloor() {
	at := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.floorSeen = at
}

// lastFloorSeen is when the watch last saw a floor profile with its status.
func (t *tracker) lastFloorSeen() time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.floorSeen
}

// observe records one object of cluster in namespace ns.
func (t *tracker) observe(ns, name, cluster, value string, complete bool) {
	at := time.Now()
	if !strings.HasPrefix(ns, "consumer-") {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if key := ns + "/" + name; complete && !t.complete[key] {
		t.complete[key] = true
		t.completedAt = append(t.completedAt, at)
		select {
		case t.notify <- struct{}{}:
		default:
		}
	}
	if e := t.pending[cluster]; e != nil && value == e.value {
		delete(e.remaining, ns)
		if len(e.remaining) == 0 {
			delete(t.pending, cluster)
			e.done <- at
		}
	}
}

// waitCount waits until n objects are complete.
func (t *tracker) waitCount(ctx context.Context, exited <-chan error, n int, timeout time.Duration) error {
	deadline := time.After(timeout)
	for {
		t.mu.Lock()
		got := len(t.complete)
		t.mu.Unlock()
		if got >= n {
			return nil
		}
		select {
		case <-t.notify:
		case err := <-exited:
			return fmt.Errorf("hubsync exited: %v", err)
		case <-deadline:
			return fmt.Errorf("only %d of %d objects complete after %s", got, n, timeout)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// expect returns a channel that receives the time at which the cluster's
// object in every consumer namespace shows value.
func (t *tracker) expect(cluster, value string) <-chan time.Time {
	e := &expectation{value: value, remaining: map[string]bool{}, done: make(chan time.Time, 1)}
	for i := range t.namespaces {
		e.remaining[nsName(i)] = true
	}
	t.mu.Lock()
	t.pending[cluster] = e
	t.mu.Unlock()
	return e.done
}

// describeTimeline says when the 1st object, 10%, 50%, 90% and the last
// were complete, from start, and the pace in between: whether a run starts
// late, runs slower or has a tail.
func describeTimeline(start time.Time, at []time.Time) string {
	if len(at) == 0 {
		return "nothing complete"
	}
	at = slices.Clone(at)
	slices.SortFunc(at, func(a, b time.Time) int { return a.Compare(b) })
	point := func(f float64) time.Duration {
		return at[min(len(at)-1, int(f*float64(len(at))))].Sub(start).Round(10 * time.Millisecond)
	}
	first, p10, p50, p90, last := point(0), point(0.1), point(0.5), point(0.9), at[len(at)-1].Sub(start).Round(10*time.Millisecond)
	mid := float64(int(0.9*float64(len(at)))-int(0.1*float64(len(at)))) / (p90 - p10).Seconds()
	return fmt.Sprintf("first %s, 10%% %s, 50%% %s, 90%% %s, last %s; %.0f objects/s from 10%% to 90%%, last 10%% took %s",
		first, p10, p50, p90, last, mid, (last - p90).Round(10*time.Millisecond))
}
