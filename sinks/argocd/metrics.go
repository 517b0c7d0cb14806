package argocd

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
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
	if reg != nil {
		if err := reg.Register(vec); err != nil {
			var are prometheus.AlreadyRegisteredError
			existing, ok := (*prometheus.GaugeVec)(nil), false
			if errors.As(err, &are) {
				existing, ok = are.ExistingCollector.(*prometheus.GaugeVec)
			}
			if !ok {
				return conflictGauge{}, fmt.Errorf("register metrics: %w", err)
			}
			vec = existing
		}
	}
	g := conflictGauge{vec: vec, sink: sink}
	g.set(0)
	return g, nil
}

func (g conflictGauge) set(n int) { g.vec.WithLabelValues(g.sink).Set(float64(n)) }

func (g conflictGauge) forget() { g.vec.DeleteLabelValues(g.sink) }
