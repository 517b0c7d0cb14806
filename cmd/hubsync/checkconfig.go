package main

import (
	"flag"
	"fmt"
	"io"

	"github.com/hubsync/hubsync/config"
	"sigs.k8s.io/yaml"
)

func checkConfigCommand(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("check-config", flag.ContinueOnError)
	fs.SetOutput(stderr)
	show := fs.Bool("print", false, "print the configuration with every default filled in")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: hubsync check-config [--print] FILE")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return errUsage
	}
	cfg, err := config.Load(fs.Arg(0))
	if err != nil {
		return fmt.Errorf("%s: %w", fs.Arg(0), err)
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
	fmt.Fprintf(stdout, "%s: ok\n", fs.Arg(0))
	return nil
}
