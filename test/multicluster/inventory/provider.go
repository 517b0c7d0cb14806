// Package inventory is a multicluster-runtime provider that engages the
// clusters ClusterProfiles describe, built for hubsync's proof on
// cluster-inventory-api's pkg/access.
//
// multicluster-runtime's own provider for the Cluster Inventory API lives
// in a module of its own, sigs.k8s.io/multicluster-runtime/providers/
// cluster-inventory-api, which the module proxy this project uses does not
// serve (neither v0.23.1 nor v0.24.0). This package is written anew, not
// copied, to reproduce that provider's behaviour as read in
// kubernetes-sigs/multicluster-runtime providers/cluster-inventory-api/
// provider.go (tag v0.23.1, commit 057a69d1244f; unchanged in behaviour up
// to d7413ad228b9, where only cluster names became multicluster.ClusterName)
// together with its kubeconfigstrategy/accessprovider.go, which builds the
// rest.Config with pkg/access BuildConfigFromCP:
//
//   - one reconcile at a time of every ClusterProfile, keyed
//     "<namespace>/<name>", on every event of the profile (no predicate);
//   - a profile that is gone: its cluster is forgotten and its context
//     cancelled (disengaged);
//   - a profile whose ControlPlaneHealthy condition is not True: requeued
//     after 10 s, and an engaged cluster is left engaged (upstream does not
//     disengage an unhealthy cluster);
//   - otherwise the rest.Config is built with BuildConfigFromCP; an engaged
//     cluster whose stored config is reflect.DeepEqual to the new one is
//     left alone, any other is torn down and built again: a new cluster,
//     its cache started and synced, then engaged with the manager.
//
// reflect.DeepEqual is never true for two configs holding a non-nil func,
// and BuildConfigFromCP always sets Proxy, so under upstream's rule every
// event of an engaged, healthy profile rebuilds its cluster. The provider
// counts what each reconcile decided under that rule and under one that
// sets func fields aside (Decisions, Stats), so that a test can tell
// rebuilds that a change of the profile called for from those that only
// upstream's comparison makes.
package inventory

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	cpv1alpha1 "sigs.k8s.io/cluster-inventory-api/apis/v1alpha1"
	"sigs.k8s.io/cluster-inventory-api/pkg/access"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	mcmanager "sigs.k8s.io/multicluster-runtime/pkg/manager"
	"sigs.k8s.io/multicluster-runtime/pkg/multicluster"
)

// notReadyRequeue is how soon upstream looks again at a profile that is
// not healthy.
const notReadyRequeue = 10 * time.Second

// Options configure a Provider.
type Options struct {
	// Access is the consumer's provider file, loaded with
	// access.NewFromFile. Required.
	Access *access.Config
	// ClusterOptions are passed to NewCluster.
	ClusterOptions []cluster.Option
	// NewCluster builds a cluster from a config; cluster.New when nil.
	NewCluster func(ctx context.Context, profile *cpv1alpha1.ClusterProfile, cfg *rest.Config, opts ...cluster.Option) (cluster.Cluster, error)
	// IsReady says whether a profile's cluster may be engaged; when nil,
	// its ControlPlaneHealthy condition must be True, as upstream's
	// default.
	IsReady func(ctx context.Context, profile *cpv1alpha1.ClusterProfile) bool
	// SameConfig decides whether an engaged cluster's config still holds;
	// UpstreamSameConfig (reflect.DeepEqual) when nil.
	SameConfig func(engaged, built *rest.Config) bool
	// Logger receives the provider's log lines.
	Logger logr.Logger
}

// Decision is what one reconcile of a ready profile decided.
type Decision struct {
	// Cluster is the cluster's name in the manager, "<namespace>/<name>".
	Cluster string
	At      time.Time
	// ResourceVersion is the profile version the reconcile read; From is
	// the version the engaged cluster had been built from, "" when there
	// was none.
	ResourceVersion, From string
	// Rebuilt: an engaged cluster was torn down and built again; a first
	// engagement has From == "" and Rebuilt false.
	Rebuilt bool
	// UpstreamDiffers is upstream's verdict (reflect.DeepEqual) on the
	// engaged and the new config; IgnoringFuncsDiffers the verdict of
	// SameConfigIgnoringFuncs; AccessChanged says whether the server or
	// the CA differ. All three are false for a first engagement.
	UpstreamDiffers, IgnoringFuncsDiffers, AccessChanged bool
}

// Stats are the provider's counters.
type Stats struct {
	// Engagements counts the engagements of each cluster; Rebuilds those
	// after the first, which tore an engaged cluster down.
	Engagements map[string]int
	Rebuilds    int
	// UpstreamWould and IgnoringFuncsWould count the reconciles of an
	// engaged cluster whose new config each rule finds different.
	UpstreamWould, IgnoringFuncsWould int
	// Disengaged counts clusters forgotten because their profile went.
	Disengaged int
}

