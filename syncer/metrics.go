package syncer

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the syncer's Prometheus collectors. They are registered on the
// registry passed to New, never on a global one.
type metrics struct {
	reconciles       *prometheus.CounterVec
	reconcileSeconds *prometheus.HistogramVec
	writes           *prometheus.CounterVec
	writeErrors      *prometheus.CounterVec
	conflicts        prometheus.Gauge
	conflictsTotal   prometheus.Counter
	invalidSets      prometheus.Gauge
	skippedClaims    prometheus.Counter
	caRotations      prometheus.Counter
	queueDepth       *queueDepths
	foreignWrites    *prometheus.CounterVec
	contested        *contestedObjects
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		reconciles: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hubsync_reconcile_total",
			Help: "Reconciliations by controller and result (success, error).",
		}, []string{"controller", "result"}),
		reconcileSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "hubsync_reconcile_duration_seconds",
			Help:    "Time one reconciliation of a key took, writes included.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}, []string{"controller"}),
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hubsync_profile_writes_total",
			Help: "ClusterProfile writes sent to the hub by operation (create, update, status, delete).",
		}, []string{"op"}),
		writeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hubsync_profile_write_errors_total",
			Help: "ClusterProfile writes the hub refused, by operation.",
		}, []string{"op"}),
		conflicts: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "hubsync_profile_conflicts",
			Help: "Desired profiles blocked by a same-named ClusterProfile of another cluster manager.",
		}),
		conflictsTotal: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hubsync_profile_conflicts_detected_total",
			Help: "Conflicts with foreign ClusterProfiles detected since start.",
		}),
		invalidSets: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "hubsync_invalid_cluster_sets",
			Help: "ManagedClusterSets whose cluster selector cannot be evaluated; their namespaces' profiles are held as they are.",
		}),
		skippedClaims: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hubsync_cluster_claims_skipped_total",
			Help: "Cluster claims left out of profile properties because the ClusterProfile schema would reject them.",
		}),
	}
	m.queueDepth = &queueDepths{
		vec: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "hubsync_queue_depth",
			Help: "Keys waiting in a work queue, by queue (topology, credentials).",
		}, []string{"queue"}),
		queues: map[string]func() int{},
	}
	m.caRotations = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "hubsync_access_provider_ca_changes_total",
		Help: "Changes of an access provider's CA bundle seen in its Secret or file.",
	})
	m.foreignWrites = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "hubsync_foreign_writes_total",
		Help: "Writes by another controller that undid what hubsync wrote, by kind of object (profile, credential).",
	}, []string{"kind"})
	m.contested = &contestedObjects{vec: prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "hubsync_contested_objects",
		Help: "Objects another controller keeps writing too, which hubsync leaves alone for a growing hold-off, by kind (profile, credential).",
	}, []string{"kind"})}
	for _, k := range Kinds() {
		m.foreignWrites.WithLabelValues(k)
	}
	// Every operation has its series from the start, so that rate() and
	// an alert on errors see 0 rather than nothing.
	for _, op := range profileOps {
		m.writes.WithLabelValues(op)
		m.writeErrors.WithLabelValues(op)
	}
	for _, op := range credentialOps {
		m.writeErrors.WithLabelValues("credential-" + op)
	}
	reg.MustRegister(m.caRotations, m.reconciles, m.reconcileSeconds, m.writes, m.writeErrors,
		m.conflicts, m.conflictsTotal, m.invalidSets, m.skippedClaims, m.queueDepth, m.foreignWrites, m.contested)
	return m
}

// profileOps are the operations of hubsync_profile_writes_total, and
// credentialOps those of hubsync_credential_writes_total (counted in
// hubsync_profile_write_errors_total as credential-<op>).
var (
	profileOps    = []string{"create", "update", "status", "delete"}
	credentialOps = []string{"create", "update", "delete"}
)

// contestedObjects is hubsync_contested_objects, counted from the
// contested objects when scraped, so that an object is no longer counted
// once its quiet hold-off has passed, whether or not anything happened to
// it since.
type contestedObjects struct {
	vec    *prometheus.GaugeVec
	mu     sync.Mutex
	source func() []Contested
}

// track reports the objects source returns.
func (c *contestedObjects) track(source func() []Contested) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.source = source
}

func (c *contestedObjects) Describe(ch chan<- *prometheus.Desc) { c.vec.Describe(ch) }

func (c *contestedObjects) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	source := c.source
	c.mu.Unlock()
	counts := map[string]int{}
	if source != nil {
		for _, o := range source() {
			counts[o.Kind]++
		}
	}
	for _, k := range Kinds() {
		c.vec.WithLabelValues(k).Set(float64(counts[k]))
	}
	c.vec.Collect(ch)
}

// queueDepths is hubsync_queue_depth: one GaugeVec, labelled by queue and
// registered once, whose values are read from the queues when scraped, so
// a series is never stale and a new queue is one track call.
type queueDepths struct {
	vec    *prometheus.GaugeVec
	mu     sync.Mutex
	queues map[string]func() int
}

// track reports depth as the named queue's series.
func (q *queueDepths) track(name string, depth func() int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.queues[name] = depth
}

func (q *queueDepths) Describe(ch chan<- *prometheus.Desc) { q.vec.Describe(ch) }

func (q *queueDepths) Collect(ch chan<- prometheus.Metric) {
	q.mu.Lock()
	for name, depth := range q.queues {
		q.vec.WithLabelValues(name).Set(float64(depth()))
	}
	q.mu.Unlock()
	q.vec.Collect(ch)
}
