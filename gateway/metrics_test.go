package gateway

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

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
		n, err := testutil.GatherAndCount(reg, name)
		if err != nil {
			t.Fatal(err)
		}
		if n != want {
			t.Errorf("%s has %d series before any request; want %d", name, n, want)
		}
	}
}
