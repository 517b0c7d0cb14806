// Package tunnel keeps one warm connection per managed cluster: a tunnel
// (through the hub's konnectivity proxy-server, or a direct TCP
// connection), TLS to the cluster's API server and one long-lived HTTP/2
// connection over it that multiplexes every request to that cluster.
//
// Entries are dialed when a cluster joins (it has a ClusterProfile in any
// consumer namespace, or matches a configured selector) and closed when it
// leaves. Each entry is probed on an interval with jitter, redialed with
// exponential backoff after a failure, a GOAWAY or a dead connection, and
// reports its state (connecting, ready, failing) through metrics, Statuses
// and tunnel events on the change stream. Code inside hubsync reaches a
// cluster through RoundTripper and waits for it with WaitReady.
//
// May import config, stream, hub and hubcache; never syncer or bus. The
// gateway imports it for the entries' statuses, targets and errors, and
// reaches the pool through an interface of its own.
package tunnel

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/net/http2"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/stream"
)

// State is where a pool entry stands.
type State string

// Entry states.
const (
	// StateConnecting: dialing for the first time since the entry was
	// created; nothing is known yet.
	StateConnecting State = "connecting"
	// StateReady: the connection is open and the last probe succeeded.
	StateReady State = "ready"
	// StateFailing: the last dial or probe failed, or the connection
	// died; the entry is redialing with backoff. Reason says why.
	StateFailing State = "failing"
	// StateIdle: the cluster is served but not dialed (warm: onDemand):
	// its first request dials it.
	StateIdle State = "idle"
)

// Errors of RoundTripper and WaitReady; test them with errors.Is.
var (
	// ErrNotServed: the pool has no entry for the cluster.
	ErrNotServed = errors.New("cluster is not served by the tunnel pool")
	// ErrNotReady: the cluster's entry has no usable connection now.
	ErrNotReady = errors.New("cluster's tunnel is not ready")
	// ErrNoCredential: no ManagedServiceAccount token is known for the
	// cluster (none configured, or its Secret is missing or empty).
	ErrNoCredential = errors.New("no ManagedServiceAccount token for the cluster")
)

// Target is where and how to reach one cluster's API server.
type Target struct {
	// Address is the host:port dialed (through the tunnel, or directly).
	Address string
	// ServerName is the name verified in the API server's certificate.
	ServerName string
	// CA is the PEM bundle that verifies the API server; empty uses the
	// system's roots.
	CA []byte
	// Token authenticates probes, and the gateway's requests as it
	// decides (Pool.Authorization). Never logged.
	Token string
	// TokenFingerprint identifies Token in statuses; never the token.
	TokenFingerprint string
	// UID is the ManagedCluster's, for the Events recorded on it.
	UID types.UID
	// ClusterSet is the ManagedClusterSet the cluster belongs to (its
	// cluster.open-cluster-management.io/clusterset label); empty when
	// none. The gateway labels what it measures with it.
	ClusterSet string
	// Err says why the cluster cannot be dialed (for example no API
	// server URL in direct mode); the entry reports it as failing.
	Err error
	// bearer is the Authorization header value for Token ("" without
	// one): Token is its tail, so the pool, its probes and HTTP/2's header
	// table share one copy of the token per cluster. The Source sets it;
	// SetTarget makes it for targets made elsewhere.
	bearer string
}

const bearerPrefix = "Bearer "

// withToken sets t's Token and its Authorization header value from one
// allocation.
func (t *Target) withToken(tok string) {
	t.bearer = bearerPrefix + tok
	t.Token = t.bearer[len(bearerPrefix):]
}

// withBearer returns t with bearer made for its token, unless it already
// is.
func (t Target) withBearer() Target {
	switch {
	case t.Token == "":
		t.bearer = ""
	case t.bearer == "" || t.bearer[len(bearerPrefix):] != t.Token:
		t.withToken(t.Token)
	}
	return t
}

// Identity names what t reaches: the ManagedCluster (its UID), the
// address, the name verified and the CA. A cluster deleted and registered
// again under its name, or moved to another API server, has another one.
func (t Target) Identity() string {
	h := sha256.New()
	for _, part := range [][]byte{[]byte(t.UID), []byte(t.Address), []byte(t.ServerName), t.CA} {
		h.Write(part)
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil)[:8])
}

