// Package syncer keeps consumer namespaces' ClusterProfiles in step with the
// hub's ManagedClusters, ManagedClusterSets and ManagedClusterSetBindings.
//
// It is level-based: informer events only name the cluster to look at; a
// worker recomputes that cluster's desired profiles from the informer caches
// and converges the hub to them, writing only what differs.
//
// Owns: the informers, the work queues and the one worker loop, the pure
// plans (desired.go, credentials_plan.go) and the thin writers that apply
// them, and the Changes it emits. It knows no consumer. May import config,
// stream and hub only; no consumer imports it.
package syncer

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"
	clusterclient "open-cluster-management.io/api/client/cluster/clientset/versioned"
	clusterlisterv1 "open-cluster-management.io/api/client/cluster/listers/cluster/v1"
	clusterlisterv1beta2 "open-cluster-management.io/api/client/cluster/listers/cluster/v1beta2"
	clusterv1 "open-cluster-management.io/api/cluster/v1"
	clusterv1beta2 "open-cluster-management.io/api/cluster/v1beta2"
	cpv1alpha1 "sigs.k8s.io/cluster-inventory-api/apis/v1alpha1"
	cpclient "sigs.k8s.io/cluster-inventory-api/client/clientset/versioned"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/hub"
	"github.com/hubsync/hubsync/hubcache"
	"github.com/hubsync/hubsync/stream"
)

// Indexer names.
const (
	byClusterSetLabel = "clusterSetLabel" // ManagedCluster -> its clusterset label value
	bySelectorType    = "selectorType"    // ManagedClusterSet -> selector type ("" for exclusive)
	bySetName         = "clusterSet"      // ManagedClusterSetBinding -> spec.clusterSet
	byName            = "name"            // ClusterProfile -> name (the cluster's name)
)

// Clients are the hub API clients the syncer uses, and the hub cache it
// reads through: the process's shared one, or nil for one of its own.
type Clients struct {
	Kube     kubernetes.Interface
	Cluster  clusterclient.Interface
	Profiles cpclient.Interface
	Cache    *hubcache.Cache
}

// Options tune the syncer; config.Config supplies them in the daemon.
type Options struct {
	// ClusterManager is the manager name on every profile hubsync writes.
	ClusterManager string
	// Workers is the number of clusters reconciled at once.
	Workers int
	// ResyncPeriod replays every informer's cache to repair missed events.
	ResyncPeriod time.Duration
	// RetryBase and RetryMax bound the per-cluster backoff after a failure.
	RetryBase, RetryMax time.Duration
	// RequestTimeout bounds each write to the hub.
	RequestTimeout time.Duration
	// AccessProviders are written into every profile's status.
	AccessProviders []config.AccessProvider
	// Credentials, when set, turns on credential copies.
	Credentials *CredentialOptions
	// Notifier receives every change hubsync makes (nil: none).
	Notifier stream.Notifier
	// ForeignWriters tunes the hold-off from objects another controller
	// writes too.
	ForeignWriters ForeignOptions
}

// Syncer projects ClusterProfiles into consumer namespaces.
type Syncer struct {
	clients  Clients
	opts     Options
	log      *slog.Logger
	recorder record.EventRecorder
	metrics  *metrics
	writes   *writeTracker
	notifier stream.Notifier
	notified *notifiedState
	foreign  *foreignReporter

	// cache is the hub cache the syncer takes its informers from while
	// it runs; ownCache when it made the cache itself (Clients.Cache nil).
	cache    *hubcache.Cache
	ownCache bool
	// holds are the informers taken by watch, released when Run ends.
	holds                                    hubcache.Holds
	hClusters, hSets, hBindings, hNamespaces *hubcache.Informer
	profiles                                 *hubcache.Informer

	clusters   clusterlisterv1.ManagedClusterLister
	clusterIdx cache.Indexer
	setLister  clusterlisterv1beta2.ManagedClusterSetLister
	setIdx     cache.Indexer
	bindingIdx cache.Indexer
	profileIdx cache.Indexer
	namespaces corelisters.NamespaceLister
	synced     []cache.InformerSynced

	providers *providerSet
	creds     *credentials
	consumers *consumerStats

	queue *trackedQueue
	ready atomic.Bool
	// converging is set by Busy when a burst starts and cleared once the
	// syncer is idle again.
	converging atomic.Bool

	mu          sync.Mutex
	conflicts   map[string]string // "ns/name" -> the cluster whose profile it blocks
	invalidSets map[string]string // set name -> resourceVersion reported
}

