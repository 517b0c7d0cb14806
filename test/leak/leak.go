// Package leak counts what a test may leave behind: goroutines and open
// file descriptors.
package leak

import (
	"context"
	"os"
	"runtime"
	"time"

	"github.com/hubsync/hubsync/test/testutil"
)

// Baseline returns the goroutine count once it has stopped changing
// (goroutines that are ending need a moment): the same in two samples
// 200 ms apart, or the last sample after 10 s.
func Baseline() int {
	n := -1 // the first sample only sets the count to compare with
	_ = testutil.Poll(context.Background(), 10*time.Second, 200*time.Millisecond, func() bool {
		m := runtime.NumGoroutine()
		stable := m == n
		n = m
		return stable
	})
	return n
}

// Goroutines polls until at most atMost goroutines run, or 10 s pass,
// and returns the count.
func Goroutines(atMost int) int {
	var n int
	_ = testutil.Poll(context.Background(), 10*time.Second, 20*time.Millisecond, func() bool {
		n = runtime.NumGoroutine()
		return n <= atMost
	})
	return n
}

// OpenFDs counts this process's open file descriptors (Linux).
func OpenFDs() (int, error) {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return 0, err
	}
	return len(ents), nil
}
