package main

import (
	"context"
	"fmt"
	"time"

	"k8s.io/client-go/tools/cache"
	cpinformers "sigs.k8s.io/cluster-inventory-api/client/informers/externalversions"

	"github.com/hubsync/hubsync/test/fleet"
)

// floorVariant is one way of taking the floor in --floor-diag.
type floorVariant struct {
	name string
	// provider writes hubsync's objects: an access provider in status.
	provider bool
	// statusInCreate sends the status in the create too, as hubsync did
	// before its creates left it out.
	statusInCreate bool
	// watched keeps a client watching every ClusterProfile meanwhile, as
	// hubsync's informer does, so the API server sends each write to one
	// more watcher.
	watched bool
}

// benchFloorDiag tells what separates hubsync's writes from the floor's
// beside hubsync itself: the floor in four variants, interleaved in small
// chunks round after round (the order rotating each round) so that the
// machine's other load falls on all four alike, and summed per variant.
func benchFloorDiag(ctx context.Context, hub *fleet.Hub, rounds, chunk, workers int) error {
	variants := []floorVariant{
		{name: "the floor as it is"},
		{name: "hubsync's objects (an access provider in status)", provider: true},
		{name: "the floor, watched", watched: true},
		{name: "hubsync's objects, watched", provider: true, watched: true},
		{name: "hubsync's objects, status sent in the create too, watched", provider: true, statusInCreate: true, watched: true},
	}
	took := make([]time.Duration, len(variants))
	cpu := make([]time.Duration, len(variants))
	fmt.Printf("== floor variants: %d rounds of %d profiles each (%d writes), interleaved\n", rounds, chunk, 2*chunk)
	for r := range rounds {
		for j := range variants {
			i := (j + r) % len(variants)
			d, c, err := floorChunk(ctx, hub, chunk, workers, variants[i])
			if err != nil {
				return fmt.Errorf("floor variant %q: %w", variants[i].name, err)
			}
			took[i] += d
			cpu[i] += c
		}
	}
	for i, v := range variants {
		fmt.Printf("  %s: %s for %d writes (%.0f writes/s), %.2fx the floor; kube-apiserver + etcd CPU %s (%.2fx)\n",
			v.name, took[i].Round(time.Millisecond), 2*chunk*rounds, float64(2*chunk*rounds)/took[i].Seconds(),
			took[i].Seconds()/took[0].Seconds(), cpu[i].Round(10*time.Millisecond), cpu[i].Seconds()/cpu[0].Seconds())
	}
	return nil
}

// floorChunk takes one chunk of the floor in variant v.
func floorChunk(ctx context.Context, hub *fleet.Hub, n, workers int, v floorVariant) (time.Duration, time.Duration, error) {
	if v.watched {
		watchCtx, cancel := context.WithCancel(ctx)
		f := cpinformers.NewSharedInformerFactory(hub.Profiles, 0)
		inf := f.Apis().V1alpha1().ClusterProfiles().Informer()
		f.Start(watchCtx.Done())
		defer func() {
			cancel()
			f.Shutdown()
		}()
		if !cache.WaitForCacheSync(watchCtx.Done(), inf.HasSynced) {
			return 0, 0, fmt.Errorf("the floor's watch did not sync")
		}
	}
	return rawWriteFloorWith(ctx, hub, n, workers, v)
}
