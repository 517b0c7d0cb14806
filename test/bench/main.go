// Command bench prints hubsync's performance figures on a real
// kube-apiserver + etcd, each against a floor or baseline measured in the
// same run:
//   - initial convergence of a 500-cluster x 8-namespace fleet (4000
//     profiles) against the time a tuned client takes for the same raw
//     writes, measured next to each run (etcd slows as its history grows),
//     with the median and range of the ratios;
//   - what the event bus adds to that initial sync: runs with the bus off
//     and on in a balanced order, compared by the median of each kind's
//     convergence/floor ratios and pair by pair; its CPU cost as hubsync's
//     extra CPU time (the bus and its embedded NATS server run in
//     hubsync's process) over the CPU time of hubsync, kube-apiserver and
//     etcd, beside the three processes' own on/off ratio; the events
//     published per second;
//   - latency from a ManagedCluster label change to every affected profile
//     being correct, and from a hub change to the event at a subscriber,
//     p50/p99;
//   - hubsync's peak RSS;
//   - credential copies: the initial 4000, a rotation's latency and every
//     cluster rotating at once, against raw Secret writes;
//   - sinks: what three sinks (kubeconfig files for every profile, Argo CD
//     Secrets for one namespace, a webhook) add to the initial sync, in
//     back-to-back pairs with the bus on; the webhook's delivery latency
//     beyond the hub write; and, for single rotations, the time to each
//     sink type's output, as a ratio to the NATS publish's;
//   - the tunnel pool, on a real konnectivity proxy-server, agent and
//     managed kube-apiserver: a small GET's p50/p99 at concurrency 1 and 32
//     through the warm pool, through a new tunnel per request and
//     directly; the time to bring 500 simulated clusters to ready; the
//     memory of a warm entry;
//   - the access gateway, over the same real parts and the hub's
//     TokenReview: a small GET's p50/p99 at concurrency 1, 32 and 128 and
//     a large list's throughput through the gateway, directly, and through
//     a gateway whose pool dials the API server without konnectivity;
//   - strangers: five floods at the gateway of the real daemon, run as
//     its ServiceAccount under the shipped flow control (forged tokens; one
//     token accepted for a cluster sent to made-up cluster names; JWTs of
//     unknown keys for a served cluster whose keys cannot be fetched;
//     refused requests announcing 1 MiB bodies sent at 1 byte/s; tokens
//     the cluster signed but refuses), each while a legitimate client
//     reads the same cluster through it and the syncer converges a burst:
//     the hub TokenReviews and requests reaching the cluster per request
//     of the flood, the shared connections redialed, how soon hubsync's
//     goroutines and open files come back, the client's errors and p99,
//     and the burst's convergence, against quiet runs beside each; then
//     what the trials cost a legitimate client: a new token's first
//     request (on a connection of its own) against its second;
//   - replicas: the tunnel pool runs on every replica; with the real
//     binary, proxy-server, agent and one managed kube-apiserver behind
//     every simulated cluster, a new standby's time from process start to
//     /readyz 200 with 500 and 3000 clusters warm, its RSS against a
//     standby with the tunnel off on the same fleet, and, at 10,000
//     clusters with tunnel.warm: onDemand, a standby's RSS when ready,
//     with 100 clusters in use through its gateway and after they closed
//     idle (on a control plane of its own in the full run);
//   - rolling updates: three replicas with leader election (the default
//     lease) behind a balancer gated on /readyz, over two proxy-servers
//     behind one address and two managed kube-apiservers, an external
//     NATS: the GETs of a few clients that fail while every replica is
//     replaced in turn and when the leader is SIGKILLed, the leader
//     handover after SIGTERM and after SIGKILL, and a new replica's time
//     to /readyz 200;
//   - revoking rotations: a managed kube-apiserver's ServiceAccount token
//     rotated through a ManagedServiceAccount and the real binary's copy,
//     the old token revoked, 20 times: the failed GETs of long-lived
//     clients built with the exec plugin (`hubsync creds`) and with
//     package access;
//   - webhook to a receiver far away: the 4000-profile initial sync
//     delivered by a webhook sink to a receiver that answers after 0, 10
//     and 50 ms, 3 runs each: events per second and how long after the
//     profiles converged the last event was delivered, in order per
//     (namespace, cluster), checked by the receiver (on a control plane
//     of its own in the full run);
//   - the clustered bus: publish throughput and event latency p99 of three
//     embedded nodes beside a single one, and the longest pause at an
//     application while a node is lost and while the publisher changes
//     (3 repeats, each with both rigs built afresh);
//   - with --scale only: 3000 clusters x 10 namespaces (10,000 profiles)
//     and 10,000 credential copies against their raw writes, hubsync's
//     peak RSS and CPU time; with --soak, RSS, goroutines and open files
//     every minute under steady rotations and relabels, with their slopes.
//
// --tunnel-only, --gateway-only, --flood-only, --replicas-only, --rolling-only, --rotation-only, --webhook-only, --bus-only, --initial-only, --initial-pairs,
// --sink-pairs, --sinks and --cpuprofile narrow it down for diagnosis.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	clientcmdv1 "k8s.io/client-go/tools/clientcmd/api/v1"
	clusterv1beta2 "open-cluster-management.io/api/cluster/v1beta2"
	cpv1alpha1 "sigs.k8s.io/cluster-inventory-api/apis/v1alpha1"
	cpinformers "sigs.k8s.io/cluster-inventory-api/client/informers/externalversions"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/test/controlplane"
	"github.com/hubsync/hubsync/test/fleet"
)

