package syncer

import (
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kubefake "k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"
	clusterfake "open-cluster-management.io/api/client/cluster/clientset/versioned/fake"
	msav1beta1 "open-cluster-management.io/managed-serviceaccount/apis/authentication/v1beta1"
	msafake "open-cluster-management.io/managed-serviceaccount/pkg/generated/clientset/versioned/fake"
	cpv1alpha1 "sigs.k8s.io/cluster-inventory-api/apis/v1alpha1"
	cpfake "sigs.k8s.io/cluster-inventory-api/client/clientset/versioned/fake"

	"github.com/hubsync/hubsync/hub"
)

func TestCopyStateOf(t *testing.T) {
	created := time.Date(2026, 11, 1, 10, 0, 0, 0, time.UTC)
	stamped := time.Date(2026, 11, 20, 8, 30, 0, 0, time.UTC)
	copyOf := func(token string, annotations map[string]string) *corev1.Secret {
		return &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: "c1-app", Namespace: "team-a", CreationTimestamp: metav1.NewTime(created), Annotations: annotations},
			Data:       map[string][]byte{hub.TokenKey: []byte(token)},
		}
	}
	source := func(token string) *corev1.Secret {
		return &corev1.Secret{Data: map[string][]byte{hub.TokenKey: []byte(token)}}
	}
	stamp := map[string]string{hub.AnnotationSyncedAt: stamped.Format(time.RFC3339)}
	tests := []struct {
		name      string
		copy      *corev1.Secret
		source    *corev1.Secret
		wantAt    time.Time
		wantStale bool
	}{
		{"in step, stamped", copyOf("t1", stamp), source("t1"), stamped, false},
		{"rotated source, copy behind", copyOf("t1", stamp), source("t2"), stamped, true},
		{"no stamp: its creation", copyOf("t1", nil), source("t1"), created, false},
		{"unreadable stamp: its creation", copyOf("t1", map[string]string{hub.AnnotationSyncedAt: "yesterday"}), source("t1"), created, false},
		{"no source: not behind anything", copyOf("t1", stamp), nil, stamped, false},
		{"source without a token: not behind anything", copyOf("t1", stamp), source("  "), stamped, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := CopyStateOf("c1/app", tt.copy, tt.source)
			if !got.SyncedAt.Equal(tt.wantAt) || got.Stale != tt.wantStale || got.Pair != "c1/app" {
				t.Errorf("CopyStateOf = %+v; want synced at %v, stale %v", got, tt.wantAt, tt.wantStale)
			}
		})
	}
}

// TestPlanStampsDataWrites: a created copy and a copy whose data is
// rewritten carry the plan's time; a metadata repair keeps the old stamp.
func TestPlanStampsDataWrites(t *testing.T) {
	now := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	old := "2026-11-01T00:00:00Z"
	msa := &msav1beta1.ManagedServiceAccount{
		ObjectMeta: metav1.ObjectMeta{Name: "app", Namespace: "c1", Labels: map[string]string{hub.LabelSyncToClusterProfile: "true"}},
		Status:     msav1beta1.ManagedServiceAccountStatus{TokenSecretRef: &msav1beta1.SecretRef{Name: "app"}},
	}
	src := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "app", Namespace: "c1"}, Data: map[string][]byte{hub.TokenKey: []byte("t2"), hub.CAKey: []byte("ca")}}
	profile := &cpv1alpha1.ClusterProfile{ObjectMeta: metav1.ObjectMeta{Name: "c1", Namespace: "team-a", UID: "u1",
		Labels: map[string]string{hub.LabelClusterManager: "m"}}}
	pair := Pair{Cluster: "c1", MSA: "app", Manager: "m", Now: now}
	current := func(token string, mutate func(*corev1.Secret)) *corev1.Secret {
		c := DesiredCopy("c1", "app", msa, &corev1.Secret{Data: map[string][]byte{hub.TokenKey: []byte(token), hub.CAKey: []byte("ca")}}, profile)
		c.Annotations[hub.AnnotationSyncedAt] = old
		c.ResourceVersion = "5"
		if mutate != nil {
			mutate(c)
		}
		return c
	}
	tests := []struct {
		name  string
		cur   *corev1.Secret
		want  string // the stamp of the written copy; "" when nothing is written
		wantN int
	}{
		{"created", nil, now.Format(time.RFC3339), 1},
		{"rotated", current("t1", nil), now.Format(time.RFC3339), 1},
		{"metadata repaired", current("t2", func(s *corev1.Secret) { s.Labels = nil }), old, 1},
		{"in step", current("t2", nil), "", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var copies []*corev1.Secret
			if tt.cur != nil {
				copies = append(copies, tt.cur)
			}
			plan := PlanCopies(pair, []*cpv1alpha1.ClusterProfile{profile}, copies, msa, src)
			var written []*corev1.Secret
			written = append(written, plan.Create...)
			for _, u := range plan.Update {
				written = append(written, u.Secret)
			}
			if len(written) != tt.wantN {
				t.Fatalf("plan writes %d copies, want %d: %+v", len(written), tt.wantN, plan)
			}
			if tt.wantN > 0 {
				if got := written[0].Annotations[hub.AnnotationSyncedAt]; got != tt.want {
					t.Errorf("synced-at %q, want %q", got, tt.want)
				}
			}
		})
	}
}

