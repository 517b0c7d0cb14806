// Command vulncheck is hubsync's vulnerability gate and dependency report.
//
//	vulncheck check [-C dir] [-allow file] [packages]
//
// scans the packages (default ./cmd/hubsync, the shipped binary) with
// govulncheck against an offline copy of the Go vulnerability database, as
// pinned by this module's go.mod, and exits 1 when the scanned code calls a
// vulnerable function that the allow-list does not accept.
//
//	vulncheck deps [-C dir]
//
// prints each direct dependency of the module in dir beside the newest
// version the module proxy serves, and the vulnerabilities known in the
// version used.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code, err := run(ctx, os.Args[1:], os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "vulncheck:", err)
	}
	os.Exit(code)
}

// options are what both subcommands share.
type options struct {
	dir       string // the module to look at
	cacheRoot string // where the database is kept between runs
	toolDir   string // this module's directory
}

func run(ctx context.Context, args []string, stdout io.Writer) (int, error) {
	if len(args) == 0 {
		return 2, errors.New("usage: vulncheck check|deps [flags] [packages]")
	}
	fs := flag.NewFlagSet("vulncheck "+args[0], flag.ContinueOnError)
	var o options
	fs.StringVar(&o.dir, "C", "../../..", "the module to scan")
	fs.StringVar(&o.cacheRoot, "cache", defaultCache(), "where the offline database is kept")
	allowFile := fs.String("allow", "allow.txt", "the allow-list (check only)")
	if err := fs.Parse(args[1:]); err != nil {
		return 2, err
	}
	wd, err := os.Getwd()
	if err != nil {
		return 2, err
	}
	o.toolDir = wd
	switch args[0] {
	case "check":
		patterns := fs.Args()
		if len(patterns) == 0 {
			patterns = []string{"./cmd/hubsync"}
		}
		return check(ctx, o, *allowFile, patterns, stdout)
	case "deps":
		return 0, deps(ctx, o, stdout)
	}
	return 2, fmt.Errorf("unknown subcommand %q: want check or deps", args[0])
}

// defaultCache is where the repository's other built tools are kept
// (${XDG_CACHE_HOME:-~/.cache}/hubsync).
func defaultCache() string {
	dir, err := os.UserCacheDir()
	if err != nil {
		dir = os.TempDir()
	}
	return filepath.Join(dir, "hubsync")
}
