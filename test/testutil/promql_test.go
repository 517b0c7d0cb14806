package testutil

import (
	"reflect"
	"testing"
)

func TestMetricNames(t *testing.T) {
	for _, tc := range []struct {
		name, expr string
		want       []string
	}{
		{"bare name", `hubsync_leader`, []string{"hubsync_leader"}},
		{"rate over a Grafana interval", `rate(hubsync_reconcile_total[$__rate_interval])`, []string{"hubsync_reconcile_total"}},
		{"label matchers with operators, commas and braces in values",
			`hubsync_gateway_requests_total{job=~"$job", code=~"5..", mode!="refused", x="a}b,c{d"}`,
			[]string{"hubsync_gateway_requests_total"}},
		{"histogram_quantile of _bucket, grouping before the argument",
			`histogram_quantile(0.99, sum by (le, mode) (rate(hubsync_gateway_request_duration_seconds_bucket{pod=~"${pod:regex}"}[5m])))`,
			[]string{"hubsync_gateway_request_duration_seconds_bucket"}},
		{"grouping after the argument", `sum(rate(hubsync_sink_delivered_total[1m])) by (sink, type)`,
			[]string{"hubsync_sink_delivered_total"}},
		{"without", `max without (instance, pod) (hubsync_tunnel_entries)`, []string{"hubsync_tunnel_entries"}},
		{"functions, aggregations and keywords are not metrics",
			`topk(10, time() - max by (sink) (hubsync_sink_oldest_waiting_timestamp_seconds > 0)) and on (sink) absent(hubsync_sink_up) or vector(0) unless count_values("v", up) offset 5m`,
			[]string{"hubsync_sink_oldest_waiting_timestamp_seconds", "hubsync_sink_up", "up"}},
		{"a function name not followed at once by its parenthesis",
			`sum (increase (hubsync_bus_publish_errors_total [10m]))`, []string{"hubsync_bus_publish_errors_total"}},
		{"one-to-many matching", `a_total * on (cluster) group_left (state) b_info == bool 1`, []string{"a_total", "b_info"}},
		{"strings are not metrics", `label_replace(hubsync_tunnel_state, "c", "$1", "cluster", "(not_a_metric.*)")`,
			[]string{"hubsync_tunnel_state"}},
		{"numbers, exponents, durations and subqueries",
			`hubsync_x > 1e-3 + 0.5 * 0x1f and max_over_time(hubsync_y[1h30m:5m]) < Inf`, []string{"hubsync_x", "hubsync_y"}},
		{"a name twice, a recording rule's colon and a comment",
			"job:hubsync_requests:rate5m + job:hubsync_requests:rate5m # hubsync_commented_out", []string{"job:hubsync_requests:rate5m"}},
		{"nothing", `vector(1)`, []string{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := MetricNames(tc.expr)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("MetricNames(%s) = %q; want %q", tc.expr, got, tc.want)
			}
		})
	}
}

func TestMetricNamesRefusesUnbalanced(t *testing.T) {
	for _, expr := range []string{`sum by (le (x)`, `x{a="b"`, `x{a="b}`, `rate(x[5m)`} {
		if names, err := MetricNames(expr); err == nil {
			t.Errorf("MetricNames(%s) = %q; want an error", expr, names)
		}
	}
}

func TestMetricsExposes(t *testing.T) {
	m, err := ParseMetrics(`# TYPE h histogram
h_bucket{le="1"} 1
h_bucket{le="+Inf"} 1
h_sum 0.5
h_count 1
# TYPE s summary
s{quantile="0.5"} 1
s_sum 1
s_count 1
# TYPE c_count counter
c_count 3
# TYPE g gauge
g 1
`)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]bool{
		"h": true, "h_bucket": true, "h_sum": true, "h_count": true,
		"s": true, "s_sum": true, "s_count": true, "s_bucket": false,
		"c_count": true, "c": false, "g": true, "g_sum": false, "g_count": false,
		"missing": false, "missing_bucket": false,
	} {
		if got := m.Exposes(name); got != want {
			t.Errorf("Exposes(%s) = %v; want %v", name, got, want)
		}
	}
}
