package syncer

import "time"

// pruner keeps a map keyed by every object ever touched down to the
// entries of the last ttl. Without it, such a map grows over a long run to
// one entry per object that ever changed, each holding memory nobody reads
// again.
type pruner struct {
	next int       // size that triggers a prune
	last time.Time // the last prune
}

// prune deletes the entries of m older than ttl at now once m has at
// least 1024 entries and has either reached the size that triggers a prune
// (twice what the last prune left: amortised O(1) per insert) or gone a
// ttl without one (so that a burst that doubled the threshold, such as an
// initial sync, is not held until the map doubles again).
func prune[V any](p *pruner, m map[string]V, now time.Time, ttl time.Duration, at func(V) time.Time) {
	if len(m) < 1024 || (len(m) < p.next && now.Sub(p.last) < ttl) {
		return
	}
	for k, v := range m {
		if now.Sub(at(v)) >= ttl {
			delete(m, k)
		}
	}
	p.next, p.last = 2*len(m), now
}
