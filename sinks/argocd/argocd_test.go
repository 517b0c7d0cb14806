package argocd

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/hub"
	"github.com/hubsync/hubsync/sinks"
	"github.com/hubsync/hubsync/stream"
)

const (
	sinkName = "prod"
	argoNS   = "argocd"
	consumer = "team-a"
	provider = "ocm"
	msa      = "argocd"
)

var testCA = []byte("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")

// env is one sink on a fake hub, with its log and metrics.
type env struct {
	sink *Sink
	kube *fake.Clientset
	reg  *prometheus.Registry
	logs *bytes.Buffer
}

func newEnv(t *testing.T, mutate func(*config.ArgoCDSink), objs ...runtime.Object) *env {
	t.Helper()
	a := &config.ArgoCDSink{
		Namespace:             argoNS,
		ConsumerNamespace:     consumer,
		AccessProvider:        provider,
		ManagedServiceAccount: msa,
		Exec:                  config.ExecAuth{Command: "/usr/local/bin/hubsync", InstallHint: "hubsync must be in the image"},
	}
	if mutate != nil {
		mutate(a)
	}
	e := &env{kube: fake.NewClientset(objs...), reg: prometheus.NewRegistry(), logs: &bytes.Buffer{}}
	sc := config.Sink{Name: sinkName, Type: config.SinkArgoCD, ArgoCD: a}
	sc.SetDefaults()
	s, err := New(sc, sinks.Deps{
		Kube:       e.kube,
		Log:        slog.New(slog.NewTextHandler(e.logs, nil)),
		Registerer: e.reg,
	})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	e.sink = s.(*Sink)
	t.Cleanup(func() { _ = s.Close() })
	return e
}

func profile(typ, ns, cluster, server string) stream.Change {
	return stream.Change{
		Type: typ, Namespace: ns, Cluster: cluster, Name: cluster,
		Profile: &stream.ProfileSummary{AccessProviders: []stream.AccessProviderSummary{
			{Name: "other", Server: "https://elsewhere.example:443"},
			{Name: provider, Server: server, CAData: testCA},
		}},
	}
}

func credential(typ, cluster string) stream.Change {
	return stream.Change{
		Type: typ, Namespace: consumer, Cluster: cluster, Name: hub.CopyName(cluster, msa),
		Credential: &stream.CredentialSummary{ManagedServiceAccount: msa, Secret: hub.CopyName(cluster, msa)},
	}
}

func server(cluster string) string { return "https://" + cluster + ".example:6443" }

// copySecret is the credential copy of cluster holding token.
func copySecret(cluster, token string) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: consumer, Name: hub.CopyName(cluster, msa)},
		Type:       corev1.SecretTypeOpaque,
		Data:       map[string][]byte{hub.TokenKey: []byte(token)},
	}
}

func (e *env) get(t *testing.T, name string) *corev1.Secret {
	t.Helper()
	sec, err := e.kube.CoreV1().Secrets(argoNS).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get Secret %s: %v", name, err)
	}
	return sec
}

// names returns the names of the Secrets in Argo CD's namespace.
func (e *env) names(t *testing.T) []string {
	t.Helper()
	l, err := e.kube.CoreV1().Secrets(argoNS).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, s := range l.Items {
		out = append(out, s.Name)
	}
	slices.Sort(out)
	return out
}

// writes counts the create, update, patch and delete calls on Secrets in
// Argo CD's namespace.
func (e *env) writes() map[string]int {
	n := map[string]int{}
	for _, a := range e.kube.Actions() {
		if a.GetResource().Resource == "secrets" && a.GetNamespace() == argoNS {
			switch a.GetVerb() {
			case "create", "update", "patch", "delete":
				n[a.GetVerb()]++
			}
		}
	}
	return n
}

