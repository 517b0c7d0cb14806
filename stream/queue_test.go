package stream

import (
	"fmt"
	"testing"
	"time"
)

func TestQueueSnapshotGoesAfterEarlierChanges(t *testing.T) {
	q := newQueue(4)
	for i := range 3 {
		q.push(change("a", fmt.Sprintf("c%d", i), "1"), time.Now())
	}
	q.markResync()
	want, after := q.takeResync()
	if !want || after != 3 {
		t.Fatalf("takeResync = %v, %d", want, after)
	}
	q.push(change("a", "late", "1"), time.Now())
	q.insertSnapshot(after, []Change{change("a", "c0", "1")})
	var got []string
	for _, e := range q.items {
		if e.isSnap {
			got = append(got, "snapshot")
		} else {
			got = append(got, e.change.Cluster)
		}
	}
	if fmt.Sprint(got) != "[c0 c1 c2 snapshot late]" {
		t.Fatalf("order %v", got)
	}
	// A newer snapshot supersedes one still waiting.
	q.insertSnapshot(q.lastSeq(), nil)
	n := 0
	for _, e := range q.items {
		if e.isSnap {
			n++
		}
	}
	if n != 1 || !q.items[len(q.items)-1].isSnap {
		t.Fatalf("want one snapshot, last; got %d", n)
	}
	if ok, _ := q.push(change("a", "x", "1"), time.Now()); ok {
		t.Fatal("a fifth change fit a queue of four")
	}
}

func TestQueueBatch(t *testing.T) {
	tests := []struct {
		name     string
		clusters []string
		max      int
		want     int
	}{
		{name: "distinct keys up to max", clusters: []string{"a", "b", "c", "d"}, max: 3, want: 3},
		{name: "stops at a repeated key", clusters: []string{"a", "b", "a", "c"}, max: 10, want: 2},
		{name: "one", clusters: []string{"a"}, max: 10, want: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q := newQueue(100)
			for _, c := range tt.clusters {
				q.push(change("ns", c, "1"), time.Now())
			}
			if got := len(q.batch(tt.max)); got != tt.want {
				t.Errorf("batch = %d, want %d", got, tt.want)
			}
		})
	}
}
