package argocdproof

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/sinks"
	"github.com/hubsync/hubsync/sinks/argocd"
	"github.com/hubsync/hubsync/stream"
	"github.com/hubsync/hubsync/test/testutil"
)

// integrationNS is the Argo CD namespace of the integration scenario.
const integrationNS = "argocd-integration"

// integrationSecret is a cluster Secret written by hand the way the
// argoproj-labs ClusterProfile integration writes one for the profile
// namespace/name (github.com/argoproj-labs/clusterprofile-integration-for-argocd,
// controller.go mutateSecret): named "cluster-<name>", labelled as a
// cluster Secret and with argocd.argoproj.io/cluster-profile-origin:
// "<namespace>-<name>", its data set through stringData (name, server and
// a config whose exec provider runs cp-creds with the cluster info).
func integrationSecret(namespace, name, server string) *corev1.Secret {
	cfg := fmt.Sprintf(`{"tlsClientConfig":{"insecure":false},"execProviderConfig":{"command":"/plugins/cp-creds",`+
		`"args":["--managed-serviceaccount=argocd"],"apiVersion":"client.authentication.k8s.io/v1","provideClusterInfo":true,`+
		`"config":{"clusterName":%q}}}`, name)
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: integrationNS, Name: "cluster-" + name,
			Labels: map[string]string{
				"argocd.argoproj.io/secret-type":            "cluster",
				"argocd.argoproj.io/cluster-profile-origin": namespace + "-" + name,
			},
		},
		StringData: map[string]string{"name": name, "server": server, "config": cfg},
	}
}

// syncLog is a log buffer safe for the sink's goroutines.
type syncLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *syncLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *syncLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// integration: beside the ClusterProfile integration, on the real API
// server, with the sink run as the daemon runs it (a sinks.Manager on a
// stream.Fanout, no periodic resync, so that what the sink does after
// its first resync comes from its watch). A Secret of the same profile,
// then one of another profile with the same server, each makes the sink
// delete its own, so that Argo CD's own ListClusters holds the cluster
// once, from the integration's Secret; when it goes, the sink writes its
// own again.
func (p *proof) integration(t *testing.T) {
	ctx := t.Context()
	bin := testutil.Plugin(t)
	reg := prometheus.NewRegistry()
	logs := &syncLog{}
	log := slog.New(slog.NewTextHandler(logs, nil))
	fan, err := stream.NewFanout(log, reg)
	if err != nil {
		t.Fatal(err)
	}
	manager := sinks.NewManager(fan, sinks.Deps{Kube: p.h.kube, Log: log, Registerer: reg},
		map[string]sinks.Factory{config.SinkArgoCD: argocd.New})
	t.Cleanup(func() {
		_ = manager.Close()
		_ = fan.Close(context.Background())
		if t.Failed() {
			t.Logf("hubsync's log:\n%s", logs)
		}
	})
	const sink = "proof-int"
	cfg := sinkConfig(sink, integrationNS, func(a *config.ArgoCDSink) { a.Exec = config.ExecAuth{Command: bin} })
	if _, err := manager.Apply([]config.Sink{cfg}); err != nil {
		t.Fatalf("start the sink: %v", err)
	}
	if err := fan.Start(ctx, p.h.snapshot); err != nil {
		t.Fatal(err)
	}
	server := strings.TrimRight(p.h.cfg.Host, "/")
	ours := argocd.SecretName(sink, clusterName)
	p.expectArgoSees(t, server, ours, "the sink's first resync")

	for _, tc := range []struct {
		what, reason string
		theirs       *corev1.Secret
	}{
		{what: "a Secret of the same profile", reason: argocd.SkipIntegrationProfile, theirs: integrationSecret(consumerNS, clusterName, server)},
		{what: "a Secret of another profile with the same server", reason: argocd.SkipIntegrationServer, theirs: integrationSecret("argocd", "prod-east", server+"/")},
	} {
		secrets := p.h.kube.CoreV1().Secrets(integrationNS)
		// The sink's Secret is the older one (creation times are in
		// seconds): the integration's must win all the same, where a
		// hand-made newcomer would be reported and left beside it.
		cur, err := secrets.Get(ctx, ours, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, 5*time.Second, 50*time.Millisecond, func() bool {
			return time.Now().After(cur.CreationTimestamp.Add(time.Second))
		}, "a second after the sink's Secret was created")
		if _, err := secrets.Create(ctx, tc.theirs, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		p.expectArgoSees(t, server, tc.theirs.Name, "the integration wrote "+tc.what)
		if v := skipped(t, reg, sink, tc.reason); v != 1 {
			t.Errorf("hubsync_argocd_clusters_skipped{reason=%q} = %v beside %s, want 1", tc.reason, v, tc.what)
		}
		if err := secrets.Delete(ctx, tc.theirs.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		p.expectArgoSees(t, server, ours, "the integration's Secret went")
		if v := skipped(t, reg, sink, tc.reason); v != 0 {
			t.Errorf("hubsync_argocd_clusters_skipped{reason=%q} = %v once it went, want 0", tc.reason, v)
		}
	}
	if n := strings.Count(logs.String(), "left to the ClusterProfile integration"); n != 2 {
		t.Errorf("%d log lines about clusters left to the integration, want 2:\n%s", n, logs)
	}
}

// expectArgoSees waits until the only cluster Argo CD's own ListClusters
// has with server comes from the Secret named want, and GetCluster finds
// it there: never two Secrets with one server, never none for long.
func (p *proof) expectArgoSees(t *testing.T, server, want, after string) {
	t.Helper()
	ctx := t.Context()
	secrets := p.h.kube.CoreV1().Secrets(integrationNS)
	testutil.Eventually(t, 30*time.Second, 50*time.Millisecond, func() error {
		sec, err := secrets.Get(ctx, want, metav1.GetOptions{})
		if err != nil {
			return err
		}
		listed, err := p.argo.Clusters(ctx, p.h.kube, integrationNS)
		if err != nil {
			return fmt.Errorf("Argo CD's ListClusters: %w", err)
		}
		var ids []string
		for _, c := range listed {
			if c.Server == server {
				ids = append(ids, c.ID)
			}
		}
		if len(ids) != 1 || ids[0] != string(sec.UID) {
			return fmt.Errorf("Argo CD lists Secrets %v with server %s, want only %s (%s)", ids, server, want, sec.UID)
		}
		got, err := p.argo.ByServer(ctx, p.h.kube, integrationNS, server)
		if err != nil || got.ID != string(sec.UID) {
			return fmt.Errorf("Argo CD's GetCluster(%s) = %+v, %v; want %s", server, got, err, want)
		}
		return nil
	}, "Argo CD %s's view after %s", p.argo.Version, after)
	// The sink's Secret is gone whenever the integration's is there.
	if want != argocd.SecretName("proof-int", clusterName) {
		if _, err := secrets.Get(ctx, argocd.SecretName("proof-int", clusterName), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("the sink's Secret beside the integration's: %v, want NotFound", err)
		}
	}
}

// skipped reads hubsync_argocd_clusters_skipped of sink for reason.
func skipped(t *testing.T, reg prometheus.Gatherer, sink, reason string) float64 {
	t.Helper()
	m, err := testutil.Gather(reg)
	if err != nil {
		t.Fatal(err)
	}
	return m.Value("hubsync_argocd_clusters_skipped", testutil.Labels{"sink": sink, "reason": reason})
}