func (e *env) conflicts(t *testing.T) float64 {
	t.Helper()
	mfs, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "hubsync_argocd_conflicts" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "sink" && l.GetValue() == sinkName {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	t.Fatal("no hubsync_argocd_conflicts series for the sink")
	return 0
}

func decodeConfig(t *testing.T, sec *corev1.Secret) map[string]any {
	t.Helper()
	var cfg map[string]any
	if err := json.Unmarshal(sec.Data["config"], &cfg); err != nil {
		t.Fatalf("config of %s: %v", sec.Name, err)
	}
	return cfg
}

func TestExecSecretContent(t *testing.T) {
	ctx := context.Background()
	wantConfig := map[string]any{
		"tlsClientConfig": map[string]any{"insecure": false, "caData": base64.StdEncoding.EncodeToString(testCA)},
		"execProviderConfig": map[string]any{
			"command":     "/usr/local/bin/hubsync",
			"args":        []any{"creds", "--managed-serviceaccount=" + msa, "--cluster=c1", "--namespace=" + consumer},
			"apiVersion":  "client.authentication.k8s.io/v1",
			"installHint": "hubsync must be in the image",
		},
	}
	for _, tc := range []struct {
		name     string
		mutate   func(*config.ArgoCDSink)
		server   string
		wantData map[string]string
	}{{
		name:     "minimal",
		server:   "https://c1.example:6443",
		wantData: map[string]string{"name": "c1", "server": "https://c1.example:6443"},
	}, {
		name:     "trailing slash trimmed",
		server:   "https://c1.example:6443/",
		wantData: map[string]string{"name": "c1", "server": "https://c1.example:6443"},
	}, {
		name: "namespaces, cluster resources, project, shard",
		mutate: func(a *config.ArgoCDSink) {
			a.Namespaces = []string{"apps", "web"}
			a.ClusterResources = true
			a.Project = "platform"
			a.Shard = "2"
		},
		server: "https://c1.example:6443",
		wantData: map[string]string{
			"name": "c1", "server": "https://c1.example:6443",
			"namespaces": "apps,web", "clusterResources": "true", "project": "platform", "shard": "2",
		},
	}, {
		name:     "namespaces only",
		mutate:   func(a *config.ArgoCDSink) { a.Namespaces = []string{"apps"} },
		server:   "https://c1.example:6443",
		wantData: map[string]string{"name": "c1", "server": "https://c1.example:6443", "namespaces": "apps"},
	}, {
		// Argo CD reads clusterResources only for a cluster limited to
		// namespaces.
		name:     "cluster resources without namespaces",
		mutate:   func(a *config.ArgoCDSink) { a.ClusterResources = true },
		server:   "https://c1.example:6443",
		wantData: map[string]string{"name": "c1", "server": "https://c1.example:6443"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, func(a *config.ArgoCDSink) {
				a.Labels = map[string]string{"env": "prod", LabelSink: "not-this"}
				a.Annotations = map[string]string{"team": "a"}
				if tc.mutate != nil {
					tc.mutate(a)
				}
			})
			if err := e.sink.Resync(ctx, []stream.Change{profile(stream.ProfileUpdated, consumer, "c1", tc.server)}); err != nil {
				t.Fatal(err)
			}
			sec := e.get(t, "hubsync-prod-c1")
			if sec.Type != corev1.SecretTypeOpaque {
				t.Errorf("type %q", sec.Type)
			}
			wantLabels := map[string]string{
				LabelSecretType: SecretTypeCluster, LabelManagedBy: ManagedBy, LabelSink: sinkName,
				LabelClusterName: "c1", "env": "prod",
			}
			if !maps.Equal(sec.Labels, wantLabels) {
				t.Errorf("labels %v, want %v", sec.Labels, wantLabels)
			}
			if !maps.Equal(sec.Annotations, map[string]string{"team": "a"}) {
				t.Errorf("annotations %v", sec.Annotations)
			}
			got := map[string]string{}
			for k, v := range sec.Data {
				if k != "config" {
					got[k] = string(v)
				}
			}
			if !maps.Equal(got, tc.wantData) {
				t.Errorf("data %v, want %v", got, tc.wantData)
			}
			cfg, _ := json.Marshal(decodeConfig(t, sec))
			want, _ := json.Marshal(wantConfig)
			if !bytes.Equal(cfg, want) {
				t.Errorf("config\n%s\nwant\n%s", cfg, want)
			}
		})
	}
}

