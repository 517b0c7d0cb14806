package e2e

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/daemon"
	"github.com/hubsync/hubsync/test/controlplane"
	"github.com/hubsync/hubsync/test/fleet"
	"github.com/hubsync/hubsync/test/testutil"
)

// Paths of the resources the daemon watches.
const (
	pathClusters   = "/apis/cluster.open-cluster-management.io/v1/managedclusters"
	pathSets       = "/apis/cluster.open-cluster-management.io/v1beta2/managedclustersets"
	pathBindings   = "/apis/cluster.open-cluster-management.io/v1beta2/managedclustersetbindings"
	pathProfiles   = "/apis/multicluster.x-k8s.io/v1alpha1/clusterprofiles"
	pathNamespaces = "/api/v1/namespaces"
	pathMSAs       = "/apis/authentication.open-cluster-management.io/v1beta1/managedserviceaccounts"
	pathSecrets    = "/api/v1/secrets"
)

// TestEachResourceIsWatchedOnce counts, in the hub's own audit log, the
// watches two in-process replicas open. The leader watches each resource
// once, whichever parts read it (the syncer and the tunnel pool share
// ManagedClusters, ClusterProfiles and token Secrets), and Secrets only by
// a selector. The standby watches only what the pool reads. When the
// leader stops, the standby takes over with the informers it already runs
// (no second watch of them) and adds only the syncer's own, and converges.
func TestEachResourceIsWatchedOnce(t *testing.T) {
	h := newHarnessWithoutSyncer(t)
	ns, caNS := h.namespaces("consumer")[0], h.namespaces("addon")[0]
	set := h.name("set")
	h.must(h.hub.CreateExclusiveSet(h.ctx, set))
	h.must(h.hub.Bind(h.ctx, ns, set, true))
	c1 := h.name("c1")
	h.cluster(c1, set, nil)
	for _, msa := range []struct {
		name string
		sync bool
	}{{"app", true}, {"gw", false}} {
		_, err := h.hub.CreateMSA(h.ctx, c1, msa.name, msa.sync)
		h.must(err)
		h.must(h.hub.PutToken(h.ctx, c1, msa.name, "token-"+msa.name+"-"+h.prefix, nil))
	}
	h.must(h.hub.PutSecret(h.ctx, caNS, "proxy-ca", map[string][]byte{"ca.crt": []byte("-----BEGIN CERTIFICATE-----\nTEST\n-----END CERTIFICATE-----\n")}))

	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	h.must(fleet.WriteKubeconfig(hubConfig, kubeconfig))
	path := filepath.Join(dir, "hubsync.yaml")
	h.must(os.WriteFile(path, fmt.Appendf(nil, `hub: {kubeconfig: %s}
server: {address: "127.0.0.1:0"}
bus: {enabled: false}
leaderElection: {enabled: true, namespace: %s, name: %s, leaseDuration: 4s, renewDeadline: 3s, retryPeriod: 500ms}
tunnel: {enabled: true, transport: direct, managedServiceAccount: gw}
accessProviders:
- {name: proxy, type: server, server: "https://proxy.example/{{.ClusterName}}", caSecret: {namespace: %s, name: proxy-ca, key: ca.crt}}
`, kubeconfig, ns, h.name("lease"), caNS), 0o600))
	cfg, err := config.Load(path)
	h.must(err)

	// Each replica is known in the audit log by its user agent.
	start := func(who string) (agent string, stop func()) {
		version := "watch-" + who + "-" + h.prefix
		logs := &fleet.LogBuffer{}
		log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- daemon.Run(ctx, cfg, daemon.Options{Log: log, ConfigPath: path, Version: version}) }()
		var once sync.Once
		stop = func() { once.Do(func() { stopRun(t, who, cancel, done, logs) }) }
		t.Cleanup(stop)
		return "hubsync/" + version, stop
	}
	watches := func(agent string) []controlplane.Watch {
		t.Helper()
		ws, err := hubPlane.Watches(agent)
		h.must(err)
		return ws
	}
	poolPaths := []string{pathClusters, pathProfiles, pathSecrets}
	leaderPaths := []string{pathBindings, pathClusters, pathMSAs, pathSets, pathNamespaces, pathProfiles, pathSecrets}
	slices.Sort(leaderPaths)
	slices.Sort(poolPaths)

	leader, stopLeader := start("a")
	h.expectProfiles(ns, c1)
	awaitWatching(t, watches, leader, leaderPaths)
	standby, _ := start("b")
	awaitWatching(t, watches, standby, poolPaths)
	for _, r := range []struct {
		agent string
		paths []string
	}{{leader, leaderPaths}, {standby, poolPaths}} {
		ws := watches(r.agent)
		if err := watchedOnce(ws); err != nil {
			t.Errorf("%s: %v", r.agent, err)
		}
		if got := openPaths(ws); !slices.Equal(got, r.paths) {
			t.Errorf("%s watches %v; want %v", r.agent, got, r.paths)
		}
	}

	// The leader goes; the standby takes over with the informers it runs.
	stopLeader()
	awaitWatching(t, watches, standby, leaderPaths)
	ws := watches(standby)
	if err := watchedOnce(ws); err != nil {
		t.Errorf("%s after taking over: %v", standby, err)
	}
	for _, p := range []string{pathClusters, pathProfiles} {
		if n := countPath(ws, p); n != 1 {
			t.Errorf("%s watched %s %d times, taking over included; want once", standby, p, n)
		}
	}
	c2 := h.name("c2")
	h.cluster(c2, set, nil)
	h.expectProfiles(ns, c1, c2)
}

