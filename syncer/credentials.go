package syncer

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"
	msav1beta1 "open-cluster-management.io/managed-serviceaccount/apis/authentication/v1beta1"
	msaclient "open-cluster-management.io/managed-serviceaccount/pkg/generated/clientset/versioned"
	msalisters "open-cluster-management.io/managed-serviceaccount/pkg/generated/listers/authentication/v1beta1"
	cpv1alpha1 "sigs.k8s.io/cluster-inventory-api/apis/v1alpha1"

	"github.com/hubsync/hubsync/hub"
	"github.com/hubsync/hubsync/hubcache"
)

const (
	bySource      = "source"      // credential copy -> "<cluster>/<msa>"
	byTokenSecret = "tokenSecret" // MSA -> "<cluster>/<status.tokenSecretRef.name>"
)

// credentials copies the token Secret of every ManagedServiceAccount
// labelled sync-to-clusterprofile into each namespace holding a profile of
// ours for its cluster, and keeps the copies current through every rotation.
//
// It watches only label-scoped Secrets (hub token Secrets and its own
// copies), never every Secret on the hub. Keys are "<cluster>/<msa>"; a
// change of a hub token Secret waits a short coalescing window so that a
// burst of rotations costs one write per copy. Each key is read from the
// caches, planned by PlanCopies and written by apply.
type credentials struct {
	credentialDeps
	workers int
	// impersonator is the ManagedServiceAccount name never copied.
	impersonator string

	// msaInf, hubInf and copyInf are the informers of synced MSAs, hub
	// token Secrets and copies, held from the hub cache while Run runs.
	msaInf, hubInf, copyInf *hubcache.Informer
	msas                    msalisters.ManagedServiceAccountLister
	msaIdx                  cache.Indexer
	hubSecrets              corelisters.SecretLister
	copies                  corelisters.SecretLister
	copyIdx                 cache.Indexer
	synced                  []cache.InformerSynced

	queue    *trackedQueue
	debounce *debouncer
	written  *writeTracker

	mu       sync.Mutex
	problems map[string]CopyProblem // key -> problem last reported

	// statsMu makes each refresh of a copy's consumer stats read the
	// caches and record what it read in one step, so that the last
	// refresh, which follows the last cache change, is the one that stays.
	statsMu sync.Mutex

	writes    *prometheus.CounterVec
	rotations prometheus.Counter
	problemsG *prometheus.GaugeVec
}

// credentialDeps is what the credentials controller uses of the syncer
// that runs it, handed over rather than reached through a pointer to the
// whole syncer.
type credentialDeps struct {
	kube     kubernetes.Interface
	recorder record.EventRecorder
	clock    clock.WithDelayedExecution
	log      *slog.Logger
	metrics  *metrics
	// foreign tells another controller's writes to copies from hubsync's.
	foreign *foreignReporter
	// profiles is the syncer's hold on the ClusterProfile informer,
	// indexed byName (set by watch).
	profiles   *hubcache.Informer
	namespaces corelisters.NamespaceLister
	// notify announces a change hubsync made to a copy.
	notify func(typ string, sec *corev1.Secret)
	// stats counts the copies per consumer namespace.
	stats *consumerStats
	// manager is hubsync's cluster manager name.
	manager                                           string
	resyncPeriod, requestTimeout, retryBase, retryMax time.Duration
}

// CredentialOptions configure credential copies; nil disables them.
type CredentialOptions struct {
	Client   msaclient.Interface
	Workers  int
	Coalesce time.Duration
	// Impersonator names the ManagedServiceAccount (in every cluster's
	// namespace) whose token the gateway impersonates hub users with:
	// tunnel.managedServiceAccount while the tunnel is on, else "". It
	// may act as anyone on its cluster, so it is never copied to a
	// consumer, whatever its labels, and copies of it are removed.
	Impersonator string
}

