package webhook

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

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

// attempt is the outcome of one POST.
type attempt struct {
	// err is nil when the endpoint answered 2xx.
	err error
	// gone is set when it answered 410 Gone.
	gone bool
	// retryAfter is the endpoint's Retry-After of a 429 or 503, capped.
	retryAfter time.Duration
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
	var (
		failures  int       // failed attempts since the last 2xx
		notBefore time.Time // no attempt before then (backoff, Retry-After)
		lastWarn  time.Time
		idleSince time.Time // since when the spool has had nothing to send
	)
	for ctx.Err() == nil {
		if err := s.saveToldIfDue(false); err != nil {
			s.log.Warn("cannot save what the webhook endpoint was told; delivered segments stay on disk until it can", "err", err)
		}
		if s.attached() && s.spool.endOverflow() {
			s.log.Info("webhook spool has drained after events were dropped; asking for a resync from the current state")
			s.requestResync()
		}
		e, ok, err := s.spool.peek()
		if err != nil {
			n, derr := s.spool.dropHead()
			s.log.Error("cannot read the webhook spool's next segment; dropping it, and resyncing the endpoint once the spool has drained",
				"err", err, "events", n)
			if derr != nil {
				s.log.Warn("cannot remove the unreadable segment", "err", derr)
			}
			continue
		}
		if !ok {
			// Wake up now and then to save what the endpoint was told, and
			// once the spool has been idle that long, let its tail segment
			// go.
			s.toldMu.Lock()
			nap := s.toldSaveEvery
			s.toldMu.Unlock()
			if s.spool.hasTail() {
				now := s.opts.now()
				if idleSince.IsZero() {
					idleSince = now
				}
				if now.Sub(idleSince) >= tailIdle {
					s.spool.closeIdleTail()
				} else {
					nap = min(nap, tailIdle-now.Sub(idleSince))
				}
			}
			s.sleep(ctx, nap)
			continue
		}
		idleSince = time.Time{}
		if s.disabled.Load() {
			n, err := s.spool.dropAll()
			s.log.Debug("webhook sink disabled (410 Gone); dropped the spooled events", "events", n)
			if err != nil {
				s.log.Warn("cannot empty the spool of the disabled webhook sink", "err", err)
			}
			continue
		}
		if d := notBefore.Sub(s.opts.now()); d > 0 {
			s.sleep(ctx, d)
			continue
		}
		res := s.post(ctx, e)
		now := s.opts.now()
		switch {
		case res.err == nil:
			s.m.delivered(now.Sub(time.Unix(0, e.Spooled)).Seconds())
			if err := s.spool.commit(); err != nil {
				s.log.Warn("cannot record a delivered event in the spool; it may be sent again after a restart", "id", e.ID, "err", err)
			}
			if failures > 0 {
				s.log.Info("webhook endpoint accepts events again", "failedAttempts", failures)
			}
			failures, notBefore = 0, time.Time{}
		case res.gone:
			s.disable()
		default:
			failures++
			// The endpoint may want a rotated secret or token already.
			s.keys.stale()
			if s.token != nil {
				s.token.stale()
			}
			delay := res.retryAfter
			if delay <= 0 {
				delay = s.opts.backoff(failures)
			}
			notBefore = now.Add(delay)
			_, queued := s.spool.size()
			if failures == 1 || now.Sub(lastWarn) >= warnEvery {
				s.log.Warn("webhook delivery failed; retrying the same event", "err", res.err, "id", e.ID,
					"attempts", failures, "retryIn", delay, "spooled", queued)
				lastWarn = now
			} else {
				s.log.Debug("webhook delivery failed; retrying", "err", res.err, "id", e.ID, "attempts", failures, "retryIn", delay)
			}
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
	keys, err := s.keys.keys(ctx)
	if err != nil {
		return attempt{err: fmt.Errorf("sign event %s: %w", e.ID, err)}
	}
	var bearer string
	if s.token != nil {
		if bearer, err = s.token.token(); err != nil {
			return attempt{err: err}
		}
	}
	ts := strconv.FormatInt(s.opts.now().Unix(), 10)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url, bytes.NewReader(e.Body))
	if err != nil {
		// The URL was checked by New; the error would repeat it unredacted.
		return attempt{err: fmt.Errorf("POST %s: cannot build the request", s.logURL)}
	}
	req.Header.Set("Content-Type", events.ContentType)
	req.Header.Set("User-Agent", "hubsync-webhook/1")
	req.Header.Set(HeaderID, e.ID)
	req.Header.Set(HeaderTimestamp, ts)
	req.Header.Set(HeaderSignature, signatureHeader(keys, e.ID, ts, e.Body))
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		s.m.request("error")
		// url.Error repeats the URL, query included: say it redacted.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return attempt{err: fmt.Errorf("POST %s: %w", s.logURL, err)}
	}
	defer func() {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxDrain))
		_ = resp.Body.Close()
	}()
	code := resp.StatusCode
	s.m.request(strconv.Itoa(code))
	switch {
	case code >= 200 && code < 300:
		return attempt{}
	case code == http.StatusGone:
		return attempt{gone: true, err: fmt.Errorf("POST %s: %s", s.logURL, resp.Status)}
	case code >= 300 && code < 400:
		to := "(no Location)"
		if loc := resp.Header.Get("Location"); loc != "" {
			to = redactURL(loc)
		}
		return attempt{err: fmt.Errorf("POST %s: endpoint answered %s redirecting to %s: redirects are not followed, configure the final URL",
			s.logURL, resp.Status, to)}
	case code == http.StatusTooManyRequests || code == http.StatusServiceUnavailable:
		err := fmt.Errorf("POST %s: endpoint answered %s", s.logURL, resp.Status)
		if d, ok := parseRetryAfter(resp.Header.Get("Retry-After"), s.opts.now(), s.opts.retryAfterMax); ok {
			return attempt{err: fmt.Errorf("%w, retry after %s", err, d), retryAfter: d}
		}
		return attempt{err: err}
	default:
		return attempt{err: fmt.Errorf("POST %s: endpoint answered %s", s.logURL, resp.Status)}
	}
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

// backoff is the delay before attempt failures+1: exponential from
// retryBase up to retryMax, with half of it random ("equal jitter") so
// that hubs failing together do not retry together, and never less than
// half the exponential delay.
func (o options) backoff(failures int) time.Duration {
	d := o.retryBase
	for i := 1; i < failures && d < o.retryMax; i++ {
		d *= 2
	}
	d = min(d, o.retryMax)
	half := d / 2
	return half + time.Duration(o.jitter(int64(half)+1))
}
