package tunnel

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"golang.org/x/net/http2"
	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	clusterv1 "open-cluster-management.io/api/cluster/v1"
)

// entry is one cluster's warm connection and the goroutine that keeps it.
type entry struct {
	p       *Pool
	cluster string
	ctx     context.Context
	cancel  context.CancelFunc
	// kick wakes the goroutine: the target changed, or a user found the
	// connection unusable.
	kick chan struct{}

	mu     sync.Mutex
	target Target
	// ident is target's Identity, made once per target.
	ident   string
	state   State
	reason  string
	since   time.Time
	latency time.Duration
	probed  time.Time
	dials   int
	cc      *http2.ClientConn
	// ccTarget is the target the current connection was made for.
	ccTarget Target
	// swapped is closed and replaced whenever cc changes.
	swapped chan struct{}
	// extra holds overflow connections to the same target, made while
	// every stream of cc and of the extras before them was busy (long
	// watches); they go when idle, and with cc.
	extra []*http2.ClientConn
	// extraDial is non-nil while an overflow connection is being dialed;
	// it is closed when the dial ends.
	extraDial chan struct{}
	// idleSince is when each overflow connection was first seen idle.
	idleSince map[*http2.ClientConn]time.Time
	// used is when a request last asked for the entry (Unix nanoseconds).
	used atomic.Int64
	// answers counts the answers (probes and requests) on the current
	// connection.
	answers atomic.Int64
	// paced says why the entry waits before its next dial or probe, until
	// pacedUntil; empty when it does not.
	paced      string
	pacedUntil time.Time
	// tls is the TLS configuration of the connections to tlsFor's target
	// (its server name and CA), with the session cache its redials resume
	// from.
	tls    *tls.Config
	tlsFor tlsKey
}

// tlsKey is what a TLS configuration is made for: a server name and the
// SHA-256 of a CA bundle.
type tlsKey struct {
	serverName string
	ca         [sha256.Size]byte
}

// touch records a request for the entry.
func (e *entry) touch() { e.used.Store(time.Now().UnixNano()) }

// idleFor is how long the entry has gone without a request; 0 while its
// first dial is in progress (someone asked for it) or a stream is open on
// one of its connections.
func (e *entry) idleFor() time.Duration {
	e.mu.Lock()
	conns := append([]*http2.ClientConn{e.cc}, e.extra...)
	connecting := e.state == StateConnecting
	e.mu.Unlock()
	if connecting {
		return 0
	}
	for _, cc := range conns {
		if cc != nil && load(cc) > 0 {
			return 0
		}
	}
	return time.Since(time.Unix(0, e.used.Load()))
}

func newEntry(p *Pool, cluster string, t Target) *entry {
	ctx, cancel := context.WithCancel(p.ctx)
	e := &entry{
		p: p, cluster: cluster, ctx: ctx, cancel: cancel,
		kick:   make(chan struct{}, 1),
		target: t, ident: t.Identity(), state: StateConnecting, since: time.Now(),
		swapped:   make(chan struct{}),
		idleSince: map[*http2.ClientConn]time.Time{},
	}
	e.touch()
	return e
}

func (e *entry) stop() { e.cancel() }

func (e *entry) wake() {
	select {
	case e.kick <- struct{}{}:
	default:
	}
}

// setTarget records a new target; a change that needs another connection
// wakes the goroutine, which makes the new one before closing the old.
func (e *entry) setTarget(t Target) {
	e.mu.Lock()
	redial := !e.target.sameConnection(t)
	e.target, e.ident = t, t.Identity()
	e.mu.Unlock()
	if redial {
		e.wake()
	}
}

func (e *entry) status() Status {
	e.mu.Lock()
	defer e.mu.Unlock()
	conns := len(e.extra)
	if e.cc != nil {
		conns++
	}
	return Status{
		Cluster: e.cluster, ClusterSet: e.target.ClusterSet, State: e.state, Reason: e.reason, Since: e.since,
		ProbeLatency: e.latency, LastProbe: e.probed, Address: e.target.Address,
		Credential: e.target.TokenFingerprint, Dials: e.dials, Connections: conns, Identity: e.ident,
		Paced: e.paced, PacedUntil: e.pacedUntil,
	}
}