func main() {
	if spec := os.Getenv(bareProxyEnv); spec != "" {
		// This binary run again as the gateway figures' bare Go proxy.
		if err := runBareProxy(spec); err != nil {
			fmt.Fprintln(os.Stderr, "bare Go proxy:", err)
			os.Exit(1)
		}
		return
	}
	binary := flag.String("hubsync", "bin/hubsync", "hubsync binary")
	clusters := flag.Int("clusters", 500, "managed clusters in the fleet")
	namespaces := flag.Int("namespaces", 8, "consumer namespaces, each bound to sets covering every cluster")
	changes := flag.Int("changes", 60, "label changes timed for the latency figure")
	floorWorkers := flag.Int("floor-workers", 32, "goroutines of the tuned raw-write client")
	workers := flag.Int("workers", 32, "hubsync topology and credential workers")
	rotations := flag.Int("rotations", 120, "single-cluster token rotations timed for the latency figure")
	events := flag.Int("events", 220, "hub changes timed from the write to the event at a subscriber")
	logPath := flag.String("log", "", "file for hubsync's log (default: discarded)")
	flag.StringVar(&cpuProfileDir, "cpuprofile", "", "directory for a CPU profile of hubsync during each initial sync (serves pprof)")
	flag.IntVar(&cpuProfileSeconds, "cpuprofile-seconds", 15, "how long each CPU profile covers from hubsync's start")
	flag.IntVar(&initialPairs, "initial-pairs", 6, "pairs of initial syncs with the bus off and on (even numbers balance the order)")
	flag.IntVar(&sinkPairs, "sink-pairs", 4, "pairs of initial syncs with the bus on, without and with three sinks")
	flag.BoolVar(&initialOnly, "initial-only", false, "only the initial syncs with the bus off and on (no tunnel, gateway or latency figures)")
	flag.BoolVar(&tunnelOnly, "tunnel-only", false, "print only the tunnel pool's figures")
	flag.IntVar(&tunnelRepeats, "tunnel-repeats", 5, "repeats of each tunnel figure")
	flag.IntVar(&tunnelRequests, "tunnel-requests", 640, "requests per tunnel latency measurement (a multiple of 32)")
	flag.IntVar(&tunnelClusters, "tunnel-clusters", 500, "simulated clusters brought to ready through the pool")
	flag.BoolVar(&gatewayOnly, "gateway-only", false, "print only the access gateway's figures")
	flag.IntVar(&gatewayRepeats, "gateway-repeats", 5, "repeats of each gateway figure")
	flag.IntVar(&gatewayRequests, "gateway-requests", 1920, "requests per gateway latency and CPU measurement (a multiple of 128)")
	flag.StringVar(&gatewayHot, "gateway-hot", "", "with --gateway-only: only load the hubsync gateway through konnectivity with small GETs at concurrency 32 (small) or large LISTs at concurrency 1 (list) for --gateway-hot-seconds, printing its CPU per request (and a profile with --gateway-cpuprofile): a quick loop for profiling")
	flag.StringVar(&gatewayBaseline, "gateway-baseline", "", "another hubsync binary measured over konnectivity in the same gateway runs (mode \"hubsync, baseline\"), for before/after figures")
	flag.IntVar(&gatewayHotSeconds, "gateway-hot-seconds", 30, "how long --gateway-hot loads the gateway")
	flag.IntVar(&gatewayLists, "gateway-lists", 24, "large lists per gateway throughput measurement (a multiple of 4)")
	flag.StringVar(&gatewayCPUProfile, "gateway-cpuprofile", "", "directory for CPU profiles of the hubsync process during the gateway measurements (small GETs at concurrency 32, large LISTs)")
	flag.BoolVar(&floodOnly, "flood-only", false, "print only the strangers figures: five floods at the gateway, each beside a legitimate client and a syncer burst")
	flag.IntVar(&floodRepeats, "flood-repeats", 3, "pairs of runs without and with each flood")
	flag.IntVar(&floodRequests, "flood-requests", 2000, "requests of the forged-token flood")
	flag.IntVar(&floodConns, "flood-conns", 50, "connections the flood comes over")
	flag.IntVar(&floodBurst, "flood-burst", 250, "clusters of the syncer's burst during each run (x2 namespaces)")
	flag.BoolVar(&replicasOnly, "replicas-only", false, "print only the replica figures: a standby's time to ready and RSS with the pool warm, and on demand at a larger fleet")
	flag.IntVar(&replicaRepeats, "replica-repeats", 3, "standbys started at each warm fleet size (each paired with one with the tunnel off)")
	flag.StringVar(&replicaSizes, "replica-clusters", "500,3000", "warm fleet sizes, increasing, separated by commas; the RSS figures are taken at each")
	flag.IntVar(&replicaOnDemand, "replica-ondemand", 10000, "clusters of the fleet for the tunnel.warm: onDemand figures")
	flag.IntVar(&replicaUsed, "replica-used", 100, "clusters read through the on-demand standby's gateway")
	flag.DurationVar(&replicaIdle, "replica-idle", 10*time.Second, "tunnel.idleTimeout of the on-demand replicas (longer than --replica-settle, which the sample of the entries in use takes)")
	flag.DurationVar(&replicaSettle, "replica-settle", 5*time.Second, "how long a replica rests before each memory sample")
	flag.IntVar(&replicaFleetConc, "replica-fleet-writers", 64, "goroutines creating the replica fleet's clusters")
	flag.IntVar(&replicaAgents, "replica-agents", 16, "konnectivity agents serving the replica fleet's one managed API server: the proxy-server spreads the tunnels over them, as a real fleet's spread over an agent per cluster (v0.36.0's proxy-server and agent can stall each other for good when one agent carries thousands of tunnels that close at once)")
	flag.StringVar(&replicaMemLimit, "replica-memlimit", "300MiB", "GOMEMLIMIT of one more warm standby at the largest fleet size, as the chart sets it from the memory limit (\"\": none)")
	flag.StringVar(&replicaProfiles, "replica-profiles", "", "directory for each warm standby's CPU profile of its start and heap and goroutine profiles once settled (serves pprof)")
	flag.BoolVar(&rollingOnly, "rolling-only", false, "print only the rolling-update figures: failed requests while replicas are replaced or the leader killed, leader handovers, time to ready")
	flag.IntVar(&rollingRepeats, "rolling-repeats", 3, "rolling updates of the three replicas, each followed by a SIGKILL of the leader")
	flag.BoolVar(&rotationOnly, "rotation-only", false, "print only the revoking-rotation figures: failed GETs of long-lived clients (exec plugin, package access) while the token rotates and the old one is revoked")
	flag.IntVar(&rotationRepeats, "rotation-repeats", 20, "revoking token rotations")
	flag.BoolVar(&scaleMode, "scale", false, "only the scale figures: a large fleet with credential copies (see --scale-clusters)")
	flag.IntVar(&scaleClusters, "scale-clusters", 3000, "clusters of the scale fleet")
	flag.IntVar(&scaleNamespaces, "scale-namespaces", 10, "namespaces of the scale fleet, each bound to one of three sets")
	flag.DurationVar(&soakDuration, "soak", 0, "with --scale: then change the fleet at a steady rate for this long, sampling RSS, goroutines and open files every minute")
	flag.IntVar(&soakRotations, "soak-rotations", 2, "token rotations per second during the soak")
	flag.IntVar(&soakRelabels, "soak-relabels", 1, "clusters moved to another set per second during the soak")
	flag.StringVar(&heapProfileDir, "heapprofile", "", "with --soak: directory for a heap profile of hubsync at each minute's sample, after a forced GC (serves pprof)")
	flag.BoolVar(&busOnly, "bus-only", false, "print only the clustered bus's figures: publish throughput and event latency p99 of three embedded nodes beside a single one, and the longest pause at an application while a node is lost and while the publisher changes")
	flag.IntVar(&busRepeats, "bus-repeats", 3, "repeats of the clustered bus's figures (each builds both rigs afresh, in alternating order)")
	flag.BoolVar(&webhookOnly, "webhook-only", false, "print only the webhook figures: the initial sync delivered to a receiver that answers after a fixed delay")
	flag.IntVar(&webhookRepeats, "webhook-repeats", 3, "initial syncs at each webhook delay and concurrency")
	flag.StringVar(&webhookDelays, "webhook-delays", "0,10,50", "the webhook receiver's delays in milliseconds, separated by commas")
	flag.StringVar(&webhookConcurrency, "webhook-concurrency", "", "webhook.concurrency of the runs, separated by commas (default: the configuration's default)")
	flag.IntVar(&floorDiag, "floor-diag", 0, "for diagnosis, instead of the initial syncs: this many rounds of the floor in chunks of --floor-diag-chunk profiles, interleaving four variants: as it is, writing hubsync's objects (an access provider in status), and each while a client watches every ClusterProfile as hubsync's informer does")
	flag.IntVar(&floorDiagChunk, "floor-diag-chunk", 500, "profiles per chunk of --floor-diag")
	flag.IntVar(&workersB, "workers-b", 0, "with --hubsync-b: the B runs' workers.topology (0: --workers)")
	flag.StringVar(&binaryB, "hubsync-b", "", "with --initial-only --sink-pairs 0: a second hubsync binary; the pairs are then the first and this one, both with the bus on, each against the floor next to it (an A/B comparison of two builds)")
	sinkList := flag.String("sinks", "files,argocd,hooks", "the sinks of the sink pairs, for diagnosis: any of files (kubeconfig), argocd, hooks (webhook)")
	flag.Parse()
	for _, n := range strings.Split(*sinkList, ",") {
		if n = strings.TrimSpace(n); n != "" {
			benchSinks = append(benchSinks, n)
		}
	}
	if gatewayRequests < 128 || gatewayRequests%128 != 0 || gatewayLists < 4 || gatewayLists%4 != 0 || gatewayRepeats < 1 {
		fmt.Fprintln(os.Stderr, "bench: --gateway-requests must be a multiple of 128, --gateway-lists of 4, --gateway-repeats at least 1")
		os.Exit(2)
	}
	if replicaAgents < 1 {
		fmt.Fprintln(os.Stderr, "bench: --replica-agents must be at least 1")
		os.Exit(2)
	}
	if replicaRepeats < 1 || replicaUsed < 1 || replicaUsed > replicaOnDemand || replicaIdle <= replicaSettle+time.Second {
		fmt.Fprintln(os.Stderr, "bench: --replica-repeats and --replica-used must be at least 1, --replica-used at most --replica-ondemand, --replica-idle over --replica-settle by more than 1s")
		os.Exit(2)
	}
	if rollingRepeats < 1 || rotationRepeats < 1 {
		fmt.Fprintln(os.Stderr, "bench: --rolling-repeats and --rotation-repeats must be at least 1")
		os.Exit(2)
	}
	if webhookRepeats < 1 {
		fmt.Fprintln(os.Stderr, "bench: --webhook-repeats must be at least 1")
		os.Exit(2)
	}
	if initialPairs < 1 || sinkPairs < 0 || (sinkPairs == 0 && !initialOnly) || (binaryB != "" && sinkPairs != 0) {
		fmt.Fprintln(os.Stderr, "bench: --initial-pairs must be at least 1, --sink-pairs at least 1 (0 only with --initial-only, and 0 with --hubsync-b)")
		os.Exit(2)
	}
	// envtest logs through controller-runtime's logger, which would
	// otherwise print a stack trace of its first use, unset.
	ctrllog.SetLogger(logr.Discard())
	// Interrupted, it still stops hubsync, kube-apiserver and etcd.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *binary, *clusters, *namespaces, *changes, *floorWorkers, *workers, *rotations, *events, *logPath); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		stop()
		os.Exit(1)
	}
}