// TestConsumerMetrics follows a namespace through the consumer metrics:
// its profiles and copies counted from what the informers deliver, a
// rotated source making its copy stale until the copy follows (with a
// new oldest time), and the namespace's series gone with its last profile
// and copy. A standby's syncer, never running, reports nothing.
func TestConsumerMetrics(t *testing.T) {
	const manager = "open-cluster-management"
	reg := prometheus.NewPedanticRegistry()
	s, err := New(Clients{Kube: kubefake.NewSimpleClientset(), Cluster: clusterfake.NewSimpleClientset(), Profiles: cpfake.NewSimpleClientset()},
		Options{ClusterManager: manager, Workers: 1, RetryBase: time.Millisecond, RetryMax: time.Second,
			RequestTimeout: time.Second, ForeignWriters: ForeignOptions{HoldOff: time.Second, MaxHoldOff: time.Minute},
			Credentials: &CredentialOptions{Client: msafake.NewSimpleClientset(), Workers: 1, Coalesce: time.Millisecond}},
		slog.New(slog.NewTextHandler(io.Discard, nil)), reg, record.NewFakeRecorder(10))
	if err != nil {
		t.Fatal(err)
	}
	// The informers, taken but not run: the test fills their stores.
	if _, err := s.watch(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.holds.Release() })
	c := s.creds
	hubSecrets := c.hubInf.Informer().GetIndexer()
	profileEvents := s.consumers.profileHandler()

	created := time.Unix(1_700_000_000, 0).UTC()
	synced1 := created.Add(time.Hour)
	synced2 := created.Add(2 * time.Hour)
	profile := func(ns, name, mgr string) *cpv1alpha1.ClusterProfile {
		return &cpv1alpha1.ClusterProfile{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: types.UID("u-" + ns + name),
			Labels: map[string]string{hub.LabelClusterManager: mgr}}}
	}
	copyIn := func(p *cpv1alpha1.ClusterProfile, token string, at time.Time) *corev1.Secret {
		return &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{
				Name: hub.CopyName(p.Name, "app"), Namespace: p.Namespace, CreationTimestamp: metav1.NewTime(created),
				Labels:      map[string]string{hub.LabelSyncedFrom: hub.SyncedFromValue(p.Name, "app")},
				Annotations: map[string]string{hub.AnnotationSource: hub.SourceKey(p.Name, "app"), hub.AnnotationSyncedAt: at.Format(time.RFC3339)},
				OwnerReferences: []metav1.OwnerReference{{APIVersion: cpv1alpha1.GroupVersion.String(), Kind: "ClusterProfile",
					Name: p.Name, UID: p.UID, Controller: ptr.To(true)}},
			},
			Data: map[string][]byte{hub.TokenKey: []byte(token)},
		}
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	expect := func(what, want string) {
		t.Helper()
		if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "hubsync_consumer_profiles", "hubsync_consumer_credential_copies",
			"hubsync_consumer_credential_copies_stale", "hubsync_consumer_credential_copy_oldest_timestamp_seconds"); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	const help = `
# HELP hubsync_consumer_credential_copies Credential copies in each consumer namespace.
# TYPE hubsync_consumer_credential_copies gauge
# HELP hubsync_consumer_credential_copies_stale Credential copies whose token is not their source's current token, in each consumer namespace.
# TYPE hubsync_consumer_credential_copies_stale gauge
# HELP hubsync_consumer_credential_copy_oldest_timestamp_seconds Unix time at which the namespace's oldest credential copy was last brought in step with its source: its hubsync.io/synced-at annotation, else its creation; time() minus it is that copy's age.
# TYPE hubsync_consumer_credential_copy_oldest_timestamp_seconds gauge
# HELP hubsync_consumer_profiles ClusterProfiles hubsync manages in each consumer namespace.
# TYPE hubsync_consumer_profiles gauge
`

	// The source: MSA c1/app, its token Secret, and c2/app likewise.
	for _, cluster := range []string{"c1", "c2"} {
		must(c.msaIdx.Add(&msav1beta1.ManagedServiceAccount{
			ObjectMeta: metav1.ObjectMeta{Name: "app", Namespace: cluster, Labels: map[string]string{hub.LabelSyncToClusterProfile: "true"}},
			Status:     msav1beta1.ManagedServiceAccountStatus{TokenSecretRef: &msav1beta1.SecretRef{Name: "app"}},
		}))
		must(hubSecrets.Add(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "app", Namespace: cluster}, Data: map[string][]byte{hub.TokenKey: []byte("t1")}}))
	}
	a1, a2, b1 := profile("team-a", "c1", manager), profile("team-a", "c2", manager), profile("team-b", "c1", manager)
	// team-d holds a profile but no copy yet; team-c only another
	// manager's profile, which does not count.
	for _, p := range []*cpv1alpha1.ClusterProfile{a1, a2, b1, profile("team-c", "c1", "someone-else"), profile("team-d", "c2", manager)} {
		profileEvents.OnAdd(p, true)
	}
	addCopy := func(sec *corev1.Secret) {
		must(c.copyIdx.Add(sec))
		c.refreshCopyStats(sec.Namespace, sec.Name)
	}
	addCopy(copyIn(a1, "t1", synced1))
	addCopy(copyIn(a2, "t1", synced2))
	addCopy(copyIn(b1, "t1", synced2))

	// Not running: a standby reports nothing.
	expect("standby", "")
	s.ready.Store(true)
	expect("running", help+`
hubsync_consumer_credential_copies{consumer_namespace="team-a"} 2
hubsync_consumer_credential_copies{consumer_namespace="team-b"} 1
hubsync_consumer_credential_copies{consumer_namespace="team-d"} 0
hubsync_consumer_credential_copies_stale{consumer_namespace="team-a"} 0
hubsync_consumer_credential_copies_stale{consumer_namespace="team-b"} 0
hubsync_consumer_credential_copies_stale{consumer_namespace="team-d"} 0
hubsync_consumer_credential_copy_oldest_timestamp_seconds{consumer_namespace="team-a"} 1.7000036e+09
hubsync_consumer_credential_copy_oldest_timestamp_seconds{consumer_namespace="team-b"} 1.7000072e+09
hubsync_consumer_profiles{consumer_namespace="team-a"} 2
hubsync_consumer_profiles{consumer_namespace="team-b"} 1
hubsync_consumer_profiles{consumer_namespace="team-d"} 1
`)
	profileEvents.OnDelete(profile("team-d", "c2", manager))

	// c1's token rotates: its copies are behind until they follow.
	must(hubSecrets.Update(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "app", Namespace: "c1"}, Data: map[string][]byte{hub.TokenKey: []byte("t2")}}))
	for _, key := range c.pairsOfTokenSecret(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "app", Namespace: "c1"}}) {
		c.refreshPairStats(key)
	}
	expect("rotated", help+`
hubsync_consumer_credential_copies{consumer_namespace="team-a"} 2
hubsync_consumer_credential_copies{consumer_namespace="team-b"} 1
hubsync_consumer_credential_copies_stale{consumer_namespace="team-a"} 1
hubsync_consumer_credential_copies_stale{consumer_namespace="team-b"} 1
hubsync_consumer_credential_copy_oldest_timestamp_seconds{consumer_namespace="team-a"} 1.7000036e+09
hubsync_consumer_credential_copy_oldest_timestamp_seconds{consumer_namespace="team-b"} 1.7000072e+09
hubsync_consumer_profiles{consumer_namespace="team-a"} 2
hubsync_consumer_profiles{consumer_namespace="team-b"} 1
`)
	synced3 := created.Add(3 * time.Hour)
	for _, p := range []*cpv1alpha1.ClusterProfile{a1, b1} {
		sec := copyIn(p, "t2", synced3)
		must(c.copyIdx.Update(sec))
		c.refreshCopyStats(sec.Namespace, sec.Name)
	}
	expect("followed", help+`
hubsync_consumer_credential_copies{consumer_namespace="team-a"} 2
hubsync_consumer_credential_copies{consumer_namespace="team-b"} 1
hubsync_consumer_credential_copies_stale{consumer_namespace="team-a"} 0
hubsync_consumer_credential_copies_stale{consumer_namespace="team-b"} 0
hubsync_consumer_credential_copy_oldest_timestamp_seconds{consumer_namespace="team-a"} 1.7000072e+09
hubsync_consumer_credential_copy_oldest_timestamp_seconds{consumer_namespace="team-b"} 1.7000108e+09
hubsync_consumer_profiles{consumer_namespace="team-a"} 2
hubsync_consumer_profiles{consumer_namespace="team-b"} 1
`)

	// team-b's binding goes: its profile and copy are deleted, and so are
	// its series. A profile handed to another manager no longer counts.
	profileEvents.OnDelete(b1)
	must(c.copyIdx.Delete(copyIn(b1, "t2", synced3)))
	c.refreshCopyStats("team-b", hub.CopyName("c1", "app"))
	profileEvents.OnUpdate(a2, profile("team-a", "c2", "someone-else"))
	expect("team-b gone", help+`
hubsync_consumer_credential_copies{consumer_namespace="team-a"} 2
hubsync_consumer_credential_copies_stale{consumer_namespace="team-a"} 0
hubsync_consumer_credential_copy_oldest_timestamp_seconds{consumer_namespace="team-a"} 1.7000072e+09
hubsync_consumer_profiles{consumer_namespace="team-a"} 1
`)
}
