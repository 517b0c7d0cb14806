package daemon

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
	clusterclient "open-cluster-management.io/api/client/cluster/clientset/versioned"
	msaclient "open-cluster-management.io/managed-serviceaccount/pkg/generated/clientset/versioned"
	cpclient "sigs.k8s.io/cluster-inventory-api/client/clientset/versioned"

	"github.com/hubsync/hubsync/bus"
	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/hubcache"
	"github.com/hubsync/hubsync/sinks"
	"github.com/hubsync/hubsync/stream"
	"github.com/hubsync/hubsync/syncer"
	"github.com/hubsync/hubsync/tunnel"
)

// The start steps, in the order Run calls them. Each builds or starts one
// part and leaves what shutdown needs to stop it in the daemon.

// connect makes the hub clients and the recorder of Kubernetes events.
func (d *daemon) connect(ctx context.Context) error {
	var err error
	if d.restCfg, err = restConfig(d.cfg.Hub, d.opts.Version); err != nil {
		return err
	}
	if d.kube, err = kubernetes.NewForConfig(d.restCfg); err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}
	if d.clusters, err = clusterclient.NewForConfig(d.restCfg); err != nil {
		return fmt.Errorf("cluster client: %w", err)
	}
	if d.profiles, err = cpclient.NewForConfig(d.restCfg); err != nil {
		return fmt.Errorf("cluster profile client: %w", err)
	}
	msas, err := msaclient.NewForConfig(d.restCfg)
	if err != nil {
		return fmt.Errorf("managed service account client: %w", err)
	}
	if d.cache, err = hubcache.New(hubcache.Clients{Kube: d.kube, Cluster: d.clusters, Profiles: d.profiles, MSA: msas},
		d.cfg.ResyncPeriod.Duration, d.reg); err != nil {
		return err
	}
	scheme, err := syncer.NewScheme()
	if err != nil {
		return err
	}
	// Not cancelled with ctx: a replica that drains still records Events
	// (its tunnels), and shutdown stops the broadcaster last.
	d.broadcaster = record.NewBroadcaster(record.WithContext(context.WithoutCancel(ctx)))
	d.broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: d.kube.CoreV1().Events("")})
	d.recorder = d.broadcaster.NewRecorder(scheme, corev1.EventSource{Component: "hubsync"})
	if d.identity, err = identity(); err != nil {
		return err
	}
	d.leader = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "hubsync_leader",
		Help: "1 while this replica holds the leader lease (always 1 without leader election).",
	})
	d.leaderInfo = &leaderInfo{}
	if err := d.reg.Register(d.leaderInfo); err != nil {
		return err
	}
	return d.reg.Register(d.leader)
}

// buildConsumers makes the change stream and its consumers, the bus and
// the sinks, and the tunnel pool, which every replica runs (it produces
// tunnel changes while this replica leads). Nothing is delivered until
// the work starts the fan-out.
func (d *daemon) buildConsumers(context.Context) error {
	var err error
	if d.fan, err = stream.NewFanout(d.log.With("component", "stream"), d.reg); err != nil {
		return err
	}
	if d.cfg.Tunnel.Enabled {
		d.pool, d.poolSrc, d.dialer, err = newTunnelPool(d.cfg, d.cache, leaderOnly{d}, leaderEvents{d},
			d.log.With("component", "tunnel"), d.reg)
		if err != nil {
			return err
		}
	}
	source := "hubsync/" + d.cfg.ClusterManager
	if d.cfg.BusEnabled() {
		if d.events, err = bus.New(d.cfg.Bus, source, d.log.With("component", "bus"), d.reg); err != nil {
			return err
		}
		if err := d.fan.Add(d.events.ConsumerOptions(), d.events); err != nil {
			return err
		}
	}
	dyn, err := dynamic.NewForConfig(d.restCfg)
	if err != nil {
		return fmt.Errorf("dynamic client: %w", err)
	}
	d.manager = sinks.NewManager(d.fan, sinks.Deps{Kube: d.kube, Cache: d.cache, Dynamic: dyn, Source: source, Log: d.log.With("component", "sinks"), Registerer: d.reg,
		ResyncPeriod: d.cfg.ResyncPeriod.Duration}, d.opts.Sinks)
	if res, err := d.manager.Apply(d.cfg.Sinks); err != nil {
		// The configuration is valid, so this is the environment (a
		// directory that cannot be created, say): report it, run the rest,
		// and try again at the next reload.
		d.log.Error("some sinks could not start; the others run", "failed", res.Failed, "err", err)
	}
	return nil
}

