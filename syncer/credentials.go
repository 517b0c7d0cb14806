package syncer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/util/sets"
	kubeinformers "k8s.io/client-go/informers"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	msav1beta1 "open-cluster-management.io/managed-serviceaccount/apis/authentication/v1beta1"
	msaclient "open-cluster-management.io/managed-serviceaccount/pkg/generated/clientset/versioned"
	msainformers "open-cluster-management.io/managed-serviceaccount/pkg/generated/informers/externalversions"
	msalisters "open-cluster-management.io/managed-serviceaccount/pkg/generated/listers/authentication/v1beta1"
	cpv1alpha1 "sigs.k8s.io/cluster-inventory-api/apis/v1alpha1"

	"github.com/hubsync/hubsync/hub"
	"github.com/hubsync/hubsync/stream"
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
// burst of rotations costs one write per copy.
type credentials struct {
	s       *Syncer
	log     *slog.Logger
	workers int

	msaInformers  msainformers.SharedInformerFactory
	hubInformers  kubeinformers.SharedInformerFactory
	copyInformers kubeinformers.SharedInformerFactory
	msas          msalisters.ManagedServiceAccountLister
	msaIdx        cache.Indexer
	hubSecrets    corelisters.SecretLister
	copies        corelisters.SecretLister
	copyIdx       cache.Indexer
	synced        []cache.InformerSynced

	queue    *trackedQueue
	debounce *debouncer
	written  *writeTracker

	mu       sync.Mutex
	problems map[string]CopyProblem // key -> problem last reported

	// impersonator is the ManagedServiceAccount name never copied.
	impersonator string

	writes    *prometheus.CounterVec
	rotations prometheus.Counter
	problemsG *prometheus.GaugeVec
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

func newCredentials(s *Syncer, o *CredentialOptions, reg prometheus.Registerer) (*credentials, error) {
	c := &credentials{
		s: s, log: s.log.With("controller", "credentials"),
		workers:      max(o.Workers, 1),
		problems:     map[string]CopyProblem{},
		impersonator: o.Impersonator,
	}
	c.queue = newTrackedQueue(s.opts.RetryBase, s.opts.RetryMax)
	c.written = newWriteTracker(30 * time.Second)
	c.debounce = newDebouncer(o.Coalesce, 10*o.Coalesce, c.queue.Add)
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
	reg.MustRegister(c.writes, c.rotations, c.problemsG, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name:        "hubsync_queue_depth",
		Help:        "Keys waiting in a work queue.",
		ConstLabels: prometheus.Labels{"queue": "credentials"},
	}, func() float64 { return float64(c.queue.Len()) }))

	strip := cache.TransformFunc(stripManagedFields)
	c.msaInformers = msainformers.NewSharedInformerFactoryWithOptions(o.Client, s.opts.ResyncPeriod,
		msainformers.WithTransform(strip),
		msainformers.WithTweakListOptions(func(lo *metav1.ListOptions) {
			lo.LabelSelector = labels.SelectorFromSet(labels.Set{hub.LabelSyncToClusterProfile: "true"}).String()
		}))
	c.hubInformers = kubeinformers.NewSharedInformerFactoryWithOptions(s.clients.Kube, s.opts.ResyncPeriod,
		kubeinformers.WithTransform(strip),
		kubeinformers.WithTweakListOptions(func(lo *metav1.ListOptions) {
			lo.LabelSelector = labels.SelectorFromSet(labels.Set{hub.LabelIsManagedServiceAccount: "true"}).String()
		}))
	exists, err := labels.NewRequirement(hub.LabelSyncedFrom, selection.Exists, nil)
	if err != nil {
		return nil, err
	}
	c.copyInformers = kubeinformers.NewSharedInformerFactoryWithOptions(s.clients.Kube, s.opts.ResyncPeriod,
		kubeinformers.WithTransform(strip),
		kubeinformers.WithTweakListOptions(func(lo *metav1.ListOptions) {
			lo.LabelSelector = labels.NewSelector().Add(*exists).String()
		}))

	msaInf := c.msaInformers.Authentication().V1beta1().ManagedServiceAccounts()
	hubInf := c.hubInformers.Core().V1().Secrets()
	copyInf := c.copyInformers.Core().V1().Secrets()
	if err := copyInf.Informer().AddIndexers(cache.Indexers{bySource: indexFunc(func(s *corev1.Secret) []string {
		if key, ok := copyPair(s); ok {
			return []string{key}
		}
		return nil
	})}); err != nil {
		return nil, fmt.Errorf("add copy indexer: %w", err)
	}
	if err := msaInf.Informer().AddIndexers(cache.Indexers{byTokenSecret: indexFunc(func(m *msav1beta1.ManagedServiceAccount) []string {
		if ref := m.Status.TokenSecretRef; ref != nil && ref.Name != "" {
			return []string{m.Namespace + "/" + ref.Name}
		}
		return nil
	})}); err != nil {
		return nil, fmt.Errorf("add token secret indexer: %w", err)
	}
	c.msas = msaInf.Lister()
	c.msaIdx = msaInf.Informer().GetIndexer()
	c.hubSecrets = hubInf.Lister()
	c.copies = copyInf.Lister()
	c.copyIdx = copyInf.Informer().GetIndexer()

	// An MSA's namespace/name is its pair's key.
	addMSA := func(obj any) {
		if key, ok := namespacedKey(obj); ok {
			c.queue.Add(key)
		}
	}
	// A copy's change re-checks its pair, unless it is hubsync's own write
	// coming back; it goes through the debouncer, so that during a burst
	// of rotations it joins the burst instead of starting a reconcile.
	onCopy := func(obj any, deleted bool) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		sec, ok := obj.(*corev1.Secret)
		if !ok || c.written.isEcho(sec, deleted) {
			return
		}
		if key, ok := copyPair(sec); ok {
			c.debounce.touch(key)
		}
	}
	for _, h := range []struct {
		inf cache.SharedIndexInformer
		h   cache.ResourceEventHandler
	}{
		{msaInf.Informer(), cache.ResourceEventHandlerFuncs{AddFunc: addMSA, UpdateFunc: func(_, obj any) { addMSA(obj) }, DeleteFunc: addMSA}},
		// A token Secret belongs to the MSAs whose status.tokenSecretRef
		// names it (and, before any MSA reports it, to the MSA of its own
		// name, which the agent gives it).
		{hubInf.Informer(), c.tokenSecretHandler()},
		{copyInf.Informer(), cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { onCopy(obj, false) },
			UpdateFunc: func(_, obj any) { onCopy(obj, false) },
			DeleteFunc: func(obj any) { onCopy(obj, true) },
		}},
		{s.cpInformers.Apis().V1alpha1().ClusterProfiles().Informer(), cache.ResourceEventHandlerFuncs{
			AddFunc:    c.onProfile,
			UpdateFunc: func(old, obj any) { c.onProfileUpdate(old, obj) },
			DeleteFunc: c.onProfile,
		}},
	} {
		r, err := h.inf.AddEventHandler(h.h)
		if err != nil {
			return nil, fmt.Errorf("add credential event handler: %w", err)
		}
		c.synced = append(c.synced, r.HasSynced)
	}
	return c, nil
}

