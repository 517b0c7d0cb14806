package syncer

import "time"

// pruneOld keeps a map keyed by every object ever touched down to the
// entries of the last ttl: once m has grown to *next entries (at least
// 1024), it deletes those older than ttl at now and sets *next to twice
// what is left, so the cost is amortised O(1) per insert. Without it, such
// a map grows over a long run to one entry per object that ever changed,
// each holding memory nobody reads again.
func pruneOld[V any](m map[string]V, next *int, now time.Time, ttl time.Duration, at func(V) time.Time) {
	if len(m) < max(*next, 1024) {
		return
	}
	for k, v := range m {
		if now.Sub(at(v)) >= ttl {
			delete(m, k)
		}
	}
	*next = 2 * len(m)
}
