package main

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"time"
)

// verdict is the gate's answer for one scan and one allow-list.
type verdict struct {
	Refused []refusal    // reachable and not (or no longer) accepted
	Allowed []vuln       // reachable and accepted by a current entry
	Stale   []allowEntry // entries that accept nothing this scan reached
	Others  []vuln       // imported or required but not called
}

type refusal struct {
	vuln
	Why string
}

// Pass reports whether the gate lets the scan through.
func (v verdict) Pass() bool { return len(v.Refused) == 0 }

// judge applies the allow-list to a scan: every vulnerability whose code
// hubsync calls must be accepted by an entry that has not expired.
func judge(res scanResult, allow map[string]allowEntry, now time.Time) verdict {
	var v verdict
	used := map[string]bool{}
	for _, f := range res.Vulns {
		if f.Level != called {
			v.Others = append(v.Others, f)
			continue
		}
		e, ok := allow[f.ID]
		switch {
		case !ok:
			v.Refused = append(v.Refused, refusal{f, "not in the allow-list"})
		case !now.Before(e.Expires):
			used[f.ID] = true
			v.Refused = append(v.Refused, refusal{f, fmt.Sprintf("its allow-list entry (line %d) expired on %s", e.Line, e.Expires.Format(time.DateOnly))})
		default:
			used[f.ID] = true
			v.Allowed = append(v.Allowed, f)
		}
	}
	for id, e := range allow {
		if !used[id] {
			v.Stale = append(v.Stale, e)
		}
	}
	sort.Slice(v.Stale, func(i, j int) bool { return v.Stale[i].Line < v.Stale[j].Line })
	return v
}

// print writes the verdict for a person: each refused vulnerability with
// its fix and the call path that reaches it, then the accepted ones and
// the entries to remove.
func (v verdict) print(w io.Writer, res scanResult, allow map[string]allowEntry, target string) {
	fmt.Fprintf(w, "vulncheck: %s with %s on %s\n", target, res.Scanner, res.GoVersion)
	for _, r := range v.Refused {
		fmt.Fprintf(w, "\nREFUSED %s (%s): %s\n", r.ID, r.Why, r.Summary)
		fmt.Fprintf(w, "  found in %s@%s, fixed in %s\n", r.Module, r.Version, orNone(r.Fixed))
		fmt.Fprintf(w, "  reached by %s\n", callPath(r.Path))
	}
	for _, a := range v.Allowed {
		e := allow[a.ID]
		fmt.Fprintf(w, "allowed %s in %s@%s until %s: %s\n", a.ID, a.Module, a.Version, e.Expires.Format(time.DateOnly), e.Reason)
	}
	for _, o := range v.Others {
		fmt.Fprintf(w, "not called: %s in %s@%s (%s, fixed in %s): %s\n", o.ID, o.Module, o.Version, o.Level, orNone(o.Fixed), o.Summary)
	}
	for _, e := range v.Stale {
		fmt.Fprintf(w, "note: allow-list line %d (%s) accepts nothing this scan reached: remove it\n", e.Line, e.ID)
	}
	fmt.Fprintf(w, "vulncheck: %d reachable vulnerabilities refused, %d accepted by the allow-list; %d more in code imported or required but not called\n",
		len(v.Refused), len(v.Allowed), len(v.Others))
}

func orNone(fixed string) string {
	if fixed == "" {
		return "no release yet"
	}
	return fixed
}

// callPath shows a trace from hubsync's code down to the vulnerable
// function, the order a reader follows it.
func callPath(path []frame) string {
	parts := make([]string, 0, len(path))
	for i := len(path) - 1; i >= 0; i-- {
		parts = append(parts, path[i].String())
	}
	return strings.Join(parts, "\n    -> ")
}
