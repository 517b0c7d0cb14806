package syncer

import (
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientcmdv1 "k8s.io/client-go/tools/clientcmd/api/v1"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	cpv1alpha1 "sigs.k8s.io/cluster-inventory-api/apis/v1alpha1"

	"github.com/hubsync/hubsync/hub"
)

func printedProfile() *cpv1alpha1.ClusterProfile {
	return &cpv1alpha1.ClusterProfile{
		ObjectMeta: metav1.ObjectMeta{Name: "c1", Namespace: "team-a", Labels: map[string]string{
			hub.LabelClusterManager: testManager, hub.LabelClusterName: "c1", hub.LabelProfileSet: "prod",
		}},
		Spec: cpv1alpha1.ClusterProfileSpec{DisplayName: "c1", ClusterManager: cpv1alpha1.ClusterManager{Name: testManager}},
		Status: cpv1alpha1.ClusterProfileStatus{
			Version:    cpv1alpha1.ClusterVersion{Kubernetes: "v1.35.4"},
			Properties: []cpv1alpha1.Property{{Name: "region", Value: "eu"}},
			Conditions: []metav1.Condition{{Type: ConditionJoined, Status: metav1.ConditionTrue, Reason: "Joined", LastTransitionTime: metav1.Unix(1, 0)}},
			AccessProviders: []cpv1alpha1.AccessProvider{
				{Name: "open-cluster-management", Cluster: clientcmdv1.Cluster{
					Server: "https://proxy:9092/c1", CertificateAuthorityData: []byte("CA"),
					Extensions: []clientcmdv1.NamedExtension{{Name: hub.ExecExtensionKey, Extension: runtime.RawExtension{Raw: []byte(`{"clusterName":"c1"}`)}}},
				}},
				{Name: "argocd", Cluster: clientcmdv1.Cluster{Server: "https://argo"}},
			},
		},
	}
}

// TestProfilePrint: the print changes with every part of a profile that
// hubsync owns, and with nothing that others own (their labels,
// conditions, access providers), so that their changes never look like a
// new intent of hubsync's.
func TestProfilePrint(t *testing.T) {
	f := newForeignWriters(clock.RealClock{}, ForeignOptions{HoldOff: time.Second, MaxHoldOff: time.Second})
	providers := []Provider{{Name: "open-cluster-management"}}
	base := printedProfile()
	tests := []struct {
		name    string
		change  func(p *cpv1alpha1.ClusterProfile)
		changes bool
	}{
		{name: "clusterset label", change: func(p *cpv1alpha1.ClusterProfile) { p.Labels[hub.LabelProfileSet] = "dev" }, changes: true},
		{name: "display name", change: func(p *cpv1alpha1.ClusterProfile) { p.Spec.DisplayName = "x" }, changes: true},
		{name: "version", change: func(p *cpv1alpha1.ClusterProfile) { p.Status.Version.Kubernetes = "v1.36.0" }, changes: true},
		{name: "property", change: func(p *cpv1alpha1.ClusterProfile) { p.Status.Properties[0].Value = "us" }, changes: true},
		{name: "own condition", change: func(p *cpv1alpha1.ClusterProfile) { p.Status.Conditions[0].Message = "m" }, changes: true},
		{name: "own provider's server", change: func(p *cpv1alpha1.ClusterProfile) { p.Status.AccessProviders[0].Cluster.Server = "https://other" }, changes: true},
		{name: "own provider's CA", change: func(p *cpv1alpha1.ClusterProfile) {
			p.Status.AccessProviders[0].Cluster.CertificateAuthorityData = []byte("CA2")
		}, changes: true},
		{name: "own provider left out", change: func(p *cpv1alpha1.ClusterProfile) { p.Status.AccessProviders = p.Status.AccessProviders[1:] }, changes: true},
		{name: "another label", change: func(p *cpv1alpha1.ClusterProfile) { p.Labels["team"] = "a" }},
		{name: "another condition", change: func(p *cpv1alpha1.ClusterProfile) {
			p.Status.Conditions = append(p.Status.Conditions, metav1.Condition{Type: "Argo", Status: metav1.ConditionTrue})
		}},
		{name: "another provider", change: func(p *cpv1alpha1.ClusterProfile) { p.Status.AccessProviders[1].Cluster.Server = "https://argo2" }},
		{name: "resourceVersion", change: func(p *cpv1alpha1.ClusterProfile) { p.ResourceVersion = "99" }},
	}
	want := f.profilePrint(base, &base.Status, providers)
	if again := f.profilePrint(printedProfile(), &printedProfile().Status, providers); again != want {
		t.Fatalf("the same profile prints differently: %x, %x", want, again)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := printedProfile()
			tt.change(p)
			if got := f.profilePrint(p, &p.Status, providers); (got != want) != tt.changes {
				t.Errorf("print changed = %v, want %v", got != want, tt.changes)
			}
		})
	}
}