// pace records that the entry waits d before its next dial or probe, and
// why ("" and 0: it no longer does).
func (e *entry) pace(why string, d time.Duration) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.paced, e.pacedUntil = truncate(why, maxReason), time.Time{}
	if why != "" {
		e.pacedUntil = time.Now().Add(d)
	}
}

// connecting reports whether the entry has not dialed yet (neither ready
// nor failing).
func (e *entry) connecting() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.state == StateConnecting
}

// use returns the connection for a request and a channel closed when
// the connection is replaced.
func (e *entry) use() (*http2.ClientConn, <-chan struct{}, Status) {
	e.mu.Lock()
	cc, swapped := e.cc, e.swapped
	e.mu.Unlock()
	return cc, swapped, e.status()
}

// A GOAWAY makes the entry dial a new connection at once (kube-apiserver
// sends them to rebalance clients with --goaway-chance, up to 2% of
// requests), but at most goawayRedials times a second after a burst of
// goawayRedialBurst. Requests wait for the new connection meanwhile (up
// to the dial timeout).
//
// A connection that goes away young (within minConnLifetime) having
// answered fewer than minConnAnswers times is a server that will not keep
// one (it sends GOAWAY after every answer, or is shutting down): the next
// dial then waits the redial backoff, as after a failure, and the entry
// says it is paced; the backoff starts again after a connection that
// outlived either bound. Such a server sees the dials of a failing one:
// at most 8 in a minute and 4 a minute after that per cluster and replica
// with the default backoff (1s doubling to 30s, each wait drawn from its
// upper half).
const (
	goawayRedials     = rate.Limit(10)
	goawayRedialBurst = 10
	minConnLifetime   = 5 * time.Second
	minConnAnswers    = 5
)

// maxReason bounds a failing reason (a TLS error can list every name a
// certificate holds); events allow 1024 bytes.
const maxReason = 512

// set moves the entry to a state; a change of state is announced.
func (e *entry) set(s State, reason string) {
	reason = truncate(reason, maxReason)
	e.mu.Lock()
	changed, was := e.state != s, e.state
	if changed {
		e.since = time.Now()
	}
	e.state, e.reason = s, reason
	uid := e.target.UID
	e.mu.Unlock()
	if !changed {
		return
	}
	if r := e.p.opts.Recorder; r != nil {
		ref := &corev1.ObjectReference{Kind: "ManagedCluster", APIVersion: clusterv1.GroupVersion.String(), Name: e.cluster, UID: uid}
		switch {
		case s == StateFailing:
			r.Eventf(ref, corev1.EventTypeWarning, "TunnelFailing", "hubsync cannot reach the cluster through its tunnel: %s", reason)
		case s == StateReady && was == StateFailing:
			r.Event(ref, corev1.EventTypeNormal, "TunnelReady", "hubsync reaches the cluster through its tunnel again")
		}
	}
	st := e.status()
	log := e.p.log.With("cluster", e.cluster, "address", st.Address)
	switch s {
	case StateReady:
		log.Info("tunnel ready", "probe", st.ProbeLatency.Round(time.Microsecond))
	case StateFailing:
		log.Warn("tunnel failing", "reason", reason)
	}
	e.p.m.transitions.WithLabelValues(string(s)).Inc()
	e.p.announce(st)
}

