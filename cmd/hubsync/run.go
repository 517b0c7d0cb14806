package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"regexp"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	clusterclient "open-cluster-management.io/api/client/cluster/clientset/versioned"
	msaclient "open-cluster-management.io/managed-serviceaccount/pkg/generated/clientset/versioned"
	cpclient "sigs.k8s.io/cluster-inventory-api/client/clientset/versioned"

	"github.com/hubsync/hubsync/bus"
	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/sinks"
	"github.com/hubsync/hubsync/stream"
	"github.com/hubsync/hubsync/syncer"
	"github.com/hubsync/hubsync/tunnel"
)

func runCommand(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	configPath := fs.String("config", "", "configuration file (defaults apply when empty)")
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig of the hub; overrides hub.kubeconfig (default: in-cluster)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		fmt.Fprintf(stderr, "hubsync run: unexpected arguments %v\n", fs.Args())
		return errUsage
	}
	cfg := config.Default()
	if *configPath != "" {
		var err error
		if cfg, err = config.Load(*configPath); err != nil {
			return fmt.Errorf("%s: %w", *configPath, err)
		}
	}
	override := func(c *config.Config) {
		if *kubeconfig != "" {
			c.Hub.Kubeconfig = *kubeconfig
		}
	}
	override(cfg)
	log := newLogger(cfg.Logging, stderr)
	// client-go logs through klog; send them to the same structured log.
	klog.SetLogger(logr.FromSlogHandler(log.Handler()))
	for _, w := range cfg.Warnings() {
		log.Warn("configuration: " + w)
	}
	return Run(ctx, cfg, log, RunOptions{ConfigPath: *configPath, Override: override})
}

// RunOptions say where the configuration came from, so that Run can
// reload it.
type RunOptions struct {
	// ConfigPath is the file cfg was loaded from; empty: no reloads.
	ConfigPath string
	// Override applies command-line flags to a reloaded configuration.
	Override func(*config.Config)
}

func newLogger(c config.Logging, w io.Writer) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(c.Level))
	opts := &slog.HandlerOptions{Level: level}
	if c.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// Run runs the daemon until ctx is cancelled.