func newCredentials(d credentialDeps, o *CredentialOptions, reg prometheus.Registerer) (*credentials, error) {
	d.log = d.log.With("controller", "credentials")
	c := &credentials{
		credentialDeps: d,
		workers:        max(o.Workers, 1),
		impersonator:   o.Impersonator,
		problems:       map[string]CopyProblem{},
		queue:          newTrackedQueue(d.retryBase, d.retryMax),
		written:        newWriteTracker(30 * time.Second),
	}
	c.debounce = newDebouncer(o.Coalesce, 10*o.Coalesce, c.queue.Add, d.clock)
	c.writes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "hubsync_credential_writes_total",
		Help: "Credential copy writes sent to the hub by operation (create, update, delete).",
	}, []string{"op"})
	c.rotations = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "hubsync_credential_rotations_total",
		Help: "Token rotations propagated to every copy of a ManagedServiceAccount.",
	})
	c.problemsG = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "hubsync_credential_problems",
		Help: "(cluster, ManagedServiceAccount) pairs whose copies are not written, by reason: no_token, invalid_name, name_conflict, " +
			"or impersonator (the gateway's impersonating ManagedServiceAccount labelled for copying, which hubsync refuses).",
	}, []string{"reason"})
	// Every reason has a series from the start, so that an alert on one
	// sees 0 rather than nothing.
	for _, p := range []CopyProblem{ProblemNoToken, ProblemNameTooLong, ProblemNameConflict, ProblemImpersonator} {
		c.problemsG.WithLabelValues(p.MetricReason())
	}
	for _, op := range credentialOps {
		c.writes.WithLabelValues(op)
	}
	reg.MustRegister(c.writes, c.rotations, c.problemsG)
	d.metrics.queueDepth.track("credentials", c.queue.Len)
	return c, nil
}

// watch takes the controller's informers from the hub cache with their
// indexes and handlers; the caller releases the holds it returns (also on
// an error).
func (c *credentials) watch(hc *hubcache.Cache) (hubcache.Holds, error) {
	c.synced = nil
	holds, err := c.newInformers(hc)
	if err != nil {
		return holds, err
	}
	return holds, c.addHandlers()
}

// newInformers takes the label-scoped informers of synced MSAs, hub token
// Secrets and copies, and adds their indexes.
func (c *credentials) newInformers(hc *hubcache.Cache) (hubcache.Holds, error) {
	var holds hubcache.Holds
	exists, err := labels.NewRequirement(hub.LabelSyncedFrom, selection.Exists, nil)
	if err != nil {
		return nil, err
	}
	takes := []struct {
		to   **hubcache.Informer
		take func() (*hubcache.Informer, error)
	}{
		{&c.msaInf, func() (*hubcache.Informer, error) {
			return hc.ManagedServiceAccounts(labels.SelectorFromSet(labels.Set{hub.LabelSyncToClusterProfile: "true"}).String())
		}},
		{&c.hubInf, func() (*hubcache.Informer, error) { return hc.Secrets(hubcache.TokenSecrets()) }},
		{&c.copyInf, func() (*hubcache.Informer, error) {
			return hc.Secrets(hubcache.Secrets{LabelSelector: labels.NewSelector().Add(*exists).String()})
		}},
	}
	for _, t := range takes {
		i, err := t.take()
		if err != nil {
			return holds, err
		}
		holds = append(holds, i)
		*t.to = i
	}
	copyInf, msaInf := c.copyInf.Informer(), c.msaInf.Informer()
	if err := addIndexers(copyInf, cache.Indexers{bySource: indexFunc(func(s *corev1.Secret) []string {
		if key, ok := copyPair(s); ok {
			return []string{key}
		}
		return nil
	})}); err != nil {
		return holds, fmt.Errorf("add copy indexer: %w", err)
	}
	if err := addIndexers(msaInf, cache.Indexers{byTokenSecret: indexFunc(func(m *msav1beta1.ManagedServiceAccount) []string {
		if ref := m.Status.TokenSecretRef; ref != nil && ref.Name != "" {
			return []string{m.Namespace + "/" + ref.Name}
		}
		return nil
	})}); err != nil {
		return holds, fmt.Errorf("add token secret indexer: %w", err)
	}
	c.msaIdx = msaInf.GetIndexer()
	c.msas = msalisters.NewManagedServiceAccountLister(c.msaIdx)
	c.hubSecrets = corelisters.NewSecretLister(c.hubInf.Informer().GetIndexer())
	c.copyIdx = copyInf.GetIndexer()
	c.copies = corelisters.NewSecretLister(c.copyIdx)
	return holds, nil
}

