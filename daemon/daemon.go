// Package daemon runs hubsync: it builds the change stream and its
// consumers (the NATS bus, the sinks, the tunnel pool), serves health and
// metrics, waits for the hub's APIs, probes the hub, serves the access
// gateway, reloads the configuration file, and runs the syncer while this
// replica holds the leader lease. Run is what `hubsync run` calls, and
// what tests call in-process.
//
// The tunnel pool and the gateway run on every replica; the syncer, the
// change stream's consumers (bus, sinks) and the tunnel changes run on
// the leader only.
//
// Every goroutine Run starts has an owner that stops it and waits for it,
// and Run returns only once all have stopped. On a stop /readyz fails at
// once, and two things happen side by side: the leader's part stops (the
// syncer, then the lease is released so that another replica takes over
// at once; the reloader; the consumers deliver what was notified, for a
// few seconds, and close), while the gateway keeps serving for the drain
// delay, then drains its requests; the tunnel pool closes after the
// gateway; the hub probe and the health server stop last.
//
// Owns: the start-up order, leader election, /healthz, /readyz and
// /metrics, the hub probe, configuration reloads, the shutdown order. It
// may import every product package but cmd; only cmd imports it.
package daemon

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"
	clusterclient "open-cluster-management.io/api/client/cluster/clientset/versioned"
	cpclient "sigs.k8s.io/cluster-inventory-api/client/clientset/versioned"

	"github.com/hubsync/hubsync/bus"
	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/hubcache"
	"github.com/hubsync/hubsync/sinks"
	"github.com/hubsync/hubsync/stream"
	"github.com/hubsync/hubsync/syncer"
	"github.com/hubsync/hubsync/tunnel"
)

// Options are what Run needs besides the configuration.
type Options struct {
	// Log receives the daemon's logs; nil discards them.
	Log *slog.Logger
	// ConfigPath is the file the configuration was loaded from, watched
	// for reloads; empty: no reloads.
	ConfigPath string
	// Override applies the command line's flags to a reloaded
	// configuration, as they were applied to the first.
	Override func(*config.Config)
	// Version is the build's version, for logs, the hub clients' user
	// agent and hubsync_build_info; Commit, the commit it was built from.
	Version, Commit string
	// Sinks are the sink types the daemon can run, by configuration type;
	// nil: every built-in type (Sinks()).
	Sinks map[string]sinks.Factory
}

// drainTimeout bounds how long the consumers get on shutdown to deliver
// what is queued; a consumer left behind resyncs at the next start.
const drainTimeout = 3 * time.Second

// daemon is one run: what the start steps build, and the tasks that
// shutdown stops.
type daemon struct {
	cfg  *config.Config
	opts Options
	log  *slog.Logger
	reg  *prometheus.Registry

	restCfg  *rest.Config
	kube     kubernetes.Interface
	clusters clusterclient.Interface
	profiles cpclient.Interface
	// cache is the hub cache every part takes its informers from.
	cache       *hubcache.Cache
	broadcaster record.EventBroadcaster
	recorder    record.EventRecorder

	fan     *stream.Fanout
	pool    *tunnel.Pool
	poolSrc *tunnel.Source
	// dialer closes the pool's connections to the proxy-server (nil with
	// the direct transport).
	dialer  io.Closer
	events  *bus.Bus
	manager *sinks.Manager
	// current is the syncer, set once the hub serves the APIs it needs;
	// until then /healthz answers and /readyz says why it is not ready.
	current atomic.Pointer[syncer.Syncer]

	// identity names this replica in the leader Lease.
	identity   string
	leader     prometheus.Gauge
	leaderInfo *leaderInfo
	leading    atomic.Bool
	// poolSynced is set once the pool has learnt the hub's clusters and
	// dials them; warmed once its first dials are done (or the warm-up
	// timeout passed); draining once shutdown began.
	poolSynced, warmed, draining atomic.Bool

	// The tasks (see shutdown for the order they stop in).
	gateway, reach, work, reloader, probe, health *task
	// failed receives the first error of a task that ended on its own.
	failed chan error
}

