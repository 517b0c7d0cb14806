package main

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubeinformers "k8s.io/client-go/informers"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/hub"
	"github.com/hubsync/hubsync/test/controlplane"
	"github.com/hubsync/hubsync/test/fleet"
)

const msaName = "app"

// credentialPhase measures credential copies on the converged fleet: one
// synced MSA per cluster, so one copy per profile.
func credentialPhase(ctx context.Context, cp *controlplane.ControlPlane, fh *fleet.Hub, binary string, conf config.Config, logs io.Writer,
	nClusters, nNamespaces, floorWorkers, nRotations int) error {
	copies := nClusters * nNamespaces
	fmt.Printf("\n== credentials: one synced ManagedServiceAccount per cluster, %d copies\n", copies)

	createFloor, updateFloor, err := secretFloor(ctx, fh, copies, floorWorkers)
	if err != nil {
		return err
	}
	fmt.Printf("floor: %d raw Secret creates by %d goroutines: %s; %d raw updates: %s\n",
		copies, floorWorkers, createFloor.Round(time.Millisecond), copies, updateFloor.Round(time.Millisecond))

	// The MSAs and their token Secrets exist before hubsync starts, as on a
	// hub where hubsync replaces the upstream syncer.
	exp := time.Now().Add(24 * time.Hour)
	if err := parallel(nClusters, 32, func(i int) error {
		if _, err := fh.CreateMSA(ctx, clusterName(i), msaName, true); err != nil {
			return err
		}
		return fh.PutToken(ctx, clusterName(i), msaName, fleet.FakeJWT(exp), nil)
	}); err != nil {
		return err
	}

	w, err := newCopyWatcher(ctx, cp, nNamespaces)
	if err != nil {
		return err
	}
	defer w.stop()

	start := time.Now()
	d, err := fleet.StartDaemon(ctx, binary, cp.Config, conf, logs)
	if err != nil {
		return err
	}
	defer d.Stop()
	readyAt := d.ReadyAt(ctx)
	if err := w.waitCount(ctx, d.Done(), copies, 10*time.Minute); err != nil {
		return err
	}
	initial := time.Since(start)
	fromReady := time.Since(<-readyAt)
	fmt.Printf("initial copies: %d, %s after hubsync's caches synced (%s after process start)\n",
		copies, fromReady.Round(time.Millisecond), initial.Round(time.Millisecond))
	fmt.Printf("  ratio to the create floor: %.2fx from caches synced, %.2fx from process start (goal <= 1.5x)\n",
		fromReady.Seconds()/createFloor.Seconds(), initial.Seconds()/createFloor.Seconds())

	// Rotation propagation, one cluster at a time, spread over the fleet.
	lat := make([]time.Duration, 0, nRotations)
	for i := range nRotations {
		c := clusterName(i * 7 % nClusters)
		tok := fleet.FakeJWT(exp)
		done := w.expect(c, hub.TokenFingerprint([]byte(tok)))
		t0 := time.Now()
		if err := fh.PutToken(ctx, c, msaName, tok, nil); err != nil {
			return err
		}
		select {
		case at := <-done:
			lat = append(lat, at.Sub(t0))
		case <-time.After(30 * time.Second):
			return fmt.Errorf("cluster %s: copies not rotated within 30s", c)
		}
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	fmt.Printf("rotation -> last of %d copies updated, over %d rotations: p50 %s  p99 %s  max %s (goal p99 < 100ms; a lone rotation does not wait for the %s coalescing window)\n",
		nNamespaces, len(lat), pct(lat, 50), pct(lat, 99), lat[len(lat)-1].Round(time.Millisecond), coalesce(conf))

	// Every cluster rotates at once.
	dones := make([]<-chan time.Time, nClusters)
	tokens := make([]string, nClusters)
	for i := range nClusters {
		tokens[i] = fleet.FakeJWT(exp)
		dones[i] = w.expect(clusterName(i), hub.TokenFingerprint([]byte(tokens[i])))
	}
	t0 := time.Now()
	if err := parallel(nClusters, floorWorkers, func(i int) error {
		return fh.PutToken(ctx, clusterName(i), msaName, tokens[i], nil)
	}); err != nil {
		return err
	}
	hubWrites := time.Since(t0)
	var last time.Time
	for i, ch := range dones {
		select {
		case at := <-ch:
			if at.After(last) {
				last = at
			}
		case <-time.After(5 * time.Minute):
			return fmt.Errorf("cluster %s: burst rotation not propagated", clusterName(i))
		}
	}
	burst := last.Sub(t0)
	fmt.Printf("burst: all %d clusters rotate at once (the %d hub writes took %s): last of %d copies updated after %s, ratio to the update floor: %.2fx\n",
		nClusters, nClusters, hubWrites.Round(time.Millisecond), copies, burst.Round(time.Millisecond), burst.Seconds()/updateFloor.Seconds())
	if m, err := d.Metrics(); err == nil {
		fmt.Printf("  hubsync credential writes over the whole phase (%d rotations x %d copies before the burst): %s\n",
			nRotations, nNamespaces, metricLines(m, "hubsync_credential_writes_total{"))
	}
	if rss, err := d.PeakRSS(); err == nil {
		fmt.Printf("hubsync peak RSS with copies: %.1f MB (goal < 200 MB)\n", float64(rss)/1e6)
	}
	return nil
}

// secretFloor times n raw creates, then n raw updates, of Secrets shaped
// like copies, from workers goroutines, and deletes them.
func secretFloor(ctx context.Context, fh *fleet.Hub, n, workers int) (time.Duration, time.Duration, error) {
	const ns = "secret-floor"
	if err := fh.Namespace(ctx, ns); err != nil {
		return 0, 0, err
	}
	client := fh.Kube.CoreV1().Secrets(ns)
	exp := time.Now().Add(time.Hour)
	secret := func(i int) *corev1.Secret {
		tok := fleet.FakeJWT(exp)
		return &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{
				Name:        fmt.Sprintf("floor-%05d", i),
				Labels:      map[string]string{hub.LabelSyncedFrom: "floor"},
				Annotations: map[string]string{hub.AnnotationSource: "floor/x", hub.AnnotationTokenFingerprint: hub.TokenFingerprint([]byte(tok))},
			},
			Type: corev1.SecretTypeOpaque,
			Data: map[string][]byte{"token": []byte(tok), "ca.crt": []byte(strings.Repeat("C", 1100))},
		}
	}
	created := make([]*corev1.Secret, n)
	start := time.Now()
	if err := parallel(n, workers, func(i int) error {
		s, err := client.Create(ctx, secret(i), metav1.CreateOptions{})
		created[i] = s
		return err
	}); err != nil {
		return 0, 0, fmt.Errorf("floor creates: %w", err)
	}
	creates := time.Since(start)
	start = time.Now()
	if err := parallel(n, workers, func(i int) error {
		s := created[i]
		s.Data = secret(i).Data
		_, err := client.Update(ctx, s, metav1.UpdateOptions{})
		return err
	}); err != nil {
		return 0, 0, fmt.Errorf("floor updates: %w", err)
	}
	updates := time.Since(start)
	return creates, updates, client.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
}