// tokenSecretHandler debounces the pairs a hub token Secret's change
// concerns.
func (c *credentials) tokenSecretHandler() cache.ResourceEventHandlerFuncs {
	touch := func(obj any) {
		key, ok := namespacedKey(obj)
		if !ok {
			return
		}
		keys := sets.New(key)
		msas, _ := c.msaIdx.ByIndex(byTokenSecret, key)
		for _, o := range msas {
			if m, ok := o.(*msav1beta1.ManagedServiceAccount); ok {
				keys.Insert(m.Namespace + "/" + m.Name)
			}
		}
		for k := range keys {
			c.debounce.touch(k) // at once when coalescing is off
		}
	}
	return cache.ResourceEventHandlerFuncs{AddFunc: touch, UpdateFunc: func(_, obj any) { touch(obj) }, DeleteFunc: touch}
}

func namespacedKey(obj any) (string, bool) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	a, err := meta.Accessor(obj)
	if err != nil || a.GetNamespace() == "" {
		return "", false
	}
	return hub.SourceKey(a.GetNamespace(), a.GetName()), true
}

// onProfile re-checks every synced MSA of the profile's cluster.
func (c *credentials) onProfile(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	p, ok := obj.(*cpv1alpha1.ClusterProfile)
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

func (c *credentials) start(ctx context.Context) {
	c.msaInformers.Start(ctx.Done())
	c.hubInformers.Start(ctx.Done())
	c.copyInformers.Start(ctx.Done())
}

func (c *credentials) shutdown() {
	c.debounce.stop()
	c.queue.ShutDown()
	c.msaInformers.Shutdown()
	c.hubInformers.Shutdown()
	c.copyInformers.Shutdown()
}

func (c *credentials) idle() bool {
	return c.queue.Outstanding() == 0 && c.debounce.pending() == 0
}

func (c *credentials) worker(ctx context.Context) {
	for {
		key, shutdown := c.queue.Get()
		if shutdown {
			return
		}
		err := c.reconcile(ctx, key)
		switch {
		case err == nil:
			c.queue.Forget(key)
		case ctx.Err() == nil:
			c.log.Warn("credential sync failed, will retry", "pair", key, "retries", c.queue.NumRequeues(key), "err", err)
			c.queue.AddRateLimited(key)
		}
		c.queue.Done(key)
	}
}

// reconcile converges the copies of one (cluster, MSA) pair.
func (c *credentials) reconcile(ctx context.Context, key string) error {
	cluster, msaName, ok := strings.Cut(key, "/")
	if !ok {
		return nil
	}
	msa, err := c.msas.ManagedServiceAccounts(cluster).Get(msaName)
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	var hubSecret *corev1.Secret
	if msa != nil && msa.Status.TokenSecretRef != nil && msa.Status.TokenSecretRef.Name != "" {
		// The Secret the agent reported, not whichever Secret has the
		// MSA's name.
		hubSecret, err = c.hubSecrets.Secrets(cluster).Get(msa.Status.TokenSecretRef.Name)
		if err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}

	existing := map[string]*corev1.Secret{}
	objs, _ := c.copyIdx.ByIndex(bySource, key)
	for _, o := range objs {
		if sec, ok := o.(*corev1.Secret); ok {
			existing[sec.Namespace] = sec
		}
	}

	// The copy plan reports its problem (a name conflict, or none) once
	// it has tried every namespace, not here: clearing it first would
	// report a lasting conflict again on every pass.
	plan, problem := PlanSource(cluster, msaName, msa, hubSecret, c.impersonator)
	switch plan {
	case PlanRemove:
		c.setProblem(key, msa, problem)
		why := "its pair no longer syncs there"
		if c.impersonator != "" && msaName == c.impersonator {
			why = "it is the gateway's impersonating credential, never copied"
		}
		return c.deleteCopies(ctx, existing, nil, why)
	case PlanHold:
		c.setProblem(key, msa, problem)
		if problem == ProblemNone {
			c.log.Debug("ManagedServiceAccount has not reported its token Secret yet", "pair", key)
		}
		return nil
	}

	want := map[string]*cpv1alpha1.ClusterProfile{}
	profiles, _ := c.s.profileIdx.ByIndex(byName, cluster)
	for _, o := range profiles {
		p, ok := o.(*cpv1alpha1.ClusterProfile)
		if ok && hub.IsOwned(p, c.s.opts.ClusterManager) && p.DeletionTimestamp == nil && c.s.namespaceActive(p.Namespace) {
			want[p.Namespace] = p
		}
	}

	var errs []error
	conflict := false
	rotated := sets.New[string]()
	name := hub.CopyName(cluster, msaName)
	for _, ns := range sets.List(sets.KeySet(want)) {
		desired := DesiredCopy(cluster, msaName, msa, hubSecret, want[ns])
		cur, err := c.copies.Secrets(ns).Get(name)
		if err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, err)
			continue
		}
		if pendingFor(c.written, ns+"/"+name, cur) {
			// Our last write is not in the cache yet; its event re-queues.
			continue
		}
		if cur != nil {
			switch copyOwnership(cur, cluster, msaName, want[ns], c.s.opts.ClusterManager) {
			case foreign:
				conflict = true
				continue
			case ownedDangling:
				// Left from a profile that was deleted and recreated:
				// remove it as the garbage collector would, then write
				// the new profile's copy.
				if err := c.deleteCopy(ctx, cur, "its profile was recreated"); err != nil {
					errs = append(errs, err)
					continue
				}
				cur = nil
			}
		}
		if cur == nil {
			switch err := c.create(ctx, cluster, msaName, desired); {
			case errors.Is(err, errForeignSecret):
				conflict = true
			case err != nil:
				errs = append(errs, err)
			}
			continue
		}
		updated, changed := ReconcileCopy(cur, desired)
		if !changed {
			continue
		}
		if cur.Annotations[hub.AnnotationTokenFingerprint] != desired.Annotations[hub.AnnotationTokenFingerprint] {
			rotated.Insert(ns)
		}
		typ := stream.CredentialSynced
		if rotated.Has(ns) {
			typ = stream.CredentialRotated
		}
		if err := c.write(ctx, "update", func(ctx context.Context) error {
			out, err := c.s.clients.Kube.CoreV1().Secrets(ns).Update(ctx, updated, metav1.UpdateOptions{})
			if err == nil {
				c.written.wrote(out)
				c.s.notifyCredential(typ, out)
			}
			return err
		}); err != nil {
			errs = append(errs, fmt.Errorf("update credential copy %s/%s: %w", ns, name, err))
			rotated.Delete(ns)
		}
	}
	if conflict {
		c.setProblem(key, msa, ProblemNameConflict)
	} else {
		c.setProblem(key, msa, ProblemNone)
	}
	if err := c.deleteCopies(ctx, existing, want, "its pair no longer syncs there"); err != nil {
		errs = append(errs, err)
	}
	if rotated.Len() > 0 {
		c.reportRotation(msa, hubSecret, rotated)
	}
	return errors.Join(errs...)
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