// sameConnection reports whether a connection made for t also serves o.
func (t Target) sameConnection(o Target) bool {
	return t.Address == o.Address && t.ServerName == o.ServerName && string(t.CA) == string(o.CA) &&
		(t.Err == nil) == (o.Err == nil)
}

// Options configure a Pool. They arrive filled (config holds the
// defaults): New refuses any left zero but Transport, Notifier, Recorder,
// Log and Registerer.
type Options struct {
	// Dialer opens the byte stream to a cluster; required.
	Dialer Dialer
	// Transport names the dialer in statuses and events (konnectivity,
	// direct).
	Transport string
	// ProbePath is fetched with GET to probe an entry.
	ProbePath string
	// ProbeInterval is the time between probes of a ready entry, with
	// ±20% jitter.
	ProbeInterval time.Duration
	// ProbeTimeout bounds one probe.
	ProbeTimeout time.Duration
	// DialTimeout bounds one dial with its TLS handshake.
	DialTimeout time.Duration
	// BackoffBase and BackoffMax bound the exponential backoff between
	// failed dials of one entry.
	BackoffBase, BackoffMax time.Duration
	// MaxDials bounds the dials in progress across the pool, so that
	// thousands of clusters joining at once never stampede the
	// proxy-server.
	MaxDials int
	// MaxUpgradeDials bounds the dials of upgraded connections (exec,
	// attach, port-forward) in progress across the pool, apart from
	// MaxDials: upgrades never take the slots entries redial with.
	MaxUpgradeDials int
	// RetireGrace is how long a replaced connection may finish its
	// requests (watches included) before it is closed.
	RetireGrace time.Duration
	// MaxConnsPerCluster bounds an entry's connections: one, plus
	// overflow connections made while every stream of the others is busy
	// (the API server allows 100 per connection by default, and long
	// watches hold theirs).
	MaxConnsPerCluster int
	// ExtraIdle is how long an overflow connection may go without a
	// request before it is closed.
	ExtraIdle time.Duration
	// OnDemand dials a cluster at its first request (WaitReady, a round
	// trip or Token) instead of when it joins, and closes its entry after
	// IdleTimeout without a request and with no stream open.
	OnDemand bool
	// IdleTimeout is how long an entry dialed on demand lives unused;
	// required with OnDemand.
	IdleTimeout time.Duration
	// Notifier receives tunnel.ready and tunnel.failing changes, one per
	// consumer namespace that has a profile for the cluster.
	Notifier stream.Notifier
	// Recorder, if set, records Kubernetes Events on the ManagedCluster:
	// TunnelFailing when its entry starts failing, TunnelReady when it
	// recovers.
	Recorder record.EventRecorder
	// Log receives the pool's lines.
	Log *slog.Logger
	// Registerer registers the pool's metrics; nil registers none.
	Registerer prometheus.Registerer
}

// OptionsFor returns the pool's options for a defaulted configuration's
// tunnel section: everything but the Dialer and the dependencies
// (Notifier, Recorder, Log, Registerer).
func OptionsFor(c config.Tunnel) Options {
	return Options{
		Transport: c.Transport, ProbePath: c.ProbePath,
		ProbeInterval: c.ProbeInterval.Duration, ProbeTimeout: c.ProbeTimeout.Duration, DialTimeout: c.DialTimeout.Duration,
		BackoffBase: c.Backoff.BaseDelay.Duration, BackoffMax: c.Backoff.MaxDelay.Duration,
		MaxDials: c.MaxConcurrentDials, MaxUpgradeDials: c.MaxConcurrentUpgradeDials, MaxConnsPerCluster: c.MaxConnectionsPerCluster,
		RetireGrace: config.DefaultTunnelRetireGrace, ExtraIdle: config.DefaultTunnelExtraIdle,
		OnDemand: c.Warm == config.WarmOnDemand, IdleTimeout: c.IdleTimeout.Duration,
	}
}

