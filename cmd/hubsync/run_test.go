package main

import (
	"context"
	"errors"
	"io"
	"testing"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/daemon"
)

// TestRunCommand runs `hubsync run` with a stand-in for the daemon: the
// flags win over the file, at the start and (through Override) at every
// reload, and the daemon learns where its configuration came from.
func TestRunCommand(t *testing.T) {
	dir := t.TempDir()
	fromFile, fromFlag := writeFile(t, dir, "file.kubeconfig", ""), writeFile(t, dir, "flag.kubeconfig", "")
	file := writeFile(t, dir, "hubsync.yaml", "hub: {kubeconfig: "+fromFile+", qps: 7}\n")
	for _, tc := range []struct {
		name           string
		args           []string
		wantKubeconfig string
		wantPath       string
	}{
		{name: "the file", args: []string{"--config", file}, wantKubeconfig: fromFile, wantPath: file},
		{name: "the flag over the file", args: []string{"--config", file, "--kubeconfig", fromFlag}, wantKubeconfig: fromFlag, wantPath: file},
		{name: "no file", args: []string{"--kubeconfig", fromFlag}, wantKubeconfig: fromFlag},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stop := errors.New("the stand-in ran")
			var got *config.Config
			var opts daemon.Options
			err := runCommand(context.Background(), tc.args, io.Discard, func(_ context.Context, cfg *config.Config, o daemon.Options) error {
				got, opts = cfg, o
				return stop
			})
			if !errors.Is(err, stop) {
				t.Fatalf("runCommand = %v, want the daemon's error", err)
			}
			if got.Hub.Kubeconfig != tc.wantKubeconfig || opts.ConfigPath != tc.wantPath || opts.Log == nil || opts.Version == "" {
				t.Errorf("daemon ran with kubeconfig %q, options %+v; want kubeconfig %q, config path %q, a logger and a version",
					got.Hub.Kubeconfig, opts, tc.wantKubeconfig, tc.wantPath)
			}
			reloaded := config.Default()
			reloaded.Hub.Kubeconfig = fromFile
			opts.Override(reloaded)
			if reloaded.Hub.Kubeconfig != tc.wantKubeconfig {
				t.Errorf("a reloaded configuration gets kubeconfig %q, want %q", reloaded.Hub.Kubeconfig, tc.wantKubeconfig)
			}
		})
	}
}
