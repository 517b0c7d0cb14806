package syncer

import (
	"cmp"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	msav1beta1 "open-cluster-management.io/managed-serviceaccount/apis/authentication/v1beta1"
	cpv1alpha1 "sigs.k8s.io/cluster-inventory-api/apis/v1alpha1"

	"github.com/hubsync/hubsync/hub"
)

// Pair is one (cluster, ManagedServiceAccount) pair and the rules its
// copies follow.
type Pair struct {
	Cluster, MSA string
	// Manager is hubsync's cluster manager name: only its profiles get
	// copies.
	Manager string
	// Impersonator is the ManagedServiceAccount the gateway impersonates
	// with ("" when the tunnel is off); see PlanSource.
	Impersonator string
	// Writable reports whether hubsync may write in a namespace (it
	// exists and is not terminating); nil means every namespace.
	Writable func(namespace string) bool
	// Now is stamped (hub.AnnotationSyncedAt) on the copies whose data
	// the plan writes; zero stamps nothing.
	Now time.Time
}

// Why a copy is deleted, as logged.
const (
	whyNoLongerSynced   = "its pair no longer syncs there"
	whyImpersonator     = "it is the gateway's impersonating credential, never copied"
	whyProfileRecreated = "its profile was recreated"
)

// CopyPlan is what must be written for one pair's copies. The writer
// applies Delete first, then Create (skipping a namespace whose Delete
// failed, since the dangling copy there still holds the name), then Update.
type CopyPlan struct {
	// Source is what becomes of the pair's copies (PlanSource).
	Source SourcePlan
	// Create lists the copies to create, one per namespace, sorted.
	Create []*corev1.Secret
	// Update lists current copies to replace, sorted by namespace.
	Update []CopyUpdate
	// Delete lists copies to remove, sorted by namespace and name.
	Delete []CopyDelete
	// Conflicts lists namespaces where a Secret that is not the pair's
	// copy holds the copy's name; it is never written or deleted.
	Conflicts []string
	// Problem is the pair's problem to report: PlanSource's, else
	// ProblemNameConflict when there are Conflicts, else ProblemNone.
	Problem CopyProblem
}

// CopyUpdate is a current copy's replacement.
type CopyUpdate struct {
	Secret *corev1.Secret
	// Rotated: the token changed (its fingerprint differs), not only the
	// metadata.
	Rotated bool
}

// CopyDelete is a copy to remove and why.
type CopyDelete struct {
	Secret *corev1.Secret
	Why    string
}

// PlanCopies compares a pair's source with its copies. profiles are the
// cached ClusterProfiles named after the cluster, of any cluster manager,
// deleting or not; copies are the cached Secrets that are or may be the
// pair's copies: those marked as its copies, wherever they are, and those
// with the copy's name next to the profiles. msa and hubSecret are as
// PlanSource takes them.
//
// A profile being deleted, or whose namespace is not writable, wants no
// copy. A copy whose controller is a profile that is gone, or that was
// recreated with a new uid, is deleted as the garbage collector would, and
// the live profile's copy is created in its place: whatever the order in
// which a profile's deletion, its return and the collector's work reach the
// caches, the plan for what they show ends with one current copy next to
// each live profile of ours.
func PlanCopies(pair Pair, profiles []*cpv1alpha1.ClusterProfile, copies []*corev1.Secret, msa *msav1beta1.ManagedServiceAccount, hubSecret *corev1.Secret) CopyPlan {
	source, problem := PlanSource(pair.Cluster, pair.MSA, msa, hubSecret, pair.Impersonator)
	plan := CopyPlan{Source: source, Problem: problem}
	live := map[string]*cpv1alpha1.ClusterProfile{}
	want := map[string]*cpv1alpha1.ClusterProfile{}
	for _, p := range profiles {
		if p.Name != pair.Cluster {
			continue
		}
		live[p.Namespace] = p
		if source == PlanCopy && hub.IsOwned(p, pair.Manager) && p.DeletionTimestamp == nil && pair.writable(p.Namespace) {
			want[p.Namespace] = p
		}
	}
	if source == PlanHold {
		return plan
	}
	why := whyNoLongerSynced
	if pair.Impersonator != "" && pair.MSA == pair.Impersonator {
		why = whyImpersonator
	}
	name := hub.CopyName(pair.Cluster, pair.MSA)
	current := map[string]*corev1.Secret{}
	for _, sec := range copies {
		_, wanted := want[sec.Namespace]
		switch {
		case wanted && sec.Name == name:
			current[sec.Namespace] = sec
		case wanted:
			// A Secret marked as the pair's copy under another name, next to
			// a profile that has its copy: not the copy, and not removed.
		case copyOwnership(sec, pair.Cluster, pair.MSA, live[sec.Namespace], pair.Manager) != foreign:
			plan.Delete = append(plan.Delete, CopyDelete{Secret: sec, Why: why})
		}
	}
	for ns, p := range want {
		plan.planNamespace(pair, p, current[ns], DesiredCopy(pair.Cluster, pair.MSA, msa, hubSecret, p))
	}
	if len(plan.Conflicts) > 0 && plan.Problem == ProblemNone {
		plan.Problem = ProblemNameConflict
	}
	plan.sort()
	return plan
}

// planNamespace plans the copy next to one live profile of ours.
func (plan *CopyPlan) planNamespace(pair Pair, p *cpv1alpha1.ClusterProfile, cur, desired *corev1.Secret) {
	if cur != nil {
		switch copyOwnership(cur, pair.Cluster, pair.MSA, p, pair.Manager) {
		case foreign:
			plan.Conflicts = append(plan.Conflicts, p.Namespace)
			return
		case ownedDangling:
			// Left from a profile that was deleted and recreated.
			plan.Delete = append(plan.Delete, CopyDelete{Secret: cur, Why: whyProfileRecreated})
			cur = nil
		}
	}
	if cur == nil {
		pair.stamp(desired)
		plan.Create = append(plan.Create, desired)
		return
	}
	if updated, changed := ReconcileCopy(cur, desired); changed {
		rotated := cur.Annotations[hub.AnnotationTokenFingerprint] != desired.Annotations[hub.AnnotationTokenFingerprint]
		if !sameData(cur.Data, updated.Data) {
			// Only a write of the data brings the copy in step with its
			// source; a metadata repair keeps the copy's stamp.
			pair.stamp(updated)
		}
		plan.Update = append(plan.Update, CopyUpdate{Secret: updated, Rotated: rotated})
	}
}

// stamp marks sec as brought in step with its source at p.Now.
func (p Pair) stamp(sec *corev1.Secret) {
	if p.Now.IsZero() {
		return
	}
	if sec.Annotations == nil {
		sec.Annotations = map[string]string{}
	}
	sec.Annotations[hub.AnnotationSyncedAt] = p.Now.UTC().Format(time.RFC3339)
}

func (plan *CopyPlan) sort() {
	byNS := func(a, b *corev1.Secret) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	}
	slices.SortFunc(plan.Create, byNS)
	slices.SortFunc(plan.Update, func(a, b CopyUpdate) int { return byNS(a.Secret, b.Secret) })
	slices.SortFunc(plan.Delete, func(a, b CopyDelete) int { return byNS(a.Secret, b.Secret) })
	slices.Sort(plan.Conflicts)
}

func (p Pair) writable(ns string) bool { return p.Writable == nil || p.Writable(ns) }