func TestTokenMode(t *testing.T) {
	ctx := context.Background()
	const tok1, tok2 = "token-one-SECRET", "token-two-SECRET"
	tokenMode := func(a *config.ArgoCDSink) { a.Auth = config.AuthToken }
	bearer := func(t *testing.T, e *env) any {
		t.Helper()
		cfg := decodeConfig(t, e.get(t, "hubsync-prod-c1"))
		if _, ok := cfg["execProviderConfig"]; ok {
			t.Error("token mode wrote an execProviderConfig")
		}
		return cfg["bearerToken"]
	}

	t.Run("written, rotated, removed", func(t *testing.T) {
		e := newEnv(t, tokenMode, copySecret("c1", tok1))
		snap := []stream.Change{profile(stream.ProfileUpdated, consumer, "c1", server("c1")), credential(stream.CredentialSynced, "c1")}
		if err := e.sink.Resync(ctx, snap); err != nil {
			t.Fatal(err)
		}
		if got := bearer(t, e); got != tok1 {
			t.Fatalf("bearerToken %v, want the first token", got)
		}
		if _, err := e.kube.CoreV1().Secrets(consumer).Update(ctx, copySecret("c1", tok2), metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := e.sink.Deliver(ctx, []stream.Change{credential(stream.CredentialRotated, "c1")}); err != nil {
			t.Fatal(err)
		}
		if got := bearer(t, e); got != tok2 {
			t.Fatalf("bearerToken %v after rotation, want the second token", got)
		}
		if w := e.writes(); w["update"] != 1 {
			t.Errorf("writes %v, want one update", w)
		}
		if err := e.sink.Deliver(ctx, []stream.Change{credential(stream.CredentialRemoved, "c1")}); err != nil {
			t.Fatal(err)
		}
		if n := e.names(t); len(n) != 0 {
			t.Errorf("Secrets %v after credential.removed, want none", n)
		}
		if strings.Contains(e.logs.String(), "SECRET") {
			t.Errorf("a token reached the log:\n%s", e.logs)
		}
	})

	t.Run("no credential announced", func(t *testing.T) {
		e := newEnv(t, tokenMode, copySecret("c1", tok1))
		if err := e.sink.Resync(ctx, []stream.Change{profile(stream.ProfileUpdated, consumer, "c1", server("c1"))}); err != nil {
			t.Fatal(err)
		}
		if n := e.names(t); len(n) != 0 {
			t.Errorf("Secrets %v without a credential copy, want none", n)
		}
	})

	t.Run("copy gone", func(t *testing.T) {
		e := newEnv(t, tokenMode, copySecret("c1", tok1))
		snap := []stream.Change{profile(stream.ProfileUpdated, consumer, "c1", server("c1")), credential(stream.CredentialSynced, "c1")}
		if err := e.sink.Resync(ctx, snap); err != nil {
			t.Fatal(err)
		}
		if err := e.kube.CoreV1().Secrets(consumer).Delete(ctx, hub.CopyName("c1", msa), metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		// The copy is read at delivery: one found missing is no error and
		// leaves no Secret with a stale token.
		if err := e.sink.Resync(ctx, snap); err != nil {
			t.Fatal(err)
		}
		if n := e.names(t); len(n) != 0 {
			t.Errorf("Secrets %v without a token, want none", n)
		}
	})

	t.Run("errors carry no token", func(t *testing.T) {
		e := newEnv(t, tokenMode, copySecret("c1", tok1))
		e.kube.PrependReactor("create", "secrets", func(a k8stesting.Action) (bool, runtime.Object, error) {
			obj := a.(k8stesting.CreateAction).GetObject().(*corev1.Secret)
			return true, nil, errors.New("refused: " + string(obj.Data["name"]))
		})
		snap := []stream.Change{profile(stream.ProfileUpdated, consumer, "c1", server("c1")), credential(stream.CredentialSynced, "c1")}
		err := e.sink.Resync(ctx, snap)
		if err == nil || !strings.Contains(err.Error(), "refused: c1") {
			t.Fatalf("Resync: %v, want the create error", err)
		}
		if strings.Contains(err.Error(), "SECRET") || strings.Contains(e.logs.String(), "SECRET") {
			t.Errorf("a token reached an error or the log: %v\n%s", err, e.logs)
		}
	})
}

func TestNoRewriteWhenUnchanged(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, nil)
	snap := []stream.Change{profile(stream.ProfileUpdated, consumer, "c1", server("c1")), credential(stream.CredentialSynced, "c1")}
	if err := e.sink.Resync(ctx, snap); err != nil {
		t.Fatal(err)
	}
	// Argo CD marks a cache refresh with an annotation: not the sink's to
	// remove, and no reason to write.
	sec := e.get(t, "hubsync-prod-c1")
	sec.Annotations = map[string]string{AnnotationRefresh: "2026-01-01T00:00:00Z"}
	if _, err := e.kube.CoreV1().Secrets(argoNS).Update(ctx, sec, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.kube.ClearActions()

	steps := []func() error{
		func() error { return e.sink.Resync(ctx, snap) },
		func() error {
			return e.sink.Deliver(ctx, []stream.Change{profile(stream.ProfileUpdated, consumer, "c1", server("c1"))})
		},
		func() error {
			return e.sink.Deliver(ctx, []stream.Change{profile(stream.AccessProviderUpdated, consumer, "c1", server("c1")+"/")})
		},
		// Exec mode names the credential: rotations change nothing.
		func() error { return e.sink.Deliver(ctx, []stream.Change{credential(stream.CredentialRotated, "c1")}) },
	}
	for i, step := range steps {
		if err := step(); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
	}
	if w := e.writes(); len(w) != 0 {
		t.Errorf("writes %v for unchanged content, want none", w)
	}

	// A real change is written once, and keeps Argo CD's annotation.
	moved := profile(stream.ProfileUpdated, consumer, "c1", "https://c1.moved.example:6443")
	for range 2 {
		if err := e.sink.Deliver(ctx, []stream.Change{moved}); err != nil {
			t.Fatal(err)
		}
	}
	if w := e.writes(); w["update"] != 1 || len(w) != 1 {
		t.Errorf("writes %v for one change delivered twice, want one update", w)
	}
	sec = e.get(t, "hubsync-prod-c1")
	if string(sec.Data["server"]) != "https://c1.moved.example:6443" || sec.Annotations[AnnotationRefresh] == "" {
		t.Errorf("after the move: server %q, annotations %v", sec.Data["server"], sec.Annotations)
	}
}

func TestExecRotationMakesNoCalls(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, nil)
	if err := e.sink.Resync(ctx, []stream.Change{profile(stream.ProfileUpdated, consumer, "c1", server("c1"))}); err != nil {
		t.Fatal(err)
	}
	e.kube.ClearActions()
	if err := e.sink.Deliver(ctx, []stream.Change{credential(stream.CredentialRotated, "c1"), credential(stream.CredentialSynced, "c2")}); err != nil {
		t.Fatal(err)
	}
	if a := e.kube.Actions(); len(a) != 0 {
		t.Errorf("credential changes in exec mode made %d calls, want none", len(a))
	}
}

func TestDuplicateServer(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, nil)
	shared := "https://shared.example:6443"
	// b comes first, then a claims the same server: a comes first by name
	// and takes it, as a resync would decide.
	if err := e.sink.Deliver(ctx, []stream.Change{profile(stream.ProfileCreated, consumer, "b", shared)}); err != nil {
		t.Fatal(err)
	}
	if err := e.sink.Deliver(ctx, []stream.Change{profile(stream.ProfileCreated, consumer, "a", shared+"/"), profile(stream.ProfileCreated, consumer, "c", server("c"))}); err != nil {
		t.Fatal(err)
	}
	if got, want := e.names(t), []string{"hubsync-prod-a", "hubsync-prod-c"}; !slices.Equal(got, want) {
		t.Fatalf("Secrets %v, want %v", got, want)
	}
	if c := e.conflicts(t); c != 1 {
		t.Errorf("conflicts %v, want 1", c)
	}
	if !strings.Contains(e.logs.String(), "cluster=b") {
		t.Errorf("the conflict of b is not logged:\n%s", e.logs)
	}
	snap := []stream.Change{
		profile(stream.ProfileUpdated, consumer, "c", server("c")),
		profile(stream.ProfileUpdated, consumer, "b", shared),
		profile(stream.ProfileUpdated, consumer, "a", shared),
	}
	e.kube.ClearActions()
	if err := e.sink.Resync(ctx, snap); err != nil {
		t.Fatal(err)
	}
	if w := e.writes(); len(w) != 0 {
		t.Errorf("resync wrote %v, want nothing", w)
	}
	// With a gone, b gets the server.
	if err := e.sink.Deliver(ctx, []stream.Change{{Type: stream.ProfileDeleted, Namespace: consumer, Cluster: "a"}}); err != nil {
		t.Fatal(err)
	}
	if got, want := e.names(t), []string{"hubsync-prod-b", "hubsync-prod-c"}; !slices.Equal(got, want) {
		t.Fatalf("Secrets %v, want %v", got, want)
	}
	if c := e.conflicts(t); c != 0 {
		t.Errorf("conflicts %v, want 0", c)
	}
}

