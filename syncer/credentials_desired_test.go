package syncer

import (
	"strings"
	"testing"

	"github.com/hubsync/hubsync/hub"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	msav1beta1 "open-cluster-management.io/managed-serviceaccount/apis/authentication/v1beta1"
	cpv1alpha1 "sigs.k8s.io/cluster-inventory-api/apis/v1alpha1"
)

func TestPlanSource(t *testing.T) {
	type msaOpt func(*msav1beta1.ManagedServiceAccount)
	unlabelled := func(m *msav1beta1.ManagedServiceAccount) { delete(m.Labels, hub.LabelSyncToClusterProfile) }
	labelFalse := func(m *msav1beta1.ManagedServiceAccount) { m.Labels[hub.LabelSyncToClusterProfile] = "false" }
	deleting := func(m *msav1beta1.ManagedServiceAccount) { m.DeletionTimestamp = &metav1.Time{} }
	unreported := func(m *msav1beta1.ManagedServiceAccount) { m.Status.TokenSecretRef = nil }
	emptyRef := func(m *msav1beta1.ManagedServiceAccount) { m.Status.TokenSecretRef.Name = "" }
	msa := func(name string, opts ...msaOpt) *msav1beta1.ManagedServiceAccount {
		m := &msav1beta1.ManagedServiceAccount{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "c1", Labels: map[string]string{hub.LabelSyncToClusterProfile: "true"}},
			Status:     msav1beta1.ManagedServiceAccountStatus{TokenSecretRef: &msav1beta1.SecretRef{Name: name}},
		}
		for _, o := range opts {
			o(m)
		}
		return m
	}
	hub := func(token string) *corev1.Secret {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "x", Namespace: "c1"}, Data: map[string][]byte{hub.TokenKey: []byte(token), hub.CAKey: []byte("ca")}}
	}
	const gw = "gateway-impersonator"
	tests := []struct {
		name         string
		msaName      string
		msa          *msav1beta1.ManagedServiceAccount
		hub          *corev1.Secret
		impersonator string
		wantPlan     SourcePlan
		wantProblem  CopyProblem
	}{
		{name: "synced MSA with a token", msaName: "app", msa: msa("app"), hub: hub("t"), wantPlan: PlanCopy},
		{name: "synced MSA beside the impersonator", msaName: "app", msa: msa("app"), hub: hub("t"), impersonator: gw, wantPlan: PlanCopy},
		{name: "no MSA", msaName: "app", wantPlan: PlanRemove},
		{name: "sync label removed", msaName: "app", msa: msa("app", unlabelled), hub: hub("t"), wantPlan: PlanRemove},
		{name: "sync label not true", msaName: "app", msa: msa("app", labelFalse), hub: hub("t"), wantPlan: PlanRemove},
		{name: "MSA being deleted", msaName: "app", msa: msa("app", deleting), hub: hub("t"), wantPlan: PlanRemove},
		{name: "token Secret not reported yet", msaName: "app", msa: msa("app", unreported), wantPlan: PlanHold},
		{name: "token Secret reported without a name", msaName: "app", msa: msa("app", emptyRef), wantPlan: PlanHold},
		{name: "reported token Secret gone", msaName: "app", msa: msa("app"), wantPlan: PlanRemove},
		{name: "token Secret without a token", msaName: "app", msa: msa("app"), hub: hub(" "), wantPlan: PlanHold, wantProblem: ProblemNoToken},
		{name: "copy name too long", msaName: strings.Repeat("m", 252), msa: msa(strings.Repeat("m", 252)), hub: hub("t"), wantPlan: PlanHold, wantProblem: ProblemNameTooLong},

		// The gateway's impersonating MSA: never copied, whatever its
		// labels or token; reported only while labelled for copying.
		{name: "impersonator labelled, with a token", msaName: gw, msa: msa(gw), hub: hub("t"), impersonator: gw, wantPlan: PlanRemove, wantProblem: ProblemImpersonator},
		{name: "impersonator labelled, token not reported yet", msaName: gw, msa: msa(gw, unreported), impersonator: gw, wantPlan: PlanRemove, wantProblem: ProblemImpersonator},
		{name: "impersonator labelled, token Secret gone", msaName: gw, msa: msa(gw), impersonator: gw, wantPlan: PlanRemove, wantProblem: ProblemImpersonator},
		{name: "impersonator labelled, empty token", msaName: gw, msa: msa(gw), hub: hub(""), impersonator: gw, wantPlan: PlanRemove, wantProblem: ProblemImpersonator},
		{name: "impersonator unlabelled", msaName: gw, msa: msa(gw, unlabelled), hub: hub("t"), impersonator: gw, wantPlan: PlanRemove},
		{name: "impersonator being deleted", msaName: gw, msa: msa(gw, deleting), hub: hub("t"), impersonator: gw, wantPlan: PlanRemove},
		{name: "impersonator gone, stale copies left", msaName: gw, impersonator: gw, wantPlan: PlanRemove},
		{name: "tunnel off: the same name is an ordinary MSA", msaName: gw, msa: msa(gw), hub: hub("t"), wantPlan: PlanCopy},
		{name: "names are compared exactly", msaName: gw + "-2", msa: msa(gw + "-2"), hub: hub("t"), impersonator: gw, wantPlan: PlanCopy},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			plan, problem := PlanSource("c1", tt.msaName, tt.msa, tt.hub, tt.impersonator)
			if plan != tt.wantPlan || problem != tt.wantProblem {
				t.Errorf("PlanSource = %v, %q; want %v, %q", plan, problem, tt.wantPlan, tt.wantProblem)
			}
		})
	}
}

