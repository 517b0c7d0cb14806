package daemon

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestLeaderInfo: hubsync_leader_info has no series before a leader is
// seen, then exactly one: the holder as the election's record says at the
// scrape.
func TestLeaderInfo(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	info := &leaderInfo{}
	reg.MustRegister(info)
	const head = "# HELP hubsync_leader_info 1, labelled with the identity holding the leader Lease as this replica last saw it (this replica's own without leader election).\n# TYPE hubsync_leader_info gauge\n"
	if err := testutil.GatherAndCompare(reg, strings.NewReader(""), "hubsync_leader_info"); err != nil {
		t.Fatalf("before the election: %v", err)
	}
	var holder string
	info.follow(func() string { return holder })
	for _, tc := range []struct{ name, holder, want string }{
		{"no leader observed yet", "", ""},
		{"a leader", "pod-a_1", head + `hubsync_leader_info{identity="pod-a_1"} 1` + "\n"},
		{"another takes over", "pod-b_2", head + `hubsync_leader_info{identity="pod-b_2"} 1` + "\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			holder = tc.holder
			if err := testutil.GatherAndCompare(reg, strings.NewReader(tc.want), "hubsync_leader_info"); err != nil {
				t.Fatal(err)
			}
		})
	}
}