func TestForeignSecretsNeverTouched(t *testing.T) {
	ctx := context.Background()
	old := metav1.NewTime(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
	clusterSecret := func(name, srv string, lbl map[string]string, created metav1.Time) *corev1.Secret {
		l := map[string]string{LabelSecretType: SecretTypeCluster}
		maps.Copy(l, lbl)
		return &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: argoNS, Name: name, Labels: l, UID: types.UID("uid-" + name), CreationTimestamp: created},
			Type:       corev1.SecretTypeOpaque,
			Data:       map[string][]byte{"name": []byte(name), "server": []byte(srv), "config": []byte("{}")},
		}
	}
	foreignServer := clusterSecret("by-hand", server("c1")+"/", nil, old)
	otherSink := clusterSecret("hubsync-staging-c2", server("c2"), map[string]string{LabelManagedBy: ManagedBy, LabelSink: "staging"}, old)
	nameTaken := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: argoNS, Name: "hubsync-prod-c3"},
		Data:       map[string][]byte{"mine": []byte("yes")},
	}
	unlabelled := clusterSecret("hubsync-prod-gone", server("gone"), map[string]string{LabelSink: sinkName}, old)
	foreign := []*corev1.Secret{foreignServer, otherSink, nameTaken, unlabelled}
	objs := []runtime.Object{}
	for _, s := range foreign {
		objs = append(objs, s)
	}
	e := newEnv(t, nil, objs...)
	snap := []stream.Change{
		profile(stream.ProfileUpdated, consumer, "c1", server("c1")),
		profile(stream.ProfileUpdated, consumer, "c2", server("c2")),
		profile(stream.ProfileUpdated, consumer, "c3", server("c3")),
		profile(stream.ProfileUpdated, consumer, "c4", server("c4")),
	}
	for range 2 {
		if err := e.sink.Resync(ctx, snap); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range foreign {
		got := e.get(t, f.Name)
		if !maps.EqualFunc(got.Data, f.Data, bytes.Equal) || !maps.Equal(got.Labels, f.Labels) {
			t.Errorf("foreign Secret %s changed: %v", f.Name, got)
		}
	}
	for _, a := range e.kube.Actions() {
		if a.GetVerb() == "update" || a.GetVerb() == "delete" {
			t.Errorf("unexpected %s of %v", a.GetVerb(), a)
		}
	}
	// c1's server is the hand-made Secret's, c2's the other sink's (a
	// foreign owner too), c3's name is taken: only c4 is written.
	want := []string{"by-hand", "hubsync-prod-c3", "hubsync-prod-c4", "hubsync-prod-gone", "hubsync-staging-c2"}
	if got := e.names(t); !slices.Equal(got, want) {
		t.Errorf("Secrets %v, want %v", got, want)
	}
	if c := e.conflicts(t); c != 3 {
		t.Errorf("conflicts %v, want 3", c)
	}
	if n := strings.Count(e.logs.String(), "Argo CD cluster conflict"); n != 3 {
		t.Errorf("%d conflict lines after two resyncs, want each conflict logged once:\n%s", n, e.logs)
	}
}

