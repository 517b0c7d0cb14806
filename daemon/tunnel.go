package daemon

import (
	"fmt"
	"io"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/record"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/hubcache"
	"github.com/hubsync/hubsync/stream"
	"github.com/hubsync/hubsync/tunnel"
)

// newTunnelPool builds the tunnel pool, the source of its targets and the
// closer of its dialer's connections (nil for a dialer that holds none)
// from the configuration.
func newTunnelPool(cfg *config.Config, hc *hubcache.Cache, notifier stream.Notifier,
	recorder record.EventRecorder, log *slog.Logger, reg prometheus.Registerer) (*tunnel.Pool, *tunnel.Source, io.Closer, error) {
	tc := cfg.Tunnel
	var dialer tunnel.Dialer
	var closer io.Closer
	switch tc.Transport {
	case config.TunnelDirect:
		dialer = &tunnel.DirectDialer{}
	default:
		k := tc.Konnectivity
		d, err := tunnel.NewKonnectivityDialer(tunnel.KonnectivityConfig{
			Address: k.Address, CAFile: k.CAFile, CertFile: k.CertFile, KeyFile: k.KeyFile, ServerName: k.ServerName,
			Connections: k.Connections, SingleUse: k.SingleUse, Log: log, Registerer: reg,
		})
		if err != nil {
			return nil, nil, nil, fmt.Errorf("tunnel: %w", err)
		}
		dialer, closer = d, d
	}
	opts := tunnel.OptionsFor(tc)
	opts.Dialer, opts.Notifier, opts.Recorder, opts.Log, opts.Registerer = dialer, notifier, recorder, log, reg
	pool, err := tunnel.New(opts)
	if err != nil {
		return nil, nil, nil, err
	}
	var selector labels.Selector
	if tc.ClusterSelector != nil {
		if selector, err = metav1.LabelSelectorAsSelector(tc.ClusterSelector); err != nil {
			return nil, nil, nil, fmt.Errorf("tunnel.clusterSelector: %w", err)
		}
	}
	src, err := tunnel.NewSource(hc, tunnel.SourceOptions{
		Transport: tc.Transport, DialAddress: tc.Konnectivity.DialAddress, ServerName: tc.ServerName,
		ManagedServiceAccount: tc.ManagedServiceAccount, Selector: selector, ResyncPeriod: cfg.ResyncPeriod.Duration,
		ClusterManager: cfg.ClusterManager,
	}, pool, log)
	if err != nil {
		return nil, nil, nil, err
	}
	return pool, src, closer, nil
}
