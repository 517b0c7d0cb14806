package access

import (
	"io"
	"net/http"
	"sync/atomic"

	utilnet "k8s.io/apimachinery/pkg/util/net"
)

// transport sets the credential's current token on every request, and
// sends a request refused with 401 once more when a newer token is known.
type transport struct {
	cred  *credential
	next  http.RoundTripper
	stats *counters
}

// counters are a Source's Stats as they accumulate.
type counters struct {
	refused, retried, rereads atomic.Int64
}

// drainLimit is how much of a refused response's body is read before it is
// closed, so that its connection can be reused for the retry.
const drainLimit = 4 << 10

// RoundTrip sends req with the credential's current token and, when it is
// refused with 401 and a newer token is known, once more with that one.
func (t *transport) RoundTrip(req *http.Request) (*http.Response, error) {
	// A request that carries its own credential is not ours to change.
	if req.Header.Get("Authorization") != "" {
		return t.next.RoundTrip(req)
	}
	token, err := t.cred.current(req.Context())
	if err != nil {
		// A RoundTripper closes the body, even when it fails.
		if req.Body != nil {
			_ = req.Body.Close()
		}
		return nil, err
	}
	resp, err := t.next.RoundTrip(withToken(req, token, req.Body))
	if err != nil || resp.StatusCode != http.StatusUnauthorized {
		return resp, err
	}
	t.stats.refused.Add(1)
	// Only a request whose body can be sent again is retried; the retry
	// is never retried, so a token refused twice ends here.
	if req.Body != nil && req.Body != http.NoBody && req.GetBody == nil {
		return resp, nil
	}
	newer, ok := t.cred.newer(req.Context(), token)
	if !ok {
		return resp, nil
	}
	body := req.Body
	if req.GetBody != nil {
		if body, err = req.GetBody(); err != nil {
			return resp, nil
		}
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, drainLimit))
	_ = resp.Body.Close()
	t.stats.retried.Add(1)
	resp, err = t.next.RoundTrip(withToken(req, newer, body))
	if err == nil && resp.StatusCode == http.StatusUnauthorized {
		t.stats.refused.Add(1)
	}
	return resp, err
}

// withToken is a copy of req with body and an Authorization header for
// token; req itself is left as it was, as a RoundTripper must.
func withToken(req *http.Request, token string, body io.ReadCloser) *http.Request {
	r := utilnet.CloneRequest(req)
	r.Body = body
	r.Header.Set("Authorization", "Bearer "+token)
	return r
}

// WrappedRoundTripper lets client-go reach the transport underneath (to
// close its idle connections, for example).
func (t *transport) WrappedRoundTripper() http.RoundTripper { return t.next }