// parallel runs f(0..n-1) on workers goroutines and returns the first error.
func parallel(n, workers int, f func(int) error) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if err := f(i); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// newCopyWatcher follows credential copies through a label-scoped watch,
// as a consumer in the copies' namespaces would see them; expectations wait
// for a cluster's token fingerprint in every namespace.
func newCopyWatcher(ctx context.Context, cp *controlplane.ControlPlane, namespaces int) (*tracker, error) {
	fh, err := fleet.NewHub(cp.Config)
	if err != nil {
		return nil, err
	}
	t := newTracker(ctx, namespaces)
	f := kubeinformers.NewSharedInformerFactoryWithOptions(fh.Kube, 0, kubeinformers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.LabelSelector = hub.LabelSyncedFrom
	}))
	inf := f.Core().V1().Secrets().Informer()
	observe := func(obj any) {
		if s, ok := obj.(*corev1.Secret); ok {
			cluster, _, _ := strings.Cut(s.Annotations[hub.AnnotationSource], "/")
			t.observe(s.Namespace, s.Name, cluster, s.Annotations[hub.AnnotationTokenFingerprint], true)
		}
	}
	return t, t.run(f, inf, observe)
}

func coalesce(c config.Config) time.Duration {
	c.SetDefaults()
	return c.Credentials.Coalesce.Duration
}
