package stream

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	poll "github.com/hubsync/hubsync/test/testutil"
)

func TestStatusWithReport(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	healthy := Status{Name: "hook", Type: "webhook", Healthy: true, QueueDepth: 2, Oldest: t0.Add(time.Minute), LastSuccess: t0.Add(2 * time.Minute)}
	handOverFailing := Status{Name: "hook", Type: "webhook", QueueDepth: 2, Failures: 3, LastError: "spool: disk full"}
	tests := []struct {
		name   string
		status Status
		report Report
		want   Status
	}{
		{
			name:   "nothing to report: the worker's success is no longer the target's",
			status: healthy,
			want:   Status{Name: "hook", Type: "webhook", Healthy: true, QueueDepth: 2, Oldest: t0.Add(time.Minute)},
		},
		{
			name:   "a backlog counts as queued, and its oldest is older than the queue's",
			status: healthy,
			report: Report{Backlog: 65, Oldest: t0, LastSuccess: t0.Add(-time.Hour), LastAttempt: t0.Add(3 * time.Minute), LastResult: "503 Service Unavailable", Failures: 4},
			want: Status{Name: "hook", Type: "webhook", Healthy: true, QueueDepth: 67, Backlog: 65, Oldest: t0,
				LastSuccess: t0.Add(-time.Hour), LastAttempt: t0.Add(3 * time.Minute), LastResult: "503 Service Unavailable"},
		},
		{
			name:   "the queue's head is older than the backlog",
			status: healthy,
			report: Report{Backlog: 1, Oldest: t0.Add(5 * time.Minute)},
			want:   Status{Name: "hook", Type: "webhook", Healthy: true, QueueDepth: 3, Backlog: 1, Oldest: t0.Add(time.Minute)},
		},
		{
			name:   "a failing target makes the sink unhealthy",
			status: healthy,
			report: Report{Backlog: 65, Oldest: t0, Failing: true, FailingSince: t0, Failures: 12, Error: "POST https://h/: 503"},
			want: Status{Name: "hook", Type: "webhook", QueueDepth: 67, Backlog: 65, Oldest: t0,
				FailingSince: t0, Failures: 12, LastError: "POST https://h/: 503"},
		},
		{
			name:   "a failing hand-over keeps its own error",
			status: handOverFailing,
			report: Report{Backlog: 1, Failing: true, FailingSince: t0, Failures: 12, Error: "POST https://h/: 503"},
			want:   Status{Name: "hook", Type: "webhook", QueueDepth: 3, Backlog: 1, Failures: 3, LastError: "spool: disk full"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.status.WithReport(tt.report); got != tt.want {
				t.Errorf("WithReport:\n got %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

func TestStatusSummary(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name   string
		status Status
		want   string
	}{
		{name: "idle", status: Status{Name: "kc", Type: "kubeconfig", Healthy: true},
			want: "sink kc (kubeconfig): ok, 0 queued"},
		{name: "the worker failing to hand over", status: Status{Name: "kc", Type: "kubeconfig", Failures: 3, LastError: "write: disk full", QueueDepth: 4, Oldest: now.Add(-1500 * time.Millisecond)},
			want: "sink kc (kubeconfig): failing (3 attempts): write: disk full, 4 queued, oldest 2s"},
		{name: "a target refusing, not for long yet", status: Status{Name: "hook", Type: "webhook", Healthy: true, QueueDepth: 5,
			Oldest: now.Add(-20 * time.Second), LastAttempt: now.Add(-250 * time.Millisecond), LastResult: "503 Service Unavailable"},
			want: "sink hook (webhook): ok, 5 queued, oldest 20s, last attempt 250ms ago: 503 Service Unavailable"},
		{name: "a target failing", status: Status{Name: "hook", Type: "webhook", QueueDepth: 65, Oldest: now.Add(-66 * time.Second),
			FailingSince: now.Add(-65 * time.Second), Failures: 14, LastError: "POST https://h/: endpoint answered 503 Service Unavailable",
			LastAttempt: now.Add(-2 * time.Second), LastResult: "503 Service Unavailable"},
			want: "sink hook (webhook): failing for 1m5s (14 attempts): POST https://h/: endpoint answered 503 Service Unavailable, 65 queued, oldest 1m6s, last attempt 2s ago: 503 Service Unavailable"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.status.Summary(now); got != tt.want {
				t.Errorf("Summary:\n got %q\nwant %q", got, tt.want)
			}
		})
	}
}

// reporting is a consumer that delivers at once and keeps a backlog of its
// own, whose report the test sets.
type reporting struct {
	recorder
	mu     sync.Mutex
	report Report
}

func (r *reporting) Report() Report {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.report
}

func (r *reporting) setReport(rep Report) {
	r.mu.Lock()
	r.report = rep
	r.mu.Unlock()
}

// A consumer whose hand-over succeeds but whose target fails is shown
// failing, with its backlog, by Statuses and by the sink metrics.
func TestStatusesAndMetricsReadTheConsumersReport(t *testing.T) {
	f, reg := newFanout(t, func() []Change { return []Change{} })
	c := &reporting{}
	if err := f.Add(Options{Name: "hook", Type: "webhook", QueueSize: 10000, MaxBatch: 256,
		RetryBase: 100 * time.Millisecond, RetryMax: 30 * time.Second}, c); err != nil {
		t.Fatal(err)
	}
	f.Notify(change("a", "c1", "1"))
	if err := f.FlushConsumer(ctxT(t), "hook"); err != nil {
		t.Fatal(err)
	}
	oldest := time.Now().Add(-time.Minute).Truncate(time.Second)
	c.setReport(Report{Backlog: 65, Oldest: oldest, Failing: true, FailingSince: oldest, Failures: 9,
		Error: "POST https://h/: endpoint answered 503 Service Unavailable"})
	st := f.Statuses()
	if len(st) != 1 || st[0].Healthy || st[0].QueueDepth != 65 || st[0].Backlog != 65 || !st[0].Oldest.Equal(oldest) ||
		!strings.Contains(st[0].LastError, "503") {
		t.Errorf("Statuses = %+v; want hook failing with 65 queued since %s", st, oldest)
	}
	for _, m := range []struct {
		name string
		want float64
	}{
		{"hubsync_sink_up", 0},
		{"hubsync_sink_queue_depth", 65},
		{"hubsync_sink_oldest_waiting_timestamp_seconds", float64(oldest.Unix())},
	} {
		if got := sinkGauge(t, reg, m.name, "hook"); got != m.want {
			t.Errorf("%s = %v, want %v", m.name, got, m.want)
		}
	}
	// The target takes the backlog: healthy, nothing waits.
	c.setReport(Report{LastSuccess: time.Now(), LastAttempt: time.Now(), LastResult: "204 No Content"})
	if got := sinkGauge(t, reg, "hubsync_sink_up", "hook"); got != 1 {
		t.Errorf("hubsync_sink_up = %v after the target took the backlog, want 1", got)
	}
	if got := sinkGauge(t, reg, "hubsync_sink_oldest_waiting_timestamp_seconds", "hook"); got != 0 {
		t.Errorf("hubsync_sink_oldest_waiting_timestamp_seconds = %v with nothing waiting, want 0", got)
	}
}

// sinkGauge is the value of the gauge name's series of sink in reg; it
// fails t if there is none.
func sinkGauge(t *testing.T, reg *prometheus.Registry, name, sink string) float64 {
	t.Helper()
	m, err := poll.Gather(reg)
	if err != nil {
		t.Fatal(err)
	}
	v, ok := m.Lookup(name, map[string]string{"sink": sink})
	if !ok {
		t.Fatalf("no %s series for sink %s", name, sink)
	}
	return v
}
