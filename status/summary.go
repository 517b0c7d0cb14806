package status

import (
	"cmp"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
)

// The metrics the summary reads (docs/operations.md, "Metrics").
const (
	mLeader             = "hubsync_leader"
	mLeaderInfo         = "hubsync_leader_info"
	mHubReachable       = "hubsync_hub_reachable"
	mReloadOK           = "hubsync_config_last_reload_successful"
	mReloadSuccessAt    = "hubsync_config_last_reload_success_timestamp_seconds"
	mReloads            = "hubsync_config_reloads_total"
	mRestartRequired    = "hubsync_config_restart_required"
	mProfiles           = "hubsync_consumer_profiles"
	mCopies             = "hubsync_consumer_credential_copies"
	mStale              = "hubsync_consumer_credential_copies_stale"
	mOldestCopy         = "hubsync_consumer_credential_copy_oldest_timestamp_seconds"
	mSinkUp             = "hubsync_sink_up"
	mSinkDepth          = "hubsync_sink_queue_depth"
	mSinkOldest         = "hubsync_sink_oldest_waiting_timestamp_seconds"
	mSinkLastSuccess    = "hubsync_sink_last_success_timestamp_seconds"
	mTunnelState        = "hubsync_tunnel_state"
	mTunnelSince        = "hubsync_tunnel_state_since_timestamp_seconds"
	mTunnelEntries      = "hubsync_tunnel_entries"
	mGatewayRequests    = "hubsync_gateway_requests_total"
	mGatewayRefused     = "hubsync_gateway_refused_total"
	mGatewayReviews     = "hubsync_gateway_token_reviews_total"
	mGatewayUpgraded    = "hubsync_gateway_upgraded_connections"
	mBusReplicas        = "hubsync_bus_stream_replicas"
	mBusCopyLag         = "hubsync_bus_copy_lag"
	mBusCopyFailing     = "hubsync_bus_copy_failing"
	reviewResultError   = "error"
	tunnelStateFailing  = "failing"
	tunnelStateReady    = "ready"
	tunnelStateConnects = "connecting"
)

// MaxFailingTunnels bounds the failing tunnels a status names; the rest
// are counted.
const MaxFailingTunnels = 20

// Status is a daemon's state as `hubsync status -o json` prints it. The
// shape is stable: fields are added, never renamed or removed. Times are
// RFC 3339; ages are seconds at the time of the reading. A part the
// daemon does not run (the tunnel pool, the gateway, configuration
// reloads) is absent; so are the consumer namespaces and sinks on a
// replica that does not lead, since only the leader runs them.
type Status struct {
	Address string    `json:"address"`
	At      time.Time `json:"at"`
	// Ready is what /readyz answers; Reason its first line.
	Ready  bool   `json:"ready"`
	Reason string `json:"reason"`

	Leader    Leader     `json:"leader"`
	Hub       *Hub       `json:"hub,omitempty"`
	Config    *Config    `json:"config,omitempty"`
	Consumers *Consumers `json:"consumers,omitempty"`
	Sinks     []Sink     `json:"sinks,omitempty"`
	Tunnels   *Tunnels   `json:"tunnels,omitempty"`
	Gateway   *Gateway   `json:"gateway,omitempty"`
	Bus       *Bus       `json:"bus,omitempty"`
}

// Bus is the embedded NATS server's health as this replica's node sees
// it: the event stream's replicas (absent before the stream exists) and
// every application's copies.
type Bus struct {
	StreamReplicas *StreamReplicas `json:"streamReplicas,omitempty"`
	Copies         []Copy          `json:"copies"`
}

// StreamReplicas counts the event stream's replicas by state.
type StreamReplicas struct {
	Current int `json:"current"`
	Behind  int `json:"behind"`
	Offline int `json:"offline"`
}

// Copy is one application's copies of the events and records.
type Copy struct {
	Consumer   string `json:"consumer"`
	EventsLag  int    `json:"eventsLag"`
	RecordsLag int    `json:"recordsLag"`
	Failing    bool   `json:"failing"`
}