const sets = 4

// Diagnosis switches (flags).
var (
	cpuProfileDir     string
	cpuProfileSeconds int
	initialOnly       bool
	initialPairs      int
	// floorTimeline describes the last floor's writes over time (see
	// describeTimeline), printed beside the run next to it.
	floorTimeline string
	// floorEnded is when the last floor's last write returned.
	floorEnded time.Time
	sinkPairs  int
	// benchSinks names the sinks of the initial syncs with sinks.
	benchSinks []string
	// floorDiag and floorDiagChunk: --floor-diag.
	floorDiag, floorDiagChunk int
	// binaryB is the second build of an A/B comparison (--hubsync-b).
	binaryB string
	// workersB is the B runs' topology workers (--workers-b).
	workersB int
)

// A run's kind: the bus off, on, or on with three sinks.
type kind int

const (
	busOff kind = iota
	busOn
	withSinks
	busOnB // bus on, the --hubsync-b binary
)

func (k kind) String() string {
	return [...]string{"bus off", "bus on (embedded NATS, JetStream stream + KV)", "bus on + kubeconfig, argocd and webhook sinks", "bus on, --hubsync-b"}[k]
}

func run(ctx context.Context, binary string, nClusters, nNamespaces, nChanges, floorWorkers, workers, nRotations, nEvents int, logPath string) error {
	fmt.Println("== hubsync bench: starting kube-apiserver + etcd")
	cp, err := controlplane.Start(ctx)
	if err != nil {
		return err
	}
	defer cp.Stop()
	logs, closeLogs, err := openLog(logPath)
	if err != nil {
		return err
	}
	defer closeLogs()
	if scaleMode {
		return benchScale(ctx, cp, binary, floorWorkers, workers, logs)
	}
	if replicasOnly {
		return benchReplicas(ctx, cp, binary, logs)
	}
	if floodOnly {
		return benchFlood(ctx, cp, binary, logs)
	}
	if rollingOnly {
		return benchRolling(ctx, cp, binary, logs)
	}
	if rotationOnly {
		return benchRotation(ctx, cp, binary, logs)
	}
	if webhookOnly {
		return benchWebhook(ctx, cp, binary, nClusters, nNamespaces, workers, logs)
	}
	if busOnly {
		return benchBus(ctx)
	}
	if !gatewayOnly && !initialOnly {
		if err := benchTunnel(ctx, cp); err != nil {
			return fmt.Errorf("tunnel figures: %w", err)
		}
	}
	if !tunnelOnly && !initialOnly {
		if err := benchGateway(ctx, cp, binary, logs); err != nil {
			return fmt.Errorf("gateway figures: %w", err)
		}
		if gatewayHot != "" {
			return nil
		}
		if err := benchFlood(ctx, cp, binary, logs); err != nil {
			return fmt.Errorf("strangers figures: %w", err)
		}
	}
	if !tunnelOnly && !gatewayOnly && !initialOnly {
		if err := benchRolling(ctx, cp, binary, logs); err != nil {
			return fmt.Errorf("rolling-update figures: %w", err)
		}
		if err := benchRotation(ctx, cp, binary, logs); err != nil {
			return fmt.Errorf("revoking-rotation figures: %w", err)
		}
		if err := benchBus(ctx); err != nil {
			return fmt.Errorf("clustered bus figures: %w", err)
		}
	}
	if tunnelOnly || gatewayOnly {
		return nil
	}
	hub, err := fleet.NewHub(cp.Config)
	if err != nil {
		return err
	}
	profiles := nClusters * nNamespaces

	// Floor: the same writes hubsync needs (one create and one status write
	// per profile) from a tuned client.
	floor, err := rawWriteFloor(ctx, hub, profiles, floorWorkers)
	if err != nil {
		return err
	}
	fmt.Printf("floor: %d raw writes (%d creates + %d status) by %d goroutines: %s (%.0f writes/s)\n",
		2*profiles, profiles, profiles, floorWorkers, floor.Round(time.Millisecond), float64(2*profiles)/floor.Seconds())
	if floorDiag > 0 {
		return benchFloorDiag(ctx, hub, floorDiag, floorDiagChunk, floorWorkers)
	}

	fmt.Printf("== fleet: %d clusters in %d exclusive sets + one {} label-selector set, %d namespaces\n", nClusters, sets, nNamespaces)
	if err := buildFleet(ctx, hub, nClusters, nNamespaces); err != nil {
		return err
	}

	w, err := newProfileWatcher(ctx, cp, nNamespaces)
	if err != nil {
		return err
	}
	defer w.stop()

	conf := config.Config{}
	// hub.qps and burst stay at their defaults: no client-side limit,
	// the API server's Priority and Fairness paces hubsync.
	conf.Workers.Topology = workers
	conf.Credentials.Workers = workers
	conf.Server.Pprof = cpuProfileDir != ""
	providerDir, err := os.MkdirTemp("", "hubsync-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(providerDir)
	// Every run writes the same access provider, which the kubeconfig and
	// Argo CD sinks use.
	if conf.AccessProviders, err = benchProviders(providerDir); err != nil {
		return err
	}

	// The same initial sync several times. The first, with the bus off,
	// is the topology figure and warms the API server up (the first sync
	// on a fresh etcd is the fastest of all); it is not compared. Then
	// back-to-back pairs: the bus off and on, in the order off, on, on,
	// off, off, on, ... so that neither kind runs later on average (the
	// API server slows down a little as etcd's history grows); then the
	// bus on without and with three sinks, in the same balanced order. Each
	// pair's ratio is computed, and the median and spread of the ratios
	// are reported, by wall time and by the CPU time of hubsync,
	// kube-apiserver and etcd. The last run, with the sinks, stays up for
	// the latency figures.
	off := conf
	no := false
	off.Bus.Enabled = &no
	kindA, kindB := busOff, busOn
	if binaryB != "" {
		kindA, kindB = busOn, busOnB
	}
	order := []kind{kindA}
	for i := range initialPairs {
		if i%2 == 0 {
			order = append(order, kindA, kindB)
		} else {
			order = append(order, kindB, kindA)
		}
	}
	busRuns := len(order)
	for i := range sinkPairs {
		if i%2 == 0 {
			order = append(order, busOn, withSinks)
		} else {
			order = append(order, withSinks, busOn)
		}
	}
	compared := len(order)
	if sinkPairs > 0 {
		order = append(order, withSinks) // for the latency figures
	}
	var d *fleet.Daemon
	var sub *eventCounter
	var rig *sinkRig
	took := map[kind][]time.Duration{}
	cpu := map[kind][]time.Duration{}
	all := map[kind][]time.Duration{}   // hubsync + kube-apiserver + etcd
	floorRatios := map[kind][]float64{} // each run against the floor next to it
	var busRatios, busCPURatios, sinkRatios, sinkCPURatios []float64
	// The bus's own CPU in each pair: hubsync's extra CPU time with the
	// bus on, as a share of the three processes' CPU with it off. The bus
	// runs in hubsync's process (the embedded NATS server included) and
	// leaves the API server's work unchanged, so this is its cost without
	// the scatter of kube-apiserver and etcd between runs.
	var busOwnCPU []float64
	var catchUp []time.Duration    // sinks idle after the profiles converged
	var busCatchUp []time.Duration // the bus's queue empty after the profiles converged
	var prevTook, prevAll, prevCPU time.Duration
	var prevKind kind
	for i, k := range order {
		if i > 0 {
			if err := d.Stop(); err != nil {
				return fmt.Errorf("stop hubsync: %w", err)
			}
			if sub != nil {
				// Its server is gone: left open, its consumer would
				// report missed heartbeats for the rest of the run.
				sub.close()
			}
			if rig != nil {
				if err := rig.close(ctx); err != nil {
					return err
				}
				rig = nil
			}
			if err := deleteProfiles(ctx, hub, nNamespaces); err != nil {
				return err
			}
			w.reset()
		}
		c := off
		var attach []func(*fleet.Daemon) error
		if k != busOff {
			c = conf
			sub = newEventCounter()
			attach = append(attach, sub.attach)
		}
		if k == withSinks {
			if rig, err = newSinkRig(ctx, hub); err != nil {
				return err
			}
			c.Sinks = rig.only(rig.sinks(config.AuthExec), benchSinks)
		}
		what := k.String()
		switch {
		case i == 0:
			what += "; the topology figure, not compared"
		case i >= compared:
			what += "; for the latency figures, not compared"
		}
		fmt.Printf("-- initial sync %d of %d, %s\n", i+1, len(order), what)
		if cpuProfileDir != "" {
			attach = append(attach, cpuProfile(filepath.Join(cpuProfileDir, fmt.Sprintf("initial-%d-%d.pprof", i+1, k))))
		}
		// A floor next to each repeat, in the same conditions (etcd's
		// history grows run after run), so that each run's ratio holds
		// still even when the API server's pace drifts.
		runFloor := floor
		if i > 0 {
			if runFloor, err = rawWriteFloor(ctx, hub, profiles, floorWorkers); err != nil {
				return err
			}
			fmt.Printf("  floor next to this run: %s (%.0f writes/s)\n", runFloor.Round(time.Millisecond), float64(2*profiles)/runFloor.Seconds())
			fmt.Printf("  floor timeline (profiles with status): %s\n", floorTimeline)
			if seen := w.lastFloorSeen(); seen.After(floorEnded) {
				fmt.Printf("  the watch saw the floor's last status %s after its write returned\n", seen.Sub(floorEnded).Round(time.Millisecond))
			}
		}
		var t time.Duration
		reqBefore, _ := readAPIRequests(ctx, hub)
		cpBefore := controlPlaneCPU()
		bin := binary
		if k == busOnB {
			bin = binaryB
			if workersB > 0 {
				c.Workers.Topology = workersB
			}
		}
		d, t, err = converge(ctx, cp, w, bin, c, logs, profiles, runFloor, attach...)
		if err != nil {
			return err
		}
		if k != busOff {
			// The bus holds its events while the syncer converges
			// (bus.yieldMax) and publishes them right after.
			idle, err := waitSinksIdle(ctx, d, "nats")
			if err != nil {
				return fmt.Errorf("the bus never caught up: %w", err)
			}
			fmt.Printf("  events all published %s after convergence\n", idle.Round(time.Millisecond))
			if i < compared {
				busCatchUp = append(busCatchUp, idle)
			}
		}
		if k == withSinks {
			idle, err := waitSinksIdle(ctx, d, benchSinks...)
			if err != nil {
				return fmt.Errorf("sinks never caught up: %w", err)
			}
			files, _ := os.ReadDir(filepath.Join(rig.dir, "kubeconfigs"))
			fmt.Printf("  sinks caught up %s after convergence: %d kubeconfig files, %d webhook events\n",
				idle.Round(time.Millisecond), len(files), rig.hook.count())
			if i < compared {
				catchUp = append(catchUp, idle)
			}
		}
		cpUsed := controlPlaneCPU() - cpBefore
		fmt.Printf("  kube-apiserver + etcd CPU for the sync: %s\n", cpUsed.Round(10*time.Millisecond))
		if reqAfter, err := readAPIRequests(ctx, hub); err == nil && reqBefore != nil {
			fmt.Printf("  API requests during the sync: %s\n", reqAfter.since(reqBefore))
		}
		if i == 0 || i >= compared {
			continue
		}
		var total, own time.Duration
		if c, err := d.CPUTime(); err == nil {
			own = c
			total = c + cpUsed
			cpu[k] = append(cpu[k], c)
			all[k] = append(all[k], total)
			fmt.Printf("  CPU time of hubsync + kube-apiserver + etcd for the sync: %s\n", total.Round(10*time.Millisecond))
		}
		took[k] = append(took[k], t)
		floorRatios[k] = append(floorRatios[k], t.Seconds()/runFloor.Seconds())
		if i%2 == 0 { // the second run of a pair: ratio of the richer kind to the other
			hi, lo, hiCPU, loCPU := t, prevTook, total, prevAll
			if k < prevKind {
				hi, lo, hiCPU, loCPU = prevTook, t, prevAll, total
			}
			ratio, cpuRatio := hi.Seconds()/lo.Seconds(), 0.0
			if loCPU > 0 {
				cpuRatio = hiCPU.Seconds() / loCPU.Seconds()
			}
			if i < busRuns {
				busRatios, busCPURatios = append(busRatios, ratio), append(busCPURatios, cpuRatio)
				onCPU, offCPU, offAll := own, prevCPU, prevAll
				if k < prevKind {
					onCPU, offCPU, offAll = prevCPU, own, total
				}
				if offAll > 0 && onCPU > 0 && offCPU > 0 {
					busOwnCPU = append(busOwnCPU, 1+(onCPU-offCPU).Seconds()/offAll.Seconds())
				}
			} else {
				sinkRatios, sinkCPURatios = append(sinkRatios, ratio), append(sinkCPURatios, cpuRatio)
			}
		}
		prevTook, prevAll, prevCPU, prevKind = t, total, own, k
	}
	defer func() { _ = d.Stop() }()
	defer func() {
		if rig != nil {
			_ = rig.close(ctx)
		}
	}()
	if sinkPairs == 0 {
		// --initial-only --sink-pairs 0: the runs against their floors only.
		printFloorRatios(floorRatios)
		if binaryB != "" {
			slices.Sort(busRatios)
			fmt.Printf("  back-to-back pairs, convergence of --hubsync-b over --hubsync: median %+.1f%%; pairs %s\n", 100*(median(busRatios)-1), percentages(busRatios))
		}
		return nil
	}
	if err := sub.waitQuiet(2 * time.Second); err != nil {
		return err
	}
	n, first, last := sub.stats()
	fmt.Printf("events published during the last initial sync: %d, %.0f events/s (first to last event seen by a subscriber, %s)\n",
		n, float64(n)/last.Sub(first).Seconds(), last.Sub(first).Round(time.Millisecond))
	for _, l := range [][]float64{busRatios, busCPURatios, busOwnCPU, sinkRatios, sinkCPURatios} {
		slices.Sort(l)
	}
	for _, k := range []kind{busOff, busOn} {
		slices.Sort(floorRatios[k])
	}
	// The bus's cost on convergence from every run of each kind, each
	// against the floor next to it: twice the runs of the pairs alone (the
	// bus-on runs of the sink pairs count too), and no drift between them.
	on, offR := floorRatios[busOn], floorRatios[busOff]
	fmt.Printf("the bus adds %+.1f%% to convergence: median convergence/floor with the bus on (%d runs, %.2fx to %.2fx) over off (%d runs, %.2fx to %.2fx) (goal <= 5%%)\n",
		100*(median(on)/median(offR)-1), len(on), on[0], on[len(on)-1], len(offR), offR[0], offR[len(offR)-1])
	slices.Sort(busCatchUp)
	fmt.Printf("  every event published %s after the profiles converged (median; %s to %s): the bus holds events while the syncer converges (bus.yieldMax)\n",
		median(busCatchUp).Round(time.Millisecond), busCatchUp[0].Round(time.Millisecond), busCatchUp[len(busCatchUp)-1].Round(time.Millisecond))
	fmt.Printf("  back-to-back on/off pairs by wall time: median %+.1f%%; pairs %s\n",
		100*(median(busRatios)-1), percentages(busRatios))
	fmt.Printf("  the bus's own CPU (hubsync's extra CPU time with the bus on, as a share of hubsync + kube-apiserver + etcd with it off): median %+.1f%% (goal <= 5%%); pairs %s\n",
		100*(median(busOwnCPU)-1), percentages(busOwnCPU))
	fmt.Printf("  CPU time of hubsync + kube-apiserver + etcd, on/off pairs (the API server's scatter between runs included): median %+.1f%%; pairs %s\n",
		100*(median(busCPURatios)-1), percentages(busCPURatios))
	fmt.Printf("sinks %s (kubeconfig: %d files, argocd: %d Secrets, hooks: a webhook) add %+.1f%% to convergence: median of %d back-to-back pairs with the bus on (goal <= 5%%); pairs %s\n",
		strings.Join(benchSinks, ","), profiles, nClusters, 100*(median(sinkRatios)-1), len(sinkRatios), percentages(sinkRatios))
	fmt.Printf("  in CPU time of hubsync + kube-apiserver + etcd, the sinks' catching up included: median %+.1f%%; pairs %s\n",
		100*(median(sinkCPURatios)-1), percentages(sinkCPURatios))
	slices.Sort(catchUp)
	fmt.Printf("  the sinks caught up %s after the profiles converged (median; %s to %s): the kubeconfig and argocd sinks yield while the syncer converges\n",
		median(catchUp).Round(time.Millisecond), catchUp[0].Round(time.Millisecond), catchUp[len(catchUp)-1].Round(time.Millisecond))
	printFloorRatios(floorRatios)
	for _, k := range []kind{busOff, busOn, withSinks} {
		slices.Sort(took[k])
		slices.Sort(cpu[k])
		if len(took[k]) > 0 && len(cpu[k]) > 0 {
			fmt.Printf("  %s: convergence median %s (%s to %s), hubsync CPU median %s\n", k, median(took[k]).Round(time.Millisecond),
				took[k][0].Round(time.Millisecond), took[k][len(took[k])-1].Round(time.Millisecond), median(cpu[k]).Round(10*time.Millisecond))
		}
	}
	if initialOnly {
		return nil
	}

	// Latency: move clusters between exclusive sets; each move relabels the
	// cluster's profile in every namespace.
	lat := make([]time.Duration, 0, nChanges)
	for i := range nChanges {
		name := clusterName(i * (nClusters / nChanges) % nClusters)
		c, err := hub.Cluster.ClusterV1().ManagedClusters().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		cur := c.Labels[clusterv1beta2.ClusterSetLabel]
		next := setName((setIndex(cur) + 1) % sets)
		done := w.expect(name, next)
		t0 := time.Now()
		if err := hub.Relabel(ctx, name, clusterv1beta2.ClusterSetLabel, next); err != nil {
			return err
		}
		select {
		case at := <-done:
			lat = append(lat, at.Sub(t0))
		case <-time.After(30 * time.Second):
			return fmt.Errorf("cluster %s: profiles not relabelled within 30s", name)
		}
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	fmt.Printf("label change -> all %d namespaces correct, over %d changes: p50 %s  p99 %s  max %s (goal p99 < 1s)\n",
		nNamespaces, len(lat), pct(lat, 50), pct(lat, 99), lat[len(lat)-1].Round(time.Millisecond))

	if err := eventLatency(ctx, hub, sub, rig.hook, nClusters, nEvents); err != nil {
		return err
	}

	rss, err := d.PeakRSS()
	if err != nil {
		return err
	}
	fmt.Printf("hubsync peak RSS: %.1f MB (goal < 200 MB)\n", float64(rss)/1e6)
	if err := d.Stop(); err != nil {
		return fmt.Errorf("stop hubsync: %w", err)
	}
	if err := credentialPhase(ctx, cp, hub, binary, conf, logs, nClusters, nNamespaces, floorWorkers, nRotations); err != nil {
		return err
	}
	if err := sinkRotations(ctx, cp, hub, binary, conf, logs, nClusters, nRotations); err != nil {
		return err
	}
	if err := webhookOnFreshHub(ctx, binary, nClusters, nNamespaces, workers, logs); err != nil {
		return fmt.Errorf("webhook figures: %w", err)
	}
	return replicasOnFreshHub(ctx, binary, logs)
}

// printFloorRatios prints each kind's convergence against the floor next
// to each run: median and range.
func printFloorRatios(floorRatios map[kind][]float64) {
	for _, k := range []kind{busOff, busOn, withSinks, busOnB} {
		if r := floorRatios[k]; len(r) > 0 {
			slices.Sort(r)
			fmt.Printf("  %s: convergence / the floor next to it: median %.2fx (%.2fx to %.2fx over %d runs; goal <= 1.5x)\n",
				k, median(r), r[0], r[len(r)-1], len(r))
		}
	}
}

// openLog opens the file for hubsync's log, or discards the log when path
// is empty.
func openLog(path string) (io.Writer, func(), error) {
	if path == "" {
		return io.Discard, func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, nil, err
	}
	return f, func() { _ = f.Close() }, nil
}

// cpuProfile starts a CPU profile of the daemon covering its initial
// sync and writes it to path in the background.
func cpuProfile(path string) func(*fleet.Daemon) error {
	return func(d *fleet.Daemon) error {
		go func() {
			if err := fetchProfile(d, "/debug/pprof/profile?seconds="+strconv.Itoa(cpuProfileSeconds), path); err != nil {
				fmt.Fprintln(os.Stderr, "cpu profile:", err)
			}
		}()
		return nil
	}
}

// fetchProfile writes the daemon's pprof endpoint at path (a
// /debug/pprof/ URL path with its query) to file, waiting up to 30 s for
// the daemon to serve it.
func fetchProfile(d *fleet.Daemon, path, file string) error {
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		return err
	}
	var resp *http.Response
	err := wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		var err error
		resp, err = http.Get("http://" + d.Address + path)
		return err == nil, nil
	})
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", path, resp.Status)
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// controlPlaneCPU is the CPU time used so far by this process's
// kube-apiserver and etcd children; 0 if they cannot be read.
func controlPlaneCPU() time.Duration {
	var total time.Duration
	for _, c := range children() {
		if c.name != "kube-apiserver" && c.name != "etcd" {
			continue
		}
		if cpu, err := fleet.ProcessCPUTime(c.pid); err == nil {
			total += cpu
		}
	}
	return total
}