// stopRun cancels a replica's Run and waits for it to return nil.
func stopRun(t *testing.T, who string, cancel func(), done <-chan error, logs *fleet.LogBuffer) {
	t.Helper()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("replica %s: Run = %v", who, err)
		}
	case <-time.After(30 * time.Second):
		t.Errorf("replica %s: Run did not return; log:\n%s", who, logs)
	}
}

// awaitWatching waits until agent's open watches cover paths exactly.
func awaitWatching(t *testing.T, watches func(string) []controlplane.Watch, agent string, paths []string) {
	t.Helper()
	testutil.Eventually(t, 60*time.Second, 50*time.Millisecond, func() error {
		if got := openPaths(watches(agent)); !slices.Equal(got, paths) {
			return fmt.Errorf("open watches of %v", got)
		}
		return nil
	}, "%s watching %v", agent, paths)
}

// watchedOnce checks that no resource has two open watches (Secrets: no
// selector has two), and that Secrets are watched only by a selector.
func watchedOnce(ws []controlplane.Watch) error {
	open := map[string]int{}
	for _, w := range ws {
		if !w.Open {
			continue
		}
		p, query, _ := strings.Cut(w.Resource, "?")
		key := p
		if strings.HasSuffix(p, "/secrets") {
			if query == "" {
				return fmt.Errorf("Secrets watched without a selector: %s", w.Resource)
			}
			key = w.Resource
		}
		open[key]++
	}
	var twice []string
	for k, n := range open {
		if n > 1 {
			twice = append(twice, fmt.Sprintf("%s (%d)", k, n))
		}
	}
	if len(twice) > 0 {
		slices.Sort(twice)
		return fmt.Errorf("watched more than once: %s", strings.Join(twice, ", "))
	}
	return nil
}

// openPaths lists the resource paths of the open watches, namespaced
// Secrets as the Secrets path, sorted and without repeats.
func openPaths(ws []controlplane.Watch) []string {
	var out []string
	for _, w := range ws {
		if !w.Open {
			continue
		}
		p, _, _ := strings.Cut(w.Resource, "?")
		if strings.HasSuffix(p, "/secrets") {
			p = pathSecrets
		}
		out = append(out, p)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// countPath counts the watches of a path ever opened.
func countPath(ws []controlplane.Watch, path string) int {
	n := 0
	for _, w := range ws {
		if p, _, _ := strings.Cut(w.Resource, "?"); p == path {
			n++
		}
	}
	return n
}
