package testutil

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"
)

// Recorder records the values a consumer is handed, from any goroutine,
// in order: a Recorder[stream.Change] is a stream.Notifier that records
// every change it is told of; a NATS consumer's handler records the
// bus.Events it receives with Notify. The zero value is ready to use.
type Recorder[T any] struct {
	mu    sync.Mutex
	items []T
	taken []bool // items Take returned
}

// Notify records v.
func (r *Recorder[T]) Notify(v T) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.items = append(r.items, v)
	r.taken = append(r.taken, false)
}

// All returns every value recorded so far, in order.
func (r *Recorder[T]) All() []T {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.items)
}

// Count returns how many recorded values match.
func (r *Recorder[T]) Count(match func(T) bool) int {
	n := 0
	for _, v := range r.All() {
		if match(v) {
			n++
		}
	}
	return n
}

// Take waits up to timeout for a recorded value that matches and that no
// earlier Take returned, marks it taken and returns it. It fails t with
// msgAndArgs (a format string and its arguments) when none comes in time.
func (r *Recorder[T]) Take(t testing.TB, timeout time.Duration, match func(T) bool, msgAndArgs ...any) T {
	t.Helper()
	var got T
	_, err := poll(context.Background(), timeout, 10*time.Millisecond, func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		for i, v := range r.items {
			if !r.taken[i] && match(v) {
				r.taken[i] = true
				got = v
				return true
			}
		}
		return false
	})
	if err != nil {
		msg := message(msgAndArgs)
		if msg == "" {
			msg = "no matching value"
		}
		t.Fatalf("%s: %v; %d values recorded", msg, err, len(r.All()))
	}
	return got
}

// Untaken returns the recorded values Take has not returned, in order.
func (r *Recorder[T]) Untaken() []T {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []T
	for i, v := range r.items {
		if !r.taken[i] {
			out = append(out, v)
		}
	}
	return out
}
