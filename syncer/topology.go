package syncer

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	corelisters "k8s.io/client-go/listers/core/v1"
	clusterv1 "open-cluster-management.io/api/cluster/v1"
	cpv1alpha1 "sigs.k8s.io/cluster-inventory-api/apis/v1alpha1"

	"github.com/hubsync/hubsync/hub"
	"github.com/hubsync/hubsync/stream"
)

// conflictError says a desired profile is blocked by a same-named profile
// that another cluster manager owns.
type conflictError struct {
	namespace, name, manager string
}

func (e *conflictError) Error() string {
	return fmt.Sprintf("profile %s/%s belongs to cluster manager %q, not hubsync", e.namespace, e.name, e.manager)
}

// onlyConflicts reports whether every error joined in err is a conflict.
func onlyConflicts(err error) bool {
	var errs []error
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	} else {
		errs = []error{err}
	}
	for _, e := range errs {
		var c *conflictError
		if !errors.As(e, &c) {
			return false
		}
	}
	return len(errs) > 0
}

func labelsOf(c *clusterv1.ManagedCluster) labels.Set { return labels.Set(c.Labels) }

// reconcile converges every consumer namespace's profile for one cluster.
// Errors from different namespaces are joined so that one bad namespace
// never stops the others, and the cluster is retried with backoff.
func (s *Syncer) reconcile(ctx context.Context, name string) error {
	cluster, err := s.clusters.Get(name)
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("get cluster %s: %w", name, err)
	}
	var m Membership
	if cluster != nil {
		candidates := s.candidateSets(cluster)
		m = DesiredNamespaces(cluster, candidates, s.bindingsFor(candidates))
	} else {
		m = DesiredNamespaces(nil, nil, nil)
	}

	objs, err := s.profileIdx.ByIndex(byName, name)
	if err != nil {
		return fmt.Errorf("index profiles of %s: %w", name, err)
	}
	existing := make([]*cpv1alpha1.ClusterProfile, 0, len(objs))
	for _, o := range objs {
		if p, ok := o.(*cpv1alpha1.ClusterProfile); ok {
			existing = append(existing, p)
		}
	}
	plan := PlanProfiles(m, existing, s.opts.ClusterManager, s.namespaceActive)
	s.resolveConflicts(name, plan.Conflicts)

	// A profile whose last write by hubsync is not yet in the cache is left
	// for the watch event that brings it.
	var errs []error
	for _, ns := range plan.Create {
		if s.writes.pending(ns+"/"+name, nil) {
			continue
		}
		if err := s.create(ctx, ns, cluster); err != nil {
			errs = append(errs, err)
		}
	}
	for _, p := range plan.Update {
		if pendingFor(s.writes, p.Namespace+"/"+p.Name, p) {
			continue
		}
		if err := s.update(ctx, p, cluster); err != nil {
			errs = append(errs, err)
		}
	}
	for _, p := range plan.Delete {
		if pendingFor(s.writes, p.Namespace+"/"+p.Name, p) {
			continue
		}
		if err := s.delete(ctx, p); err != nil {
			errs = append(errs, err)
		}
	}
	for _, p := range plan.Conflicts {
		errs = append(errs, &conflictError{namespace: p.Namespace, name: p.Name, manager: p.Labels[hub.LabelClusterManager]})
	}
	return errors.Join(errs...)
}

// namespaceActive reports whether hubsync may write in a namespace: it
// exists in the cache and is not terminating.
func (s *Syncer) namespaceActive(name string) bool { return namespaceActive(s.namespaces, name) }

func namespaceActive(namespaces corelisters.NamespaceLister, name string) bool {
	ns, err := namespaces.Get(name)
	if err != nil {
		return false
	}
	return ns.DeletionTimestamp == nil && ns.Status.Phase != corev1.NamespaceTerminating
}

