package syncer

import (
	"bytes"
	"fmt"
	"time"

	"github.com/hubsync/hubsync/hub"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	msav1beta1 "open-cluster-management.io/managed-serviceaccount/apis/authentication/v1beta1"
	cpv1alpha1 "sigs.k8s.io/cluster-inventory-api/apis/v1alpha1"
)

// TokenExpiry returns when a token expires: the ManagedServiceAccount's
// status.expirationTimestamp when set, else the JWT's exp claim (read, not
// verified). ok is false when neither is known.
func TokenExpiry(msa *msav1beta1.ManagedServiceAccount, token []byte) (time.Time, bool) {
	if msa != nil && msa.Status.ExpirationTimestamp != nil && !msa.Status.ExpirationTimestamp.IsZero() {
		return msa.Status.ExpirationTimestamp.UTC(), true
	}
	return hub.JWTExpiry(token)
}

// CopyProblem says why a pair's copies cannot be written; it never
// contains token material.
type CopyProblem string

// Problems with a pair's hub Secret or names, and the one refusal.
const (
	ProblemNone         CopyProblem = ""
	ProblemNoToken      CopyProblem = "the hub token Secret has no token"
	ProblemNameTooLong  CopyProblem = "the copy's name <cluster>-<msa> is not a valid Secret name (over 253 characters or invalid)"
	ProblemNameConflict CopyProblem = "another Secret already has the copy's name"
	ProblemImpersonator CopyProblem = "it is the gateway's impersonating credential (tunnel.managedServiceAccount): " +
		"it may impersonate anyone on its cluster, so it is never copied to consumers and its copies are removed; " +
		"remove the sync-to-clusterprofile label, or give consumers another ManagedServiceAccount"
)

// EventReason is the reason of the Warning Event that reports p on the
// ManagedServiceAccount. The refusal to copy the impersonator has its own,
// so that it is not mistaken for a fault hubsync will retry.
func (p CopyProblem) EventReason() string {
	if p == ProblemImpersonator {
		return "ImpersonatorNotCopied"
	}
	return "CredentialNotCopied"
}

// MetricReason is the reason label of p on hubsync_credential_problems.
func (p CopyProblem) MetricReason() string {
	switch p {
	case ProblemNoToken:
		return "no_token"
	case ProblemNameTooLong:
		return "invalid_name"
	case ProblemNameConflict:
		return "name_conflict"
	case ProblemImpersonator:
		return "impersonator"
	default:
		return ""
	}
}

// SourcePlan is what becomes of the copies of one (cluster, MSA) pair.
type SourcePlan int

const (
	// PlanRemove: no copy may exist; delete them all.
	PlanRemove SourcePlan = iota
	// PlanHold: write nothing and delete nothing; the copies stay as
	// they are until the source is usable again.
	PlanHold
	// PlanCopy: a current copy next to each of the cluster's profiles of
	// ours, and none elsewhere.
	PlanCopy
)

func (p SourcePlan) String() string {
	switch p {
	case PlanRemove:
		return "remove"
	case PlanHold:
		return "hold"
	case PlanCopy:
		return "copy"
	default:
		return fmt.Sprintf("SourcePlan(%d)", int(p))
	}
}

// PlanSource decides what becomes of the copies of the pair (cluster,
// msaName) and which problem to report. msa is the ManagedServiceAccount as
// cached (nil when there is none), hub the token Secret its status reports
// (nil when there is none or it is not cached), and impersonator the name
// of the ManagedServiceAccount the gateway impersonates with ("" when the
// tunnel is off).
//
// The impersonator is decided first and by name alone: whatever its labels
// or the state of its token, its copies must not exist, because each one
// would hand a consumer the power to act as anyone on the cluster. It is
// reported only while someone asks for it to be copied (the sync label);
// an unlabelled impersonator is the normal case and not a problem.
func PlanSource(cluster, msaName string, msa *msav1beta1.ManagedServiceAccount, hubSecret *corev1.Secret, impersonator string) (SourcePlan, CopyProblem) {
	syncs := msa != nil && msa.DeletionTimestamp == nil && msa.Labels[hub.LabelSyncToClusterProfile] == "true"
	switch {
	case impersonator != "" && msaName == impersonator:
		if syncs {
			return PlanRemove, ProblemImpersonator
		}
		return PlanRemove, ProblemNone
	case !syncs:
		// A removed label, a deleted MSA: access ends.
		return PlanRemove, ProblemNone
	case msa.Status.TokenSecretRef == nil || msa.Status.TokenSecretRef.Name == "":
		// The agent has not reported a token yet: copy nothing until it
		// does, and leave any copies as they are.
		return PlanHold, ProblemNone
	case hubSecret == nil:
		// A deleted token Secret ends access: no copy may keep the old
		// token.
		return PlanRemove, ProblemNone
	}
	if p := CheckSource(cluster, msaName, hubSecret); p != ProblemNone {
		// A malformed token Secret (mid-rotation, hand-edited) leaves the
		// copies as they are rather than cutting consumers off.
		return PlanHold, p
	}
	return PlanCopy, ProblemNone
}