// liveProfile returns the cached profile named after the cluster in ns, of
// any cluster manager.
func (c *credentials) liveProfile(ns, cluster string) *cpv1alpha1.ClusterProfile {
	obj, ok, err := c.s.profileIdx.GetByKey(ns + "/" + cluster)
	if err != nil || !ok {
		return nil
	}
	p, _ := obj.(*cpv1alpha1.ClusterProfile)
	return p
}

var errForeignSecret = errors.New("a Secret that hubsync does not own has the copy's name")

func (c *credentials) create(ctx context.Context, cluster, msaName string, want *corev1.Secret) error {
	err := c.write(ctx, "create", func(ctx context.Context) error {
		out, err := c.s.clients.Kube.CoreV1().Secrets(want.Namespace).Create(ctx, want, metav1.CreateOptions{})
		if err == nil {
			c.written.wrote(out)
			c.s.notifyCredential(stream.CredentialSynced, out)
		}
		return err
	})
	switch {
	case err == nil, isNamespaceGone(err):
		return nil
	case apierrors.IsAlreadyExists(err):
		// Not in our cache: either not yet seen, or not ours at all (no
		// synced-from label). Look before deciding.
		cur, gerr := c.s.clients.Kube.CoreV1().Secrets(want.Namespace).Get(ctx, want.Name, metav1.GetOptions{})
		if gerr == nil && copyOwnership(cur, cluster, msaName, c.liveProfile(want.Namespace, cluster), c.s.opts.ClusterManager) == foreign {
			return errForeignSecret
		}
		return fmt.Errorf("create credential copy %s/%s: %w", want.Namespace, want.Name, err)
	default:
		return fmt.Errorf("create credential copy %s/%s: %w", want.Namespace, want.Name, err)
	}
}