func TestOlderSecretKeepsServer(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, nil)
	if err := e.sink.Resync(ctx, []stream.Change{profile(stream.ProfileUpdated, consumer, "c1", server("c1"))}); err != nil {
		t.Fatal(err)
	}
	ours := e.get(t, "hubsync-prod-c1")
	ours.CreationTimestamp = metav1.NewTime(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
	if _, err := e.kube.CoreV1().Secrets(argoNS).Update(ctx, ours, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Someone adds a cluster Secret for the same server later: the sink's
	// Secret stays, and the newcomer is reported, not deleted.
	later := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: argoNS, Name: "later", Labels: map[string]string{LabelSecretType: SecretTypeCluster},
			CreationTimestamp: metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))},
		Data: map[string][]byte{"server": []byte(server("c1"))},
	}
	if _, err := e.kube.CoreV1().Secrets(argoNS).Create(ctx, later, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := e.sink.Resync(ctx, []stream.Change{profile(stream.ProfileUpdated, consumer, "c1", server("c1"))}); err != nil {
		t.Fatal(err)
	}
	if got, want := e.names(t), []string{"hubsync-prod-c1", "later"}; !slices.Equal(got, want) {
		t.Errorf("Secrets %v, want %v", got, want)
	}
	if c := e.conflicts(t); c != 1 {
		t.Errorf("conflicts %v, want 1", c)
	}
}

