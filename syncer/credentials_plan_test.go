package syncer

import (
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	msav1beta1 "open-cluster-management.io/managed-serviceaccount/apis/authentication/v1beta1"
	cpv1alpha1 "sigs.k8s.io/cluster-inventory-api/apis/v1alpha1"

	"github.com/hubsync/hubsync/hub"
)

func TestPlanCopies(t *testing.T) {
	const (
		cluster = "c1"
		msaName = "app"
		gw      = "gateway-impersonator"
	)
	copyName := hub.CopyName(cluster, msaName)
	profile := func(ns, uid string) *cpv1alpha1.ClusterProfile {
		return &cpv1alpha1.ClusterProfile{ObjectMeta: metav1.ObjectMeta{
			Name: cluster, Namespace: ns, UID: types.UID(uid), Labels: map[string]string{hub.LabelClusterManager: testManager},
		}}
	}
	deleting := func(p *cpv1alpha1.ClusterProfile) *cpv1alpha1.ClusterProfile {
		p.DeletionTimestamp = &metav1.Time{}
		return p
	}
	otherManager := func(p *cpv1alpha1.ClusterProfile) *cpv1alpha1.ClusterProfile {
		p.Labels[hub.LabelClusterManager] = "someone-else"
		return p
	}
	msa := &msav1beta1.ManagedServiceAccount{
		ObjectMeta: metav1.ObjectMeta{Name: msaName, Namespace: cluster, Labels: map[string]string{hub.LabelSyncToClusterProfile: "true"}},
		Status:     msav1beta1.ManagedServiceAccountStatus{TokenSecretRef: &msav1beta1.SecretRef{Name: msaName}},
	}
	unlabelled := msa.DeepCopy()
	unlabelled.Labels = nil
	unreported := msa.DeepCopy()
	unreported.Status.TokenSecretRef = nil
	hubSecret := func(token string) *corev1.Secret {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: msaName, Namespace: cluster},
			Data: map[string][]byte{hub.TokenKey: []byte(token), hub.CAKey: []byte("ca")}}
	}
	// copyOf is the pair's current copy next to p, made from token; uid
	// names the Secret.
	copyOf := func(p *cpv1alpha1.ClusterProfile, token, uid string) *corev1.Secret {
		sec := DesiredCopy(cluster, msaName, msa, hubSecret(token), p)
		sec.UID = types.UID(uid)
		sec.ResourceVersion = "1"
		return sec
	}
	// foreignSecret holds the copy's name without being the pair's copy.
	foreignSecret := func(ns string) *corev1.Secret {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: copyName, Namespace: ns, UID: "theirs",
			Labels: map[string]string{hub.LabelSyncedFrom: "something-else"}}}
	}
	// upstream is a copy the upstream syncer made: synced-from label and
	// controller reference, no annotations.
	upstream := func(p *cpv1alpha1.ClusterProfile) *corev1.Secret {
		return &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: copyName, Namespace: p.Namespace, UID: "up",
				Labels: map[string]string{hub.LabelSyncedFrom: copyName},
				OwnerReferences: []metav1.OwnerReference{{APIVersion: cpv1alpha1.GroupVersion.String(), Kind: "ClusterProfile",
					Name: cluster, UID: p.UID, Controller: ptr.To(true)}}},
			Data: map[string][]byte{hub.TokenKey: []byte("t1"), hub.CAKey: []byte("ca")},
		}
	}
	// straySecret is marked as the pair's copy under another name.
	stray := func(p *cpv1alpha1.ClusterProfile) *corev1.Secret {
		sec := copyOf(p, "t1", "stray")
		sec.Name = "renamed"
		return sec
	}
	relabelled := func(sec *corev1.Secret) *corev1.Secret {
		sec.Labels[hub.LabelSyncedFrom] = "edited"
		return sec
	}
	allWritable := func(string) bool { return true }

	tests := []struct {
		name         string
		profiles     []*cpv1alpha1.ClusterProfile
		copies       []*corev1.Secret
		msa          *msav1beta1.ManagedServiceAccount
		hub          *corev1.Secret
		msaName      string
		impersonator string
		writable     func(string) bool
		// Each list as "namespace(detail)", sorted; see describe.
		create, update, delete, conflicts string
		problem                           CopyProblem
	}{
		{name: "a profile without its copy gets one",
			profiles: []*cpv1alpha1.ClusterProfile{profile("a", "u1"), profile("b", "u2")},
			create:   "a(owner u1),b(owner u2)"},
		{name: "a current copy is left alone",
			profiles: []*cpv1alpha1.ClusterProfile{profile("a", "u1")},
			copies:   []*corev1.Secret{copyOf(profile("a", "u1"), "t1", "s1")}},
		{name: "a rotation updates the copy",
			profiles: []*cpv1alpha1.ClusterProfile{profile("a", "u1")},
			copies:   []*corev1.Secret{copyOf(profile("a", "u1"), "t0", "s1")},
			update:   "a(rotated)"},
		{name: "a copy whose metadata was edited is restored without a rotation",
			profiles: []*cpv1alpha1.ClusterProfile{profile("a", "u1")},
			copies:   []*corev1.Secret{relabelled(copyOf(profile("a", "u1"), "t1", "s1"))},
			update:   "a(synced)"},
		// It carries no fingerprint, so the first write of one is reported
		// as a rotation.
		{name: "an upstream copy is adopted",
			profiles: []*cpv1alpha1.ClusterProfile{profile("a", "u1")},
			copies:   []*corev1.Secret{upstream(profile("a", "u1"))},
			update:   "a(rotated)"},

		// A deleted profile: its deletion, its return (new uid) and the
		// garbage collector's deletion of its copy reach the caches in any
		// order; the plan for each state they can show converges on one
		// copy owned by the live profile.
		{name: "profile deleted, copy still there (garbage collector late)",
			copies: []*corev1.Secret{copyOf(profile("a", "u1"), "t1", "s1")},
			delete: "a/c1-app(s1: its pair no longer syncs there)"},
		{name: "profile deleted and its copy gone (garbage collector first), profile not back yet"},
		{name: "copy gone first, the deleted profile still in the cache",
			profiles: []*cpv1alpha1.ClusterProfile{profile("a", "u1")},
			create:   "a(owner u1)"},
		{name: "profile back first, the old profile's copy still there",
			profiles: []*cpv1alpha1.ClusterProfile{profile("a", "u2")},
			copies:   []*corev1.Secret{copyOf(profile("a", "u1"), "t1", "s1")},
			delete:   "a/c1-app(s1: its profile was recreated)",
			create:   "a(owner u2)"},
		{name: "profile back, copy gone",
			profiles: []*cpv1alpha1.ClusterProfile{profile("a", "u2")},
			create:   "a(owner u2)"},
		{name: "profile back, copy created for the old profile while its deletion was unseen",
			profiles: []*cpv1alpha1.ClusterProfile{profile("a", "u2")},
			copies:   []*corev1.Secret{copyOf(profile("a", "u1"), "t1", "s2")},
			delete:   "a/c1-app(s2: its profile was recreated)",
			create:   "a(owner u2)"},
		{name: "profile back, copy already the new profile's",
			profiles: []*cpv1alpha1.ClusterProfile{profile("a", "u2")},
			copies:   []*corev1.Secret{copyOf(profile("a", "u2"), "t1", "s2")}},
		{name: "profile being deleted in the foreground, garbage collector paused",
			profiles: []*cpv1alpha1.ClusterProfile{deleting(profile("a", "u1"))},
			copies:   []*corev1.Secret{copyOf(profile("a", "u1"), "t1", "s1")},
			delete:   "a/c1-app(s1: its pair no longer syncs there)"},
		{name: "profile being deleted, copy already gone",
			profiles: []*cpv1alpha1.ClusterProfile{deleting(profile("a", "u1"))}},

		{name: "a foreign Secret with the copy's name is a conflict, never written",
			profiles:  []*cpv1alpha1.ClusterProfile{profile("a", "u1"), profile("b", "u2")},
			copies:    []*corev1.Secret{foreignSecret("a")},
			create:    "b(owner u2)",
			conflicts: "a", problem: ProblemNameConflict},
		{name: "a profile of another manager gets no copy, and its copy is not ours to remove",
			profiles: []*cpv1alpha1.ClusterProfile{otherManager(profile("a", "u1"))},
			copies:   []*corev1.Secret{copyOf(profile("a", "u1"), "t1", "s1")}},
		{name: "a namespace that is not writable gets no copy; one there is removed",
			profiles: []*cpv1alpha1.ClusterProfile{profile("a", "u1"), profile("t", "u2")},
			copies:   []*corev1.Secret{copyOf(profile("t", "u2"), "t1", "s2")},
			writable: func(ns string) bool { return ns != "t" },
			create:   "a(owner u1)",
			delete:   "t/c1-app(s2: its pair no longer syncs there)"},
		{name: "a marked Secret of another name next to a wanted copy is left alone",
			profiles: []*cpv1alpha1.ClusterProfile{profile("a", "u1")},
			copies:   []*corev1.Secret{copyOf(profile("a", "u1"), "t1", "s1"), stray(profile("a", "u1"))}},
		{name: "a marked Secret of another name where no copy is wanted is removed",
			copies: []*corev1.Secret{stray(profile("a", "u1"))},
			delete: "a/renamed(stray: its pair no longer syncs there)"},

		{name: "sync label removed: every copy of ours goes, foreign Secrets stay",
			profiles: []*cpv1alpha1.ClusterProfile{profile("a", "u1"), profile("b", "u2")},
			copies:   []*corev1.Secret{copyOf(profile("b", "u2"), "t1", "s2"), copyOf(profile("a", "u1"), "t1", "s1"), foreignSecret("c")},
			msa:      unlabelled,
			delete:   "a/c1-app(s1: its pair no longer syncs there),b/c1-app(s2: its pair no longer syncs there)"},
		{name: "token not reported yet: copies held as they are, even dangling ones",
			profiles: []*cpv1alpha1.ClusterProfile{profile("a", "u2")},
			copies:   []*corev1.Secret{copyOf(profile("a", "u1"), "t1", "s1")},
			msa:      unreported},
		{name: "empty token: copies held, problem reported",
			profiles: []*cpv1alpha1.ClusterProfile{profile("a", "u1")},
			copies:   []*corev1.Secret{copyOf(profile("a", "u1"), "t1", "s1")},
			hub:      hubSecret(""),
			problem:  ProblemNoToken},
		{name: "the impersonator is never copied; its copies go",
			msaName: gw, impersonator: gw,
			profiles: []*cpv1alpha1.ClusterProfile{profile("a", "u1")},
			copies:   []*corev1.Secret{impersonatorCopy(profile("a", "u1"), gw)},
			delete:   "a/c1-gateway-impersonator(s9: it is the gateway's impersonating credential, never copied)",
			problem:  ProblemImpersonator},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pair := Pair{Cluster: cluster, MSA: msaName, Manager: testManager, Impersonator: tc.impersonator, Writable: tc.writable}
			if tc.msaName != "" {
				pair.MSA = tc.msaName
			}
			if pair.Writable == nil {
				pair.Writable = allWritable
			}
			m, h := tc.msa, tc.hub
			if m == nil {
				m = msa
				if tc.msaName != "" {
					m = msa.DeepCopy()
					m.Name = tc.msaName
				}
			}
			if h == nil {
				h = hubSecret("t1")
			}
			plan := PlanCopies(pair, tc.profiles, tc.copies, m, h)
			for _, c := range []struct{ what, got, want string }{
				{"create", describeCreates(plan.Create), tc.create},
				{"update", describeUpdates(plan.Update), tc.update},
				{"delete", describeDeletes(plan.Delete), tc.delete},
				{"conflicts", strings.Join(plan.Conflicts, ","), tc.conflicts},
				{"problem", string(plan.Problem), string(tc.problem)},
			} {
				if c.got != c.want {
					t.Errorf("%s = %q, want %q", c.what, c.got, c.want)
				}
			}
			for _, sec := range plan.Create {
				if want := DesiredCopy(cluster, pair.MSA, m, h, profileIn(tc.profiles, sec.Namespace)); !equalSecrets(sec, want) {
					t.Errorf("created copy in %s is not the desired copy", sec.Namespace)
				}
			}
		})
	}
}

