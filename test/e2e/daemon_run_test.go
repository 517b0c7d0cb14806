package e2e

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/daemon"
	"github.com/hubsync/hubsync/test/fleet"
	"github.com/hubsync/hubsync/test/testutil"
)

// TestDaemonRunInProcess runs daemon.Run in the test's own process, as
// `hubsync run` does, with leader election, the health server, the
// embedded bus and configuration reloads: it converges a profile and
// reports ready, and once its context is cancelled it returns nil, having
// released the lease and stopped every goroutine it started.
func TestDaemonRunInProcess(t *testing.T) {
	h := newHarnessWithoutSyncer(t)
	ns := h.namespaces("consumer")[0]
	set := h.name("set")
	h.must(h.hub.CreateExclusiveSet(h.ctx, set))
	h.must(h.hub.Bind(h.ctx, ns, set, true))
	c1 := h.name("c1")
	h.cluster(c1, set, nil)

	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	h.must(fleet.WriteKubeconfig(hubConfig, kubeconfig))
	lease := h.name("lease")
	path := filepath.Join(dir, "hubsync.yaml")
	h.must(os.WriteFile(path, fmt.Appendf(nil, `hub: {kubeconfig: %s}
server: {address: "127.0.0.1:0"}
leaderElection: {enabled: true, namespace: %s, name: %s, leaseDuration: 4s, renewDeadline: 3s, retryPeriod: 500ms}
bus: {embedded: {listen: "127.0.0.1:0", dataDir: %s}}
`, kubeconfig, ns, lease, filepath.Join(dir, "nats")), 0o600))
	cfg, err := config.Load(path)
	h.must(err)

	// What runs now (the test framework, the harness's clients) is not
	// the daemon's.
	before := goroutineIDs()
	logs := &fleet.LogBuffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- daemon.Run(ctx, cfg, daemon.Options{Log: log, ConfigPath: path, Version: "e2e"}) }()

	h.expectProfiles(ns, c1)
	addr := regexp.MustCompile(`msg="serving metrics and health" address=(\S+)`)
	testutil.Eventually(t, 30*time.Second, 25*time.Millisecond, func() error {
		m := addr.FindStringSubmatch(logs.String())
		if m == nil {
			return fmt.Errorf("no health server address logged yet")
		}
		resp, err := http.Get("http://" + m[1] + "/readyz")
		if err != nil {
			return err
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/readyz: %s", resp.Status)
		}
		return nil
	}, "the daemon ready; log:\n%s", logs)

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run = %v after its context ended, want nil; log:\n%s", err, logs)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("Run did not return after its context ended; log:\n%s", logs)
	}
	// Checked at once, not polled: Run waits for the goroutines it
	// started, so none that runs hubsync's code may still be ending.
	var ours []string
	for _, g := range goroutinesSince(before) {
		if strings.Contains(g, "github.com/hubsync/hubsync/") {
			ours = append(ours, g)
		}
	}
	if len(ours) > 0 {
		t.Errorf("%d goroutines of hubsync still run after Run returned:\n\n%s", len(ours), strings.Join(ours, "\n\n"))
	}
	// Libraries may end their own goroutines a moment later (nats-server
	// closes a connection's on a goroutine it does not wait for), but end
	// them they must.
	testutil.Eventually(t, 10*time.Second, 50*time.Millisecond, func() error {
		if left := goroutinesSince(before); len(left) > 0 {
			return fmt.Errorf("%d goroutines started during Run still run:\n\n%s", len(left), strings.Join(left, "\n\n"))
		}
		return nil
	}, "goroutines left by Run")
	l, err := h.hub.Kube.CoordinationV1().Leases(ns).Get(h.ctx, lease, metav1.GetOptions{})
	h.must(err)
	if id := l.Spec.HolderIdentity; id != nil && *id != "" {
		t.Errorf("the lease is still held by %s after Run returned", *id)
	}
}

// notOwned are functions of goroutines a run may leave that are not the
// daemon's: idle keep-alive connections of client-go's shared transports
// (the transport cache owns them), and the process's signal loop, which
// the first signal.Notify starts.
var notOwned = []string{
	"net/http.(*persistConn).readLoop",
	"net/http.(*persistConn).writeLoop",
	"net/http.(*http2ClientConn).readLoop",
	"golang.org/x/net/http2.(*ClientConn).readLoop",
	"os/signal.loop",
}

// goroutines returns the stacks of every goroutine, by id.
func goroutines() map[string]string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	out := map[string]string{}
	for _, g := range strings.Split(string(buf), "\n\n") {
		if id, _, ok := strings.Cut(strings.TrimPrefix(g, "goroutine "), " "); ok {
			out[id] = g
		}
	}
	return out
}

func goroutineIDs() map[string]bool {
	ids := map[string]bool{}
	for id := range goroutines() {
		ids[id] = true
	}
	return ids
}

// goroutinesSince returns the stacks of the goroutines that were not
// running at before, but those in notOwned.
func goroutinesSince(before map[string]bool) []string {
	var left []string
	for id, stack := range goroutines() {
		if before[id] || slices.ContainsFunc(notOwned, func(f string) bool { return strings.Contains(stack, f+"(") }) {
			continue
		}
		left = append(left, stack)
	}
	return left
}
