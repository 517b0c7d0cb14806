package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hubsync/hubsync/tunnel"
)

// Pool is what the gateway needs of the tunnel pool.
type Pool interface {
	Status(cluster string) (tunnel.Status, bool)
	RoundTripper(cluster string) http.RoundTripper
	AuthenticatedRoundTripper(cluster string) http.RoundTripper
	UpgradeRoundTripper(cluster string, authenticate bool) http.RoundTripper
}

// Classifier tells what a token the hub refused is (HubKeys).
type Classifier interface {
	Classify(ctx context.Context, token string) (TokenKind, error)
}

// Options configure a Gateway.
type Options struct {
	// Pool reaches the clusters; required.
	Pool Pool
	// Reviewer authenticates tokens on the hub (TokenReviewer); required.
	// The gateway caches its positive answers.
	Reviewer Reviewer
	// ReviewCacheTTL bounds how long a positive review is trusted
	// (0 or more than MaxCacheTTL: MaxCacheTTL); ReviewCacheSize bounds
	// how many are kept (0: 10000).
	ReviewCacheTTL  time.Duration
	ReviewCacheSize int
	// Now is the review cache's clock; time.Now when nil.
	Now func() time.Time
	// Tokens classifies the tokens the hub refuses; required when
	// PassThrough is on.
	Tokens Classifier
	// PassThrough lets a JWT the hub did not sign (a managed cluster's
	// token) through unchanged, to act as itself. Off: such tokens get 401.
	PassThrough bool
	// ForwardGroups, when set, lists the only hub groups impersonated
	// (prefixed) on managed clusters; others are dropped. It lets a
	// managed cluster grant impersonation of exactly those groups by name
	// (RBAC cannot grant a prefix). Empty: every group.
	ForwardGroups []string
	// Serving, if set, says whether this replica serves (the pool runs on
	// the leader only) and why not.
	Serving func() (bool, string)
	// BodyTimeout bounds reading a request's body (0: 1m).
	BodyTimeout time.Duration
	// RetryAfter is sent with 503 answers (0: 5s).
	RetryAfter time.Duration
	Log        *slog.Logger
	// Registerer registers the gateway's metrics; nil registers none.
	Registerer prometheus.Registerer
}

// Gateway serves /<cluster>/<kubernetes path>: it authenticates the
// bearer token on the hub, impersonates a hub identity with the
// cluster:hub: prefix through the cluster's ManagedServiceAccount, or lets
// a managed cluster's own token through, and sends the request over the
// cluster's warm pool entry.
type Gateway struct {
	opts     Options
	m        *metrics
	log      *slog.Logger
	reviewer *CachedReviewer
	buffers  *bufferPool
	errorLog *log.Logger // the reverse proxy's, at debug level
}

// New builds a gateway.
func New(opts Options) (*Gateway, error) {
	if opts.Pool == nil || opts.Reviewer == nil {
		return nil, errors.New("gateway: a pool and a reviewer are required")
	}
	if opts.PassThrough && opts.Tokens == nil {
		return nil, errors.New("gateway: pass-through needs a token classifier")
	}
	if opts.BodyTimeout <= 0 {
		opts.BodyTimeout = time.Minute
	}
	if opts.RetryAfter <= 0 {
		opts.RetryAfter = 5 * time.Second
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	m, err := newMetrics(opts.Registerer)
	if err != nil {
		return nil, err
	}
	reviewer := NewCachedReviewer(opts.Reviewer, opts.ReviewCacheTTL, opts.ReviewCacheSize, opts.Now, m.hits.Inc)
	return &Gateway{opts: opts, m: m, log: opts.Log, reviewer: reviewer, buffers: &bufferPool{},
		errorLog: slog.NewLogLogger(opts.Log.Handler(), slog.LevelDebug)}, nil
}

// Request modes, for metrics and logs.
const (
	modeImpersonate = "impersonate"
	modePassThrough = "passthrough"
	modeRefused     = "refused"
)

// ServeHTTP serves one request.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	rw := &recorder{ResponseWriter: w}
	rq := &request{start: start}
	defer func() { g.finish(rw, r, rq) }()
	g.serve(rw, r, rq)
}

// request is what one request's log line and metrics say.
type request struct {
	start    time.Time
	cluster  string // only once known to be served: bounds metric labels
	mode     string
	user     string
	refusal  string
	upgrade  bool
	switched bool // the cluster answered 101 and the connection was handed over
	// bodyDeadline: reading the body is bounded by BodyTimeout.
	bodyDeadline bool
	watch        bool
}

