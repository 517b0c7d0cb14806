package syncer

import (
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hubsync/hubsync/stream"
)

func TestPrune(t *testing.T) {
	t0 := time.Date(2026, 11, 24, 4, 0, 0, 0, time.UTC)
	tests := []struct {
		name     string
		old, new int           // entries older than the ttl, and within it
		next     int           // size that triggers a prune
		since    time.Duration // since the last prune
		want     int           // entries left
		wantNext int
	}{
		{name: "small maps are left alone", old: 1000, new: 23, since: time.Hour, want: 1023},
		{name: "at 1024 the expired go", old: 1000, new: 24, want: 24, wantNext: 48},
		{name: "nothing expired: next doubles", old: 0, new: 1024, want: 1024, wantNext: 2048},
		{name: "below a raised threshold, pruned recently: left alone", old: 3000, new: 1000, next: 5000, since: time.Second, want: 4000, wantNext: 5000},
		{name: "at a raised threshold", old: 3000, new: 2000, next: 5000, since: time.Second, want: 2000, wantNext: 4000},
		{name: "below a raised threshold, a ttl since the last prune", old: 3000, new: 1000, next: 40000, since: 30 * time.Second, want: 1000, wantNext: 2000},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := map[string]time.Time{}
			for i := range tc.old {
				m[fmt.Sprint("old-", i)] = t0.Add(-time.Minute)
			}
			for i := range tc.new {
				m[fmt.Sprint("new-", i)] = t0.Add(-time.Second)
			}
			p := pruner{next: tc.next, last: t0.Add(-tc.since)}
			prune(&p, m, t0, 30*time.Second, func(t time.Time) time.Time { return t })
			if len(m) != tc.want || p.next != tc.wantNext {
				t.Errorf("left %d entries, next %d; want %d, next %d", len(m), p.next, tc.want, tc.wantNext)
			}
			for k, at := range m {
				if tc.want < tc.old+tc.new && t0.Sub(at) >= 30*time.Second {
					t.Fatalf("expired %s kept", k)
				}
			}
		})
	}
}

// TestTrackersForgetOneOffObjects writes many objects once each, as
// clusters moving between sets do over a long run: the trackers keep
// about the entries of their ttl, not one per object ever written.
func TestTrackersForgetOneOffObjects(t *testing.T) {
	const objects = 20000
	w := newWriteTracker(time.Nanosecond)
	n := newNotifiedState(time.Nanosecond)
	for i := range objects {
		meta := &metav1.ObjectMeta{Namespace: fmt.Sprint("ns-", i%10), Name: fmt.Sprint("c-", i), ResourceVersion: fmt.Sprint(i + 1), UID: "u"}
		if i%2 == 0 {
			w.wrote(meta)
		} else {
			w.deletedObj(meta)
		}
		n.note(stream.Change{Type: stream.ProfileCreated, Namespace: meta.Namespace, Cluster: meta.Name, Name: meta.Name, ResourceVersion: meta.ResourceVersion})
	}
	if len(w.m) >= 2048 || len(n.m) >= 2048 {
		t.Errorf("after %d one-off objects the write tracker holds %d entries and the notified state %d; want fewer than 2048 each", objects, len(w.m), len(n.m))
	}
}
