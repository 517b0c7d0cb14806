package main

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestGateRefusesAVulnerablePin scans a program that pins nats-server
// v2.12.1 with the real govulncheck and database, once: the gate refuses
// the scan, and lets it through once the allow-list accepts each
// vulnerability it calls, but not with an entry that has expired or one
// missing.
func TestGateRefusesAVulnerablePin(t *testing.T) {
	const fixture = "testdata/natsold"
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	o := options{dir: fixture, cacheRoot: defaultCache(), toolDir: wd}
	db, err := ensureDB(t.Context(), o.toolDir, o.cacheRoot)
	if err != nil {
		t.Fatal(err)
	}
	res, err := govulncheck(t.Context(), db, fixture, "symbol", []string{"."})
	if err != nil {
		t.Fatal(err)
	}
	ids := calledIDs(res)
	if !slices.Contains(ids, "GO-2026-4533") {
		t.Fatalf("the scan of nats-server v2.12.1 does not report GO-2026-4533 as called; called: %v", ids)
	}
	now := time.Now().UTC()
	later, earlier := now.AddDate(0, 1, 0), now.AddDate(0, 0, -1)
	tests := []struct {
		name  string
		allow string
		exit  int
		want  string
	}{
		{"no allow-list", "", 1, "REFUSED GO-2026-4533 (not in the allow-list)"},
		{"each called id accepted", allowLines(ids, later), 0, "0 reachable vulnerabilities refused, " + strconv.Itoa(len(ids)) + " accepted"},
		{"one entry expired", allowLines(ids[:1], earlier) + allowLines(ids[1:], later), 1, "expired on " + earlier.Format(time.DateOnly)},
		{"one id left out", allowLines(ids[1:], later), 1, "REFUSED " + ids[0] + " (not in the allow-list)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "allow.txt")
			if err := os.WriteFile(file, []byte(tt.allow), 0o644); err != nil {
				t.Fatal(err)
			}
			allow, err := readAllowList(file, now)
			if err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			exit, err := gate(res, allow, file, now, fixture, &out)
			if exit != tt.exit {
				t.Fatalf("exit %d (error %v), want %d; output:\n%s", exit, err, tt.exit, out.String())
			}
			if !strings.Contains(out.String(), tt.want) {
				t.Fatalf("output lacks %q:\n%s", tt.want, out.String())
			}
		})
	}
}

func calledIDs(res scanResult) []string {
	var ids []string
	for _, v := range res.Vulns {
		if v.Level == called {
			ids = append(ids, v.ID)
		}
	}
	return ids
}

func allowLines(ids []string, until time.Time) string {
	var b strings.Builder
	for _, id := range ids {
		b.WriteString(id + " " + until.Format(time.DateOnly) + " accepted by the test\n")
	}
	return b.String()
}
