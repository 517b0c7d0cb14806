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
// connection (use WaitReady for that; on demand, a request for a cluster
// not dialed yet starts its dial).
//
// The transport follows the entry: after a redial, the next request uses
// the new connection.
func (p *Pool) RoundTripper(cluster string) http.RoundTripper {
	return &roundTripper{p: p, cluster: cluster}
}

// Authorization returns the value of an Authorization header that sends
// a request as the cluster's ManagedServiceAccount ("Bearer " and its
// token, made once per token rather than for every request), or an error
// wrapping ErrNotServed or ErrNoCredential. The pool never sets it on a
// request: whoever sends one as that account sets it, and must first have
// authenticated and authorised its caller.
func (p *Pool) Authorization(cluster string) (string, error) {
	p.mu.Lock()
	served, auth := p.servedLocked(cluster), p.targets[cluster].bearer
	p.mu.Unlock()
	if !served {
		return "", fmt.Errorf("cluster %s: %w", cluster, ErrNotServed)
	}
	if auth == "" {
		return "", fmt.Errorf("cluster %s: %w", cluster, ErrNoCredential)
	}
	return auth, nil
}

type roundTripper struct {
	p       *Pool
	cluster string
}

func (rt *roundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	e := rt.p.demand(rt.cluster)
	if e == nil {
		closeBody(req)
		return nil, fmt.Errorf("cluster %s: %w", rt.cluster, ErrNotServed)
	}
	cc, swapped, st := e.use()
	if cc == nil || st.State != StateReady {
		closeBody(req)
		return nil, fmt.Errorf("cluster %s: %w (%s%s)", rt.cluster, ErrNotReady, st.State, reasonSuffix(st.Reason))
	}
	if !usable(cc) && st.Paced != "" {
		// GOAWAY, and the next dial waits: no request waits with it.
		closeBody(req)
		return nil, fmt.Errorf("cluster %s: %w (paced: %s)", rt.cluster, ErrNotReady, st.Paced)
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
		if cc, _, st = e.use(); cc == nil || st.State != StateReady || !usable(cc) {
			closeBody(req)
			return nil, fmt.Errorf("cluster %s: %w (%s%s)", rt.cluster, ErrNotReady, st.State, reasonSuffix(st.Reason))
		}
	}
	// Every stream of the connection busy (long watches): an overflow
	// connection, or the least busy one to wait on.
	cc = e.pick(req.Context(), cc)
	resp, err := cc.RoundTrip(req)
	if err != nil {
		rt.p.m.requests.WithLabelValues("error").Inc()
		if !usable(cc) {
			e.wake()
		}
		return nil, err
	}
	rt.p.m.requests.WithLabelValues("ok").Inc()
	e.answers.Add(1)
	return resp, nil
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		_ = req.Body.Close()
	}
}
