package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"strings"
	"time"

	"golang.org/x/vuln/scan"
)

// check runs the gate: read the allow-list, scan, judge, print.
func check(ctx context.Context, o options, allowFile string, patterns []string, w io.Writer) (int, error) {
	now := time.Now().UTC()
	allow, err := readAllowList(allowFile, now) // before a scan of minutes
	if err != nil {
		return 2, err
	}
	db, err := ensureDB(ctx, o.toolDir, o.cacheRoot)
	if err != nil {
		return 2, err
	}
	res, err := govulncheck(ctx, db, o.dir, "symbol", patterns)
	if err != nil {
		return 2, err
	}
	target := strings.Join(patterns, " ")
	if flags := os.Getenv("GOFLAGS"); flags != "" {
		target += " (GOFLAGS=" + flags + ")"
	}
	return gate(res, allow, allowFile, now, target, w)
}

// gate judges a scan against the allow-list read from allowFile and prints
// the verdict; it answers 1 when a reachable vulnerability is not accepted.
func gate(res scanResult, allow map[string]allowEntry, allowFile string, now time.Time, target string, w io.Writer) (int, error) {
	v := judge(res, allow, now)
	v.print(w, res, allow, target)
	if !v.Pass() {
		return 1, fmt.Errorf("%d reachable vulnerabilities: move to a fixed version, or accept each in %s with an expiry date and a reason", len(v.Refused), allowFile)
	}
	return 0, nil
}

func readAllowList(name string, now time.Time) (map[string]allowEntry, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, fmt.Errorf("open the allow-list: %w", err)
	}
	defer f.Close()
	return parseAllowList(f, name, now)
}

// govulncheck scans the packages of the module in dir at the given level
// (symbol or module) against the offline database in db.
func govulncheck(ctx context.Context, db, dir, level string, patterns []string) (scanResult, error) {
	args := append([]string{"-db", "file://" + db, "-format", "json", "-scan", level, "-C", dir}, patterns...)
	var stdout, stderr bytes.Buffer
	cmd := scan.Command(ctx, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		return scanResult{}, fmt.Errorf("start govulncheck: %w", err)
	}
	if err := cmd.Wait(); err != nil {
		return scanResult{}, fmt.Errorf("govulncheck %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	res, err := readFindings(&stdout)
	res.Scanner = "govulncheck " + vulnVersion()
	return res, err
}

// vulnVersion is the version of golang.org/x/vuln built into this command
// (the scan package reports none when it is not the main module).
func vulnVersion() string {
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, d := range info.Deps {
			if d.Path == "golang.org/x/vuln" {
				return d.Version
			}
		}
	}
	return "(unknown version)"
}