func (g *Gateway) serve(w *recorder, r *http.Request, rq *request) {
	rq.mode = modeRefused
	route, err := ParseRoute(r.URL)
	if err != nil {
		g.refuse(w, rq, http.StatusBadRequest, "bad_path", "BadRequest", err.Error())
		return
	}
	token, err := BearerToken(r.Header)
	if err != nil {
		g.refuse(w, rq, http.StatusUnauthorized, "no_token", "Unauthorized", err.Error())
		return
	}
	if HasImpersonation(r.Header) {
		g.refuse(w, rq, http.StatusForbidden, "impersonation_header", "Forbidden",
			"Impersonate-* headers are refused: the gateway sets the identity itself (hub users act as "+Prefix+"<user>)")
		return
	}
	if hasProtocolToken(r.Header) {
		// The API server takes a bearer token from a WebSocket
		// subprotocol too; one there could carry a hub token past the
		// checks above.
		g.refuse(w, rq, http.StatusUnauthorized, "protocol_token", "Unauthorized",
			"bearer tokens in Sec-WebSocket-Protocol are refused: send the token in the Authorization header")
		return
	}
	if g.opts.Serving != nil {
		if ok, why := g.opts.Serving(); !ok {
			g.unavailable(w, rq, "not_serving", "this replica does not serve the gateway now: "+why)
			return
		}
	}
	id, hub, err := g.reviewer.Review(r.Context(), token)
	switch {
	case err != nil:
		g.m.reviews.WithLabelValues("error").Inc()
		g.log.Warn("hub TokenReview failed; refusing the request", "err", err)
		g.unavailable(w, rq, "review_failed", "the hub's TokenReview could not be reached; try again")
		return
	case hub && id.Username == "":
		// Never forward as the impersonator itself.
		g.m.reviews.WithLabelValues("authenticated").Inc()
		g.refuse(w, rq, http.StatusUnauthorized, "no_username", "Unauthorized", "the hub authenticated the token without a username")
		return
	case hub:
		g.m.reviews.WithLabelValues("authenticated").Inc()
		rq.mode, rq.user = modeImpersonate, id.Username
	default:
		g.m.reviews.WithLabelValues("unauthenticated").Inc()
		if !g.opts.PassThrough {
			g.refuse(w, rq, http.StatusUnauthorized, "not_hub_identity", "Unauthorized", "the hub does not recognise this token")
			return
		}
		kind, err := g.opts.Tokens.Classify(r.Context(), token)
		switch {
		case err != nil:
			g.log.Warn("cannot tell whether a token is the hub's; refusing the request", "err", err)
			g.unavailable(w, rq, "hub_keys_unavailable", "the hub's service-account keys could not be fetched; try again")
			return
		case kind == TokenHub:
			g.refuse(w, rq, http.StatusUnauthorized, "hub_token_refused", "Unauthorized",
				"the hub refuses this hub token (expired, revoked or for another audience); hub tokens are never forwarded")
			return
		case kind == TokenOpaque:
			g.refuse(w, rq, http.StatusUnauthorized, "opaque_token", "Unauthorized",
				"the hub does not recognise this token, and only a managed cluster's JWT may pass through")
			return
		}
		rq.mode = modePassThrough
	}
	st, served := g.opts.Pool.Status(route.Cluster)
	if !served {
		g.refuse(w, rq, http.StatusNotFound, "cluster_not_served", "NotFound",
			fmt.Sprintf("cluster %q is not served by this gateway (no ClusterProfile or tunnel for it)", route.Cluster))
		return
	}
	rq.cluster = route.Cluster
	if st.State != tunnel.StateReady {
		g.unavailable(w, rq, "cluster_not_ready", fmt.Sprintf("cluster %q is %s%s", route.Cluster, st.State, reasonSuffix(st.Reason)))
		return
	}
	g.forward(w, r, rq, route, id)
}

