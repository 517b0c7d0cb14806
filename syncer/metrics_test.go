package syncer

import (
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// hubsync_queue_depth is one family with a series per tracked queue, each
// read from its queue when scraped.
func TestQueueDepth(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m := newMetrics(reg)
	topology, credentials := 3, 0
	m.queueDepth.track("topology", func() int { return topology })
	m.queueDepth.track("credentials", func() int { return credentials })
	for _, tc := range []struct {
		name                  string
		topology, credentials int
	}{
		{"as tracked", 3, 0},
		{"read again at the next scrape", 0, 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			topology, credentials = tc.topology, tc.credentials
			want := `
# HELP hubsync_queue_depth Keys waiting in a work queue, by queue (topology, credentials).
# TYPE hubsync_queue_depth gauge
hubsync_queue_depth{queue="credentials"} ` + strconv.Itoa(tc.credentials) + `
hubsync_queue_depth{queue="topology"} ` + strconv.Itoa(tc.topology) + `
`
			if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "hubsync_queue_depth"); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// Every write operation has its series from the start, so that rate() and
// an alert on refused writes see 0 before the first write.
func TestWriteSeriesFromStart(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	newMetrics(reg)
	for name, want := range map[string]int{
		"hubsync_profile_writes_total":       len(profileOps),
		"hubsync_profile_write_errors_total": len(profileOps) + len(credentialOps),
	} {
		n, err := testutil.GatherAndCount(reg, name)
		if err != nil {
			t.Fatal(err)
		}
		if n != want {
			t.Errorf("%s has %d series before any write; want %d", name, n, want)
		}
	}
}
