package stream

import (
	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	delivered *prometheus.CounterVec
	failures  *prometheus.CounterVec
	dropped   *prometheus.CounterVec
	resyncs   *prometheus.CounterVec
	lag       *prometheus.HistogramVec
}

// newMetrics registers the per-sink metrics. Queue depth, health and last
// success are read from the consumers when scraped, so a removed sink
// leaves no series behind.
func newMetrics(reg prometheus.Registerer, statuses func() []Status) (*metrics, error) {
	m := &metrics{
		delivered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hubsync_sink_delivered_total",
			Help: "Changes delivered to a sink.",
		}, []string{"sink"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hubsync_sink_delivery_failures_total",
			Help: "Failed delivery attempts to a sink (each retried with backoff).",
		}, []string{"sink"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hubsync_sink_dropped_total",
			Help: "Changes dropped because a sink's queue was full; the sink is resynced instead.",
		}, []string{"sink"}),
		resyncs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hubsync_sink_resyncs_total",
			Help: "Times a sink was brought to the current state from a snapshot.",
		}, []string{"sink"}),
		lag: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "hubsync_sink_delivery_lag_duration_seconds",
			Help:    "Time from a change being made to its delivery to a sink.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300},
		}, []string{"sink"}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.delivered, m.failures, m.dropped, m.resyncs, m.lag, &statusCollector{statuses}} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// track gives a new consumer's counters their series at once, so that
// rate() and an alert on failures or drops see 0 rather than nothing.
func (m *metrics) track(name string) {
	m.delivered.WithLabelValues(name)
	m.failures.WithLabelValues(name)
	m.dropped.WithLabelValues(name)
	m.resyncs.WithLabelValues(name)
}

func (m *metrics) forget(name string) {
	m.delivered.DeleteLabelValues(name)
	m.failures.DeleteLabelValues(name)
	m.dropped.DeleteLabelValues(name)
	m.resyncs.DeleteLabelValues(name)
	m.lag.DeleteLabelValues(name)
}

var (
	depthDesc = prometheus.NewDesc("hubsync_sink_queue_depth",
		"Changes waiting for a sink: in its queue and, for a webhook, in its spool.", []string{"sink", "type"}, nil)
	upDesc = prometheus.NewDesc("hubsync_sink_up",
		"0 while a sink is failing (its last hand-over failed, or its target has refused or been out of reach past its failingAfter), else 1.", []string{"sink", "type"}, nil)
	oldestDesc = prometheus.NewDesc("hubsync_sink_oldest_waiting_timestamp_seconds",
		"Unix time at which the oldest change waiting for a sink was queued (0: none waits); time() minus it is the age of its backlog.", []string{"sink", "type"}, nil)
	lastSuccessDesc = prometheus.NewDesc("hubsync_sink_last_success_timestamp_seconds",
		"Unix time of a sink's last successful delivery or resync; for a webhook, of the last event its endpoint took (0: none yet).", []string{"sink", "type"}, nil)
)

type statusCollector struct{ statuses func() []Status }

func (c *statusCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- depthDesc
	ch <- upDesc
	ch <- lastSuccessDesc
	ch <- oldestDesc
}

func (c *statusCollector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range c.statuses() {
		up, last := 0.0, 0.0
		if s.Healthy {
			up = 1
		}
		if !s.LastSuccess.IsZero() {
			last = float64(s.LastSuccess.UnixNano()) / 1e9
		}
		ch <- prometheus.MustNewConstMetric(depthDesc, prometheus.GaugeValue, float64(s.QueueDepth), s.Name, s.Type)
		ch <- prometheus.MustNewConstMetric(upDesc, prometheus.GaugeValue, up, s.Name, s.Type)
		ch <- prometheus.MustNewConstMetric(lastSuccessDesc, prometheus.GaugeValue, last, s.Name, s.Type)
		ch <- prometheus.MustNewConstMetric(oldestDesc, prometheus.GaugeValue, unixSeconds(s.Oldest), s.Name, s.Type)
	}
}
