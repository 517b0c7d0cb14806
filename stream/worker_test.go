package stream

import (
	"slices"
	"testing"
	"time"
)

// A worker waits base after its first failed delivery and doubles the wait
// after each further one, up to max, without jitter.
func TestRetryBackoff(t *testing.T) {
	ms := time.Millisecond
	for _, tc := range []struct {
		name      string
		base, max time.Duration
		want      []time.Duration
	}{
		{"hubsync's defaults", 100 * ms, 30 * time.Second, []time.Duration{
			100 * ms, 200 * ms, 400 * ms, 800 * ms, 1600 * ms, 3200 * ms, 6400 * ms, 12800 * ms, 25600 * ms, 30 * time.Second, 30 * time.Second,
		}},
		{"max not a doubling of base", ms, 10 * ms, []time.Duration{ms, 2 * ms, 4 * ms, 8 * ms, 10 * ms, 10 * ms}},
		{"base is max", time.Second, time.Second, []time.Duration{time.Second, time.Second, time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := retryBackoff(tc.base, tc.max)
			var got []time.Duration
			for range tc.want {
				got = append(got, b.Step())
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("waits %v, want %v", got, tc.want)
			}
		})
	}
}
