package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/test/controlplane"
	"github.com/hubsync/hubsync/test/fleet"
	"github.com/hubsync/hubsync/test/lb"
	"github.com/hubsync/hubsync/test/testutil"
)

// showReplicas starts a second replica beside the first, puts both
// gateways behind a readiness-gated round-robin balancer, and stops the
// leader (SIGTERM) while a client sends a GET every 100 ms: the standby
// takes the lease at once and every GET succeeds. It returns the second
// replica, which the demo stops at its end.
func showReplicas(ctx context.Context, binary string, cp *controlplane.ControlPlane, first *fleet.Daemon, gw *demoGateway,
	logs io.Writer) (*fleet.Daemon, error) {
	step("Two replicas: both serve the gateway, one leads; the leader is stopped (SIGTERM) as in a rolling update")
	conf := first.Conf
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	conf.Gateway.Listen = ln.Addr().String()
	_ = ln.Close()
	// Each replica here has its own embedded NATS (a highly available
	// install shares an external one: only the leader publishes).
	conf.Bus = config.Bus{}
	start := time.Now()
	second, err := fleet.StartDaemon(ctx, binary, cp.Config, conf, logs)
	if err != nil {
		return nil, err
	}
	if err := second.WaitReady(ctx, time.Minute); err != nil {
		return second, err
	}
	fmt.Printf("   replica 2 ready (tunnel pool warm) %s after it started; leader: replica 1 %v, replica 2 %v\n",
		since(start), first.Leading(), second.Leading())
	bal := lb.New(lb.Options{},
		lb.Backend{Addr: first.Conf.Gateway.Listen, ReadyURL: "http://" + first.Address + "/readyz"},
		lb.Backend{Addr: conf.Gateway.Listen, ReadyURL: "http://" + second.Address + "/readyz"})
	if err := bal.Start(ctx); err != nil {
		return second, err
	}
	defer bal.Close()
	var ok, failed atomic.Int64
	loadCtx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	done := make(chan struct{})
	go func() {
		defer close(done)
		getEvery(loadCtx, gw, "https://"+bal.Addr(), 100*time.Millisecond, &ok, &failed)
	}()
	_ = testutil.Poll(ctx, 10*time.Second, 20*time.Millisecond, func() error {
		if ok.Load() < 10 {
			return fmt.Errorf("%d GETs", ok.Load())
		}
		return nil
	})
	stopped := time.Now()
	var handover time.Duration
	leaderCh := make(chan time.Duration, 1)
	go func() {
		_ = testutil.Poll(ctx, time.Minute, 10*time.Millisecond, func() error {
			if !second.Leading() {
				return fmt.Errorf("replica 2 does not lead")
			}
			return nil
		})
		leaderCh <- time.Since(stopped)
	}()
	if err := first.Stop(); err != nil {
		return second, fmt.Errorf("stopping replica 1: %w", err)
	}
	fmt.Printf("   replica 1 stopped %s after SIGTERM (not ready at once, served through its drain delay, then drained)\n", since(stopped))
	handover = <-leaderCh
	fmt.Printf("   replica 2 leads %s after replica 1 got SIGTERM (the lease was released, not left to expire)\n", handover.Round(time.Millisecond))
	n := ok.Load()
	_ = testutil.Poll(ctx, 10*time.Second, 20*time.Millisecond, func() error {
		if ok.Load() < n+10 {
			return fmt.Errorf("%d GETs", ok.Load())
		}
		return nil
	})
	stopLoad()
	<-done
	fmt.Printf("   GETs through the balancer to %s every 100 ms meanwhile: %d succeeded, %d failed\n", gatewayCluster, ok.Load(), failed.Load())
	return second, nil
}

// getEvery sends a GET of a ConfigMap list through the gateway every
// interval until ctx ends, counting the answers.
func getEvery(ctx context.Context, gw *demoGateway, url string, every time.Duration, ok, failed *atomic.Int64) {
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: gw.ca}, ForceAttemptHTTP2: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/"+gatewayCluster+"/api/v1/namespaces/payments/configmaps", nil)
		if err != nil {
			return
		}
		req.Header.Set("Authorization", "Bearer "+gw.token)
		resp, err := client.Do(req)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
		}
		if err == nil && resp.StatusCode == http.StatusOK {
			ok.Add(1)
		} else {
			failed.Add(1)
		}
	}
}
