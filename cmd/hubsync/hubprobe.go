package main

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"
)

// probeHub checks the hub API server's /readyz every interval and reports
// when it becomes unreachable and when it is back, with a gauge for alerts.
// Informers retry on their own; this makes an outage visible to operators.
func probeHub(ctx context.Context, kube kubernetes.Interface, interval time.Duration, log *slog.Logger, reg prometheus.Registerer) {
	reachable := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "hubsync_hub_reachable",
		Help: "1 when the last probe of the hub API server's /readyz succeeded, else 0.",
	})
	failures := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "hubsync_hub_probe_failures_total",
		Help: "Failed probes of the hub API server's /readyz.",
	})
	reg.MustRegister(reachable, failures)
	reachable.Set(1)
	var downSince time.Time
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(ctx, interval)
		err := kube.Discovery().RESTClient().Get().AbsPath("/readyz").Do(pctx).Error()
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			failures.Inc()
			reachable.Set(0)
			if downSince.IsZero() {
				downSince = time.Now()
				log.Warn("hub API server unreachable; hubsync keeps its state and retries", "err", err)
			}
		case !downSince.IsZero():
			reachable.Set(1)
			log.Info("hub API server reachable again; resuming", "after", time.Since(downSince).Round(time.Second))
			downSince = time.Time{}
		}
	}
}
