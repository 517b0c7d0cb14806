package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"time"

	clusterv1beta2 "open-cluster-management.io/api/cluster/v1beta2"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/test/controlplane"
	"github.com/hubsync/hubsync/test/fleet"
	"github.com/hubsync/hubsync/test/testutil"
)

// Scale and soak modes (flags).
var (
	scaleMode       bool
	scaleClusters   int
	scaleNamespaces int
	soakDuration    time.Duration
	soakRotations   int
	soakRelabels    int
	heapProfileDir  string
)

const scaleSets = 3

// benchScale measures a large fleet: scaleClusters clusters in three
// exclusive sets, scaleNamespaces namespaces each bound to one set (about
// a third of the fleet each), one synced ManagedServiceAccount per
// cluster. It prints the initial convergence of profiles and copies
// against the raw writes they need, hubsync's peak RSS and CPU time, then,
// with --soak, runs rotations and relabels at a steady rate and prints
// RSS, goroutines and open files every minute with their slopes.
func benchScale(ctx context.Context, cp *controlplane.ControlPlane, binary string, floorWorkers, workers int, logs io.Writer) error {
	hub, err := fleet.NewHub(cp.Config)
	if err != nil {
		return err
	}
	perSet := make([]int, scaleSets)
	for i := range scaleClusters {
		perSet[i%scaleSets]++
	}
	profiles := 0
	for n := range scaleNamespaces {
		profiles += perSet[n%scaleSets]
	}
	copies := profiles // one MSA per cluster: a copy next to each profile
	fmt.Printf("== scale: %d clusters in %d exclusive sets, %d namespaces each bound to one set: %d profiles; one synced ManagedServiceAccount per cluster: %d copies\n",
		scaleClusters, scaleSets, scaleNamespaces, profiles, copies)

	begin := time.Now()
	for i := range scaleSets {
		if err := hub.CreateExclusiveSet(ctx, setName(i)); err != nil {
			return err
		}
	}
	exp := time.Now().Add(24 * time.Hour)
	if err := parallel(scaleClusters, 32, func(i int) error {
		if _, err := hub.CreateCluster(ctx, fleet.ClusterSpec{
			Name:   clusterName(i),
			Labels: fleet.ExclusiveSetLabels(setName(i%scaleSets), nil),
			Claims: map[string]string{"id.k8s.io": clusterName(i)},
		}); err != nil {
			return err
		}
		if _, err := hub.CreateMSA(ctx, clusterName(i), msaName, true); err != nil {
			return err
		}
		return hub.PutToken(ctx, clusterName(i), msaName, fleet.FakeJWT(exp), nil)
	}); err != nil {
		return err
	}
	for n := range scaleNamespaces {
		if err := hub.Namespace(ctx, nsName(n)); err != nil {
			return err
		}
		if err := hub.Bind(ctx, nsName(n), setName(n%scaleSets), true); err != nil {
			return err
		}
	}
	fmt.Printf("fleet built in %s\n", time.Since(begin).Round(time.Second))

	// The floor in the conditions hubsync meets: after the fleet, on the
	// etcd that holds it.
	profileFloor, err := rawWriteFloor(ctx, hub, profiles, floorWorkers)
	if err != nil {
		return err
	}
	copyFloor, _, err := secretFloor(ctx, hub, copies, floorWorkers)
	if err != nil {
		return err
	}
	floor := profileFloor + copyFloor
	fmt.Printf("floor: %d profile writes (create + status) %s, %d Secret creates %s: %s in all (%.0f writes/s)\n",
		2*profiles, profileFloor.Round(time.Millisecond), copies, copyFloor.Round(time.Millisecond), floor.Round(time.Millisecond),
		float64(2*profiles+copies)/floor.Seconds())

	pw, err := newProfileWatcher(ctx, cp, scaleNamespaces)
	if err != nil {
		return err
	}
	defer pw.stop()
	cw, err := newCopyWatcher(ctx, cp, scaleNamespaces)
	if err != nil {
		return err
	}
	defer cw.stop()

	conf := config.Config{}
	conf.Workers.Topology = workers
	conf.Credentials.Workers = workers
	conf.Server.Pprof = heapProfileDir != ""
	start := time.Now()
	cpBefore := controlPlaneCPU()
	d, err := fleet.StartDaemon(ctx, binary, cp.Config, conf, logs)
	if err != nil {
		return err
	}
	defer func() { _ = d.Stop() }()
	readyAt := d.ReadyAt(ctx)
	if err := pw.waitCount(ctx, d.Done(), profiles, 20*time.Minute); err != nil {
		return err
	}
	profilesAt := time.Now()
	if err := cw.waitCount(ctx, d.Done(), copies, 20*time.Minute); err != nil {
		return err
	}
	ready := <-readyAt
	total := time.Since(ready)
	fmt.Printf("initial convergence: %d profiles with full status after %s, all %d copies after %s (from hubsync's caches synced; %s from process start)\n",
		profiles, profilesAt.Sub(ready).Round(time.Millisecond), copies, total.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	fmt.Printf("  ratio to the floor: %.2fx (goal <= 1.5x)\n", total.Seconds()/floor.Seconds())
	// The bus holds its events during the burst, within half its queue,
	// and publishes them after; none may be dropped.
	idle, err := waitSinksIdle(ctx, d, "nats")
	if err != nil {
		return fmt.Errorf("the bus never caught up: %w", err)
	}
	m, err := d.Scrape()
	if err != nil {
		return err
	}
	published := m.Value("hubsync_sink_delivered_total", testutil.Labels{"sink": "nats"})
	dropped := m.Value("hubsync_sink_dropped_total", testutil.Labels{"sink": "nats"})
	fmt.Printf("  events: %.0f changes published, the last %s after convergence; %.0f dropped (goal 0)\n", published, idle.Round(time.Millisecond), dropped)
	cpuUsed, _ := d.CPUTime()
	fmt.Printf("  CPU time: hubsync %s, kube-apiserver + etcd %s\n", cpuUsed.Round(10*time.Millisecond), (controlPlaneCPU() - cpBefore).Round(10*time.Millisecond))
	rss, err := d.PeakRSS()
	if err != nil {
		return err
	}
	fmt.Printf("hubsync peak RSS at %d profiles and %d copies: %.1f MB (goal < 500 MB)\n", profiles, copies, float64(rss)/1e6)
	if soakDuration > 0 {
		return soak(ctx, d, hub)
	}
	return nil
}

// soak changes the fleet at a steady rate (token rotations and clusters
// moving between sets, each moving its profiles and copies between
// namespaces) for soakDuration, sampling hubsync's RSS, goroutines and
// open files every minute, and prints each series' least-squares slope.
func soak(ctx context.Context, d *fleet.Daemon, hub *fleet.Hub) error {
	fmt.Printf("== soak: %s of %d token rotations and %d relabels per second\n", soakDuration, soakRotations, soakRelabels)
	exp := time.Now().Add(24 * time.Hour)
	rng := rand.New(rand.NewPCG(1, 2))
	type sample struct {
		at              time.Duration
		rss, live       float64 // MB
		goroutines, fds float64
	}
	var samples []sample
	// With --heapprofile, a heap profile before each sample, after a
	// forced GC, so that the sample's live heap is exact:
	// go tool pprof -diff_base soak-01.pprof soak-30.pprof shows what the
	// soak left behind.
	heapProfile := func(at time.Duration) error {
		if heapProfileDir == "" {
			return nil
		}
		return fetchProfile(d, "/debug/pprof/heap?gc=1", filepath.Join(heapProfileDir, fmt.Sprintf("soak-%02.0f.pprof", at.Minutes())))
	}
	take := func(at time.Duration) error {
		if err := heapProfile(at); err != nil {
			return err
		}
		rss, err := d.RSS()
		if err != nil {
			return err
		}
		fds, err := d.OpenFiles()
		if err != nil {
			return err
		}
		m, err := d.Scrape()
		if err != nil {
			return err
		}
		value := func(name string) float64 { return m.Value(name, nil) }
		mb := func(name string) float64 { return value(name) / 1e6 }
		// The heap the last GC kept (exact after the forced GC of a heap
		// profile, else including what became garbage during that GC): RSS
		// also holds garbage awaiting the next GC (up to as much again at
		// GOGC=100) and free pages the runtime has not yet returned, so it
		// moves in steps.
		s := sample{at: at, rss: float64(rss) / 1e6, live: mb("go_gc_heap_live_bytes"), goroutines: value("go_goroutines"), fds: float64(fds)}
		samples = append(samples, s)
		fmt.Printf("  +%3.0f min: RSS %.1f MB (live heap %.1f, heap in use %.1f, free heap not yet returned %.1f), %0.f goroutines, %0.f open files\n",
			at.Minutes(), s.rss, s.live, mb("go_memstats_heap_inuse_bytes"), mb("go_memstats_heap_idle_bytes")-mb("go_memstats_heap_released_bytes"), s.goroutines, s.fds)
		return nil
	}
	begin := time.Now()
	if err := take(0); err != nil {
		return err
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	nextSample := time.Minute
	changes := 0
	for time.Since(begin) < soakDuration {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-d.Done():
			return fmt.Errorf("hubsync exited during the soak")
		case <-tick.C:
		}
		for range soakRotations {
			if err := hub.PutToken(ctx, clusterName(rng.IntN(scaleClusters)), msaName, fleet.FakeJWT(exp), nil); err != nil {
				return err
			}
			changes++
		}
		for range soakRelabels {
			if err := hub.Relabel(ctx, clusterName(rng.IntN(scaleClusters)), clusterv1beta2.ClusterSetLabel, setName(rng.IntN(scaleSets))); err != nil {
				return err
			}
			changes++
		}
		if el := time.Since(begin); el >= nextSample {
			if err := take(el); err != nil {
				return err
			}
			nextSample += time.Minute
		}
	}
	slope := func(y func(sample) float64) float64 {
		var n, sx, sy, sxx, sxy float64
		for _, s := range samples[1:] { // the first minute includes the warm-up
			x := s.at.Minutes()
			n, sx, sy, sxx, sxy = n+1, sx+x, sy+y(s), sxx+x*x, sxy+x*y(s)
		}
		if n < 2 || n*sxx-sx*sx == 0 {
			return 0
		}
		return (n*sxy - sx*sy) / (n*sxx - sx*sx)
	}
	fmt.Printf("soak: %d changes in %s; slopes from minute 1 on: RSS %+.2f MB/min, live heap %+.2f MB/min, goroutines %+.2f/min, open files %+.2f/min (goal: flat)\n",
		changes, time.Since(begin).Round(time.Second), slope(func(s sample) float64 { return s.rss }), slope(func(s sample) float64 { return s.live }),
		slope(func(s sample) float64 { return s.goroutines }), slope(func(s sample) float64 { return s.fds }))
	var names []string
	for _, s := range samples {
		names = append(names, fmt.Sprintf("%.1f", s.rss))
	}
	fmt.Printf("  RSS samples (MB): %s\n", strings.Join(names, " "))
	return nil
}