// check refuses options left unset: the defaults are config's (its
// tunnel section and DefaultTunnelRetireGrace, DefaultTunnelExtraIdle),
// and a zero here would mean probes without a timeout, dials without a
// bound or a redial loop without a backoff.
func (o *Options) check() error {
	var missing []string
	for _, f := range []struct {
		name string
		ok   bool
	}{
		{"Dialer", o.Dialer != nil},
		{"ProbePath", o.ProbePath != ""},
		{"ProbeInterval", o.ProbeInterval > 0},
		{"ProbeTimeout", o.ProbeTimeout > 0},
		{"DialTimeout", o.DialTimeout > 0},
		{"BackoffBase", o.BackoffBase > 0},
		{"BackoffMax (at least BackoffBase)", o.BackoffMax >= o.BackoffBase},
		{"MaxDials", o.MaxDials > 0},
		{"MaxUpgradeDials", o.MaxUpgradeDials > 0},
		{"MaxConnsPerCluster", o.MaxConnsPerCluster > 0},
		{"RetireGrace", o.RetireGrace > 0},
		{"ExtraIdle", o.ExtraIdle > 0},
		{"IdleTimeout (with OnDemand)", !o.OnDemand || o.IdleTimeout > 0},
	} {
		if !f.ok {
			missing = append(missing, f.name)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("tunnel pool: %s not set (the configuration's tunnel section fills every option)", strings.Join(missing, ", "))
	}
	if o.Notifier == nil {
		o.Notifier = stream.Nop{}
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Pool holds one entry per served cluster.
type Pool struct {
	opts Options
	log  *slog.Logger
	m    *metrics
	h2   *http2.Transport
	sem  chan struct{}
	// upgradeSem bounds upgrade dials, apart from sem.
	upgradeSem chan struct{}
	// epoch and seq make the resourceVersion of tunnel changes: unique
	// per transition, across restarts too.
	epoch string
	seq   atomic.Uint64

	mu      sync.Mutex
	ctx     context.Context // set by Start; entries run under it
	closed  bool
	entries map[string]*entry
	// namespaces holds, per cluster, the consumer namespaces that have a
	// profile for it (from the change stream).
	namespaces map[string]map[string]bool
	// selected holds the clusters a configured selector matches.
	selected map[string]bool
	// targets holds what the sources know of each cluster.
	targets map[string]Target
	// demanded holds the clusters asked for since their entry was last
	// closed idle (OnDemand).
	demanded map[string]bool
	// changed is closed and replaced whenever an entry is added or
	// changes state (WaitReady waits on it).
	changed chan struct{}

	wg sync.WaitGroup // entry goroutines and retiring connections

	ownersMu sync.Mutex
	owners   map[*http2.ClientConn]*entry
}

// deadNotifier is the HTTP/2 transport's connection pool. The pool dials
// its own connections, so GetClientConn is never used; MarkDead is how
// the transport reports a GOAWAY or a broken connection.
type deadNotifier struct{ p *Pool }

func (d deadNotifier) GetClientConn(*http.Request, string) (*http2.ClientConn, error) {
	return nil, http2.ErrNoCachedConn
}

func (d deadNotifier) MarkDead(cc *http2.ClientConn) {
	d.p.ownersMu.Lock()
	e := d.p.owners[cc]
	d.p.ownersMu.Unlock()
	if e != nil {
		e.wake()
	}
}

func (p *Pool) own(cc *http2.ClientConn, e *entry) {
	p.ownersMu.Lock()
	defer p.ownersMu.Unlock()
	if e == nil {
		delete(p.owners, cc)
	} else {
		p.owners[cc] = e
	}
}

// New returns a pool; Start runs it.
func New(opts Options) (*Pool, error) {
	if errWrappedHTTP2 != nil {
		return nil, errWrappedHTTP2
	}
	if err := opts.check(); err != nil {
		return nil, err
	}
	p := &Pool{
		opts: opts, log: opts.Log,
		sem:        make(chan struct{}, opts.MaxDials),
		upgradeSem: make(chan struct{}, opts.MaxUpgradeDials),
		epoch:      strconv.FormatInt(time.Now().UnixNano(), 36),
		entries:    map[string]*entry{},
		namespaces: map[string]map[string]bool{},
		selected:   map[string]bool{},
		targets:    map[string]Target{},
		demanded:   map[string]bool{},
		changed:    make(chan struct{}),
		owners:     map[*http2.ClientConn]*entry{},
	}
	p.h2 = &http2.Transport{
		// A connection that says nothing for this long is pinged;
		// without an answer it is closed, and the entry redials.
		ReadIdleTimeout: 30 * time.Second,
		PingTimeout:     10 * time.Second,
		// The transport tells its pool when a connection gets a GOAWAY
		// or dies: the entry then replaces it at once.
		ConnPool: deadNotifier{p},
		// An entry has one connection: when every stream the API server
		// allows is in use, a request waits for one rather than failing.
		StrictMaxConcurrentStreams: true,
	}
	m, err := newMetrics(opts.Registerer, p.Statuses)
	if err != nil {
		return nil, err
	}
	p.m = m
	return p, nil
}

// Start lets the pool dial: entries known already start now, later ones
// when they join. Cancelling ctx stops every entry; Close waits for them.
func (p *Pool) Start(ctx context.Context) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ctx != nil || p.closed {
		return
	}
	p.ctx = ctx
	for c := range p.targets {
		p.reconcileLocked(c)
	}
	for c := range p.namespaces {
		p.reconcileLocked(c)
	}
	for c := range p.selected {
		p.reconcileLocked(c)
	}
	if p.opts.OnDemand {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.closeIdle(ctx)
		}()
	}
}

// Close stops every entry and closes every connection, waiting until they
// are gone. The dialer is its owner's to close: a process that stops
// closes the konnectivity dialer first, so that every tunnel ends at once
// rather than each with its own goodbye (a TLS close_notify and a
// CLOSE_REQ, each answered through its agent).
func (p *Pool) Close() {
	p.mu.Lock()
	p.closed = true
	for c, e := range p.entries {
		e.stop()
		delete(p.entries, c)
	}
	p.signalLocked()
	p.mu.Unlock()
	p.wg.Wait()
}

// SetTarget records where a cluster is (nil: the cluster is gone) and
// starts, updates or stops its entry.
func (p *Pool) SetTarget(cluster string, t *Target) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if t == nil {
		delete(p.targets, cluster)
	} else {
		p.targets[cluster] = t.withBearer()
	}
	p.reconcileLocked(cluster)
}

