package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"
	"time"
)

// maxAllowAhead is the longest an allow-list entry may run: an accepted
// vulnerability is looked at again at least this often.
const maxAllowAhead = 366 * 24 * time.Hour

// osvID is the shape of a Go vulnerability database id (GO-2026-4533).
var osvID = regexp.MustCompile(`^GO-[0-9]{4}-[0-9]{4,}$`)

// allowEntry accepts one reachable vulnerability until it expires.
type allowEntry struct {
	ID      string
	Expires time.Time // the first day on which the entry no longer counts
	Reason  string
	Line    int
}

// parseAllowList reads the allow-list: one entry a line, the OSV id, the
// date it expires (YYYY-MM-DD) and why the vulnerability is accepted until
// then; '#' starts a comment and blank lines are ignored. Every malformed
// line is reported, not only the first.
func parseAllowList(r io.Reader, name string, now time.Time) (map[string]allowEntry, error) {
	entries := map[string]allowEntry{}
	var errs []error
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line, _, _ := strings.Cut(sc.Text(), "#")
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		e, err := parseAllowLine(fields, n, now)
		if err == nil {
			if prev, dup := entries[e.ID]; dup {
				err = fmt.Errorf("%s is listed again (first on line %d)", e.ID, prev.Line)
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s:%d: %w", name, n, err))
			continue
		}
		entries[e.ID] = e
	}
	if err := sc.Err(); err != nil {
		errs = append(errs, fmt.Errorf("read %s: %w", name, err))
	}
	return entries, errors.Join(errs...)
}

func parseAllowLine(fields []string, n int, now time.Time) (allowEntry, error) {
	if !osvID.MatchString(fields[0]) {
		return allowEntry{}, fmt.Errorf("%q is not a Go vulnerability id (GO-YYYY-NNNN)", fields[0])
	}
	if len(fields) < 3 {
		return allowEntry{}, fmt.Errorf("%s needs an expiry date (YYYY-MM-DD) and a reason", fields[0])
	}
	day, err := time.Parse(time.DateOnly, fields[1])
	if err != nil {
		return allowEntry{}, fmt.Errorf("%s: expiry %q is not a date (YYYY-MM-DD)", fields[0], fields[1])
	}
	if day.Sub(now) > maxAllowAhead {
		return allowEntry{}, fmt.Errorf("%s: expiry %s is more than a year ahead", fields[0], fields[1])
	}
	return allowEntry{ID: fields[0], Expires: day, Reason: strings.Join(fields[2:], " "), Line: n}, nil
}
