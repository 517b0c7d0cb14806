// Command manifests writes deploy/ from charts/hubsync: the chart rendered
// with its default values (and with the gateway on and credentials off for
// deploy/gateway/ and deploy/without-credentials/), release hubsync in
// open-cluster-management-hub. `make manifests` runs it.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/hubsync/hubsync/test/chart"
	"github.com/hubsync/hubsync/test/testutil"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "manifests: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	root, err := testutil.ModuleDir()
	if err != nil {
		return err
	}
	out := flag.String("deploy", filepath.Join(root, "deploy"), "the directory to write the manifests into")
	flag.Parse()
	ch, err := chart.LoadCheckout()
	if err != nil {
		return err
	}
	files, err := chart.Manifests(ch)
	if err != nil {
		return err
	}
	for _, name := range chart.ManifestPaths() {
		path := filepath.Join(*out, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(path, files[name], 0o644); err != nil {
			return fmt.Errorf("write %s: %w", path, err)
		}
	}
	return nil
}