// run keeps the entry's connection until ctx ends.
func (e *entry) run(ctx context.Context) {
	defer e.swap(nil, Target{})
	b := redialBackoff(e.p.opts.BackoffBase, e.p.opts.BackoffMax)
	// young paces the redials after connections that went away young.
	young := redialBackoff(e.p.opts.BackoffBase, e.p.opts.BackoffMax)
	// lastQuick is when a lost connection was last redialed at once.
	var lastQuick time.Time
	goaways := rate.NewLimiter(goawayRedials, goawayRedialBurst)
	for ctx.Err() == nil {
		e.mu.Lock()
		t := e.target
		e.mu.Unlock()
		if t.Err != nil {
			e.swap(nil, Target{})
			e.set(StateFailing, t.Err.Error())
			e.sleep(ctx, 0)
			continue
		}
		cc, dead, err := e.connect(ctx, t)
		if err == nil {
			var latency time.Duration
			latency, err = e.probe(ctx, cc, t)
			// A throttled answer came through the tunnel: the cluster is
			// reachable, and keeps its connection while it sheds load.
			var first *throttled
			if errors.As(err, &first) {
				err = nil
			}
			if err != nil {
				e.p.own(cc, nil)
				_ = cc.Close()
			} else {
				b = redialBackoff(e.p.opts.BackoffBase, e.p.opts.BackoffMax)
				e.mu.Lock()
				e.latency = latency
				e.mu.Unlock()
				e.swap(cc, t)
				e.answers.Store(1) // the probe
				e.set(StateReady, "")
				born := time.Now()
				reason, redial := e.keep(ctx, cc, dead, first)
				if reason == "" {
					// The target changed, or a GOAWAY came: dial a new
					// connection while the old one finishes its streams.
					// GOAWAYs are followed at a bounded pace, so that a
					// server that sends one on every connection is not
					// redialed in a loop.
					e.mu.Lock()
					moved := !e.ccTarget.sameConnection(e.target)
					e.mu.Unlock()
					if !moved {
						e.afterGoaway(ctx, time.Since(born), goaways, &young)
					}
					continue
				}
				// A connection that was fine a moment ago gets one
				// immediate redial before the cluster is reported failing
				// (a load balancer reset, an API server closing idle
				// connections); not twice within a probe interval.
				if redial && time.Since(lastQuick) > e.p.opts.ProbeInterval {
					lastQuick = time.Now()
					continue
				}
				err = errors.New(reason)
			}
		}
		if ctx.Err() != nil {
			return
		}
		e.swap(nil, Target{})
		e.set(StateFailing, err.Error())
		e.sleep(ctx, b.Step())
	}
}

// afterGoaway waits before the dial that replaces a connection gone away
// after lived: the redial backoff when it went young (see
// minConnLifetime), else what the GOAWAY rate allows.
func (e *entry) afterGoaway(ctx context.Context, lived time.Duration, goaways *rate.Limiter, young *wait.Backoff) {
	answers := e.answers.Load()
	if lived >= minConnLifetime || answers >= minConnAnswers {
		*young = redialBackoff(e.p.opts.BackoffBase, e.p.opts.BackoffMax)
		if r := goaways.Reserve(); r.Delay() > 0 {
			e.p.m.goawayWaits.Inc()
			pause(ctx, r.Delay())
		}
		return
	}
	d := young.Step()
	e.p.m.goawayWaits.Inc()
	e.pace(fmt.Sprintf("the API server sent GOAWAY %s after the connection was made, having answered %d times: the next dial waits %s",
		lived.Round(time.Millisecond), answers, d.Round(time.Millisecond)), d)
	pause(ctx, d)
	e.pace("", 0)
}

// sleep waits d (0: until woken), or until the entry is woken or stopped.
func (e *entry) sleep(ctx context.Context, d time.Duration) {
	var timer <-chan time.Time
	if d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		timer = t.C
	}
	select {
	case <-ctx.Done():
	case <-e.kick:
	case <-timer:
	}
}

// pause waits d, or until ctx ends. Unlike sleep, a kick does not end it:
// every request that finds the connection gone away kicks the entry.
func pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// keep probes a ready connection until it fails (the reason is returned;
// redial says the connection was lost rather than found failing) or needs
// replacing: a new target or a GOAWAY ("" is returned).
func (e *entry) keep(ctx context.Context, cc *http2.ClientConn, dead <-chan struct{}, first *throttled) (reason string, redial bool) {
	defer e.pace("", 0)
	// next is the wait before the next probe when the last was throttled.
	var next time.Duration
	if first != nil {
		next = e.throttle(first)
	}
	for {
		// ±20% jitter spreads the probes of clusters that joined together.
		d := time.Duration(float64(e.p.opts.ProbeInterval) * (0.8 + 0.4*rand.Float64()))
		if next > 0 {
			d, next = next, 0
		}
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return "stopped", false
		case <-dead:
			t.Stop()
			return "connection lost", true
		case <-e.kick:
			t.Stop()
			e.mu.Lock()
			same := e.ccTarget.sameConnection(e.target)
			e.mu.Unlock()
			if same && e.stillUsable(ctx, cc) {
				continue
			}
			// A new target, or a GOAWAY (an API server going away, or
			// rebalancing with --goaway-chance): dial a new connection
			// while this one finishes what it carries.
			return "", false
		case <-t.C:
		}
		e.pace("", 0)
		e.mu.Lock()
		target := e.target
		e.mu.Unlock()
		if !usable(cc) {
			return "", false
		}
		e.pruneExtra(time.Now())
		latency, err := e.probe(ctx, cc, target)
		var th *throttled
		switch {
		case errors.As(err, &th):
			// The API server answered, shedding load: the connection is
			// kept and the next probe waits as long as it asks.
			e.answers.Add(1)
			next = e.throttle(th)
			continue
		case err != nil:
			return err.Error(), false
		}
		e.answers.Add(1)
		e.mu.Lock()
		e.latency = latency
		e.mu.Unlock()
	}
}