// deleteCopies removes the copies in namespaces not in keep, logging why.
// A Secret whose controller is a live profile that is not hubsync's is left
// alone.
func (c *credentials) deleteCopies(ctx context.Context, existing map[string]*corev1.Secret, keep map[string]*cpv1alpha1.ClusterProfile, why string) error {
	var errs []error
	for ns, sec := range existing {
		if _, ok := keep[ns]; ok || pendingFor(c.written, ns+"/"+sec.Name, sec) {
			continue
		}
		pair, _ := copyPair(sec)
		cluster, msa, _ := strings.Cut(pair, "/")
		if copyOwnership(sec, cluster, msa, c.liveProfile(ns, cluster), c.s.opts.ClusterManager) == foreign {
			continue
		}
		if err := c.deleteCopy(ctx, sec, why); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// deleteCopy deletes one copy, guarded by its uid.
func (c *credentials) deleteCopy(ctx context.Context, sec *corev1.Secret, why string) error {
	uid := sec.UID
	err := c.write(ctx, "delete", func(ctx context.Context) error {
		return c.s.clients.Kube.CoreV1().Secrets(sec.Namespace).Delete(ctx, sec.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
	})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("delete credential copy %s/%s: %w", sec.Namespace, sec.Name, err)
	}
	c.written.deletedObj(sec)
	if err == nil {
		c.s.notifyCredential(stream.CredentialRemoved, sec)
	}
	pair, _ := copyPair(sec)
	c.log.Info("credential copy removed", "namespace", sec.Namespace, "secret", sec.Name, "source", pair, "reason", why,
		"madeBy", map[bool]string{true: "hubsync", false: "the upstream syncer"}[sec.Annotations[hub.AnnotationSource] != ""])
	return nil
}

func (c *credentials) write(ctx context.Context, op string, f func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, c.s.opts.RequestTimeout)
	defer cancel()
	err := f(ctx)
	c.writes.WithLabelValues(op).Inc()
	if err != nil {
		c.s.metrics.writeErrors.WithLabelValues("credential-" + op).Inc()
	}
	return err
}

// reportRotation logs and records one event per rotation of a pair, naming
// the new token's fingerprint and expiry, never the token.
func (c *credentials) reportRotation(msa *msav1beta1.ManagedServiceAccount, hubSecret *corev1.Secret, namespaces sets.Set[string]) {
	c.rotations.Inc()
	fp := hub.TokenFingerprint(hubSecret.Data[hub.TokenKey])
	expiry := "unknown"
	if exp, ok := TokenExpiry(msa, hubSecret.Data[hub.TokenKey]); ok {
		expiry = exp.Format(time.RFC3339)
	}
	c.log.Info("credential rotated", "cluster", msa.Namespace, "managedServiceAccount", msa.Name,
		"fingerprint", fp, "expires", expiry, "copies", namespaces.Len(), "namespaces", strings.Join(sets.List(namespaces), ","))
	c.s.recorder.Eventf(msa, corev1.EventTypeNormal, "CredentialRotated",
		"token %s (expires %s) copied to %d namespace(s): %s", fp, expiry, namespaces.Len(), strings.Join(sets.List(namespaces), ", "))
}

// setProblem records a pair's problem, reporting it (log, Event on the
// MSA) only when it changes, and keeps the gauge current.
func (c *credentials) setProblem(key string, msa *msav1beta1.ManagedServiceAccount, p CopyProblem) {
	c.mu.Lock()
	prev := c.problems[key]
	if p == ProblemNone {
		delete(c.problems, key)
	} else {
		c.problems[key] = p
	}
	if p != prev {
		if prev != ProblemNone {
			c.problemsG.WithLabelValues(prev.MetricReason()).Dec()
		}
		if p != ProblemNone {
			c.problemsG.WithLabelValues(p.MetricReason()).Inc()
		}
	}
	c.mu.Unlock()
	switch {
	case p == prev:
	case p == ProblemNone:
		c.log.Info("credential problem resolved", "pair", key, "was", string(prev))
	case p == ProblemImpersonator:
		c.log.Warn("refusing to copy the gateway's impersonating credential", "pair", key, "reason", p.MetricReason(), "problem", string(p))
		if msa != nil {
			c.s.recorder.Eventf(msa, corev1.EventTypeWarning, p.EventReason(), "hubsync does not copy this token: %s", string(p))
		}
	default:
		c.log.Warn("credential copies cannot be written", "pair", key, "reason", p.MetricReason(), "problem", string(p))
		if msa != nil {
			c.s.recorder.Eventf(msa, corev1.EventTypeWarning, p.EventReason(), "hubsync cannot copy this token: %s", string(p))
		}
	}
}