// engagement is an engaged cluster and what it was built from.
type engagement struct {
	cluster cluster.Cluster
	cancel  context.CancelFunc
	cfg     *rest.Config
	version string
}

type index struct {
	obj     client.Object
	field   string
	extract client.IndexerFunc
}

// Provider is a multicluster.Provider over the ClusterProfiles of the
// manager's local cluster. Call SetupWithManager before the manager starts.
type Provider struct {
	opts   Options
	log    logr.Logger
	client client.Client

	mu       sync.RWMutex
	mgr      mcmanager.Manager
	clusters map[string]*engagement
	indexers []index
	stats    Stats
	// decisions and lastRead are for the test: every decision made, and
	// the last profile version each reconcile read per cluster.
	decisions []Decision
	lastRead  map[string]string
}

var _ multicluster.Provider = &Provider{}

// New returns a provider; it refuses options without a provider file.
func New(opts Options) (*Provider, error) {
	if opts.Access == nil {
		return nil, errors.New("inventory: Options.Access (the provider file) is required")
	}
	if opts.NewCluster == nil {
		opts.NewCluster = func(_ context.Context, _ *cpv1alpha1.ClusterProfile, cfg *rest.Config, o ...cluster.Option) (cluster.Cluster, error) {
			return cluster.New(cfg, o...)
		}
	}
	if opts.IsReady == nil {
		opts.IsReady = ControlPlaneHealthy
	}
	if opts.SameConfig == nil {
		opts.SameConfig = UpstreamSameConfig
	}
	return &Provider{
		opts:     opts,
		log:      opts.Logger.WithName("inventory-provider"),
		clusters: map[string]*engagement{},
		stats:    Stats{Engagements: map[string]int{}},
		lastRead: map[string]string{},
	}, nil
}

// ControlPlaneHealthy is upstream's default readiness: the profile's
// ControlPlaneHealthy condition is True.
func ControlPlaneHealthy(_ context.Context, p *cpv1alpha1.ClusterProfile) bool {
	c := meta.FindStatusCondition(p.Status.Conditions, cpv1alpha1.ClusterConditionControlPlaneHealthy)
	return c != nil && c.Status == metav1.ConditionTrue
}

// SetupWithManager registers the profile controller on the manager's local
// cluster: one worker, every event of every profile.
func (p *Provider) SetupWithManager(mgr mcmanager.Manager) error {
	if mgr == nil {
		return errors.New("inventory: manager is nil")
	}
	local := mgr.GetLocalManager()
	if local == nil {
		return errors.New("inventory: the manager has no local manager")
	}
	p.mu.Lock()
	p.mgr = mgr
	p.mu.Unlock()
	p.client = local.GetClient()
	err := builder.ControllerManagedBy(local).
		Named("clusterprofile-provider").
		For(&cpv1alpha1.ClusterProfile{}).
		WithOptions(controller.Options{MaxConcurrentReconciles: 1}).
		Complete(p)
	if err != nil {
		return fmt.Errorf("inventory: build the profile controller: %w", err)
	}
	return nil
}

// Get returns an engaged cluster.
func (p *Provider) Get(_ context.Context, name string) (cluster.Cluster, error) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if e, ok := p.clusters[name]; ok {
		return e.cluster, nil
	}
	return nil, multicluster.ErrClusterNotFound
}

// IndexField adds an index to every engaged cluster and every later one.
func (p *Provider) IndexField(ctx context.Context, obj client.Object, field string, extract client.IndexerFunc) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.indexers = append(p.indexers, index{obj: obj, field: field, extract: extract})
	for name, e := range p.clusters {
		if err := e.cluster.GetCache().IndexField(ctx, obj, field, extract); err != nil {
			return fmt.Errorf("inventory: index %q on cluster %s: %w", field, name, err)
		}
	}
	return nil
}

