package webhook

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/hubsync/hubsync/events"
	"github.com/hubsync/hubsync/stream"
)

// tailIdle is how long the spool must have had nothing to send before the
// sender closes its tail segment, which lets it be removed.
const tailIdle = time.Second

// warnEvery bounds how often a failing endpoint is logged at warning level;
// the attempts in between are logged at debug level.
const warnEvery = 30 * time.Second

// maxDrain is how much of a response body is read, so that the connection
// can be reused; the body itself is never used.
const maxDrain = 64 << 10

// sendState is the sender's own state between attempts.
type sendState struct {
	// backoff gives the delays between failed attempts; it starts again
	// after a success.
	backoff   wait.Backoff
	failures  int       // failed attempts since the last 2xx
	notBefore time.Time // no attempt before then (backoff, Retry-After)
	// probing is set from a failed attempt until one succeeds: meanwhile
	// one attempt goes at a time, so an endpoint that is down or throttling
	// gets what a single sender would send it, not one request per key.
	probing   bool
	lastWarn  time.Time
	idleSince time.Time // since when the spool has had nothing to send

	// pending are the events taken from the spool and not delivered yet,
	// in spool order, those in flight included.
	pending  []*delivery
	inFlight int
	// results receives the outcome of every attempt; it holds as many as
	// can be in flight, so an attempt never waits to report.
	results chan result
	// seen is launch's scratch: the keys it has passed.
	seen map[stream.Key]bool
}

// delivery is one event on its way to the endpoint.
type delivery struct {
	e       entry
	at      pos
	key     stream.Key
	sending bool // an attempt is in flight
}

// result is the outcome of one attempt at d.
type result struct {
	d     *delivery
	a     attempt
	probe bool // made while probing
}

// run is the sender: it posts the spooled events, up to concurrency at a
// time, and removes each from the spool once the endpoint has taken it.
// Events of one (namespace, cluster) go one at a time, in spool order,
// which is the order of Deliver and Resync: an event is sent only once
// every earlier event of its key is delivered. Events of other keys go
// side by side, taken from a window of the spool (window events from the
// first one not delivered yet), so one slow key holds the others back
// only once the window is full. A failed attempt makes the sender probe:
// one attempt at a time, after the backoff or Retry-After, which holds
// every key, until one succeeds.
//
// It retries by itself rather than with the CloudEvents SDK's HTTP retry,
// which ignores Retry-After, retries in lock step without jitter (every
// hub behind one outage would hit the endpoint at the same instants) and
// does not retry a 500.
func (s *sink) run(ctx context.Context) {
	defer close(s.done)
	st := &sendState{
		backoff: s.opts.newBackoff(), results: make(chan result, s.concurrency), seen: map[stream.Key]bool{},
	}
	for ctx.Err() == nil {
		s.housekeep()
		if s.disabled.Load() {
			s.dropDisabled(st)
		} else {
			s.fill(st)
			s.launch(ctx, st)
		}
		s.wait(ctx, st)
	}
	// Close lets the requests under way finish and records them, so that
	// an event the endpoint took is not sent again after a restart.
	for st.inFlight > 0 {
		s.finish(st, <-st.results)
	}
}

// housekeep saves what the endpoint was told when that is due, and asks
// for a resync once the spool has drained after events were dropped.
func (s *sink) housekeep() {
	if err := s.saveToldIfDue(false); err != nil {
		s.log.Warn("cannot save what the webhook endpoint was told; delivered segments stay on disk until it can", "err", err)
	}
	if s.attached() && s.spool.endOverflow() {
		s.log.Info("webhook spool has drained after events were dropped; asking for a resync from the current state")
		s.requestResync()
	}
}

// fill takes events from the spool while the window has room: the events
// pending and those delivered beyond the first one pending count.
func (s *sink) fill(st *sendState) {
	for len(st.pending)+s.spool.aheadCount() < s.window {
		e, at, ok, err := s.spool.take()
		switch {
		case err != nil:
			s.dropUnreadable(at.seg, err)
			continue
		case !ok:
			return
		}
		st.pending = append(st.pending, &delivery{e: e, at: at, key: stream.Key{Namespace: e.Namespace, Cluster: e.Cluster}})
	}
}

// launch starts an attempt at every event that may go now: the first
// pending event of each key, unless it is in flight already, up to
// concurrency attempts in flight (one while probing), and none before
// notBefore.
func (s *sink) launch(ctx context.Context, st *sendState) {
	if st.notBefore.After(s.opts.now()) {
		return
	}
	clear(st.seen)
	for _, d := range st.pending {
		if st.inFlight >= s.concurrency || (st.probing && st.inFlight > 0) {
			return
		}
		if st.seen[d.key] {
			continue
		}
		st.seen[d.key] = true
		if !d.sending {
			s.start(ctx, st, d)
		}
	}
}

