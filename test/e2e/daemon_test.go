package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/test/fleet"
	"github.com/hubsync/hubsync/test/testutil"
)

// TestDaemonLeaderElection runs the real binary twice with leader election:
// one replica works, the other stands by, and takes over when the first
// stops, converging the changes made meanwhile.
func TestDaemonLeaderElection(t *testing.T) {
	h := newHarnessWithoutSyncer(t)
	bin := testutil.Hubsync(t)
	h.must(h.hub.Namespace(h.ctx, "open-cluster-management-hub"))
	ns := h.namespaces("consumer")[0]
	set := h.name("set")
	h.must(h.hub.CreateExclusiveSet(h.ctx, set))
	h.must(h.hub.Bind(h.ctx, ns, set, true))
	a := h.name("a")
	h.cluster(a, set, nil)

	conf := config.Config{}
	conf.LeaderElection.Enabled = true
	conf.LeaderElection.Name = h.name("lease")
	// Short timings keep the hand-over quick in a test.
	conf.LeaderElection.LeaseDuration.Duration = 4 * time.Second
	conf.LeaderElection.RenewDeadline.Duration = 3 * time.Second
	conf.LeaderElection.RetryPeriod.Duration = 500 * time.Millisecond
	var logs1, logs2 fleet.LogBuffer
	d1, err := fleet.StartDaemon(h.ctx, bin, hubConfig, conf, &logs1)
	h.must(err)
	if err := d1.WaitReady(h.ctx, 30*time.Second); err != nil {
		t.Fatalf("%v\n%s", err, logs1.String())
	}
	h.expectProfiles(ns, a)
	metrics, err := d1.Scrape()
	h.must(err)
	if got := metrics.Value("hubsync_profile_writes_total", testutil.Labels{"op": "create"}); got != 1 {
		t.Errorf(`hubsync_profile_writes_total{op="create"} = %v, want 1`, got)
	}
	for _, want := range []string{"hubsync_queue_depth", "go_goroutines", "go_gc_heap_live_bytes", "process_resident_memory_bytes"} {
		if !metrics.Has(want, nil) {
			t.Errorf("metrics lack %q", want)
		}
	}
	// hubsync's GC target, unless the environment sets one.
	if _, set := os.LookupEnv("GOGC"); !set {
		if got := metrics.Value("go_gc_gogc_percent", nil); got != 50 {
			t.Errorf("go_gc_gogc_percent = %v, want hubsync's 50", got)
		}
	}

	d2, err := fleet.StartDaemon(h.ctx, bin, hubConfig, conf, &logs2)
	h.must(err)
	defer d2.Stop()
	// A standby is ready (so rolling updates proceed) but does not lead.
	if err := d2.WaitReady(h.ctx, 30*time.Second); err != nil {
		t.Fatalf("standby not ready: %v\n%s", err, logs2.String())
	}
	h.eventually("the standby sees the lease held", func() error {
		if !strings.Contains(logs2.String(), "another replica leads; standing by") {
			return fmt.Errorf("not yet")
		}
		return nil
	})
	if !d1.Leading() || d2.Leading() {
		t.Fatalf("leader flags: first %v, second %v; want only the first", d1.Leading(), d2.Leading())
	}

	if err := d1.Stop(); err != nil {
		t.Fatalf("leader did not stop cleanly on SIGTERM: %v\n%s", err, logs1.String())
	}
	b := h.name("b")
	h.cluster(b, set, nil)
	h.eventually("standby takes over", func() error {
		if !d2.Leading() {
			return fmt.Errorf("not leading yet")
		}
		return nil
	})
	h.expectProfiles(ns, a, b)
	for i, l := range []string{logs1.String(), logs2.String()} {
		if !strings.Contains(l, "became leader") {
			t.Errorf("replica %d never logged leadership:\n%s", i+1, l)
		}
		if strings.Contains(l, "level=ERROR") {
			t.Errorf("replica %d logged errors:\n%s", i+1, l)
		}
	}
}

// TestCheckConfigBinary runs the built binary's check-config on bad input.
func TestCheckConfigBinary(t *testing.T) {
	bin := testutil.Hubsync(t)
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	h := &harness{t: t}
	h.must(writeFile(bad, "hub:\n  qps: -3\nworkers:\n  topology: -2\nlogging:\n  format: xml\n"))
	var out bytes.Buffer
	cmd := exec.Command(bin, "check-config", bad)
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if code := cmd.ProcessState.ExitCode(); err == nil || code != 1 {
		t.Fatalf("exit code %d, want 1: %s", code, out.String())
	}
	for _, want := range []string{"3 problems", "hub.qps", "workers.topology", "logging.format"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

// newHarnessWithoutSyncer gives a test the harness's fleet helpers and
// clean-up without an in-process syncer, for tests that run the binary.
func newHarnessWithoutSyncer(t *testing.T) *harness {
	t.Helper()
	hub, err := fleet.NewHub(hubConfig)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h := &harness{t: t, ctx: ctx, hub: hub, prefix: fmt.Sprintf("t%d", testSeq.Add(1))}
	t.Cleanup(func() {
		cancel()
		h.cleanup()
	})
	return h
}

func writeFile(path, content string) error { return os.WriteFile(path, []byte(content), 0o600) }
