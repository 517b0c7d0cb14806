package bus

import (
	"strconv"
	"testing"

	"github.com/hubsync/hubsync/syncer"
)

func order(q *queue) string {
	s := ""
	for _, e := range q.items {
		if e.isSnap {
			s += "S" + strconv.Itoa(len(e.snapshot)) + " "
		} else {
			s += e.change.ResourceVersion + " "
		}
	}
	return s
}

func TestQueueOrderAndSnapshots(t *testing.T) {
	q := newQueue(4)
	push := func(rv string) bool {
		ok, _ := q.push(syncer.Change{ResourceVersion: rv})
		return ok
	}
	for _, rv := range []string{"1", "2", "3"} {
		push(rv)
	}
	want, after := q.takeResync()
	if want {
		t.Fatal("resync wanted without drops")
	}
	q.markResync()
	want, after = q.takeResync()
	if !want || after != 3 {
		t.Fatalf("takeResync = %v, %d", want, after)
	}
	push("4") // notified while the snapshot is taken: goes after it
	q.insertSnapshot(after, make([]syncer.Change, 1))
	if got := order(q); got != "1 2 3 S1 4 " {
		t.Fatalf("order %q", got)
	}
	// Snapshots do not count against the bound; the fifth change does.
	if push("5") {
		t.Fatal("pushed beyond the bound")
	}
	if want, after = q.takeResync(); !want || after != 4 {
		t.Fatalf("takeResync after a drop = %v, %d", want, after)
	}
	q.insertSnapshot(after, make([]syncer.Change, 2))
	if got := order(q); got != "1 2 3 4 S2 " {
		t.Fatalf("a newer snapshot must replace the waiting one: %q", got)
	}
	// A snapshot under way at the head stays; the new one goes after.
	q.pop(3)
	q.pop(1)
	q.items[0].published = 1
	push("6")
	q.insertSnapshot(5, make([]syncer.Change, 3))
	if got := order(q); got != "S2 6 S3 " {
		t.Fatalf("order %q", got)
	}
	if done, _ := q.doneUpTo(5); done {
		t.Error("doneUpTo ignores waiting entries")
	}
}

func TestQueueBatch(t *testing.T) {
	c := func(ns, cluster string) syncer.Change {
		return syncer.Change{Namespace: ns, Cluster: cluster, ResourceVersion: ns + "/" + cluster}
	}
	tests := []struct {
		name    string
		changes []syncer.Change
		snapAt  int // a snapshot after this many changes; -1 for none
		max     int
		want    string
	}{
		{name: "empty", snapAt: -1, max: 4, want: ""},
		{name: "distinct pairs up to max", changes: []syncer.Change{c("a", "1"), c("a", "2"), c("b", "1"), c("b", "2")}, snapAt: -1, max: 3, want: "a/1 a/2 b/1 "},
		{name: "stops before a pair already in the batch", changes: []syncer.Change{c("a", "1"), c("b", "1"), c("a", "1"), c("c", "1")}, snapAt: -1, max: 10, want: "a/1 b/1 "},
		{name: "same cluster, other namespace", changes: []syncer.Change{c("a", "1"), c("b", "1")}, snapAt: -1, max: 10, want: "a/1 b/1 "},
		{name: "stops before a snapshot", changes: []syncer.Change{c("a", "1"), c("b", "1")}, snapAt: 1, max: 10, want: "a/1 "},
		{name: "a snapshot at the head goes alone", changes: []syncer.Change{c("a", "1")}, snapAt: 0, max: 10, want: "S0 "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q := newQueue(100)
			for i, ch := range tt.changes {
				if i == tt.snapAt {
					q.insertSnapshot(uint64(i), nil)
				}
				q.push(ch)
			}
			got := order(&queue{items: q.batch(tt.max)})
			if got != tt.want {
				t.Errorf("batch = %q, want %q", got, tt.want)
			}
			n := len(q.items)
			q.batch(tt.max)
			if len(q.items) != n {
				t.Error("batch changed the queue")
			}
		})
	}
}
