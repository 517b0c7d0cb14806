package webhook

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hubsync/hubsync/sinks"
)

// metrics are the webhook sinks' collectors. Every webhook sink makes its
// own and registers them with sinks.Register, which hands the second sink
// the first one's: the series of all webhook sinks live in one collector
// per name, labelled by sink.
type metrics struct {
	requests    *prometheus.CounterVec
	spoolBytes  *prometheus.GaugeVec
	spoolEvents *prometheus.GaugeVec
	dropped     *prometheus.CounterVec
	disabled    *prometheus.GaugeVec
	delivery    *prometheus.HistogramVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hubsync_webhook_requests_total",
			Help: "Requests a webhook sink made, by HTTP status code (\"error\": no response).",
		}, []string{"sink", "code"}),
		spoolBytes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "hubsync_webhook_spool_bytes",
			Help: "Bytes of a webhook sink's on-disk spool.",
		}, []string{"sink"}),
		spoolEvents: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "hubsync_webhook_spool_events",
			Help: "Events waiting in a webhook sink's spool.",
		}, []string{"sink"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hubsync_webhook_spool_dropped_total",
			Help: "Events not spooled because a webhook sink's spool was full; the endpoint is resynced once the spool has drained.",
		}, []string{"sink"}),
		disabled: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "hubsync_webhook_disabled",
			Help: "1 while a webhook sink is disabled because its endpoint answered 410 Gone (until the sink is recreated).",
		}, []string{"sink"}),
		delivery: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "hubsync_webhook_delivery_duration_seconds",
			Help:    "Time from an event being spooled to its endpoint answering 2xx.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600},
		}, []string{"sink"}),
	}
	var errs [6]error
	m.requests, errs[0] = sinks.Register(reg, m.requests)
	m.spoolBytes, errs[1] = sinks.Register(reg, m.spoolBytes)
	m.spoolEvents, errs[2] = sinks.Register(reg, m.spoolEvents)
	m.dropped, errs[3] = sinks.Register(reg, m.dropped)
	m.disabled, errs[4] = sinks.Register(reg, m.disabled)
	m.delivery, errs[5] = sinks.Register(reg, m.delivery)
	if err := errors.Join(errs[:]...); err != nil {
		return nil, fmt.Errorf("webhook: %w", err)
	}
	return m, nil
}

// sinkMetrics are one sink's series. They look their children up on every
// update instead of keeping them: if a sink of the same name is closed
// after its replacement was made (a configuration reload), the old one's
// forget deletes the series, and the new one's next update brings them back.
type sinkMetrics struct {
	m    *metrics
	name string
}

func (m *metrics) forSink(name string) *sinkMetrics {
	return &sinkMetrics{m: m, name: name}
}

func (s *sinkMetrics) request(code string) {
	s.m.requests.WithLabelValues(s.name, code).Inc()
}

func (s *sinkMetrics) state(bytes int64, events int, disabled bool) {
	s.m.spoolBytes.WithLabelValues(s.name).Set(float64(bytes))
	s.m.spoolEvents.WithLabelValues(s.name).Set(float64(events))
	// The drop counter is there from the start too, so that rate() and
	// an alert on drops see 0 rather than nothing.
	s.m.dropped.WithLabelValues(s.name)
	d := 0.0
	if disabled {
		d = 1
	}
	s.m.disabled.WithLabelValues(s.name).Set(d)
}

func (s *sinkMetrics) drop(n int) {
	s.m.dropped.WithLabelValues(s.name).Add(float64(n))
}

func (s *sinkMetrics) delivered(seconds float64) {
	s.m.delivery.WithLabelValues(s.name).Observe(seconds)
}

// forget deletes the sink's series, so a sink taken out of the
// configuration leaves none behind.
func (s *sinkMetrics) forget() {
	s.m.requests.DeletePartialMatch(prometheus.Labels{"sink": s.name})
	s.m.spoolBytes.DeleteLabelValues(s.name)
	s.m.spoolEvents.DeleteLabelValues(s.name)
	s.m.dropped.DeleteLabelValues(s.name)
	s.m.disabled.DeleteLabelValues(s.name)
	s.m.delivery.DeleteLabelValues(s.name)
}