// Leader says who leads.
type Leader struct {
	// Leading: this replica holds the leader Lease (or runs without
	// leader election).
	Leading bool `json:"leading"`
	// Identity is the Lease holder as this replica last saw it: the pod
	// name, "_" and a random suffix; "" when not known yet.
	Identity string `json:"identity,omitempty"`
}

// Hub is whether hubsync's probe reaches the hub's API server.
type Hub struct {
	Reachable bool `json:"reachable"`
}

// Config is the state of configuration reloads.
type Config struct {
	LastReloadSuccessful bool       `json:"lastReloadSuccessful"`
	LastSuccess          *time.Time `json:"lastSuccess,omitempty"`
	// Reloads counts the reloads that changed something or were
	// rejected; a reload of an unchanged file is not one.
	Reloads         int `json:"reloads"`
	RejectedReloads int `json:"rejectedReloads"`
	// RestartRequired: a reload changed settings that only a restart
	// applies.
	RestartRequired bool `json:"restartRequired"`
}

// Consumers is what the consumer namespaces hold, in total and per
// namespace (sorted by name).
type Consumers struct {
	Profiles    int `json:"profiles"`
	Copies      int `json:"copies"`
	StaleCopies int `json:"staleCopies"`
	// OldestCopySyncedAt is when the oldest copy was last brought in step
	// with its source; OldestCopyAgeSeconds how long before the reading.
	OldestCopySyncedAt   *time.Time  `json:"oldestCopySyncedAt,omitempty"`
	OldestCopyAgeSeconds *float64    `json:"oldestCopyAgeSeconds,omitempty"`
	Namespaces           []Namespace `json:"namespaces"`
}

// Namespace is what one consumer namespace holds.
type Namespace struct {
	Name                 string     `json:"name"`
	Profiles             int        `json:"profiles"`
	Copies               int        `json:"copies"`
	StaleCopies          int        `json:"staleCopies"`
	OldestCopySyncedAt   *time.Time `json:"oldestCopySyncedAt,omitempty"`
	OldestCopyAgeSeconds *float64   `json:"oldestCopyAgeSeconds,omitempty"`
}

// Sink is one sink's health and backlog.
type Sink struct {
	Name string `json:"name"`
	Type string `json:"type"`
	Up   bool   `json:"up"`
	// Error is the failing sink's last error, as /readyz?verbose says it.
	Error  string `json:"error,omitempty"`
	Queued int    `json:"queued"`
	// OldestWaitingSince is when the oldest waiting change was queued;
	// absent when none waits.
	OldestWaitingSince      *time.Time `json:"oldestWaitingSince,omitempty"`
	OldestWaitingAgeSeconds *float64   `json:"oldestWaitingAgeSeconds,omitempty"`
	// LastSuccess is the last delivery (for a webhook, the last event its
	// endpoint took); absent before the first.
	LastSuccess *time.Time `json:"lastSuccess,omitempty"`
}

// Tunnels is this replica's tunnel pool.
type Tunnels struct {
	Ready      int `json:"ready"`
	Failing    int `json:"failing"`
	Connecting int `json:"connecting"`
	// FailingTunnels names the failing entries, longest failing first, at
	// most MaxFailingTunnels; FailingNotListed counts the others.
	FailingTunnels   []FailingTunnel `json:"failingTunnels"`
	FailingNotListed int             `json:"failingNotListed"`
}

// FailingTunnel is one failing pool entry.
type FailingTunnel struct {
	Cluster string     `json:"cluster"`
	Since   *time.Time `json:"since,omitempty"`
	// Reason is why, as /readyz?verbose says it (it lists at most 100
	// entries, so a reason may be missing in a very large fleet).
	Reason string `json:"reason,omitempty"`
}

