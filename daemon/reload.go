package daemon

import (
	"context"
	"crypto/sha256"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/sinks"
)

// reloader re-reads the configuration file when it changes and applies
// what can change live (the sinks, bus.consumers). It watches the file's directory, not
// the file, so that the symlink swap a ConfigMap volume makes
// (..data -> ..2026_11_23_...) is seen, and reacts to the events of two
// names only: the file's, and "..data". Anything else written in the
// directory (a log file beside the configuration) costs nothing. SIGHUP
// forces a reload; and a periodic checksum catches whatever a watch misses
// (network filesystems, a file that is a symlink out of the directory, a
// watch that could not be set up).
type reloader struct {
	path     string
	override func(*config.Config) // flags that override the file
	running  *config.Config       // owned by run
	manager  *sinks.Manager
	// busConsumers applies bus.consumers (nil without a bus).
	busConsumers func([]config.BusConsumer) error
	log          *slog.Logger
	interval     time.Duration
	lastSum      [sha256.Size]byte

	successful prometheus.Gauge
	successAt  prometheus.Gauge
	reloads    *prometheus.CounterVec
	restart    prometheus.Gauge
}

func newReloader(path string, running *config.Config, override func(*config.Config), manager *sinks.Manager, log *slog.Logger, reg prometheus.Registerer) *reloader {
	r := &reloader{
		path: path, running: running, override: override, manager: manager, log: log, interval: 30 * time.Second,
		successful: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "hubsync_config_last_reload_successful",
			Help: "1 if the last reload of the configuration file was applied, 0 if it was rejected (the running configuration stays).",
		}),
		successAt: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "hubsync_config_last_reload_success_timestamp_seconds",
			Help: "Unix time of the last successful configuration load (start or reload).",
		}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hubsync_config_reloads_total",
			Help: "Configuration reloads by result (applied, rejected, unchanged).",
		}, []string{"result"}),
		restart: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "hubsync_config_restart_required",
			Help: "1 while the file holds changes that take effect only after a restart.",
		}),
	}
	for _, result := range []string{"applied", "rejected", "unchanged"} {
		r.reloads.WithLabelValues(result)
	}
	reg.MustRegister(r.successful, r.successAt, r.reloads, r.restart)
	r.successful.Set(1)
	r.successAt.SetToCurrentTime()
	if data, err := os.ReadFile(path); err == nil {
		r.lastSum = sha256.Sum256(data)
	}
	return r
}

// run watches until ctx ends.
func (r *reloader) run(ctx context.Context) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	var fsEvents <-chan fsnotify.Event
	var fsErrors <-chan error
	if w, err := fsnotify.NewWatcher(); err != nil {
		r.log.Warn("cannot watch the configuration file; checking it periodically instead", "err", err, "interval", r.interval)
	} else {
		defer w.Close()
		if err := w.Add(filepath.Dir(r.path)); err != nil {
			r.log.Warn("cannot watch the configuration file's directory; checking it periodically instead", "dir", filepath.Dir(r.path), "err", err, "interval", r.interval)
		} else {
			fsEvents, fsErrors = w.Events, w.Errors
		}
	}
	tick := time.NewTicker(r.interval)
	defer tick.Stop()
	// A burst of file events (an editor's write, a ConfigMap swap) settles
	// before the file is read.
	settle := time.NewTimer(time.Hour)
	settle.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			r.log.Info("SIGHUP: reloading the configuration", "file", r.path)
			r.check(true)
		case <-tick.C:
			r.check(false)
		case ev, ok := <-fsEvents:
			if !ok {
				fsEvents = nil
				continue
			}
			if r.concerns(ev) {
				settle.Reset(100 * time.Millisecond)
			}
		case err, ok := <-fsErrors:
			if !ok {
				fsErrors = nil
				continue
			}
			r.log.Warn("watching the configuration file", "err", err)
		case <-settle.C:
			r.check(false)
		}
	}
}

// configMapData is the symlink a ConfigMap volume swaps, in one rename,
// to publish every file of a new version at once.
const configMapData = "..data"

// concerns reports whether a file event in the watched directory may have
// changed the configuration: an event of the file itself, or the swap of
// a ConfigMap volume's ..data link that the file points through.
func (r *reloader) concerns(ev fsnotify.Event) bool {
	name := filepath.Base(ev.Name)
	return name == filepath.Base(r.path) || name == configMapData
}

// check reloads the file if its content changed (or force is set).
func (r *reloader) check(force bool) {
	data, err := os.ReadFile(r.path)
	if err != nil {
		r.reject(fmt.Errorf("read %s: %w", r.path, err))
		return
	}
	sum := sha256.Sum256(data)
	if sum == r.lastSum && !force {
		return
	}
	r.lastSum = sum
	next, err := config.Parse(data)
	if err != nil {
		r.reject(fmt.Errorf("%s: %w", r.path, err))
		return
	}
	if r.override != nil {
		r.override(next)
	}
	if fields := r.running.RestartNeeded(next); len(fields) > 0 {
		r.restart.Set(1)
		r.log.Warn("the configuration changed fields that take effect only after a restart; they are ignored until then",
			"fields", strings.Join(fields, ", "), "reloadable", strings.Join(config.Reloadable, ", "))
	} else {
		r.restart.Set(0)
	}
	res, err := r.manager.Apply(next.Sinks)
	r.running.Sinks = next.Sinks
	if err != nil {
		r.reject(fmt.Errorf("apply sinks: %w", err))
		return
	}
	if r.busConsumers != nil && !reflect.DeepEqual(r.running.Bus.Consumers, next.Bus.Consumers) {
		if err := r.busConsumers(next.Bus.Consumers); err != nil {
			r.reject(fmt.Errorf("apply bus.consumers: %w", err))
			return
		}
		r.running.Bus.Consumers = next.Bus.Consumers
	}
	r.successful.Set(1)
	r.successAt.SetToCurrentTime()
	result := "applied"
	if len(res.Added)+len(res.Changed)+len(res.Removed) == 0 {
		result = "unchanged"
	}
	r.reloads.WithLabelValues(result).Inc()
	r.log.Info("configuration reloaded", "file", r.path, "sinksAdded", res.Added, "sinksChanged", res.Changed,
		"sinksRemoved", res.Removed, "sinksUnchanged", len(res.Unchanged))
}

func (r *reloader) reject(err error) {
	// The log first: whoever sees the metric change finds the reason.
	r.log.Error("configuration reload rejected; the running configuration stays", "err", err)
	r.successful.Set(0)
	r.reloads.WithLabelValues("rejected").Inc()
}
