package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/status"
)

// defaultStatusAddress is the daemon's default server address, on this
// host: where `kubectl port-forward pod/<pod> 8080` puts a pod's.
func defaultStatusAddress() string {
	_, port, err := net.SplitHostPort(config.DefaultServerAddress)
	if err != nil {
		return "localhost:8080"
	}
	return net.JoinHostPort("localhost", port)
}

// statusCommand reads a daemon's /metrics and /readyz?verbose and prints
// what they say (package status).
func statusCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	address := fs.String("address", defaultStatusAddress(), "the daemon's health and metrics server (its server.address): host:port or a URL")
	output := fs.String("o", "text", "output format: text or json")
	interval := fs.Duration("interval", 0, "read the metrics twice this far apart and report the gateway's rates (0: read once)")
	timeout := fs.Duration("timeout", 10*time.Second, "bound on each request to the daemon")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 || (*output != "text" && *output != "json") || *interval < 0 {
		fmt.Fprintln(stderr, "usage: hubsync status [--address HOST:PORT] [-o text|json] [--interval 10s]")
		return errUsage
	}
	base := status.BaseURL(*address)
	client := &http.Client{Timeout: *timeout}
	first, err := status.Read(ctx, client, base)
	if err != nil {
		return err
	}
	cur, prev := first, (*status.Scrape)(nil)
	if *interval > 0 {
		t := time.NewTimer(*interval)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		if cur, err = status.Read(ctx, client, base); err != nil {
			return err
		}
		prev = first
	}
	st := status.Summarize(base, cur, prev)
	if *output == "json" {
		return status.WriteJSON(stdout, st)
	}
	return status.WriteText(stdout, st)
}
