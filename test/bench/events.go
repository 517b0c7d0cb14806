package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/test/controlplane"
	"github.com/hubsync/hubsync/test/fleet"
	"github.com/hubsync/hubsync/test/testutil"
)

// converge starts hubsync and waits for every profile to have full status;
// it returns the daemon and the time from its caches being synced. attach,
// if given, is called with the daemon before convergence is awaited.
func converge(ctx context.Context, cp *controlplane.ControlPlane, w *tracker, binary string, conf config.Config, logs io.Writer,
	profiles int, floor time.Duration, attach ...func(*fleet.Daemon) error) (*fleet.Daemon, time.Duration, error) {
	start := time.Now()
	d, err := fleet.StartDaemon(ctx, binary, cp.Config, conf, logs)
	if err != nil {
		return nil, 0, err
	}
	readyAt := d.ReadyAt(ctx)
	for _, a := range attach {
		if err := a(d); err != nil {
			_ = d.Stop()
			return nil, 0, err
		}
	}
	if err := w.waitCount(ctx, d.Done(), profiles, 10*time.Minute); err != nil {
		_ = d.Stop()
		return nil, 0, err
	}
	total := time.Since(start)
	ready := <-readyAt
	fromReady := time.Since(ready)
	fmt.Printf("initial convergence: %d profiles with full status %s after hubsync's caches synced (%s after process start)\n",
		profiles, fromReady.Round(time.Millisecond), total.Round(time.Millisecond))
	fmt.Printf("  ratio to floor: %.2fx from caches synced, %.2fx from process start (goal <= 1.5x)\n",
		fromReady.Seconds()/floor.Seconds(), total.Seconds()/floor.Seconds())
	fmt.Printf("  timeline from caches synced: %s\n", describeTimeline(ready, w.timeline()))
	if m, err := d.Metrics(); err == nil {
		fmt.Printf("  hubsync writes: %s\n", metricLines(m, "hubsync_profile_writes_total{", "hubsync_profile_write_errors_total{"))
		fmt.Printf("  hubsync reconciles: %s\n", metricLines(m, `hubsync_reconcile_total{controller="topology"`))
		if line := metricLines(m, "hubsync_bus_publish_batch_size_sum", "hubsync_bus_publish_batch_size_count"); line != "" {
			fmt.Printf("  event batches: %s\n", line)
		}
	}
	if cpu, err := d.CPUTime(); err == nil {
		fmt.Printf("  hubsync CPU time so far: %s\n", cpu.Round(10*time.Millisecond))
	}
	return d, fromReady, nil
}

// deleteProfiles removes every profile from the consumer namespaces and
// waits until they are gone.
func deleteProfiles(ctx context.Context, hub *fleet.Hub, namespaces int) error {
	for i := range namespaces {
		if err := hub.Profiles.ApisV1alpha1().ClusterProfiles(nsName(i)).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
			return err
		}
	}
	return wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		for i := range namespaces {
			names, err := hub.ProfileNames(ctx, nsName(i))
			if err != nil || len(names) > 0 {
				return false, nil
			}
		}
		return true, nil
	})
}

// eventCounter subscribes to every event subject of a daemon's bus, as a
// consumer would, and records when each event arrives.
type eventCounter struct {
	mu      sync.Mutex
	nc      *nats.Conn
	n       int
	first   time.Time
	last    time.Time
	waiters map[string]chan time.Time // "<namespace>/<cluster>" -> next event arrival
}

func newEventCounter() *eventCounter {
	return &eventCounter{waiters: map[string]chan time.Time{}}
}

// close ends the subscription, once its daemon has stopped.
func (c *eventCounter) close() {
	if c.nc != nil {
		c.nc.Close()
	}
}

