package argocd

import (
	"context"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	k8stesting "k8s.io/client-go/testing"

	"github.com/hubsync/hubsync/stream"
	"github.com/hubsync/hubsync/test/testutil"
)

// integrationSecret is a cluster Secret as the argoproj-labs ClusterProfile
// integration writes it for the profile namespace/name: "cluster-<name>",
// its origin label "<namespace>-<name>", data name and server.
func integrationSecret(namespace, name, srv string, created time.Time) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: argoNS, Name: "cluster-" + name, UID: types.UID("uid-cluster-" + name),
			CreationTimestamp: metav1.NewTime(created),
			Labels:            map[string]string{LabelSecretType: SecretTypeCluster, LabelProfileOrigin: namespace + "-" + name},
		},
		Type: corev1.SecretTypeOpaque,
		Data: map[string][]byte{"name": []byte(name), "server": []byte(srv), "config": []byte(`{"tlsClientConfig":{"insecure":false}}`)},
	}
}

func TestCovering(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name    string
		secrets []*corev1.Secret
		server  string
		want    *skip
	}{{
		name: "none",
	}, {
		name:    "same profile, other server",
		secrets: []*corev1.Secret{integrationSecret(consumer, "c1", "https://gke.example/c1", t0)},
		server:  server("c1"),
		want:    &skip{reason: SkipIntegrationProfile, secret: "cluster-c1"},
	}, {
		name:    "same server, other profile",
		secrets: []*corev1.Secret{integrationSecret("argocd", "c1-alias", server("c1")+"/", t0)},
		server:  server("c1"),
		want:    &skip{reason: SkipIntegrationServer, secret: "cluster-c1-alias"},
	}, {
		name: "same profile wins over same server",
		secrets: []*corev1.Secret{
			integrationSecret("argocd", "x", server("c1"), t0),
			integrationSecret(consumer, "c1", server("c1"), t0.Add(time.Hour)),
		},
		server: server("c1"),
		want:   &skip{reason: SkipIntegrationProfile, secret: "cluster-c1"},
	}, {
		// "team" + "a-c1" gives the origin "team-a-c1" too, but that
		// Secret names cluster a-c1: not this profile.
		name:    "same origin value, other cluster name",
		secrets: []*corev1.Secret{integrationSecret("team", "a-c1", "https://elsewhere.example", t0)},
		server:  server("c1"),
	}, {
		name:    "another profile of another server",
		secrets: []*corev1.Secret{integrationSecret(consumer, "c2", server("c2"), t0)},
		server:  server("c1"),
	}, {
		name: "the oldest of two with the server",
		secrets: []*corev1.Secret{
			integrationSecret("ns-b", "b", server("c1"), t0.Add(time.Hour)),
			integrationSecret("ns-a", "a", server("c1"), t0),
		},
		server: server("c1"),
		want:   &skip{reason: SkipIntegrationServer, secret: "cluster-a"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			in := newIntegrationSecrets()
			for _, s := range tc.secrets {
				in.add(s)
			}
			got := in.covering(consumer, "c1", tc.server)
			switch {
			case (got == nil) != (tc.want == nil):
				t.Errorf("covering = %v, want %v", got, tc.want)
			case got != nil && *got != *tc.want:
				t.Errorf("covering = %+v, want %+v", *got, *tc.want)
			}
		})
	}
}

func (e *env) skipped(t *testing.T, reason string) float64 {
	t.Helper()
	m, err := testutil.Gather(e.reg)
	if err != nil {
		t.Fatal(err)
	}
	v, ok := m.Lookup("hubsync_argocd_clusters_skipped", testutil.Labels{"sink": sinkName, "reason": reason})
	if !ok {
		t.Fatalf("no hubsync_argocd_clusters_skipped series for reason %s", reason)
	}
	return v
}

// TestIntegrationSecretWins: a cluster the integration already gives Argo
// CD gets no Secret from the sink, and loses the one it had even when that
// one is older (unlike a hand-made Secret, TestOlderSecretKeepsServer);
// once the integration's Secret is gone, a resync writes it again.
func TestIntegrationSecretWins(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name, reason string
		theirs       *corev1.Secret
	}{
		{name: "same profile", reason: SkipIntegrationProfile, theirs: integrationSecret(consumer, "c1", "https://gke.example/c1", time.Now().Add(time.Hour))},
		{name: "same server", reason: SkipIntegrationServer, theirs: integrationSecret("argocd", "prod-east", server("c1"), time.Now().Add(time.Hour))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, nil)
			snap := []stream.Change{profile(stream.ProfileUpdated, consumer, "c1", server("c1")), profile(stream.ProfileUpdated, consumer, "c2", server("c2"))}
			if err := e.sink.Resync(ctx, snap); err != nil {
				t.Fatal(err)
			}
			if _, err := e.kube.CoreV1().Secrets(argoNS).Create(ctx, tc.theirs, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			for range 2 {
				if err := e.sink.Resync(ctx, snap); err != nil {
					t.Fatal(err)
				}
			}
			if got, want := e.names(t), []string{tc.theirs.Name, "hubsync-prod-c2"}; !slices.Equal(got, want) {
				t.Fatalf("Secrets %v, want %v", got, want)
			}
			if e.skipped(t, tc.reason) != 1 || e.conflicts(t) != 0 {
				t.Errorf("skipped(%s) %v, conflicts %v; want 1 and 0", tc.reason, e.skipped(t, tc.reason), e.conflicts(t))
			}
			if n := strings.Count(e.logs.String(), "left to the ClusterProfile integration"); n != 1 {
				t.Errorf("%d skip lines after two resyncs, want one:\n%s", n, e.logs)
			}
			// Deliveries do not bring the sink's Secret back while theirs is there.
			if err := e.sink.Deliver(ctx, []stream.Change{profile(stream.ProfileUpdated, consumer, "c1", server("c1"))}); err != nil {
				t.Fatal(err)
			}
			if slices.Contains(e.names(t), "hubsync-prod-c1") {
				t.Errorf("a delivery wrote the Secret of a covered cluster")
			}

			if err := e.kube.CoreV1().Secrets(argoNS).Delete(ctx, tc.theirs.Name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			if err := e.sink.Resync(ctx, snap); err != nil {
				t.Fatal(err)
			}
			if got, want := e.names(t), []string{"hubsync-prod-c1", "hubsync-prod-c2"}; !slices.Equal(got, want) {
				t.Fatalf("Secrets %v after the integration's Secret went, want %v", got, want)
			}
			if e.skipped(t, tc.reason) != 0 || !strings.Contains(e.logs.String(), "no longer covered") {
				t.Errorf("skipped(%s) %v after it went; log:\n%s", tc.reason, e.skipped(t, tc.reason), e.logs)
			}
		})
	}
}