// serveHealth serves /healthz, /readyz and /metrics, unless turned off.
func (d *daemon) serveHealth(ctx context.Context) error {
	if d.cfg.Server.Address == config.ServerOff {
		return nil
	}
	var tunnels func() []tunnel.Status
	if d.pool != nil {
		tunnels = d.pool.Statuses
	}
	var busLines func(time.Time) []string
	if d.events != nil {
		busLines = d.events.HealthLines
	}
	srv, ln, err := newServer(d.cfg.Server.Address, d.cfg.Server.Pprof, d.reg, d.fan.Statuses, tunnels, d.contested, busLines, d.ready)
	if err != nil {
		return err
	}
	d.log.Info("serving metrics and health", "address", ln.Addr().String())
	d.health = newTask(context.WithoutCancel(ctx)) // /readyz says "draining" until the end
	d.goRun(d.health, "metrics server", func(ctx context.Context) error {
		return serve(ctx, srv, ln)
	})
	return nil
}

// ready is /readyz's answer: not while stopping, nor before the hub's APIs
// answer and the tunnel pool is warm; then ready on a standby, and on the
// leader once its caches have synced.
func (d *daemon) ready() (bool, string) {
	s := d.current.Load()
	switch {
	case d.draining.Load():
		return false, "draining: this replica is stopping"
	case s == nil:
		return false, "waiting for the hub's APIs"
	}
	if ok, why := d.warm(); !ok {
		return false, why
	}
	if d.events != nil {
		if ok, why := d.events.NodeReady(); !ok {
			return false, why
		}
	}
	switch {
	case s.Ready():
		return true, "ok"
	case d.cfg.LeaderElection.Enabled && !d.leading.Load():
		// A healthy standby is ready, so that rolling updates and several
		// replicas work; hubsync_leader tells who leads.
		return true, "standby"
	default:
		return false, "caches not synced yet"
	}
}

// contested lists the objects another controller writes too, as this
// replica's syncer knows them (none before it exists or while it stands
// by).
func (d *daemon) contested() []syncer.Contested {
	if s := d.current.Load(); s != nil {
		return s.Contested()
	}
	return nil
}

// waitForHub waits until the hub serves every API hubsync needs.
func (d *daemon) waitForHub(ctx context.Context) error {
	d.log.Info("hubsync starting", "version", d.opts.Version, "host", d.restCfg.Host, "clusterManager", d.cfg.ClusterManager,
		"workers", d.cfg.Workers.Topology, "qps", d.cfg.Hub.QPS, "burst", d.cfg.Hub.Burst)
	return waitForAPIs(ctx, d.kube, requiredAPIs, d.log)
}

// startCache runs the hub cache's informers: those the tunnel source and
// the sinks took while they were built, and every one taken later, as it
// is taken. Not before the hub serves the APIs, so that no informer
// starts by failing to list. Shutdown stops it, once every part has
// released what it held.
func (d *daemon) startCache(ctx context.Context) error {
	d.cache.Start(context.WithoutCancel(ctx))
	return nil
}

// startProbe probes the hub's /readyz in the background.
func (d *daemon) startProbe(ctx context.Context) error {
	p, err := newHubProbe(d.kube, probeInterval, d.log, d.reg)
	if err != nil {
		return err
	}
	d.probe = newTask(context.WithoutCancel(ctx))
	d.goRun(d.probe, "hub probe", p.run)
	return nil
}

// newSyncer builds the syncer; the work runs it.
func (d *daemon) newSyncer(context.Context) error {
	creds, err := credentialOptions(d.cfg, d.restCfg, d.kube, d.log)
	if err != nil {
		return err
	}
	c := d.cfg
	s, err := syncer.New(syncer.Clients{Kube: d.kube, Cluster: d.clusters, Profiles: d.profiles, Cache: d.cache}, syncer.Options{
		ClusterManager:  c.ClusterManager,
		Workers:         c.Workers.Topology,
		ResyncPeriod:    c.ResyncPeriod.Duration,
		RetryBase:       c.Retry.BaseDelay.Duration,
		RetryMax:        c.Retry.MaxDelay.Duration,
		RequestTimeout:  c.Hub.Timeout.Duration,
		AccessProviders: c.AccessProviders,
		Credentials:     creds,
		Notifier:        d.fan,
		ForeignWriters:  syncer.ForeignOptions{HoldOff: c.ForeignWriters.HoldOff.Duration, MaxHoldOff: c.ForeignWriters.MaxHoldOff.Duration},
	}, d.log, d.reg, d.recorder)
	if err != nil {
		return err
	}
	d.current.Store(s)
	return nil
}