// Gateway is this replica's access gateway traffic since it started.
type Gateway struct {
	// Requests counts answered requests by status class: "2xx", "3xx",
	// "4xx", "5xx" (and "other").
	Requests            map[string]float64 `json:"requests"`
	Refused             float64            `json:"refused"`
	TokenReviewErrors   float64            `json:"tokenReviewErrors"`
	UpgradedConnections float64            `json:"upgradedConnections"`
	// Rates are per second over the interval between two readings
	// (--interval); absent with one reading, or when a counter went back
	// (the daemon restarted in between).
	Rates *GatewayRates `json:"rates,omitempty"`
}

// GatewayRates are the gateway's counters per second between two readings.
type GatewayRates struct {
	IntervalSeconds   float64            `json:"intervalSeconds"`
	Requests          map[string]float64 `json:"requests"`
	Refused           float64            `json:"refused"`
	TokenReviewErrors float64            `json:"tokenReviewErrors"`
}

// Summarize sums up cur, a reading of the daemon at address; prev, an
// earlier reading or nil, gives the gateway's rates.
func Summarize(address string, cur, prev *Scrape) Status {
	m := metrics(cur.Metrics)
	st := Status{Address: address, At: cur.At.UTC(), Ready: cur.Ready, Reason: cur.Reason}
	st.Leader.Leading = m.value(mLeader, nil) == 1
	for _, s := range m.series(mLeaderInfo) {
		if value(s) == 1 {
			st.Leader.Identity = label(s, "identity")
		}
	}
	if m.has(mHubReachable) {
		st.Hub = &Hub{Reachable: m.value(mHubReachable, nil) == 1}
	}
	if m.has(mReloadOK) {
		st.Config = &Config{
			LastReloadSuccessful: m.value(mReloadOK, nil) == 1,
			LastSuccess:          timestamp(m.value(mReloadSuccessAt, nil)),
			Reloads: int(m.value(mReloads, map[string]string{"result": "applied"}) +
				m.value(mReloads, map[string]string{"result": "rejected"})),
			RejectedReloads: int(m.value(mReloads, map[string]string{"result": "rejected"})),
			RestartRequired: m.value(mRestartRequired, nil) == 1,
		}
	}
	if st.Leader.Leading {
		st.Consumers = consumers(m, cur.At)
		st.Sinks = sinks(m, cur)
	}
	if m.has(mTunnelState) || m.has(mTunnelEntries) {
		st.Tunnels = tunnels(m, cur)
	}
	if m.has(mBusCopyFailing) || m.has(mBusReplicas) {
		st.Bus = bus(m)
	}
	if m.has(mGatewayUpgraded) {
		st.Gateway = gateway(m)
		if prev != nil {
			st.Gateway.Rates = rates(st.Gateway, gateway(metrics(prev.Metrics)), cur.At.Sub(prev.At))
		}
	}
	return st
}

func bus(m metrics) *Bus {
	b := &Bus{Copies: []Copy{}}
	if m.has(mBusReplicas) {
		state := func(s string) int { return int(m.value(mBusReplicas, map[string]string{"state": s})) }
		b.StreamReplicas = &StreamReplicas{Current: state("current"), Behind: state("behind"), Offline: state("offline")}
	}
	for _, s := range m.series(mBusCopyFailing) {
		c := label(s, "consumer")
		b.Copies = append(b.Copies, Copy{
			Consumer:   c,
			Failing:    value(s) == 1,
			EventsLag:  int(m.value(mBusCopyLag, map[string]string{"consumer": c, "copy": "events"})),
			RecordsLag: int(m.value(mBusCopyLag, map[string]string{"consumer": c, "copy": "records"})),
		})
	}
	slices.SortFunc(b.Copies, func(x, y Copy) int { return cmp.Compare(x.Consumer, y.Consumer) })
	return b
}

