package argocd

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/hubsync/hubsync/sinks"
)

// conflictGauge is the sink's series of hubsync_argocd_conflicts.
type conflictGauge struct {
	vec  *prometheus.GaugeVec
	sink string
}

// newConflictGauge registers hubsync_argocd_conflicts on reg, or finds it
// there when another Argo CD sink registered it first: every Argo CD sink
// shares the metric, labelled by sink name. A nil reg gives a gauge that
// nothing collects.
func newConflictGauge(reg prometheus.Registerer, sink string) (conflictGauge, error) {
	vec := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "hubsync_argocd_conflicts",
		Help: "Clusters of an Argo CD sink in a conflict: their server is also another cluster's (the first by name gets it) or a foreign cluster Secret's, or their Secret name is taken by a Secret hubsync does not own.",
	}, []string{"sink"})
	vec, err := sinks.Register(reg, vec)
	if err != nil {
		return conflictGauge{}, err
	}
	g := conflictGauge{vec: vec, sink: sink}
	g.set(0)
	return g, nil
}

func (g conflictGauge) set(n int) { g.vec.WithLabelValues(g.sink).Set(float64(n)) }

func (g conflictGauge) forget() { g.vec.DeleteLabelValues(g.sink) }

// skipGauge is the sink's series of hubsync_argocd_clusters_skipped, one
// per reason, with the counts behind them.
type skipGauge struct {
	vec    *prometheus.GaugeVec
	sink   string
	counts map[string]int
}

// newSkipGauge registers hubsync_argocd_clusters_skipped on reg, or finds
// it there, as newConflictGauge does.
func newSkipGauge(reg prometheus.Registerer, sink string) (*skipGauge, error) {
	vec := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "hubsync_argocd_clusters_skipped",
		Help: "Clusters of an Argo CD sink for which it keeps no Secret because the argoproj-labs ClusterProfile integration's Secret already gives Argo CD the cluster: one of the same profile (reason integration-profile) or with the same server (integration-server).",
	}, []string{"sink", "reason"})
	vec, err := sinks.Register(reg, vec)
	if err != nil {
		return nil, err
	}
	g := &skipGauge{vec: vec, sink: sink, counts: map[string]int{}}
	for _, r := range skipReasons {
		g.vec.WithLabelValues(sink, r).Set(0)
	}
	return g, nil
}

// add changes the count of reason by n.
func (g *skipGauge) add(reason string, n int) {
	g.counts[reason] += n
	g.vec.WithLabelValues(g.sink, reason).Set(float64(g.counts[reason]))
}

func (g *skipGauge) forget() {
	for _, r := range skipReasons {
		g.vec.DeleteLabelValues(g.sink, r)
	}
}
