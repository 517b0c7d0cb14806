package tunnel

import (
	"fmt"
	"net/http"
	"time"
)

// RoundTripper returns an http.RoundTripper that sends requests to the
// cluster's API server over its warm connection, whatever the request
// URL's host, exactly as they are: it adds no credential, so a request
// acts with whatever Authorization it carries (or anonymously). When the
// cluster is not served or not ready, the request fails at once with an
// error wrapping ErrNotServed or ErrNotReady: it never waits for a
// connection (use WaitReady for that).
//
// The transport follows the entry: after a redial, the next request uses
// the new connection.
func (p *Pool) RoundTripper(cluster string) http.RoundTripper {
	return &roundTripper{p: p, cluster: cluster}
}

// AuthenticatedRoundTripper is RoundTripper acting as the pool's
// ManagedServiceAccount on the cluster: it sets the Authorization header
// to that token, replacing any the request carries, and fails with
// ErrNoCredential while the cluster has none. It is for hubsync's own
// requests; never hand it a request whose caller has not been
// authenticated and authorised for what it asks.
func (p *Pool) AuthenticatedRoundTripper(cluster string) http.RoundTripper {
	return &roundTripper{p: p, cluster: cluster, authenticate: true}
}

type roundTripper struct {
	p            *Pool
	cluster      string
	authenticate bool
}

func (rt *roundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	e := rt.p.entry(rt.cluster)
	if e == nil {
		closeBody(req)
		return nil, fmt.Errorf("cluster %s: %w", rt.cluster, ErrNotServed)
	}
	cc, token, swapped, st := e.use()
	if cc == nil || st.State != StateReady {
		closeBody(req)
		return nil, fmt.Errorf("cluster %s: %w (%s%s)", rt.cluster, ErrNotReady, st.State, reasonSuffix(st.Reason))
	}
	if !usable(cc) {
		// GOAWAY: the entry is dialing a new connection while this one
		// finishes its streams. Wait for it, at most a dial's time.
		e.wake()
		timer := time.NewTimer(rt.p.opts.DialTimeout)
		defer timer.Stop()
		select {
		case <-swapped:
		case <-timer.C:
		case <-req.Context().Done():
		}
		if cc, token, _, st = e.use(); cc == nil || st.State != StateReady || !usable(cc) {
			closeBody(req)
			return nil, fmt.Errorf("cluster %s: %w (%s%s)", rt.cluster, ErrNotReady, st.State, reasonSuffix(st.Reason))
		}
	}
	// Every stream of the connection busy (long watches): an overflow
	// connection, or the least busy one to wait on.
	cc = e.pick(req.Context(), cc)
	if rt.authenticate {
		if token == "" {
			closeBody(req)
			return nil, fmt.Errorf("cluster %s: %w", rt.cluster, ErrNoCredential)
		}
		req = req.Clone(req.Context())
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := cc.RoundTrip(req)
	if err != nil {
		rt.p.m.requests.WithLabelValues("error").Inc()
		if !usable(cc) {
			e.wake()
		}
		return nil, err
	}
	rt.p.m.requests.WithLabelValues("ok").Inc()
	return resp, nil
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		_ = req.Body.Close()
	}
}
