package stream

import (
	"slices"
	"sync"
	"time"
)

// entry is one item of a consumer's queue: a change, or a snapshot of the
// current state taken on a resync.
type entry struct {
	seq      uint64
	at       time.Time // when the change was notified
	change   Change
	snapshot []Change // for a snapshot entry; never nil there
	isSnap   bool
}

// queue is the bounded FIFO between Notify and one consumer. Only changes
// count against the bound; the consumer's worker holds the head until it is
// delivered, so nothing is ever reordered.
type queue struct {
	mu      sync.Mutex
	items   []*entry
	changes int
	max     int
	seq     uint64 // of the last change enqueued
	closed  bool
	// resync is set when a change was dropped, when the consumer starts and
	// when it asks for one: the worker then inserts a snapshot of the
	// current state.
	resync bool
	// dropping is true from the first drop until the next resync, so a
	// burst of drops is reported once.
	dropping bool

	wake    chan struct{} // the worker has work
	changed chan struct{} // closed and replaced whenever the head is popped
}

func newQueue(max int) *queue {
	return &queue{max: max, wake: make(chan struct{}, 1), changed: make(chan struct{})}
}

// push adds a change unless the queue is full; it never blocks. first
// reports the first drop of a burst.
func (q *queue) push(c Change, at time.Time) (ok, first bool) {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return true, false
	}
	if q.changes >= q.max {
		q.resync = true
		first = !q.dropping
		q.dropping = true
		q.mu.Unlock()
		q.signal()
		return false, first
	}
	q.seq++
	q.items = append(q.items, &entry{seq: q.seq, at: at, change: c})
	q.changes++
	q.mu.Unlock()
	q.signal()
	return true, false
}

func (q *queue) signal() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

func (q *queue) head() *entry {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.items) == 0 {
		return nil
	}
	return q.items[0]
}

// batch returns the entries to deliver together: a snapshot at the head
// alone, or the changes at the head up to max and up to the first one
// about a key already in the batch, so that a batch never holds two
// changes of one (namespace, cluster) and a consumer may deliver a batch's
// changes concurrently without reordering a key.
func (q *queue) batch(max int) []*entry {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.items) == 0 {
		return nil
	}
	if q.items[0].isSnap {
		return q.items[:1:1]
	}
	seen := make(map[Key]bool, min(max, len(q.items)))
	n := 0
	for _, e := range q.items {
		k := e.change.Key()
		if n == max || e.isSnap || seen[k] {
			break
		}
		seen[k] = true
		n++
	}
	return slices.Clone(q.items[:n])
}

// pop removes the first n entries, which the worker has delivered.
func (q *queue) pop(n int) {
	q.mu.Lock()
	for _, e := range q.items[:n] {
		if !e.isSnap {
			q.changes--
		}
	}
	clear(q.items[:n])
	q.items = q.items[n:]
	close(q.changed)
	q.changed = make(chan struct{})
	q.mu.Unlock()
}

// depth is the number of changes waiting.
func (q *queue) depth() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.changes
}

// markResync asks for a resync.
func (q *queue) markResync() {
	q.mu.Lock()
	q.resync = true
	q.mu.Unlock()
	q.signal()
}

// takeResync returns whether a resync is wanted and the sequence number of
// the last change enqueued so far, clearing the request.
func (q *queue) takeResync() (bool, uint64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.resync {
		return false, 0
	}
	q.resync = false
	q.dropping = false
	return true, q.seq
}

// insertSnapshot puts a snapshot right after the change with sequence
// number after, that is, after every change enqueued before the snapshot
// was taken and before every change enqueued since. A snapshot still
// waiting is superseded by the new one and removed, unless it is at the
// head (it may be under way).
func (q *queue) insertSnapshot(after uint64, snap []Change) {
	q.mu.Lock()
	defer q.mu.Unlock()
	kept := q.items[:0:0]
	for i, e := range q.items {
		if e.isSnap && i > 0 {
			continue
		}
		kept = append(kept, e)
	}
	i := 0
	for i < len(kept) && (kept[i].seq <= after || (i == 0 && kept[i].isSnap)) {
		i++
	}
	if snap == nil {
		snap = []Change{}
	}
	e := &entry{seq: after, at: time.Now(), snapshot: snap, isSnap: true}
	kept = slices.Insert(kept, i, e)
	q.items = kept
}

// lastSeq is the sequence number of the last change enqueued.
func (q *queue) lastSeq() uint64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.seq
}

// doneUpTo reports whether everything enqueued up to seq (changes, and
// snapshots inserted after them) has been delivered, and otherwise returns
// a channel closed at the next pop.
func (q *queue) doneUpTo(seq uint64) (bool, <-chan struct{}) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.items) == 0 || q.items[0].seq > seq {
		return true, nil
	}
	return false, q.changed
}

func (q *queue) close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	q.signal()
}