func (s *Syncer) create(ctx context.Context, ns string, cluster *clusterv1.ManagedCluster) error {
	providers := s.providers.snapshot()
	want := NewProfile(s.opts.ClusterManager, ns, cluster, providers)
	status := want.Status
	// Status is a subresource: the server drops it from a create, after
	// decoding it and tracking its fields. Sent, it was most of the create's
	// body, work for the API server on every new profile of a burst; the
	// status write that follows carries it.
	want.Status = cpv1alpha1.ClusterProfileStatus{}
	ctx, cancel := context.WithTimeout(ctx, s.opts.RequestTimeout)
	defer cancel()
	intent := s.foreign.writers.profilePrint(want, &status, providers)
	created, err := s.clients.Profiles.ApisV1alpha1().ClusterProfiles(ns).Create(ctx, want, metav1.CreateOptions{FieldManager: FieldManager})
	s.countWrite("create", err)
	if err != nil {
		if isNamespaceGone(err) {
			return nil
		}
		return fmt.Errorf("create profile %s/%s: %w", ns, cluster.Name, err)
	}
	s.log.Debug("profile created", "namespace", ns, "cluster", cluster.Name)
	s.writes.wrote(created)
	s.foreign.writers.wrote(KindProfile, ns, created.Name, created.ResourceVersion, intent)
	s.noteSkippedClaims(cluster)
	if statusEmpty(status) {
		// Nothing to report yet (no version, conditions, claims or
		// providers): the create alone is the whole profile.
		s.notifyProfile(stream.ProfileCreated, created)
		return nil
	}
	withStatus := created.DeepCopy()
	withStatus.Status = status
	updated, err := s.writeStatus(ctx, withStatus)
	s.countWrite("status", err)
	if err != nil {
		// The profile exists, without status: say so now; the retry's
		// status write follows as an update.
		s.notifyProfile(stream.ProfileCreated, created)
		if isNamespaceGone(err) {
			return nil
		}
		return fmt.Errorf("write status of new profile %s/%s: %w", ns, cluster.Name, err)
	}
	s.writes.wrote(updated)
	s.foreign.writers.wrote(KindProfile, ns, updated.Name, updated.ResourceVersion, intent)
	s.notifyProfile(stream.ProfileCreated, updated)
	return nil
}

func (s *Syncer) update(ctx context.Context, cur *cpv1alpha1.ClusterProfile, cluster *clusterv1.ManagedCluster) error {
	providers := s.providers.snapshot()
	p, changed := ReconcileMeta(cur, s.opts.ClusterManager, cluster)
	status := DesiredStatus(p.Status, cluster, providers)
	if !changed && equality.Semantic.DeepEqual(status, p.Status) {
		return nil
	}
	intent := s.foreign.writers.profilePrint(p, &status, providers)
	if s.holdProfile(ctx, cur, p, &status, providers, intent) {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.opts.RequestTimeout)
	defer cancel()
	if changed {
		updated, err := s.clients.Profiles.ApisV1alpha1().ClusterProfiles(cur.Namespace).Update(ctx, p, metav1.UpdateOptions{FieldManager: FieldManager})
		s.countWrite("update", err)
		if err != nil {
			if isNamespaceGone(err) {
				return nil
			}
			return fmt.Errorf("restore profile %s/%s: %w", cur.Namespace, cur.Name, err)
		}
		s.log.Debug("profile labels or spec updated", "namespace", cur.Namespace, "cluster", cur.Name)
		s.writes.wrote(updated)
		s.foreign.writers.wrote(KindProfile, updated.Namespace, updated.Name, updated.ResourceVersion, intent)
		p = updated
		status = DesiredStatus(p.Status, cluster, providers)
		if equality.Semantic.DeepEqual(status, p.Status) {
			s.notifyProfile(stream.ProfileUpdated, p)
			return nil
		}
	} else {
		p = p.DeepCopy()
	}
	s.noteSkippedClaims(cluster)
	p.Status = status
	updated, err := s.writeStatus(ctx, p)
	s.countWrite("status", err)
	if err != nil {
		if isNamespaceGone(err) {
			return nil
		}
		return fmt.Errorf("update status of profile %s/%s: %w", cur.Namespace, cur.Name, err)
	}
	s.writes.wrote(updated)
	s.foreign.writers.wrote(KindProfile, updated.Namespace, updated.Name, updated.ResourceVersion, intent)
	s.notifyProfile(stream.ProfileUpdated, updated)
	if providersChanged(cur, updated) {
		s.notifyProfile(stream.AccessProviderUpdated, updated)
	}
	return nil
}

