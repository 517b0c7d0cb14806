package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
)

// Request modes: the identity a request takes on the cluster, for
// metrics and logs.
const (
	// modeImpersonate: a hub identity, impersonated with the prefix
	// through the cluster's ManagedServiceAccount.
	modeImpersonate = "impersonate"
	// modePassThrough: a managed cluster's own token, verified against
	// that cluster's service-account keys, acting as itself.
	modePassThrough = "passthrough"
	// modeRefused: answered by the gateway, nothing sent.
	modeRefused = "refused"
	// modeSelf: hubsync's own reads (a cluster's service-account keys),
	// as the ManagedServiceAccount itself.
	modeSelf = "self"
)

// decision is the identity the gateway chose for a request from what it
// verified.
type decision struct {
	mode string
	// id is the hub identity (modeImpersonate), before the prefix.
	id Identity
	// token is the token verified against the cluster's keys
	// (modePassThrough).
	token string
	// trial: a token passed through that the cluster has not accepted
	// yet; release gives back the admission it holds until the cluster
	// does (Gateway.decide), nil when none is held.
	trial   bool
	release func()
}

// errIdentity is a request whose identity headers are not exactly those
// the gateway set: it is never sent.
var errIdentity = errors.New("the outgoing request's identity is not the one the gateway set")

// identity returns the headers that carry the identity a cluster sees for
// d: nothing else in an outgoing request may name one. This is the only
// place an outgoing Authorization or Impersonate-* header is made.
func (g *Gateway) identity(cluster string, d decision) (http.Header, error) {
	h := make(http.Header, 3)
	switch d.mode {
	case modeImpersonate:
		auth, err := g.opts.Pool.Authorization(cluster)
		if err != nil {
			return nil, err
		}
		h["Authorization"] = []string{auth}
		h["Impersonate-User"] = []string{Prefix + d.id.Username}
		// The uid and extra fields are not forwarded: a hub uid means
		// nothing on a managed cluster, and RBAC cannot limit
		// impersonating them to prefixed values (it matches
		// resourceNames exactly), so granting it would grant every uid.
		if groups := g.forwardedGroups(d.id.Groups); len(groups) > 0 {
			for i, grp := range groups {
				groups[i] = Prefix + grp
			}
			h["Impersonate-Group"] = groups
		}
	case modePassThrough:
		if d.token == "" {
			return nil, fmt.Errorf("%w: pass-through without a verified token", errIdentity)
		}
		h.Set("Authorization", "Bearer "+d.token)
	case modeSelf:
		auth, err := g.opts.Pool.Authorization(cluster)
		if err != nil {
			return nil, err
		}
		h["Authorization"] = []string{auth}
	default:
		return nil, fmt.Errorf("%w: no identity for mode %q", errIdentity, d.mode)
	}
	return h, nil
}

// forwardedGroups is groups without the empty name and, when
// ForwardGroups is set, with only the groups it lists.
func (g *Gateway) forwardedGroups(groups []string) []string {
	out := make([]string, 0, len(groups))
	for _, grp := range groups {
		if grp == "" || len(g.opts.ForwardGroups) > 0 && !slices.Contains(g.opts.ForwardGroups, grp) {
			continue
		}
		out = append(out, grp)
	}
	return out
}

// setIdentity makes want the only identity h carries: every identity
// header, in any spelling, is removed, then want's are set.
func setIdentity(h http.Header, want http.Header) {
	for k := range h {
		if identityHeader(k) {
			delete(h, k)
		}
	}
	for k, vs := range want {
		h[k] = slices.Clone(vs)
	}
}

// checkIdentity is the last check before a request leaves for a cluster:
// its identity headers (in any spelling) must be exactly want's, in the
// same order, and it may carry no other credential the API server reads
// (a WebSocket subprotocol token, user info in the URL, trailers). The
// error names the header, never its value.
func checkIdentity(req *http.Request, want http.Header) error {
	if req.URL.User != nil {
		return fmt.Errorf("%w: user info in the URL", errIdentity)
	}
	if len(req.Trailer) > 0 {
		return fmt.Errorf("%w: trailers", errIdentity)
	}
	for k, vs := range req.Header {
		if identityHeader(k) && !slices.Equal(vs, want[k]) {
			return fmt.Errorf("%w: header %s", errIdentity, headerName(k))
		}
		if strings.EqualFold(k, "Sec-WebSocket-Protocol") {
			for _, v := range vs {
				if strings.Contains(strings.ToLower(v), protocolTokenPrefix) {
					return fmt.Errorf("%w: a bearer token in Sec-WebSocket-Protocol", errIdentity)
				}
			}
		}
	}
	for k, vs := range want {
		if !slices.Equal(req.Header[k], vs) {
			return fmt.Errorf("%w: header %s missing", errIdentity, headerName(k))
		}
	}
	return nil
}