func impersonatorCopy(p *cpv1alpha1.ClusterProfile, msaName string) *corev1.Secret {
	hubSecret := &corev1.Secret{Data: map[string][]byte{hub.TokenKey: []byte("t1")}}
	sec := DesiredCopy(p.Name, msaName, nil, hubSecret, p)
	sec.UID = "s9"
	return sec
}

func profileIn(ps []*cpv1alpha1.ClusterProfile, ns string) *cpv1alpha1.ClusterProfile {
	for _, p := range ps {
		if p.Namespace == ns {
			return p
		}
	}
	return nil
}

func equalSecrets(a, b *corev1.Secret) bool {
	_, changed := ReconcileCopy(a, b)
	return !changed && a.Name == b.Name && a.Namespace == b.Namespace
}

func describeCreates(secs []*corev1.Secret) string {
	out := make([]string, len(secs))
	for i, s := range secs {
		out[i] = fmt.Sprintf("%s(owner %s)", s.Namespace, s.OwnerReferences[0].UID)
	}
	return strings.Join(out, ",")
}

func describeUpdates(us []CopyUpdate) string {
	out := make([]string, len(us))
	for i, u := range us {
		out[i] = fmt.Sprintf("%s(%s)", u.Secret.Namespace, map[bool]string{true: "rotated", false: "synced"}[u.Rotated])
	}
	return strings.Join(out, ",")
}

func describeDeletes(ds []CopyDelete) string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = fmt.Sprintf("%s/%s(%s: %s)", d.Secret.Namespace, d.Secret.Name, d.Secret.UID, d.Why)
	}
	return strings.Join(out, ",")
}
