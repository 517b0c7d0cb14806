// Package leak counts what a test may leave behind: goroutines and open
// file descriptors.
package leak

import (
	"os"
	"runtime"
	"time"
)

// Baseline returns the goroutine count once it has stopped changing
// (goroutines that are ending need a moment), or after 10 s.
func Baseline() int {
	deadline := time.Now().Add(10 * time.Second)
	n := runtime.NumGoroutine()
	for time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
		m := runtime.NumGoroutine()
		if m == n {
			return n
		}
		n = m
	}
	return n
}

// Goroutines polls until at most atMost goroutines run, or 10 s pass,
// and returns the count.
func Goroutines(atMost int) int {
	deadline := time.Now().Add(10 * time.Second)
	n := runtime.NumGoroutine()
	for n > atMost && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		n = runtime.NumGoroutine()
	}
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