// New builds a syncer and its informers; Run starts them.
func New(clients Clients, opts Options, log *slog.Logger, reg prometheus.Registerer, recorder record.EventRecorder) (*Syncer, error) {
	opts, err := checkOptions(opts)
	if err != nil {
		return nil, err
	}
	s := &Syncer{
		clients:     clients,
		opts:        opts,
		log:         log,
		recorder:    recorder,
		metrics:     newMetrics(reg),
		writes:      newWriteTracker(30 * time.Second),
		notifier:    opts.Notifier,
		notified:    newNotifiedState(time.Minute),
		conflicts:   map[string]string{},
		invalidSets: map[string]string{},
	}
	s.queue = newTrackedQueue(opts.RetryBase, opts.RetryMax)
	s.metrics.queueDepth.track("topology", s.queue.Len)
	s.foreign = &foreignReporter{
		writers: newForeignWriters(clock.RealClock{}, opts.ForeignWriters),
		log:     log, recorder: recorder, total: s.metrics.foreignWrites, requestTimeout: opts.RequestTimeout,
	}
	s.metrics.contested.track(s.foreign.contested)
	s.consumers = newConsumerStats(opts.ClusterManager, s.ready.Load, opts.Credentials != nil)
	reg.MustRegister(s.consumers)
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "hubsync_profiles_managed",
		Help: "ClusterProfiles carrying hubsync's cluster-manager label, as seen by its cache.",
	}, s.countOwned))

	providers, err := s.newProviderSet(opts.AccessProviders)
	if err != nil {
		return nil, err
	}
	s.providers = providers
	if s.cache = clients.Cache; s.cache == nil {
		hc := hubcache.Clients{Kube: clients.Kube, Cluster: clients.Cluster, Profiles: clients.Profiles}
		if opts.Credentials != nil {
			hc.MSA = opts.Credentials.Client
		}
		if s.cache, err = hubcache.New(hc, opts.ResyncPeriod, nil); err != nil {
			return nil, err
		}
		s.ownCache = true
	}
	if opts.Credentials != nil {
		if s.creds, err = newCredentials(s.credentialDeps(), opts.Credentials, reg); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// checkOptions refuses options config did not fill (config owns every
// default) and makes a nil Notifier one that drops changes.
func checkOptions(opts Options) (Options, error) {
	var missing []string
	if opts.ClusterManager == "" {
		missing = append(missing, "ClusterManager")
	}
	if opts.Workers <= 0 {
		missing = append(missing, "Workers")
	}
	if opts.RetryBase <= 0 || opts.RetryMax < opts.RetryBase {
		missing = append(missing, "RetryBase, RetryMax")
	}
	if opts.RequestTimeout <= 0 {
		missing = append(missing, "RequestTimeout")
	}
	if f := opts.ForeignWriters; f.HoldOff <= 0 || f.MaxHoldOff < f.HoldOff {
		missing = append(missing, "ForeignWriters")
	}
	if len(missing) > 0 {
		return opts, fmt.Errorf("syncer: %s not set (config.SetDefaults fills them)", strings.Join(missing, ", "))
	}
	if opts.Notifier == nil {
		opts.Notifier = stream.Nop{}
	}
	return opts, nil
}

// watch takes the informers the syncer reads from the hub cache, with
// their indexes and handlers (and the credentials controller's and the
// access providers' CA Secrets'), and returns what tells they have
// synced. Run releases them when it ends: an informer another part still
// holds (the tunnel's ManagedClusters, ClusterProfiles and token Secrets)
// keeps running, without the syncer's handlers.
func (s *Syncer) watch() (caSynced []cache.InformerSynced, err error) {
	s.synced, s.holds = nil, nil
	if err := s.newInformers(); err != nil {
		return nil, err
	}
	if err := s.addHandlers(); err != nil {
		return nil, err
	}
	if s.creds != nil {
		s.creds.profiles = s.profiles
		s.creds.namespaces = s.namespaces
		held, err := s.creds.watch(s.cache)
		s.holds = append(s.holds, held...)
		if err != nil {
			return nil, err
		}
		s.synced = append(s.synced, s.creds.synced...)
	}
	held, caSynced, err := s.providers.watch(s)
	s.holds = append(s.holds, held...)
	return caSynced, err
}

// hold takes an informer from the hub cache and keeps the hold for
// release.
func (s *Syncer) hold(take func() (*hubcache.Informer, error)) (*hubcache.Informer, error) {
	i, err := take()
	if err != nil {
		return nil, err
	}
	s.holds = append(s.holds, i)
	return i, nil
}

// addIndexers adds the indexes inf lacks: a shared informer keeps the
// indexes a holder added before.
func addIndexers(inf cache.SharedIndexInformer, indexers cache.Indexers) error {
	have := inf.GetIndexer().GetIndexers()
	missing := cache.Indexers{}
	for name, f := range indexers {
		if _, ok := have[name]; !ok {
			missing[name] = f
		}
	}
	if len(missing) == 0 {
		return nil
	}
	if err := inf.AddIndexers(missing); err != nil {
		return fmt.Errorf("add indexer: %w", err)
	}
	return nil
}

// newInformers takes the topology's informers, adds the indexes the
// reconcilers look up by, and keeps their listers.
func (s *Syncer) newInformers() error {
	var err error
	if s.hClusters, err = s.hold(s.cache.ManagedClusters); err != nil {
		return err
	}
	if s.hSets, err = s.hold(s.cache.ManagedClusterSets); err != nil {
		return err
	}
	if s.hBindings, err = s.hold(s.cache.ManagedClusterSetBindings); err != nil {
		return err
	}
	if s.profiles, err = s.hold(s.cache.ClusterProfiles); err != nil {
		return err
	}
	if s.hNamespaces, err = s.hold(s.cache.Namespaces); err != nil {
		return err
	}
	indexers := []struct {
		inf     cache.SharedIndexInformer
		indexer cache.Indexers
	}{
		{s.hClusters.Informer(), cache.Indexers{byClusterSetLabel: indexFunc(func(c *clusterv1.ManagedCluster) []string {
			if v, ok := c.Labels[hub.LabelClusterSet]; ok {
				return []string{v}
			}
			return nil
		})}},
		{s.hSets.Informer(), cache.Indexers{bySelectorType: indexFunc(func(set *clusterv1beta2.ManagedClusterSet) []string {
			return []string{string(set.Spec.ClusterSelector.SelectorType)}
		})}},
		{s.hBindings.Informer(), cache.Indexers{bySetName: indexFunc(func(b *clusterv1beta2.ManagedClusterSetBinding) []string {
			return []string{b.Spec.ClusterSet}
		})}},
		{s.profiles.Informer(), cache.Indexers{byName: indexFunc(func(p *cpv1alpha1.ClusterProfile) []string {
			return []string{p.Name}
		})}},
	}
	for _, i := range indexers {
		if err := addIndexers(i.inf, i.indexer); err != nil {
			return err
		}
	}

	s.clusterIdx = s.hClusters.Informer().GetIndexer()
	s.clusters = clusterlisterv1.NewManagedClusterLister(s.clusterIdx)
	s.setIdx = s.hSets.Informer().GetIndexer()
	s.setLister = clusterlisterv1beta2.NewManagedClusterSetLister(s.setIdx)
	s.bindingIdx = s.hBindings.Informer().GetIndexer()
	s.profileIdx = s.profiles.Informer().GetIndexer()
	s.namespaces = corelisters.NewNamespaceLister(s.hNamespaces.Informer().GetIndexer())
	return nil
}

// addHandlers routes every informer event to the clusters it concerns.
func (s *Syncer) addHandlers() error {
	handlers := []struct {
		inf *hubcache.Informer
		h   cache.ResourceEventHandler
	}{
		{s.hClusters, cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { s.enqueueObjectName(obj) },
			UpdateFunc: func(_, obj any) { s.enqueueObjectName(obj) },
			DeleteFunc: func(obj any) { s.enqueueObjectName(obj) },
		}},
		{s.hSets, cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { s.onSet(nil, obj) },
			UpdateFunc: func(old, obj any) { s.onSet(old, obj) },
			DeleteFunc: func(obj any) { s.onSet(obj, nil) },
		}},
		{s.hBindings, cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { s.onBinding(obj) },
			UpdateFunc: func(old, obj any) { s.onBinding(old); s.onBinding(obj) },
			DeleteFunc: func(obj any) { s.onBinding(obj) },
		}},
		{s.profiles, cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { s.enqueueObjectName(obj) },
			UpdateFunc: func(_, obj any) { s.enqueueObjectName(obj) },
			DeleteFunc: s.onProfileDeleted,
		}},
		{s.profiles, s.consumers.profileHandler()},
		{s.hNamespaces, cache.ResourceEventHandlerFuncs{
			// A binding can reach the cache before its namespace does;
			// the namespace's arrival re-checks the clusters it is bound to.
			AddFunc: func(obj any) { s.onNamespace(obj) },
		}},
	}
	for _, h := range handlers {
		synced, err := h.inf.AddEventHandler(h.h)
		if err != nil {
			return fmt.Errorf("add event handler: %w", err)
		}
		s.synced = append(s.synced, synced)
	}
	return nil
}

