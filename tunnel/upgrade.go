package tunnel

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
)

// UpgradeRoundTripper returns an http.RoundTripper for requests that
// upgrade their connection (exec, attach and port-forward over SPDY or
// WebSocket). An HTTP/2 connection cannot carry an HTTP/1.1 upgrade, so
// each request gets a connection of its own: a new tunnel to the
// cluster's API server with TLS offering only http/1.1, closed when the
// upgraded stream ends. It serves only a ready entry, like RoundTripper,
// and authenticate sets the ManagedServiceAccount token as
// AuthenticatedRoundTripper does. A 101 response's Body is the upgraded
// connection (an io.ReadWriteCloser), as net/http's own transport returns
// it.
func (p *Pool) UpgradeRoundTripper(cluster string, authenticate bool) http.RoundTripper {
	return &upgradeRoundTripper{p: p, cluster: cluster, authenticate: authenticate}
}

type upgradeRoundTripper struct {
	p            *Pool
	cluster      string
	authenticate bool
}

func (rt *upgradeRoundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	e := rt.p.entry(rt.cluster)
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
	if rt.authenticate {
		if t.Token == "" {
			closeBody(req)
			return nil, fmt.Errorf("cluster %s: %w", rt.cluster, ErrNoCredential)
		}
		req = req.Clone(req.Context())
		req.Header.Set("Authorization", "Bearer "+t.Token)
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
// through the pool's dialer, with TLS offering only http/1.1. It shares
// the pool's bound on dials in progress.
func (p *Pool) dialHTTP1(ctx context.Context, cluster string, t Target) (net.Conn, error) {
	if t.Err != nil {
		return nil, t.Err
	}
	select {
	case p.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-p.sem }()
	ctx, cancel := context.WithTimeout(ctx, p.opts.DialTimeout)
	defer cancel()
	raw, err := p.opts.Dialer.Dial(ctx, cluster, t.Address)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", t.Address, err)
	}
	cfg := tlsConfig(t)
	cfg.NextProtos = []string{"http/1.1"}
	tc := tls.Client(raw, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		_ = raw.Close()
		return nil, fmt.Errorf("TLS handshake with %s: %w", t.Address, err)
	}
	return tc, nil
}