// throttle returns the wait before the probe after one answered 429 or
// 503 with Retry-After (at least a probe interval, at most
// maxRetryAfter), and says so in the entry's status.
func (e *entry) throttle(th *throttled) time.Duration {
	d := min(max(th.retryAfter, e.p.opts.ProbeInterval), maxRetryAfter)
	e.pace(fmt.Sprintf("the API server answered the probe %s (Retry-After %s): the next probe waits %s, the connection is kept",
		th.status, th.retryAfter, d), d)
	return d
}

// maxRetryAfter bounds the wait a probe's Retry-After asks for.
const maxRetryAfter = 5 * time.Minute

// throttled is a probe answered 429 Too Many Requests, or 503 Service
// Unavailable with a Retry-After: the API server sheds load, and a redial
// would add to it.
type throttled struct {
	status     string
	retryAfter time.Duration
}

func (t *throttled) Error() string {
	return fmt.Sprintf("the API server answered %s (Retry-After %s)", t.status, t.retryAfter)
}

// throttling returns the throttled answer resp is, or nil.
func throttling(resp *http.Response) *throttled {
	ra := resp.Header.Get("Retry-After")
	switch {
	case resp.StatusCode == http.StatusTooManyRequests:
	case resp.StatusCode == http.StatusServiceUnavailable && ra != "":
	default:
		return nil
	}
	d := time.Second // kube-apiserver's priority and fairness asks for 1s
	if n, err := strconv.Atoi(strings.TrimSpace(ra)); err == nil && n >= 0 {
		d = time.Duration(n) * time.Second
	} else if at, err := http.ParseTime(ra); err == nil {
		d = max(time.Until(at), 0)
	}
	return &throttled{status: resp.Status, retryAfter: d}
}

// goawaySettle is how long after a kick the entry looks at its
// connection again: the HTTP/2 transport reports a GOAWAY to its pool
// (MarkDead, which kicks the entry) just before it marks the connection
// as going away, so a look at once can miss it.
const goawaySettle = 20 * time.Millisecond

// stillUsable reports whether cc still takes new requests, looked at
// again goawaySettle after a kick.
func (e *entry) stillUsable(ctx context.Context, cc *http2.ClientConn) bool {
	if !usable(cc) {
		return false
	}
	t := time.NewTimer(goawaySettle)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return true // the caller's loop sees ctx end
	case <-t.C:
	}
	return usable(cc)
}

// swap makes cc the entry's connection and retires the previous one: it
// may finish its requests (watches too) for RetireGrace, then it closes.
func (e *entry) swap(cc *http2.ClientConn, t Target) {
	e.mu.Lock()
	old := e.cc
	e.cc, e.ccTarget = cc, t
	var extra []*http2.ClientConn
	if old != cc {
		close(e.swapped)
		e.swapped = make(chan struct{})
		// Overflow connections belong to the old connection's target.
		extra, e.extra = e.extra, nil
		clear(e.idleSince)
	}
	e.mu.Unlock()
	for _, x := range extra {
		e.retire(x)
	}
	if old == nil || old == cc {
		return
	}
	e.retire(old)
}

// retire lets a connection finish its requests (watches too) for
// RetireGrace, then closes it.
func (e *entry) retire(old *http2.ClientConn) {
	e.p.wg.Add(1)
	go func() {
		defer e.p.wg.Done()
		defer e.p.own(old, nil)
		if e.ctx.Err() != nil {
			// The entry stopped: no GOAWAY for a server that is left.
			_ = old.Close()
			return
		}
		ctx, cancel := context.WithTimeout(e.ctx, e.p.opts.RetireGrace)
		defer cancel()
		// Shutdown waits for open streams; a stopped entry (ctx done)
		// closes at once.
		if err := old.Shutdown(ctx); err != nil {
			_ = old.Close()
		}
	}()
}