// Reconcile follows upstream's steps for one profile; see the package
// comment.
func (p *Provider) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	key := req.NamespacedName.String()
	log := p.log.WithValues("clusterprofile", key)
	profile := &cpv1alpha1.ClusterProfile{}
	if err := p.client.Get(ctx, req.NamespacedName, profile); err != nil {
		if apierrors.IsNotFound(err) {
			p.forget(key)
			log.Info("profile gone, cluster disengaged")
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, fmt.Errorf("get ClusterProfile %s: %w", key, err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.mgr == nil {
		return reconcile.Result{RequeueAfter: 2 * time.Second}, nil
	}
	if !p.opts.IsReady(ctx, profile) {
		log.V(1).Info("profile not healthy, requeued")
		return reconcile.Result{RequeueAfter: notReadyRequeue}, nil
	}
	cfg, err := p.opts.Access.BuildConfigFromCP(profile)
	if err != nil {
		return reconcile.Result{}, fmt.Errorf("build the config of ClusterProfile %s: %w", key, err)
	}
	p.lastRead[key] = profile.ResourceVersion
	d := Decision{Cluster: key, At: time.Now(), ResourceVersion: profile.ResourceVersion}
	if cur, ok := p.clusters[key]; ok {
		d.From = cur.version
		d.UpstreamDiffers = !UpstreamSameConfig(cur.cfg, cfg)
		d.IgnoringFuncsDiffers = !SameConfigIgnoringFuncs(cur.cfg, cfg)
		d.AccessChanged = AccessChanged(cur.cfg, cfg)
		p.count(d)
		if p.opts.SameConfig(cur.cfg, cfg) {
			p.decisions = append(p.decisions, d)
			return reconcile.Result{}, nil
		}
		log.Info("config changed, rebuilding the cluster", "from", cur.version, "to", profile.ResourceVersion)
		cur.cancel()
		delete(p.clusters, key)
		d.Rebuilt = true
	}
	p.decisions = append(p.decisions, d)
	return reconcile.Result{}, p.engageLocked(ctx, key, profile, cfg, d.Rebuilt)
}

// count adds a reconcile of an engaged cluster to the counters.
func (p *Provider) count(d Decision) {
	if d.UpstreamDiffers {
		p.stats.UpstreamWould++
	}
	if d.IgnoringFuncsDiffers {
		p.stats.IgnoringFuncsWould++
	}
}

// engageLocked builds a cluster from cfg, starts it, waits for its cache
// and engages it with the manager, as upstream does, holding p.mu all
// along (upstream holds its lock across the cache sync too).
func (p *Provider) engageLocked(ctx context.Context, key string, profile *cpv1alpha1.ClusterProfile, cfg *rest.Config, rebuild bool) error {
	cl, err := p.opts.NewCluster(ctx, profile, cfg, p.opts.ClusterOptions...)
	if err != nil {
		return fmt.Errorf("create the cluster of ClusterProfile %s: %w", key, err)
	}
	for _, idx := range p.indexers {
		if err := cl.GetCache().IndexField(ctx, idx.obj, idx.field, idx.extract); err != nil {
			return fmt.Errorf("index %q on cluster %s: %w", idx.field, key, err)
		}
	}
	// The cluster lives as long as the provider's controller, unless the
	// profile goes or the cluster is rebuilt: like upstream, its context
	// derives from the reconcile's.
	clusterCtx, cancel := context.WithCancel(ctx)
	go func() {
		if err := cl.Start(clusterCtx); err != nil {
			p.log.Error(err, "cluster stopped", "clusterprofile", key)
		}
	}()
	if !cl.GetCache().WaitForCacheSync(ctx) {
		cancel()
		return fmt.Errorf("sync the cache of ClusterProfile %s", key)
	}
	p.clusters[key] = &engagement{cluster: cl, cancel: cancel, cfg: cfg, version: profile.ResourceVersion}
	if err := p.mgr.Engage(clusterCtx, key, cl); err != nil {
		cancel()
		delete(p.clusters, key)
		return fmt.Errorf("engage the cluster of ClusterProfile %s: %w", key, err)
	}
	p.stats.Engagements[key]++
	if rebuild {
		p.stats.Rebuilds++
	}
	p.log.Info("cluster engaged", "clusterprofile", key, "version", profile.ResourceVersion, "rebuild", rebuild)
	return nil
}

// forget disengages the cluster of a profile that is gone.
func (p *Provider) forget(key string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if e, ok := p.clusters[key]; ok {
		e.cancel()
		delete(p.clusters, key)
		p.stats.Disengaged++
	}
	delete(p.lastRead, key)
}

// Stats returns a copy of the counters.
func (p *Provider) Stats() Stats {
	p.mu.RLock()
	defer p.mu.RUnlock()
	s := p.stats
	s.Engagements = make(map[string]int, len(p.stats.Engagements))
	for k, v := range p.stats.Engagements {
		s.Engagements[k] = v
	}
	return s
}

// Decisions returns every decision made so far, oldest first.
func (p *Provider) Decisions() []Decision {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return append([]Decision(nil), p.decisions...)
}

// Engaged returns the engaged clusters, each with the profile version it
// was built from.
func (p *Provider) Engaged() map[string]string {
	p.mu.RLock()
	defer p.mu.RUnlock()
	out := make(map[string]string, len(p.clusters))
	for k, e := range p.clusters {
		out[k] = e.version
	}
	return out
}

// LastRead returns the profile version the last reconcile of a ready
// profile read for a cluster, "" when there was none.
func (p *Provider) LastRead(key string) string {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.lastRead[key]
}