// dropUnreadable drops a spool segment that cannot be read.
func (s *sink) dropUnreadable(seq uint64, err error) {
	n, derr := s.spool.dropSegment(seq)
	s.log.Error("cannot read a webhook spool segment; dropping it, and resyncing the endpoint once the spool has drained",
		"err", err, "events", n)
	if derr != nil {
		s.log.Warn("cannot remove the unreadable segment", "err", derr)
	}
}

// dropDisabled drops everything spooled once the endpoint answered 410
// Gone. Attempts still in flight end unheeded.
func (s *sink) dropDisabled(st *sendState) {
	st.pending = nil
	if _, events := s.spool.size(); events == 0 {
		return
	}
	n, err := s.spool.dropAll()
	s.log.Debug("webhook sink disabled (410 Gone); dropped the spooled events", "events", n)
	if err != nil {
		s.log.Warn("cannot empty the spool of the disabled webhook sink", "err", err)
	}
}

// wait waits for an attempt to end, an event to be spooled, Close, or
// the nap to pass.
func (s *sink) wait(ctx context.Context, st *sendState) {
	t := time.NewTimer(s.nap(st))
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-s.wake:
	case r := <-st.results:
		s.finish(st, r)
	case <-t.C:
	}
}

// nap is how long the sender may wait for an attempt to end or an event to
// come before it has something to do: the end of a backoff or Retry-After,
// saving what the endpoint was told, and, once the spool has been idle
// tailIdle, letting its tail segment go.
func (s *sink) nap(st *sendState) time.Duration {
	s.toldMu.Lock()
	nap := s.toldSaveEvery
	s.toldMu.Unlock()
	now := s.opts.now()
	if len(st.pending) > 0 {
		st.idleSince = time.Time{}
		if d := st.notBefore.Sub(now); d > 0 {
			nap = min(nap, d)
		}
		return nap
	}
	if s.spool.hasTail() {
		if st.idleSince.IsZero() {
			st.idleSince = now
		}
		if now.Sub(st.idleSince) >= tailIdle {
			s.spool.closeIdleTail()
		} else {
			nap = min(nap, tailIdle-now.Sub(st.idleSince))
		}
	}
	return nap
}

// start makes an attempt at d in a goroutine of its own, which reports to
// st.results. The request is signed here, by the sender: the signing
// secrets and the token are read by it alone.
func (s *sink) start(ctx context.Context, st *sendState, d *delivery) {
	d.sending = true
	st.inFlight++
	probe := st.probing
	// Bounded by the sink's timeout, not by ctx: Close lets a request
	// under way finish, so that an event the endpoint took is not sent
	// again after a restart.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.timeout)
	req, err := s.request(ctx, d.e)
	if err != nil {
		cancel()
		st.results <- result{d: d, a: attempt{result: resultOf(nil), err: err}, probe: probe}
		return
	}
	go func() {
		defer cancel()
		st.results <- result{d: d, a: s.post(req), probe: probe}
	}()
}

// finish records an attempt and acts on its verdict.
func (s *sink) finish(st *sendState, r result) {
	st.inFlight--
	r.d.sending = false
	now := s.opts.now()
	s.health.record(r.a, now)
	switch classify(r.a.code) {
	case delivered:
		s.m.delivered(now.Sub(time.Unix(0, r.d.e.Spooled)).Seconds())
		if err := s.spool.ack(r.d.at); err != nil {
			s.log.Warn("cannot record a delivered event in the spool; it may be sent again after a restart", "id", r.d.e.ID, "err", err)
		}
		if i := slices.Index(st.pending, r.d); i >= 0 {
			st.pending = slices.Delete(st.pending, i, i+1)
		}
		if st.failures > 0 {
			s.log.Info("webhook endpoint accepts events again", "failedAttempts", st.failures)
		}
		st.failures, st.probing, st.backoff = 0, false, s.opts.newBackoff()
	case gone:
		s.disable()
	default:
		s.failed(st, r, now)
	}
}

// failed acts on a failed attempt: its event stays pending, and the
// sender probes after the backoff, or the Retry-After if the endpoint
// sent one, which holds every key: a throttle is the endpoint's, not one
// cluster's.
func (s *sink) failed(st *sendState, r result, now time.Time) {
	st.failures++
	// The endpoint may want a rotated secret or token already.
	s.keys.stale()
	if s.token != nil {
		s.token.stale()
	}
	var delay time.Duration
	if r.probe || !st.probing {
		// The first failure, or a failed probe: the backoff grows. The
		// attempts that were in flight when the endpoint began to fail
		// do not grow it again.
		delay = s.opts.delay(&st.backoff)
	}
	if r.a.retryAfter > 0 {
		delay = r.a.retryAfter
	}
	st.probing = true
	if at := now.Add(delay); at.After(st.notBefore) {
		st.notBefore = at
	}
	_, queued := s.spool.size()
	retryIn := st.notBefore.Sub(now)
	if st.failures == 1 || now.Sub(st.lastWarn) >= warnEvery {
		s.log.Warn("webhook delivery failed; retrying the same event", "err", r.a.err, "id", r.d.e.ID,
			"attempts", st.failures, "retryIn", retryIn, "spooled", queued)
		st.lastWarn = now
	} else {
		s.log.Debug("webhook delivery failed; retrying", "err", r.a.err, "id", r.d.e.ID, "attempts", st.failures, "retryIn", retryIn)
	}
}