// connect dials the target, does TLS with HTTP/2 and returns the HTTP/2
// connection and a channel closed when the connection breaks.
func (e *entry) connect(ctx context.Context, t Target) (*http2.ClientConn, <-chan struct{}, error) {
	p := e.p
	select {
	case p.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, nil, ctx.Err()
	}
	defer func() { <-p.sem }()
	ctx, cancel := context.WithTimeout(ctx, p.opts.DialTimeout)
	defer cancel()
	start := time.Now()
	e.mu.Lock()
	e.dials++
	e.mu.Unlock()
	raw, err := p.opts.Dialer.Dial(ctx, e.cluster, t.Address)
	if err != nil {
		p.m.dials.WithLabelValues("error").Inc()
		return nil, nil, fmt.Errorf("dial %s: %w", t.Address, err)
	}
	w := newWatchedConn(raw)
	tc := tls.Client(w, e.tlsConfig(t))
	if err := tc.HandshakeContext(ctx); err != nil {
		_ = w.Close()
		p.m.dials.WithLabelValues("error").Inc()
		return nil, nil, fmt.Errorf("TLS handshake with %s: %w", t.Address, err)
	}
	if proto := tc.ConnectionState().NegotiatedProtocol; proto != http2.NextProtoTLS {
		_ = tc.Close()
		p.m.dials.WithLabelValues("error").Inc()
		return nil, nil, fmt.Errorf("the API server at %s does not offer HTTP/2 (ALPN %q)", t.Address, proto)
	}
	cc, err := p.h2.NewClientConn(tc)
	if err != nil {
		_ = tc.Close()
		p.m.dials.WithLabelValues("error").Inc()
		return nil, nil, fmt.Errorf("HTTP/2 with %s: %w", t.Address, err)
	}
	p.own(cc, e)
	p.m.dials.WithLabelValues("ok").Inc()
	p.m.dialSeconds.Observe(time.Since(start).Seconds())
	return cc, w.dead, nil
}

// tlsConfig returns the TLS configuration of the entry's connections to
// t: made once per server name and CA, with a session cache of one
// session, so that a redial (after a GOAWAY, a lost connection, an API
// server restart behind the same certificate) resumes the last TLS session
// rather than doing a full handshake: no certificate chain sent, signed or
// verified again. crypto/tls resumes only a session whose chain the
// configuration's CA still verifies and whose certificate is unexpired; a
// new CA or server name starts a configuration without sessions.
func (e *entry) tlsConfig(t Target) *tls.Config {
	e.mu.Lock()
	defer e.mu.Unlock()
	key := tlsKey{t.ServerName, sha256.Sum256(t.CA)}
	if e.tls == nil || e.tlsFor != key {
		e.tls, e.tlsFor = tlsConfig(t), key
		e.tls.ClientSessionCache = tls.NewLRUClientSessionCache(1)
	}
	return e.tls
}

func tlsConfig(t Target) *tls.Config {
	c := &tls.Config{
		MinVersion: tls.VersionTLS12,
		ServerName: t.ServerName,
		NextProtos: []string{http2.NextProtoTLS},
	}
	if len(t.CA) > 0 {
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(t.CA)
		c.RootCAs = pool
	}
	return c
}