// child is a process this one started.
type child struct {
	pid  int
	name string // the command's name, as /proc/<pid>/stat gives it
}

// children lists this process's child processes from /proc; none if it
// cannot be read.
func children() []child {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	self := os.Getpid()
	var out []child
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		open, end := strings.IndexByte(string(stat), '('), strings.LastIndexByte(string(stat), ')')
		if open < 0 || end < open {
			continue
		}
		rest := strings.Fields(string(stat[end+1:]))
		if len(rest) < 2 {
			continue
		}
		if ppid, _ := strconv.Atoi(rest[1]); ppid == self {
			out = append(out, child{pid: pid, name: string(stat[open+1 : end])})
		}
	}
	return out
}

// percentages formats ratios as changes: 1.031 is "+3.1%".
func percentages(ratios []float64) string {
	parts := make([]string, len(ratios))
	for i, r := range ratios {
		parts[i] = fmt.Sprintf("%+.1f%%", 100*(r-1))
	}
	return strings.Join(parts, " ")
}

// median of a sorted list.
func median[T time.Duration | float64](d []T) T {
	if len(d)%2 == 1 {
		return d[len(d)/2]
	}
	return (d[len(d)/2-1] + d[len(d)/2]) / 2
}

func pct(d []time.Duration, p int) time.Duration {
	i := (len(d)*p + 99) / 100
	if i > 0 {
		i--
	}
	return d[i].Round(100 * time.Microsecond)
}

