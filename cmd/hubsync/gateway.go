package main

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
	"github.com/hubsync/hubsync/tunnel"
)

// startGateway builds the access gateway over the pool and starts serving
// it; the returned channel gets the server's error. serving says whether
// the pool runs on this replica (it runs on the leader only).
func startGateway(ctx context.Context, cfg *config.Config, hub *rest.Config, pool *tunnel.Pool,
	serving func() (bool, string), log *slog.Logger, reg prometheus.Registerer) (<-chan error, error) {
	gc := cfg.Gateway
	// A hub client of its own: strangers' TokenReviews are paced apart
	// from the syncer's writes (and deploy/flowcontrol.yaml gives them a
	// priority level of their own on the hub).
	own := rest.CopyConfig(hub)
	own.QPS, own.Burst = gc.HubQPS, gc.HubBurst
	own.UserAgent = "hubsync-gateway/" + buildVersion()
	kube, err := kubernetes.NewForConfig(own)
	if err != nil {
		return nil, fmt.Errorf("gateway hub client: %w", err)
	}
	var certs gateway.CertSource
	if s := gc.TLS.Secret; s != nil {
		sc := &gateway.SecretCert{Namespace: s.Namespace, Name: s.Name, Log: log}
		if err := sc.Run(ctx, kube); err != nil {
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
	g, err := gateway.New(gateway.Options{
		Pool:               pool,
		Reviewer:           gateway.TokenReviewer{Kube: kube},
		ReviewCacheTTL:     gc.ReviewCacheTTL.Duration,
		ReviewCacheSize:    gc.ReviewCacheSize,
		MaxInFlightReviews: gc.MaxInFlightReviews,
		RefusalCacheTTL:    gc.RefusalCacheTTL.Duration,
		RefusalsPerSecond:  gc.RefusalsPerSecond,
		RefusalBurst:       gc.RefusalBurst,
		PassThrough:        gc.PassThrough == config.PassThroughJWT,
		HubKeys:            hubKeys,
		HubIssuers:         gc.HubIssuers,
		ForwardGroups:      gc.ForwardGroups,
		Serving:            serving,
		BodyTimeout:        gc.BodyTimeout.Duration,
		Log:                log,
		Registerer:         reg,
	})
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", gc.Listen)
	if err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	log.Info("serving the access gateway", "address", ln.Addr().String(), "url", gc.URL, "passThrough", gc.PassThrough,
		"impersonator", cfg.Tunnel.ManagedServiceAccount)
	errc := make(chan error, 1)
	go func() {
		errc <- gateway.Serve(ctx, ln, g, gateway.ServerOptions{
			Certs: certs, MaxHeaderBytes: gc.MaxHeaderBytes, ReadHeaderTimeout: gc.ReadHeaderTimeout.Duration,
			IdleTimeout: gc.IdleTimeout.Duration, Log: log,
		})
	}()
	return errc, nil
}
