package daemon

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/sinks"
	"github.com/hubsync/hubsync/stream"
	"github.com/hubsync/hubsync/test/fleet"
	"github.com/hubsync/hubsync/test/testutil"
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
	r, manager, logs := startReloader(t, path, running)
	eventually := func(what string, cond func() bool) {
		t.Helper()
		testutil.Eventually(t, 10*time.Second, 10*time.Millisecond, cond, "waiting for %s; log:\n%s", what, logs)
	}
	reloads := func(result string) float64 { return promtest.ToFloat64(r.reloads.WithLabelValues(result)) }

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
	eventually("restart required", func() bool { return promtest.ToFloat64(r.restart) == 1 })
	if v := promtest.ToFloat64(r.successful); v != 1 {
		t.Errorf("last reload successful = %v, want 1", v)
	}

	// A broken file is rejected, and the sinks stay.
	if err := os.WriteFile(path, []byte("sinks:\n- {name: '', type: kafka}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	eventually("the rejection", func() bool { return reloads("rejected") == 1 })
	if v := promtest.ToFloat64(r.successful); v != 0 {
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

// startReloader runs a reloader of the file at path, whose sinks are
// running's, until the test ends. It reloads on the watch and SIGHUP only.
func startReloader(t *testing.T, path string, running *config.Config) (*reloader, *sinks.Manager, *fleet.LogBuffer) {
	t.Helper()
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
	r := newReloader(path, running, nil, manager, slog.New(slog.NewTextHandler(logs, nil)), prometheus.NewRegistry())
	r.interval = time.Hour // only the watch and SIGHUP
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.run(ctx) }()
	t.Cleanup(func() { cancel(); <-done; _ = manager.Close() })
	return r, manager, logs
}

// TestReloaderWatchesOnlyItsFile: in a directory laid out as a ConfigMap
// volume mounts one, a swap of ..data reloads the file, and so does a new
// hubsync.yaml; a file written beside it (a log file, written all the
// time) reloads nothing, even when the content behind the configuration
// changed without any event in the directory.
func TestReloaderWatchesOnlyItsFile(t *testing.T) {
	dir := t.TempDir()
	cm := &fleet.ConfigMapDir{Dir: dir}
	secrets := filepath.Join(t.TempDir(), "secrets")
	if err := os.WriteFile(secrets, []byte("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	doc := func(names ...string) []byte {
		var b strings.Builder
		b.WriteString("sinks:\n")
		for _, n := range names {
			b.WriteString("- {name: " + n + ", type: webhook, webhook: {url: 'https://" + n + ".example', secretsFile: " + secrets + "}}\n")
		}
		return []byte(b.String())
	}
	if err := cm.Write(doc("a")); err != nil {
		t.Fatal(err)
	}
	running, err := config.Load(cm.Path())
	if err != nil {
		t.Fatal(err)
	}
	r, manager, logs := startReloader(t, cm.Path(), running)
	applied := func() float64 { return promtest.ToFloat64(r.reloads.WithLabelValues("applied")) }
	sinksAre := func(want ...string) func() bool {
		return func() bool { return applied() >= 1 && slices.Equal(manager.Names(), want) }
	}

	// A ConfigMap update: ..data points to a new version's directory. It
	// is made again until seen: the first may come before the watch.
	testutil.Eventually(t, 10*time.Second, 200*time.Millisecond, func() bool {
		if applied() == 0 {
			if err := cm.Write(doc("a", "b")); err != nil {
				t.Fatal(err)
			}
		}
		return sinksAre("a", "b")()
	}, "the ..data swap applied; log:\n%s", logs)

	// The content changes behind the ..data link, where no watch sees it.
	version, err := os.Readlink(filepath.Join(dir, "..data"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, version, "hubsync.yaml"), doc("a", "b", "c"), 0o600); err != nil {
		t.Fatal(err)
	}
	// A second of log lines written beside the file, further apart than
	// the 100 ms the watch lets a burst settle: each would have reloaded
	// the configuration had the reloader reacted to it.
	logFile := filepath.Join(dir, "hubsync.log")
	for end := time.Now().Add(time.Second); time.Now().Before(end); {
		f, err := os.OpenFile(logFile, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = f.WriteString("level=INFO msg=something\n")
		_ = f.Close()
		time.Sleep(150 * time.Millisecond) // the pace of the log writer
	}
	if got := applied(); got != 1 || !slices.Equal(manager.Names(), []string{"a", "b"}) {
		t.Fatalf("after writes to another file: %v reloads applied, sinks %v; want 1 and [a b]", got, manager.Names())
	}

	// The file itself replaced in the directory (a new symlink renamed
	// over it) is seen, and brings the change.
	tmp := filepath.Join(dir, "hubsync.yaml.tmp")
	if err := os.Symlink(filepath.Join(version, "hubsync.yaml"), tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, cm.Path()); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, 10*time.Millisecond, sinksAre("a", "b", "c"), "the file's own event applied; log:\n%s", logs)
}

// Every reload result has its series from the start, so that an alert on
// rejected reloads sees 0 before the first reload.
func TestReloadResultsFromStart(t *testing.T) {
	r := newReloader(filepath.Join(t.TempDir(), "hubsync.yaml"), config.Default(), nil, nil, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if n := promtest.CollectAndCount(r.reloads); n != 3 {
		t.Fatalf("hubsync_config_reloads_total has %d series before any reload; want 3", n)
	}
}
