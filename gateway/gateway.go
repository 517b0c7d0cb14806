package gateway

import (
	"bytes"
	"cmp"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hubsync/hubsync/tunnel"
)

// Pool is what the gateway needs of the tunnel pool. Its round trippers
// add no credential: the gateway alone decides the identity a cluster
// sees.
type Pool interface {
	Status(cluster string) (tunnel.Status, bool)
	// RoundTripper sends requests over the cluster's warm connection.
	RoundTripper(cluster string) http.RoundTripper
	// UpgradeRoundTripper gives each request a connection of its own (an
	// upgrade cannot share an HTTP/2 connection).
	UpgradeRoundTripper(cluster string) http.RoundTripper
	// Authorization is the Authorization header value ("Bearer " and
	// the token) of the cluster's ManagedServiceAccount, which may
	// impersonate; tunnel.ErrNoCredential when there is none.
	Authorization(cluster string) (string, error)
	// WaitReady waits until the cluster's entry is ready (dialing it, if
	// it is dialed on demand), or ctx ends.
	WaitReady(ctx context.Context, cluster string) error
}

// Options configure a Gateway. They arrive filled (OptionsFor, from the
// configuration): New refuses a limit, timeout or period left zero.
type Options struct {
	// Pool reaches the clusters; required.
	Pool Pool
	// Reviewer authenticates tokens on the hub (TokenReviewer); required.
	Reviewer Reviewer
	// ReviewCacheTTL bounds how long a positive review is trusted (at
	// most MaxCacheTTL); ReviewCacheSize bounds how many tokens each of
	// the gateway's memories keeps.
	ReviewCacheTTL  time.Duration
	ReviewCacheSize int
	// MaxInFlightReviews bounds the TokenReviews waiting for the hub;
	// beyond it requests that need one get 503.
	MaxInFlightReviews int
	// RefusalCacheTTL is how long a refused token is answered from memory
	// without asking the hub again.
	RefusalCacheTTL time.Duration
	// RefusalsPerSecond and RefusalBurst are each client address's
	// token bucket of refused requests; an address that has spent it gets
	// 429 for every request whose token the gateway has not recently
	// accepted.
	RefusalsPerSecond float64
	RefusalBurst      int
	// ClientHeader and TrustedProxies: a connection from a trusted proxy
	// names its client in ClientHeader (strangers.go, clientOf); empty:
	// every client is its TCP peer.
	ClientHeader   string
	TrustedProxies []netip.Prefix
	// Now is the clock of the caches and limits; time.Now when nil.
	Now func() time.Time
	// PassThrough lets a managed cluster's own token through, to act as
	// itself there, once it verifies against that cluster's
	// service-account keys. Off: such tokens get 401.
	PassThrough bool
	// HubKeys are the hub's service-account keys: a token they verify is
	// the hub's and never passes through. Required with PassThrough.
	HubKeys *KeySet
	// HubIssuers are further issuers of hub tokens (OIDC): a token naming
	// one never passes through.
	HubIssuers []string
	// KeyRefresh and KeyMinRefetch configure each cluster's key set.
	KeyRefresh, KeyMinRefetch time.Duration
	// ForwardGroups, when set, lists the only hub groups impersonated
	// (prefixed) on managed clusters; others are dropped. It lets a
	// managed cluster grant impersonation of exactly those groups by name
	// (RBAC cannot grant a prefix). Empty: every group.
	ForwardGroups []string
	// Serving, if set, says whether this replica serves and why not.
	Serving func() (bool, string)
	// BodyTimeout bounds reading a request's body.
	BodyTimeout time.Duration
	// RetryAfter is sent with 503 answers.
	RetryAfter time.Duration
	// TunnelWait bounds how long a request for a cluster whose entry is
	// still connecting (or not dialed yet, on demand) waits for it.
	TunnelWait time.Duration
	Log        *slog.Logger
	// Registerer registers the gateway's metrics; nil registers none.
	Registerer prometheus.Registerer
}

// Gateway serves /<cluster>/<kubernetes path>. It decides, from what it
// verified, the identity the cluster sees: a hub identity (TokenReview on
// the hub) impersonated with the cluster:hub: prefix through the
// cluster's ManagedServiceAccount, or a managed cluster's own token
// verified against that cluster's keys; it sets that identity itself on
// the outgoing request and checks it last. Nothing a client sends can
// add, remove or replace it.
type Gateway struct {
	opts      Options
	m         *metrics
	log       *slog.Logger
	reviewer  *CachedReviewer
	buffers   *bufferPool
	errorLog  *log.Logger // the reverse proxy's, at debug level
	strangers *strangers
	// refusals are tokens refused lately (for a cluster: the answer may
	// name it), answered from memory.
	refusals *expiring[passKey, refusal]
	// passes are tokens verified lately as a cluster's own.
	passes *expiring[passKey, struct{}]
	// known are tokens accepted lately for a cluster: a limited address
	// is not limited for them there, and only there.
	known *expiring[passKey, struct{}]
	// confirmed are tokens passed through that the cluster has accepted
	// once, on a connection of their own: only they travel on the
	// connection every client of the cluster shares.
	confirmed *expiring[passKey, struct{}]

	keysMu      sync.Mutex
	clusterKeys map[string]clusterKeySet
	// issuers are the hub's JWT issuers the gateway could not identify,
	// each logged once.
	issuers *expiring[string, struct{}]
}

