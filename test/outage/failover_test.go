package outage

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/events"
	"github.com/hubsync/hubsync/test/fleet"
	"github.com/hubsync/hubsync/test/testutil"
)

// TestFailover runs two replicas with leader election on the real API
// server and an external NATS, and kills the leader with SIGKILL in the
// middle of a burst of 1000 new clusters: the standby takes over within
// the lease duration, the hub converges, and every profile has exactly
// one creation event (a change published by both replicas has one id,
// stored once).
func TestFailover(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	r := newNATSRig(ctx, t, "team-a")
	ns, cp, hub, hubsyncBin := r.ns, r.cp, r.hub, r.hubsyncBin
	must(hub.Namespace(ctx, "open-cluster-management-hub"))

	conf := config.Config{}
	conf.Bus.URLs = []string{"nats://" + ns.addr}
	conf.LeaderElection.Enabled = true
	const lease = 6 * time.Second
	conf.LeaderElection.LeaseDuration.Duration = lease
	conf.LeaderElection.RenewDeadline.Duration = 4 * time.Second
	conf.LeaderElection.RetryPeriod.Duration = 500 * time.Millisecond
	var logs [2]fleet.LogBuffer
	var ds [2]*fleet.Daemon
	var err error
	for i := range ds {
		ds[i], err = fleet.StartDaemon(ctx, hubsyncBin, cp.Config, conf, &logs[i])
		must(err)
		defer func() { _ = ds[i].Stop() }()
		if err := ds[i].WaitReady(ctx, 60*time.Second); err != nil {
			t.Fatalf("replica %d not ready: %v\n%s", i, err, logs[i].String())
		}
	}
	leader, standby := -1, -1
	err = testutil.Poll(ctx, 30*time.Second, 50*time.Millisecond, func() bool {
		switch {
		case ds[0].Leading() && !ds[1].Leading():
			leader, standby = 0, 1
		case ds[1].Leading() && !ds[0].Leading():
			leader, standby = 1, 0
		default:
			return false
		}
		return strings.Contains(logs[standby].String(), "another replica leads; standing by")
	})
	if err != nil {
		t.Fatalf("no single leader with a standby\n%s\n%s", logs[0].String(), logs[1].String())
	}

	// The burst: 1000 clusters, 16 at a time.
	const total = 1000
	profiles := func() int {
		names, err := hub.ProfileNames(ctx, "team-a")
		if err != nil {
			return -1
		}
		return len(names)
	}
	burst := make(chan error, 1)
	go func() {
		var wg sync.WaitGroup
		errs := make(chan error, total)
		next := make(chan int)
		for range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range next {
					if _, err := hub.CreateCluster(ctx, fleet.ClusterSpec{Name: fmt.Sprintf("c%04d", i), Labels: fleet.ExclusiveSetLabels("fleet", nil)}); err != nil {
						errs <- err
					}
				}
			}()
		}
		for i := range total {
			next <- i
		}
		close(next)
		wg.Wait()
		close(errs)
		burst <- <-errs
	}()
	err = testutil.Poll(ctx, 2*time.Minute, 100*time.Millisecond, func() bool {
		return profiles() >= total/4
	})
	must(err)
	must(ds[leader].Kill())
	killed := time.Now()
	atKill := profiles()
	t.Logf("leader (replica %d) killed with SIGKILL at %d of %d profiles", leader, atKill, total)
	if atKill >= total {
		t.Fatal("the burst was over before the leader was killed")
	}

	// The standby takes over within the lease duration (plus a retry
	// period and slack: a sanity bound, the figure is logged).
	err = testutil.Poll(ctx, 2*lease, 50*time.Millisecond, func() bool {
		return ds[standby].Leading()
	})
	if err != nil {
		t.Fatalf("the standby did not take over within %s\n%s", 2*lease, logs[standby].String())
	}
	takeover := time.Since(killed)
	t.Logf("standby leads %s after the kill (lease duration %s)", takeover.Round(time.Millisecond), lease)
	if takeover > lease+2*time.Second {
		t.Errorf("takeover took %s, beyond the lease duration %s", takeover.Round(time.Millisecond), lease)
	}
	must(<-burst)

	// The hub converges: every profile, each with its status.
	err = testutil.Poll(ctx, 3*time.Minute, 200*time.Millisecond, func() bool {
		ps, err := hub.ProfilesIn(ctx, "team-a")
		if err != nil || len(ps) != total {
			return false
		}
		for _, p := range ps {
			if len(p.Status.Conditions) == 0 || p.Status.Version.Kubernetes == "" {
				return false
			}
		}
		return true
	})
	if err != nil {
		t.Fatalf("the hub did not converge after the failover: %d profiles\n%s", profiles(), logs[standby].String())
	}

	// Every profile has exactly one creation event in the stream, and
	// nothing was deleted.
	nc, err := nats.Connect("nats://" + ns.addr)
	must(err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	must(err)
	def := config.Default().Bus
	created := map[string]map[string]bool{} // subject -> ids
	types := map[string][]string{}          // subject -> event types, in order
	var deleted []string
	err = testutil.Poll(ctx, time.Minute, 500*time.Millisecond, func() error {
		st, err := js.Stream(ctx, def.Stream.Name)
		if err != nil {
			return err
		}
		info, err := st.Info(ctx)
		if err != nil {
			return err
		}
		created, deleted, types = map[string]map[string]bool{}, nil, map[string][]string{}
		for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
			m, err := st.GetMsg(ctx, seq)
			if err != nil {
				continue
			}
			if err := events.ValidateEvent(m.Data); err != nil {
				return testutil.Stop(err)
			}
			var e struct {
				ID, Type, Subject string
			}
			if err := json.Unmarshal(m.Data, &e); err != nil {
				return testutil.Stop(err)
			}
			types[e.Subject] = append(types[e.Subject], strings.TrimPrefix(e.Type, "io.hubsync."))
			switch e.Type {
			case "io.hubsync.profile.created":
				if created[e.Subject] == nil {
					created[e.Subject] = map[string]bool{}
				}
				created[e.Subject][e.ID] = true
			case "io.hubsync.profile.deleted":
				deleted = append(deleted, e.Subject)
			}
		}
		if len(created) < total {
			return fmt.Errorf("creation events for %d of %d profiles in the stream", len(created), total)
		}
		return nil
	})
	if err != nil {
		t.Errorf("reading the stream: %v", err)
	}
	for subject, ids := range created {
		if len(ids) != 1 {
			t.Errorf("%s: %d different creation events (ids %v): created twice", subject, len(ids), ids)
		}
	}
	if len(deleted) > 0 {
		t.Errorf("%d profiles were deleted during the failover, e.g. %s", len(deleted), deleted[0])
	}
	for i := range total {
		if s := fmt.Sprintf("team-a/c%04d", i); created[s] == nil {
			t.Errorf("no creation event for %s; its events: %v", s, types[s])
		}
	}
	if t.Failed() {
		t.Logf("standby's log:\n%s", logs[standby].String())
	}
}