// attach connects to the daemon's NATS once it accepts connections and
// follows hubsync.> from then on.
func (c *eventCounter) attach(d *fleet.Daemon) error {
	var nc *nats.Conn
	err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		var err error
		nc, err = nats.Connect(d.NATSURL)
		return err == nil, nil
	})
	if err != nil {
		return fmt.Errorf("connect to the event bus at %s: %w", d.NATSURL, err)
	}
	c.nc = nc
	js, err := nc.JetStream()
	if err != nil {
		return err
	}
	handle := func(m *nats.Msg) {
		at := time.Now()
		var e struct {
			Subject string `json:"subject"`
		}
		_ = json.Unmarshal(m.Data, &e)
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.n == 0 {
			c.first = at
		}
		c.n++
		c.last = at
		if ch := c.waiters[e.Subject]; ch != nil {
			delete(c.waiters, e.Subject)
			ch <- at
		}
	}
	return followNew(js, handle)
}

// followNew follows the bus as an application does: an ordered consumer
// of its copy of the stream (nats sub 'hubsync.>' --new), made once
// hubsync has made the copy (beside publishing).
func followNew(js nats.JetStreamContext, handle nats.MsgHandler) error {
	return wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		_, err := js.Subscribe("hubsync.>", handle, nats.OrderedConsumer(), nats.DeliverNew())
		return err == nil, nil
	})
}

func (c *eventCounter) stats() (int, time.Time, time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n, c.first, c.last
}

// waitQuiet waits until no event has arrived for quiet.
func (c *eventCounter) waitQuiet(quiet time.Duration) error {
	err := testutil.Poll(context.Background(), 5*time.Minute, 100*time.Millisecond, func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.n > 0 && time.Since(c.last) > quiet
	})
	if err != nil {
		return fmt.Errorf("events never went quiet: %w", err)
	}
	return nil
}

// next returns a channel that receives the arrival time of the next event
// about subject "<namespace>/<cluster>".
func (c *eventCounter) next(subject string) <-chan time.Time {
	ch := make(chan time.Time, 1)
	c.mu.Lock()
	c.waiters[subject] = ch
	c.mu.Unlock()
	return ch
}

// eventLatency flips clusters' availability and times, for each change,
// the arrival of the profile.updated event in the first namespace: from
// the start of the hub write and from its end, at a NATS subscriber and at
// the webhook sink's receiver.
func eventLatency(ctx context.Context, hub *fleet.Hub, sub *eventCounter, hook *hookReceiver, nClusters, n int) error {
	fromStart := make([]time.Duration, 0, n)
	fromEnd := make([]time.Duration, 0, n)
	hookEnd := make([]time.Duration, 0, n)
	for i := range n {
		name := clusterName(i * 13 % nClusters)
		status := metav1.ConditionFalse
		if (i/nClusters)%2 == 1 {
			status = metav1.ConditionTrue
		}
		arrived := sub.next(nsName(0) + "/" + name)
		hooked := hook.next("io.hubsync.profile.updated", nsName(0)+"/"+name)
		t0 := time.Now()
		if err := hub.SetAvailable(ctx, name, status); err != nil {
			return err
		}
		t1 := time.Now()
		select {
		case at := <-arrived:
			fromStart = append(fromStart, at.Sub(t0))
			fromEnd = append(fromEnd, at.Sub(t1))
		case <-time.After(30 * time.Second):
			return fmt.Errorf("no event for %s within 30s", name)
		}
		select {
		case at := <-hooked:
			hookEnd = append(hookEnd, at.Sub(t1))
		case <-time.After(30 * time.Second):
			return fmt.Errorf("no webhook delivery for %s within 30s", name)
		}
	}
	for _, l := range [][]time.Duration{fromStart, fromEnd, hookEnd} {
		sort.Slice(l, func(i, j int) bool { return l[i] < l[j] })
	}
	fmt.Printf("hub change -> event at a subscriber, over %d changes: beyond the hub write p50 %s p99 %s (goal p99 < 100ms); including the write p50 %s p99 %s\n",
		n, pct(fromEnd, 50), pct(fromEnd, 99), pct(fromStart, 50), pct(fromStart, 99))
	fmt.Printf("hub change -> webhook delivered (POST received), over %d changes: beyond the hub write p50 %s p99 %s (goal p99 < 100ms on loopback)\n",
		n, pct(hookEnd, 50), pct(hookEnd, 99))
	return nil
}
