package kueue

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hubsync/hubsync/stream"
)

// Kinds of problem the sink reports.
const (
	// conflict: an object of the name the sink would write exists and is
	// not the sink's; it is left alone.
	conflict = "conflict"
	// refused: the profile's kubeconfig breaks Kueue's rules, so it is not
	// written.
	refused = "refused"
	// tooMany: more clusters than a MultiKueueConfig may list.
	tooMany = "tooMany"
)

// configKey is the key of the MultiKueueConfig's problems, which no
// profile name (a DNS-1123 subdomain) can equal.
const configKey = "MultiKueueConfig "

// problem is why the sink cannot do its job for one profile (or the
// MultiKueueConfig).
type problem struct {
	kind   string
	reason string
}

// health is the sink's record for Report: its current problems and its
// last attempts. It has its own lock, so that Report never waits for a
// delivery's hub requests.
type health struct {
	mu       sync.Mutex
	problems map[string]problem
	// since is when the current problems began; zero with none.
	since time.Time
	// attempts counts the deliveries and resyncs since then.
	attempts    int
	lastAttempt time.Time
	lastResult  string
	lastSuccess time.Time
}

// set records key's problem (kind "" for none) and reports whether it
// changed.
func (h *health) set(key, kind, reason string, now time.Time) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	old, had := h.problems[key]
	switch {
	case kind == "" && !had:
		return false
	case kind == "":
		delete(h.problems, key)
	case had && old == problem{kind, reason}:
		return false
	default:
		h.problems[key] = problem{kind, reason}
	}
	switch {
	case len(h.problems) == 0:
		h.since, h.attempts = time.Time{}, 0
	case h.since.IsZero():
		h.since = now
	}
	return true
}

// forgetExcept drops the problems of profiles not in keep (the MultiKueueConfig's stay).
func (h *health) forgetExcept(keep func(string) bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for key := range h.problems {
		if key != configKey && !keep(key) {
			delete(h.problems, key)
		}
	}
	if len(h.problems) == 0 {
		h.since, h.attempts = time.Time{}, 0
	}
}

// count returns how many problems of kind there are.
func (h *health) count(kind string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, p := range h.problems {
		if p.kind == kind {
			n++
		}
	}
	return n
}

// attempt records a delivery or resync that ended at now with err.
func (h *health) attempt(err error, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.lastAttempt = now
	if len(h.problems) > 0 {
		h.attempts++
	}
	switch {
	case err != nil:
		h.lastResult = "error"
	case len(h.problems) > 0:
		h.lastResult = fmt.Sprintf("%d blocked", len(h.problems))
		h.lastSuccess = now
	default:
		h.lastResult = "ok"
		h.lastSuccess = now
	}
}

// maxShown bounds the problems the health message spells out.
const maxShown = 3

// report is the record as a stream.Report: failing while there is any
// problem, with the first few (by profile name) as the error.
func (h *health) report() stream.Report {
	h.mu.Lock()
	defer h.mu.Unlock()
	r := stream.Report{LastSuccess: h.lastSuccess, LastAttempt: h.lastAttempt, LastResult: h.lastResult}
	if len(h.problems) == 0 {
		return r
	}
	keys := slices.Sorted(maps.Keys(h.problems))
	var msgs []string
	for _, k := range keys[:min(len(keys), maxShown)] {
		msgs = append(msgs, h.problems[k].reason)
	}
	if more := len(keys) - maxShown; more > 0 {
		msgs = append(msgs, fmt.Sprintf("and %d more", more))
	}
	r.Failing, r.FailingSince, r.Failures = true, h.since, max(h.attempts, 1)
	r.Error = strings.Join(msgs, "; ")
	return r
}
