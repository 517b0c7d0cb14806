package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/hubsync/hubsync/bus"
	"github.com/hubsync/hubsync/config"
	"sigs.k8s.io/yaml"
)

func checkConfigCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("check-config", flag.ContinueOnError)
	fs.SetOutput(stderr)
	show := fs.Bool("print", false, "print the configuration with every default filled in")
	connect := fs.Bool("connect", false, "also sign in to the external NATS of bus.urls and check its accounts (hubsync bus-accounts)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: hubsync check-config [--print] [--connect] FILE")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	cfg, err := loadConfigArg(fs)
	if err != nil {
		return err
	}
	for _, w := range cfg.Warnings() {
		fmt.Fprintf(stderr, "%s: warning: %s\n", fs.Arg(0), w)
	}
	if *show {
		out, err := yaml.Marshal(cfg)
		if err != nil {
			return fmt.Errorf("print config: %w", err)
		}
		_, _ = stdout.Write(out)
		return nil
	}
	if *connect {
		if err := checkBus(ctx, cfg.Bus, stdout); err != nil {
			return fmt.Errorf("%s: %w", fs.Arg(0), err)
		}
	}
	fmt.Fprintf(stdout, "%s: ok\n", fs.Arg(0))
	return nil
}

// checkBus checks the accounts of an external NATS, one line each.
func checkBus(ctx context.Context, cfg config.Bus, stdout io.Writer) error {
	if len(cfg.URLs) == 0 {
		return errors.New("--connect checks an external NATS (bus.urls); the embedded server makes its accounts itself")
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	findings := bus.VerifyExternal(ctx, cfg)
	for _, f := range findings {
		if f.Err != nil {
			fmt.Fprintf(stdout, "FAIL %s: %v\n", f.What, f.Err)
		} else {
			fmt.Fprintf(stdout, "ok   %s\n", f.What)
		}
	}
	if err := bus.FindingsErr(findings); err != nil {
		return errors.New("the external NATS does not hold the bus's accounts (see above; hubsync bus-accounts prints them)")
	}
	return nil
}

// loadConfigArg loads the configuration file that is fs's one argument,
// after its flags were parsed.
func loadConfigArg(fs *flag.FlagSet) (*config.Config, error) {
	if fs.NArg() != 1 {
		fs.Usage()
		return nil, errUsage
	}
	cfg, err := config.Load(fs.Arg(0))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", fs.Arg(0), err)
	}
	return cfg, nil
}