// credentialDeps hands the credentials controller what it uses.
func (s *Syncer) credentialDeps() credentialDeps {
	return credentialDeps{
		kube:           s.clients.Kube,
		recorder:       s.recorder,
		clock:          clock.RealClock{},
		log:            s.log,
		metrics:        s.metrics,
		foreign:        s.foreign,
		notify:         s.notifyCredential,
		stats:          s.consumers,
		manager:        s.opts.ClusterManager,
		resyncPeriod:   s.opts.ResyncPeriod,
		requestTimeout: s.opts.RequestTimeout,
		retryBase:      s.opts.RetryBase,
		retryMax:       s.opts.RetryMax,
	}
}

// controller is the topology controller as the worker loop runs it.
func (s *Syncer) controller() *controller {
	return &controller{
		name: "topology", queue: s.queue, reconcile: s.reconcile, metrics: s.metrics,
		log: s.log.With("controller", "topology"),
		// Conflicts with foreign profiles are reported when first seen;
		// retrying them until the foreign profile goes is a steady state,
		// not pending work.
		steady: onlyConflicts,
	}
}

// indexFunc adapts a typed key function to a cache.IndexFunc.
func indexFunc[T any](keys func(T) []string) cache.IndexFunc {
	return func(obj any) ([]string, error) {
		t, ok := obj.(T)
		if !ok {
			return nil, nil
		}
		return keys(t), nil
	}
}

