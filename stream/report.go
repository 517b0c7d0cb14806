package stream

import (
	"fmt"
	"strings"
	"time"
)

// Reporter is implemented by consumers that keep a backlog of their own
// beyond the stream's queue. For them a successful Deliver only hands the
// changes over (a webhook writes them to its spool and posts them later),
// so the worker's view, an empty queue and a last Deliver that succeeded,
// says nothing about whether the target gets them: the consumer's report,
// computed from its own delivery record, is merged into its Status (see
// Status.WithReport). Report is called by Statuses and by every metrics
// scrape, concurrently with the worker: it must be cheap and safe for that.
type Reporter interface {
	Report() Report
}

// Report is a consumer's account of its own delivery.
type Report struct {
	// Backlog is what the consumer has taken but its target not yet: the
	// events in a webhook's spool.
	Backlog int
	// Oldest is when the oldest of the backlog was taken; zero with none.
	Oldest time.Time
	// LastSuccess is when the target last took something; zero if it has
	// not since the consumer started.
	LastSuccess time.Time
	// LastAttempt is when the consumer last tried its target, LastResult
	// what came of it ("204 No Content", "503 Service Unavailable", "no
	// response").
	LastAttempt time.Time
	LastResult  string
	// Failing is set once the target has refused or been out of reach for
	// longer than the consumer tolerates, or for good (a webhook's 410
	// Gone); FailingSince is when that began (the first failed attempt
	// since the last success), Failures the attempts failed since, and
	// Error the last one's error. Errors never carry credentials.
	Failing      bool
	FailingSince time.Time
	Failures     int
	Error        string
}

// WithReport merges a consumer's report into its worker's status: the
// backlog counts as queued and its oldest item may be the oldest waiting;
// success and the last attempt are the consumer's; a failing target makes
// the consumer unhealthy, unless the worker itself is failing to hand
// changes over, whose error then stays the one shown.
func (s Status) WithReport(r Report) Status {
	s.Backlog = r.Backlog
	s.QueueDepth += r.Backlog
	if !r.Oldest.IsZero() && (s.Oldest.IsZero() || r.Oldest.Before(s.Oldest)) {
		s.Oldest = r.Oldest
	}
	s.LastSuccess = r.LastSuccess
	s.LastAttempt, s.LastResult = r.LastAttempt, r.LastResult
	if r.Failing && s.Healthy {
		s.Healthy = false
		s.FailingSince, s.Failures, s.LastError = r.FailingSince, r.Failures, r.Error
	}
	return s
}

// Summary is the status in one line, for /readyz?verbose: "sink hook
// (webhook): failing for 1m5s (14 attempts): POST https://...: endpoint
// answered 503 Service Unavailable, 65 queued, oldest 1m6s, last attempt
// 2s ago: 503 Service Unavailable".
func (s Status) Summary(now time.Time) string {
	var b strings.Builder
	fmt.Fprintf(&b, "sink %s (%s): ", s.Name, s.Type)
	if s.Healthy {
		b.WriteString("ok")
	} else {
		b.WriteString("failing")
		if !s.FailingSince.IsZero() {
			fmt.Fprintf(&b, " for %s", age(now, s.FailingSince))
		}
		fmt.Fprintf(&b, " (%d attempts): %s", s.Failures, s.LastError)
	}
	fmt.Fprintf(&b, ", %d queued", s.QueueDepth)
	if !s.Oldest.IsZero() {
		fmt.Fprintf(&b, ", oldest %s", age(now, s.Oldest))
	}
	if !s.LastAttempt.IsZero() {
		fmt.Fprintf(&b, ", last attempt %s ago: %s", age(now, s.LastAttempt), s.LastResult)
	}
	return b.String()
}

// age is how long ago t was, to the second (to the millisecond below one).
func age(now, t time.Time) time.Duration {
	d := max(now.Sub(t), 0)
	if d < time.Second {
		return d.Round(time.Millisecond)
	}
	return d.Round(time.Second)
}

// statusOf is a consumer's status: its worker's, with the age of the
// queue's head, and its own report if it makes one.
func statusOf(w *worker) Status {
	s := w.status()
	if e := w.q.head(); e != nil {
		s.Oldest = e.at
	}
	if r, ok := w.sink.(Reporter); ok {
		s = s.WithReport(r.Report())
	}
	return s
}

// unixSeconds is t as a Unix time in seconds; 0 for the zero time.
func unixSeconds(t time.Time) float64 {
	if t.IsZero() {
		return 0
	}
	return float64(t.UnixNano()) / 1e9
}