// guard sends a request only when checkIdentity passes.
type guard struct {
	next http.RoundTripper
	want http.Header
}

func (t guard) RoundTrip(req *http.Request) (*http.Response, error) {
	if err := checkIdentity(req, t.want); err != nil {
		if req.Body != nil {
			_ = req.Body.Close()
		}
		return nil, err
	}
	return t.next.RoundTrip(req)
}

// transportFor returns the transport of one request to cluster with the
// identity want: the pool's shared connection, or a connection of its own
// for an upgrade, behind the last check.
func (g *Gateway) transportFor(cluster string, want http.Header, upgrade bool) http.RoundTripper {
	if upgrade {
		return guard{next: g.opts.Pool.UpgradeRoundTripper(cluster), want: want}
	}
	return guard{next: g.opts.Pool.RoundTripper(cluster), want: want}
}

// outgoingURL is the URL sent to the cluster: built anew from the checked
// route and the client's query, so nothing else of the client's URL (user
// info, host) is carried over.
func outgoingURL(route Route, rawQuery string) *url.URL {
	return &url.URL{Scheme: "https", Host: route.Cluster, Path: route.Path, RawPath: route.RawPath, RawQuery: rawQuery}
}

// maxKeyDocument bounds a cluster's JWKS document.
const maxKeyDocument = 1 << 20

// fetchFromCluster GETs path from cluster's API server as the
// ManagedServiceAccount itself, through the same identity check as every
// forwarded request.
func (g *Gateway) fetchFromCluster(ctx context.Context, cluster, path string) ([]byte, error) {
	want, err := g.identity(cluster, decision{mode: modeSelf})
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, outgoingURL(Route{Cluster: cluster, Path: path}, "").String(), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/jwk-set+json, application/json")
	setIdentity(req.Header, want)
	resp, err := g.transportFor(cluster, want, false).RoundTrip(req)
	if err != nil {
		return nil, fmt.Errorf("GET %s from cluster %s: %w", path, cluster, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxKeyDocument+1))
	switch {
	case err != nil:
		return nil, fmt.Errorf("GET %s from cluster %s: %w", path, cluster, err)
	case resp.StatusCode != http.StatusOK:
		return nil, fmt.Errorf("GET %s from cluster %s: %s", path, cluster, resp.Status)
	case len(body) > maxKeyDocument:
		return nil, fmt.Errorf("GET %s from cluster %s: larger than %d bytes", path, cluster, maxKeyDocument)
	}
	return body, nil
}

// replaceResponse turns resp into the gateway's own Status answer, for an
// answer of the cluster the gateway does not forward.
func replaceResponse(resp *http.Response, code int, msg string) {
	_ = resp.Body.Close()
	body := statusBody(code, statusReason(code), msg)
	*resp = http.Response{
		Status: fmt.Sprintf("%d %s", code, http.StatusText(code)), StatusCode: code,
		Proto: resp.Proto, ProtoMajor: resp.ProtoMajor, ProtoMinor: resp.ProtoMinor,
		Header:        http.Header{"Content-Type": {"application/json"}, "X-Content-Type-Options": {"nosniff"}},
		Body:          io.NopCloser(strings.NewReader(string(body))),
		ContentLength: int64(len(body)),
		Request:       resp.Request,
	}
}

// stripCORS removes the cluster's CORS headers: they state the cluster's
// own policy for browsers calling it directly, which means nothing for
// the gateway's origin, and the gateway grants no cross-origin access.
func stripCORS(h http.Header) {
	for k := range h {
		if hasPrefixFold(k, "access-control-") {
			delete(h, k)
		}
	}
}
