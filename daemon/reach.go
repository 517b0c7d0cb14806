package daemon

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/runtime"

	"github.com/hubsync/hubsync/stream"
)

// The reach half runs on every replica, leader or not: the tunnel pool
// follows the hub's profiles and clusters itself, and the gateway serves
// over it, so that every replica serves requests and a rolling update or
// a lost pod fails none that has not started.

// startReach starts the tunnel pool's informers and lets it dial. A
// replica reports ready only once the pool is warm (see warm).
func (d *daemon) startReach(ctx context.Context) error {
	if d.pool == nil {
		return nil
	}
	d.reach = newTask(context.WithoutCancel(ctx)) // stopped in shutdown, after the gateway
	d.goRun(d.reach, "tunnel pool", func(ctx context.Context) error {
		start := time.Now()
		if err := d.poolSrc.Run(ctx); err != nil {
			return err
		}
		d.pool.Start(ctx)
		d.poolSynced.Store(true)
		_, total := d.pool.Pending()
		d.log.Info("tunnel pool started", "transport", d.cfg.Tunnel.Transport, "warm", d.cfg.Tunnel.Warm, "clusters", total,
			"managedServiceAccount", d.cfg.Tunnel.ManagedServiceAccount, "probeInterval", d.cfg.Tunnel.ProbeInterval.Duration)
		d.warmUp(ctx, start)
		<-ctx.Done()
		return nil
	})
	return nil
}

// warmUp waits until every entry has dialed once (ready or failing), up to
// the warm-up timeout, then lets the replica report ready.
func (d *daemon) warmUp(ctx context.Context, start time.Time) {
	wait, cancel := context.WithTimeout(ctx, d.cfg.Tunnel.WarmupTimeout.Duration-time.Since(start))
	defer cancel()
	err := d.pool.WaitWarm(wait)
	if ctx.Err() != nil {
		return
	}
	connecting, total := d.pool.Pending()
	if err != nil {
		d.log.Warn("tunnel pool not warm within the warm-up timeout; reporting ready, requests for the clusters still connecting wait for them",
			"timeout", d.cfg.Tunnel.WarmupTimeout.Duration, "connecting", connecting, "clusters", total)
	} else {
		d.log.Info("tunnel pool warm", "clusters", total, "took", time.Since(start).Round(time.Millisecond))
	}
	d.warmed.Store(true)
}

// warm says whether the pool is warm enough for gateway traffic: every
// entry dialed once, or the warm-up timeout passed. No pool is warm.
func (d *daemon) warm() (bool, string) {
	switch {
	case d.pool == nil || d.warmed.Load():
		return true, ""
	case !d.poolSynced.Load():
		return false, "tunnel pool: learning the hub's clusters"
	}
	connecting, total := d.pool.Pending()
	return false, fmt.Sprintf("tunnel pool warming: %d of %d clusters connecting", connecting, total)
}

// serving says whether the gateway can serve: once the pool knows the
// hub's clusters, so that no cluster is answered "not served" merely
// because it is not loaded yet. Requests for a cluster still connecting
// wait for it in the gateway.
func (d *daemon) serving() (bool, string) {
	if d.poolSynced.Load() {
		return true, ""
	}
	return false, "the tunnel pool is starting: it has not yet learnt the hub's clusters"
}

// leaderOnly passes the pool's tunnel changes to the stream while this
// replica leads; a standby's pool keeps its entries quiet. A replica that
// starts leading announces every entry (Pool.Announce).
type leaderOnly struct{ d *daemon }

func (l leaderOnly) Notify(c stream.Change) {
	if l.d.leading.Load() {
		l.d.fan.Notify(c)
	}
}

// leaderEvents posts the pool's Kubernetes Events (TunnelFailing,
// TunnelReady) while this replica leads, as its tunnel changes: the hub
// hears of each cluster once, not from every replica.
type leaderEvents struct{ d *daemon }

func (l leaderEvents) Event(obj runtime.Object, eventtype, reason, message string) {
	if l.d.leading.Load() {
		l.d.recorder.Event(obj, eventtype, reason, message)
	}
}

func (l leaderEvents) Eventf(obj runtime.Object, eventtype, reason, messageFmt string, args ...any) {
	if l.d.leading.Load() {
		l.d.recorder.Eventf(obj, eventtype, reason, messageFmt, args...)
	}
}

func (l leaderEvents) AnnotatedEventf(obj runtime.Object, annotations map[string]string, eventtype, reason, messageFmt string, args ...any) {
	if l.d.leading.Load() {
		l.d.recorder.AnnotatedEventf(obj, annotations, eventtype, reason, messageFmt, args...)
	}
}