// CheckSource reports whether a pair's copies can be written.
func CheckSource(cluster, msa string, hubSecret *corev1.Secret) CopyProblem {
	if len(validation.IsDNS1123Subdomain(hub.CopyName(cluster, msa))) > 0 {
		return ProblemNameTooLong
	}
	if hubSecret != nil && len(bytes.TrimSpace(hubSecret.Data[hub.TokenKey])) == 0 {
		return ProblemNoToken
	}
	return ProblemNone
}

// DesiredCopy returns the copy of hub's data that must sit next to profile:
// type Opaque, the token and CA keys only, the synced-from label,
// hubsync's annotations and a controller ownerReference to the profile.
func DesiredCopy(cluster, msaName string, msa *msav1beta1.ManagedServiceAccount, hubSecret *corev1.Secret, profile *cpv1alpha1.ClusterProfile) *corev1.Secret {
	token := hubSecret.Data[hub.TokenKey]
	annotations := map[string]string{
		hub.AnnotationSource:           hub.SourceKey(cluster, msaName),
		hub.AnnotationTokenFingerprint: hub.TokenFingerprint(token),
	}
	if exp, ok := TokenExpiry(msa, token); ok {
		annotations[hub.AnnotationTokenExpiration] = exp.Format(time.RFC3339)
	}
	// Only the token and the cluster's CA, the keys the
	// managed-serviceaccount agent writes: whatever else someone puts in
	// the hub Secret stays there.
	data := make(map[string][]byte, 2)
	for _, k := range [...]string{hub.TokenKey, hub.CAKey} {
		if v, ok := hubSecret.Data[k]; ok {
			data[k] = append([]byte(nil), v...)
		}
	}
	yes := true
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name:        hub.CopyName(cluster, msaName),
			Namespace:   profile.Namespace,
			Labels:      map[string]string{hub.LabelSyncedFrom: hub.SyncedFromValue(cluster, msaName)},
			Annotations: annotations,
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: cpv1alpha1.GroupVersion.String(),
				Kind:       "ClusterProfile",
				Name:       profile.Name,
				UID:        profile.UID,
				Controller: &yes,
			}},
		},
		Type: corev1.SecretTypeOpaque,
		Data: data,
	}
}

// ReconcileCopy returns cur updated to match want, keeping labels,
// annotations and owner references of others, and whether anything changed.
func ReconcileCopy(cur, want *corev1.Secret) (*corev1.Secret, bool) {
	changed := cur.Type != want.Type || !sameData(cur.Data, want.Data)
	for k, v := range want.Labels {
		changed = changed || cur.Labels[k] != v
	}
	for _, k := range []string{hub.AnnotationSource, hub.AnnotationTokenFingerprint, hub.AnnotationTokenExpiration} {
		changed = changed || cur.Annotations[k] != want.Annotations[k]
	}
	owners := ownerRefsWithController(cur.OwnerReferences, want.OwnerReferences[0])
	changed = changed || len(owners) != len(cur.OwnerReferences)
	if !changed {
		for i := range owners {
			if !sameOwner(owners[i], cur.OwnerReferences[i]) {
				changed = true
			}
		}
	}
	if !changed {
		return cur, false
	}
	out := cur.DeepCopy()
	out.Type = want.Type
	out.Data = want.Data
	if out.Labels == nil {
		out.Labels = map[string]string{}
	}
	for k, v := range want.Labels {
		out.Labels[k] = v
	}
	if out.Annotations == nil {
		out.Annotations = map[string]string{}
	}
	for _, k := range []string{hub.AnnotationSource, hub.AnnotationTokenFingerprint, hub.AnnotationTokenExpiration} {
		if v, ok := want.Annotations[k]; ok {
			out.Annotations[k] = v
		} else {
			delete(out.Annotations, k)
		}
	}
	out.OwnerReferences = owners
	return out, true
}

// ownerRefsWithController replaces any ClusterProfile owner reference and
// any other controller reference with ref, keeping the rest.
func ownerRefsWithController(refs []metav1.OwnerReference, ref metav1.OwnerReference) []metav1.OwnerReference {
	out := []metav1.OwnerReference{ref}
	for _, r := range refs {
		if r.Kind == "ClusterProfile" || (r.Controller != nil && *r.Controller) {
			continue
		}
		out = append(out, r)
	}
	return out
}

func sameOwner(a, b metav1.OwnerReference) bool {
	return a.APIVersion == b.APIVersion && a.Kind == b.Kind && a.Name == b.Name && a.UID == b.UID &&
		(a.Controller != nil && *a.Controller) == (b.Controller != nil && *b.Controller)
}

func sameData(a, b map[string][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		w, ok := b[k]
		if !ok || !bytes.Equal(v, w) {
			return false
		}
	}
	return true
}