func TestResyncDeletesStale(t *testing.T) {
	ctx := context.Background()
	ours := func(name, cluster string) *corev1.Secret {
		return &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: argoNS, Name: name, UID: types.UID("uid-" + name),
				Labels: map[string]string{LabelSecretType: SecretTypeCluster, LabelManagedBy: ManagedBy, LabelSink: sinkName}},
			Data: map[string][]byte{"name": []byte(cluster), "server": []byte(server(cluster))},
		}
	}
	e := newEnv(t, nil,
		ours("hubsync-prod-gone", "gone"),
		ours("renamed-by-someone", "c1"),
		ours("hubsync-prod-c1", "c1"),
	)
	if err := e.sink.Resync(ctx, []stream.Change{profile(stream.ProfileUpdated, consumer, "c1", server("c1"))}); err != nil {
		t.Fatal(err)
	}
	if got, want := e.names(t), []string{"hubsync-prod-c1"}; !slices.Equal(got, want) {
		t.Errorf("Secrets %v, want %v", got, want)
	}
	deleted := map[string]string{}
	for _, a := range e.kube.Actions() {
		if d, ok := a.(k8stesting.DeleteActionImpl); ok {
			p := d.GetDeleteOptions().Preconditions
			if p == nil || p.UID == nil {
				t.Errorf("delete of %s without a UID precondition", d.GetName())
				continue
			}
			deleted[d.GetName()] = string(*p.UID)
		}
	}
	if want := map[string]string{"hubsync-prod-gone": "uid-hubsync-prod-gone", "renamed-by-someone": "uid-renamed-by-someone"}; !maps.Equal(deleted, want) {
		t.Errorf("deleted %v, want %v", deleted, want)
	}

	// profile.deleted deletes the Secret, with the same precondition.
	e.kube.ClearActions()
	if err := e.sink.Deliver(ctx, []stream.Change{{Type: stream.ProfileDeleted, Namespace: consumer, Cluster: "c1"}}); err != nil {
		t.Fatal(err)
	}
	if got := e.names(t); len(got) != 0 {
		t.Errorf("Secrets %v after profile.deleted, want none", got)
	}
	if w := e.writes(); w["delete"] != 1 {
		t.Errorf("writes %v, want one delete", w)
	}
}

func TestOtherNamespaceIgnored(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, nil)
	if err := e.sink.Deliver(ctx, []stream.Change{
		profile(stream.ProfileCreated, "team-b", "c1", server("c1")),
		{Type: stream.ProfileDeleted, Namespace: "team-b", Cluster: "c2"},
	}); err != nil {
		t.Fatal(err)
	}
	if a := e.kube.Actions(); len(a) != 0 {
		t.Errorf("changes of another namespace made calls: %v", a)
	}
	if err := e.sink.Resync(ctx, []stream.Change{
		profile(stream.ProfileUpdated, "team-b", "c1", server("c1")),
		profile(stream.ProfileUpdated, consumer, "c2", server("c2")),
	}); err != nil {
		t.Fatal(err)
	}
	if got, want := e.names(t), []string{"hubsync-prod-c2"}; !slices.Equal(got, want) {
		t.Errorf("Secrets %v, want %v", got, want)
	}
}