func printedCopy() *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name: "c1-app", Namespace: "team-a", ResourceVersion: "5",
			Labels:          map[string]string{hub.LabelSyncedFrom: "c1-app"},
			Annotations:     map[string]string{hub.AnnotationSource: "c1/app", hub.AnnotationTokenFingerprint: "f1"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "multicluster.x-k8s.io/v1alpha1", Kind: "ClusterProfile", Name: "c1", UID: "u1", Controller: ptr.To(true)}},
		},
		Type: corev1.SecretTypeOpaque,
		Data: map[string][]byte{hub.TokenKey: []byte("t1"), hub.CAKey: []byte("ca")},
	}
}

// TestCopyPrint: as TestProfilePrint, for credential copies.
func TestCopyPrint(t *testing.T) {
	f := newForeignWriters(clock.RealClock{}, ForeignOptions{HoldOff: time.Second, MaxHoldOff: time.Second})
	tests := []struct {
		name    string
		change  func(s *corev1.Secret)
		changes bool
	}{
		{name: "token", change: func(s *corev1.Secret) { s.Data[hub.TokenKey] = []byte("t2") }, changes: true},
		{name: "CA", change: func(s *corev1.Secret) { s.Data[hub.CAKey] = []byte("ca2") }, changes: true},
		{name: "another data key", change: func(s *corev1.Secret) { s.Data["x"] = []byte("x") }, changes: true},
		{name: "synced-from label", change: func(s *corev1.Secret) { s.Labels[hub.LabelSyncedFrom] = "x" }, changes: true},
		{name: "fingerprint", change: func(s *corev1.Secret) { s.Annotations[hub.AnnotationTokenFingerprint] = "f2" }, changes: true},
		{name: "owner uid", change: func(s *corev1.Secret) { s.OwnerReferences[0].UID = "u2" }, changes: true},
		{name: "type", change: func(s *corev1.Secret) { s.Type = corev1.SecretTypeServiceAccountToken }, changes: true},
		{name: "another label", change: func(s *corev1.Secret) { s.Labels["team"] = "a" }},
		{name: "another annotation", change: func(s *corev1.Secret) { s.Annotations["note"] = "a" }},
		{name: "resourceVersion", change: func(s *corev1.Secret) { s.ResourceVersion = "6" }},
	}
	want := f.copyPrint(printedCopy())
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := printedCopy()
			tt.change(s)
			if got := f.copyPrint(s); (got != want) != tt.changes {
				t.Errorf("print changed = %v, want %v", got != want, tt.changes)
			}
		})
	}
}

// TestDrift: the parts named are those that differ from what hubsync
// wants.
func TestDrift(t *testing.T) {
	providers := []Provider{{Name: "open-cluster-management"}, {Name: "gateway"}}
	want := printedProfile()
	cur := printedProfile()
	cur.Status.AccessProviders[0].Cluster.Server = "https://elsewhere"
	cur.Labels[hub.LabelProfileSet] = "dev"
	cur.Labels["team"] = "a"
	if got := profileDrift(cur, want, &want.Status, providers); !slices.Equal(got, []string{"labels", "status.accessProviders[open-cluster-management]"}) {
		t.Errorf("profileDrift = %v", got)
	}
	cur = printedProfile()
	cur.Status.Version.Kubernetes = "v1"
	if got := profileDrift(cur, want, &want.Status, providers); !slices.Equal(got, []string{"status"}) {
		t.Errorf("profileDrift = %v", got)
	}
	sec := printedCopy()
	sec.Data[hub.CAKey] = []byte("other")
	sec.Labels["team"] = "a"
	if got := copyDrift(sec, printedCopy()); !slices.Equal(got, []string{"data"}) {
		t.Errorf("copyDrift = %v", got)
	}
}