func Run(ctx context.Context, cfg *config.Config, log *slog.Logger, ro RunOptions) error {
	restCfg, err := restConfig(cfg.Hub)
	if err != nil {
		return err
	}
	kube, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}
	clusters, err := clusterclient.NewForConfig(restCfg)
	if err != nil {
		return fmt.Errorf("cluster client: %w", err)
	}
	profiles, err := cpclient.NewForConfig(restCfg)
	if err != nil {
		return fmt.Errorf("cluster profile client: %w", err)
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(
		// go_gc_heap_live_bytes, the heap the last GC kept: what the
		// daemon holds, where RSS also counts the garbage the next GC
		// frees and free pages not yet returned to the OS.
		collectors.WithGoCollectorRuntimeMetrics(collectors.GoRuntimeMetricsRule{Matcher: regexp.MustCompile(`^/gc/heap/live:bytes$`)}),
	), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	scheme, err := syncer.NewScheme()
	if err != nil {
		return err
	}
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	defer broadcaster.Shutdown()
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: kube.CoreV1().Events("")})
	recorder := broadcaster.NewRecorder(scheme, corev1.EventSource{Component: "hubsync"})

	leader := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "hubsync_leader",
		Help: "1 while this replica holds the leader lease (always 1 without leader election).",
	})
	reg.MustRegister(leader)
	var leading atomic.Bool
	// The syncer exists once the hub serves the APIs it needs; until then
	// /healthz answers and /readyz says why it is not ready.
	var current atomic.Pointer[syncer.Syncer]
	// The change stream: the syncer notifies it, and it delivers to the
	// bus and every sink, each through its own queue.
	fan, err := stream.NewFanout(log.With("component", "stream"), reg)
	if err != nil {
		return err
	}
	// The tunnel pool, when configured: one more consumer of the stream
	// (profiles say which clusters to keep warm) and a producer of
	// tunnel events.
	var pool *tunnel.Pool
	var poolSource *tunnel.Source
	if cfg.Tunnel.Enabled {
		if pool, poolSource, err = newTunnelPool(cfg, clusters, kube, fan, recorder, log.With("component", "tunnel"), reg); err != nil {
			return err
		}
		if err := fan.Add(pool.ConsumerOptions(), pool); err != nil {
			return err
		}
	}
	var tunnelStatuses func() []tunnel.Status
	if pool != nil {
		tunnelStatuses = pool.Statuses
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	serverErr := make(chan error, 1)
	if cfg.Server.Address != config.ServerOff {
		srv, ln, err := newServer(cfg.Server.Address, cfg.Server.Pprof, reg, fan.Statuses, tunnelStatuses, func() (bool, string) {
			s := current.Load()
			switch {
			case s == nil:
				return false, "waiting for the hub's APIs"
			case s.Ready():
				return true, "ok"
			case cfg.LeaderElection.Enabled && !leading.Load():
				// A healthy standby is ready, so that rolling updates and
				// several replicas work; hubsync_leader tells who leads.
				return true, "standby"
			default:
				return false, "caches not synced yet"
			}
		})
		if err != nil {
			return err
		}
		log.Info("serving metrics and health", "address", ln.Addr().String())
		go func() { serverErr <- srv.Serve(ln) }()
		defer func() {
			shutdownCtx, done := context.WithTimeout(context.Background(), 5*time.Second)
			defer done()
			_ = srv.Shutdown(shutdownCtx)
		}()
	}

	log.Info("hubsync starting", "version", buildVersion(), "host", restCfg.Host, "clusterManager", cfg.ClusterManager,
		"workers", cfg.Workers.Topology, "qps", cfg.Hub.QPS, "burst", cfg.Hub.Burst)
	if err := waitForAPIs(ctx, kube, requiredAPIs, log); err != nil {
		return err
	}
	go probeHub(ctx, kube, 2*time.Second, log, reg)
	// The gateway serves from the start; it answers 503 until the pool
	// runs here (on the leader).
	var poolRunning atomic.Bool
	var gatewayErr <-chan error
	if cfg.Gateway.Enabled && pool != nil {
		serving := func() (bool, string) {
			switch {
			case poolRunning.Load():
				return true, ""
			case cfg.LeaderElection.Enabled && !leading.Load():
				return false, "it is a standby; the leader serves"
			default:
				return false, "the tunnel pool is starting"
			}
		}
		if gatewayErr, err = startGateway(ctx, cfg, restCfg, pool, serving, log.With("component", "gateway"), reg); err != nil {
			return err
		}
	}
	creds, err := credentialOptions(cfg, restCfg, kube, log)
	if err != nil {
		return err
	}
	source := "hubsync/" + cfg.ClusterManager
	var events *bus.Bus
	if cfg.BusEnabled() {
		if events, err = bus.New(cfg.Bus, source, log.With("component", "bus"), reg); err != nil {
			return err
		}
		if err := fan.Add(events.ConsumerOptions(), events); err != nil {
			return err
		}
	}
	manager := sinks.NewManager(fan, sinks.Deps{Kube: kube, Source: source, Log: log.With("component", "sinks"), Registerer: reg,
		ResyncPeriod: cfg.ResyncPeriod.Duration}, sinkFactories())
	if res, err := manager.Apply(cfg.Sinks); err != nil {
		// The configuration is valid, so this is the environment (a
		// directory that cannot be created, say): report it, run the rest,
		// and try again at the next reload.
		log.Error("some sinks could not start; the others run", "failed", res.Failed, "err", describe(err))
	}
	defer func() {
		// Deliver what is queued for a few seconds, then close every
		// consumer.
		drain, done := context.WithTimeout(context.Background(), 3*time.Second)
		defer done()
		if err := fan.Close(drain); err != nil {
			log.Warn("stopping with changes undelivered; the next start resyncs every sink", "err", err)
		}
		if err := manager.Close(); err != nil {
			log.Warn("closing sinks", "err", err)
		}
		if events != nil {
			if err := events.Close(); err != nil {
				log.Warn("closing the event bus", "err", err)
			}
		}
	}()
	if ro.ConfigPath != "" {
		go newReloader(ro.ConfigPath, cfg, ro.Override, manager, log.With("component", "config"), reg).run(ctx)
	}
	// work runs while this replica leads: the bus (only the leader
	// publishes and writes the KV bucket), the sinks and the syncer.
	work := func(ctx context.Context, s *syncer.Syncer) error {
		if events != nil {
			if err := events.Start(ctx); err != nil {
				return fmt.Errorf("event bus: %w", err)
			}
			log.Info("event bus started", "url", bus.RedactURLs([]string{events.ClientURL()}), "stream", cfg.Bus.Stream.Name, "kvBucket", cfg.Bus.KVBucket)
		}
		fan.SetBusy(s.Busy)
		if err := fan.Start(ctx, s.Snapshot); err != nil {
			return err
		}
		if pool != nil {
			defer pool.Close()
			if err := poolSource.Run(ctx); err != nil {
				return err
			}
			pool.Start(ctx)
			poolRunning.Store(true)
			defer poolRunning.Store(false)
			log.Info("tunnel pool started", "transport", cfg.Tunnel.Transport, "managedServiceAccount", cfg.Tunnel.ManagedServiceAccount,
				"probeInterval", cfg.Tunnel.ProbeInterval.Duration)
		}
		return s.Run(ctx)
	}
	s, err := syncer.New(syncer.Clients{Kube: kube, Cluster: clusters, Profiles: profiles}, syncer.Options{
		ClusterManager:  cfg.ClusterManager,
		Workers:         cfg.Workers.Topology,
		ResyncPeriod:    cfg.ResyncPeriod.Duration,
		RetryBase:       cfg.Retry.BaseDelay.Duration,
		RetryMax:        cfg.Retry.MaxDelay.Duration,
		RequestTimeout:  cfg.Hub.Timeout.Duration,
		AccessProviders: cfg.AccessProviders,
		Credentials:     creds,
		Notifier:        fan,
	}, log, reg, recorder)
	if err != nil {
		return err
	}

	current.Store(s)

	runErr := make(chan error, 1)
	go func() {
		if cfg.LeaderElection.Enabled {
			runErr <- runLeaderElected(ctx, cfg.LeaderElection, kube, log, func(ctx context.Context) error {
				leading.Store(true)
				leader.Set(1)
				defer leader.Set(0)
				return work(ctx, s)
			})
			return
		}
		leading.Store(true)
		leader.Set(1)
		runErr <- work(ctx, s)
	}()
	select {
	case err := <-runErr:
		return err
	case err := <-serverErr:
		cancel()
		<-runErr
		return fmt.Errorf("metrics server: %w", err)
	case err := <-gatewayErr:
		cancel()
		if rerr := <-runErr; err == nil {
			return rerr
		}
		return err
	}
}