// addHandlers routes every change to the pairs it concerns.
func (c *credentials) addHandlers() error {
	// An MSA's namespace/name is its pair's key.
	addMSA := func(obj any) {
		if key, ok := namespacedKey(obj); ok {
			c.queue.Add(key)
		}
	}
	for _, h := range []struct {
		inf *hubcache.Informer
		h   cache.ResourceEventHandler
	}{
		{c.msaInf, onEvent(addMSA)},
		// A token Secret belongs to the MSAs whose status.tokenSecretRef
		// names it (and, before any MSA reports it, to the MSA of its own
		// name, which the agent gives it).
		{c.hubInf, c.tokenSecretHandler()},
		{c.copyInf, c.copyHandler()},
		{c.profiles, cache.ResourceEventHandlerFuncs{
			AddFunc:    c.onProfile,
			UpdateFunc: c.onProfileUpdate,
			DeleteFunc: c.onProfile,
		}},
		// The consumer stats follow every copy, hubsync's own writes
		// included, and every change of a copy's source.
		{c.copyInf, onEvent(func(obj any) {
			if sec, ok := eventObject[*corev1.Secret](obj); ok {
				c.refreshCopyStats(sec.Namespace, sec.Name)
			}
		})},
		{c.msaInf, onEvent(func(obj any) {
			if key, ok := namespacedKey(obj); ok {
				c.refreshPairStats(key)
			}
		})},
		{c.hubInf, onEvent(func(obj any) {
			for _, key := range c.pairsOfTokenSecret(obj) {
				c.refreshPairStats(key)
			}
		})},
	} {
		synced, err := h.inf.AddEventHandler(h.h)
		if err != nil {
			return fmt.Errorf("add credential event handler: %w", err)
		}
		c.synced = append(c.synced, synced)
	}
	return nil
}

// copyHandler re-plans the pair of a copy that changed, unless the change
// is hubsync's own write coming back. A deletion always re-plans, hubsync's
// own included: whoever deleted the copy (hubsync, the garbage collector
// after its profile's deletion, a tool), the plan decides whether one must
// be there now. Changes go through the debouncer, so that during a burst of
// rotations they join the burst instead of starting a reconcile each.
func (c *credentials) copyHandler() cache.ResourceEventHandlerFuncs {
	touch := func(obj any, deleted bool) {
		sec, ok := eventObject[*corev1.Secret](obj)
		if !ok {
			return
		}
		if deleted {
			c.written.sawDeleted(sec)
			c.foreign.writers.forget(KindCredential, sec.Namespace, sec.Name)
		} else if c.written.isEcho(sec) {
			return
		}
		if key, ok := copyPair(sec); ok {
			c.debounce.touch(key)
		}
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { touch(obj, false) },
		UpdateFunc: func(_, obj any) { touch(obj, false) },
		DeleteFunc: func(obj any) { touch(obj, true) },
	}
}

// tokenSecretHandler debounces the pairs a hub token Secret's change
// concerns.
func (c *credentials) tokenSecretHandler() cache.ResourceEventHandlerFuncs {
	return onEvent(func(obj any) {
		for _, k := range c.pairsOfTokenSecret(obj) {
			c.debounce.touch(k) // at once when coalescing is off
		}
	})
}

// pairsOfTokenSecret returns the keys of the pairs a hub token Secret
// belongs to: the MSAs whose status.tokenSecretRef names it, and the MSA
// of its own name, which the agent gives it before any MSA reports it.
func (c *credentials) pairsOfTokenSecret(obj any) []string {
	key, ok := namespacedKey(obj)
	if !ok {
		return nil
	}
	keys := sets.New(key)
	msas, _ := c.msaIdx.ByIndex(byTokenSecret, key)
	for _, o := range msas {
		if m, ok := o.(*msav1beta1.ManagedServiceAccount); ok {
			keys.Insert(m.Namespace + "/" + m.Name)
		}
	}
	return sets.List(keys)
}

// onEvent calls f with the object of every add, update and delete.
func onEvent(f func(obj any)) cache.ResourceEventHandlerFuncs {
	return cache.ResourceEventHandlerFuncs{AddFunc: f, UpdateFunc: func(_, obj any) { f(obj) }, DeleteFunc: f}
}

// refreshCopyStats records the cached copy namespace/name in the consumer
// stats with its source as cached now, or forgets it when the cache holds
// no such copy.
func (c *credentials) refreshCopyStats(namespace, name string) {
	c.statsMu.Lock()
	defer c.statsMu.Unlock()
	sec, err := c.copies.Secrets(namespace).Get(name)
	if err != nil {
		c.stats.setCopy(namespace, name, CopyState{}, false)
		return
	}
	key, ok := copyPair(sec)
	if !ok {
		c.stats.setCopy(namespace, name, CopyState{}, false)
		return
	}
	cluster, msa, _ := strings.Cut(key, "/")
	_, source, _ := c.source(cluster, msa)
	c.stats.setCopy(namespace, name, CopyStateOf(key, sec, source), true)
}