// SetSelected records whether a configured selector matches the cluster.
func (p *Pool) SetSelected(cluster string, selected bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if selected {
		p.selected[cluster] = true
	} else {
		delete(p.selected, cluster)
	}
	p.reconcileLocked(cluster)
}

// servedLocked says whether the pool serves the cluster: it is known and
// has a profile or matches the selector.
func (p *Pool) servedLocked(cluster string) bool {
	_, known := p.targets[cluster]
	return known && (len(p.namespaces[cluster]) > 0 || p.selected[cluster])
}

// reconcileLocked makes the cluster's entry match what is wanted: an
// entry for every served cluster, or, on demand, for every served
// cluster asked for.
func (p *Pool) reconcileLocked(cluster string) {
	t := p.targets[cluster]
	served := p.servedLocked(cluster)
	if !served {
		delete(p.demanded, cluster)
	}
	want := served && (!p.opts.OnDemand || p.demanded[cluster])
	e := p.entries[cluster]
	switch {
	case p.ctx == nil || p.closed:
		return
	case !want && e != nil:
		e.stop()
		delete(p.entries, cluster)
		if served {
			p.log.Debug("tunnel closed: idle", "cluster", cluster, "idleTimeout", p.opts.IdleTimeout)
		} else {
			p.log.Info("tunnel closed: cluster left the pool", "cluster", cluster)
		}
		p.signalLocked()
	case want && e == nil:
		e = newEntry(p, cluster, t)
		p.entries[cluster] = e
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			e.run(e.ctx)
		}()
		p.signalLocked()
	case want:
		e.setTarget(t)
	}
}

func (p *Pool) signalLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

func (p *Pool) entry(cluster string) *entry {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.entries[cluster]
}

