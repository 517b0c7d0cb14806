package syncer

import (
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// debouncer coalesces changes to a key only while they arrive close
// together, as the bus's batch window does: a key touched after a quiet
// spell (no touch for quiet) is handed on at once, so a single token
// rotation costs no delay. A key touched again within quiet of its last
// touch is in a burst: it is handed on once no new touch has come for
// quiet, or at most maxWait after the burst began. A burst of rotations of
// one hub token Secret thus costs two reconciles (the first change at
// once, the rest together), and so at most two writes per copy.
type debouncer struct {
	quiet, maxWait time.Duration
	fire           func(string)
	clock          clock.WithDelayedExecution

	mu        sync.Mutex
	timers    map[string]clock.Timer
	first     map[string]time.Time // start of a key's pending burst
	lastTouch map[string]time.Time // keys touched within the last quiet
	pruner    pruner               // of lastTouch
	stopped   bool
}

func newDebouncer(quiet, maxWait time.Duration, fire func(string), c clock.WithDelayedExecution) *debouncer {
	return &debouncer{
		quiet: quiet, maxWait: maxWait, fire: fire, clock: c,
		timers: map[string]clock.Timer{}, first: map[string]time.Time{}, lastTouch: map[string]time.Time{},
	}
}

func (d *debouncer) touch(key string) {
	if d.quiet <= 0 {
		d.fire(key)
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stopped {
		return
	}
	now := d.clock.Now()
	last, recent := d.lastTouch[key]
	recent = recent && now.Sub(last) < d.quiet
	d.lastTouch[key] = now
	prune(&d.pruner, d.lastTouch, now, d.quiet, func(t time.Time) time.Time { return t })
	if t, ok := d.timers[key]; ok {
		// A burst already waits: push it back, within maxWait of its start.
		t.Reset(max(min(d.quiet, d.first[key].Add(d.maxWait).Sub(now)), 0))
		return
	}
	if !recent {
		// After a quiet spell: at once. Fired under the lock, so that the
		// key is always either pending here or in the queue.
		d.fire(key)
		return
	}
	d.first[key] = now
	d.timers[key] = d.clock.AfterFunc(d.quiet, func() {
		d.mu.Lock()
		defer d.mu.Unlock()
		delete(d.timers, key)
		delete(d.first, key)
		if !d.stopped {
			d.fire(key)
		}
	})
}

func (d *debouncer) pending() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.timers)
}

func (d *debouncer) stop() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.stopped = true
	for _, t := range d.timers {
		t.Stop()
	}
}