// refreshPairStats refreshes the consumer stats of a pair's copies after
// a change of its source.
func (c *credentials) refreshPairStats(key string) {
	copies, _ := c.copyIdx.ByIndex(bySource, key)
	for _, o := range copies {
		if sec, ok := o.(*corev1.Secret); ok {
			c.refreshCopyStats(sec.Namespace, sec.Name)
		}
	}
}

func namespacedKey(obj any) (string, bool) {
	a, ok := eventObject[metav1.Object](obj)
	if !ok || a.GetNamespace() == "" {
		return "", false
	}
	return hub.SourceKey(a.GetNamespace(), a.GetName()), true
}

// onProfile re-checks every synced MSA of the profile's cluster: a
// profile's creation or deletion re-plans each of its pairs.
func (c *credentials) onProfile(obj any) {
	p, ok := eventObject[*cpv1alpha1.ClusterProfile](obj)
	if !ok {
		return
	}
	objs, _ := c.msaIdx.ByIndex(cache.NamespaceIndex, p.Name)
	for _, o := range objs {
		if msa, ok := o.(*msav1beta1.ManagedServiceAccount); ok {
			c.queue.Add(hub.SourceKey(msa.Namespace, msa.Name))
		}
	}
}

// onProfileUpdate only reacts to what matters to copies (ownership, UID,
// deletion), not to every status write.
func (c *credentials) onProfileUpdate(oldObj, obj any) {
	o, ok1 := oldObj.(*cpv1alpha1.ClusterProfile)
	n, ok2 := obj.(*cpv1alpha1.ClusterProfile)
	if ok1 && ok2 && o.UID == n.UID && o.Labels[hub.LabelClusterManager] == n.Labels[hub.LabelClusterManager] &&
		(o.DeletionTimestamp == nil) == (n.DeletionTimestamp == nil) && o.ResourceVersion != n.ResourceVersion {
		return
	}
	c.onProfile(obj)
}

func (c *credentials) shutdown() {
	c.debounce.stop()
	c.queue.ShutDown()
}

func (c *credentials) idle() bool {
	return c.queue.Outstanding() == 0 && c.debounce.pending() == 0
}

// controller is the credentials controller as the worker loop runs it.
func (c *credentials) controller() *controller {
	return &controller{name: "credentials", queue: c.queue, reconcile: c.reconcile, log: c.log, metrics: c.metrics}
}

// reconcile converges the copies of one (cluster, MSA) pair: what the
// caches show, planned by PlanCopies, written by apply.
func (c *credentials) reconcile(ctx context.Context, key string) error {
	cluster, msaName, ok := strings.Cut(key, "/")
	if !ok {
		return nil
	}
	msa, hubSecret, err := c.source(cluster, msaName)
	if err != nil {
		return fmt.Errorf("read the source of %s: %w", key, err)
	}
	pair := Pair{
		Cluster: cluster, MSA: msaName, Manager: c.manager, Impersonator: c.impersonator,
		Writable: func(ns string) bool { return namespaceActive(c.namespaces, ns) },
		Now:      c.clock.Now(),
	}
	profiles, copies := c.current(pair)
	return c.apply(ctx, pair, msa, hubSecret, PlanCopies(pair, profiles, copies, msa, hubSecret))
}

// source returns a pair's MSA and the token Secret its status reports, as
// cached; each is nil when there is none.
func (c *credentials) source(cluster, msaName string) (*msav1beta1.ManagedServiceAccount, *corev1.Secret, error) {
	msa, err := c.msas.ManagedServiceAccounts(cluster).Get(msaName)
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil, nil
	case err != nil:
		return nil, nil, err
	}
	ref := msa.Status.TokenSecretRef
	if ref == nil || ref.Name == "" {
		return msa, nil, nil
	}
	// The Secret the agent reported, not whichever Secret has the MSA's
	// name.
	hubSecret, err := c.hubSecrets.Secrets(cluster).Get(ref.Name)
	switch {
	case apierrors.IsNotFound(err):
		return msa, nil, nil
	case err != nil:
		return nil, nil, err
	}
	return msa, hubSecret, nil
}

