package tunnel

import (
	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	dials        *prometheus.CounterVec
	upgradeDials *prometheus.CounterVec
	probes       *prometheus.CounterVec
	requests     *prometheus.CounterVec
	transitions  *prometheus.CounterVec
	goawayWaits  prometheus.Counter
	dialSeconds  prometheus.Histogram
	probeSeconds prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer, statuses func() []Status) (*metrics, error) {
	m := &metrics{
		dials: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hubsync_tunnel_dials_total",
			Help: "Connections dialed by the tunnel pool (tunnel, TLS and HTTP/2), by result.",
		}, []string{"result"}),
		upgradeDials: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hubsync_tunnel_upgrade_dials_total",
			Help: "Connections of their own dialed for upgraded requests (exec, attach, port-forward) and for the gateway's first request with a token passed through, until the cluster has accepted it, by result (ok, error, busy: no slot came free within a dial's time).",
		}, []string{"result"}),
		probes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hubsync_tunnel_probes_total",
			Help: "Probes of tunnel pool entries, by result (ok, error, throttled: answered 429, or 503 with Retry-After; the connection is kept and the next probe waits).",
		}, []string{"result"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hubsync_tunnel_requests_total",
			Help: "Requests sent through the tunnel pool's round trippers, by result (probes excluded).",
		}, []string{"result"}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hubsync_tunnel_transitions_total",
			Help: "Tunnel pool entries entering a state.",
		}, []string{"state"}),
		goawayWaits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hubsync_tunnel_goaway_waits_total",
			Help: "GOAWAYs after which a pool entry waited before dialing a new connection: the connection went away young (within 5s, with fewer than 5 answers), so the redial backoff applies, or GOAWAYs came faster than the pool follows them (10 a second per cluster after a burst of 10).",
		}),
		dialSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "hubsync_tunnel_dial_duration_seconds",
			Help:    "Time to dial a pool entry: tunnel, TLS and HTTP/2 handshakes.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 15),
		}),
		probeSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "hubsync_tunnel_probe_duration_seconds",
			Help:    "Round trip of successful probes of pool entries (a cluster's last one is in its status: hubsync state, /readyz?verbose).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 15),
		}),
	}
	// Every result and state has its series from the start, so that
	// rate() and an alert on errors see 0 rather than nothing.
	m.probes.WithLabelValues("throttled")
	for _, r := range []string{"ok", "error"} {
		m.dials.WithLabelValues(r)
		m.probes.WithLabelValues(r)
		m.requests.WithLabelValues(r)
		m.upgradeDials.WithLabelValues(r)
	}
	m.upgradeDials.WithLabelValues("busy")
	for _, s := range []State{StateConnecting, StateReady, StateFailing} {
		m.transitions.WithLabelValues(string(s))
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.dials, m.upgradeDials, m.probes, m.requests, m.transitions, m.goawayWaits, m.dialSeconds, m.probeSeconds, &stateCollector{statuses}} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// The per-cluster series are one state gauge and one since-timestamp per
// entry: values that change only when the entry's state does, so a fleet
// of thousands of clusters costs one sample each per scrape and nothing
// churns. How long a state has lasted is time() minus the timestamp; each
// cluster's last probe round trip is in its status, and the fleet's in
// hubsync_tunnel_probe_duration_seconds.
var (
	stateDesc = prometheus.NewDesc("hubsync_tunnel_state",
		"1 for each pool entry, labelled with its cluster and current state (connecting, ready, failing).",
		[]string{"cluster", "state"}, nil)
	stateSinceDesc = prometheus.NewDesc("hubsync_tunnel_state_since_timestamp_seconds",
		"Unix time at which each pool entry entered its current state.",
		[]string{"cluster"}, nil)
	entriesDesc = prometheus.NewDesc("hubsync_tunnel_entries",
		"Pool entries by state.",
		[]string{"state"}, nil)
)

// stateCollector reports every entry's state when scraped.
type stateCollector struct{ statuses func() []Status }

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- stateDesc
	ch <- stateSinceDesc
	ch <- entriesDesc
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	counts := map[State]int{StateConnecting: 0, StateReady: 0, StateFailing: 0}
	for _, s := range c.statuses() {
		counts[s.State]++
		ch <- prometheus.MustNewConstMetric(stateDesc, prometheus.GaugeValue, 1, s.Cluster, string(s.State))
		ch <- prometheus.MustNewConstMetric(stateSinceDesc, prometheus.GaugeValue, float64(s.Since.UnixNano())/1e9, s.Cluster)
	}
	for st, n := range counts {
		ch <- prometheus.MustNewConstMetric(entriesDesc, prometheus.GaugeValue, float64(n), string(st))
	}
}