// credentialOptions turns credential copies on when configured and the hub
// serves the ManagedServiceAccount API. A hub without the
// managed-serviceaccount addon still gets its profiles: copies are off,
// with a warning, rather than hubsync waiting for an API that may never come.
func credentialOptions(cfg *config.Config, restCfg *rest.Config, kube kubernetes.Interface, log *slog.Logger) (*syncer.CredentialOptions, error) {
	if !cfg.CredentialsEnabled() {
		return nil, nil
	}
	missing, err := missingAPIs(kube, msaAPI)
	if err != nil {
		return nil, err
	}
	if len(missing) > 0 {
		log.Warn("the hub does not serve ManagedServiceAccounts (managed-serviceaccount addon not installed?); credential copies are off until hubsync is restarted with it installed, or set credentials.enabled: false",
			"missing", strings.Join(missing, ", "))
		return nil, nil
	}
	msas, err := msaclient.NewForConfig(restCfg)
	if err != nil {
		return nil, fmt.Errorf("managed service account client: %w", err)
	}
	return &syncer.CredentialOptions{
		Client: msas, Workers: cfg.Credentials.Workers, Coalesce: cfg.Credentials.Coalesce.Duration,
		Impersonator: cfg.ImpersonatingMSA(),
	}, nil
}

var msaAPI = map[string][]string{"authentication.open-cluster-management.io/v1beta1": {"managedserviceaccounts"}}

func restConfig(hub config.Hub) (*rest.Config, error) {
	var cfg *rest.Config
	var err error
	if hub.Kubeconfig == "" {
		cfg, err = rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("no hub.kubeconfig or --kubeconfig given and not running in a cluster: %w", err)
		}
	} else {
		rules := &clientcmd.ClientConfigLoadingRules{ExplicitPath: hub.Kubeconfig}
		overrides := &clientcmd.ConfigOverrides{CurrentContext: hub.Context}
		cfg, err = clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides).ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("load kubeconfig %s: %w", hub.Kubeconfig, err)
		}
	}
	cfg.QPS = hub.QPS
	cfg.Burst = hub.Burst
	// No cfg.Timeout: it would become the HTTP client's timeout and cut
	// every informer's watch. Each write gets hub.timeout as its deadline
	// instead (syncer.Options.RequestTimeout).
	cfg.UserAgent = "hubsync/" + buildVersion()
	// Impersonation is never taken from a kubeconfig: hubsync acts as itself.
	cfg.Impersonate = rest.ImpersonationConfig{}
	return cfg, nil
}

// requiredAPIs are the resources hubsync cannot work without.
var requiredAPIs = map[string][]string{
	"multicluster.x-k8s.io/v1alpha1":             {"clusterprofiles"},
	"cluster.open-cluster-management.io/v1":      {"managedclusters"},
	"cluster.open-cluster-management.io/v1beta2": {"managedclustersets", "managedclustersetbindings"},
}