// demand returns the cluster's entry, creating it for a served cluster
// not dialed yet (OnDemand); nil when the pool does not serve the
// cluster. The entry counts as used.
func (p *Pool) demand(cluster string) *entry {
	p.mu.Lock()
	defer p.mu.Unlock()
	if e := p.entries[cluster]; e != nil || !p.opts.OnDemand {
		if e != nil {
			e.touch()
		}
		return e
	}
	if !p.servedLocked(cluster) {
		return nil
	}
	p.demanded[cluster] = true
	p.reconcileLocked(cluster)
	return p.entries[cluster]
}

// closeIdle closes, until ctx ends, the entries dialed on demand that
// went IdleTimeout without a request and have no stream open; the next
// request dials again.
func (p *Pool) closeIdle(ctx context.Context) {
	every := min(max(p.opts.IdleTimeout/4, 10*time.Millisecond), 30*time.Second)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		p.mu.Lock()
		for c, e := range p.entries {
			if e.idleFor() >= p.opts.IdleTimeout {
				delete(p.demanded, c)
				p.reconcileLocked(c)
			}
		}
		p.mu.Unlock()
	}
}

// SetProfile records whether namespace has a ClusterProfile for the
// cluster (the source follows the hub's profiles on every replica); a
// namespace that newly has the cluster learns its tunnel's current state.
func (p *Pool) SetProfile(namespace, cluster string, present bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ns := p.namespaces[cluster]
	if present == ns[namespace] {
		return
	}
	if !present {
		delete(ns, namespace)
		if len(ns) == 0 {
			delete(p.namespaces, cluster)
		}
		p.reconcileLocked(cluster)
		return
	}
	if ns == nil {
		ns = map[string]bool{}
		p.namespaces[cluster] = ns
	}
	ns[namespace] = true
	p.reconcileLocked(cluster)
	if e := p.entries[cluster]; e != nil {
		if st := e.status(); st.State != StateConnecting {
			p.notify(st, []string{namespace})
		}
	}
}

// Announce notifies every entry's current state (but connecting) to every
// namespace that has the cluster: a replica that starts leading tells the
// change stream where the tunnels stand, whatever the previous leader
// said.
func (p *Pool) Announce() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c, e := range p.entries {
		if st := e.status(); st.State != StateConnecting {
			p.notify(st, slices.Sorted(maps.Keys(p.namespaces[c])))
		}
	}
}

// announce publishes an entry's new state to every namespace that has the
// cluster.
func (p *Pool) announce(st Status) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.entries[st.Cluster] == nil {
		return
	}
	p.notify(st, slices.Sorted(maps.Keys(p.namespaces[st.Cluster])))
	p.signalLocked()
}

func (p *Pool) notify(st Status, namespaces []string) {
	typ := stream.TunnelReady
	if st.State == StateFailing {
		typ = stream.TunnelFailing
	}
	summary := &stream.TunnelSummary{
		State: string(st.State), Reason: st.Reason, Transport: p.opts.Transport,
		Since: st.Since.UTC(),
	}
	if st.ProbeLatency > 0 {
		summary.ProbeMillis = float64(st.ProbeLatency.Microseconds()) / 1000
	}
	rv := fmt.Sprintf("%s-%d", p.epoch, p.seq.Add(1))
	for _, ns := range namespaces {
		p.opts.Notifier.Notify(stream.Change{
			Type: typ, Namespace: ns, Cluster: st.Cluster, Name: st.Cluster,
			ResourceVersion: rv, Time: st.Since, Tunnel: summary,
		})
	}
}

// Status is one entry's state.
type Status struct {
	Cluster string `json:"cluster"`
	// ClusterSet is the cluster's ManagedClusterSet (Target.ClusterSet).
	ClusterSet string `json:"clusterSet,omitempty"`
	State      State  `json:"state"`
	// Reason says why the entry is failing; empty otherwise.
	Reason string `json:"reason,omitempty"`
	// Since is when the entry entered its state.
	Since time.Time `json:"since"`
	// ProbeLatency is the last successful probe's round trip.
	ProbeLatency time.Duration `json:"probeLatency,omitempty"`
	// LastProbe is when the last probe ended, successful or not.
	LastProbe time.Time `json:"lastProbe,omitzero"`
	// Address is the host:port dialed.
	Address string `json:"address,omitempty"`
	// Credential is the fingerprint of the token probes use; empty when
	// there is none.
	Credential string `json:"credential,omitempty"`
	// Dials counts the connections made for the entry.
	Dials int `json:"dials"`
	// Connections is how many connections the entry has open: one, and
	// overflow connections while every stream is busy.
	Connections int `json:"connections"`
	// Identity is the target's (Target.Identity): what the gateway's
	// memories of the cluster (its key set) are kept for.
	Identity string `json:"identity,omitempty"`
	// Paced says why the entry waits before its next dial or probe (its
	// API server sheds load, or keeps no connection), until PacedUntil;
	// empty when it does not.
	Paced      string    `json:"paced,omitempty"`
	PacedUntil time.Time `json:"pacedUntil,omitzero"`
}