// passKey is a token for one cluster, as the pool identifies it: a
// cluster registered again under its name, or moved, is another one.
type passKey struct {
	cluster, identity string
	token             tokenKey
}

// target is the cluster a request names, as the pool knows it.
type target struct {
	cluster string
	served  bool
	// identity is tunnel.Target.Identity: what the gateway's memories of
	// the cluster are kept for.
	identity string
}

func (t target) pass(key tokenKey) passKey {
	return passKey{cluster: t.cluster, identity: t.identity, token: key}
}

// clusterKeySet is a cluster's key set, kept for one identity of it.
type clusterKeySet struct {
	identity string
	keys     *KeySet
}

// knownFor is how long a token accepted for a cluster exempts its client
// from the refusal limit for that cluster.
const knownFor = 10 * time.Minute

// New builds a gateway.
func New(opts Options) (*Gateway, error) {
	if opts.Pool == nil || opts.Reviewer == nil {
		return nil, errors.New("gateway: a pool and a reviewer are required")
	}
	if opts.PassThrough && opts.HubKeys == nil {
		return nil, errors.New("gateway: pass-through needs the hub's keys")
	}
	if err := opts.check(); err != nil {
		return nil, err
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	m, err := newMetrics(opts.Registerer)
	if err != nil {
		return nil, err
	}
	if opts.HubKeys != nil && opts.HubKeys.OnFetch == nil {
		opts.HubKeys.OnFetch = m.keyFetch("hub")
	}
	size := opts.ReviewCacheSize
	reviewer, err := NewCachedReviewer(opts.Reviewer, ReviewCacheOptions{TTL: opts.ReviewCacheTTL, Size: size,
		MaxInFlight: opts.MaxInFlightReviews, Now: opts.Now, OnHit: m.hits.Inc, OnReview: m.review})
	if err != nil {
		return nil, err
	}
	return &Gateway{opts: opts, m: m, log: opts.Log, buffers: &bufferPool{},
		reviewer:    reviewer,
		errorLog:    slog.NewLogLogger(opts.Log.Handler(), slog.LevelDebug),
		strangers:   newStrangers(opts.RefusalsPerSecond, opts.RefusalBurst, size, opts.Now),
		refusals:    newExpiring[passKey, refusal](size),
		passes:      newExpiring[passKey, struct{}](size),
		known:       newExpiring[passKey, struct{}](size),
		confirmed:   newExpiring[passKey, struct{}](size),
		clusterKeys: map[string]clusterKeySet{},
		issuers:     newExpiring[string, struct{}](100),
	}, nil
}

// ServeHTTP serves one request.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	rw := &recorder{ResponseWriter: w}
	rq := &request{start: start, flight: flightOf(r.Context())}
	defer func() { g.finish(rw, r, rq) }()
	g.serve(rw, r, rq)
}

// request is what one request's log line and metrics say.
type request struct {
	start   time.Time
	addr    string // the client's address, the key of its refusal limit
	cluster string // only once known to be served: bounds metric labels
	// clusterSet is the cluster's ManagedClusterSet, as the pool's status
	// names it, once the cluster is known to be served.
	clusterSet string
	mode       string
	user       string
	refusal    string
	upgrade    bool
	switched   bool // the cluster answered 101 and the connection was handed over
	// bodyDeadline: reading the body is bounded by BodyTimeout.
	bodyDeadline bool
	// body: the request announced a body; http1: over HTTP/1.x.
	body, http1 bool
	// pass is the request's token for its cluster; trial: a token passed
	// through that the cluster has not accepted yet, sent on a
	// connection of its own; release gives back the admission it holds
	// until then (finish); tried: what the cluster said to a trial
	// (trialAccepted, trialRefused), empty when it did not answer.
	pass    passKey
	trial   bool
	tried   string
	release func()
	watch   bool
	// flight is the request as Serve tracks it, so that a drain can end
	// it; nil outside Serve.
	flight *flight
}