func clusterName(i int) string { return fmt.Sprintf("cluster-%04d", i) }
func setName(i int) string     { return fmt.Sprintf("set-%d", i) }
func setIndex(s string) int {
	var i int
	_, _ = fmt.Sscanf(s, "set-%d", &i)
	return i
}
func nsName(i int) string { return fmt.Sprintf("consumer-%d", i) }

// rawWriteFloor creates n profiles and writes their status from workers
// goroutines with no client-side rate limit, then deletes them.
func rawWriteFloor(ctx context.Context, hub *fleet.Hub, n, workers int) (time.Duration, error) {
	d, _, err := rawWriteFloorWith(ctx, hub, n, workers, floorVariant{})
	return d, err
}

// rawWriteFloorWith is rawWriteFloor in variant v (its provider and
// statusInCreate; see floorVariant). It also returns the CPU time
// kube-apiserver and etcd spent on the writes.
func rawWriteFloorWith(ctx context.Context, hub *fleet.Hub, n, workers int, v floorVariant) (time.Duration, time.Duration, error) {
	const ns = "floor"
	if err := hub.Namespace(ctx, ns); err != nil {
		return 0, 0, err
	}
	client := hub.Profiles.ApisV1alpha1().ClusterProfiles(ns)
	status := fleet.Status(fleet.ClusterSpec{Claims: map[string]string{"id.k8s.io": "x", "region.open-cluster-management.io": "r"}})
	setStatus := func(p *cpv1alpha1.ClusterProfile) {
		p.Status.Version.Kubernetes = status.Version.Kubernetes
		for _, c := range status.ClusterClaims {
			p.Status.Properties = append(p.Status.Properties, cpv1alpha1.Property{Name: c.Name, Value: c.Value})
		}
		for _, c := range status.Conditions {
			meta.SetStatusCondition(&p.Status.Conditions, c)
		}
		if v.provider {
			p.Status.AccessProviders = []cpv1alpha1.AccessProvider{{Name: benchProvider, Cluster: clientcmdv1.Cluster{
				Server:                   "https://proxy.example:9092/" + p.Name,
				CertificateAuthorityData: []byte("-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIUbench\n-----END CERTIFICATE-----\n"),
			}}}
		}
	}
	var mu sync.Mutex
	done := make([]time.Time, 0, n)
	cpBefore := controlPlaneCPU()
	ownBefore, _ := fleet.ProcessCPUTime(os.Getpid())
	start := time.Now()
	err := parallel(n, workers, func(i int) error {
		p := &cpv1alpha1.ClusterProfile{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("floor-%05d", i), Labels: map[string]string{
				"x-k8s.io/cluster-manager": "floor", "open-cluster-management.io/cluster-name": "x", "multicluster.x-k8s.io/clusterset": "set-0",
			}},
			Spec: cpv1alpha1.ClusterProfileSpec{DisplayName: "x", ClusterManager: cpv1alpha1.ClusterManager{Name: "floor"}},
		}
		if v.statusInCreate {
			setStatus(p) // dropped by the server: status is a subresource
		}
		created, err := client.Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			return err
		}
		setStatus(created)
		if _, err = client.UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			return err
		}
		mu.Lock()
		done = append(done, time.Now())
		mu.Unlock()
		return nil
	})
	floorEnded = time.Now()
	d := floorEnded.Sub(start)
	cpUsed := controlPlaneCPU() - cpBefore
	ownAfter, _ := fleet.ProcessCPUTime(os.Getpid())
	floorTimeline = fmt.Sprintf("%s; CPU: kube-apiserver + etcd %s, the bench's process (the floor's client and the watch) %s",
		describeTimeline(start, done), cpUsed.Round(10*time.Millisecond), (ownAfter - ownBefore).Round(10*time.Millisecond))
	if err != nil {
		return 0, 0, fmt.Errorf("floor writes: %w", err)
	}
	if err := client.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		return 0, 0, err
	}
	return d, cpUsed, nil
}

