package kueue

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/hubsync/hubsync/sinks"
)

// metrics are the sink's series of the kueue sinks' gauges, labelled by
// sink name.
type metrics struct {
	conflicts, refused, clusters *prometheus.GaugeVec
	sink                         string
}

// newMetrics registers the gauges on reg, or finds them there when
// another kueue sink (or an earlier one of a reload) registered them. A nil
// reg gives gauges that nothing collects.
func newMetrics(reg prometheus.Registerer, sink string) (metrics, error) {
	m := metrics{sink: sink}
	for _, g := range []struct {
		vec  **prometheus.GaugeVec
		opts prometheus.GaugeOpts
	}{
		{&m.conflicts, prometheus.GaugeOpts{
			Name: "hubsync_kueue_conflicts",
			Help: "Objects a kueue sink would write (a MultiKueueCluster, its kubeconfig Secret, the MultiKueueConfig) whose name is taken by one hubsync did not create; they are left alone.",
		}},
		{&m.refused, prometheus.GaugeOpts{
			Name: "hubsync_kueue_refused_kubeconfigs",
			Help: "Profiles of a kueue sink whose kubeconfig Kueue would refuse (InsecureKubeConfig: a server host that is not an IP address or DNS name, ...); it is not written.",
		}},
		{&m.clusters, prometheus.GaugeOpts{
			Name: "hubsync_kueue_clusters",
			Help: "MultiKueueClusters a kueue sink keeps.",
		}},
	} {
		vec, err := sinks.Register(reg, prometheus.NewGaugeVec(g.opts, []string{"sink"}))
		if err != nil {
			return metrics{}, err
		}
		*g.vec = vec
	}
	m.set(0, 0, 0)
	return m, nil
}

func (m metrics) set(conflicts, refused, clusters int) {
	m.conflicts.WithLabelValues(m.sink).Set(float64(conflicts))
	m.refused.WithLabelValues(m.sink).Set(float64(refused))
	m.clusters.WithLabelValues(m.sink).Set(float64(clusters))
}

func (m metrics) forget() {
	for _, v := range []*prometheus.GaugeVec{m.conflicts, m.refused, m.clusters} {
		v.DeleteLabelValues(m.sink)
	}
}
