package gateway

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	requests *prometheus.CounterVec
	refused  *prometheus.CounterVec
	duration *prometheus.HistogramVec
	reviews  *prometheus.CounterVec
	hits     prometheus.Counter
	// reviewSeconds observes the TokenReviews sent to the hub, by result.
	reviewSeconds *prometheus.HistogramVec
	upgraded      prometheus.Gauge
	fetches       *prometheus.CounterVec
	drained       *prometheus.CounterVec
	// tunnelWait observes how long requests waited for a connecting entry.
	tunnelWait prometheus.Histogram
	// trials counts tokens passed through on a connection of their own
	// until their cluster accepted them, by result.
	trials *prometheus.CounterVec
}

// keyFetch counts the fetches of one kind of key set (hub, cluster).
func (m *metrics) keyFetch(keys string) func(error) {
	return func(err error) {
		result := "ok"
		if err != nil {
			result = "error"
		}
		m.fetches.WithLabelValues(keys, result).Inc()
	}
}

// review observes a TokenReview the hub answered (or failed to).
func (m *metrics) review(result string, took time.Duration) {
	m.reviewSeconds.WithLabelValues(result).Observe(took.Seconds())
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hubsync_gateway_requests_total",
			Help: "Gateway requests by cluster (empty until the cluster is known to be served, so that clients cannot make up label values), cluster_set (the cluster's ManagedClusterSet, from its cluster.open-cluster-management.io/clusterset label; empty when it has none or the cluster is not known), HTTP code and mode (impersonate, passthrough, refused).",
		}, []string{"cluster", "cluster_set", "code", "mode"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hubsync_gateway_refused_total",
			Help: "Gateway requests answered by the gateway itself instead of a cluster, by reason (connection_header, bad_path, no_token, impersonation_header, credential_in_url, hub_token_refused, not_cluster_token, rate_limited, reviews_busy, cluster_not_served, cluster_not_ready, redirect, identity_mismatch, ...).",
		}, []string{"reason"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "hubsync_gateway_request_duration_seconds",
			Help:    "Time to serve gateway requests, watches, follows and upgraded connections excluded, by mode and cluster_set (the cluster's ManagedClusterSet; empty when it has none or the cluster is not known).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}, []string{"mode", "cluster_set"}),
		reviews: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hubsync_gateway_token_reviews_total",
			Help: "Bearer tokens checked with the hub's TokenReview, by result: authenticated (a hub identity), unauthenticated, error (the hub could not be asked), busy (too many reviews in flight: not asked), skipped (an expired hub token, refused without asking).",
		}, []string{"result"}),
		reviewSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "hubsync_gateway_token_review_duration_seconds",
			Help:    "Time the hub took to answer the TokenReviews the gateway sent (cache misses only), by result: authenticated, unauthenticated, error (no answer, or an error within the 10s bound).",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"result"}),
		hits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hubsync_gateway_token_review_cache_hits_total",
			Help: "Tokens found authenticated in the review cache (at most 10s old) instead of asking the hub.",
		}),
		fetches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hubsync_gateway_key_fetches_total",
			Help: "Fetches of service-account key sets (JWKS) that tell a hub token from a managed cluster's own, by keys (hub, cluster) and result (ok, error).",
		}, []string{"keys", "result"}),
		upgraded: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "hubsync_gateway_upgraded_connections",
			Help: "Upgraded connections (exec, attach, port-forward over SPDY or WebSocket) open through the gateway.",
		}),
		drained: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hubsync_gateway_drain_ended_requests_total",
			Help: "Requests the gateway ended when it drained (gateway.drain), by kind: watch (a watch or followed log, ended as a clean end of stream for the client to re-establish elsewhere), upgrade (an exec, attach or port-forward connection, closed), forced (still running at gateway.drain.timeout, cut).",
		}, []string{"kind"}),
		tunnelWait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "hubsync_gateway_tunnel_wait_duration_seconds",
			Help:    "Time requests waited for a cluster's tunnel that was still connecting (a replica warming up, a cluster that just joined, an entry dialed on demand), bounded by gateway.tunnelWait.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}),
		trials: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hubsync_gateway_trials_total",
			Help: "Requests with a token passed through that its cluster had not yet accepted, each sent on a connection of its own (a dial) so that a refusal cannot close the connection the cluster's other clients share, by result: accepted (the token shares the connection from then on), refused (the cluster answered 401; remembered), error (no answer).",
		}, []string{"result"}),
	}
	// The fixed label values have their series from the start, so that
	// rate() and the alerts on them see 0 rather than nothing before the
	// first review.
	for _, result := range []string{ReviewAuthenticated, ReviewUnauthenticated, ReviewError} {
		m.reviewSeconds.WithLabelValues(result)
	}
	for _, r := range []string{ReviewAuthenticated, ReviewUnauthenticated, ReviewError, "busy", "skipped"} {
		m.reviews.WithLabelValues(r)
	}
	for _, k := range []string{endedWatch, endedUpgrade, endedForced} {
		m.drained.WithLabelValues(k)
	}
	for _, r := range []string{trialAccepted, trialRefused, trialError} {
		m.trials.WithLabelValues(r)
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.requests, m.refused, m.duration, m.reviews, m.reviewSeconds, m.hits, m.upgraded, m.fetches, m.drained, m.tunnelWait, m.trials} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