// TestCoveredClusterTakesNoServer: of two clusters with one server, the
// first by name would get it; when the integration covers that one (as its
// own profile, at another server), the second gets the server.
func TestCoveredClusterTakesNoServer(t *testing.T) {
	ctx := context.Background()
	shared := "https://shared.example:6443"
	e := newEnv(t, nil, integrationSecret(consumer, "a", "https://a.gke.example", time.Now()))
	if err := e.sink.Resync(ctx, []stream.Change{
		profile(stream.ProfileUpdated, consumer, "a", shared),
		profile(stream.ProfileUpdated, consumer, "b", shared),
	}); err != nil {
		t.Fatal(err)
	}
	if got, want := e.names(t), []string{"cluster-a", "hubsync-prod-b"}; !slices.Equal(got, want) {
		t.Errorf("Secrets %v, want %v", got, want)
	}
	if e.conflicts(t) != 0 || e.skipped(t, SkipIntegrationProfile) != 1 {
		t.Errorf("conflicts %v, skipped %v; want 0 and 1", e.conflicts(t), e.skipped(t, SkipIntegrationProfile))
	}
}

// countingControl is a stream.Control that counts resync requests.
type countingControl struct{ resyncs atomic.Int32 }

func (c *countingControl) RequestResync() { c.resyncs.Add(1) }
func (c *countingControl) Retry()         {}

// TestWatchRequestsResync: once attached, the sink asks for a resync when
// an integration Secret appears, changes its server, or goes, and not for
// Secrets of others or changes that do not decide coverage.
func TestWatchRequestsResync(t *testing.T) {
	ctx := context.Background()
	existing := integrationSecret(consumer, "c0", server("c0"), time.Now())
	e := newEnv(t, nil, existing)
	// The fake clientset has no resource versions: what happens between
	// the informer's list and its watch is lost, so the test starts once
	// the watch is registered.
	var watching atomic.Bool
	e.kube.PrependWatchReactor("secrets", func(a k8stesting.Action) (bool, watch.Interface, error) {
		w, err := e.kube.Tracker().Watch(a.GetResource(), a.GetNamespace())
		watching.Store(true)
		return true, w, err
	})
	c := &countingControl{}
	e.sink.Attach(c)
	testutil.Eventually(t, 5*time.Second, 10*time.Millisecond, watching.Load, "the sink's watch")
	secrets := e.kube.CoreV1().Secrets(argoNS)
	expect := func(n int32, step string) {
		t.Helper()
		testutil.Eventually(t, 5*time.Second, 10*time.Millisecond, func() bool { return c.resyncs.Load() >= n }, "resync requests after %s", step)
		if got := c.resyncs.Load(); got != n {
			t.Fatalf("%d resync requests after %s, want %d", got, step, n)
		}
	}

	// An unrelated cluster Secret, and an annotation on the integration's:
	// no request. The next step's request proves they were seen first.
	if _, err := secrets.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: argoNS, Name: "by-hand",
		Labels: map[string]string{LabelSecretType: SecretTypeCluster}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	annotated := existing.DeepCopy()
	annotated.Annotations = map[string]string{"note": "x"}
	if _, err := secrets.Update(ctx, annotated, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := secrets.Create(ctx, integrationSecret(consumer, "c1", server("c1"), time.Now()), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	expect(1, "an integration Secret appeared")

	moved := integrationSecret(consumer, "c1", server("c1-moved"), time.Now())
	if _, err := secrets.Update(ctx, moved, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	expect(2, "its server changed")

	if err := secrets.Delete(ctx, moved.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	expect(3, "it went")
	// The watch hands events over in order: once a fourth Secret's request
	// arrives, every earlier event was handled, so an exact count shows
	// that none of them asked for more.
	if _, err := secrets.Create(ctx, integrationSecret(consumer, "c9", server("c9"), time.Now()), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	expect(4, "a fourth integration Secret appeared")

	if err := e.sink.Close(); err != nil {
		t.Fatal(err)
	}
	if err := secrets.Delete(ctx, existing.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := secrets.Create(ctx, integrationSecret(consumer, "c2", server("c2"), time.Now()), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The watch stopped with Close: nothing can arrive any more (Shutdown
	// waited for its goroutines), so one look suffices.
	if got := c.resyncs.Load(); got != 4 {
		t.Errorf("%d resync requests after Close, want still 4", got)
	}
}
