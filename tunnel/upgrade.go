package tunnel

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
)

// ErrUpgradesBusy: every slot for upgrade dials is taken and none came
// free within a dial's time.
var ErrUpgradesBusy = errors.New("too many upgraded connections are being dialed")

// UpgradeRoundTripper returns an http.RoundTripper for requests that
// upgrade their connection (exec, attach and port-forward over SPDY or
// WebSocket). An HTTP/2 connection cannot carry an HTTP/1.1 upgrade, so
// each request gets a connection of its own: a new tunnel to the
// cluster's API server with TLS offering only http/1.1, closed when the
// upgraded stream ends. Like RoundTripper it serves only a ready entry
// and adds no credential. Its dials have their own bound
// (MaxUpgradeDials), apart from the entries' redials, so that a flood of
// upgrades never keeps a failing cluster from reconnecting. A 101
// response's Body is the upgraded connection (an io.ReadWriteCloser), as
// net/http's own transport returns it.
func (p *Pool) UpgradeRoundTripper(cluster string) http.RoundTripper {
	return &upgradeRoundTripper{p: p, cluster: cluster}
}

type upgradeRoundTripper struct {
	p       *Pool
	cluster string
}

func (rt *upgradeRoundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	e := rt.p.demand(rt.cluster)
	if e == nil {
		closeBody(req)
		return nil, fmt.Errorf("cluster %s: %w", rt.cluster, ErrNotServed)
	}
	e.mu.Lock()
	t := e.target
	e.mu.Unlock()
	if st := e.status(); st.State != StateReady {
		closeBody(req)
		return nil, fmt.Errorf("cluster %s: %w (%s%s)", rt.cluster, ErrNotReady, st.State, reasonSuffix(st.Reason))
	}
	tr := &http.Transport{
		DialTLSContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return rt.p.dialHTTP1(ctx, rt.cluster, t)
		},
		DisableKeepAlives: true,
		// No HTTP/2: an upgrade needs HTTP/1.1.
		TLSNextProto:          map[string]func(string, *tls.Conn) http.RoundTripper{},
		ResponseHeaderTimeout: rt.p.opts.DialTimeout + rt.p.opts.ProbeTimeout,
	}
	resp, err := tr.RoundTrip(req)
	if err != nil {
		rt.p.m.requests.WithLabelValues("error").Inc()
		return nil, err
	}
	rt.p.m.requests.WithLabelValues("ok").Inc()
	return resp, nil
}

// dialHTTP1 opens a connection of its own to the cluster's API server
// through the pool's dialer, with TLS offering only http/1.1, within the
// bound on upgrade dials.
func (p *Pool) dialHTTP1(ctx context.Context, cluster string, t Target) (net.Conn, error) {
	if t.Err != nil {
		return nil, t.Err
	}
	ctx, cancel := context.WithTimeout(ctx, p.opts.DialTimeout)
	defer cancel()
	select {
	case p.upgradeSem <- struct{}{}:
	case <-ctx.Done():
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			p.m.upgradeDials.WithLabelValues("busy").Inc()
			return nil, fmt.Errorf("cluster %s: %w", cluster, ErrUpgradesBusy)
		}
		return nil, ctx.Err()
	}
	defer func() { <-p.upgradeSem }()
	raw, err := p.opts.Dialer.Dial(ctx, cluster, t.Address)
	if err != nil {
		p.m.upgradeDials.WithLabelValues("error").Inc()
		return nil, fmt.Errorf("dial %s: %w", t.Address, err)
	}
	cfg := tlsConfig(t)
	cfg.NextProtos = []string{"http/1.1"}
	tc := tls.Client(raw, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		_ = raw.Close()
		p.m.upgradeDials.WithLabelValues("error").Inc()
		return nil, fmt.Errorf("TLS handshake with %s: %w", t.Address, err)
	}
	p.m.upgradeDials.WithLabelValues("ok").Inc()
	return tc, nil
}
