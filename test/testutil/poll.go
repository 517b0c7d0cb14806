// Package testutil owns the helpers that every end-to-end suite, the
// benchmarks and the demo share, so that each is written once: waiting
// for a condition by polling it (never by sleeping a fixed time), the
// hubsync binary built once per process, reading Prometheus metrics, and
// recording what a consumer is handed.
//
// It is a leaf: it imports no other test-support package, so that
// test/controlplane, test/fleet, test/konnectivity and test/leak can use
// it. Fixtures belong elsewhere: the control plane and the suites' boot
// in test/controlplane, simulated fleets and the daemon in test/fleet,
// keys, certificates and JWTs in test/pki.
package testutil

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// Condition is what Poll and Eventually wait for: a func() bool that
// reports whether it holds, or a func() error that returns nil once it
// holds and otherwise says why not (the last reason is reported when the
// wait times out). A func() error may return an error wrapped with Stop
// to end the wait at once.
type Condition interface {
	func() bool | func() error
}

// errNotYet is the reason a func() bool condition gives while it does not
// hold.
var errNotYet = errors.New("condition not met")

// stopped marks an error that ends a wait at once.
type stopped struct{ err error }

func (s stopped) Error() string { return s.err.Error() }
func (s stopped) Unwrap() error { return s.err }

// Stop wraps err so that a func() error condition returning it ends Poll
// or Eventually at once with err, instead of being retried: for a
// condition that can no longer come true (the process it waits for
// exited).
func Stop(err error) error { return stopped{err} }

// check evaluates cond once.
func check[C Condition](cond C) error {
	switch c := any(cond).(type) {
	case func() bool:
		if c() {
			return nil
		}
		return errNotYet
	case func() error:
		return c()
	}
	panic("unreachable")
}

// Poll evaluates cond at once and then every interval until it holds,
// returning nil. It returns an error naming cond's last reason when
// timeout passes first, ctx's error when ctx ends first, and the wrapped
// error when cond returns one made with Stop.
func Poll[C Condition](ctx context.Context, timeout, interval time.Duration, cond C) error {
	_, err := poll(ctx, timeout, interval, cond)
	return err
}

// poll is Poll that also returns how long cond took to hold.
func poll[C Condition](ctx context.Context, timeout, interval time.Duration, cond C) (time.Duration, error) {
	start := time.Now()
	// Since Go 1.23 a stopped timer can be Reset without draining it.
	timer := time.NewTimer(interval)
	timer.Stop()
	defer timer.Stop()
	for {
		err := check(cond)
		if err == nil {
			return time.Since(start), nil
		}
		if s := (stopped{}); errors.As(err, &s) {
			return time.Since(start), s.err
		}
		left := timeout - time.Since(start)
		if left <= 0 {
			if err == errNotYet {
				return time.Since(start), fmt.Errorf("not within %s", timeout)
			}
			return time.Since(start), fmt.Errorf("not within %s: %w", timeout, err)
		}
		// The last check falls on the deadline, not an interval past it.
		timer.Reset(min(interval, left))
		select {
		case <-ctx.Done():
			return time.Since(start), fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		case <-timer.C:
		}
	}
}

// Eventually polls cond like Poll until it holds, and returns how long
// that took. If cond does not hold within timeout (or returns a Stop
// error), it fails t with msgAndArgs, a format string and its arguments,
// followed by cond's last reason. The arguments are formatted only then,
// so a fmt.Stringer argument, such as a *fleet.LogBuffer, shows what it
// holds at the failure.
func Eventually[C Condition](t testing.TB, timeout, interval time.Duration, cond C, msgAndArgs ...any) time.Duration {
	t.Helper()
	took, err := poll(context.Background(), timeout, interval, cond)
	if err != nil {
		if msg := message(msgAndArgs); msg != "" {
			t.Fatalf("%s: %v", msg, err)
		}
		t.Fatal(err)
	}
	return took
}

// message formats msgAndArgs: a format string and its arguments, or
// nothing.
func message(msgAndArgs []any) string {
	if len(msgAndArgs) == 0 {
		return ""
	}
	if format, ok := msgAndArgs[0].(string); ok {
		return fmt.Sprintf(format, msgAndArgs[1:]...)
	}
	return fmt.Sprint(msgAndArgs...)
}
