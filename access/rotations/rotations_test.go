package rotations

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	clientcmdv1 "k8s.io/client-go/tools/clientcmd/api/v1"
	cpv1alpha1 "sigs.k8s.io/cluster-inventory-api/apis/v1alpha1"

	"github.com/hubsync/hubsync/access"
	"github.com/hubsync/hubsync/events"
	"github.com/hubsync/hubsync/hub"
	"github.com/hubsync/hubsync/stream"
	"github.com/hubsync/hubsync/test/testutil"
)

const (
	ns      = "team-ml"
	cluster = "c1.eu"
	msa     = "app"
	prefix  = "acme.hubsync"
)

func TestSubject(t *testing.T) {
	if got, want := Subject("hubsync", "team-ml"), "hubsync.team-ml.*.credential"; got != want {
		t.Errorf("Subject = %q, want %q", got, want)
	}
}

// recorder is the cluster: it records the token of every request.
type recorder struct {
	mu    sync.Mutex
	auths []string
}

func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	r.mu.Lock()
	r.auths = append(r.auths, req.Header.Get("Authorization"))
	r.mu.Unlock()
	return &http.Response{StatusCode: 200, Body: io.NopCloser(strings.NewReader("{}")), Header: http.Header{}, Request: req}, nil
}

func (r *recorder) last() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.auths[len(r.auths)-1]
}

func copySecret(token string) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: hub.CopyName(cluster, msa), Labels: map[string]string{hub.LabelSyncedFrom: hub.SyncedFromValue(cluster, msa)}},
		Data:       map[string][]byte{hub.TokenKey: []byte(token)},
	}
}

func startNATS(t *testing.T) (*server.Server, *nats.Conn) {
	t.Helper()
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, NoLog: true, NoSigs: true,
		JetStream: true, StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server did not start")
	}
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	// The event stream, as hubsync's bus makes it.
	js, err := nc.JetStream()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.AddStream(&nats.StreamConfig{Name: "HUBSYNC_EVENTS", Subjects: []string{prefix + ".>"}}); err != nil {
		t.Fatal(err)
	}
	return s, nc
}

// publish sends the event of a credential change of (namespace, cluster)
// for msaName as hubsync's bus does.
func publish(t *testing.T, nc *nats.Conn, typ, namespace, clusterName, msaName, token string) {
	t.Helper()
	c := stream.Change{
		Type: typ, Namespace: namespace, Cluster: clusterName, Name: hub.CopyName(clusterName, msaName), ResourceVersion: "2", Time: time.Now(),
		Credential: &stream.CredentialSummary{ManagedServiceAccount: msaName, Secret: hub.CopyName(clusterName, msaName), Fingerprint: hub.TokenFingerprint([]byte(token))},
	}
	data, err := events.Encode(c, "hubsync/open-cluster-management")
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Publish(events.Subject(prefix, namespace, clusterName, "credential"), data); err != nil {
		t.Fatal(err)
	}
}

// TestFollow: a credential.rotated event of the Source's namespace and
// ManagedServiceAccount makes it read the copy at once (the Source runs no
// informer here, so only the event can bring the new token); other
// events make it read nothing.
func TestFollow(t *testing.T) {
	srv, nc := startNATS(t)
	kube := fake.NewClientset(copySecret("token-A"))
	src, err := access.NewForClients(access.Clients{Kube: kube}, access.Options{Namespace: ns, ManagedServiceAccount: msa})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &cpv1alpha1.ClusterProfile{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: cluster},
		Status: cpv1alpha1.ClusterProfileStatus{AccessProviders: []cpv1alpha1.AccessProvider{
			{Name: access.DefaultProvider, Cluster: clientcmdv1.Cluster{Server: "https://c1.example"}},
		}},
	}
	cfg, err := src.ConfigFor(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	rt := cfg.WrapTransport(rec)
	send := func() {
		req, _ := http.NewRequest(http.MethodGet, "https://c1.example/api", nil)
		resp, err := rt.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
	}

	// The server counts its own subscriptions too: wait for one more.
	base := srv.NumSubscriptions()
	done := make(chan error, 1)
	go func() { done <- Follow(ctx, nc, src, prefix, nil) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	testutil.Eventually(t, 10*time.Second, 10*time.Millisecond, func() bool { return srv.NumSubscriptions() > base }, "subscribed")

	if _, err := kube.CoreV1().Secrets(ns).Update(ctx, copySecret("token-B"), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	kube.ClearActions()
	pub, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	// Ignored, in order: another namespace's, another ManagedServiceAccount's,
	// a synced (not rotated) event, one with the token already held, and
	// a message that is not an event.
	publish(t, pub, stream.CredentialRotated, "team-other", cluster, msa, "token-C")
	publish(t, pub, stream.CredentialRotated, ns, cluster, "other", "token-C")
	publish(t, pub, stream.CredentialSynced, ns, cluster, msa, "token-C")
	publish(t, pub, stream.CredentialRotated, ns, cluster, msa, "token-A")
	if err := pub.Publish(Subject(prefix, ns), []byte("not an event")); err != nil {
		t.Fatal(err)
	}
	// Used: the rotation to token B.
	publish(t, pub, stream.CredentialRotated, ns, cluster, msa, "token-B")
	testutil.Eventually(t, 10*time.Second, 10*time.Millisecond, func() bool {
		send()
		return rec.last() == "Bearer token-B"
	}, "requests carry the token of the rotation event")
	var gets int
	for _, a := range kube.Actions() {
		if a.GetVerb() == "get" && a.GetResource().Resource == "secrets" {
			gets++
		}
	}
	if gets != 1 {
		t.Errorf("%d reads of the copy, want 1 (only the rotation of this namespace's copy with a new token)", gets)
	}
}
