package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/test/controlplane"
	"github.com/hubsync/hubsync/test/konnectivity"
	"github.com/hubsync/hubsync/tunnel"
)

// Tunnel figures (flags).
var (
	tunnelOnly     bool
	tunnelRepeats  int
	tunnelRequests int
	tunnelClusters int
)

// tunnelPath is the small GET of the latency figures: one object, read
// from the API server's etcd.
const tunnelPath = "/api/v1/namespaces/default"

// benchTunnel measures, against one real proxy-server, agent and managed
// kube-apiserver, the latency of a small GET through the warm pool,
// through a new single-use tunnel and transport per request (cluster-proxy's
// way), and straight to the API server; then the time to bring many
// simulated clusters to ready and the memory of a warm entry.
func benchTunnel(ctx context.Context, cp *controlplane.ControlPlane) error {
	fmt.Println("== tunnel pool: real konnectivity proxy-server + agent + managed kube-apiserver")
	const ip = "127.0.0.21"
	r, err := startReach(ctx, cp, "bench-managed", ip)
	if err != nil {
		return err
	}
	defer r.stop()
	srv, m := r.server, r.managed
	kd, err := tunnel.NewKonnectivityDialer(tunnel.KonnectivityConfig{
		Address: srv.ClientAddress, CAFile: srv.CAFile, CertFile: srv.CertFile, KeyFile: srv.KeyFile,
	})
	if err != nil {
		return err
	}
	defer kd.Close()
	// cluster-proxy's way dials a single-use tunnel (a gRPC connection of
	// its own) per request.
	singleUse, err := tunnel.NewKonnectivityDialer(tunnel.KonnectivityConfig{
		Address: srv.ClientAddress, CAFile: srv.CAFile, CertFile: srv.CertFile, KeyFile: srv.KeyFile, SingleUse: true,
	})
	if err != nil {
		return err
	}
	var newPoolWith func(d tunnel.Dialer, maxDials int) (*tunnel.Pool, context.CancelFunc, error)
	target := tunnel.Target{Address: m.Address, ServerName: tunnel.DefaultKonnectivityServerName, CA: m.CA, Token: m.Config.BearerToken}
	newPool := func(maxDials int) (*tunnel.Pool, context.CancelFunc, error) {
		return newPoolWith(kd, maxDials)
	}
	newPoolWith = func(d tunnel.Dialer, maxDials int) (*tunnel.Pool, context.CancelFunc, error) {
		opts := tunnel.OptionsFor(config.Default().Tunnel)
		opts.Dialer, opts.Transport = d, tunnel.TransportKonnectivity
		if maxDials > 0 { // 0: the configuration's default
			opts.MaxDials = maxDials
		}
		p, err := tunnel.New(opts)
		if err != nil {
			return nil, nil, err
		}
		pctx, cancel := context.WithCancel(ctx)
		p.Start(pctx)
		return p, func() { cancel(); p.Close() }, nil
	}
	pool, stop, err := newPool(0)
	if err != nil {
		return err
	}
	defer stop()
	pool.SetTarget("bench", &target)
	pool.SetSelected("bench", true)
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	err = pool.WaitReady(wctx, "bench")
	cancel()
	if err != nil {
		return err
	}

	// The same pool dialing the API server directly: what the pool itself
	// costs, without konnectivity's two relays.
	directPool, stopDirect, err := newPoolWith(&tunnel.DirectDialer{}, 0)
	if err != nil {
		return err
	}
	defer stopDirect()
	directPool.SetTarget("bench", &target)
	directPool.SetSelected("bench", true)
	wctx, cancel = context.WithTimeout(ctx, time.Minute)
	err = directPool.WaitReady(wctx, "bench")
	cancel()
	if err != nil {
		return err
	}

	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(m.CA)
	direct := &http.Transport{
		TLSClientConfig:   &tls.Config{RootCAs: roots},
		ForceAttemptHTTP2: true, MaxIdleConnsPerHost: 64,
	}
	defer direct.CloseIdleConnections()
	modes := []struct {
		name string
		rt   func() (http.RoundTripper, func())
	}{
		{"warm pool", func() (http.RoundTripper, func()) { return pool.RoundTripper("bench"), func() {} }},
		{"per-request tunnel", func() (http.RoundTripper, func()) {
			// cluster-proxy's way: a new single-use tunnel and a new
			// HTTP/1.1 transport for every request.
			t := &http.Transport{
				DialTLSContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
					c, err := singleUse.Dial(ctx, "bench", m.Address)
					if err != nil {
						return nil, err
					}
					tc := tls.Client(c, &tls.Config{RootCAs: roots, ServerName: tunnel.DefaultKonnectivityServerName})
					if err := tc.HandshakeContext(ctx); err != nil {
						_ = c.Close()
						return nil, err
					}
					return tc, nil
				},
				DisableKeepAlives: true,
			}
			return t, t.CloseIdleConnections
		}},
		{"direct", func() (http.RoundTripper, func()) { return direct, func() {} }},
		{"warm pool, no tunnel", func() (http.RoundTripper, func()) { return directPool.RoundTripper("bench"), func() {} }},
	}
	host := "https://" + m.Address
	one := func(rt http.RoundTripper) (time.Duration, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, host+tunnelPath, nil)
		if err != nil {
			return 0, err
		}
		req.Header.Set("Authorization", "Bearer "+m.Config.BearerToken)
		start := time.Now()
		resp, err := rt.RoundTrip(req)
		if err != nil {
			return 0, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return 0, fmt.Errorf("GET %s: %s", tunnelPath, resp.Status)
		}
		return time.Since(start), nil
	}
	// run sends n requests from conc goroutines and returns p50 and p99.
	run := func(mode int, conc, n int) (p50, p99 time.Duration, err error) {
		lat := make([]time.Duration, 0, n)
		var mu sync.Mutex
		var wg sync.WaitGroup
		var first error
		per := n / conc
		for range conc {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range per {
					rt, done := modes[mode].rt()
					d, err := one(rt)
					done()
					mu.Lock()
					if err != nil && first == nil {
						first = err
					}
					lat = append(lat, d)
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		if first != nil {
			return 0, 0, fmt.Errorf("%s: %w", modes[mode].name, first)
		}
		slices.Sort(lat)
		return quantile(lat, 50), quantile(lat, 99), nil
	}
	fmt.Printf("small GET %s, %d requests per mode, concurrency and repeat; modes interleaved in each repeat\n", tunnelPath, tunnelRequests)
	for _, conc := range []int{1, 32} {
		// Warm-up: the direct transport's connection, the API server's
		// caches.
		for mode := range modes {
			if _, _, err := run(mode, conc, min(conc*4, tunnelRequests)); err != nil {
				return err
			}
		}
		p50s := make([][]time.Duration, len(modes))
		p99s := make([][]time.Duration, len(modes))
		var warmVsDirect, perReqVsWarm, poolVsDirect []float64
		for r := range tunnelRepeats {
			for k := range modes {
				// Rotate the order so no mode always runs first.
				mode := (k + r) % len(modes)
				p50, p99, err := run(mode, conc, tunnelRequests)
				if err != nil {
					return err
				}
				p50s[mode] = append(p50s[mode], p50)
				p99s[mode] = append(p99s[mode], p99)
			}
			warmVsDirect = append(warmVsDirect, ratio(p50s[0][r], p50s[2][r]))
			poolVsDirect = append(poolVsDirect, ratio(p50s[3][r], p50s[2][r]))
			perReqVsWarm = append(perReqVsWarm, ratio(p50s[1][r], p50s[0][r]))
		}
		fmt.Printf("concurrency %d (median over %d repeats, range in brackets):\n", conc, tunnelRepeats)
		for mode := range modes {
			fmt.Printf("  %-21s p50 %s  p99 %s\n", modes[mode].name, durSpread(p50s[mode]), durSpread(p99s[mode]))
		}
		fmt.Printf("  warm p50 / direct p50: %s (goal <= 1.2x)\n", ratioSpread(warmVsDirect))
		fmt.Printf("  warm pool without the tunnel p50 / direct p50: %s (the pool's own cost; the rest is konnectivity's two relays)\n", ratioSpread(poolVsDirect))
		fmt.Printf("  per-request p50 / warm p50: %s (goal >= 3x)\n", ratioSpread(perReqVsWarm))
	}
	stop()
	stopDirect()

	// What the relays cost by themselves: a 64-byte echo round trip over
	// one open tunnel and over a direct TCP connection, to an echo server
	// on the managed cluster's host.
	if err := benchEcho(ctx, kd, ip); err != nil {
		return err
	}

	// Many simulated clusters: entries that share the one agent and API
	// server, each with its own tunnel, TLS and HTTP/2 connection.
	n := tunnelClusters
	fmt.Printf("%d simulated clusters through the one agent, dials bounded at %d:\n", n, config.DefaultTunnelMaxDials)
	var readyTimes []time.Duration
	var perEntry []float64
	var goroutines []float64
	for r := range tunnelRepeats {
		heap0, g0 := heapInUse()
		p, stop, err := newPool(0)
		if err != nil {
			return err
		}
		start := time.Now()
		for i := range n {
			c := fmt.Sprintf("sim-%04d", i)
			p.SetTarget(c, &target)
			p.SetSelected(c, true)
		}
		wctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		for i := range n {
			if err := p.WaitReady(wctx, fmt.Sprintf("sim-%04d", i)); err != nil {
				cancel()
				stop()
				return err
			}
		}
		cancel()
		readyTimes = append(readyTimes, time.Since(start))
		heap1, g1 := heapInUse()
		perEntry = append(perEntry, float64(heap1-heap0)/float64(n))
		goroutines = append(goroutines, float64(g1-g0)/float64(n))
		stop()
		_ = r
	}
	fmt.Printf("  all %d ready after %s (median over %d repeats, range in brackets)\n", n, durSpread(readyTimes), tunnelRepeats)
	slices.Sort(perEntry)
	slices.Sort(goroutines)
	fmt.Printf("  memory per warm entry (Go heap in use, after GC): %.1f KiB [%.1f-%.1f]; goroutines per entry: %.1f\n",
		median(perEntry)/1024, perEntry[0]/1024, perEntry[len(perEntry)-1]/1024, median(goroutines))
	return nil
}

// heapInUse returns the Go heap in use after a GC, and the goroutines.
func heapInUse() (uint64, int) {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse, runtime.NumGoroutine()
}

// quantile of a sorted list, in microseconds' precision.
func quantile(d []time.Duration, p int) time.Duration {
	i := (len(d)*p + 99) / 100
	if i > 0 {
		i--
	}
	return d[i].Round(time.Microsecond)
}

func ratio(a, b time.Duration) float64 { return a.Seconds() / b.Seconds() }

// durSpread prints the median of repeats and their range.
func durSpread(d []time.Duration) string {
	s := slices.Clone(d)
	slices.Sort(s)
	return fmt.Sprintf("%s [%s-%s]", median(s).Round(time.Microsecond), s[0], s[len(s)-1])
}

func ratioSpread(r []float64) string {
	s := slices.Clone(r)
	slices.Sort(s)
	return fmt.Sprintf("%.2fx [%.2f-%.2f]", median(s), s[0], s[len(s)-1])
}

// benchEcho prints the round trip of a 64-byte echo through an open
// konnectivity tunnel and over plain TCP, p50 over repeats.
func benchEcho(ctx context.Context, kd tunnel.Dialer, ip string) error {
	ln, err := net.Listen("tcp", ip+":0")
	if err != nil {
		return err
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	addr := ln.Addr().String()
	rtt := func(c net.Conn, n int) (time.Duration, error) {
		msg := make([]byte, 64)
		buf := make([]byte, 64)
		lat := make([]time.Duration, 0, n)
		for range n {
			start := time.Now()
			if _, err := c.Write(msg); err != nil {
				return 0, err
			}
			if _, err := io.ReadFull(c, buf); err != nil {
				return 0, err
			}
			lat = append(lat, time.Since(start))
		}
		slices.Sort(lat)
		return quantile(lat, 50), nil
	}
	var viaTunnel, viaTCP []time.Duration
	for range tunnelRepeats {
		tc, err := kd.Dial(ctx, "echo", addr)
		if err != nil {
			return err
		}
		dc, err := net.Dial("tcp", addr)
		if err != nil {
			_ = tc.Close()
			return err
		}
		a, errA := rtt(tc, tunnelRequests)
		b, errB := rtt(dc, tunnelRequests)
		_ = tc.Close()
		_ = dc.Close()
		if errA != nil || errB != nil {
			return fmt.Errorf("echo: %v %v", errA, errB)
		}
		viaTunnel, viaTCP = append(viaTunnel, a), append(viaTCP, b)
	}
	fmt.Printf("64-byte echo round trip, p50: through an open tunnel %s, plain TCP %s: konnectivity's proxy-server and agent add %s per round trip\n",
		durSpread(viaTunnel), durSpread(viaTCP), (median(sorted(viaTunnel)) - median(sorted(viaTCP))).Round(time.Microsecond))
	return nil
}

func sorted(d []time.Duration) []time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s
}

// reach is a managed kube-apiserver on its own address, behind a real
// konnectivity proxy-server and an agent that registers that address.
type reach struct {
	dir     string
	server  *konnectivity.Server
	managed *controlplane.Managed
	agent   *konnectivity.Agent
	// more are agents beside agent for the same host (addAgents).
	more []*konnectivity.Agent
}

// addAgents starts n more agents that serve the managed API server's
// host, each with a stream of its own to the proxy-server, which picks
// one at random for each dial: a fleet's tunnels then spread over them
// as a real fleet's spread over an agent per cluster.
func (r *reach) addAgents(name, ip string, n int) error {
	for i := range n {
		a, err := r.server.StartAgent(fmt.Sprintf("%s-%d", name, i+2), ip)
		if err != nil {
			return err
		}
		r.more = append(r.more, a)
	}
	return nil
}

// agentLogs are the files the agents log to.
func (r *reach) agentLogs() []string {
	var out []string
	for _, a := range append([]*konnectivity.Agent{r.agent}, r.more...) {
		if a != nil {
			out = append(out, filepath.Join(r.dir, "agent-"+a.ID+".log"))
		}
	}
	return out
}

// startReach starts a proxy-server, a managed API server named name on ip
// (sharing the hub's etcd) and its agent.
func startReach(ctx context.Context, cp *controlplane.ControlPlane, name, ip string) (*reach, error) {
	dir, err := os.MkdirTemp("", "hubsync-bench-"+name+"-")
	if err != nil {
		return nil, err
	}
	r := &reach{dir: dir}
	if r.server, err = konnectivity.StartServer(ctx, dir); err != nil {
		r.stop()
		return nil, err
	}
	if r.managed, err = controlplane.StartManaged(ctx, cp.EtcdURL(), name, ip); err != nil {
		r.stop()
		return nil, err
	}
	if r.agent, err = r.server.StartAgent(name, ip); err != nil {
		r.stop()
		return nil, err
	}
	return r, nil
}

// stop stops what startReach started and removes its files.
func (r *reach) stop() {
	if r.agent != nil {
		r.agent.Kill()
	}
	for _, a := range r.more {
		a.Kill()
	}
	if r.managed != nil {
		_ = r.managed.Close()
	}
	if r.server != nil {
		r.server.Kill()
	}
	_ = os.RemoveAll(r.dir)
}