// waitForAPIs waits until the hub serves every required resource, logging
// what is missing with growing intervals, so that a hub that is still
// coming up or lacks a CRD is reported clearly instead of as informer noise.
func waitForAPIs(ctx context.Context, kube kubernetes.Interface, required map[string][]string, log *slog.Logger) error {
	backoff := wait.Backoff{Duration: time.Second, Factor: 2, Cap: 30 * time.Second, Steps: 1 << 30}
	for {
		missing, err := missingAPIs(kube, required)
		if err == nil && len(missing) == 0 {
			return nil
		}
		if err != nil {
			log.Warn("cannot reach the hub API server; retrying", "err", err)
		} else {
			log.Warn("the hub does not serve resources hubsync needs; install the CRDs (see README); retrying",
				"missing", strings.Join(missing, ", "))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff.Step()):
		}
	}
}

func missingAPIs(kube kubernetes.Interface, required map[string][]string) ([]string, error) {
	var missing []string
	for gv, resources := range required {
		list, err := kube.Discovery().ServerResourcesForGroupVersion(gv)
		served := map[string]bool{}
		if err == nil {
			for _, r := range list.APIResources {
				served[r.Name] = true
			}
		} else if !apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("discover %s: %w", gv, err)
		}
		for _, r := range resources {
			if !served[r] {
				missing = append(missing, r+"."+gv)
			}
		}
	}
	sort.Strings(missing)
	return missing, nil
}

func newServer(addr string, withPprof bool, reg *prometheus.Registry, sinkStatuses func() []stream.Status,
	tunnelStatuses func() []tunnel.Status, ready func() (bool, string)) (*http.Server, net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, fmt.Errorf("listen on %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		ok, why := ready()
		code := http.StatusOK
		if !ok {
			code = http.StatusServiceUnavailable
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(code)
		_, _ = io.WriteString(w, why+"\n")
		// A sink that is failing never makes hubsync unready (restarting
		// it would not help the sink): it is only reported here.
		if r.URL.Query().Has("verbose") && sinkStatuses != nil {
			for _, s := range sinkStatuses() {
				state := "ok"
				if !s.Healthy {
					state = fmt.Sprintf("failing (%d attempts): %s", s.Failures, s.LastError)
				}
				fmt.Fprintf(w, "sink %s (%s): %s, %d queued\n", s.Name, s.Type, state, s.QueueDepth)
			}
		}
		// Nor does a cluster that cannot be reached.
		if r.URL.Query().Has("verbose") && tunnelStatuses != nil {
			writeTunnelStatuses(w, tunnelStatuses(), time.Now())
		}
	})
	if withPprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	return &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}, ln, nil
}

// runLeaderElected runs fn while this replica holds the lease. Losing the
// lease ends the process's work: fn's context is cancelled and an error is
// returned so the pod restarts and rejoins the election with clean caches.
func runLeaderElected(ctx context.Context, c config.LeaderElection, kube kubernetes.Interface, log *slog.Logger, fn func(context.Context) error) error {
	host, err := os.Hostname()
	if err != nil {
		return fmt.Errorf("leader election identity: %w", err)
	}
	// The suffix keeps two processes on one host (or a restarted pod that
	// kept its name) from both believing they hold the lease.
	id := host + "_" + string(uuid.NewUUID())
	lock, err := resourcelock.New(resourcelock.LeasesResourceLock, c.Namespace, c.Name,
		kube.CoreV1(), kube.CoordinationV1(), resourcelock.ResourceLockConfig{Identity: id})
	if err != nil {
		return fmt.Errorf("leader election lock: %w", err)
	}
	result := make(chan error, 1)
	lost := errors.New("leader election lost")
	leaderelection.RunOrDie(ctx, leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   c.LeaseDuration.Duration,
		RenewDeadline:   c.RenewDeadline.Duration,
		RetryPeriod:     c.RetryPeriod.Duration,
		ReleaseOnCancel: true,
		Name:            c.Name,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				log.Info("became leader", "lease", c.Namespace+"/"+c.Name, "identity", id)
				result <- fn(ctx)
			},
			OnStoppedLeading: func() {
				log.Info("stopped leading", "lease", c.Namespace+"/"+c.Name)
			},
			OnNewLeader: func(leader string) {
				if leader != id {
					log.Info("another replica leads; standing by", "lease", c.Namespace+"/"+c.Name, "leader", leader)
				}
			},
		},
	})
	select {
	case err := <-result:
		if err == nil && ctx.Err() == nil {
			return lost
		}
		return err
	default:
		if ctx.Err() != nil {
			return nil
		}
		return lost
	}
}