func TestCopyProblemReasons(t *testing.T) {
	tests := []struct {
		problem      CopyProblem
		event, label string
	}{
		{ProblemNoToken, "CredentialNotCopied", "no_token"},
		{ProblemNameTooLong, "CredentialNotCopied", "invalid_name"},
		{ProblemNameConflict, "CredentialNotCopied", "name_conflict"},
		{ProblemImpersonator, "ImpersonatorNotCopied", "impersonator"},
	}
	for _, tt := range tests {
		t.Run(tt.label, func(t *testing.T) {
			if got := tt.problem.EventReason(); got != tt.event {
				t.Errorf("EventReason = %q, want %q", got, tt.event)
			}
			if got := tt.problem.MetricReason(); got != tt.label {
				t.Errorf("MetricReason = %q, want %q", got, tt.label)
			}
		})
	}
}

func TestDesiredCopyKeys(t *testing.T) {
	profile := &cpv1alpha1.ClusterProfile{ObjectMeta: metav1.ObjectMeta{Name: "c1", Namespace: "team", UID: "p-uid"}}
	tests := []struct {
		name string
		data map[string][]byte
		want []string
	}{
		{"token and CA", map[string][]byte{hub.TokenKey: []byte("t"), hub.CAKey: []byte("ca")}, []string{hub.TokenKey, hub.CAKey}},
		{"other keys stay on the hub", map[string][]byte{hub.TokenKey: []byte("t"), hub.CAKey: []byte("ca"), "kubeconfig": []byte("admin"), "note": nil},
			[]string{hub.TokenKey, hub.CAKey}},
		{"no CA", map[string][]byte{hub.TokenKey: []byte("t")}, []string{hub.TokenKey}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			hub := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "msa", Namespace: "c1"}, Data: tt.data}
			got := DesiredCopy("c1", "msa", nil, hub, profile)
			if len(got.Data) != len(tt.want) {
				t.Fatalf("copy keys %v; want %v", keysOf(got.Data), tt.want)
			}
			for _, k := range tt.want {
				if string(got.Data[k]) != string(tt.data[k]) {
					t.Errorf("%s = %q; want %q", k, got.Data[k], tt.data[k])
				}
			}
			if got.Type != corev1.SecretTypeOpaque {
				t.Errorf("type %q", got.Type)
			}
		})
	}
}

func keysOf(m map[string][]byte) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
