package main

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/sinks"
	"github.com/hubsync/hubsync/stream"
	"github.com/hubsync/hubsync/test/fleet"
)

// nopSink is a sink that takes everything.
type nopSink struct{}

func (nopSink) Deliver(context.Context, []stream.Change) error { return nil }
func (nopSink) Resync(context.Context, []stream.Change) error  { return nil }
func (nopSink) Close() error                                   { return nil }

func TestReloader(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "hubsync.yaml")
	secrets := filepath.Join(dir, "secrets")
	if err := os.WriteFile(secrets, []byte("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	doc := func(extra string) []byte {
		return []byte("sinks:\n- {name: hooks, type: webhook, webhook: {url: 'https://hooks.example', secretsFile: " + secrets + "}}\n" + extra)
	}
	if err := os.WriteFile(path, doc(""), 0o600); err != nil {
		t.Fatal(err)
	}
	running, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	fan, err := stream.NewFanout(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	logs := &fleet.LogBuffer{}
	manager := sinks.NewManager(fan, sinks.Deps{Log: slog.New(slog.DiscardHandler)}, map[string]sinks.Factory{
		config.SinkWebhook: func(config.Sink, sinks.Deps) (sinks.Sink, error) { return nopSink{}, nil },
	})
	if _, err := manager.Apply(running.Sinks); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	r := newReloader(path, running, nil, manager, slog.New(slog.NewTextHandler(logs, nil)), reg)
	r.interval = time.Hour // only the watch and SIGHUP
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.run(ctx) }()
	t.Cleanup(func() { cancel(); <-done; _ = manager.Close() })
	eventually := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s; log:\n%s", what, logs.String())
			}
			time.Sleep(10 * time.Millisecond) // polling interval
		}
	}
	reloads := func(result string) float64 { return testutil.ToFloat64(r.reloads.WithLabelValues(result)) }

	// SIGHUP reloads even an unchanged file. The test holds a handler of
	// its own, so a signal sent before the reloader's is in place cannot
	// end the test binary; it is sent until the reloader has seen one.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	eventually("a reload on SIGHUP", func() bool {
		if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		return reloads("unchanged") >= 1
	})

	// A field that needs a restart is reported; the sinks still apply.
	if err := os.WriteFile(path, doc("hub: {qps: 7, burst: 14}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	eventually("restart required", func() bool { return testutil.ToFloat64(r.restart) == 1 })
	if v := testutil.ToFloat64(r.successful); v != 1 {
		t.Errorf("last reload successful = %v, want 1", v)
	}

	// A broken file is rejected, and the sinks stay.
	if err := os.WriteFile(path, []byte("sinks:\n- {name: '', type: kafka}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	eventually("the rejection", func() bool { return reloads("rejected") == 1 })
	if v := testutil.ToFloat64(r.successful); v != 0 {
		t.Errorf("last reload successful = %v, want 0", v)
	}
	if names := manager.Names(); len(names) != 1 || names[0] != "hooks" {
		t.Errorf("running sinks %v after a rejected reload", names)
	}
	for _, want := range []string{"sinks[0].name", "sinks[0].type", "the running configuration stays", "fields=hub"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log lacks %q", want)
		}
	}
}