func (g *Gateway) serve(w *recorder, r *http.Request, rq *request) {
	rq.mode = modeRefused
	rq.addr = clientOf(r, g.opts.ClientHeader, g.opts.TrustedProxies)
	rq.body, rq.http1 = r.ContentLength != 0, r.ProtoMajor == 1
	// First, on every path: a hop-by-hop list could otherwise remove
	// what the gateway sets.
	if ref := checkConnection(r.Header); ref != nil {
		g.refuse(w, rq, ref)
		return
	}
	if r.Method == http.MethodConnect {
		// An HTTP/1.1 CONNECT names a host, not the path checked below,
		// and would reach the cluster as an HTTP/2 CONNECT.
		g.refuse(w, rq, refuse(http.StatusMethodNotAllowed, "connect_method",
			"CONNECT is refused: the gateway forwards Kubernetes API requests"))
		return
	}
	route, err := ParseRoute(r.URL)
	if err != nil {
		g.refuse(w, rq, refuse(http.StatusBadRequest, "bad_path", err.Error()))
		return
	}
	token, err := BearerToken(r.Header)
	if err != nil {
		g.refuse(w, rq, refuse(http.StatusUnauthorized, "no_token", err.Error()))
		return
	}
	if ref := screen(r, route, token); ref != nil {
		g.refuse(w, rq, ref)
		return
	}
	if g.opts.Serving != nil {
		if ok, why := g.opts.Serving(); !ok {
			g.unavailable(w, rq, "not_serving", "this replica does not serve the gateway now: "+why)
			return
		}
	}
	key := g.reviewer.keys.key(token)
	st, served := g.opts.Pool.Status(route.Cluster)
	tg := target{cluster: route.Cluster, served: served, identity: st.Identity}
	rq.pass = tg.pass(key)
	d, ref := g.decide(r.Context(), rq.addr, tg, token, key)
	if ref != nil {
		g.refuse(w, rq, ref)
		return
	}
	rq.mode, rq.release, rq.trial = d.mode, d.release, d.trial
	if d.mode == modeImpersonate {
		rq.user = d.id.Username
	}
	if !served {
		g.refuse(w, rq, refuse(http.StatusNotFound, "cluster_not_served",
			fmt.Sprintf("cluster %q is not served by this gateway (no ClusterProfile or tunnel for it)", route.Cluster)))
		return
	}
	rq.cluster, rq.clusterSet = route.Cluster, st.ClusterSet
	if st.State != tunnel.StateReady && st.State != tunnel.StateFailing {
		st = g.waitForTunnel(r.Context(), route.Cluster, st)
	}
	if st.State != tunnel.StateReady {
		g.unavailable(w, rq, "cluster_not_ready", fmt.Sprintf("cluster %q is %s%s", route.Cluster, st.State, reasonSuffix(st.Reason)))
		return
	}
	g.forward(w, r, rq, route, d)
}

// waitForTunnel waits, up to TunnelWait, for a cluster whose entry is
// dialing, rather than failing a request the next moment would serve (a
// replica that just started, a cluster that just joined, an entry dialed
// on demand). It returns the entry's status then.
func (g *Gateway) waitForTunnel(ctx context.Context, cluster string, st tunnel.Status) tunnel.Status {
	wait, cancel := context.WithTimeout(ctx, g.opts.TunnelWait)
	defer cancel()
	start := g.opts.Now()
	err := g.opts.Pool.WaitReady(wait, cluster)
	g.m.tunnelWait.Observe(g.opts.Now().Sub(start).Seconds())
	if now, ok := g.opts.Pool.Status(cluster); ok {
		st = now
	}
	if err == nil {
		st.State = tunnel.StateReady
	}
	return st
}

// decide chooses the identity of a request from its token, or refuses
// it. Tokens accepted or refused lately are answered from memory; a
// client address that has spent its refusals waits before anything else
// is spent on it.
func (g *Gateway) decide(ctx context.Context, addr string, tg target, token string, key tokenKey) (decision, *refusal) {
	now, pk := g.opts.Now(), tg.pass(key)
	if id, ok := g.reviewer.cached(key); ok {
		return g.impersonation(id)
	}
	if _, ok := g.passes.get(pk, now); ok && tg.served && g.accepted(pk, now) {
		return decision{mode: modePassThrough, token: token}, nil
	}
	if ref, ok := g.refusals.get(pk, now); ok {
		return decision{}, &ref
	}
	// A token accepted lately for this cluster is checked whatever its
	// address has spent; any other check is paid for up front, and given
	// back only if it passes: its refusal, whatever the code, is charged.
	release := func() {}
	_, known := g.known.get(pk, now)
	if !known {
		var wait time.Duration
		var ok bool
		if release, wait, ok = g.strangers.admit(addr); !ok {
			return decision{}, rateLimited(wait)
		}
	}
	d, ref := g.check(ctx, tg, token, key, now)
	switch {
	case ref == nil && d.mode == modePassThrough && !g.accepted(pk, now):
		// The cluster may still refuse it (another audience, a deleted
		// ServiceAccount): the admission is given back, and the token
		// known, once the cluster has accepted it (answer). Asking the
		// cluster costs it a connection of its own besides the request:
		// it holds two tokens.
		d.trial = true
		if known {
			return d, nil
		}
		more, wait, ok := g.strangers.admit(addr)
		if !ok {
			release()
			return decision{}, rateLimited(wait)
		}
		d.release = func() { release(); more() }
		return d, nil
	case ref == nil:
		release()
		g.known.put(pk, struct{}{}, now.Add(knownFor))
		return d, nil
	case ref.code == http.StatusUnauthorized:
		// Answered from memory next time, and charged then.
		g.refusals.put(pk, *ref, now.Add(g.opts.RefusalCacheTTL))
	}
	ref.paid = !known // admit charged it
	return d, ref
}