// forward sends the request to the cluster over the pool.
func (g *Gateway) forward(w *recorder, r *http.Request, rq *request, route Route, id Identity) {
	impersonate := rq.mode == modeImpersonate
	rq.upgrade = isUpgrade(r)
	q := r.URL.Query()
	watch, _ := strconv.ParseBool(q.Get("watch"))
	follow, _ := strconv.ParseBool(q.Get("follow"))
	rq.watch = watch || follow || strings.Contains(route.Path, "/watch/")
	var rt http.RoundTripper
	switch {
	case rq.upgrade:
		rt = g.opts.Pool.UpgradeRoundTripper(route.Cluster, impersonate)
	case impersonate:
		rt = g.opts.Pool.AuthenticatedRoundTripper(route.Cluster)
	default:
		rt = g.opts.Pool.RoundTripper(route.Cluster)
	}
	if r.ContentLength != 0 && !rq.upgrade {
		// A client that sends its body slowly holds a stream; bound it,
		// then lift the deadline so that a long response is not cut.
		rc := http.NewResponseController(w)
		if rc.SetReadDeadline(time.Now().Add(g.opts.BodyTimeout)) == nil {
			rq.bodyDeadline = true
			r.Body = &clearOnEOF{ReadCloser: r.Body, clear: func() { _ = rc.SetReadDeadline(time.Time{}) }}
		}
	}
	proxy := &httputil.ReverseProxy{
		Transport: rt,
		Rewrite: func(pr *httputil.ProxyRequest) {
			out := pr.Out
			out.URL.Scheme = "https"
			out.URL.Host = route.Cluster
			out.URL.Path, out.URL.RawPath = route.Path, route.RawPath
			out.Host = ""
			// Request-header authentication headers mean nothing over a
			// bearer token, but are never forwarded either.
			for k := range out.Header {
				if lk := strings.ToLower(k); strings.HasPrefix(lk, "x-remote-") || strings.HasPrefix(lk, "impersonate-") {
					delete(out.Header, k)
				}
			}
			if impersonate {
				// Drops the hub token and sets the prefixed identity.
				_ = Impersonate(out.Header, g.forwarded(id))
			}
		},
		// Watches and followed logs reach the client as they come; a
		// finished answer (a get, a list) is written in as few frames as
		// the server's buffers allow (see recorder.FlushError).
		FlushInterval: -1,
		BufferPool:    g.buffers,
		ModifyResponse: func(resp *http.Response) error {
			w.buffered = !rq.watch && finished(resp)
			if resp.StatusCode == http.StatusSwitchingProtocols {
				// The proxy writes a 101 on the hijacked connection,
				// never through WriteHeader.
				rq.switched = true
				if body, ok := resp.Body.(io.ReadWriteCloser); ok {
					resp.Body = g.trackUpgrade(body)
				}
			}
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) { g.proxyError(w, rq, err) },
		ErrorLog:     g.errorLog,
	}
	proxy.ServeHTTP(w, r)
}

// forwarded is id with only the groups ForwardGroups allows.
func (g *Gateway) forwarded(id Identity) Identity {
	if len(g.opts.ForwardGroups) == 0 {
		return id
	}
	var groups []string
	for _, grp := range id.Groups {
		if slices.Contains(g.opts.ForwardGroups, grp) {
			groups = append(groups, grp)
		}
	}
	id.Groups = groups
	return id
}

// proxyError answers a request the pool or the cluster failed.
func (g *Gateway) proxyError(w http.ResponseWriter, rq *request, err error) {
	switch {
	case errors.Is(err, tunnel.ErrNotServed):
		g.refuse(w, rq, http.StatusNotFound, "cluster_not_served", "NotFound", err.Error())
	case errors.Is(err, tunnel.ErrNotReady):
		g.unavailable(w, rq, "cluster_not_ready", err.Error())
	case errors.Is(err, tunnel.ErrNoCredential):
		g.unavailable(w, rq, "no_credential", err.Error()+": the gateway has no impersonating credential for it")
	case errors.Is(err, os.ErrDeadlineExceeded) && rq.bodyDeadline:
		rq.refusal = "slow_body"
		writeStatus(w, http.StatusRequestTimeout, "Timeout",
			fmt.Sprintf("the request body did not arrive within %s", g.opts.BodyTimeout))
	case errors.Is(err, context.Canceled):
		// The client went away.
		rq.refusal = "client_gone"
		w.WriteHeader(499)
	default:
		g.log.Warn("request to a cluster failed", "cluster", rq.cluster, "err", err)
		rq.refusal = "upstream_error"
		writeStatus(w, http.StatusBadGateway, "ServiceUnavailable", fmt.Sprintf("cluster %q: %v", rq.cluster, err))
	}
}

func (g *Gateway) refuse(w http.ResponseWriter, rq *request, code int, why, reason, msg string) {
	rq.refusal = why
	writeStatus(w, code, reason, msg)
}

func (g *Gateway) unavailable(w http.ResponseWriter, rq *request, why, msg string) {
	rq.refusal = why
	w.Header().Set("Retry-After", strconv.Itoa(int((g.opts.RetryAfter+time.Second-1)/time.Second)))
	writeStatus(w, http.StatusServiceUnavailable, "ServiceUnavailable", msg)
}

// writeStatus answers with a Kubernetes Status, which kubectl and
// client-go show as the error's message.
func writeStatus(w http.ResponseWriter, code int, reason, msg string) {
	var body bytes.Buffer
	enc := json.NewEncoder(&body)
	enc.SetEscapeHTML(false) // served as JSON, never HTML: keep "<user>" readable
	_ = enc.Encode(map[string]any{
		"kind": "Status", "apiVersion": "v1", "metadata": map[string]any{},
		"status": "Failure", "message": "hubsync gateway: " + msg, "reason": reason, "code": code,
	})
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	_, _ = w.Write(body.Bytes())
}

