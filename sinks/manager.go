package sinks

import (
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/go-multierror"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/stream"
)

// batchWindow lets the changes of a burst reach a sink together: one spool
// segment (one fsync) or one list of Argo CD's Secrets for many changes
// instead of one each. It adds at most this much latency, and only in a
// burst: a change after a quiet spell goes at once. 50 ms was measured to
// put the webhook's p99 above 100 ms beyond the hub write, for no gain in
// the initial sync; 10 ms is what the bus uses.
const batchWindow = 10 * time.Millisecond

// Manager keeps the fan-out's sinks equal to the configuration: Apply adds
// the sinks that are new, replaces those whose settings changed and removes
// those that are gone, without touching the others.
type Manager struct {
	fan       *stream.Fanout
	deps      Deps
	factories map[string]Factory

	// applying orders reconfigurations: one Apply at a time, so that two
	// cannot start the same sink. Only Apply waits for it.
	applying sync.Mutex
	// mu guards running and closed. It is never held while a sink is
	// built, stopped or closed (files, connections, hub requests): Names
	// and Close never wait for a sink.
	mu      sync.Mutex
	running map[string]running
	closed  bool
}

type running struct {
	cfg  config.Sink
	sink Sink
}

// NewManager makes a manager that adds sinks to fan, building each with
// the factory of its type.
func NewManager(fan *stream.Fanout, deps Deps, factories map[string]Factory) *Manager {
	return &Manager{fan: fan, deps: deps, factories: factories, running: map[string]running{}}
}

// Result says what Apply did, by sink name.
type Result struct {
	Added, Changed, Removed, Unchanged []string
	// Failed holds the sinks that could not be built; they are not
	// running, and the next Apply tries again.
	Failed []string
}

// errClosed fails an Apply after Close.
var errClosed = errors.New("sinks: the manager is closed")

// Apply makes the running sinks those of cfgs (a validated configuration).
// A changed sink is stopped and started anew, so it resyncs its target from
// the current state. A sink that cannot be built is reported in the error
// and skipped; the others run. Sinks being removed or replaced are closed
// concurrently, and every error of every sink is returned.
func (m *Manager) Apply(cfgs []config.Sink) (Result, error) {
	m.applying.Lock()
	defer m.applying.Unlock()
	res, stopping, err := m.plan(cfgs)
	if err != nil {
		return res, err
	}
	var errs *multierror.Error
	if err := m.stop(stopping); err != nil {
		errs = multierror.Append(errs, err)
	}
	for _, c := range cfgs {
		if slices.Contains(res.Unchanged, c.Name) {
			continue
		}
		if err := m.start(c); err != nil {
			res.Failed = append(res.Failed, c.Name)
			errs = multierror.Append(errs, err)
			continue
		}
		if !slices.Contains(res.Changed, c.Name) {
			res.Added = append(res.Added, c.Name)
		}
	}
	return res, errs.ErrorOrNil()
}

// plan compares cfgs with the running sinks and takes those to stop out
// of the running set.
func (m *Manager) plan(cfgs []config.Sink) (Result, []running, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var res Result
	if m.closed {
		return res, nil, errClosed
	}
	want := make(map[string]config.Sink, len(cfgs))
	for _, c := range cfgs {
		want[c.Name] = c
	}
	var stopping []running
	for _, name := range slices.Sorted(maps.Keys(m.running)) {
		r := m.running[name]
		c, ok := want[name]
		switch {
		case !ok:
			res.Removed = append(res.Removed, name)
		case !reflect.DeepEqual(c, r.cfg):
			res.Changed = append(res.Changed, name)
		default:
			res.Unchanged = append(res.Unchanged, name)
			continue
		}
		stopping = append(stopping, r)
		delete(m.running, name)
	}
	return res, stopping, nil
}

func (m *Manager) start(c config.Sink) error {
	factory, ok := m.factories[c.Type]
	if !ok {
		return fmt.Errorf("sink %s: type %q is not available", c.Name, c.Type)
	}
	f := c.Filter
	if c.ArgoCD != nil && len(f.Namespaces) == 0 {
		// An Argo CD sink serves one consumer namespace: the others'
		// changes need not even be queued for it.
		f.Namespaces = []string{c.ArgoCD.ConsumerNamespace}
	}
	if c.Kueue != nil && len(f.Namespaces) == 0 {
		// A kueue sink serves Kueue's namespace only.
		f.Namespaces = []string{c.Kueue.Namespace}
	}
	filter, err := Filter(f)
	if err != nil {
		return fmt.Errorf("sink %s: %w", c.Name, err)
	}
	deps := m.deps
	deps.Log = m.deps.Log.With("sink", c.Name, "type", c.Type)
	s, err := factory(c, deps) // may read files and the hub: no lock held
	if err != nil {
		return fmt.Errorf("sink %s: %w", c.Name, err)
	}
	opts := config.ConsumerOptions(c.Name, c.Type)
	opts.Filter, opts.QueueSize, opts.BatchWindow = filter, c.QueueSize, batchWindow
	opts.Log = m.deps.Log.With("type", c.Type)
	if c.Type != config.SinkWebhook {
		// Sinks that keep a state: resynced on a period, and held while
		// the syncer converges (the initial sync, a fleet-wide change), so
		// that their files and hub writes do not slow the profiles down;
		// they catch up right after. A webhook reports events as they
		// happen: it neither yields nor resyncs on a period. (The bus
		// yields too, within bus.yieldMax: see bus.ConsumerOptions.)
		opts.ResyncPeriod = m.deps.ResyncPeriod
		opts.Yield = true
	}
	if err := m.add(opts, c, s); err != nil {
		return errors.Join(fmt.Errorf("sink %s: %w", c.Name, err), s.Close())
	}
	m.deps.Log.Info("sink started", "sink", c.Name, "type", c.Type)
	return nil
}

// add puts a built sink into the fan-out and the running set, unless the
// manager was closed while it was built.
func (m *Manager) add(opts stream.Options, c config.Sink, s Sink) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return errClosed
	}
	if err := m.fan.Add(opts, s); err != nil {
		return err
	}
	m.running[c.Name] = running{cfg: c, sink: s}
	return nil
}

// stop takes sinks out of the fan-out and closes them, all at once.
func (m *Manager) stop(rs []running) error {
	var g multierror.Group
	for _, r := range rs {
		g.Go(func() error {
			err := m.fan.Remove(r.cfg.Name)
			if cerr := r.sink.Close(); cerr != nil {
				err = errors.Join(err, fmt.Errorf("close sink %s: %w", r.cfg.Name, cerr))
			}
			m.deps.Log.Info("sink stopped; what it wrote stays as it is", "sink", r.cfg.Name, "type", r.cfg.Type)
			return err
		})
	}
	return g.Wait().ErrorOrNil()
}

// Names returns the running sinks' names, sorted.
func (m *Manager) Names() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Sorted(maps.Keys(m.running))
}

// Close stops and closes every sink; a later Apply fails, and a sink an
// Apply in progress builds is closed instead of started.
func (m *Manager) Close() error {
	m.mu.Lock()
	m.closed = true
	rs := slices.Collect(maps.Values(m.running))
	m.running = map[string]running{}
	m.mu.Unlock()
	return m.stop(rs)
}
