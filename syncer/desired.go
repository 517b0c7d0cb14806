package syncer

import (
	"fmt"
	"sort"

	"github.com/hubsync/hubsync/hub"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/sets"
	clusterv1 "open-cluster-management.io/api/cluster/v1"
	clusterv1beta2 "open-cluster-management.io/api/cluster/v1beta2"
	cpv1alpha1 "sigs.k8s.io/cluster-inventory-api/apis/v1alpha1"
)

// Label keys and condition types hubsync writes, fixed by the upstream
// contracts so that existing ClusterProfile consumers work unchanged.
const (
	ConditionControlPlaneHealthy = cpv1alpha1.ClusterConditionControlPlaneHealthy
	ConditionJoined              = "Joined"

	// maxPropertyValue is the ClusterProfile CRD's limit on a property value.
	maxPropertyValue = 1024
	// maxPropertyName is the ClusterProfile CRD's limit on a property name.
	maxPropertyName = 253
)

// Membership is the result of evaluating which consumer namespaces must
// hold a profile for one cluster.
type Membership struct {
	// Desired namespaces must hold a profile.
	Desired sets.Set[string]
	// Held namespaces are bound to a set whose selector cannot be evaluated;
	// their existing profiles are neither created nor deleted until the set
	// is fixed, so a typo in a selector never wipes a namespace's profiles.
	Held sets.Set[string]
	// InvalidSets names the sets whose selectors could not be evaluated.
	InvalidSets []string
}

// SetSelector returns the selector a ManagedClusterSet uses to pick its
// clusters. An empty or ExclusiveClusterSetLabel type selects clusters
// labelled with the set's name; LabelSelector uses the given selector, where
// {} selects every cluster and nil selects none.
func SetSelector(set *clusterv1beta2.ManagedClusterSet) (labels.Selector, error) {
	switch set.Spec.ClusterSelector.SelectorType {
	case "", clusterv1beta2.ExclusiveClusterSetLabel:
		return labels.SelectorFromSet(labels.Set{hub.LabelClusterSet: set.Name}), nil
	case clusterv1beta2.LabelSelector:
		if set.Spec.ClusterSelector.LabelSelector == nil {
			return labels.Nothing(), nil
		}
		sel, err := metav1.LabelSelectorAsSelector(set.Spec.ClusterSelector.LabelSelector)
		if err != nil {
			return nil, fmt.Errorf("cluster set %q: invalid label selector: %w", set.Name, err)
		}
		return sel, nil
	default:
		return nil, fmt.Errorf("cluster set %q: unknown selector type %q", set.Name, set.Spec.ClusterSelector.SelectorType)
	}
}

// IsBound reports whether a binding entitles its namespace to the set's
// clusters: its name equals spec.clusterSet, its Bound condition is True and
// it is not being deleted.
func IsBound(b *clusterv1beta2.ManagedClusterSetBinding) bool {
	return b.DeletionTimestamp == nil &&
		b.Name == b.Spec.ClusterSet &&
		meta.IsStatusConditionTrue(b.Status.Conditions, clusterv1beta2.ClusterSetBindingBoundType)
}

// DesiredNamespaces computes which namespaces must hold a profile for
// cluster, given the candidate cluster sets and the bindings to them. A nil
// or deleting cluster belongs nowhere.
func DesiredNamespaces(cluster *clusterv1.ManagedCluster, clusterSets []*clusterv1beta2.ManagedClusterSet, bindings []*clusterv1beta2.ManagedClusterSetBinding) Membership {
	m := Membership{Desired: sets.New[string](), Held: sets.New[string]()}
	if cluster == nil || cluster.DeletionTimestamp != nil {
		return m
	}
	member := map[string]bool{} // set name -> cluster is a member
	invalid := sets.New[string]()
	for _, set := range clusterSets {
		if set.DeletionTimestamp != nil {
			continue
		}
		sel, err := SetSelector(set)
		if err != nil {
			invalid.Insert(set.Name)
			continue
		}
		if sel.Matches(labels.Set(cluster.Labels)) {
			member[set.Name] = true
		}
	}
	for _, b := range bindings {
		if !IsBound(b) {
			continue
		}
		switch {
		case member[b.Spec.ClusterSet]:
			m.Desired.Insert(b.Namespace)
		case invalid.Has(b.Spec.ClusterSet):
			m.Held.Insert(b.Namespace)
		}
	}
	// A namespace entitled through a valid set is desired whatever its other
	// sets say.
	m.Held = m.Held.Difference(m.Desired)
	m.InvalidSets = sets.List(invalid)
	return m
}

// ProfileLabels returns the labels hubsync owns on a cluster's profile.
func ProfileLabels(manager string, cluster *clusterv1.ManagedCluster) map[string]string {
	return map[string]string{
		hub.LabelClusterManager: manager,
		hub.LabelClusterName:    hub.ClusterNameLabelValue(cluster.Name),
		hub.LabelProfileSet:     cluster.Labels[hub.LabelClusterSet],
	}
}

// NewProfile returns the profile hubsync creates for cluster in namespace,
// with its status already computed so that a create and one status write
// make a complete profile.
func NewProfile(manager, namespace string, cluster *clusterv1.ManagedCluster, providers []Provider) *cpv1alpha1.ClusterProfile {
	p := &cpv1alpha1.ClusterProfile{
		ObjectMeta: metav1.ObjectMeta{
			Name:      cluster.Name,
			Namespace: namespace,
			Labels:    ProfileLabels(manager, cluster),
		},
		Spec: cpv1alpha1.ClusterProfileSpec{
			DisplayName:    cluster.Name,
			ClusterManager: cpv1alpha1.ClusterManager{Name: manager},
		},
	}
	p.Status = DesiredStatus(p.Status, cluster, providers)
	return p
}

