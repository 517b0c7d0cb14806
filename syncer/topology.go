package syncer

import (
	"context"
	"errors"
	"fmt"
	"sort"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/sets"
	clusterv1 "open-cluster-management.io/api/cluster/v1"
	cpv1alpha1 "sigs.k8s.io/cluster-inventory-api/apis/v1alpha1"
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
		if n := SkippedClaims(cluster.Status.ClusterClaims); n > 0 {
			s.log.Debug("cluster claims left out of profile properties", "cluster", name, "count", n)
		}
	} else {
		m = DesiredNamespaces(nil, nil, nil)
	}

	existing := map[string]*cpv1alpha1.ClusterProfile{}
	objs, err := s.profileIdx.ByIndex(byName, name)
	if err != nil {
		return fmt.Errorf("index profiles of %s: %w", name, err)
	}
	for _, o := range objs {
		if p, ok := o.(*cpv1alpha1.ClusterProfile); ok {
			existing[p.Namespace] = p
		}
	}

	var errs []error
	for _, ns := range sets.List(m.Desired) {
		key := ns + "/" + name
		if !s.namespaceActive(ns) {
			continue
		}
		p := existing[ns]
		if s.writes.pending(key, p) {
			continue
		}
		switch {
		case p == nil:
			s.clearConflict(key)
			err = s.create(ctx, ns, cluster)
		case !IsOwned(p, s.opts.ClusterManager):
			err = s.reportConflict(p)
		default:
			s.clearConflict(key)
			err = s.update(ctx, p, cluster)
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	stale := make([]string, 0, len(existing))
	for ns := range existing {
		stale = append(stale, ns)
	}
	sort.Strings(stale)
	for _, ns := range stale {
		p := existing[ns]
		if m.Desired.Has(ns) {
			continue
		}
		s.clearConflict(ns + "/" + name)
		if s.writes.pending(ns+"/"+name, p) {
			continue
		}
		if m.Held.Has(ns) || !IsOwned(p, s.opts.ClusterManager) || !s.namespaceActive(ns) {
			continue
		}
		if err := s.delete(ctx, p); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// namespaceActive reports whether hubsync may write in a namespace: it
// exists in the cache and is not terminating.
func (s *Syncer) namespaceActive(name string) bool {
	ns, err := s.namespaces.Get(name)
	if err != nil {
		return false
	}
	return ns.DeletionTimestamp == nil && ns.Status.Phase != corev1.NamespaceTerminating
}

func (s *Syncer) create(ctx context.Context, ns string, cluster *clusterv1.ManagedCluster) error {
	want := NewProfile(s.opts.ClusterManager, ns, cluster)
	status := want.Status
	ctx, cancel := context.WithTimeout(ctx, s.opts.RequestTimeout)
	defer cancel()
	created, err := s.clients.Profiles.ApisV1alpha1().ClusterProfiles(ns).Create(ctx, want, metav1.CreateOptions{})
	s.countWrite("create", err)
	if err != nil {
		if isNamespaceGone(err) {
			return nil
		}
		return fmt.Errorf("create profile %s/%s: %w", ns, cluster.Name, err)
	}
	s.log.Debug("profile created", "namespace", ns, "cluster", cluster.Name)
	s.writes.wrote(created)
	created.Status = status
	updated, err := s.clients.Profiles.ApisV1alpha1().ClusterProfiles(ns).UpdateStatus(ctx, created, metav1.UpdateOptions{})
	s.countWrite("status", err)
	if err != nil {
		if isNamespaceGone(err) {
			return nil
		}
		return fmt.Errorf("write status of new profile %s/%s: %w", ns, cluster.Name, err)
	}
	s.writes.wrote(updated)
	return nil
}

func (s *Syncer) update(ctx context.Context, cur *cpv1alpha1.ClusterProfile, cluster *clusterv1.ManagedCluster) error {
	ctx, cancel := context.WithTimeout(ctx, s.opts.RequestTimeout)
	defer cancel()
	client := s.clients.Profiles.ApisV1alpha1().ClusterProfiles(cur.Namespace)
	p, changed := ReconcileMeta(cur, s.opts.ClusterManager, cluster)
	if changed {
		updated, err := client.Update(ctx, p, metav1.UpdateOptions{})
		s.countWrite("update", err)
		if err != nil {
			if isNamespaceGone(err) {
				return nil
			}
			return fmt.Errorf("restore profile %s/%s: %w", cur.Namespace, cur.Name, err)
		}
		s.log.Debug("profile labels or spec updated", "namespace", cur.Namespace, "cluster", cur.Name)
		s.writes.wrote(updated)
		p = updated
	}
	status := DesiredStatus(p.Status, cluster)
	if equality.Semantic.DeepEqual(status, p.Status) {
		return nil
	}
	if !changed {
		p = p.DeepCopy()
	}
	p.Status = status
	updated, err := client.UpdateStatus(ctx, p, metav1.UpdateOptions{})
	s.countWrite("status", err)
	if err != nil {
		if isNamespaceGone(err) {
			return nil
		}
		return fmt.Errorf("update status of profile %s/%s: %w", cur.Namespace, cur.Name, err)
	}
	s.writes.wrote(updated)
	return nil
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
	s.log.Debug("profile deleted", "namespace", p.Namespace, "cluster", p.Name)
	return nil
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

// reportConflict records a same-named foreign profile: a log line and a
// Kubernetes Event when first seen, a metric always, and an error so the
// cluster is retried with growing backoff rather than in a hot loop.
func (s *Syncer) reportConflict(p *cpv1alpha1.ClusterProfile) error {
	key := p.Namespace + "/" + p.Name
	manager := p.Labels[LabelClusterManager]
	s.mu.Lock()
	_, known := s.conflicts[key]
	s.conflicts[key] = manager
	s.metrics.conflicts.Set(float64(len(s.conflicts)))
	s.mu.Unlock()
	if !known {
		s.metrics.conflictsTotal.Inc()
		s.log.Warn("a ClusterProfile of another cluster manager blocks hubsync's profile",
			"namespace", p.Namespace, "cluster", p.Name, "manager", manager)
		s.recorder.Eventf(p, corev1.EventTypeWarning, "ProfileConflict",
			"hubsync (cluster manager %q) wants a profile named %q here, but this one belongs to cluster manager %q; hubsync leaves it alone and retries with backoff",
			s.opts.ClusterManager, p.Name, manager)
	}
	return &conflictError{namespace: p.Namespace, name: p.Name, manager: manager}
}

func (s *Syncer) clearConflict(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.conflicts[key]; !ok {
		return
	}
	delete(s.conflicts, key)
	s.metrics.conflicts.Set(float64(len(s.conflicts)))
	s.log.Info("profile conflict resolved", "profile", key)
}
