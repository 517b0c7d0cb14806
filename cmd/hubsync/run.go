package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/debug"
	"slices"
	"strings"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/daemon"
)

// runFunc runs the daemon: daemon.Run, or a test's stand-in.
type runFunc func(ctx context.Context, cfg *config.Config, o daemon.Options) error

// runCommand is `hubsync run`: it loads the configuration, applies the
// flags over it, sets up logging and hands both to run.
func runCommand(ctx context.Context, args []string, stderr io.Writer, run runFunc) error {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	configPath := fs.String("config", "", "configuration file (defaults apply when empty)")
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig of the hub; overrides hub.kubeconfig (default: in-cluster)")
	logLevel := fs.String("log-level", "", "log level, overriding logging.level: "+strings.Join(config.LogLevels, ", "))
	logFormat := fs.String("log-format", "", "log format, overriding logging.format: "+strings.Join(config.LogFormats, ", "))
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		fmt.Fprintf(stderr, "hubsync run: unexpected arguments %v\n", fs.Args())
		return errUsage
	}
	for _, f := range []struct {
		name, value string
		allowed     []string
	}{
		{"--log-level", *logLevel, config.LogLevels}, {"--log-format", *logFormat, config.LogFormats},
	} {
		if f.value != "" && !slices.Contains(f.allowed, f.value) {
			fmt.Fprintf(stderr, "hubsync run: %s %q: want one of %s\n", f.name, f.value, strings.Join(f.allowed, ", "))
			return errUsage
		}
	}
	cfg := config.Default()
	if *configPath != "" {
		var err error
		if cfg, err = config.Load(*configPath); err != nil {
			return fmt.Errorf("%s: %w", *configPath, err)
		}
	}
	// The flags win over the file, at the start and at every reload.
	override := func(c *config.Config) {
		if *kubeconfig != "" {
			c.Hub.Kubeconfig = *kubeconfig
		}
		if *logLevel != "" {
			c.Logging.Level = *logLevel
		}
		if *logFormat != "" {
			c.Logging.Format = *logFormat
		}
	}
	override(cfg)
	log := newLogger(cfg.Logging, stderr)
	// client-go logs through klog; send them to the same structured log.
	klog.SetLogger(logr.FromSlogHandler(log.Handler()))
	for _, w := range cfg.Warnings() {
		log.Warn("configuration: " + w)
	}
	if _, set := os.LookupEnv("GOGC"); !set {
		debug.SetGCPercent(gcPercent)
	}
	b := build()
	return run(ctx, cfg, daemon.Options{Log: log, ConfigPath: *configPath, Override: override, Version: b.Version, Commit: b.Commit})
}

// gcPercent is the GC target `hubsync run` sets unless GOGC does. A warm
// replica's heap is mostly long-lived connection state, so Go's default
// (100), which lets the heap grow to twice what is live before it
// collects, holds about as much garbage as state; at 50 a warm entry costs
// about a sixth less RSS, with no CPU at rest that the bench can tell
// apart (docs/operations.md, "Memory").
const gcPercent = 50

func newLogger(c config.Logging, w io.Writer) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(c.Level))
	opts := &slog.HandlerOptions{Level: level}
	if c.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}
