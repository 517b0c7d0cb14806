package gateway

import (
	"context"
	"errors"
	"maps"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	promtestutil "github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/hubsync/hubsync/test/testutil"
)

// slowReviewer is a hub whose TokenReviews take latency on the test's
// clock, and fail while down.
type slowReviewer struct {
	next    Reviewer
	now     *time.Time
	latency time.Duration
	down    bool
}

func (r *slowReviewer) Review(ctx context.Context, token string) (Identity, bool, error) {
	*r.now = r.now.Add(r.latency)
	if r.down {
		return Identity{}, false, errors.New("hub unreachable")
	}
	return r.next.Review(ctx, token)
}

// TestTokenReviewDuration: every TokenReview sent to the hub is observed
// once, under its result and with the time the hub took; an answer from
// the review cache is not one. Every result has a series before the
// first review.
func TestTokenReviewDuration(t *testing.T) {
	const name = "hubsync_gateway_token_review_duration_seconds"
	w := newWorld(t)
	now := time.Unix(1000, 0)
	hub := &slowReviewer{next: w.reviewer(), now: &now}
	reg := prometheus.NewRegistry()
	g, err := New(configured(Options{Pool: w.pool(), Reviewer: hub, Registerer: reg, Now: func() time.Time { return now }}))
	if err != nil {
		t.Fatal(err)
	}
	type observed struct {
		count uint64
		sum   float64
	}
	results := []string{ReviewAuthenticated, ReviewUnauthenticated, ReviewError}
	want := map[string]observed{}
	steps := []struct {
		name     string
		token    string
		latency  time.Duration
		down     bool
		wantCode int
		// result is the series the step observes; "" for none.
		result string
	}{
		{name: "before any request"},
		{name: "a hub identity, asked", token: w.hubToken, latency: 30 * time.Millisecond, wantCode: http.StatusOK, result: ReviewAuthenticated},
		{name: "the same token, from the cache", token: w.hubToken, latency: time.Second, wantCode: http.StatusOK},
		{name: "a token the hub does not know", token: "unknown-token-0123", latency: 2 * time.Second, wantCode: http.StatusUnauthorized, result: ReviewUnauthenticated},
		{name: "the hub failing", token: "another-token-0123", latency: 10 * time.Second, down: true, wantCode: http.StatusServiceUnavailable, result: ReviewError},
		{name: "a second identity review", token: "nameless-token-0123", latency: 250 * time.Millisecond, wantCode: http.StatusUnauthorized, result: ReviewAuthenticated},
	}
	for _, s := range steps {
		if s.token != "" {
			hub.latency, hub.down = s.latency, s.down
			if code := serve(g, http.MethodGet, "/c1/api", bearer(s.token)).Code; code != s.wantCode {
				t.Fatalf("%s: answered %d; want %d", s.name, code, s.wantCode)
			}
		}
		if s.result != "" {
			o := want[s.result]
			want[s.result] = observed{count: o.count + 1, sum: o.sum + s.latency.Seconds()}
		}
		m, err := testutil.Gather(reg)
		if err != nil {
			t.Fatal(err)
		}
		for _, result := range results {
			var got *observed
			for _, mt := range m[name].GetMetric() {
				if labelOf(mt.GetLabel(), "result") == result {
					h := mt.GetHistogram()
					got = &observed{count: h.GetSampleCount(), sum: h.GetSampleSum()}
				}
			}
			switch {
			case got == nil:
				t.Fatalf("%s: no %s{result=%q} series; want one from the start", s.name, name, result)
			case got.count != want[result].count || !closeTo(got.sum, want[result].sum):
				t.Fatalf("%s: %s{result=%q} holds %d reviews taking %gs; want %d taking %gs",
					s.name, name, result, got.count, got.sum, want[result].count, want[result].sum)
			}
		}
	}
}

// TestRequestsByClusterSet: a request is counted, and its duration
// observed, under the ManagedClusterSet of its cluster as the pool names
// it; a cluster in no set, and a request with no known cluster, under "".
func TestRequestsByClusterSet(t *testing.T) {
	w := newWorld(t)
	tests := []struct {
		name    string
		path    string
		code    int
		cluster string
		set     string
		mode    string
	}{
		{name: "a cluster of set prod", path: "/c1/api", code: http.StatusOK, cluster: "c1", set: "prod", mode: modeImpersonate},
		{name: "a cluster in no set", path: "/c2/api", code: http.StatusOK, cluster: "c2", set: "", mode: modeImpersonate},
		{name: "a failing cluster of set edge", path: "/down/api", code: http.StatusServiceUnavailable, cluster: "down", set: "edge", mode: modeImpersonate},
		{name: "a cluster not served", path: "/nowhere/api", code: http.StatusNotFound, cluster: "", set: "", mode: modeImpersonate},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			g, err := New(configured(Options{Pool: w.pool(), Reviewer: w.reviewer(), Registerer: reg}))
			if err != nil {
				t.Fatal(err)
			}
			if rec := serve(g, http.MethodGet, tt.path, bearer(w.hubToken)); rec.Code != tt.code {
				t.Fatalf("answered %d %s; want %d", rec.Code, rec.Body, tt.code)
			}
			m, err := testutil.Gather(reg)
			if err != nil {
				t.Fatal(err)
			}
			for name, want := range map[string]map[string]string{
				"hubsync_gateway_requests_total":           {"cluster": tt.cluster, "cluster_set": tt.set, "code": strconv.Itoa(tt.code), "mode": tt.mode},
				"hubsync_gateway_request_duration_seconds": {"cluster_set": tt.set, "mode": tt.mode},
			} {
				series := m[name].GetMetric()
				if len(series) != 1 {
					t.Fatalf("%s has %d series; want 1:\n%s", name, len(series), m.Text())
				}
				if got := labelsOf(series[0]); !maps.Equal(got, want) {
					t.Errorf("%s: labels %v; want %v", name, got, want)
				}
				if v := m.Value(name, nil); v != 1 {
					t.Errorf("%s counts %v requests; want 1", name, v)
				}
			}
		})
	}
}

func labelsOf(s *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, p := range s.GetLabel() {
		out[p.GetName()] = p.GetValue()
	}
	return out
}

func labelOf(pairs []*dto.LabelPair, name string) string {
	for _, p := range pairs {
		if p.GetName() == name {
			return p.GetValue()
		}
	}
	return ""
}

func closeTo(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 }

// The fixed label values have their series from the start, so that
// rate() and an alert on them see 0 before the first request.
func TestFixedSeriesFromStart(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	if _, err := newMetrics(reg); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]int{
		"hubsync_gateway_token_reviews_total":        5,
		"hubsync_gateway_drain_ended_requests_total": 3,
	} {
		n, err := promtestutil.GatherAndCount(reg, name)
		if err != nil {
			t.Fatal(err)
		}
		if n != want {
			t.Errorf("%s has %d series before any request; want %d", name, n, want)
		}
	}
}