func TestLongClusterNames(t *testing.T) {
	ctx := context.Background()
	long := func(c string) string { return strings.Repeat("a", 200) + "." + strings.Repeat(c, 52) }
	c1, c2 := long("b"), long("c")
	for _, c := range []string{"short", strings.Repeat("x", 63), c1, c2, strings.Repeat("a", 240) + "-" + "z"} {
		n := SecretName(sinkName, c)
		if errs := validation.IsDNS1123Subdomain(n); len(errs) > 0 {
			t.Errorf("SecretName for a %d-character name: %q: %v", len(c), n, errs)
		}
		if n != SecretName(sinkName, c) {
			t.Errorf("SecretName is not deterministic")
		}
	}
	if SecretName(sinkName, c1) == SecretName(sinkName, c2) {
		t.Errorf("two long names share a Secret name")
	}

	e := newEnv(t, nil)
	if err := e.sink.Resync(ctx, []stream.Change{
		profile(stream.ProfileUpdated, consumer, c1, server("c1")),
		profile(stream.ProfileUpdated, consumer, c2, server("c2")),
	}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{c1, c2} {
		sec := e.get(t, SecretName(sinkName, c))
		if string(sec.Data["name"]) != c {
			t.Errorf("data name %q, want the full cluster name", sec.Data["name"])
		}
		v := sec.Labels[LabelClusterName]
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 || v != hub.ClusterNameLabelValue(c) {
			t.Errorf("cluster label %q: %v", v, errs)
		}
		args := decodeConfig(t, sec)["execProviderConfig"].(map[string]any)["args"].([]any)
		if !slices.Contains(args, any("--cluster="+c)) {
			t.Errorf("exec args %v do not name the full cluster", args)
		}
	}
	// A resync finds them again by name: nothing to write.
	e.kube.ClearActions()
	if err := e.sink.Resync(ctx, []stream.Change{
		profile(stream.ProfileUpdated, consumer, c1, server("c1")),
		profile(stream.ProfileUpdated, consumer, c2, server("c2")),
	}); err != nil {
		t.Fatal(err)
	}
	if w := e.writes(); len(w) != 0 {
		t.Errorf("second resync wrote %v", w)
	}
}

func TestNewRejects(t *testing.T) {
	deps := sinks.Deps{Kube: fake.NewClientset()}
	ok := config.ArgoCDSink{ConsumerNamespace: consumer, AccessProvider: provider, ManagedServiceAccount: msa}
	for name, mutate := range map[string]func(*config.Sink){
		"no section": func(s *config.Sink) { s.ArgoCD = nil },
		"no consumer namespace": func(s *config.Sink) {
			s.ArgoCD.ConsumerNamespace = ""
		},
		"bad auth":             func(s *config.Sink) { s.ArgoCD.Auth = "basic" },
		"no namespace":         func(s *config.Sink) { s.ArgoCD.Namespace = "" },
		"exec without command": func(s *config.Sink) { s.ArgoCD.Exec.Command = "" },
		"bad shard":            func(s *config.Sink) { s.ArgoCD.Shard = "one" },
		"no exec plugin":       func(s *config.Sink) { s.ArgoCD.ExecPlugin = "" },
		"cp-creds without cluster info": func(s *config.Sink) {
			s.ArgoCD.ExecPlugin = config.ExecPluginCPCreds
		},
	} {
		t.Run(name, func(t *testing.T) {
			a := ok
			s := config.Sink{Name: sinkName, Type: config.SinkArgoCD, ArgoCD: &a}
			s.SetDefaults()
			mutate(&s)
			if _, err := New(s, deps); err == nil {
				t.Error("New accepted it")
			}
		})
	}
}

func TestMetricsShared(t *testing.T) {
	reg := prometheus.NewRegistry()
	a := config.ArgoCDSink{ConsumerNamespace: consumer, AccessProvider: provider, ManagedServiceAccount: msa}
	var made []sinks.Sink
	for _, name := range []string{"one", "two"} {
		sc := config.Sink{Name: name, Type: config.SinkArgoCD, ArgoCD: &a}
		sc.SetDefaults()
		s, err := New(sc, sinks.Deps{Kube: fake.NewClientset(), Registerer: reg})
		if err != nil {
			t.Fatalf("New %s: %v", name, err)
		}
		made = append(made, s)
	}
	series := func(name string) int {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == name {
				return len(mf.GetMetric())
			}
		}
		return 0
	}
	if n, m := series("hubsync_argocd_conflicts"), series("hubsync_argocd_clusters_skipped"); n != 2 || m != 4 {
		t.Errorf("%d conflict and %d skip series, want one per sink and two per sink (one per reason)", n, m)
	}
	_ = made[0].Close()
	if n, m := series("hubsync_argocd_conflicts"), series("hubsync_argocd_clusters_skipped"); n != 1 || m != 2 {
		t.Errorf("%d conflict and %d skip series after Close, want 1 and 2", n, m)
	}
	_ = made[1].Close()
}

