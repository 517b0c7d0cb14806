package testutil

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

func TestPollHoldsAtOnceAndLater(t *testing.T) {
	if err := Poll(context.Background(), time.Second, time.Hour, func() bool { return true }); err != nil {
		t.Fatalf("a condition that holds at once: %v", err)
	}
	var calls atomic.Int32
	took := Eventually(t, 5*time.Second, time.Millisecond, func() error {
		if calls.Add(1) < 3 {
			return errors.New("not yet")
		}
		return nil
	}, "third call")
	if calls.Load() != 3 || took <= 0 {
		t.Fatalf("%d calls, took %s; want 3 calls", calls.Load(), took)
	}
}

func TestPollTimesOutWithTheLastReason(t *testing.T) {
	start := time.Now()
	err := Poll(context.Background(), 50*time.Millisecond, 10*time.Millisecond, func() error { return errors.New("still broken") })
	if err == nil || !strings.Contains(err.Error(), "still broken") || !strings.Contains(err.Error(), "not within 50ms") {
		t.Fatalf("err = %v, want the timeout and the last reason", err)
	}
	if d := time.Since(start); d < 50*time.Millisecond || d > 5*time.Second {
		t.Fatalf("returned after %s, want about 50ms", d)
	}
	if err := Poll(context.Background(), 0, time.Millisecond, func() bool { return false }); err == nil {
		t.Fatal("a condition that never holds passed with no time at all")
	}
}

func TestPollStopsAtOnce(t *testing.T) {
	gone := errors.New("process exited")
	calls := 0
	err := Poll(context.Background(), time.Minute, time.Millisecond, func() error {
		calls++
		return Stop(gone)
	})
	if !errors.Is(err, gone) || calls != 1 {
		t.Fatalf("err = %v after %d calls, want %v after 1", err, calls, gone)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Poll(ctx, time.Minute, time.Millisecond, func() bool { return false }); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v with a cancelled context", err)
	}
}

const text = `# HELP hubsync_sink_up Whether the sink runs.
# TYPE hubsync_sink_up gauge
hubsync_sink_up{sink="one",type="kubeconfig"} 1
hubsync_sink_up{sink="two",type="webhook"} 0
# HELP hubsync_profile_writes_total Writes.
# TYPE hubsync_profile_writes_total counter
hubsync_profile_writes_total{op="create"} 3
hubsync_profile_writes_total{op="status"} 4
# HELP hubsync_leader Leader.
# TYPE hubsync_leader gauge
hubsync_leader 1
# HELP hubsync_sink_delivery_seconds Delivery.
# TYPE hubsync_sink_delivery_seconds histogram
hubsync_sink_delivery_seconds_bucket{sink="one",le="1"} 2
hubsync_sink_delivery_seconds_bucket{sink="one",le="+Inf"} 2
hubsync_sink_delivery_seconds_sum{sink="one"} 0.5
hubsync_sink_delivery_seconds_count{sink="one"} 2
`

func TestMetricsLookup(t *testing.T) {
	m, err := ParseMetrics(text)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name    string
		labels  Labels
		want    float64
		present bool
	}{
		{"hubsync_profile_writes_total", nil, 7, true},
		{"hubsync_profile_writes_total", Labels{"op": "create"}, 3, true},
		{"hubsync_profile_writes_total", Labels{"op": "delete"}, 0, false},
		{"hubsync_sink_up", Labels{"sink": "two"}, 0, true},
		{"hubsync_sink_up", Labels{"sink": "one", "type": "kubeconfig"}, 1, true},
		{"hubsync_sink_up", Labels{"sink": "one", "type": "webhook"}, 0, false},
		{"hubsync_leader", nil, 1, true},
		{"hubsync_sink_delivery_seconds", Labels{"sink": "one"}, 2, true},
		{"hubsync_missing", nil, 0, false},
	} {
		got, ok := m.Lookup(c.name, c.labels)
		if got != c.want || ok != c.present || m.Value(c.name, c.labels) != c.want || m.Has(c.name, c.labels) != c.present {
			t.Errorf("%s%v = %v (present %v), want %v (present %v)", c.name, c.labels, got, ok, c.want, c.present)
		}
	}
	again, err := ParseMetrics(m.Text())
	if err != nil || again.Value("hubsync_profile_writes_total", nil) != 7 {
		t.Fatalf("Text does not parse back: %v\n%s", err, m.Text())
	}
	if _, err := ParseMetrics("not metrics {"); err == nil {
		t.Fatal("a broken text parsed")
	}
}

func TestGather(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hubsync_reconcile_total", Help: "h"}, []string{"result"})
	reg.MustRegister(c)
	c.WithLabelValues("error").Add(2)
	c.WithLabelValues("success").Inc()
	m, err := Gather(reg)
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Value("hubsync_reconcile_total", Labels{"result": "error"}); got != 2 {
		t.Fatalf("errors = %v, want 2", got)
	}
}

func TestRecorder(t *testing.T) {
	var r Recorder[string]
	go func() {
		for _, v := range []string{"a1", "b1", "a2"} {
			r.Notify(v)
		}
	}()
	isA := func(v string) bool { return strings.HasPrefix(v, "a") }
	if got := r.Take(t, 5*time.Second, isA); got != "a1" {
		t.Fatalf("first take %q", got)
	}
	if got := r.Take(t, 5*time.Second, isA); got != "a2" {
		t.Fatalf("second take %q", got)
	}
	if n := r.Count(isA); n != 2 {
		t.Fatalf("count %d", n)
	}
	if u := r.Untaken(); len(u) != 1 || u[0] != "b1" {
		t.Fatalf("untaken %v", u)
	}
	if all := r.All(); strings.Join(all, ",") != "a1,b1,a2" {
		t.Fatalf("all %v", all)
	}
}

func TestHubsyncPathFromEnv(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "hubsync")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv(BinaryEnv, bin)
	if got := Hubsync(t); got != bin {
		t.Fatalf("Hubsync = %q, want %s's %q", got, BinaryEnv, bin)
	}
	t.Setenv(BinaryEnv, filepath.Join(t.TempDir(), "missing"))
	if _, err := HubsyncPath(); err == nil {
		t.Fatal("a missing binary was accepted")
	}
}