// Run starts the informers, waits for their caches, then runs the workers
// until ctx is cancelled. It returns an error if the caches never sync.
func (s *Syncer) Run(ctx context.Context) error {
	defer s.queue.ShutDown()
	if s.creds != nil {
		defer s.creds.shutdown()
	}
	// Released before the queues shut down: no handler of the syncer's
	// runs past Run.
	defer func() { s.holds.Release(); s.holds = nil }()
	caSynced, err := s.watch()
	if err != nil {
		return fmt.Errorf("syncer: %w", err)
	}
	if s.ownCache {
		s.cache.Start(ctx)
		defer s.cache.Stop()
	}

	start := time.Now()
	if !cache.WaitForCacheSync(ctx.Done(), s.synced...) {
		return fmt.Errorf("syncer: informer caches did not sync: %w", ctx.Err())
	}
	// CA Secrets are waited for only briefly: a CA that cannot be read (no
	// such namespace, no permission) must not stop every profile; those
	// profiles get the provider entry once the CA arrives.
	caCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	if !cache.WaitForCacheSync(caCtx.Done(), caSynced...) && ctx.Err() == nil {
		s.log.Warn("access provider CA Secrets not readable yet; profiles are written without those providers until they are")
	}
	cancel()
	s.log.Info("caches synced", "after", time.Since(start).Round(time.Millisecond))

	var wg sync.WaitGroup
	wg.Go(func() { s.providers.pollFiles(ctx, s, 5*time.Second) })
	topology := s.controller()
	for range s.opts.Workers {
		wg.Go(func() { topology.run(ctx) })
	}
	if s.creds != nil {
		creds := s.creds.controller()
		for range s.creds.workers {
			wg.Go(func() { creds.run(ctx) })
		}
	}
	s.ready.Store(true)
	<-ctx.Done()
	s.ready.Store(false)
	s.queue.ShutDown()
	if s.creds != nil {
		s.creds.queue.ShutDown()
	}
	wg.Wait()
	return nil
}

// Ready reports whether caches are synced and workers are running.
func (s *Syncer) Ready() bool { return s.ready.Load() }

