package bus

import "github.com/prometheus/client_golang/prometheus"

// metrics are the bus's collectors, all named hubsync_bus_*, so that one
// prefix finds everything the NATS sink reports.
type metrics struct {
	published       *prometheus.CounterVec
	duplicates      prometheus.Counter
	publishErrors   prometheus.Counter
	publishDuration prometheus.Histogram
	connected       prometheus.Gauge
	resyncs         prometheus.Counter
	kvWrites        *prometheus.CounterVec
	kvErrors        prometheus.Counter
	batchSize       prometheus.Histogram
	// The embedded server's health, refreshed every healthEvery.
	copyLag        *prometheus.GaugeVec
	copyFailing    *prometheus.GaugeVec
	streamReplicas *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		published: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hubsync_bus_events_published_total",
			Help: "Events acknowledged by JetStream, by CloudEvents type (duplicates included).",
		}, []string{"type"}),
		duplicates: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hubsync_bus_events_duplicates_total",
			Help: "Events JetStream acknowledged as duplicates of one stored within the duplicate window (republished state).",
		}),
		publishErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hubsync_bus_publish_errors_total",
			Help: "Failed publish attempts (each is retried), and changes that could not be encoded (skipped).",
		}),
		publishDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "hubsync_bus_publish_duration_seconds",
			Help:    "Time from sending an event to JetStream's acknowledgement, per attempt.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 3, 12),
		}),
		connected: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "hubsync_bus_connected",
			Help: "1 while connected to NATS.",
		}),
		resyncs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hubsync_bus_resyncs_total",
			Help: "Times the current state was republished to NATS (after a (re)connect, a restart or dropped changes).",
		}),
		kvWrites: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hubsync_bus_kv_writes_total",
			Help: "Successful writes to the access-record KV bucket, by operation (put, delete).",
		}, []string{"op"}),
		kvErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hubsync_bus_kv_write_errors_total",
			Help: "Failed writes to the access-record KV bucket (each is retried).",
		}),
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "hubsync_bus_publish_batch_size",
			Help:    "Changes published together in one pipelined batch (bus.batchWindow).",
			Buckets: prometheus.ExponentialBuckets(1, 2, 9),
		}),
		copyLag: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "hubsync_bus_copy_lag",
			Help: "Messages of hubsync's stream (copy=events) or bucket (copy=records) an application's copy has still to take, as the embedded server last counted.",
		}, []string{"consumer", "copy"}),
		copyFailing: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "hubsync_bus_copy_failing",
			Help: "1 while an application's copies cannot be read or the server reports an error sourcing them.",
		}, []string{"consumer"}),
		streamReplicas: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "hubsync_bus_stream_replicas",
			Help: "Replicas of the event stream by state (current, behind, offline), as the embedded cluster reports them; below bus.stream.replicas current, the stream has lost redundancy.",
		}, []string{"state"}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{
		m.published, m.duplicates, m.publishErrors, m.publishDuration, m.connected, m.resyncs, m.kvWrites, m.kvErrors, m.batchSize,
		m.copyLag, m.copyFailing, m.streamReplicas,
	} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