// current returns what the caches show of a pair: the profiles named after
// its cluster, and the Secrets that are or may be its copies (those marked
// as its copies, and those with the copy's name next to the profiles). A
// namespace where hubsync's last write of the copy is not in the cache yet
// is left out altogether, its profile with its copy, so that the plan
// neither writes it again nor deletes it; that write's echo re-queues the
// pair.
func (c *credentials) current(pair Pair) ([]*cpv1alpha1.ClusterProfile, []*corev1.Secret) {
	name := hub.CopyName(pair.Cluster, pair.MSA)
	namespaces := sets.New[string]()
	objs, _ := c.profiles.Informer().GetIndexer().ByIndex(byName, pair.Cluster)
	marked, _ := c.copyIdx.ByIndex(bySource, hub.SourceKey(pair.Cluster, pair.MSA))
	for _, list := range [][]any{objs, marked} {
		for _, o := range list {
			if a, ok := o.(metav1.Object); ok {
				namespaces.Insert(a.GetNamespace())
			}
		}
	}
	busy := sets.New[string]()
	var copies []*corev1.Secret
	for _, ns := range sets.List(namespaces) {
		cur, pending := observe(c.written, ns+"/"+name, func() *corev1.Secret {
			sec, _ := c.copies.Secrets(ns).Get(name)
			return sec
		})
		switch {
		case pending:
			busy.Insert(ns)
		case cur != nil:
			copies = append(copies, cur)
		}
	}
	for _, o := range marked {
		if sec, ok := o.(*corev1.Secret); ok && sec.Name != name && !busy.Has(sec.Namespace) {
			copies = append(copies, sec)
		}
	}
	var profiles []*cpv1alpha1.ClusterProfile
	for _, o := range objs {
		if p, ok := o.(*cpv1alpha1.ClusterProfile); ok && !busy.Has(p.Namespace) {
			profiles = append(profiles, p)
		}
	}
	return profiles, copies
}

// profileOwner returns a Secret's controller reference when it names a
// ClusterProfile, else nil.
func profileOwner(sec *corev1.Secret) *metav1.OwnerReference {
	ref := metav1.GetControllerOf(sec)
	if ref == nil || ref.Kind != "ClusterProfile" || !strings.HasPrefix(ref.APIVersion, cpv1alpha1.GroupVersion.Group+"/") {
		return nil
	}
	return ref
}

// copyPair returns the "<cluster>/<msa>" key of the pair a copy belongs to:
// its hubsync source annotation, or, for a copy the upstream syncer made,
// what its synced-from label says. Either way the Secret's controller must
// be the cluster's ClusterProfile (named after the cluster). The upstream
// copies of pairs that no longer sync are then removed like hubsync's own,
// instead of being left behind with a stale token.
func copyPair(sec *corev1.Secret) (string, bool) {
	ref := profileOwner(sec)
	if ref == nil {
		return "", false
	}
	if v := sec.Annotations[hub.AnnotationSource]; v != "" {
		if cluster, _, ok := strings.Cut(v, "/"); !ok || cluster != ref.Name {
			return "", false
		}
		return v, true
	}
	from := sec.Labels[hub.LabelSyncedFrom]
	if from == "" || from != sec.Name {
		return "", false
	}
	msa, ok := strings.CutPrefix(from, ref.Name+"-")
	if !ok || msa == "" {
		return "", false
	}
	return ref.Name + "/" + msa, true
}

// ownership says whose an existing Secret with a copy's name is.
type ownership int

const (
	// foreign: not the pair's copy; never written or deleted.
	foreign ownership = iota
	// ownedLive: the pair's copy, controlled by the live profile of
	// hubsync's it sits next to (uid included).
	ownedLive
	// ownedDangling: the pair's copy, but its controller, the cluster's
	// profile in that namespace, is gone (no such profile, or one with
	// another uid). Kubernetes' garbage collector deletes such a Secret;
	// hubsync deletes it too rather than rewriting it.
	ownedDangling
)

// copyOwnership decides whether sec is the pair's copy: it must carry the
// pair's marks (hubsync's source annotation, or the upstream syncer's
// synced-from label and no annotation) and have the cluster's profile as
// its controller. live is the profile named after the cluster in sec's
// namespace, of any cluster manager, or nil. Marks alone are not enough:
// anyone who can edit a Secret can add them.
func copyOwnership(sec *corev1.Secret, cluster, msa string, live *cpv1alpha1.ClusterProfile, manager string) ownership {
	switch src := sec.Annotations[hub.AnnotationSource]; src {
	case hub.SourceKey(cluster, msa):
	case "":
		if sec.Labels[hub.LabelSyncedFrom] != hub.CopyName(cluster, msa) {
			return foreign
		}
	default:
		return foreign
	}
	ref := profileOwner(sec)
	if ref == nil || ref.Name != cluster {
		return foreign
	}
	if live == nil || live.UID != ref.UID {
		return ownedDangling
	}
	if !hub.IsOwned(live, manager) {
		return foreign
	}
	return ownedLive
}