func consumers(m metrics, now time.Time) *Consumers {
	byNS := map[string]*Namespace{}
	get := func(s *dto.Metric) *Namespace {
		ns := label(s, "consumer_namespace")
		if byNS[ns] == nil {
			byNS[ns] = &Namespace{Name: ns}
		}
		return byNS[ns]
	}
	for _, s := range m.series(mProfiles) {
		get(s).Profiles = int(value(s))
	}
	for _, s := range m.series(mCopies) {
		get(s).Copies = int(value(s))
	}
	for _, s := range m.series(mStale) {
		get(s).StaleCopies = int(value(s))
	}
	for _, s := range m.series(mOldestCopy) {
		n := get(s)
		n.OldestCopySyncedAt = timestamp(value(s))
		n.OldestCopyAgeSeconds = ageOf(now, n.OldestCopySyncedAt)
	}
	c := &Consumers{Namespaces: []Namespace{}}
	for _, n := range byNS {
		c.Profiles += n.Profiles
		c.Copies += n.Copies
		c.StaleCopies += n.StaleCopies
		if n.OldestCopySyncedAt != nil && (c.OldestCopySyncedAt == nil || n.OldestCopySyncedAt.Before(*c.OldestCopySyncedAt)) {
			c.OldestCopySyncedAt = n.OldestCopySyncedAt
		}
		c.Namespaces = append(c.Namespaces, *n)
	}
	c.OldestCopyAgeSeconds = ageOf(now, c.OldestCopySyncedAt)
	slices.SortFunc(c.Namespaces, func(a, b Namespace) int { return cmp.Compare(a.Name, b.Name) })
	return c
}

// sinkLine reads a failing sink's error from its /readyz?verbose line:
// "sink <name> (<type>): failing[ for <d>] (<n> attempts): <error>, <n> queued...".
var sinkLine = regexp.MustCompile(`^sink (\S+) \(([^)]*)\): failing(?: for \S+)? \(\d+ attempts\): (.*), \d+ queued`)

func sinks(m metrics, cur *Scrape) []Sink {
	errs := map[string]string{}
	for _, l := range cur.Lines {
		if g := sinkLine.FindStringSubmatch(l); g != nil {
			errs[g[1]] = g[3]
		}
	}
	var out []Sink
	for _, s := range m.series(mSinkUp) {
		name, typ := label(s, "sink"), label(s, "type")
		sel := map[string]string{"sink": name}
		k := Sink{Name: name, Type: typ, Up: value(s) == 1, Queued: int(m.value(mSinkDepth, sel)),
			OldestWaitingSince: timestamp(m.value(mSinkOldest, sel)), LastSuccess: timestamp(m.value(mSinkLastSuccess, sel))}
		k.OldestWaitingAgeSeconds = ageOf(cur.At, k.OldestWaitingSince)
		if !k.Up {
			k.Error = errs[name]
		}
		out = append(out, k)
	}
	slices.SortFunc(out, func(a, b Sink) int { return cmp.Compare(a.Name, b.Name) })
	return out
}

// tunnelLine reads a failing entry's reason from its /readyz?verbose line:
// "tunnel <cluster>: failing for <d>: <reason>".
var tunnelLine = regexp.MustCompile(`^tunnel (\S+): failing for \S+: (.*)$`)

func tunnels(m metrics, cur *Scrape) *Tunnels {
	reasons := map[string]string{}
	for _, l := range cur.Lines {
		if g := tunnelLine.FindStringSubmatch(l); g != nil {
			reasons[g[1]] = g[2]
		}
	}
	t := &Tunnels{FailingTunnels: []FailingTunnel{}}
	var failing []FailingTunnel
	for _, s := range m.series(mTunnelState) {
		if value(s) != 1 {
			continue
		}
		cluster := label(s, "cluster")
		switch label(s, "state") {
		case tunnelStateReady:
			t.Ready++
		case tunnelStateConnects:
			t.Connecting++
		case tunnelStateFailing:
			t.Failing++
			failing = append(failing, FailingTunnel{Cluster: cluster, Reason: reasons[cluster],
				Since: timestamp(m.value(mTunnelSince, map[string]string{"cluster": cluster}))})
		}
	}
	slices.SortFunc(failing, func(a, b FailingTunnel) int {
		var ta, tb time.Time
		if a.Since != nil {
			ta = *a.Since
		}
		if b.Since != nil {
			tb = *b.Since
		}
		return cmp.Or(ta.Compare(tb), cmp.Compare(a.Cluster, b.Cluster))
	})
	if len(failing) > MaxFailingTunnels {
		t.FailingNotListed = len(failing) - MaxFailingTunnels
		failing = failing[:MaxFailingTunnels]
	}
	t.FailingTunnels = append(t.FailingTunnels, failing...)
	return t
}