// rateLimited is the answer to an address that has spent its refusals.
func rateLimited(wait time.Duration) *refusal {
	ref := refuse(http.StatusTooManyRequests, "rate_limited",
		"too many refused requests from this address; try again later")
	ref.retryAfter = wait
	return ref
}

// accepted reports a token passed through that the cluster has accepted
// lately.
func (g *Gateway) accepted(pk passKey, now time.Time) bool {
	_, ok := g.confirmed.get(pk, now)
	return ok
}

func (g *Gateway) impersonation(id Identity) (decision, *refusal) {
	if id.Username == "" {
		// Never forward as the impersonator itself.
		return decision{}, refuse(http.StatusUnauthorized, "no_username", "the hub authenticated the token without a username")
	}
	return decision{mode: modeImpersonate, id: id}, nil
}

// check asks who the token belongs to: a managed cluster's own token
// (verified against the cluster's keys, with no hub request), or a hub
// identity (the hub's TokenReview).
func (g *Gateway) check(ctx context.Context, tg target, token string, key tokenKey, now time.Time) (decision, *refusal) {
	var t *jwt
	if g.opts.PassThrough {
		t = parseJWT(token)
	}
	from, keysErr := fromNobody, error(nil)
	if t != nil {
		from, keysErr = g.origin(ctx, tg, t)
		if d, ref, done := g.signed(tg, t, from, token, key, now); done {
			return d, ref
		}
	}
	id, ok, err := g.reviewer.review(ctx, key, token)
	switch {
	case errors.Is(err, ErrReviewsBusy):
		g.m.reviews.WithLabelValues("busy").Inc()
		return decision{}, refuse(http.StatusServiceUnavailable, "reviews_busy",
			"too many tokens are being checked with the hub; try again")
	case err != nil:
		g.m.reviews.WithLabelValues("error").Inc()
		g.log.Warn("hub TokenReview failed; refusing the request", "err", err)
		return decision{}, refuse(http.StatusServiceUnavailable, "review_failed", "the hub's TokenReview could not be reached; try again")
	case ok:
		g.m.reviews.WithLabelValues("authenticated").Inc()
		if t != nil && from == fromNobody {
			g.noteIssuer(t.claims.Issuer)
		}
		return g.impersonation(id)
	}
	g.m.reviews.WithLabelValues("unauthenticated").Inc()
	return decision{}, g.unauthenticated(tg, t, from, keysErr)
}

// signed decides a JWT whose signer the gateway could tell without the
// hub: a cluster's own token passes through, unless it has expired or is
// the gateway's own impersonating credential; an expired hub token is
// refused. done is false when the hub is to be asked.
func (g *Gateway) signed(tg target, t *jwt, from origin, token string, key tokenKey, now time.Time) (d decision, ref *refusal, done bool) {
	switch {
	case from == fromCluster && t.claims.expired(now):
		return decision{}, refuse(http.StatusUnauthorized, "token_expired", "the token has expired"), true
	case from == fromCluster && g.impersonator(tg.cluster, token, t):
		g.log.Warn("a client sent the gateway's impersonating credential of a cluster; refused", "cluster", tg.cluster)
		return decision{}, refuse(http.StatusUnauthorized, "impersonator_token", fmt.Sprintf(
			"this token may not pass through to cluster %q", tg.cluster)), true
	case from == fromCluster:
		until := now.Add(MaxCacheTTL)
		if exp := t.claims.expiry(); !exp.IsZero() && exp.Before(until) {
			until = exp
		}
		g.passes.put(tg.pass(key), struct{}{}, until)
		return decision{mode: modePassThrough, token: token}, nil, true
	case from == fromHub && t.claims.expired(now):
		g.m.reviews.WithLabelValues("skipped").Inc()
		return decision{}, refuse(http.StatusUnauthorized, "hub_token_refused",
			"this hub token has expired; hub tokens are never forwarded"), true
	}
	return decision{}, nil, false
}

// impersonator reports token being the cluster's ManagedServiceAccount's,
// with which the gateway impersonates: that very token, or another one of
// the same ServiceAccount (t is verified: its subject is the cluster's
// word). That identity never acts as itself through the gateway.
func (g *Gateway) impersonator(cluster, token string, t *jwt) bool {
	auth, err := g.opts.Pool.Authorization(cluster)
	if err != nil {
		return false
	}
	own := strings.TrimPrefix(auth, "Bearer ")
	if subtle.ConstantTimeCompare([]byte(own), []byte(token)) == 1 {
		return true
	}
	o := parseJWT(own) // hubsync's own credential, from the hub
	return o != nil && o.claims.Subject != "" && o.claims.Subject == t.claims.Subject
}

