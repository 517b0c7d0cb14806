package webhook

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the webhook sinks' collectors. Every webhook sink makes its
// own and registers them; the second sink finds them registered and uses
// the first one's (prometheus.AlreadyRegisteredError), so the series of all
// webhook sinks live in one collector per name, labelled by sink.
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
			Name:    "hubsync_webhook_delivery_seconds",
			Help:    "Time from an event being spooled to its endpoint answering 2xx.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600},
		}, []string{"sink"}),
	}
	if reg == nil {
		return m, nil
	}
	var err error
	m.requests, err = register(reg, m.requests)
	if err == nil {
		m.spoolBytes, err = register(reg, m.spoolBytes)
	}
	if err == nil {
		m.spoolEvents, err = register(reg, m.spoolEvents)
	}
	if err == nil {
		m.dropped, err = register(reg, m.dropped)
	}
	if err == nil {
		m.disabled, err = register(reg, m.disabled)
	}
	if err == nil {
		m.delivery, err = register(reg, m.delivery)
	}
	if err != nil {
		return nil, err
	}
	return m, nil
}

// register registers c, or returns the collector of the same name that
// another webhook sink registered before.
func register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	err := reg.Register(c)
	if err == nil {
		return c, nil
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing, nil
		}
	}
	return c, fmt.Errorf("register webhook metrics: %w", err)
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