// ReconcileMeta returns a copy of the profile with hubsync's labels and spec
// restored, and whether anything changed. Labels set by others are kept.
func ReconcileMeta(p *cpv1alpha1.ClusterProfile, manager string, cluster *clusterv1.ManagedCluster) (*cpv1alpha1.ClusterProfile, bool) {
	want := ProfileLabels(manager, cluster)
	changed := p.Spec.DisplayName != cluster.Name
	for k, v := range want {
		if cur, ok := p.Labels[k]; !ok || cur != v {
			changed = true
		}
	}
	if !changed {
		return p, false
	}
	out := p.DeepCopy()
	if out.Labels == nil {
		out.Labels = map[string]string{}
	}
	for k, v := range want {
		out.Labels[k] = v
	}
	out.Spec.DisplayName = cluster.Name
	return out, true
}

// DesiredStatus returns the status a profile must have for cluster, starting
// from its current status so that entries written by others (conditions of
// other types, access providers of other names) are kept, and
// lastTransitionTime only moves when a condition's status changes.
func DesiredStatus(cur cpv1alpha1.ClusterProfileStatus, cluster *clusterv1.ManagedCluster, providers []Provider) cpv1alpha1.ClusterProfileStatus {
	st := *cur.DeepCopy()
	st.AccessProviders = mergeAccessProviders(st.AccessProviders, providers, cluster)
	st.Version.Kubernetes = cluster.Status.Version.Kubernetes
	st.Properties = Properties(cluster.Status.ClusterClaims)
	mirror := func(from, to string) {
		c := meta.FindStatusCondition(cluster.Status.Conditions, from)
		if c == nil {
			return
		}
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{
			Type:               to,
			Status:             c.Status,
			Reason:             validReason(c.Reason),
			Message:            c.Message,
			LastTransitionTime: c.LastTransitionTime,
		})
	}
	mirror(clusterv1.ManagedClusterConditionAvailable, ConditionControlPlaneHealthy)
	mirror(clusterv1.ManagedClusterConditionJoined, ConditionJoined)
	return st
}

// Properties maps cluster claims to profile properties, sorted by name.
// Claims the ClusterProfile schema would reject (empty or over-long names
// and values, duplicates) are left out rather than failing the whole write.
func Properties(claims []clusterv1.ManagedClusterClaim) []cpv1alpha1.Property {
	seen := sets.New[string]()
	props := []cpv1alpha1.Property{}
	for _, c := range claims {
		if c.Name == "" || c.Value == "" || len(c.Name) > maxPropertyName || len(c.Value) > maxPropertyValue || seen.Has(c.Name) {
			continue
		}
		seen.Insert(c.Name)
		props = append(props, cpv1alpha1.Property{Name: c.Name, Value: c.Value})
	}
	sort.Slice(props, func(i, j int) bool { return props[i].Name < props[j].Name })
	return props
}

// SkippedClaims counts the claims Properties leaves out.
func SkippedClaims(claims []clusterv1.ManagedClusterClaim) int {
	return len(claims) - len(Properties(claims))
}

// validReason keeps a condition reason the CRD accepts; ManagedCluster
// conditions written by old agents may carry an empty reason.
func validReason(r string) string {
	if r == "" {
		return "Unknown"
	}
	return r
}

// Plan is what must be written for one cluster's profiles.
type Plan struct {
	// Create lists the namespaces that need a new profile.
	Create []string
	// Update lists existing profiles of ours that must stay; each is
	// compared with its desired labels, spec and status before any write.
	Update []*cpv1alpha1.ClusterProfile
	// Delete lists profiles of ours that no longer have a reason to exist.
	Delete []*cpv1alpha1.ClusterProfile
	// Conflicts lists foreign profiles that hold a name hubsync wants.
	Conflicts []*cpv1alpha1.ClusterProfile
}

// PlanProfiles compares a cluster's membership with the profiles named
// after it. Namespaces for which writable returns false (terminating or
// unknown) are left alone, as are held namespaces and every profile of
// another manager. Results are sorted by namespace.
func PlanProfiles(m Membership, existing []*cpv1alpha1.ClusterProfile, manager string, writable func(namespace string) bool) Plan {
	var plan Plan
	byNS := make(map[string]*cpv1alpha1.ClusterProfile, len(existing))
	for _, p := range existing {
		byNS[p.Namespace] = p
	}
	for _, ns := range sets.List(m.Desired) {
		if !writable(ns) {
			continue
		}
		switch p := byNS[ns]; {
		case p == nil:
			plan.Create = append(plan.Create, ns)
		case !hub.IsOwned(p, manager):
			plan.Conflicts = append(plan.Conflicts, p)
		default:
			plan.Update = append(plan.Update, p)
		}
	}
	stale := make([]*cpv1alpha1.ClusterProfile, 0, len(existing))
	for _, p := range existing {
		if !m.Desired.Has(p.Namespace) && !m.Held.Has(p.Namespace) && hub.IsOwned(p, manager) && writable(p.Namespace) {
			stale = append(stale, p)
		}
	}
	sort.Slice(stale, func(i, j int) bool { return stale[i].Namespace < stale[j].Namespace })
	plan.Delete = stale
	return plan
}
