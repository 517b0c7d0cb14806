package main

import (
	"strings"
	"testing"
	"time"
)

func TestParseAllowList(t *testing.T) {
	now := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name    string
		in      string
		ids     []string
		wantErr string
	}{
		{"empty", "", nil, ""},
		{"comments and blank lines", "# header\n\n   # indented\n", nil, ""},
		{"one entry", "GO-2026-4533 2027-01-31 the fix breaks the bus; tracked upstream\n", []string{"GO-2026-4533"}, ""},
		{"trailing comment", "GO-2026-4533 2027-01-31 reason # note\n", []string{"GO-2026-4533"}, ""},
		{"no reason", "GO-2026-4533 2027-01-31\n", nil, "needs an expiry date (YYYY-MM-DD) and a reason"},
		{"no date", "GO-2026-4533\n", nil, "needs an expiry date"},
		{"bad date", "GO-2026-4533 31/01/2027 reason\n", nil, `expiry "31/01/2027" is not a date`},
		{"not an id", "CVE-2026-1234 2027-01-31 reason\n", nil, `"CVE-2026-1234" is not a Go vulnerability id`},
		{"more than a year ahead", "GO-2026-4533 2028-01-01 reason\n", nil, "more than a year ahead"},
		{"listed twice", "GO-2026-4533 2027-01-31 a\nGO-2026-4533 2027-02-28 b\n", nil, "listed again (first on line 1)"},
		{"every bad line reported", "x 1 2\ny 3 4\n", nil, "allow.txt:2:"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseAllowList(strings.NewReader(tt.in), "allow.txt", now)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tt.ids) {
				t.Fatalf("%d entries, want %v", len(got), tt.ids)
			}
			for _, id := range tt.ids {
				if got[id].Reason == "" {
					t.Errorf("%s has no reason: %+v", id, got[id])
				}
			}
		})
	}
}

func TestJudge(t *testing.T) {
	now := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	res := scanResult{Vulns: []vuln{
		{ID: "GO-2026-0001", Level: called},
		{ID: "GO-2026-0002", Level: imported},
		{ID: "GO-2026-0003", Level: called},
	}}
	day := func(s string) time.Time { d, _ := time.Parse(time.DateOnly, s); return d }
	tests := []struct {
		name                    string
		allow                   map[string]allowEntry
		refused, allowed, stale int
	}{
		{"nothing accepted", nil, 2, 0, 0},
		{"both accepted", map[string]allowEntry{"GO-2026-0001": {Expires: day("2026-12-01")}, "GO-2026-0003": {Expires: day("2026-12-01")}}, 0, 2, 0},
		{"expires today", map[string]allowEntry{"GO-2026-0001": {Expires: day("2026-11-28")}}, 2, 0, 0},
		{"an imported one accepts nothing", map[string]allowEntry{"GO-2026-0002": {Expires: day("2026-12-01")}}, 2, 0, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := judge(res, tt.allow, now)
			if len(v.Refused) != tt.refused || len(v.Allowed) != tt.allowed || len(v.Stale) != tt.stale {
				t.Fatalf("refused %d allowed %d stale %d, want %d %d %d", len(v.Refused), len(v.Allowed), len(v.Stale), tt.refused, tt.allowed, tt.stale)
			}
			if v.Pass() != (tt.refused == 0) {
				t.Fatalf("Pass() = %v with %d refused", v.Pass(), tt.refused)
			}
		})
	}
}