// unauthenticated is the refusal of a token the hub does not recognise.
// A cluster whose keys could not be had is answered as one whose keys do
// not verify the token: a stranger learns nothing of which clusters exist
// (the fetch's failure is in the metrics, and at debug level in the log).
func (g *Gateway) unauthenticated(tg target, t *jwt, from origin, keysErr error) *refusal {
	notCluster := func(why string) *refusal {
		return refuse(http.StatusUnauthorized, why, fmt.Sprintf(
			"the hub does not recognise this token, and it is not signed by the service-account keys of cluster %q: "+
				"only a cluster's own token passes through to it", tg.cluster))
	}
	switch {
	case errors.Is(keysErr, errHubKeys):
		g.log.Warn("cannot tell whose a token is: the hub's keys are unavailable; refusing the request", "err", keysErr)
		return refuse(http.StatusServiceUnavailable, "keys_unavailable",
			"the service-account keys that tell a hub token from a cluster's own could not be fetched; try again")
	case keysErr != nil:
		g.log.Debug("cannot tell whose a token is: the cluster's keys are unavailable; refusing the request", "cluster", tg.cluster, "err", keysErr)
		return notCluster("cluster_keys_unavailable")
	case from == fromHub:
		return refuse(http.StatusUnauthorized, "hub_token_refused",
			"the hub refuses this hub token (expired, revoked or for another audience); hub tokens are never forwarded")
	case t != nil:
		return notCluster("not_cluster_token")
	case g.opts.PassThrough:
		return refuse(http.StatusUnauthorized, "opaque_token",
			"the hub does not recognise this token, and only a managed cluster's JWT may pass through")
	default:
		return refuse(http.StatusUnauthorized, "not_hub_identity", "the hub does not recognise this token")
	}
}

// noteIssuer logs, once, an issuer whose JWTs the hub accepts but the
// gateway cannot identify by signature: it belongs in gateway.hubIssuers.
func (g *Gateway) noteIssuer(issuer string) {
	if len(issuer) > 256 {
		issuer = issuer[:256]
	}
	now := g.opts.Now()
	if _, seen := g.issuers.get(issuer, now); seen {
		return
	}
	g.issuers.put(issuer, struct{}{}, now.Add(24*time.Hour))
	g.log.Warn("the hub accepts JWTs of an issuer the gateway cannot identify by signature; add it to gateway.hubIssuers",
		"issuer", issuer)
}

// origin is who signed a JWT, as far as the gateway can tell.
type origin int

const (
	fromNobody  origin = iota // no key the gateway knows
	fromHub                   // the hub's keys, or a hub issuer
	fromCluster               // the cluster's own keys, and not the hub's
)

// errHubKeys is the hub's key set being unavailable: the gateway cannot
// tell a hub token from a cluster's own, for any cluster.
var errHubKeys = errors.New("the hub's service-account keys are unavailable")

// origin checks t against the hub's keys, then the cluster's. A key id
// that neither knows makes the hub's set be fetched again (it may be the
// hub's newest key). err: a key set could not be had, so the token must
// not pass through (errHubKeys: the hub's).
func (g *Gateway) origin(ctx context.Context, tg target, t *jwt) (origin, error) {
	hub := g.opts.HubKeys
	if _, ok, err := hub.verify(ctx, t.jws, false); err != nil {
		return fromNobody, fmt.Errorf("%w: %w", errHubKeys, err)
	} else if ok || t.claims.issuedBy(g.opts.HubIssuers) {
		return fromHub, nil
	}
	var keys *KeySet
	if tg.served {
		keys = g.keysOf(tg)
		_, ok, err := keys.verify(ctx, t.jws, true)
		if err != nil {
			return fromNobody, err
		}
		if ok {
			return g.notTheHubs(ctx, keys, t)
		}
	}
	if !hub.Knows(t.jws) && (keys == nil || !keys.Knows(t.jws)) {
		// Checked against the hub's set as it was above: only a new set
		// can tell more.
		_, ok, err := hub.verifyRefetched(ctx, t.jws)
		if err != nil {
			return fromNobody, fmt.Errorf("%w: %w", errHubKeys, err)
		}
		if ok {
			return fromHub, nil
		}
	}
	return fromNobody, nil
}

// notTheHubs decides a token the cluster's keys verify: the cluster's
// own, unless the hub's keys verify it too. A cluster that trusts the
// hub's keys (a local-cluster, spokes given the hub's key) lists a key
// the hub added as soon as the hub does, perhaps before the gateway's
// copy of the hub's set has it: so the hub's set is always at least as
// new as the cluster's set that verified the token. Fetched again for a
// key id it lacks when the cluster's set is newer, that costs at most one
// hub fetch per fetch of a cluster's set.
func (g *Gateway) notTheHubs(ctx context.Context, keys *KeySet, t *jwt) (origin, error) {
	hub := g.opts.HubKeys
	if hub.Knows(t.jws) {
		return fromCluster, nil // checked against this very set above
	}
	_, ok, err := hub.verifyFetchedSince(ctx, t.jws, keys.fetchedAt())
	switch {
	case err != nil:
		return fromNobody, fmt.Errorf("%w: %w", errHubKeys, err)
	case ok:
		return fromHub, nil
	}
	return fromCluster, nil
}