// startReloader follows the configuration file, when there is one.
func (d *daemon) startReloader(ctx context.Context) error {
	if d.opts.ConfigPath == "" {
		return nil
	}
	r := newReloader(d.opts.ConfigPath, d.cfg, d.opts.Override, d.manager, d.log.With("component", "config"), d.reg)
	if d.events != nil {
		r.busConsumers = func(cs []config.BusConsumer) error { return d.events.SetConsumers(ctx, cs) }
	}
	d.reloader = newTask(ctx)
	d.goRun(d.reloader, "configuration reloader", func(ctx context.Context) error {
		r.run(ctx)
		return nil
	})
	return nil
}

// startWork runs the work: under the leader lease with leader election,
// else at once.
func (d *daemon) startWork(ctx context.Context) error {
	d.work = newTask(ctx)
	if !d.cfg.LeaderElection.Enabled {
		d.goRun(d.work, "the syncer", d.lead)
		return nil
	}
	d.goRun(d.work, "leader election", func(ctx context.Context) error {
		return runLeaderElected(ctx, d.cfg.LeaderElection, d.kube, d.identity, d.log, d.leaderInfo, d.lead)
	})
	return nil
}

// startBusNode starts the embedded NATS server on every replica, leader
// or not: the nodes of bus.embedded.cluster form one cluster whichever
// replica leads, and consumers reach any of them. Only the leader
// publishes (lead).
func (d *daemon) startBusNode(context.Context) error {
	if d.events == nil {
		return nil
	}
	if err := d.events.StartNode(); err != nil {
		return fmt.Errorf("event bus: %w", err)
	}
	return nil
}

// lead is what runs while this replica leads: the bus (only the leader
// publishes and writes the KV bucket), the fan-out to every consumer, the
// tunnel pool's changes and the syncer. It returns once the syncer, the
// producer of changes, has stopped; the pool's changes stop reaching the
// stream with it. The consumers outlive it: they run on a context of their
// own and stop in shutdown, after delivering what was notified.
func (d *daemon) lead(ctx context.Context) error {
	d.leading.Store(true)
	d.leader.Set(1)
	if !d.cfg.LeaderElection.Enabled {
		d.leaderInfo.set(d.identity)
	}
	defer func() { d.leading.Store(false); d.leader.Set(0) }()
	s := d.current.Load()
	consumers := context.WithoutCancel(ctx)
	if d.events != nil {
		if err := d.events.Start(consumers); err != nil {
			return fmt.Errorf("event bus: %w", err)
		}
		d.log.Info("event bus started", "url", bus.RedactURLs([]string{d.events.ClientURL()}), "stream", d.cfg.Bus.Stream.Name,
			"kvBucket", d.cfg.Bus.KVBucket)
	}
	d.fan.SetBusy(s.Busy)
	if err := d.fan.Start(consumers, s.Snapshot); err != nil {
		return err
	}
	if d.pool != nil {
		// The pool ran before this replica led: the stream hears where
		// every tunnel stands now.
		d.pool.Announce()
	}
	err := s.Run(ctx)
	d.flushBus()
	return err
}

// flushBus publishes what this leader's syncer notified before the lease
// is released (for up to drainTimeout), so that the next leader, which
// republishes the state it finds, never leaves a change of this one's
// out of the stream.
func (d *daemon) flushBus() {
	if d.events == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), drainTimeout)
	defer cancel()
	start := time.Now()
	if err := d.fan.FlushConsumer(ctx, d.events.ConsumerOptions().Name); err != nil {
		d.log.Warn("releasing the lease with events unpublished; the next leader republishes the current state", "err", err)
		return
	}
	d.log.Debug("events published before the lease is released", "took", time.Since(start))
}
