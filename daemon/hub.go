package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	msaclient "open-cluster-management.io/managed-serviceaccount/pkg/generated/clientset/versioned"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/syncer"
)

// restConfig is the hub client configuration: from hub.kubeconfig, else
// in-cluster.
func restConfig(hub config.Hub, version string) (*rest.Config, error) {
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
	cfg.UserAgent = "hubsync/" + version
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

// apiBackoff paces the checks of a hub that lacks an API: 1 s doubling to
// 30 s, with jitter so that replicas started together spread out.
func apiBackoff() wait.Backoff {
	return wait.Backoff{Duration: time.Second, Factor: 2, Jitter: 0.1, Cap: 30 * time.Second, Steps: 1 << 30}
}

// waitForAPIs waits until the hub serves every required resource, logging
// what is missing with growing intervals, so that a hub that is still
// coming up or lacks a CRD is reported clearly instead of as informer noise.
func waitForAPIs(ctx context.Context, kube kubernetes.Interface, required map[string][]string, log *slog.Logger) error {
	// DelayFunc keeps waiting the cap once it is reached, where
	// ExponentialBackoff would give up.
	return apiBackoff().DelayFunc().Until(ctx, true, true, func(context.Context) (bool, error) {
		missing, err := missingAPIs(kube, required)
		switch {
		case err != nil:
			log.Warn("cannot reach the hub API server; retrying", "err", err)
		case len(missing) > 0:
			log.Warn("the hub does not serve resources hubsync needs; install the CRDs (see docs/operations.md, Prerequisites); retrying",
				"missing", strings.Join(missing, ", "))
		}
		return err == nil && len(missing) == 0, nil
	})
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

var msaAPI = map[string][]string{"authentication.open-cluster-management.io/v1beta1": {"managedserviceaccounts"}}

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

// probeInterval is how often the hub's /readyz is probed, and each
// probe's timeout.
const probeInterval = 2 * time.Second

// hubProbe checks the hub API server's /readyz every interval and reports
// when it becomes unreachable and when it is back, with a gauge for
// alerts. Informers retry on their own; this makes an outage visible to
// operators.
type hubProbe struct {
	kube      kubernetes.Interface
	interval  time.Duration
	log       *slog.Logger
	reachable prometheus.Gauge
	failures  prometheus.Counter
}

func newHubProbe(kube kubernetes.Interface, interval time.Duration, log *slog.Logger, reg prometheus.Registerer) (*hubProbe, error) {
	p := &hubProbe{
		kube: kube, interval: interval, log: log,
		reachable: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "hubsync_hub_reachable",
			Help: "1 when the last probe of the hub API server's /readyz succeeded, else 0.",
		}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hubsync_hub_probe_failures_total",
			Help: "Failed probes of the hub API server's /readyz.",
		}),
	}
	for _, c := range []prometheus.Collector{p.reachable, p.failures} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("hub probe metrics: %w", err)
		}
	}
	p.reachable.Set(1)
	return p, nil
}

// run probes until ctx ends.
func (p *hubProbe) run(ctx context.Context) error {
	var downSince time.Time
	t := time.NewTicker(p.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(ctx, p.interval)
		err := p.kube.Discovery().RESTClient().Get().AbsPath("/readyz").Do(pctx).Error()
		cancel()
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			p.failures.Inc()
			p.reachable.Set(0)
			if downSince.IsZero() {
				downSince = time.Now()
				p.log.Warn("hub API server unreachable; hubsync keeps its state and retries", "err", err)
			}
		case !downSince.IsZero():
			p.reachable.Set(1)
			p.log.Info("hub API server reachable again; resuming", "after", time.Since(downSince).Round(time.Second))
			downSince = time.Time{}
		}
	}
}