// keysOf is the key set of the cluster tg names, as the pool identifies
// it now, read through the pool as the ManagedServiceAccount (every
// ServiceAccount may read it on a default cluster:
// system:service-account-issuer-discovery). A cluster registered again
// under its name, or moved, gets a new set; the sets of clusters the
// pool no longer serves are dropped when another cluster's is made.
func (g *Gateway) keysOf(tg target) *KeySet {
	g.keysMu.Lock()
	defer g.keysMu.Unlock()
	k, ok := g.clusterKeys[tg.cluster]
	if ok && k.identity == tg.identity {
		return k.keys
	}
	if !ok {
		for c := range g.clusterKeys {
			if _, served := g.opts.Pool.Status(c); !served {
				delete(g.clusterKeys, c)
			}
		}
	}
	cluster := tg.cluster
	k = clusterKeySet{identity: tg.identity, keys: &KeySet{
		Fetch: func(ctx context.Context) ([]byte, error) {
			return g.fetchFromCluster(ctx, cluster, "/openid/v1/jwks")
		},
		RefreshEvery: g.opts.KeyRefresh, MinRefetch: g.opts.KeyMinRefetch, Now: g.opts.Now,
		OnFetch: g.m.keyFetch("cluster"),
	}}
	g.clusterKeys[cluster] = k
	return k.keys
}

// forward sends the request to the cluster over the pool with the
// identity d.
func (g *Gateway) forward(w *recorder, r *http.Request, rq *request, route Route, d decision) {
	want, err := g.identity(route.Cluster, d)
	if err != nil {
		g.proxyError(w, rq, err)
		return
	}
	rq.upgrade = isUpgrade(r)
	rq.watch = strings.Contains(route.Path, "/watch/")
	if r.URL.RawQuery != "" {
		q := r.URL.Query()
		watch, _ := strconv.ParseBool(q.Get("watch"))
		follow, _ := strconv.ParseBool(q.Get("follow"))
		rq.watch = rq.watch || watch || follow
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
		// A token the cluster signed may still be refused by it (another
		// audience, a deleted ServiceAccount); kube-apiserver answers 401
		// and closes the connection, which every client of the cluster
		// shares. Until the cluster has accepted it once (a trial), it
		// goes on a connection of its own.
		Transport: g.transportFor(route.Cluster, want, rq.upgrade || rq.trial),
		Rewrite: func(pr *httputil.ProxyRequest) {
			// Go's proxy has removed the hop-by-hop headers (and with
			// checkConnection, only those) and X-Forwarded-*.
			pr.Out.URL = outgoingURL(route, pr.Out.URL.RawQuery)
			pr.Out.Host = ""
			pr.Out.Trailer = nil
			setIdentity(pr.Out.Header, want)
		},
		// Watches and followed logs reach the client as they come; a
		// finished answer (a get, a list) is written in as few frames as
		// the server's buffers allow (see recorder.FlushError).
		FlushInterval:  -1,
		BufferPool:     g.buffers,
		ModifyResponse: func(resp *http.Response) error { return g.answer(w, rq, resp) },
		ErrorHandler:   func(w http.ResponseWriter, _ *http.Request, err error) { g.proxyError(w, rq, err) },
		ErrorLog:       g.errorLog,
	}
	proxy.ServeHTTP(w, r)
}

// What the cluster said to a trial (hubsync_gateway_trials_total).
const (
	trialAccepted = "accepted"
	trialRefused  = "refused"
	trialError    = "error"
)

