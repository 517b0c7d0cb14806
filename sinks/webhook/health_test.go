package webhook

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/stream"
	"github.com/hubsync/hubsync/stream/streamtest"
)

func TestClassify(t *testing.T) {
	tests := []struct {
		code int
		want verdict
	}{
		{0, retry}, // no answer
		{200, delivered},
		{202, delivered},
		{204, delivered},
		{299, delivered},
		{301, retry},
		{307, retry},
		{400, retry},
		{401, retry},
		{404, retry},
		{408, retry},
		{409, retry},
		{410, gone},
		{413, retry},
		{429, throttled},
		{500, retry},
		{502, retry},
		{503, throttled},
		{504, retry},
	}
	for _, tt := range tests {
		if got := classify(tt.code); got != tt.want {
			t.Errorf("classify(%d) = %d, want %d", tt.code, got, tt.want)
		}
	}
}

func TestHealthReport(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	ok := attempt{code: 204, result: "204 No Content"}
	refused := attempt{code: 503, result: "503 Service Unavailable", err: errors.New("POST https://h/: endpoint answered 503 Service Unavailable")}
	unreachable := attempt{result: "no response", err: errors.New("POST https://h/: connection refused")}
	goneAttempt := attempt{code: 410, result: "410 Gone", err: errors.New("POST https://h/: endpoint answered 410 Gone")}
	type step struct {
		at time.Duration // after t0
		a  attempt
	}
	tests := []struct {
		name  string
		steps []step
		now   time.Duration // after t0
		want  stream.Report
	}{
		{name: "no attempt yet", now: time.Hour, want: stream.Report{}},
		{name: "delivering", steps: []step{{0, ok}}, now: time.Hour,
			want: stream.Report{LastSuccess: t0, LastAttempt: t0, LastResult: "204 No Content"}},
		{name: "refusing, not for failingAfter yet", steps: []step{{0, ok}, {time.Second, refused}, {50 * time.Second, refused}}, now: 60 * time.Second,
			want: stream.Report{LastSuccess: t0, LastAttempt: t0.Add(50 * time.Second), LastResult: "503 Service Unavailable", Failures: 2}},
		{name: "refusing for failingAfter, counted from the first refusal", steps: []step{{0, ok}, {time.Second, refused}, {50 * time.Second, refused}}, now: 61 * time.Second,
			want: stream.Report{LastSuccess: t0, LastAttempt: t0.Add(50 * time.Second), LastResult: "503 Service Unavailable", Failures: 2,
				Failing: true, FailingSince: t0.Add(time.Second), Error: refused.err.Error()}},
		{name: "unreachable, with no attempt for a long Retry-After", steps: []step{{time.Second, unreachable}}, now: 5 * time.Minute,
			want: stream.Report{LastAttempt: t0.Add(time.Second), LastResult: "no response", Failures: 1,
				Failing: true, FailingSince: t0.Add(time.Second), Error: unreachable.err.Error()}},
		{name: "a success ends it", steps: []step{{0, refused}, {2 * time.Minute, refused}, {3 * time.Minute, ok}}, now: 4 * time.Minute,
			want: stream.Report{LastSuccess: t0.Add(3 * time.Minute), LastAttempt: t0.Add(3 * time.Minute), LastResult: "204 No Content"}},
		{name: "gone is failing at once", steps: []step{{0, goneAttempt}}, now: time.Second,
			want: stream.Report{LastAttempt: t0, LastResult: "410 Gone", Failures: 1, Failing: true, FailingSince: t0,
				Error: "disabled until it is recreated: " + goneAttempt.err.Error()}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := &health{failingAfter: time.Minute}
			for _, s := range tt.steps {
				h.record(s.a, t0.Add(s.at))
			}
			if got := h.report(t0.Add(tt.now)); got != tt.want {
				t.Errorf("report:\n got %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

// The spool knows when its oldest undelivered event was spooled, across
// segments, after deliveries, and after a restart (from the files).
func TestSpoolOldest(t *testing.T) {
	dir := t.TempDir()
	sp, err := openSpool(dir, 1<<20, slog.New(slog.DiscardHandler), func(entry) {})
	if err != nil {
		t.Fatal(err)
	}
	if o := sp.oldest(); !o.IsZero() {
		t.Fatalf("oldest of an empty spool = %s", o)
	}
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	sp.rollBytes = 1 // every batch a segment of its own
	write := func(at time.Duration, ids ...string) {
		t.Helper()
		var es []entry
		for _, id := range ids {
			es = append(es, entry{ID: id, Spooled: t0.Add(at).UnixNano(), Body: []byte(`{}`)})
		}
		app, _, _, err := sp.write(es, false)
		if err != nil || app == nil {
			t.Fatalf("write: %v", err)
		}
		sp.publish(app, false)
	}
	deliver := func(n int) {
		t.Helper()
		for range n {
			_, at, ok, err := sp.take()
			if !ok || err != nil {
				t.Fatalf("take: %v, %v", ok, err)
			}
			if err := sp.ack(at); err != nil {
				t.Fatal(err)
			}
		}
	}
	write(0, "a", "b")
	write(time.Second, "c")
	sp.rollBytes = 1 << 20 // the next two batches join the last segment
	write(2*time.Second, "d")
	write(3*time.Second, "e")
	for _, step := range []struct {
		deliver int
		want    time.Duration
	}{{0, 0}, {1, 0}, {1, time.Second}, {1, 2 * time.Second}, {1, 3 * time.Second}} {
		deliver(step.deliver)
		if o := sp.oldest(); !o.Equal(t0.Add(step.want)) {
			t.Errorf("after %d more delivered: oldest %s, want %s", step.deliver, o, t0.Add(step.want))
		}
	}
	if err := sp.saveCursor(true); err != nil {
		t.Fatal(err)
	}
	sp.close()
	reopened, err := openSpool(dir, 1<<20, slog.New(slog.DiscardHandler), func(entry) {})
	if err != nil {
		t.Fatal(err)
	}
	if o := reopened.oldest(); !o.Equal(t0.Add(3 * time.Second)) {
		t.Errorf("after a restart: oldest %s, want %s", o, t0.Add(3*time.Second))
	}
	sp = reopened
	deliver(1)
	if o := sp.oldest(); !o.IsZero() {
		t.Errorf("oldest of a drained spool = %s", o)
	}
}

// A webhook sink whose endpoint keeps refusing is shown failing, with its
// backlog and the age of its oldest event, by the fan-out's Statuses and
// the sink metrics, although every Deliver (which only spools) succeeds;
// before failingAfter it is shown healthy, but with its backlog queued.
func TestStatusComesFromTheSpool(t *testing.T) {
	const changes = 5
	tests := []struct {
		name         string
		failingAfter time.Duration
		wantHealthy  bool
	}{
		{name: "refused for less than failingAfter", failingAfter: time.Hour, wantHealthy: true},
		{name: "refused past failingAfter", failingAfter: 100 * time.Millisecond, wantHealthy: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rc, e := newAnsweringEnv(t, http.StatusServiceUnavailable)
			e.cfg.Webhook.FailingAfter = metav1.Duration{Duration: tt.failingAfter}
			var state []stream.Change
			for i := range changes {
				state = append(state, streamtest.Profile(stream.ProfileCreated, "ns", fmt.Sprintf("c%d", i), "1"))
			}
			begin := time.Now()
			// The sink's first delivery, a resync, spools the state.
			fan := startFanout(t, e, state)
			// The receiver sees a request before the sender records its
			// answer: wait for both.
			waitFor(t, "a few refusals, recorded", func() bool {
				return len(rc.all()) >= 3 && fan.Statuses()[0].LastResult != ""
			})
			if !tt.wantHealthy {
				waitFor(t, "the sink to fail", func() bool { return !fan.Statuses()[0].Healthy })
			}
			st := fan.Statuses()[0]
			if st.Healthy != tt.wantHealthy || st.QueueDepth != changes || st.Backlog != changes ||
				st.Oldest.Before(begin.Add(-time.Second)) || st.Oldest.After(time.Now()) ||
				st.LastResult != "503 Service Unavailable" || !st.LastSuccess.IsZero() {
				t.Errorf("status %+v; want healthy %v, %d queued since the test began, last result 503", st, tt.wantHealthy, changes)
			}
			if !tt.wantHealthy && (!strings.Contains(st.LastError, "503") || st.FailingSince.IsZero() || st.Failures < 3) {
				t.Errorf("failing status %+v does not say why and since when", st)
			}
			up := map[bool]float64{true: 1, false: 0}[tt.wantHealthy]
			if v := e.metric("hubsync_sink_up", nil); v != up {
				t.Errorf("hubsync_sink_up = %v, want %v", v, up)
			}
			if v := e.metric("hubsync_sink_queue_depth", nil); v != changes {
				t.Errorf("hubsync_sink_queue_depth = %v, want %d", v, changes)
			}
			if v := e.metric("hubsync_sink_oldest_waiting_timestamp_seconds", nil); v < float64(begin.Add(-time.Second).Unix()) {
				t.Errorf("hubsync_sink_oldest_waiting_timestamp_seconds = %v, want about %d", v, begin.Unix())
			}

			// The endpoint takes the backlog: healthy, nothing waits.
			rc.setHandle(answer(http.StatusNoContent))
			waitFor(t, "the backlog delivered", func() bool {
				st := fan.Statuses()[0]
				return st.Healthy && st.QueueDepth == 0 && st.Oldest.IsZero() && !st.LastSuccess.IsZero()
			})
			if v := e.metric("hubsync_sink_up", nil); v != 1 {
				t.Errorf("hubsync_sink_up = %v after the endpoint took the backlog", v)
			}
		})
	}
}

// A sink disabled by 410 Gone is failing at once, whatever failingAfter.
func TestGoneIsFailing(t *testing.T) {
	_, e := newAnsweringEnv(t, http.StatusGone)
	e.cfg.Webhook.FailingAfter = metav1.Duration{Duration: time.Hour}
	fan := startFanout(t, e, []stream.Change{streamtest.Profile(stream.ProfileCreated, "ns", "c", "1")})
	waitFor(t, "the sink to fail", func() bool { return !fan.Statuses()[0].Healthy })
	if st := fan.Statuses()[0]; !strings.Contains(st.LastError, "410 Gone") || !strings.Contains(st.LastError, "disabled") {
		t.Errorf("status %+v does not say the sink is disabled by a 410", st)
	}
}

// startFanout starts a fan-out, on the env's registry, whose current
// state is state, with the env's sink as its consumer, as sinks.Manager
// does; both end with the test.
func startFanout(t *testing.T, e *env, state []stream.Change) *stream.Fanout {
	t.Helper()
	fan, err := stream.NewFanout(nil, e.reg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() {
		c, done := context.WithTimeout(context.Background(), time.Second)
		defer done()
		_ = fan.Close(c)
		cancel()
	})
	if err := fan.Start(ctx, func() []stream.Change { return state }); err != nil {
		t.Fatal(err)
	}
	if err := fan.Add(config.ConsumerOptions(e.cfg.Name, e.cfg.Type), e.start()); err != nil {
		t.Fatal(err)
	}
	return fan
}