// holdProfile reports whether hubsync must leave a profile alone now,
// because another controller keeps writing what hubsync wants it to say
// (want's labels and spec, status st).
func (s *Syncer) holdProfile(ctx context.Context, cur, want *cpv1alpha1.ClusterProfile, st *cpv1alpha1.ClusterProfileStatus, providers []Provider, intent uint64) bool {
	return s.foreign.hold(ctx, ownedWrite{
		kind: KindProfile, namespace: cur.Namespace, name: cur.Name, rv: cur.ResourceVersion, intent: intent,
		requeue: func(d time.Duration) { s.queue.AddAfter(cur.Name, d) },
		subject: cur,
		drift:   func() []string { return profileDrift(cur, want, st, providers) },
		managedFields: func(ctx context.Context) ([]metav1.ManagedFieldsEntry, error) {
			// A list of the one profile: hubsync's role may list profiles,
			// not get them.
			l, err := s.clients.Profiles.ApisV1alpha1().ClusterProfiles(cur.Namespace).List(ctx, metav1.ListOptions{
				FieldSelector: fields.OneTermEqualSelector("metadata.name", cur.Name).String(),
			})
			if err != nil || len(l.Items) == 0 {
				return nil, err
			}
			return l.Items[0].ManagedFields, nil
		},
	})
}

func (s *Syncer) delete(ctx context.Context, p *cpv1alpha1.ClusterProfile) error {
	ctx, cancel := context.WithTimeout(ctx, s.opts.RequestTimeout)
	defer cancel()
	// The UID precondition keeps a stale cache from deleting a profile that
	// was recreated meanwhile.
	err := s.clients.Profiles.ApisV1alpha1().ClusterProfiles(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{
		Preconditions: &metav1.Preconditions{UID: &p.UID},
	})
	s.countWrite("delete", err)
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete profile %s/%s: %w", p.Namespace, p.Name, err)
	}
	s.writes.deletedObj(p)
	s.foreign.writers.forget(KindProfile, p.Namespace, p.Name)
	if err == nil {
		s.notifyProfile(stream.ProfileDeleted, p)
	}
	s.log.Debug("profile deleted", "namespace", p.Namespace, "cluster", p.Name)
	return nil
}

// noteSkippedClaims counts, for each status write, the cluster's claims
// that the ClusterProfile schema would reject and that are left out.
func (s *Syncer) noteSkippedClaims(cluster *clusterv1.ManagedCluster) {
	if n := SkippedClaims(cluster.Status.ClusterClaims); n > 0 {
		s.metrics.skippedClaims.Add(float64(n))
		s.log.Debug("cluster claims left out of profile properties", "cluster", cluster.Name, "count", n)
	}
}

func (s *Syncer) countWrite(op string, err error) {
	s.metrics.writes.WithLabelValues(op).Inc()
	if err != nil {
		s.metrics.writeErrors.WithLabelValues(op).Inc()
	}
}

// isNamespaceGone reports an error that means the namespace is being or
// has been deleted; there is nothing to do there and nothing to retry.
func isNamespaceGone(err error) bool {
	if apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause) {
		return true
	}
	return apierrors.IsNotFound(err)
}

// resolveConflicts updates the set of known conflicts for one cluster: a
// conflict seen for the first time gets a log line and a Kubernetes Event,
// one that went away a log line; the gauge always shows the current count.
// The caller returns an error per conflict so the cluster is retried with
// growing backoff rather than in a hot loop.
func (s *Syncer) resolveConflicts(cluster string, current []*cpv1alpha1.ClusterProfile) {
	now := map[string]*cpv1alpha1.ClusterProfile{}
	for _, p := range current {
		now[p.Namespace+"/"+p.Name] = p
	}
	s.mu.Lock()
	var added []*cpv1alpha1.ClusterProfile
	var cleared []string
	for key, p := range now {
		if _, known := s.conflicts[key]; !known {
			added = append(added, p)
		}
		s.conflicts[key] = cluster
	}
	for key, c := range s.conflicts {
		if _, still := now[key]; c == cluster && !still {
			delete(s.conflicts, key)
			cleared = append(cleared, key)
		}
	}
	s.metrics.conflicts.Set(float64(len(s.conflicts)))
	s.mu.Unlock()

	for _, p := range added {
		manager := p.Labels[hub.LabelClusterManager]
		s.metrics.conflictsTotal.Inc()
		s.log.Warn("a ClusterProfile of another cluster manager blocks hubsync's profile",
			"namespace", p.Namespace, "cluster", p.Name, "manager", manager)
		s.recorder.Eventf(p, corev1.EventTypeWarning, "ProfileConflict",
			"hubsync (cluster manager %q) wants a profile named %q here, but this one belongs to cluster manager %q; hubsync leaves it alone and retries with backoff",
			s.opts.ClusterManager, p.Name, manager)
	}
	for _, key := range cleared {
		s.log.Info("profile conflict resolved", "profile", key)
	}
}