// Idle reports whether the syncer has no work: no key queued, being
// reconciled, or waiting to be retried (except the steady retries of
// conflicts with other cluster managers' profiles), and no token change
// waiting out its coalescing window. It is exact for what the syncer has
// been told; events the informers have not delivered yet are not known.
// Tests and benchmarks use it to tell when the syncer has converged.
func (s *Syncer) Idle() bool {
	return s.ready.Load() && s.queue.Outstanding() == 0 && (s.creds == nil || s.creds.idle())
}

// busyBacklog is how many keys must be waiting in a queue for Busy to say
// the syncer is converging: a single change (one cluster relabelled, one
// token rotated) never makes it busy, the initial sync or a fleet-wide
// change does.
const busyBacklog = 8

// Busy reports whether the syncer is converging: before its caches are
// synced, and from the moment a queue holds busyBacklog keys or more
// waiting for a worker until it is idle again (the last keys of a burst,
// in flight, still count). Consumers of the change stream that keep a
// state wait for it to pass (stream.Options.Yield), so that the hub's own
// objects converge first.
func (s *Syncer) Busy() bool {
	if !s.ready.Load() {
		return true
	}
	if s.queue.Len() >= busyBacklog || (s.creds != nil && s.creds.queue.Len() >= busyBacklog) {
		s.converging.Store(true)
		return true
	}
	if !s.converging.Load() {
		return false
	}
	if s.Idle() {
		s.converging.Store(false)
		return false
	}
	return true
}

func (s *Syncer) enqueueObjectName(obj any) {
	if a, ok := eventObject[metav1.Object](obj); ok {
		s.queue.Add(a.GetName())
	}
}

// onProfileDeleted re-checks a deleted profile's cluster. The deletion
// also ends any wait for hubsync's own last write of that profile: a
// profile hubsync created and someone deleted before the cache showed it
// must be created again, not taken for a write still on its way.
func (s *Syncer) onProfileDeleted(obj any) {
	if p, ok := eventObject[*cpv1alpha1.ClusterProfile](obj); ok {
		s.writes.sawDeleted(p)
		s.foreign.writers.forget(KindProfile, p.Namespace, p.Name)
	}
	s.enqueueObjectName(obj)
}

// onSet re-checks every cluster that was or is a member of a set, and
// every cluster with a profile in a namespace bound to it (the old members
// of a set whose old selector could not be evaluated).
func (s *Syncer) onSet(oldObj, newObj any) {
	for i, obj := range []any{oldObj, newObj} {
		set, ok := eventObject[*clusterv1beta2.ManagedClusterSet](obj)
		if !ok {
			continue
		}
		switch {
		case i == 1:
			s.checkSetSelector(set)
		case newObj == nil:
			s.forgetInvalidSet(set.Name)
		}
		for _, name := range s.setMembers(set) {
			s.queue.Add(name)
		}
		if _, err := SetSelector(set); err != nil {
			bindings, _ := s.bindingIdx.ByIndex(bySetName, set.Name)
			for _, b := range bindings {
				s.enqueueProfilesIn(b.(*clusterv1beta2.ManagedClusterSetBinding).Namespace)
			}
		}
	}
}

// onBinding re-checks the clusters of the bound set and every cluster that
// has a profile in the binding's namespace, which covers an unbound set
// whose selector has since changed or which no longer exists.
func (s *Syncer) onBinding(obj any) {
	b, ok := eventObject[*clusterv1beta2.ManagedClusterSetBinding](obj)
	if !ok {
		return
	}
	if set, err := s.setLister.Get(b.Spec.ClusterSet); err == nil {
		for _, name := range s.setMembers(set) {
			s.queue.Add(name)
		}
	}
	s.enqueueProfilesIn(b.Namespace)
}

// enqueueProfilesIn re-checks the cluster of every profile of ours in a
// namespace.
func (s *Syncer) enqueueProfilesIn(namespace string) {
	objs, _ := s.profileIdx.ByIndex(cache.NamespaceIndex, namespace)
	for _, o := range objs {
		if p, ok := o.(*cpv1alpha1.ClusterProfile); ok && hub.IsOwned(p, s.opts.ClusterManager) {
			s.queue.Add(p.Name)
		}
	}
}

func (s *Syncer) onNamespace(obj any) {
	ns, ok := obj.(*corev1.Namespace)
	if !ok {
		return
	}
	objs, _ := s.bindingIdx.ByIndex(cache.NamespaceIndex, ns.Name)
	for _, o := range objs {
		s.onBinding(o)
	}
}