// answer decides what of the cluster's answer the client gets. These are
// the proxy's edges, each decided as apimachinery's UpgradeAwareHandler
// names them:
//   - the cluster's CORS headers are removed (stripCORS);
//   - a redirect (3xx with Location) is answered with 502, never passed
//     on: the client would follow it past the gateway, perhaps with its
//     hub token, to an address only the cluster's network knows;
//   - an upgrade the cluster answers with anything but 101 is passed on
//     when it is an error (>= 400: the Status says why, e.g. Forbidden),
//     and answered with 502 otherwise;
//   - a 101 to a request that asked for no upgrade, or for another
//     protocol, is refused by Go's proxy with 502, and the connection is
//     never hijacked;
//   - a managed cluster refusing a token passed through (401) is
//     remembered, so that it does not reach the cluster again soon.
//
// Errors before the hijack are answered with a Status (proxyError);
// after it the client's connection is closed with the cluster's, which
// clients see as the stream ending and re-establish.
func (g *Gateway) answer(w *recorder, rq *request, resp *http.Response) error {
	stripCORS(resp.Header)
	code := resp.StatusCode
	switch {
	case code == http.StatusSwitchingProtocols:
		// The proxy writes a 101 on the hijacked connection, never
		// through WriteHeader.
		rq.switched = true
		if body, ok := resp.Body.(io.ReadWriteCloser); ok {
			resp.Body = g.trackUpgrade(body)
		}
		rq.flight.upgraded()
	case rq.upgrade && code < http.StatusBadRequest:
		g.log.Warn("a cluster answered an upgrade without switching protocols", "cluster", rq.cluster, "code", code)
		rq.refusal = "upgrade_not_switched"
		replaceResponse(resp, http.StatusBadGateway, fmt.Sprintf("cluster %q answered the upgrade with %d instead of switching protocols", rq.cluster, code))
	case code >= 300 && code < 400 && resp.Header.Get("Location") != "":
		g.log.Warn("a cluster answered with a redirect; not forwarded", "cluster", rq.cluster, "code", code)
		rq.refusal = "redirect"
		replaceResponse(resp, http.StatusBadGateway, fmt.Sprintf("cluster %q answered with a redirect, which the gateway does not forward", rq.cluster))
	case code == http.StatusUnauthorized && rq.mode == modePassThrough:
		// Revoked, or for another audience: its signature was good, but
		// the cluster says no. Do not send it there again for a while.
		now := g.opts.Now()
		g.passes.remove(rq.pass)
		g.confirmed.remove(rq.pass)
		g.known.remove(rq.pass)
		g.refusals.put(rq.pass, *refuse(http.StatusUnauthorized, "cluster_refused_token",
			fmt.Sprintf("cluster %q refuses this token", rq.cluster)), now.Add(g.opts.RefusalCacheTTL))
		rq.tried = trialRefused
		if rq.release != nil {
			rq.release = nil // the admission it held is the charge
		} else {
			g.strangers.charge(rq.addr)
		}
	case rq.trial:
		// Accepted: from now on it shares the cluster's connection, and
		// its client's address is not limited for it (finish gives the
		// admission back).
		until := g.opts.Now().Add(knownFor)
		g.confirmed.put(rq.pass, struct{}{}, until)
		g.known.put(rq.pass, struct{}{}, until)
		rq.tried = trialAccepted
	}
	w.buffered = !rq.watch && finished(resp)
	if rq.watch && code == http.StatusOK {
		// A drain ends it as the cluster would, for the client to watch
		// again on another replica.
		resp.Body = rq.flight.watch(resp.Body)
	}
	if !rq.switched {
		moveHeader(w.Header(), resp.Header)
	}
	return nil
}

// moveHeader gives dst src's headers, leaving src empty, as Go's proxy
// would next copy them (httputil's copyHeader adds each value, which
// allocates per value): the proxy then finds nothing left to copy. The
// proxy has already removed the hop-by-hop headers from src. Not for a
// 101, whose headers the proxy writes from src itself.
func moveHeader(dst, src http.Header) {
	for k, vs := range src {
		if have, ok := dst[k]; ok {
			dst[k] = append(have, vs...)
		} else {
			dst[k] = vs
		}
	}
	clear(src)
}

// proxyError answers a request the pool or the cluster failed.
func (g *Gateway) proxyError(w http.ResponseWriter, rq *request, err error) {
	switch {
	case errors.Is(err, errIdentity):
		// A bug, never a client's doing: nothing was sent.
		g.log.Error("refused to send a request whose identity the gateway did not set", "cluster", rq.cluster, "mode", rq.mode, "err", err)
		g.refuse(w, rq, refuse(http.StatusInternalServerError, "identity_mismatch",
			"the outgoing request's identity was not the one the gateway set; it was not sent"))
	case errors.Is(err, tunnel.ErrNotServed):
		g.refuse(w, rq, refuse(http.StatusNotFound, "cluster_not_served", err.Error()))
	case errors.Is(err, tunnel.ErrNotReady):
		g.unavailable(w, rq, "cluster_not_ready", err.Error())
	case errors.Is(err, tunnel.ErrNoCredential):
		g.unavailable(w, rq, "no_credential", err.Error()+": the gateway has no impersonating credential for it")
	case errors.Is(err, tunnel.ErrUpgradesBusy):
		g.unavailable(w, rq, "upgrades_busy", err.Error())
	case errors.Is(err, os.ErrDeadlineExceeded) && rq.bodyDeadline:
		g.refuse(w, rq, refuse(http.StatusRequestTimeout, "slow_body",
			fmt.Sprintf("the request body did not arrive within %s", g.opts.BodyTimeout)))
	case errors.Is(err, context.Canceled):
		// The client went away.
		rq.refusal = "client_gone"
		w.WriteHeader(499)
	default:
		// The error may name addresses and hosts of the hub's network:
		// it goes to the log, not to the client.
		g.log.Warn("request to a cluster failed", "cluster", rq.cluster, "err", err)
		rq.refusal = "upstream_error"
		writeStatus(w, http.StatusBadGateway, "ServiceUnavailable",
			fmt.Sprintf("cluster %q could not be reached; hubsync's log says why", rq.cluster))
	}
}

