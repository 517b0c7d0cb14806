package syncer

import (
	"reflect"
	"strconv"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// writeTracker remembers hubsync's own recent writes until the informer
// cache shows them, so that a reconcile running on a cache that has not yet
// caught up neither creates a profile twice nor sends a status update that
// is bound to fail its resourceVersion check. Each write's watch event
// re-queues the cluster, so skipping until then loses nothing. Entries
// expire, so a missed event can never block a key for long.
//
// Comparing resourceVersions as integers is what client-go's
// IntegerResourceVersionMutationCache does for the same purpose; if a
// server ever returns a non-integer one, tracking is simply skipped.
type writeTracker struct {
	ttl    time.Duration
	mu     sync.Mutex
	m      map[string]pendingWrite
	pruner pruner // of m's expired entries
}

type pendingWrite struct {
	rv      uint64
	uid     types.UID // the object a create or update wrote
	deleted types.UID // set when the write was a delete of this UID
	at      time.Time
	// recheck: a reconcile skipped this object while the cache was behind
	// the write; its echo must then re-queue the key, not be ignored.
	recheck bool
}

func newWriteTracker(ttl time.Duration) *writeTracker {
	return &writeTracker{ttl: ttl, m: map[string]pendingWrite{}}
}

// wrote records a create or update that returned obj.
func (w *writeTracker) wrote(obj metav1.Object) {
	rv, err := strconv.ParseUint(obj.GetResourceVersion(), 10, 64)
	if err != nil {
		return
	}
	w.put(obj.GetNamespace()+"/"+obj.GetName(), pendingWrite{rv: rv, uid: obj.GetUID()})
}

// deletedObj records a delete of obj.
func (w *writeTracker) deletedObj(obj metav1.Object) {
	w.put(obj.GetNamespace()+"/"+obj.GetName(), pendingWrite{deleted: obj.GetUID()})
}

// put records a write; an object written once and never reconciled again
// (a profile deleted when its cluster left a set) is forgotten once its
// entry expires, not kept for ever.
func (w *writeTracker) put(key string, p pendingWrite) {
	now := time.Now()
	p.at = now
	w.mu.Lock()
	defer w.mu.Unlock()
	w.m[key] = p
	prune(&w.pruner, w.m, now, w.ttl, func(p pendingWrite) time.Time { return p.at })
}

// isEcho reports whether an informer event's object (added or updated) is
// hubsync's own last write to it coming back, at the resourceVersion it
// wrote, and nothing waits for it: an echo that a reconcile skipped for
// (see pending) is not one, so that the skipped work is done. Deletions
// are never echoes; see sawDeleted.
func (w *writeTracker) isEcho(obj metav1.Object) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	p, ok := w.m[obj.GetNamespace()+"/"+obj.GetName()]
	if !ok || p.recheck || p.deleted != "" {
		return false
	}
	rv, err := strconv.ParseUint(obj.GetResourceVersion(), 10, 64)
	return err == nil && p.rv == rv
}

// sawDeleted is told that the informer cache has seen obj deleted: a
// write of that object can no longer arrive in the cache, and a delete of
// it has, so its entry is done with. Without this, an object hubsync wrote
// and someone else deleted before a reconcile saw the write in the cache
// (the garbage collector removing the copy of a deleted profile, a tool, a
// hand) looked like a write still on its way: every reconcile skipped its
// name, the deletion's own event only ran another such reconcile, and once
// the entry expired no event was left to bring the object back before the
// next resync.
func (w *writeTracker) sawDeleted(obj metav1.Object) {
	uid := obj.GetUID()
	if uid == "" {
		return
	}
	key := obj.GetNamespace() + "/" + obj.GetName()
	w.mu.Lock()
	defer w.mu.Unlock()
	if p, ok := w.m[key]; ok && (p.uid == uid || p.deleted == uid) {
		delete(w.m, key)
	}
}

// pending reports whether the cache (cached, nil when absent) does not yet
// show hubsync's last write to key. Entries the cache has caught up with, or
// that have expired, are dropped. A typed nil pointer counts as absent.
func pendingFor[T metav1.Object](w *writeTracker, key string, cached T) bool {
	return w.pending(key, asObject(cached))
}

// observe reads key's object from the cache with get and reports it with
// whether the cache is still behind hubsync's last write to it, as pending
// does. The read and the check are one step under the lock that isEcho
// takes too: an echo arriving meanwhile is either already in what get
// returns, or comes after the entry was marked for recheck and so
// re-queues the key. Checked after an unlocked read, an echo could slip in
// between: ignored as an echo although the reconcile then skipped for it,
// it left the skipped work to the next resync.
func observe[T metav1.Object](w *writeTracker, key string, get func() T) (T, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	cached := get()
	return cached, w.pendingLocked(key, asObject(cached))
}

// asObject turns a typed nil pointer into a nil interface.
func asObject[T metav1.Object](cached T) metav1.Object {
	if v := reflect.ValueOf(cached); !v.IsValid() || v.IsNil() {
		return nil
	}
	return cached
}

func (w *writeTracker) pending(key string, cached metav1.Object) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.pendingLocked(key, cached)
}

func (w *writeTracker) pendingLocked(key string, cached metav1.Object) bool {
	p, ok := w.m[key]
	if !ok {
		return false
	}
	behind := false
	switch {
	case time.Since(p.at) > w.ttl:
	case p.deleted != "":
		behind = cached != nil && cached.GetUID() == p.deleted
	case cached == nil:
		behind = true
	default:
		rv, err := strconv.ParseUint(cached.GetResourceVersion(), 10, 64)
		behind = err == nil && rv < p.rv
	}
	if !behind {
		delete(w.m, key)
		return false
	}
	p.recheck = true
	w.m[key] = p
	return true
}
