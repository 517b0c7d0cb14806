package webhook

import (
	"net/http"
	"sync"
	"time"

	"github.com/hubsync/hubsync/stream"
)

// attempt is the record of one POST of one event.
type attempt struct {
	// code is the endpoint's status code; 0 when there was no answer
	// (unreachable, timed out, or the request could not even be made).
	code int
	// result is what came of it, for the status: the status line, or
	// "no response".
	result string
	// err is nil when the endpoint took the event. It never holds a
	// secret, a token or the URL's query.
	err error
	// retryAfter is the endpoint's Retry-After, capped, when the verdict
	// honours it; 0 otherwise.
	retryAfter time.Duration
}

// verdict is what an attempt's answer means for the sender.
type verdict int

const (
	// delivered: 2xx, the endpoint took the event; the next one goes.
	delivered verdict = iota
	// gone: 410 Gone, the endpoint says it will never take events again;
	// the sink is disabled until it is recreated.
	gone
	// throttled: 429 or 503, the endpoint is overloaded or down for a
	// while; the same event is retried after its Retry-After (capped) if
	// it sent one, else after the backoff.
	throttled
	// retry: any other answer (3xx, 4xx, 5xx) or none; the same event is
	// retried after the backoff. The spool is ordered, so an event the
	// endpoint refuses holds the ones behind it: a refusal for good
	// (400 for an event it cannot parse, 401 for a rotated secret) is an
	// outage to fix, which the sink reports failing, never a reason to
	// drop the event.
	retry
)

// classify is the sender's retry policy: the verdict on an answer with
// status code (0: no answer). Like knative's SelectiveRetry it honours
// Retry-After on 429 and 503; unlike it, it retries every 4xx but 410,
// since dropping an event would break the per-cluster order.
func classify(code int) verdict {
	switch {
	case code >= 200 && code < 300:
		return delivered
	case code == http.StatusGone:
		return gone
	case code == http.StatusTooManyRequests || code == http.StatusServiceUnavailable:
		return throttled
	default:
		return retry
	}
}

// health is the sink's delivery record: the outcome of its attempts, from
// which its status is computed. The sender records; Report reads, from any
// goroutine.
type health struct {
	// failingAfter is how long attempts may fail in a row before the sink
	// is reported failing; 0 reports it at the first failed attempt.
	failingAfter time.Duration

	mu sync.Mutex
	// since is when the current run of failed attempts began; zero while
	// the last attempt succeeded.
	since    time.Time
	failures int
	lastErr  string
	// lastSuccess is when the endpoint last took an event.
	lastSuccess time.Time
	lastAttempt time.Time
	lastResult  string
	// gone is set once the endpoint answered 410 Gone: the sink is
	// disabled for good, failing whatever failingAfter says.
	gone bool
}

// record adds the attempt that ended at now.
func (h *health) record(a attempt, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.lastAttempt, h.lastResult = now, a.result
	if a.err == nil {
		h.since, h.failures, h.lastErr, h.lastSuccess = time.Time{}, 0, "", now
		return
	}
	if h.failures == 0 {
		h.since = now
	}
	h.failures++
	h.lastErr = a.err.Error()
	if classify(a.code) == gone {
		h.gone = true
		h.lastErr = "disabled until it is recreated: " + h.lastErr
	}
}

// report is the record as of now: failing once attempts have failed in a
// row for failingAfter. It is computed when asked, so an endpoint that
// asked to be left alone (a long Retry-After) shows failing on time even
// though no attempt is made meanwhile.
func (h *health) report(now time.Time) stream.Report {
	h.mu.Lock()
	defer h.mu.Unlock()
	r := stream.Report{
		LastSuccess: h.lastSuccess, LastAttempt: h.lastAttempt, LastResult: h.lastResult,
		Failures: h.failures,
	}
	if h.gone || (h.failures > 0 && now.Sub(h.since) >= h.failingAfter) {
		r.Failing, r.FailingSince, r.Error = true, h.since, h.lastErr
	}
	return r
}

// resultOf is an attempt's result for the status.
func resultOf(resp *http.Response) string {
	if resp == nil {
		return "no response"
	}
	return resp.Status
}
