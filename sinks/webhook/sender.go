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
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/hubsync/hubsync/events"
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
	// backoff gives the delays between failed attempts at one event; it
	// starts again after a success.
	backoff   wait.Backoff
	failures  int       // failed attempts since the last 2xx
	notBefore time.Time // no attempt before then (backoff, Retry-After)
	lastWarn  time.Time
	idleSince time.Time // since when the spool has had nothing to send
}

// run is the sender: it posts the spooled events one at a time, oldest
// first, and removes each once the endpoint has taken it. The order of the
// spool is the order of Deliver and Resync, so every (namespace, cluster)
// gets its events in order.
//
// It retries by itself rather than with the CloudEvents SDK's HTTP retry,
// which ignores Retry-After, retries in lock step without jitter (every
// hub behind one outage would hit the endpoint at the same instants) and
// does not retry a 500.
func (s *sink) run(ctx context.Context) {
	defer close(s.done)
	st := &sendState{backoff: s.opts.newBackoff()}
	for ctx.Err() == nil {
		s.housekeep()
		e, ok, err := s.spool.peek()
		switch {
		case err != nil:
			s.dropUnreadable(err)
			continue
		case !ok:
			s.idle(ctx, st)
			continue
		}
		st.idleSince = time.Time{}
		if s.disabled.Load() {
			n, err := s.spool.dropAll()
			s.log.Debug("webhook sink disabled (410 Gone); dropped the spooled events", "events", n)
			if err != nil {
				s.log.Warn("cannot empty the spool of the disabled webhook sink", "err", err)
			}
			continue
		}
		if d := st.notBefore.Sub(s.opts.now()); d > 0 {
			s.sleep(ctx, d)
			continue
		}
		s.send(ctx, e, st)
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

// dropUnreadable drops the spool's head segment, which cannot be read.
func (s *sink) dropUnreadable(err error) {
	n, derr := s.spool.dropHead()
	s.log.Error("cannot read the webhook spool's next segment; dropping it, and resyncing the endpoint once the spool has drained",
		"err", err, "events", n)
	if derr != nil {
		s.log.Warn("cannot remove the unreadable segment", "err", derr)
	}
}

// idle waits while the spool has nothing to send: until woken, and now
// and then to save what the endpoint was told and, once the spool has
// been idle tailIdle, to let its tail segment go.
func (s *sink) idle(ctx context.Context, st *sendState) {
	s.toldMu.Lock()
	nap := s.toldSaveEvery
	s.toldMu.Unlock()
	if s.spool.hasTail() {
		now := s.opts.now()
		if st.idleSince.IsZero() {
			st.idleSince = now
		}
		if now.Sub(st.idleSince) >= tailIdle {
			s.spool.closeIdleTail()
		} else {
			nap = min(nap, tailIdle-now.Sub(st.idleSince))
		}
	}
	s.sleep(ctx, nap)
}

// send makes one attempt at e, records it, and acts on its verdict.
func (s *sink) send(ctx context.Context, e entry, st *sendState) {
	a := s.post(ctx, e)
	now := s.opts.now()
	s.health.record(a, now)
	switch classify(a.code) {
	case delivered:
		s.m.delivered(now.Sub(time.Unix(0, e.Spooled)).Seconds())
		if err := s.spool.commit(); err != nil {
			s.log.Warn("cannot record a delivered event in the spool; it may be sent again after a restart", "id", e.ID, "err", err)
		}
		if st.failures > 0 {
			s.log.Info("webhook endpoint accepts events again", "failedAttempts", st.failures)
		}
		st.failures, st.notBefore, st.backoff = 0, time.Time{}, s.opts.newBackoff()
	case gone:
		s.disable()
	default:
		st.failures++
		// The endpoint may want a rotated secret or token already.
		s.keys.stale()
		if s.token != nil {
			s.token.stale()
		}
		delay := s.opts.delay(&st.backoff)
		if a.retryAfter > 0 {
			delay = a.retryAfter
		}
		st.notBefore = now.Add(delay)
		_, queued := s.spool.size()
		if st.failures == 1 || now.Sub(st.lastWarn) >= warnEvery {
			s.log.Warn("webhook delivery failed; retrying the same event", "err", a.err, "id", e.ID,
				"attempts", st.failures, "retryIn", delay, "spooled", queued)
			st.lastWarn = now
		} else {
			s.log.Debug("webhook delivery failed; retrying", "err", a.err, "id", e.ID, "attempts", st.failures, "retryIn", delay)
		}
	}
}

// sleep waits for d (0: without limit) or until woken or stopped.
func (s *sink) sleep(ctx context.Context, d time.Duration) {
	var timeout <-chan time.Time
	if d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-ctx.Done():
	case <-s.wake:
	case <-timeout:
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

// post makes one attempt at one event. The attempt is bounded by the
// sink's timeout, not by ctx: Close lets a request under way finish, so
// that an event the endpoint took is not sent again after a restart.
func (s *sink) post(ctx context.Context, e entry) attempt {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.timeout)
	defer cancel()
	req, err := s.request(ctx, e)
	if err != nil {
		return attempt{result: resultOf(nil), err: err}
	}
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
