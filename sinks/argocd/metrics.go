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