// probe sends one authenticated GET of the probe path.
func (e *entry) probe(ctx context.Context, cc *http2.ClientConn, t Target) (time.Duration, error) {
	p := e.p
	ctx, cancel := context.WithTimeout(ctx, p.opts.ProbeTimeout)
	defer cancel()
	if !usable(cc) {
		return 0, errors.New("the API server closed the connection (GOAWAY)")
	}
	if saturated(cc) || t.Token == "" {
		// Every stream is taken (long watches, say): a GET would wait
		// for one to end. Or there is no token: kube-apiserver answers an
		// anonymous HTTP/2 request and then closes the connection
		// (GOAWAY, its UnauthenticatedHTTP2DOSMitigation), so a GET would
		// tear down the connection it probes. An HTTP/2 PING crosses the
		// same tunnel and TLS session to the API server without a stream
		// or an identity.
		start := time.Now()
		err := cc.Ping(ctx)
		took := time.Since(start)
		e.mu.Lock()
		e.probed = time.Now()
		e.mu.Unlock()
		if err != nil {
			p.m.probes.WithLabelValues("error").Inc()
			if ctx.Err() != nil {
				return 0, fmt.Errorf("probe PING: no answer within %s", p.opts.ProbeTimeout)
			}
			return 0, fmt.Errorf("probe PING: %w", err)
		}
		p.m.probes.WithLabelValues("ok").Inc()
		p.m.probeSeconds.Observe(took.Seconds())
		return took, nil
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+hostForRequest(t)+p.opts.ProbePath, nil)
	if err != nil {
		return 0, fmt.Errorf("probe: %w", err)
	}
	if t.bearer != "" {
		req.Header.Set("Authorization", t.bearer)
	}
	req.Header.Set("User-Agent", "hubsync-tunnel-probe")
	start := time.Now()
	resp, err := cc.RoundTrip(req)
	if err == nil {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
		_ = resp.Body.Close()
	}
	took := time.Since(start)
	e.mu.Lock()
	e.probed = time.Now()
	e.mu.Unlock()
	switch {
	case err != nil:
		p.m.probes.WithLabelValues("error").Inc()
		if ctx.Err() != nil {
			return 0, fmt.Errorf("probe GET %s: no answer within %s", p.opts.ProbePath, p.opts.ProbeTimeout)
		}
		return 0, fmt.Errorf("probe GET %s: %w", p.opts.ProbePath, err)
	case resp.StatusCode != http.StatusOK:
		if th := throttling(resp); th != nil {
			p.m.probes.WithLabelValues("throttled").Inc()
			return took, th
		}
		p.m.probes.WithLabelValues("error").Inc()
		return 0, fmt.Errorf("probe GET %s: %s", p.opts.ProbePath, resp.Status)
	}
	p.m.probes.WithLabelValues("ok").Inc()
	p.m.probeSeconds.Observe(took.Seconds())
	return took, nil
}

// truncate cuts s to at most n bytes on a rune boundary, marking the cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const mark = "..."
	cut := n - len(mark)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + mark
}

// usable reports whether a connection takes new requests: it is not
// closed and has had no GOAWAY. A connection whose streams are all in use
// is still usable; a new request waits for a free stream (unlike
// CanTakeNewRequest, which says false then).
func usable(cc *http2.ClientConn) bool {
	st := cc.State()
	return !st.Closed && !st.Closing
}

// pick returns the connection for a new request: cc while it has a free
// stream, else an overflow connection that has one, dialing a new one (one
// dial at a time) while the entry has fewer than MaxConnsPerCluster. When
// all are busy and no more may be made, the least busy one is returned and
// the request waits there for a stream.
func (e *entry) pick(ctx context.Context, cc *http2.ClientConn) *http2.ClientConn {
	for {
		if !saturated(cc) {
			return cc
		}
		e.mu.Lock()
		if e.cc != cc {
			// Replaced meanwhile: new requests go to the new connection.
			next := e.cc
			e.mu.Unlock()
			if next == nil {
				return cc
			}
			cc = next
			continue
		}
		s, dead := e.survey(cc)
		e.mu.Unlock()
		for _, x := range dead {
			e.p.own(x, nil)
			_ = x.Close()
		}
		switch {
		case s.free != nil:
			return s.free
		case s.full:
			return s.best
		case s.dialing != nil:
			select {
			case <-s.dialing:
				continue
			case <-ctx.Done():
				return s.best
			}
		}
		if x, again := e.addExtra(ctx, cc, s); !again {
			return x
		}
	}
}

// overflow is what pick found among a saturated connection's overflow
// connections.
type overflow struct {
	free *http2.ClientConn // one with a free stream, if any
	best *http2.ClientConn // the least busy of all
	// full says no more connections may be made.
	full bool
	// dialing is closed when another request's overflow dial ends.
	dialing chan struct{}
	// done is set when this request is to dial: close it when the dial ends.
	done   chan struct{}
	target Target
}

// survey drops the overflow connections that are no longer usable
// (returned, for the caller to close) and finds a free or the least busy
// one. Unless one is free, it claims the overflow dial when it may make
// one and no dial is under way. The caller holds e.mu.
func (e *entry) survey(cc *http2.ClientConn) (overflow, []*http2.ClientConn) {
	live := make([]*http2.ClientConn, 0, len(e.extra))
	var dead []*http2.ClientConn
	for _, x := range e.extra {
		if usable(x) {
			live = append(live, x)
		} else {
			dead = append(dead, x)
		}
	}
	e.extra = live
	s := overflow{best: cc, target: e.ccTarget, dialing: e.extraDial}
	bestLoad := load(cc)
	for _, x := range live {
		if !saturated(x) {
			s.free = x
			break
		}
		if l := load(x); l < bestLoad {
			s.best, bestLoad = x, l
		}
	}
	s.full = 1+len(live) >= e.p.opts.MaxConnsPerCluster
	if s.free == nil && !s.full && s.dialing == nil {
		s.done = make(chan struct{})
		e.extraDial = s.done
	}
	return s, dead
}

