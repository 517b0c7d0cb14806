package gateway

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	requests *prometheus.CounterVec
	refused  *prometheus.CounterVec
	duration *prometheus.HistogramVec
	reviews  *prometheus.CounterVec
	hits     prometheus.Counter
	upgraded prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hubsync_gateway_requests_total",
			Help: "Gateway requests by cluster (empty until the cluster is known to be served, so that clients cannot make up label values), HTTP code and mode (impersonate, passthrough, refused).",
		}, []string{"cluster", "code", "mode"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hubsync_gateway_refused_total",
			Help: "Gateway requests answered by the gateway itself instead of a cluster, by reason (bad_path, no_token, impersonation_header, hub_token_refused, opaque_token, cluster_not_served, cluster_not_ready, ...).",
		}, []string{"reason"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "hubsync_gateway_request_duration_seconds",
			Help:    "Time to serve gateway requests, watches, follows and upgraded connections excluded, by mode.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}, []string{"mode"}),
		reviews: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hubsync_gateway_token_reviews_total",
			Help: "Bearer tokens checked, by result: authenticated (a hub identity), unauthenticated, error (the hub could not be asked).",
		}, []string{"result"}),
		hits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hubsync_gateway_token_review_cache_hits_total",
			Help: "Tokens found authenticated in the review cache (at most 10s old) instead of asking the hub.",
		}),
		upgraded: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "hubsync_gateway_upgraded_connections",
			Help: "Upgraded connections (exec, attach, port-forward over SPDY or WebSocket) open through the gateway.",
		}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.requests, m.refused, m.duration, m.reviews, m.hits, m.upgraded} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
