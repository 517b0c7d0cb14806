package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hubsync/hubsync/test/controlplane"
)

// The floods the gateway must shrug off, each a way for someone who is
// not entitled to a cluster to make hubsync, the hub or a cluster work.
const (
	// floodDark is a served cluster whose keys cannot be fetched: no
	// agent serves it and it has no ManagedServiceAccount token.
	floodDark = "bench-flood-dark"
	// floodKnownRequests, floodDarkRequests, floodSlowConns and
	// floodSignedRequests are the sizes of the floods.
	floodKnownRequests  = 2000
	floodDarkRequests   = 2000
	floodSlowConns      = 1000
	floodSignedRequests = 500
	// floodSlowBody is the body a slow request announces.
	floodSlowBody = 1 << 20
)

// floodTarget is where the floods go.
type floodTarget struct {
	addr  string
	roots *x509.CertPool
	m     *controlplane.Managed
}

// floodReq is one request of a flood: its path and token.
type floodReq struct{ path, token string }

// floodKind is one flood: its name, its size, and prepare, which makes
// what one run sends (new tokens each run) and returns the sender.
type floodKind struct {
	name     string
	requests int
	prepare  func(ctx context.Context) (func(ctx context.Context) (time.Duration, map[int]int), error)
}

// floodKinds are the floods of a run of the bench, in order.
func floodKinds(t floodTarget, known string) []floodKind {
	send := func(reqs []floodReq) func(ctx context.Context) (time.Duration, map[int]int) {
		return func(ctx context.Context) (time.Duration, map[int]int) { return flood(ctx, t, reqs) }
	}
	return []floodKind{
		{name: "forged tokens (half opaque, half self-signed JWTs, each new)", requests: floodRequests,
			prepare: func(context.Context) (func(context.Context) (time.Duration, map[int]int), error) {
				tokens, err := forgedTokens(floodRequests, "https://"+t.m.Address, false)
				return send(toCluster(floodCluster, tokens)), err
			}},
		{name: "one token accepted for a cluster, sent to made-up cluster names", requests: floodKnownRequests,
			prepare: func(ctx context.Context) (func(context.Context) (time.Duration, map[int]int), error) {
				// Accepted for the real cluster first, from the attacker's
				// address.
				if _, codes := flood(ctx, t, toCluster(floodCluster, []string{known})); codes[http.StatusOK] != 1 {
					return nil, fmt.Errorf("the known token was not accepted for %s: %v", floodCluster, codes)
				}
				reqs := make([]floodReq, floodKnownRequests)
				for i := range reqs {
					reqs[i] = floodReq{path: fmt.Sprintf("/made-up-%d%s", i, gatewaySmallPath), token: known}
				}
				return send(reqs), nil
			}},
		{name: "JWTs of unknown keys to a served cluster whose keys cannot be fetched", requests: floodDarkRequests,
			prepare: func(context.Context) (func(context.Context) (time.Duration, map[int]int), error) {
				tokens, err := forgedTokens(floodDarkRequests, "https://"+t.m.Address, true)
				return send(toCluster(floodDark, tokens)), err
			}},
		{name: fmt.Sprintf("refused requests announcing %d KiB bodies sent at 1 byte/s, one per connection", floodSlowBody>>10), requests: floodSlowConns,
			prepare: func(context.Context) (func(context.Context) (time.Duration, map[int]int), error) {
				return func(ctx context.Context) (time.Duration, map[int]int) { return slowBodies(ctx, t, floodSlowConns) }, nil
			}},
		{name: "tokens the cluster signed but refuses (another audience)", requests: floodSignedRequests,
			prepare: func(ctx context.Context) (func(context.Context) (time.Duration, map[int]int), error) {
				tokens := make([]string, floodSignedRequests)
				err := parallel(len(tokens), 16, func(i int) (err error) {
					tokens[i], err = t.m.ServiceAccountToken(ctx, gatewayNS, "direct-reader", time.Hour, fmt.Sprintf("not-this-cluster-%d", i))
					return err
				})
				return send(toCluster(floodCluster, tokens)), err
			}},
	}
}

func toCluster(cluster string, tokens []string) []floodReq {
	reqs := make([]floodReq, len(tokens))
	for i, tok := range tokens {
		reqs[i] = floodReq{path: "/" + cluster + gatewaySmallPath, token: tok}
	}
	return reqs
}

// attackerTransport is one connection of the flood's, from floodAttacker.
func attackerTransport(t floodTarget) *http.Transport {
	return &http.Transport{TLSClientConfig: &tls.Config{RootCAs: t.roots}, MaxConnsPerHost: 1,
		DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(floodAttacker)}}).DialContext}
}

// flood sends reqs from floodConns connections of their own (HTTP/1.1
// keep-alive, from floodAttacker), and returns its wall time and the
// answers' codes (0: no answer).
func flood(ctx context.Context, t floodTarget, reqs []floodReq) (time.Duration, map[int]int) {
	codes := map[int]int{}
	var mu sync.Mutex
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range min(floodConns, len(reqs)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tr := attackerTransport(t)
			defer tr.CloseIdleConnections()
			for {
				i := int(next.Add(1)) - 1
				if i >= len(reqs) {
					return
				}
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+t.addr+reqs[i].path, nil)
				req.Header.Set("Authorization", "Bearer "+reqs[i].token)
				req.Header.Set("User-Agent", floodAgent)
				code := 0
				if resp, err := tr.RoundTrip(req); err == nil {
					code = resp.StatusCode
					_, _ = io.Copy(io.Discard, resp.Body)
					_ = resp.Body.Close()
				}
				mu.Lock()
				codes[code]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return time.Since(start), codes
}

// slowBodies opens n TLS connections from floodAttacker, each sending a
// request without a token that announces a floodSlowBody body and then
// one byte a second, until the gateway answers and closes the connection
// or a minute passes. It returns the wall time until every connection
// ended and the answers' codes (0: none).
func slowBodies(ctx context.Context, t floodTarget, n int) (time.Duration, map[int]int) {
	codes := map[int]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code := slowBody(ctx, t)
			mu.Lock()
			codes[code]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	return time.Since(start), codes
}

func slowBody(ctx context.Context, t floodTarget) int {
	d := &tls.Dialer{NetDialer: &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(floodAttacker)}},
		Config: &tls.Config{RootCAs: t.roots, NextProtos: []string{"http/1.1"}}}
	conn, err := d.DialContext(ctx, "tcp", t.addr)
	if err != nil {
		return 0
	}
	defer conn.Close()
	head := fmt.Sprintf("POST /%s/api/v1/namespaces/%s/configmaps HTTP/1.1\r\nHost: %s\r\nUser-Agent: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{",
		floodCluster, gatewayNS, t.addr, floodAgent, floodSlowBody)
	if _, err := io.WriteString(conn, head); err != nil {
		return 0
	}
	answered := make(chan int, 1)
	go func() {
		_ = conn.SetReadDeadline(time.Now().Add(time.Minute))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			answered <- 0
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		answered <- resp.StatusCode
	}()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case code := <-answered:
			return code
		case <-ctx.Done():
			return 0
		case <-tick.C:
			if _, err := io.WriteString(conn, strings.Repeat(" ", 1)); err != nil {
				return <-answered
			}
		}
	}
}
