package syncer

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestTrackedQueueOutstanding(t *testing.T) {
	type step struct {
		do   func(q *trackedQueue)
		want int // Outstanding after the step
	}
	get := func(want string) func(q *trackedQueue) {
		return func(q *trackedQueue) {
			if k, shut := q.Get(); shut || k != want {
				t.Fatalf("Get = %q, %v; want %q", k, shut, want)
			}
		}
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"added, taken, done", []step{
			{func(q *trackedQueue) { q.Add("a") }, 1},
			{func(q *trackedQueue) { q.Add("a") }, 1},
			{get("a"), 1}, // taken but not processed: still work
			{func(q *trackedQueue) { q.Done("a") }, 0},
		}},
		{"added again while processing", []step{
			{func(q *trackedQueue) { q.Add("a") }, 1},
			{get("a"), 1},
			{func(q *trackedQueue) { q.Add("a") }, 1},
			{func(q *trackedQueue) { q.Done("a") }, 1}, // queued again
			{get("a"), 1},
			{func(q *trackedQueue) { q.Done("a") }, 0},
		}},
		{"two keys", []step{
			{func(q *trackedQueue) { q.Add("a"); q.Add("b") }, 2},
			{get("a"), 2},
			{func(q *trackedQueue) { q.Done("a") }, 1},
			{get("b"), 1},
			{func(q *trackedQueue) { q.Done("b") }, 0},
		}},
		{"a steady retry does not count until it is queued", []step{
			{func(q *trackedQueue) { q.Add("a") }, 1},
			{get("a"), 1},
			{func(q *trackedQueue) { q.AddRateLimitedSteady("a"); q.Done("a") }, 0},
			{get("a"), 1}, // after the backoff, it is work again
			{func(q *trackedQueue) { q.Done("a") }, 0},
		}},
		{"a retry waiting counts", []step{
			{func(q *trackedQueue) { q.Add("a") }, 1},
			{get("a"), 1},
			{func(q *trackedQueue) { q.AddRateLimited("a"); q.Done("a") }, 1},
			{get("a"), 1}, // after the backoff
			{func(q *trackedQueue) { q.Forget("a"); q.Done("a") }, 0},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q := newTrackedQueue(20*time.Millisecond, time.Second)
			defer q.ShutDown()
			for i, s := range tt.steps {
				s.do(q)
				if got := q.Outstanding(); got != s.want {
					t.Fatalf("after step %d: Outstanding = %d, want %d", i, got, s.want)
				}
			}
		})
	}
}

func TestTrackedQueueBackoffAndShutdown(t *testing.T) {
	q := newTrackedQueue(30*time.Millisecond, time.Second)
	q.Add("a")
	k, _ := q.Get()
	q.AddRateLimited(k)
	q.Done(k)
	if q.Len() != 0 || q.NumRequeues("a") != 1 {
		t.Fatalf("Len = %d, NumRequeues = %d; want 0 and 1 while the retry waits", q.Len(), q.NumRequeues("a"))
	}
	start := time.Now()
	if k, shut := q.Get(); shut || k != "a" {
		t.Fatalf("Get = %q, %v", k, shut)
	}
	if waited := time.Since(start); waited < 20*time.Millisecond {
		t.Errorf("retry came after %v, want the 30ms backoff", waited)
	}
	q.Done("a")
	q.Add("b")
	q.ShutDown()
	q.Add("c") // ignored after shutdown
	if k, shut := q.Get(); shut || k != "b" {
		t.Fatalf("after shutdown, queued keys are still handed out: Get = %q, %v", k, shut)
	}
	q.Done("b")
	if _, shut := q.Get(); !shut {
		t.Fatal("Get after shutdown and drain: want shutdown")
	}
}

// TestTrackedQueueNeverIdleWithWork races workers against adds: whenever
// Outstanding is 0, a processing that began after the latest add must
// have finished.
func TestTrackedQueueNeverIdleWithWork(t *testing.T) {
	q := newTrackedQueue(time.Millisecond, 10*time.Millisecond)
	var adds, doneUpTo atomic.Int64
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				k, shut := q.Get()
				if shut {
					return
				}
				covered := adds.Load() // every add so far is handled by this processing
				for range 50 {
					runtime.Gosched() // the processing takes a moment
				}
				for {
					cur := doneUpTo.Load()
					if covered <= cur || doneUpTo.CompareAndSwap(cur, covered) {
						break
					}
				}
				q.Done(k)
			}
		}()
	}
	for i := range 2000 {
		n := adds.Add(1)
		q.Add("k")
		for range 20 {
			if q.Outstanding() == 0 && doneUpTo.Load() < n {
				t.Fatalf("iteration %d: Outstanding 0 before add %d was processed", i, n)
			}
			runtime.Gosched()
		}
	}
	q.ShutDown()
	wg.Wait()
}