// setMembers lists the clusters a set selects. Exclusive sets use the label
// index; label-selector sets scan the cluster cache, which only happens on a
// set or binding change, never per cluster event.
func (s *Syncer) setMembers(set *clusterv1beta2.ManagedClusterSet) []string {
	sel, err := SetSelector(set)
	if err != nil {
		return nil
	}
	var objs []any
	switch set.Spec.ClusterSelector.SelectorType {
	case "", clusterv1beta2.ExclusiveClusterSetLabel:
		objs, _ = s.clusterIdx.ByIndex(byClusterSetLabel, set.Name)
	default:
		objs = s.clusterIdx.List()
	}
	names := make([]string, 0, len(objs))
	for _, o := range objs {
		if c, ok := o.(*clusterv1.ManagedCluster); ok && sel.Matches(labelsOf(c)) {
			names = append(names, c.Name)
		}
	}
	return names
}

// checkSetSelector reports a set whose selector cannot be evaluated, once
// per resourceVersion.
func (s *Syncer) checkSetSelector(set *clusterv1beta2.ManagedClusterSet) {
	_, err := SetSelector(set)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err == nil {
		if _, ok := s.invalidSets[set.Name]; ok {
			delete(s.invalidSets, set.Name)
			s.log.Info("cluster set selector is valid again", "clusterSet", set.Name)
		}
		s.metrics.invalidSets.Set(float64(len(s.invalidSets)))
		return
	}
	if s.invalidSets[set.Name] == set.ResourceVersion {
		return
	}
	s.invalidSets[set.Name] = set.ResourceVersion
	s.metrics.invalidSets.Set(float64(len(s.invalidSets)))
	s.log.Warn("cluster set has an invalid selector; profiles of namespaces bound to it are held as they are",
		"clusterSet", set.Name, "err", err)
	s.recorder.Eventf(set, corev1.EventTypeWarning, "InvalidClusterSelector",
		"hubsync cannot evaluate this set's cluster selector, so profiles in namespaces bound to it are held as they are: %v", err)
}

func (s *Syncer) forgetInvalidSet(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.invalidSets, name)
	s.metrics.invalidSets.Set(float64(len(s.invalidSets)))
}

func (s *Syncer) countOwned() float64 {
	if !s.ready.Load() {
		// A standby's syncer holds no profile informer.
		return 0
	}
	n := 0
	for _, o := range s.profileIdx.List() {
		if p, ok := o.(*cpv1alpha1.ClusterProfile); ok && hub.IsOwned(p, s.opts.ClusterManager) {
			n++
		}
	}
	return float64(n)
}

// candidateSets returns the sets a cluster may belong to: the exclusive set
// its clusterset label names, and every set that is not exclusive.
func (s *Syncer) candidateSets(c *clusterv1.ManagedCluster) []*clusterv1beta2.ManagedClusterSet {
	var out []*clusterv1beta2.ManagedClusterSet
	if name, ok := c.Labels[hub.LabelClusterSet]; ok {
		if set, err := s.setLister.Get(name); err == nil {
			out = append(out, set)
		}
	}
	// Every set that is not exclusive may select the cluster: label-selector
	// sets, and sets of an unknown selector type, which are reported as
	// invalid and hold their namespaces.
	for _, t := range s.setIdx.ListIndexFuncValues(bySelectorType) {
		if t == "" || clusterv1beta2.SelectorType(t) == clusterv1beta2.ExclusiveClusterSetLabel {
			continue
		}
		objs, _ := s.setIdx.ByIndex(bySelectorType, t)
		for _, o := range objs {
			if set, ok := o.(*clusterv1beta2.ManagedClusterSet); ok {
				out = append(out, set)
			}
		}
	}
	return out
}

func (s *Syncer) bindingsFor(clusterSets []*clusterv1beta2.ManagedClusterSet) []*clusterv1beta2.ManagedClusterSetBinding {
	var out []*clusterv1beta2.ManagedClusterSetBinding
	seen := sets.New[string]()
	for _, set := range clusterSets {
		if seen.Has(set.Name) {
			continue
		}
		seen.Insert(set.Name)
		objs, _ := s.bindingIdx.ByIndex(bySetName, set.Name)
		for _, o := range objs {
			if b, ok := o.(*clusterv1beta2.ManagedClusterSetBinding); ok {
				out = append(out, b)
			}
		}
	}
	return out
}
