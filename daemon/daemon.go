// Package daemon runs hubsync: it builds the change stream and its
// consumers (the NATS bus, the sinks, the tunnel pool), serves health and
// metrics, waits for the hub's APIs, probes the hub, serves the access
// gateway, reloads the configuration file, and runs the syncer while this
// replica holds the leader lease. Run is what `hubsync run` calls, and
// what tests call in-process.
//
// Every goroutine Run starts has an owner that stops it and waits for it,
// and Run returns only once all have stopped, in this order: the gateway
// drains its requests; the producers (the syncer and the tunnel pool)
// stop, then the lease is released; the reloader stops; the consumers
// deliver what the producers notified, for a few seconds, and close; the
// hub probe and the health server stop last.
//
// Owns: the start-up order, leader election, /healthz, /readyz and
// /metrics, the hub probe, configuration reloads, the shutdown order. It
// may import every product package but cmd; only cmd imports it.
package daemon

import (
	"context"
	"fmt"
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
	// Version is the build's version, for logs and the hub clients' user
	// agent.
	Version string
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

	restCfg     *rest.Config
	kube        kubernetes.Interface
	clusters    clusterclient.Interface
	profiles    cpclient.Interface
	broadcaster record.EventBroadcaster
	recorder    record.EventRecorder

	fan     *stream.Fanout
	pool    *tunnel.Pool
	poolSrc *tunnel.Source
	events  *bus.Bus
	manager *sinks.Manager
	// current is the syncer, set once the hub serves the APIs it needs;
	// until then /healthz answers and /readyz says why it is not ready.
	current atomic.Pointer[syncer.Syncer]

	leader      prometheus.Gauge
	leading     atomic.Bool
	poolRunning atomic.Bool

	// The tasks, in the order shutdown stops them.
	gateway, work, reloader, probe, health *task
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
	d := &daemon{cfg: cfg, opts: o, log: o.Log, reg: newRegistry(), failed: make(chan error, 1)}
	defer d.shutdown()
	steps := []func(context.Context) error{
		d.connect,        // hub clients, event recorder
		d.buildConsumers, // fan-out, tunnel pool, bus, sinks
		d.serveHealth,    // /healthz, /readyz, /metrics
		d.waitForHub,     // the hub serves the APIs hubsync needs
		d.startProbe,     // hub reachability, for operators
		d.startGateway,   // answers 503 until the pool runs here
		d.newSyncer,      // ready to run, not running
		d.startReloader,  // sinks follow the configuration file
		d.startWork,      // the syncer and pool, on the leader only
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

// shutdown stops what the steps started, producers before consumers (see
// the package documentation). A task never started is skipped.
func (d *daemon) shutdown() {
	d.gateway.stop()
	d.work.stop()
	d.reloader.stop()
	d.closeConsumers()
	d.probe.stop()
	d.health.stop()
	if d.broadcaster != nil {
		d.broadcaster.Shutdown()
	}
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
	if d.pool != nil {
		d.pool.Close()
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
