package syncer

import (
	"strconv"
	"sync"
	"time"

	"github.com/hubsync/hubsync/stream"
)

// notifiedState remembers the last change notified for each object until
// the informer cache shows it, so that a snapshot is never older than the
// changes consumers already have. Without it, a snapshot taken while the
// cache lags hubsync's own writes would lack a profile whose creation was
// already delivered, and the consumer's resync would remove it again (a
// file pruned, a profile.deleted announced) with no later change to repair
// it.
type notifiedState struct {
	ttl    time.Duration
	mu     sync.Mutex
	m      map[string]notedChange
	pruner pruner // of m's expired entries
}

type notedChange struct {
	c   stream.Change
	rv  uint64
	at  time.Time
	del bool // the object was deleted; rv is its last version
}

func newNotifiedState(ttl time.Duration) *notifiedState {
	return &notifiedState{ttl: ttl, m: map[string]notedChange{}}
}

// objectKey identifies the object a change is about: a profile, or a
// credential copy (a Secret).
func objectKey(c stream.Change) string {
	kind := "profile/"
	if c.Credential != nil || c.Type == stream.CredentialSynced || c.Type == stream.CredentialRotated || c.Type == stream.CredentialRemoved {
		kind = "secret/"
	}
	return kind + c.Namespace + "/" + c.Name
}

// note records a change as it is notified. A resourceVersion that is not
// an integer is not tracked (as in writeTracker).
func (n *notifiedState) note(c stream.Change) {
	rv, err := strconv.ParseUint(c.ResourceVersion, 10, 64)
	if err != nil {
		return
	}
	del := c.Type == stream.ProfileDeleted || c.Type == stream.CredentialRemoved
	now := time.Now()
	n.mu.Lock()
	defer n.mu.Unlock()
	n.m[objectKey(c)] = notedChange{c: c, rv: rv, at: now, del: del}
	// Entries are otherwise dropped only by a snapshot, which may not come
	// for days; an expired one no longer changes any snapshot.
	prune(&n.pruner, n.m, now, n.ttl, func(c notedChange) time.Time { return c.at })
}

// overlay merges what the cache shows (one snapshot change per object)
// with the changes notified since: an object the cache shows at an older
// version than the last notified one is taken from the notification, or
// left out if that was its deletion; an object the cache does not show yet
// is added. Entries the cache has caught up with, and expired ones, are
// forgotten.
func (n *notifiedState) overlay(cached []stream.Change, now time.Time) []stream.Change {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make([]stream.Change, 0, len(cached))
	seen := make(map[string]bool, len(n.m))
	for _, c := range cached {
		k := objectKey(c)
		noted, ok := n.m[k]
		if !ok {
			out = append(out, c)
			continue
		}
		seen[k] = true
		rv, err := strconv.ParseUint(c.ResourceVersion, 10, 64)
		switch {
		case err != nil || now.Sub(noted.at) > n.ttl:
			delete(n.m, k)
			out = append(out, c)
		case noted.del && rv <= noted.rv:
			// Deleted; the cache still shows it.
		case !noted.del && rv < noted.rv:
			out = append(out, asSnapshot(noted.c, c.ClusterLabels))
		default:
			delete(n.m, k) // the cache has caught up
			out = append(out, c)
		}
	}
	for k, noted := range n.m {
		switch {
		case seen[k]:
		case now.Sub(noted.at) > n.ttl:
			delete(n.m, k)
		case noted.del:
			delete(n.m, k) // gone from the cache too
		default:
			out = append(out, asSnapshot(noted.c, noted.c.ClusterLabels))
		}
	}
	return out
}

// asSnapshot turns a notified change into the snapshot entry for its
// object: profile.updated or credential.synced.
func asSnapshot(c stream.Change, labels map[string]string) stream.Change {
	if c.Credential != nil {
		c.Type = stream.CredentialSynced
	} else {
		c.Type = stream.ProfileUpdated
	}
	if labels != nil {
		c.ClusterLabels = labels
	}
	return c
}