func buildFleet(ctx context.Context, hub *fleet.Hub, nClusters, nNamespaces int) error {
	for i := range sets {
		if err := hub.CreateExclusiveSet(ctx, setName(i)); err != nil {
			return err
		}
	}
	if err := hub.CreateLabelSelectorSet(ctx, "all", &metav1.LabelSelector{}); err != nil {
		return err
	}
	if err := parallel(nClusters, 32, func(i int) error {
		_, err := hub.CreateCluster(ctx, fleet.ClusterSpec{
			Name:   clusterName(i),
			Labels: fleet.ExclusiveSetLabels(setName(i%sets), map[string]string{"region": fmt.Sprintf("r%d", i%5)}),
			Claims: map[string]string{"id.k8s.io": clusterName(i), "region.open-cluster-management.io": fmt.Sprintf("r%d", i%5)},
		})
		return err
	}); err != nil {
		return err
	}
	// Half the namespaces bind the four exclusive sets, half the {} set:
	// both cover every cluster.
	for n := range nNamespaces {
		ns := nsName(n)
		if err := hub.Namespace(ctx, ns); err != nil {
			return err
		}
		if n%2 == 0 {
			for i := range sets {
				if err := hub.Bind(ctx, ns, setName(i), true); err != nil {
					return err
				}
			}
		} else if err := hub.Bind(ctx, ns, "all", true); err != nil {
			return err
		}
	}
	return nil
}

