package chart_test

import (
	"testing"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/lint/support"

	"github.com/hubsync/hubsync/test/chart"
)

// TestLint runs `helm lint --strict` on the chart with its default values
// and with every optional part on: a warning fails as an error does. The
// one message let through is Helm's INFO that Chart.yaml has no icon.
func TestLint(t *testing.T) {
	dir, err := chart.Dir()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		values string
	}{
		{"defaults", `{}`},
		{"everything on", `
serviceMonitor: {enabled: true}
prometheusRule: {enabled: true}
dashboard: {enabled: true}
clusterPermission: {clusters: [cluster-a]}
config:
  gateway: {enabled: true}
  tunnel: {enabled: true, managedServiceAccount: hubsync-gateway}
`},
		{"credentials off, one replica", `
replicas: 1
config: {credentials: {enabled: false}}
`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lint := action.NewLint()
			lint.Strict = true
			lint.Namespace = chart.Namespace
			kv := chart.KubeVersion
			lint.KubeVersion = &kv
			res := lint.Run([]string{dir}, parseValues(t, tt.values))
			if res.TotalChartsLinted != 1 {
				t.Fatalf("linted %d charts; errors: %v", res.TotalChartsLinted, res.Errors)
			}
			for _, m := range res.Messages {
				if m.Severity == support.InfoSev && m.Path == "Chart.yaml" && contains(m.Err.Error(), "icon is recommended") {
					t.Logf("let through: %s", m)
					continue
				}
				t.Errorf("helm lint: %s", m)
			}
			for _, err := range res.Errors {
				t.Errorf("helm lint --strict: %v", err)
			}
		})
	}
}