// addExtra dials the overflow connection survey claimed for cc. It returns
// the connection to use, or again when cc was replaced meanwhile and pick
// must start over with the new one.
func (e *entry) addExtra(ctx context.Context, cc *http2.ClientConn, s overflow) (x *http2.ClientConn, again bool) {
	x, _, err := e.connect(ctx, s.target)
	e.mu.Lock()
	e.extraDial = nil
	close(s.done)
	current := e.cc == cc
	if err == nil && current {
		e.extra = append(e.extra, x)
	}
	n := 1 + len(e.extra)
	e.mu.Unlock()
	switch {
	case err != nil:
		e.p.log.Warn("tunnel: cannot add a connection to a busy cluster; requests wait for a stream", "cluster", e.cluster, "err", err)
		return s.best, false
	case !current:
		e.retire(x)
		return nil, true
	}
	e.p.log.Info("tunnel: every stream busy, added a connection", "cluster", e.cluster, "connections", n)
	return x, false
}

// pruneExtra closes overflow connections that have had no stream for
// ExtraIdle (or are no longer usable).
func (e *entry) pruneExtra(now time.Time) {
	e.mu.Lock()
	keep := make([]*http2.ClientConn, 0, len(e.extra))
	var idle []*http2.ClientConn
	for _, x := range e.extra {
		if !usable(x) {
			idle = append(idle, x)
			continue
		}
		if load(x) > 0 {
			delete(e.idleSince, x)
			keep = append(keep, x)
			continue
		}
		since, ok := e.idleSince[x]
		if !ok {
			e.idleSince[x] = now
		}
		if ok && now.Sub(since) >= e.p.opts.ExtraIdle {
			idle = append(idle, x)
			continue
		}
		keep = append(keep, x)
	}
	e.extra = keep
	for _, x := range idle {
		delete(e.idleSince, x)
	}
	e.mu.Unlock()
	for _, x := range idle {
		e.p.own(x, nil)
		_ = x.Close()
	}
}

// load is how many streams a connection has in use or promised.
func load(cc *http2.ClientConn) int {
	st := cc.State()
	return st.StreamsActive + st.StreamsReserved + st.StreamsPending
}

// saturated reports whether every stream the server allows is in use or
// promised to a request.
func saturated(cc *http2.ClientConn) bool {
	st := cc.State()
	return st.MaxConcurrentStreams > 0 && uint32(st.StreamsActive+st.StreamsReserved+st.StreamsPending) >= st.MaxConcurrentStreams
}

// hostForRequest is the :authority of requests: the TLS name when there
// is one, else the dialed address.
func hostForRequest(t Target) string {
	if t.ServerName != "" {
		return t.ServerName
	}
	return t.Address
}

// watchedConn closes dead on its first read or write error, so that a
// tunnel closed by the proxy-server or the agent is noticed at once.
type watchedConn struct {
	net.Conn
	dead chan struct{}
	once sync.Once
}

func newWatchedConn(c net.Conn) *watchedConn {
	return &watchedConn{Conn: c, dead: make(chan struct{})}
}

func (c *watchedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if err != nil {
		c.die()
	}
	return n, err
}

func (c *watchedConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	if err != nil {
		c.die()
	}
	return n, err
}

func (c *watchedConn) Close() error {
	c.die()
	return c.Conn.Close()
}

func (c *watchedConn) die() { c.once.Do(func() { close(c.dead) }) }

// redialBackoff is the wait after each failed dial or probe: it doubles
// from base up to max, each wait drawn from the upper half of its step
// ([step/2, step]), so that clusters that failed together do not all
// redial together.
func redialBackoff(base, max time.Duration) wait.Backoff {
	return wait.Backoff{Duration: base / 2, Factor: 2, Jitter: 1, Cap: max / 2, Steps: math.MaxInt32}
}