// newProfileWatcher follows ClusterProfiles as a consumer would, through a
// watch: a profile counts once it has full status, and expectations wait
// for a cluster's clusterset label in every namespace.
func newProfileWatcher(ctx context.Context, cp *controlplane.ControlPlane, namespaces int) (*tracker, error) {
	hub, err := fleet.NewHub(cp.Config)
	if err != nil {
		return nil, err
	}
	t := newTracker(ctx, namespaces)
	f := cpinformers.NewSharedInformerFactory(hub.Profiles, 0)
	inf := f.Apis().V1alpha1().ClusterProfiles().Informer()
	observe := func(obj any) {
		if p, ok := obj.(*cpv1alpha1.ClusterProfile); ok {
			if p.Namespace == "floor" {
				if p.Status.Version.Kubernetes != "" {
					t.sawFloor()
				}
				return
			}
			complete := p.Status.Version.Kubernetes != "" && meta.FindStatusCondition(p.Status.Conditions, "ControlPlaneHealthy") != nil
			t.observe(p.Namespace, p.Name, p.Name, p.Labels["multicluster.x-k8s.io/clusterset"], complete)
		}
	}
	return t, t.run(f, inf, observe)
}

// metricLines joins the lines of a /metrics text that start with any of
// the prefixes.
func metricLines(metrics string, prefixes ...string) string {
	var parts []string
	for _, line := range strings.Split(metrics, "\n") {
		for _, p := range prefixes {
			if strings.HasPrefix(line, p) {
				parts = append(parts, strings.TrimPrefix(line, "hubsync_"))
			}
		}
	}
	return strings.Join(parts, ", ")
}
