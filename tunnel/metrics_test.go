package tunnel

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
)

// perCluster returns every sample labelled with a cluster, as
// "name{labels} value" lines.
func perCluster(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if !hasLabel(m, "cluster") {
				continue
			}
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			out[mf.GetName()+"{"+strings.Join(labels, ",")+"}"] = m.GetGauge().GetValue()
		}
	}
	return out
}

func hasLabel(m *dto.Metric, name string) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return true
		}
	}
	return false
}

// A ready entry's per-cluster series do not change from scrape to scrape
// while its state stays: with thousands of clusters, a value that moves
// every scrape (how long the state has lasted, the last probe's round
// trip) costs a fresh sample per cluster each time. The since-timestamp
// is the moment the entry entered its state.
func TestPerClusterSeriesChangeOnlyWithState(t *testing.T) {
	ca := newTestCA(t)
	s := newFakeAPIServer(t, ca, "m")
	reg := prometheus.NewRegistry()
	p, _ := newTestPool(t, func(o *Options) { o.Registerer = reg })
	p.SetTarget("m", target(s, ca, "secret-token"))
	p.SetSelected("m", true)
	eventually(t, "ready", func() bool { return state(p, "m") == StateReady })

	first := perCluster(t, reg)
	// Probes run every 100ms in the test pool: a few of them later, time
	// has passed and the probe round trip has been measured again.
	probes := func() float64 { return testutil.ToFloat64(p.m.probes.WithLabelValues("ok")) }
	before := probes()
	eventually(t, "more probes", func() bool { return probes() >= before+3 })
	if state(p, "m") != StateReady {
		t.Fatal("the entry left ready while probing")
	}
	second := perCluster(t, reg)

	want := map[string]bool{
		"hubsync_tunnel_state{cluster=m,state=ready}":             true,
		"hubsync_tunnel_state_since_timestamp_seconds{cluster=m}": true,
	}
	for k := range second {
		if !want[k] {
			t.Errorf("per-cluster series %s: want only %v", k, want)
		}
	}
	for k := range want {
		if _, ok := second[k]; !ok {
			t.Errorf("per-cluster series %s missing from %v", k, second)
		}
	}
	for k, v := range second {
		if first[k] != v {
			t.Errorf("%s changed between scrapes with no change of state: %v, then %v", k, first[k], v)
		}
	}
	st, _ := p.Status("m")
	since := second["hubsync_tunnel_state_since_timestamp_seconds{cluster=m}"]
	if got := time.Unix(0, int64(math.Round(since*1e9))); got.Sub(st.Since).Abs() > time.Microsecond {
		t.Errorf("since timestamp %v, want the status's %v", got, st.Since)
	}
}

// The redial backoff doubles from base up to max, each wait drawn from the
// upper half of its step.
func TestRedialBackoff(t *testing.T) {
	for _, tc := range []struct {
		name      string
		base, max time.Duration
		steps     []time.Duration // the upper bound of each wait
	}{
		{"defaults", time.Second, 30 * time.Second, []time.Duration{
			time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 30 * time.Second, 30 * time.Second,
		}},
		{"test pool", 20 * time.Millisecond, 200 * time.Millisecond, []time.Duration{
			20 * time.Millisecond, 40 * time.Millisecond, 80 * time.Millisecond, 160 * time.Millisecond, 200 * time.Millisecond, 200 * time.Millisecond,
		}},
		{"base is max", time.Second, time.Second, []time.Duration{time.Second, time.Second, time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Jitter is random: many runs show both halves of the bound are
			// kept, and that the waits are spread rather than fixed.
			spread := make([]bool, len(tc.steps))
			for range 200 {
				b := redialBackoff(tc.base, tc.max)
				for i, upper := range tc.steps {
					d := b.Step()
					if d < upper/2 || d > upper {
						t.Fatalf("wait %d = %v, want within [%v, %v]", i, d, upper/2, upper)
					}
					if d != upper/2 {
						spread[i] = true
					}
				}
			}
			for i, ok := range spread {
				if !ok {
					t.Errorf("wait %d was always %v: no jitter", i, tc.steps[i]/2)
				}
			}
		})
	}
}

// Every result and state has its series from the start, so that rate()
// and an alert on errors see 0 before the first dial.
func TestResultSeriesFromStart(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	if _, err := newMetrics(reg, func() []Status { return nil }); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]int{
		"hubsync_tunnel_dials_total":         2,
		"hubsync_tunnel_probes_total":        3,
		"hubsync_tunnel_requests_total":      2,
		"hubsync_tunnel_upgrade_dials_total": 3,
		"hubsync_tunnel_transitions_total":   3,
	} {
		n, err := testutil.GatherAndCount(reg, name)
		if err != nil {
			t.Fatal(err)
		}
		if n != want {
			t.Errorf("%s has %d series before any dial; want %d", name, n, want)
		}
	}
}