// Statuses returns every entry's status, sorted by cluster.
func (p *Pool) Statuses() []Status {
	p.mu.Lock()
	es := slices.Collect(maps.Values(p.entries))
	p.mu.Unlock()
	out := make([]Status, 0, len(es))
	for _, e := range es {
		out = append(out, e.status())
	}
	slices.SortFunc(out, func(a, b Status) int { return cmp.Compare(a.Cluster, b.Cluster) })
	return out
}

// Pending returns how many entries are still dialing for the first time
// (connecting), and how many entries there are.
func (p *Pool) Pending() (connecting, total int) {
	p.mu.Lock()
	es := slices.Collect(maps.Values(p.entries))
	p.mu.Unlock()
	for _, e := range es {
		if e.connecting() {
			connecting++
		}
	}
	return connecting, len(es)
}

// WaitWarm waits until no entry is connecting (each is ready or failing),
// or ctx ends.
//
// Every entry's change wakes it. It keeps to one entry still connecting,
// chosen at random, and looks for another only once that one is done: a
// warm-up of n entries then costs about log n scans of the entries
// rather than one per change (n).
func (p *Pool) WaitWarm(ctx context.Context) error {
	var on *entry // an entry still connecting, when last looked at
	for {
		p.mu.Lock()
		changed := p.changed
		if on != nil && p.entries[on.cluster] != on {
			on = nil // it left the pool
		}
		var es []*entry
		if on == nil || !on.connecting() {
			on, es = nil, slices.Collect(maps.Values(p.entries))
		}
		p.mu.Unlock()
		if es != nil {
			// Map order is random: the first one found connecting is
			// any of them.
			if i := slices.IndexFunc(es, (*entry).connecting); i >= 0 {
				on = es[i]
			}
		}
		if on == nil {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Status returns one cluster's status: StateIdle for a served cluster not
// dialed yet (OnDemand).
func (p *Pool) Status(cluster string) (Status, bool) {
	p.mu.Lock()
	e := p.entries[cluster]
	idle := e == nil && p.opts.OnDemand && p.servedLocked(cluster)
	var t Target
	if idle {
		t = p.targets[cluster]
	}
	p.mu.Unlock()
	switch {
	case idle:
		return Status{Cluster: cluster, ClusterSet: t.ClusterSet, State: StateIdle, Identity: t.Identity()}, true
	case e == nil:
		return Status{}, false
	}
	return e.status(), true
}

// WaitReady waits until the cluster's entry is ready, or ctx ends; on
// demand it dials a served cluster not dialed yet. The error then says
// what the entry was doing.
func (p *Pool) WaitReady(ctx context.Context, cluster string) error {
	for {
		// Asked for again at each change: a waiting request keeps an
		// entry dialed on demand in use.
		p.demand(cluster)
		p.mu.Lock()
		e, changed := p.entries[cluster], p.changed
		p.mu.Unlock()
		var st Status
		if e != nil {
			st = e.status()
			if st.State == StateReady {
				return nil
			}
		}
		select {
		case <-changed:
		case <-ctx.Done():
			if e == nil {
				return fmt.Errorf("cluster %s: %w", cluster, ErrNotServed)
			}
			return fmt.Errorf("cluster %s: %w (%s%s)", cluster, ErrNotReady, st.State, reasonSuffix(st.Reason))
		}
	}
}

func reasonSuffix(r string) string {
	if r == "" {
		return ""
	}
	return ": " + r
}
