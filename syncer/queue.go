package syncer

import (
	"sync"
	"time"

	"k8s.io/client-go/util/workqueue"
)

// trackedQueue is a rate-limited work queue with client-go's semantics (a
// key is queued once however often it is added, never handed to two
// workers at once, and queued again if added while being processed) that
// also knows exactly which keys still have work: queued, being processed,
// or waiting out a retry delay. client-go's queue cannot say so (its Len
// drops when a worker takes a key, before the key is processed, and
// delayed retries are not counted), so an idleness check built on it can
// pass while work is pending. Here every state change happens under one
// lock.
type trackedQueue struct {
	limiter workqueue.TypedRateLimiter[string]

	mu         sync.Mutex
	cond       *sync.Cond
	order      []string            // keys waiting for a worker, in order
	dirty      map[string]struct{} // keys waiting (in order, or re-queued once processing ends)
	processing map[string]struct{}
	delayed    map[string]int // retries scheduled per key
	timers     map[*time.Timer]struct{}
	stopped    bool
}

func newTrackedQueue(base, maxDelay time.Duration) *trackedQueue {
	t := &trackedQueue{
		limiter:    workqueue.NewTypedItemExponentialFailureRateLimiter[string](base, maxDelay),
		dirty:      map[string]struct{}{},
		processing: map[string]struct{}{},
		delayed:    map[string]int{},
		timers:     map[*time.Timer]struct{}{},
	}
	t.cond = sync.NewCond(&t.mu)
	return t
}

// add queues key; call with mu held.
func (t *trackedQueue) add(key string) {
	if _, ok := t.dirty[key]; ok {
		return
	}
	t.dirty[key] = struct{}{}
	if _, ok := t.processing[key]; ok {
		return // queued again when its processing is done
	}
	t.order = append(t.order, key)
	t.cond.Signal()
}

// Add queues key (once, however often it is added before a worker takes it).
func (t *trackedQueue) Add(key string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.stopped {
		t.add(key)
	}
}

// AddRateLimited queues key after its per-key exponential backoff; the
// key counts as outstanding while it waits.
func (t *trackedQueue) AddRateLimited(key string) { t.addAfterBackoff(key, true) }

// AddRateLimitedSteady queues key after its backoff like AddRateLimited,
// for a failure that is a reported steady state (a conflict with another
// cluster manager's profile), not work in progress: the key does not count
// as outstanding while it waits, only once it is queued again.
func (t *trackedQueue) AddRateLimitedSteady(key string) { t.addAfterBackoff(key, false) }

// AddAfter queues key after d, for a key that waits on purpose (an
// object another controller writes too, left alone for a hold-off): like
// AddRateLimitedSteady, the key does not count as outstanding while it
// waits, and its backoff is left as it is.
func (t *trackedQueue) AddAfter(key string, d time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.stopped {
		t.addAfterLocked(key, d, false)
	}
}

func (t *trackedQueue) addAfterBackoff(key string, counted bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.stopped {
		t.addAfterLocked(key, t.limiter.When(key), counted)
	}
}

// addAfterLocked queues key after d; call with mu held, the queue running.
func (t *trackedQueue) addAfterLocked(key string, d time.Duration, counted bool) {
	if counted {
		t.delayed[key]++
	}
	var timer *time.Timer
	timer = time.AfterFunc(d, func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		delete(t.timers, timer)
		if counted {
			if t.delayed[key]--; t.delayed[key] <= 0 {
				delete(t.delayed, key)
			}
		}
		if !t.stopped {
			t.add(key)
		}
	})
	t.timers[timer] = struct{}{}
}

// Get waits for a key; shutdown is true once the queue is shut down and
// drained of queued keys.
func (t *trackedQueue) Get() (key string, shutdown bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for len(t.order) == 0 && !t.stopped {
		t.cond.Wait()
	}
	if len(t.order) == 0 {
		return "", true
	}
	key, t.order = t.order[0], t.order[1:]
	delete(t.dirty, key)
	t.processing[key] = struct{}{}
	return key, false
}

// Done marks a key's processing finished; a key added meanwhile is queued
// again.
func (t *trackedQueue) Done(key string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.processing, key)
	if _, ok := t.dirty[key]; ok {
		t.order = append(t.order, key)
		t.cond.Signal()
	}
}

// Forget resets a key's backoff.
func (t *trackedQueue) Forget(key string) { t.limiter.Forget(key) }

// NumRequeues is how many retries a key has had since it last succeeded.
func (t *trackedQueue) NumRequeues(key string) int { return t.limiter.NumRequeues(key) }

// Len is the number of keys waiting for a worker.
func (t *trackedQueue) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.order)
}

// Outstanding is the number of keys with work left: queued, being
// processed, or waiting to be retried.
func (t *trackedQueue) Outstanding() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	keys := make(map[string]struct{}, len(t.dirty)+len(t.processing)+len(t.delayed))
	for k := range t.dirty {
		keys[k] = struct{}{}
	}
	for k := range t.processing {
		keys[k] = struct{}{}
	}
	for k := range t.delayed {
		keys[k] = struct{}{}
	}
	return len(keys)
}

// ShutDown stops the queue: workers' Get returns shutdown once the queued
// keys are taken, and scheduled retries are dropped.
func (t *trackedQueue) ShutDown() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.stopped = true
	for timer := range t.timers {
		timer.Stop()
	}
	t.timers = map[*time.Timer]struct{}{}
	t.delayed = map[string]int{}
	t.cond.Broadcast()
}