func gateway(m metrics) *Gateway {
	g := &Gateway{Requests: map[string]float64{}}
	for _, s := range m.series(mGatewayRequests) {
		g.Requests[codeClass(label(s, "code"))] += value(s)
	}
	g.Refused = m.value(mGatewayRefused, nil)
	g.TokenReviewErrors = m.value(mGatewayReviews, map[string]string{"result": reviewResultError})
	g.UpgradedConnections = m.value(mGatewayUpgraded, nil)
	return g
}

func rates(cur, prev *Gateway, d time.Duration) *GatewayRates {
	secs := d.Seconds()
	if secs <= 0 {
		return nil
	}
	r := &GatewayRates{IntervalSeconds: secs, Requests: map[string]float64{}}
	for class, n := range cur.Requests {
		if n < prev.Requests[class] {
			return nil
		}
		r.Requests[class] = (n - prev.Requests[class]) / secs
	}
	if cur.Refused < prev.Refused || cur.TokenReviewErrors < prev.TokenReviewErrors {
		return nil
	}
	r.Refused = (cur.Refused - prev.Refused) / secs
	r.TokenReviewErrors = (cur.TokenReviewErrors - prev.TokenReviewErrors) / secs
	return r
}

// codeClass is "2xx" for "200".
func codeClass(code string) string {
	n, err := strconv.Atoi(code)
	if err != nil || n < 100 || n > 599 {
		return "other"
	}
	return strconv.Itoa(n/100) + "xx"
}

// metrics are the families of one reading.
type metrics map[string]*dto.MetricFamily

func (m metrics) has(name string) bool { return m[name] != nil }

func (m metrics) series(name string) []*dto.Metric {
	if mf := m[name]; mf != nil {
		return mf.GetMetric()
	}
	return nil
}

// value sums the values of name's series that carry every label in sel.
func (m metrics) value(name string, sel map[string]string) float64 {
	var sum float64
	for _, s := range m.series(name) {
		ok := true
		for k, v := range sel {
			ok = ok && label(s, k) == v
		}
		if ok {
			sum += value(s)
		}
	}
	return sum
}

func value(s *dto.Metric) float64 {
	switch {
	case s.Gauge != nil:
		return s.GetGauge().GetValue()
	case s.Counter != nil:
		return s.GetCounter().GetValue()
	case s.Untyped != nil:
		return s.GetUntyped().GetValue()
	}
	return 0
}

func label(s *dto.Metric, name string) string {
	for _, l := range s.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// timestamp is a Unix time in seconds as a time; nil for 0 (never).
func timestamp(secs float64) *time.Time {
	if secs <= 0 || math.IsNaN(secs) || math.IsInf(secs, 0) {
		return nil
	}
	whole, frac := math.Modf(secs)
	t := time.Unix(int64(whole), int64(frac*1e9)).UTC()
	return &t
}

// ageOf is how many seconds before now t was, rounded to the millisecond;
// nil when t is.
func ageOf(now time.Time, t *time.Time) *float64 {
	if t == nil {
		return nil
	}
	a := math.Round(max(now.Sub(*t).Seconds(), 0)*1000) / 1000
	return &a
}

// podOf is the pod name in a Lease identity, "<host>_<suffix>".
func podOf(identity string) string {
	if i := strings.LastIndex(identity, "_"); i > 0 {
		return identity[:i]
	}
	return identity
}