func (s *sink) attached() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.control != nil
}

func (s *sink) requestResync() {
	s.mu.Lock()
	c := s.control
	s.mu.Unlock()
	c.RequestResync()
}

// disable turns the sink off after a 410 Gone, until it is recreated.
func (s *sink) disable() {
	if !s.disabled.CompareAndSwap(false, true) {
		return
	}
	s.log.Error("webhook endpoint answered 410 Gone: the sink is disabled and drops its events until it is recreated (for example by a configuration reload)",
		"url", s.logURL)
	bytes, events := s.spool.size()
	s.m.state(bytes, events, true)
}

// post sends one attempt's request and reads the answer.
func (s *sink) post(req *http.Request) attempt {
	resp, err := s.client.Do(req)
	if err != nil {
		s.m.request("error")
		// url.Error repeats the URL, query included: say it redacted.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return attempt{result: resultOf(nil), err: fmt.Errorf("POST %s: %w", s.logURL, err)}
	}
	defer func() {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxDrain))
		_ = resp.Body.Close()
	}()
	s.m.request(strconv.Itoa(resp.StatusCode))
	return s.answer(resp)
}

// request is e's signed POST, with the bearer token if there is one.
func (s *sink) request(ctx context.Context, e entry) (*http.Request, error) {
	keys, err := s.keys.keys(ctx)
	if err != nil {
		return nil, fmt.Errorf("sign event %s: %w", e.ID, err)
	}
	var bearer string
	if s.token != nil {
		if bearer, err = s.token.token(); err != nil {
			return nil, err
		}
	}
	ts := strconv.FormatInt(s.opts.now().Unix(), 10)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url, bytes.NewReader(e.Body))
	if err != nil {
		// The URL was checked by New; the error would repeat it unredacted.
		return nil, fmt.Errorf("POST %s: cannot build the request", s.logURL)
	}
	req.Header.Set("Content-Type", events.ContentType)
	req.Header.Set("User-Agent", "hubsync-webhook/1")
	req.Header.Set(HeaderID, e.ID)
	req.Header.Set(HeaderTimestamp, ts)
	req.Header.Set(HeaderSignature, signatureHeader(keys, e.ID, ts, e.Body))
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	return req, nil
}

// answer is the attempt that resp ends.
func (s *sink) answer(resp *http.Response) attempt {
	a := attempt{code: resp.StatusCode, result: resultOf(resp)}
	switch v := classify(a.code); {
	case v == delivered:
	case a.code >= 300 && a.code < 400:
		to := "(no Location)"
		if loc := resp.Header.Get("Location"); loc != "" {
			to = redactURL(loc)
		}
		a.err = fmt.Errorf("POST %s: endpoint answered %s redirecting to %s: redirects are not followed, configure the final URL",
			s.logURL, resp.Status, to)
	case v == throttled:
		a.err = fmt.Errorf("POST %s: endpoint answered %s", s.logURL, resp.Status)
		if d, ok := parseRetryAfter(resp.Header.Get("Retry-After"), s.opts.now(), s.opts.retryAfterMax); ok {
			a.err, a.retryAfter = fmt.Errorf("%w, retry after %s", a.err, d), d
		}
	default:
		a.err = fmt.Errorf("POST %s: endpoint answered %s", s.logURL, resp.Status)
	}
	return a
}

// parseRetryAfter reads a Retry-After header: delay seconds or an HTTP
// date, capped at limit; a date in the past is no delay.
func parseRetryAfter(v string, now time.Time, limit time.Duration) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if n, err := strconv.ParseUint(v, 10, 64); err == nil {
		if n > uint64(limit/time.Second) {
			return limit, true
		}
		return time.Duration(n) * time.Second, true
	}
	if t, err := http.ParseTime(v); err == nil {
		return min(max(t.Sub(now), 0), limit), true
	}
	return 0, false
}

// newBackoff is the exponential part of the delays between attempts at
// one event: from retryBase, doubling after every failed attempt, up to
// retryMax.
func (o options) newBackoff() wait.Backoff {
	return wait.Backoff{Duration: min(o.retryBase, o.retryMax), Factor: 2, Steps: math.MaxInt, Cap: o.retryMax}
}

// delay is the wait after a failed attempt: b's next step, of which half
// is random ("equal jitter") so that hubs failing together do not retry
// together, and never less than half. wait.Backoff's own jitter only adds
// to a step; this one spreads it, and its randomness comes from options,
// so that tests can fix it.
func (o options) delay(b *wait.Backoff) time.Duration {
	half := b.Step() / 2
	return half + time.Duration(o.jitter(int64(half)+1))
}