func TestRetriedBatchDecidesCompetitorsAgain(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, nil)
	shared := "https://shared.example:6443"
	if err := e.sink.Deliver(ctx, []stream.Change{
		profile(stream.ProfileCreated, consumer, "a", shared),
		profile(stream.ProfileCreated, consumer, "b", shared),
	}); err != nil {
		t.Fatal(err)
	}
	failed := false
	e.kube.PrependReactor("create", "secrets", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.(k8stesting.CreateAction).GetObject().(*corev1.Secret).Name == "hubsync-prod-b" && !failed {
			failed = true
			return true, nil, errors.New("API server unavailable")
		}
		return false, nil, nil
	})
	// a moves away and frees the server for b, whose create fails: the
	// batch comes again, and by then the state no longer shows that a
	// freed anything.
	batch := []stream.Change{profile(stream.ProfileUpdated, consumer, "a", server("a"))}
	if err := e.sink.Deliver(ctx, batch); err == nil {
		t.Fatal("Deliver hid the failed create")
	}
	if err := e.sink.Deliver(ctx, batch); err != nil {
		t.Fatal(err)
	}
	if got, want := e.names(t), []string{"hubsync-prod-a", "hubsync-prod-b"}; !slices.Equal(got, want) {
		t.Errorf("Secrets %v, want %v", got, want)
	}
	if c := e.conflicts(t); c != 0 {
		t.Errorf("conflicts %v, want 0", c)
	}
}

// A burst of deliveries lists Argo CD's namespace once, not twice a batch;
// the list is taken again once it is obsMaxAge old, so a foreign cluster
// Secret that appears meanwhile is still seen.
func TestDeliveriesReuseTheList(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, nil)
	now := time.Date(2026, 11, 23, 4, 0, 0, 0, time.UTC)
	e.sink.now = func() time.Time { return now }
	lists := func() int {
		n := 0
		for _, a := range e.kube.Actions() {
			if a.GetVerb() == "list" && a.GetResource().Resource == "secrets" {
				n++
			}
		}
		return n
	}
	for i := range 10 {
		c := fmt.Sprintf("c%d", i)
		if err := e.sink.Deliver(ctx, []stream.Change{profile(stream.ProfileCreated, consumer, c, server(c))}); err != nil {
			t.Fatal(err)
		}
	}
	if n := lists(); n != 2 {
		t.Errorf("%d lists for 10 deliveries, want the 2 of one observation", n)
	}
	if got := len(e.names(t)); got != 10 {
		t.Fatalf("%d Secrets, want 10", got)
	}
	// A foreign Secret claims c10's server before c10 arrives.
	foreign := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: argoNS, Name: "theirs", Labels: map[string]string{LabelSecretType: SecretTypeCluster}},
		Data:       map[string][]byte{"server": []byte(server("c10"))},
	}
	if _, err := e.kube.CoreV1().Secrets(argoNS).Create(ctx, foreign, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	now = now.Add(obsMaxAge)
	if err := e.sink.Deliver(ctx, []stream.Change{profile(stream.ProfileCreated, consumer, "c10", server("c10"))}); err != nil {
		t.Fatal(err)
	}
	if n := lists(); n < 4 {
		t.Errorf("%d lists, want a second observation once the first is %s old", n, obsMaxAge)
	}
	if slices.Contains(e.names(t), SecretName(sinkName, "c10")) || e.conflicts(t) != 1 {
		t.Errorf("a Secret for a server a foreign Secret has: %v (conflicts %v)", e.names(t), e.conflicts(t))
	}
}
