package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"net"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/gateway"
	"github.com/hubsync/hubsync/hubcache"
	"github.com/hubsync/hubsync/tunnel"
)

// startGateway builds the access gateway over the pool and starts serving
// it, on every replica. It answers 503 until the pool knows the hub's
// clusters.
func (d *daemon) startGateway(ctx context.Context) error {
	if !d.cfg.Gateway.Enabled || d.pool == nil {
		return nil
	}
	d.gateway = newTask(context.WithoutCancel(ctx)) // stopped in shutdown, after the drain delay
	log := d.log.With("component", "gateway")
	serveGateway, err := newGateway(d.gateway.ctx, d.cfg, d.restCfg, d.cache, d.opts.Version, d.pool, d.serving, log, d.reg)
	if err != nil {
		return err
	}
	d.goRun(d.gateway, "gateway", serveGateway)
	return nil
}

// newGateway builds the gateway and its listener, and returns the function
// that serves it until its context ends. The Secret holding its serving
// certificate, if any, is watched until ctx ends.
func newGateway(ctx context.Context, cfg *config.Config, hub *rest.Config, hc *hubcache.Cache, version string, pool *tunnel.Pool,
	serving func() (bool, string), log *slog.Logger, reg prometheus.Registerer) (func(context.Context) error, error) {
	gc := cfg.Gateway
	// A hub client of its own: strangers' TokenReviews are paced apart
	// from the syncer's writes (and deploy/flowcontrol.yaml gives them a
	// priority level of their own on the hub).
	own := rest.CopyConfig(hub)
	own.QPS, own.Burst = gc.HubQPS, gc.HubBurst
	own.UserAgent = "hubsync-gateway/" + version
	kube, err := kubernetes.NewForConfig(own)
	if err != nil {
		return nil, fmt.Errorf("gateway hub client: %w", err)
	}
	var certs gateway.CertSource
	if s := gc.TLS.Secret; s != nil {
		sc := &gateway.SecretCert{Namespace: s.Namespace, Name: s.Name, Log: log}
		if err := sc.Run(ctx, hc); err != nil {
			return nil, fmt.Errorf("gateway: watching Secret %s/%s: %w", s.Namespace, s.Name, err)
		}
		certs = sc
	} else {
		fc, err := gateway.NewFileCert(gc.TLS.CertFile, gc.TLS.KeyFile, log)
		if err != nil {
			return nil, err
		}
		certs = fc
	}
	hubKeys := &gateway.KeySet{Fetch: func(ctx context.Context) ([]byte, error) {
		return kube.CoreV1().RESTClient().Get().AbsPath("/openid/v1/jwks").DoRaw(ctx)
	}}
	opts := gateway.OptionsFor(gc)
	opts.Pool, opts.Reviewer, opts.HubKeys, opts.Serving = pool, gateway.TokenReviewer{Kube: kube}, hubKeys, serving
	opts.Log, opts.Registerer = log, reg
	g, err := gateway.New(opts)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", gc.Listen)
	if err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	log.Info("serving the access gateway", "address", ln.Addr().String(), "url", gc.URL, "passThrough", gc.PassThrough,
		"impersonator", cfg.Tunnel.ManagedServiceAccount)
	return func(ctx context.Context) error {
		so := gateway.ServerOptionsFor(gc)
		so.Certs, so.Log = certs, log
		return gateway.Serve(ctx, ln, g, so)
	}, nil
}