// TestWriterOf: the other writer is the field manager that owns the
// fields that drifted, not hubsync's own, the most recent if several.
func TestWriterOf(t *testing.T) {
	entry := func(manager, sub string, at int64, fields string) metav1.ManagedFieldsEntry {
		return metav1.ManagedFieldsEntry{Manager: manager, Operation: metav1.ManagedFieldsOperationUpdate, Subresource: sub,
			Time: ptr.To(metav1.Unix(at, 0)), FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(fields)}}
	}
	providers := `{"f:status":{"f:accessProviders":{}}}`
	mapProviders := `{"f:status":{"f:accessProviders":{"k:{\"name\":\"open-cluster-management\"}":{".":{},"f:cluster":{"f:server":{}}}}}}`
	labels := `{"f:metadata":{"f:labels":{"f:team":{}}}}`
	tests := []struct {
		name    string
		entries []metav1.ManagedFieldsEntry
		drift   []string
		want    string
	}{
		{name: "atomic list", drift: []string{"status.accessProviders[open-cluster-management]"},
			entries: []metav1.ManagedFieldsEntry{entry(FieldManager, "", 1, labels), entry(FieldManager, "status", 2, `{"f:status":{"f:version":{}}}`), entry("cluster-proxy", "status", 3, providers)},
			want:    "cluster-proxy"},
		{name: "list map", drift: []string{"status.accessProviders[open-cluster-management]"},
			entries: []metav1.ManagedFieldsEntry{entry("manager", "status", 3, mapProviders), entry(FieldManager, "status", 4, `{"f:status":{"f:properties":{}}}`)},
			want:    "manager"},
		{name: "the owner of the field, not the latest writer", drift: []string{"status.accessProviders[open-cluster-management]"},
			entries: []metav1.ManagedFieldsEntry{entry("cluster-proxy", "status", 3, providers), entry("kubectl-edit", "", 9, labels)},
			want:    "cluster-proxy"},
		{name: "the latest of two owners", drift: []string{"data"},
			entries: []metav1.ManagedFieldsEntry{entry("msa", "", 3, `{"f:data":{}}`), entry("managed-serviceaccount", "", 5, `{"f:data":{}}`)},
			want:    "managed-serviceaccount"},
		{name: "nobody owns it: the latest other writer", drift: []string{"data"},
			entries: []metav1.ManagedFieldsEntry{entry("kubectl", "", 3, labels), entry("tool", "", 5, labels), entry(FieldManager, "", 9, `{"f:data":{}}`)},
			want:    "tool"},
		{name: "only hubsync", drift: []string{"labels"}, entries: []metav1.ManagedFieldsEntry{entry(FieldManager, "", 3, labels)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := writerOf(tt.entries, tt.drift); got != tt.want {
				t.Errorf("writerOf = %q, want %q", got, tt.want)
			}
		})
	}
}

// TestWriterAdvice: each upstream writer hubsync replaces is named with
// the feature gate to turn off, by its own field manager and by the one
// the API server gives it from its binary.
func TestWriterAdvice(t *testing.T) {
	tests := []struct {
		writer, kind, controller string
		advice                   []string
	}{
		{"cluster-proxy", KindProfile, "cluster-proxy", []string{"ClusterProfileAccessProvider", "featureGates.clusterProfileAccessProvider", "clusterProfile from v0.11"}},
		{"manager", KindProfile, "cluster-proxy", []string{"ClusterProfileAccessProvider"}},
		{"manager", KindCredential, "manager", []string{`field manager "manager"`}},
		{"msa", KindCredential, "managed-serviceaccount", []string{"ClusterProfileCredSyncer", "featureGates.clusterProfileCredSyncer", "ClusterProfile in later releases"}},
		{"managed-serviceaccount", KindCredential, "managed-serviceaccount", []string{"ClusterProfileCredSyncer"}},
		{"registration", KindProfile, "OCM registration", []string{"feature: ClusterProfile, mode: Disable"}},
		{"", KindProfile, "unknown", []string{"another hubsync"}},
		{"my-tool", KindProfile, "my-tool", []string{`field manager "my-tool"`}},
	}
	for _, tt := range tests {
		t.Run(tt.writer+"/"+tt.kind, func(t *testing.T) {
			controller, advice := writerAdvice(tt.writer, tt.kind)
			if controller != tt.controller {
				t.Errorf("controller = %q, want %q", controller, tt.controller)
			}
			for _, a := range tt.advice {
				if !strings.Contains(advice, a) {
					t.Errorf("advice %q lacks %q", advice, a)
				}
			}
		})
	}
}

// BenchmarkOwnWrite is what detection adds to each write hubsync makes:
// the print of what it wants, the check before the write, the record
// after it.
func BenchmarkOwnWrite(b *testing.B) {
	f := newForeignWriters(clock.RealClock{}, ForeignOptions{HoldOff: time.Second, MaxHoldOff: time.Second})
	providers := []Provider{{Name: "open-cluster-management"}}
	p := printedProfile()
	b.ReportAllocs()
	for b.Loop() {
		intent := f.profilePrint(p, &p.Status, providers)
		f.observe(KindProfile, "team-a", "c1", "1", intent)
		f.wrote(KindProfile, "team-a", "c1", "1", intent)
	}
}
