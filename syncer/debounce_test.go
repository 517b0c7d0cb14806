package syncer

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/hubsync/hubsync/test/testutil"
	clocktesting "k8s.io/utils/clock/testing"
)

func TestDebouncer(t *testing.T) {
	const quiet, maxWait = 100 * time.Millisecond, time.Second
	type step struct {
		advance time.Duration // before the touch
		touch   string        // "" for none
		fired   []string      // all fires so far, in order
		pending int
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"a lone change goes at once", []step{
			{touch: "a", fired: []string{"a"}},
		}},
		{"a change after a quiet spell goes at once again", []step{
			{touch: "a", fired: []string{"a"}},
			{advance: quiet, touch: "a", fired: []string{"a", "a"}},
		}},
		{"a burst: the first at once, the rest together after quiet", []step{
			{touch: "a", fired: []string{"a"}},
			{advance: 10 * time.Millisecond, touch: "a", fired: []string{"a"}, pending: 1},
			{advance: 10 * time.Millisecond, touch: "a", fired: []string{"a"}, pending: 1},
			{advance: 90 * time.Millisecond, fired: []string{"a"}, pending: 1}, // 90ms since the last touch
			{advance: 10 * time.Millisecond, fired: []string{"a", "a"}},
		}},
		{"other keys are not held back by a burst", []step{
			{touch: "a", fired: []string{"a"}},
			{advance: time.Millisecond, touch: "a", fired: []string{"a"}, pending: 1},
			{touch: "b", fired: []string{"a", "b"}, pending: 1},
		}},
		{"an endless burst still goes within maxWait", func() []step {
			s := []step{{touch: "a", fired: []string{"a"}}, {advance: 50 * time.Millisecond, touch: "a", fired: []string{"a"}, pending: 1}}
			for range 19 { // touches every 50ms until 1000ms
				s = append(s, step{advance: 50 * time.Millisecond, touch: "a", fired: []string{"a"}, pending: 1})
			}
			// maxWait after the burst began (at 50ms) is 1050ms, before
			// quiet after the last touch (1100ms).
			return append(s, step{advance: 40 * time.Millisecond, fired: []string{"a"}, pending: 1},
				step{advance: 10 * time.Millisecond, fired: []string{"a", "a"}})
		}()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
			var mu sync.Mutex
			var fired []string
			d := newDebouncer(quiet, maxWait, func(k string) {
				mu.Lock()
				defer mu.Unlock()
				fired = append(fired, k)
			}, clk)
			defer d.stop()
			for i, s := range tt.steps {
				if s.advance > 0 {
					clk.Step(s.advance)
				}
				if s.touch != "" {
					d.touch(s.touch)
				}
				// A fake timer's function runs in its own goroutine: wait
				// for the expected fires (a bounded poll), then compare.
				// A timeout is reported by the comparison below.
				_ = testutil.Poll(context.Background(), 2*time.Second, time.Millisecond, func() bool {
					mu.Lock()
					defer mu.Unlock()
					return len(fired) >= len(s.fired)
				})
				mu.Lock()
				got := append([]string(nil), fired...)
				mu.Unlock()
				if len(got) != len(s.fired) {
					t.Fatalf("step %d: fired %v, want %v", i, got, s.fired)
				}
				for j := range got {
					if got[j] != s.fired[j] {
						t.Fatalf("step %d: fired %v, want %v", i, got, s.fired)
					}
				}
				if p := d.pending(); p != s.pending {
					t.Fatalf("step %d: pending %d, want %d", i, p, s.pending)
				}
			}
		})
	}
}