// Run runs the daemon with cfg (loaded, defaulted and validated) until ctx
// ends or a part of it fails, and returns once every goroutine it started
// has stopped. A ctx that ends, even during the start, is a normal stop:
// Run returns nil.
func Run(ctx context.Context, cfg *config.Config, o Options) error {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Sinks == nil {
		o.Sinks = Sinks()
	}
	d := &daemon{cfg: cfg, opts: o, log: o.Log, reg: newRegistry(o.Version, o.Commit), failed: make(chan error, 1)}
	defer d.shutdown()
	steps := []func(context.Context) error{
		d.connect,        // hub clients, event recorder
		d.buildConsumers, // fan-out, tunnel pool, bus, sinks
		d.serveHealth,    // /healthz, /readyz, /metrics
		d.startBusNode,   // the embedded NATS node, on every replica
		d.waitForHub,     // the hub serves the APIs hubsync needs
		d.startCache,     // the informers taken so far, and later ones as taken
		d.startProbe,     // hub reachability, for operators
		d.startReach,     // the tunnel pool, on every replica
		d.startGateway,   // on every replica, once the pool knows the clusters
		d.newSyncer,      // ready to run, not running
		d.startReloader,  // sinks follow the configuration file
		d.startWork,      // the syncer, on the leader only
	}
	for _, step := range steps {
		if err := step(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
	}
	select {
	case <-ctx.Done():
		return nil
	case err := <-d.failed:
		return err
	}
}

// shutdown stops what the steps started (see the package
// documentation). A task never started is skipped.
func (d *daemon) shutdown() {
	d.draining.Store(true)
	// The leader's part stops at once, so that the lease is released and
	// another replica writes while this one drains its gateway.
	leaderDone := make(chan struct{})
	go func() {
		defer close(leaderDone)
		d.work.stop()
		d.reloader.stop()
		d.closeConsumers()
	}()
	d.drainGateway()
	d.reach.stop()
	if d.pool != nil {
		// Every tunnel ends with its shared connection, at once; then
		// the entries stop.
		if d.dialer != nil {
			_ = d.dialer.Close()
		}
		d.pool.Close()
	}
	<-leaderDone
	// Every part has released its informers; the ones still held (a
	// part that failed to start) stop here.
	if d.cache != nil {
		d.cache.Stop()
	}
	d.probe.stop()
	d.health.stop()
	if d.broadcaster != nil {
		d.broadcaster.Shutdown()
	}
}

// drainGateway keeps the gateway serving for the drain delay while
// /readyz fails, so that load balancers stop sending it connections, then
// stops it: Serve ends watches and upgraded streams and lets other
// requests finish for the drain timeout.
func (d *daemon) drainGateway() {
	if d.gateway == nil {
		return
	}
	if delay := d.cfg.Gateway.Drain.DelayOrZero(); delay > 0 && d.gateway.running() {
		d.log.Info("draining: not ready; serving the gateway until load balancers stop sending requests", "delay", delay)
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-d.gateway.done:
		}
		t.Stop()
	}
	d.gateway.stop()
}

// closeConsumers delivers what is queued for a few seconds, then closes
// every consumer.
func (d *daemon) closeConsumers() {
	if d.fan == nil {
		return
	}
	drain, cancel := context.WithTimeout(context.Background(), drainTimeout)
	defer cancel()
	if err := d.fan.Close(drain); err != nil {
		d.log.Warn("stopping with changes undelivered; the next start resyncs every sink", "err", err)
	}
	if d.manager != nil {
		if err := d.manager.Close(); err != nil {
			d.log.Warn("closing sinks", "err", err)
		}
	}
	if d.events != nil {
		if err := d.events.Close(); err != nil {
			d.log.Warn("closing the event bus", "err", err)
		}
	}
}

// task is a part of the daemon that runs on a goroutine of its own until
// it is stopped. Its context is there before the goroutine starts, so the
// setup of the part (an informer, a listener) ends with it too.
type task struct {
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{} // nil until go
}

func newTask(parent context.Context) *task {
	ctx, cancel := context.WithCancel(parent)
	return &task{ctx: ctx, cancel: cancel}
}

// goRun runs fn on the task's goroutine. When fn returns while the task's
// context is live, the part failed on its own, and Run ends with its
// error (fn says what failed).
func (d *daemon) goRun(t *task, name string, fn func(context.Context) error) {
	t.done = make(chan struct{})
	go func() {
		defer close(t.done)
		err := fn(t.ctx)
		if t.ctx.Err() != nil {
			return // stopped
		}
		if err == nil {
			err = fmt.Errorf("%s stopped", name)
		}
		select {
		case d.failed <- err:
		default: // Run ends with the first failure only
		}
	}()
}

// running says whether the task's goroutine runs.
func (t *task) running() bool {
	if t == nil || t.done == nil {
		return false
	}
	select {
	case <-t.done:
		return false
	default:
		return true
	}
}

// stop cancels the task and waits for its goroutine; nil is a task never
// started.
func (t *task) stop() {
	if t == nil {
		return
	}
	t.cancel()
	if t.done != nil {
		<-t.done
	}
}