// refuse answers with the gateway's own Status. Every refusal (4xx, and
// 503) is charged to the client's address, once; 429 is the charge's
// own answer, and a 500 or 502 is the gateway's or the cluster's doing.
func (g *Gateway) refuse(w http.ResponseWriter, rq *request, ref *refusal) {
	rq.refusal = ref.why
	if rq.body {
		// net/http reads up to 256 KiB of a body the handler left unread,
		// before an HTTP/1.1 answer and after any answer, for as long as
		// the client takes to send it: the refusal is answered at once
		// instead, and the connection closed.
		if rq.http1 {
			w.Header().Set("Connection", "close")
		}
		_ = http.NewResponseController(w).SetReadDeadline(time.Now())
	}
	if charged(ref.code) && !ref.paid {
		g.strangers.charge(rq.addr)
	}
	switch ref.code {
	case http.StatusServiceUnavailable:
		w.Header().Set("Retry-After", seconds(g.opts.RetryAfter))
	case http.StatusTooManyRequests:
		w.Header().Set("Retry-After", seconds(ref.retryAfter))
	}
	writeStatus(w, ref.code, ref.reason, ref.msg)
}

// charged reports a refusal code charged to the client's address.
func charged(code int) bool {
	return code >= 400 && code < 500 && code != http.StatusTooManyRequests || code == http.StatusServiceUnavailable
}

func (g *Gateway) unavailable(w http.ResponseWriter, rq *request, why, msg string) {
	g.refuse(w, rq, refuse(http.StatusServiceUnavailable, why, msg))
}

// seconds is d for Retry-After: whole seconds, at least 1.
func seconds(d time.Duration) string {
	return strconv.Itoa(max(1, int((d+time.Second-1)/time.Second)))
}

// statusBody is a Kubernetes Status, which kubectl and client-go show as
// the error's message.
func statusBody(code int, reason, msg string) []byte {
	var body bytes.Buffer
	enc := json.NewEncoder(&body)
	enc.SetEscapeHTML(false) // served as JSON, never HTML: keep "<user>" readable
	_ = enc.Encode(map[string]any{
		"kind": "Status", "apiVersion": "v1", "metadata": map[string]any{},
		"status": "Failure", "message": "hubsync gateway: " + msg, "reason": reason, "code": code,
	})
	return body.Bytes()
}

func writeStatus(w http.ResponseWriter, code int, reason, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	_, _ = w.Write(statusBody(code, reason, msg))
}

func (g *Gateway) finish(w *recorder, r *http.Request, rq *request) {
	if rq.release != nil {
		// Not refused by the cluster: the admission goes back.
		rq.release()
	}
	code := w.code
	switch {
	case rq.switched:
		code = http.StatusSwitchingProtocols
	case code == 0:
		code = http.StatusOK
	}
	g.m.requests.WithLabelValues(rq.cluster, rq.clusterSet, strconv.Itoa(code), rq.mode).Inc()
	if rq.refusal != "" {
		g.m.refused.WithLabelValues(rq.refusal).Inc()
	}
	if kind := rq.flight.endedBy(); kind != "" {
		g.m.drained.WithLabelValues(kind).Inc()
	}
	if rq.trial {
		g.m.trials.WithLabelValues(cmp.Or(rq.tried, trialError)).Inc()
	}
	elapsed := time.Since(rq.start)
	if !rq.upgrade && !rq.watch {
		g.m.duration.WithLabelValues(rq.mode, rq.clusterSet).Observe(elapsed.Seconds())
	}
	level := slog.LevelDebug
	if code >= 500 && code != 503 {
		level = slog.LevelWarn
	}
	if g.log.Enabled(r.Context(), level) {
		path := r.URL.EscapedPath()
		if rq.refusal == "credential_in_url" || rq.refusal == "bad_path" {
			path = "(not shown: it may hold a credential)"
		}
		g.log.Log(r.Context(), level, "gateway request", "method", r.Method, "path", path, "cluster", rq.cluster,
			"mode", rq.mode, "user", rq.user, "code", code, "refused", rq.refusal, "remote", r.RemoteAddr, "duration", elapsed)
	}
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
// requests instead of 32 KiB allocated for each. It keeps them as array
// pointers, which a slice converts to without an allocation (a *[]byte
// would cost one per request).
type bufferPool struct{ p sync.Pool }

const copyBufferSize = 32 << 10

func (b *bufferPool) Get() []byte {
	if v, ok := b.p.Get().(*[copyBufferSize]byte); ok {
		return v[:]
	}
	return make([]byte, copyBufferSize)
}

func (b *bufferPool) Put(buf []byte) {
	if cap(buf) >= copyBufferSize {
		b.p.Put((*[copyBufferSize]byte)(buf[:copyBufferSize]))
	}
}

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
