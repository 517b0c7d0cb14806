package main

import (
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	clusterclient "open-cluster-management.io/api/client/cluster/clientset/versioned"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/stream"
	"github.com/hubsync/hubsync/tunnel"
)

// newTunnelPool builds the tunnel pool and the source of its targets from
// the configuration.
func newTunnelPool(cfg *config.Config, clusters clusterclient.Interface, kube kubernetes.Interface, notifier stream.Notifier,
	recorder record.EventRecorder, log *slog.Logger, reg prometheus.Registerer) (*tunnel.Pool, *tunnel.Source, error) {
	tc := cfg.Tunnel
	var dialer tunnel.Dialer
	switch tc.Transport {
	case config.TunnelDirect:
		dialer = &tunnel.DirectDialer{}
	default:
		k := tc.Konnectivity
		d, err := tunnel.NewKonnectivityDialer(tunnel.KonnectivityConfig{
			Address: k.Address, CAFile: k.CAFile, CertFile: k.CertFile, KeyFile: k.KeyFile, ServerName: k.ServerName,
		})
		if err != nil {
			return nil, nil, fmt.Errorf("tunnel: %w", err)
		}
		dialer = d
	}
	pool, err := tunnel.New(tunnel.Options{
		Dialer: dialer, Transport: tc.Transport, ProbePath: tc.ProbePath,
		ProbeInterval: tc.ProbeInterval.Duration, ProbeTimeout: tc.ProbeTimeout.Duration, DialTimeout: tc.DialTimeout.Duration,
		BackoffBase: tc.Backoff.BaseDelay.Duration, BackoffMax: tc.Backoff.MaxDelay.Duration,
		MaxDials: tc.MaxConcurrentDials, MaxUpgradeDials: tc.MaxConcurrentUpgradeDials, MaxConnsPerCluster: tc.MaxConnectionsPerCluster, Notifier: notifier, Recorder: recorder, Log: log, Registerer: reg,
	})
	if err != nil {
		return nil, nil, err
	}
	var selector labels.Selector
	if tc.ClusterSelector != nil {
		if selector, err = metav1.LabelSelectorAsSelector(tc.ClusterSelector); err != nil {
			return nil, nil, fmt.Errorf("tunnel.clusterSelector: %w", err)
		}
	}
	src, err := tunnel.NewSource(clusters, kube, tunnel.SourceOptions{
		Transport: tc.Transport, DialAddress: tc.Konnectivity.DialAddress, ServerName: tc.ServerName,
		ManagedServiceAccount: tc.ManagedServiceAccount, Selector: selector, ResyncPeriod: cfg.ResyncPeriod.Duration,
	}, pool, log)
	if err != nil {
		return nil, nil, err
	}
	return pool, src, nil
}

// maxTunnelLines bounds the clusters /readyz?verbose lists one by one.
const maxTunnelLines = 100

// writeTunnelStatuses writes the pool's summary and the entries that are
// not ready (ready ones too while there are few).
func writeTunnelStatuses(w io.Writer, sts []tunnel.Status, now time.Time) {
	counts := map[tunnel.State]int{}
	for _, s := range sts {
		counts[s.State]++
	}
	fmt.Fprintf(w, "tunnels: %d ready, %d failing, %d connecting\n",
		counts[tunnel.StateReady], counts[tunnel.StateFailing], counts[tunnel.StateConnecting])
	lines := 0
	for _, s := range sts {
		if s.State == tunnel.StateReady && len(sts) > maxTunnelLines {
			continue
		}
		if lines == maxTunnelLines {
			fmt.Fprintf(w, "tunnel ...: more entries not listed; see the hubsync_tunnel_state metric\n")
			return
		}
		lines++
		in := now.Sub(s.Since).Round(time.Second)
		switch s.State {
		case tunnel.StateReady:
			more := ""
			if s.Connections > 1 {
				more = fmt.Sprintf(", %d connections (every stream of one was busy)", s.Connections)
			}
			fmt.Fprintf(w, "tunnel %s: ready for %s, probe %s%s\n", s.Cluster, in, s.ProbeLatency.Round(time.Microsecond), more)
		case tunnel.StateFailing:
			fmt.Fprintf(w, "tunnel %s: failing for %s: %s\n", s.Cluster, in, s.Reason)
		default:
			fmt.Fprintf(w, "tunnel %s: %s for %s\n", s.Cluster, s.State, in)
		}
	}
}