func (g *Gateway) finish(w *recorder, r *http.Request, rq *request) {
	code := w.code
	switch {
	case rq.switched:
		code = http.StatusSwitchingProtocols
	case code == 0:
		code = http.StatusOK
	}
	g.m.requests.WithLabelValues(rq.cluster, strconv.Itoa(code), rq.mode).Inc()
	if rq.refusal != "" {
		g.m.refused.WithLabelValues(rq.refusal).Inc()
	}
	elapsed := time.Since(rq.start)
	if !rq.upgrade && !rq.watch {
		g.m.duration.WithLabelValues(rq.mode).Observe(elapsed.Seconds())
	}
	level := slog.LevelDebug
	if code >= 500 && code != 503 {
		level = slog.LevelWarn
	}
	if g.log.Enabled(r.Context(), level) {
		g.log.Log(r.Context(), level, "gateway request", "method", r.Method, "path", r.URL.EscapedPath(), "cluster", rq.cluster,
			"mode", rq.mode, "user", rq.user, "code", code, "refused", rq.refusal, "remote", r.RemoteAddr, "duration", elapsed)
	}
}

// protocolTokenPrefix marks a bearer token sent as a WebSocket subprotocol
// (Kubernetes' authenticator for browsers).
const protocolTokenPrefix = "base64url.bearer.authorization.k8s.io."

func hasProtocolToken(h http.Header) bool {
	for _, v := range h.Values("Sec-WebSocket-Protocol") {
		if strings.Contains(strings.ToLower(v), protocolTokenPrefix) {
			return true
		}
	}
	return false
}

// isUpgrade reports a request asking to switch protocols (SPDY or
// WebSocket), as net/http's reverse proxy recognises it.
func isUpgrade(r *http.Request) bool {
	if r.Header.Get("Upgrade") == "" {
		return false
	}
	for _, v := range r.Header.Values("Connection") {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), "upgrade") {
				return true
			}
		}
	}
	return false
}

func reasonSuffix(r string) string {
	if r == "" {
		return ""
	}
	return ": " + r
}

// recorder remembers the status code; Unwrap lets http.ResponseController
// reach the server's writer (hijack, deadlines). While buffered, flushes
// are skipped: the reverse proxy flushes after every read of a response
// without a length, which for a large list means a frame and a write per
// read.
type recorder struct {
	http.ResponseWriter
	code     int
	buffered bool
}

// FlushError is what http.ResponseController's Flush calls.
func (r *recorder) FlushError() error {
	if r.buffered {
		return nil
	}
	return http.NewResponseController(r.ResponseWriter).Flush()
}

// finished reports a response that is one whole object or list (JSON or
// protobuf, not a watch stream): nothing waits on its first bytes.
func finished(resp *http.Response) bool {
	if resp.StatusCode == http.StatusSwitchingProtocols {
		return false
	}
	ct := strings.ToLower(resp.Header.Get("Content-Type"))
	return (strings.HasPrefix(ct, "application/json") || strings.HasPrefix(ct, "application/vnd.kubernetes.protobuf")) &&
		!strings.Contains(ct, "stream=")
}

// bufferPool holds the reverse proxy's copy buffers, reused across
// requests instead of 32 KiB allocated for each.
type bufferPool struct{ p sync.Pool }

func (b *bufferPool) Get() []byte {
	if v, ok := b.p.Get().(*[]byte); ok {
		return *v
	}
	return make([]byte, 32<<10)
}

func (b *bufferPool) Put(buf []byte) { b.p.Put(&buf) }

func (r *recorder) WriteHeader(code int) {
	if r.code == 0 || r.code == http.StatusSwitchingProtocols {
		r.code = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *recorder) Write(b []byte) (int, error) {
	if r.code == 0 {
		r.code = http.StatusOK
	}
	return r.ResponseWriter.Write(b)
}

func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// clearOnEOF calls clear once the body has been read to its end. A body
// that fails (the deadline passed) or is left unread keeps its deadline:
// net/http reads what is left of a small unread body before it answers,
// and without the deadline a client that stops sending would hold that
// answer forever.
type clearOnEOF struct {
	io.ReadCloser
	clear func()
	done  atomic.Bool
}

func (c *clearOnEOF) Read(p []byte) (int, error) {
	n, err := c.ReadCloser.Read(p)
	if err == io.EOF && c.done.CompareAndSwap(false, true) {
		c.clear()
	}
	return n, err
}

// trackUpgrade counts an upgraded connection as open until it closes.
func (g *Gateway) trackUpgrade(body io.ReadWriteCloser) io.ReadWriteCloser {
	g.m.upgraded.Inc()
	return &upgraded{ReadWriteCloser: body, done: g.m.upgraded.Dec}
}

type upgraded struct {
	io.ReadWriteCloser
	once atomic.Bool
	done func()
}

func (u *upgraded) Close() error {
	if u.once.CompareAndSwap(false, true) {
		u.done()
	}
	return u.ReadWriteCloser.Close()
}
