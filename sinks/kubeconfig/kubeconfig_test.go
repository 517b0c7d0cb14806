package kubeconfig

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/hub"
	"github.com/hubsync/hubsync/sinks"
	"github.com/hubsync/hubsync/stream"
)

const (
	testSink     = "files"
	testProvider = "open-cluster-management"
	testMSA      = "hubsync-reader"
	testServer   = "https://cluster1.example.com:6443"
	testNS       = "team-a"
	testCluster  = "eu.prod-1"
)

var testCA = []byte("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")

type fixture struct {
	sink *Sink
	dir  string
	kube *fake.Clientset
	logs *bytes.Buffer
}

func newFixture(t *testing.T, auth string, mutate ...func(*config.KubeconfigSink)) *fixture {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "kubeconfigs")
	kube := fake.NewClientset()
	logs := &bytes.Buffer{}
	k := &config.KubeconfigSink{
		Directory:             dir,
		AccessProvider:        testProvider,
		ManagedServiceAccount: testMSA,
		Auth:                  auth,
		Exec:                  config.ExecAuth{Command: "/usr/local/bin/hubsync", InstallHint: "install hubsync"},
	}
	for _, m := range mutate {
		m(k)
	}
	sc := config.Sink{Name: testSink, Type: config.SinkKubeconfig, Kubeconfig: k}
	sc.SetDefaults()
	s, err := New(sc, sinks.Deps{
		Kube: kube,
		Log:  slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return &fixture{sink: s.(*Sink), dir: dir, kube: kube, logs: logs}
}

func (f *fixture) path(ns, cluster string) string {
	return filepath.Join(f.dir, FileName(ns, cluster))
}

func (f *fixture) deliver(t *testing.T, changes ...stream.Change) {
	t.Helper()
	if err := f.sink.Deliver(context.Background(), changes); err != nil {
		t.Fatalf("Deliver: %v", err)
	}
}

func (f *fixture) setToken(t *testing.T, ns, cluster, token string) {
	t.Helper()
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: hub.CopyName(cluster, testMSA)},
		Type:       corev1.SecretTypeOpaque,
		Data:       map[string][]byte{hub.TokenKey: []byte(token)},
	}
	ctx := context.Background()
	secrets := f.kube.CoreV1().Secrets(ns)
	if _, err := secrets.Get(ctx, sec.Name, metav1.GetOptions{}); err == nil {
		if _, err := secrets.Update(ctx, sec, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("update secret: %v", err)
		}
		return
	}
	if _, err := secrets.Create(ctx, sec, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create secret: %v", err)
	}
}

func profile(typ, ns, cluster string, providers ...stream.AccessProviderSummary) stream.Change {
	return stream.Change{
		Type: typ, Namespace: ns, Cluster: cluster, Name: cluster,
		Profile: &stream.ProfileSummary{AccessProviders: providers},
	}
}

func provider(server string) stream.AccessProviderSummary {
	return stream.AccessProviderSummary{Name: testProvider, Server: server, CAData: testCA}
}

func credential(typ, ns, cluster, msa string) stream.Change {
	name := hub.CopyName(cluster, msa)
	return stream.Change{
		Type: typ, Namespace: ns, Cluster: cluster, Name: name,
		Credential: &stream.CredentialSummary{ManagedServiceAccount: msa, Secret: name},
	}
}

func load(t *testing.T, path string) *clientcmdapi.Config {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	cfg, err := clientcmd.Load(data)
	if err != nil {
		t.Fatalf("parse %s: %v", path, err)
	}
	return cfg
}

func exists(t *testing.T, path string) bool {
	t.Helper()
	_, err := os.Stat(path)
	switch {
	case err == nil:
		return true
	case errors.Is(err, fs.ErrNotExist):
		return false
	}
	t.Fatalf("stat %s: %v", path, err)
	return false
}

func stat(t *testing.T, path string) os.FileInfo {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatalf("stat %s: %v", path, err)
	}
	return fi
}

func TestExecContent(t *testing.T) {
	f := newFixture(t, config.AuthExec)
	f.deliver(t, profile(stream.ProfileCreated, testNS, testCluster,
		stream.AccessProviderSummary{Name: "other", Server: "https://wrong:6443"},
		provider(testServer)))

	cfg := load(t, f.path(testNS, testCluster))
	if cfg.CurrentContext != testCluster {
		t.Errorf("current-context = %q, want %q", cfg.CurrentContext, testCluster)
	}
	ctx := cfg.Contexts[cfg.CurrentContext]
	if ctx == nil || ctx.Cluster != testCluster {
		t.Fatalf("context %q = %+v, want cluster %q", cfg.CurrentContext, ctx, testCluster)
	}
	if len(cfg.Clusters) != 1 || len(cfg.Contexts) != 1 || len(cfg.AuthInfos) != 1 {
		t.Errorf("want one cluster, context and user, got %d, %d, %d", len(cfg.Clusters), len(cfg.Contexts), len(cfg.AuthInfos))
	}
	cl := cfg.Clusters[testCluster]
	if cl == nil {
		t.Fatalf("no cluster %q", testCluster)
	}
	if cl.Server != testServer {
		t.Errorf("server = %q, want %q", cl.Server, testServer)
	}
	if !bytes.Equal(cl.CertificateAuthorityData, testCA) {
		t.Errorf("certificate-authority-data = %q, want %q", cl.CertificateAuthorityData, testCA)
	}
	ext, ok := cl.Extensions[hub.ExecExtensionKey].(*runtime.Unknown)
	if !ok {
		t.Fatalf("cluster extension %s = %#v", hub.ExecExtensionKey, cl.Extensions[hub.ExecExtensionKey])
	}
	if got, want := string(ext.Raw), `{"clusterName":"`+testCluster+`"}`; got != want {
		t.Errorf("cluster extension = %s, want %s", got, want)
	}
	user := cfg.AuthInfos[ctx.AuthInfo]
	if user == nil || user.Exec == nil {
		t.Fatalf("user %q = %+v, want an exec user", ctx.AuthInfo, user)
	}
	if user.Token != "" {
		t.Errorf("exec-mode file holds a token")
	}
	e := user.Exec
	if e.APIVersion != "client.authentication.k8s.io/v1" {
		t.Errorf("exec apiVersion = %q", e.APIVersion)
	}
	if e.Command != "/usr/local/bin/hubsync" {
		t.Errorf("exec command = %q", e.Command)
	}
	wantArgs := []string{"creds", "--managed-serviceaccount=" + testMSA, "--cluster=" + testCluster, "--namespace=" + testNS}
	if !slices.Equal(e.Args, wantArgs) {
		t.Errorf("exec args = %q, want %q", e.Args, wantArgs)
	}
	if !e.ProvideClusterInfo {
		t.Error("exec provideClusterInfo = false")
	}
	if e.InteractiveMode != clientcmdapi.NeverExecInteractiveMode {
		t.Errorf("exec interactiveMode = %q, want Never", e.InteractiveMode)
	}
	if e.InstallHint != "install hubsync" {
		t.Errorf("exec installHint = %q", e.InstallHint)
	}
	data, _ := os.ReadFile(f.path(testNS, testCluster))
	if sink, ok := markerOf(data); !ok || sink != testSink {
		t.Errorf("marker = %q, %v; want %q", sink, ok, testSink)
	}
}

func TestExecDefaultCommand(t *testing.T) {
	f := newFixture(t, "", func(k *config.KubeconfigSink) { k.Exec = config.ExecAuth{} })
	f.deliver(t, profile(stream.ProfileCreated, testNS, testCluster, provider(testServer)))
	cfg := load(t, f.path(testNS, testCluster))
	for _, u := range cfg.AuthInfos {
		if u.Exec == nil || u.Exec.Command != "hubsync" || u.Exec.InstallHint != "" {
			t.Errorf("exec = %+v, want command hubsync and no install hint", u.Exec)
		}
	}
}

// TestClientGoExecConfig checks the file the way client-go reads it: the
// rest.Config must run the plugin with the cluster's extension as its
// cluster config.
func TestClientGoExecConfig(t *testing.T) {
	f := newFixture(t, config.AuthExec)
	f.deliver(t, profile(stream.ProfileCreated, testNS, testCluster, provider(testServer)))
	path := f.path(testNS, testCluster)

	rc, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatalf("BuildConfigFromFlags: %v", err)
	}
	if rc.Host != testServer {
		t.Errorf("host = %q, want %q", rc.Host, testServer)
	}
	if !bytes.Equal(rc.CAData, testCA) {
		t.Errorf("CA data = %q", rc.CAData)
	}
	if rc.BearerToken != "" {
		t.Error("exec-mode rest.Config has a bearer token")
	}
	ep := rc.ExecProvider
	if ep == nil {
		t.Fatal("no exec provider")
	}
	wantArgs := sinks.CredsArgs(testMSA, testCluster, testNS)
	if !slices.Equal(ep.Args, wantArgs) {
		t.Errorf("exec args = %q, want %q", ep.Args, wantArgs)
	}
	if !ep.ProvideClusterInfo {
		t.Error("provideClusterInfo = false")
	}
	if ep.InteractiveMode != clientcmdapi.NeverExecInteractiveMode {
		t.Errorf("interactiveMode = %q", ep.InteractiveMode)
	}
	want := &runtime.Unknown{Raw: []byte(`{"clusterName":"` + testCluster + `"}`), ContentType: runtime.ContentTypeJSON}
	got, ok := ep.Config.(*runtime.Unknown)
	if !ok || !bytes.Equal(got.Raw, want.Raw) || got.ContentType != want.ContentType {
		t.Errorf("exec provider config = %#v, want %#v", ep.Config, want)
	}

	// The same through a non-interactive client config of the loaded file.
	cfg := load(t, path)
	rc2, err := clientcmd.NewNonInteractiveClientConfig(*cfg, cfg.CurrentContext, &clientcmd.ConfigOverrides{}, nil).ClientConfig()
	if err != nil {
		t.Fatalf("ClientConfig: %v", err)
	}
	if rc2.ExecProvider == nil || rc2.ExecProvider.Config == nil {
		t.Fatalf("non-interactive client config has no exec cluster config: %+v", rc2.ExecProvider)
	}
	if got, ok := rc2.ExecProvider.Config.(*runtime.Unknown); !ok || !bytes.Equal(got.Raw, want.Raw) {
		t.Errorf("exec provider config = %#v, want %#v", rc2.ExecProvider.Config, want)
	}
}

func TestExecIgnoresCredentialChanges(t *testing.T) {
	f := newFixture(t, config.AuthExec)
	f.deliver(t, profile(stream.ProfileCreated, testNS, testCluster, provider(testServer)))
	path := f.path(testNS, testCluster)
	before := stat(t, path)
	for _, typ := range []string{stream.CredentialSynced, stream.CredentialRotated, stream.CredentialRemoved} {
		f.deliver(t, credential(typ, testNS, testCluster, testMSA))
		if !exists(t, path) {
			t.Fatalf("%s removed the exec-mode file", typ)
		}
		if after := stat(t, path); !os.SameFile(before, after) {
			t.Errorf("%s rewrote the exec-mode file", typ)
		}
	}
}

func TestTokenMode(t *testing.T) {
	f := newFixture(t, config.AuthToken)
	path := f.path(testNS, testCluster)
	token := func() string {
		t.Helper()
		cfg := load(t, path)
		u := cfg.AuthInfos[cfg.Contexts[cfg.CurrentContext].AuthInfo]
		if u == nil {
			t.Fatal("no user")
		}
		if u.Exec != nil {
			t.Error("token-mode file has an exec user")
		}
		return u.Token
	}

	// The profile comes before its copy: no token, no file, no error.
	f.deliver(t, profile(stream.ProfileCreated, testNS, testCluster, provider(testServer)))
	if exists(t, path) {
		t.Fatal("token-mode file written without a token")
	}

	// The copy arrives.
	f.setToken(t, testNS, testCluster, "token-1")
	f.deliver(t, credential(stream.CredentialSynced, testNS, testCluster, testMSA))
	if got := token(); got != "token-1" {
		t.Errorf("token = %q, want token-1", got)
	}
	cfg := load(t, path)
	if cl := cfg.Clusters[testCluster]; cl == nil || cl.Server != testServer {
		t.Errorf("cluster = %+v, want server %s from the profile", cl, testServer)
	}
	if fi := stat(t, path); fi.Mode().Perm() != 0o600 {
		t.Errorf("token-mode file mode = %v, want 0600", fi.Mode().Perm())
	}

	// A credential change of another ManagedServiceAccount changes nothing.
	f.setToken(t, testNS, testCluster, "token-2")
	f.deliver(t, credential(stream.CredentialRotated, testNS, testCluster, "someone-else"))
	if got := token(); got != "token-1" {
		t.Errorf("another MSA's rotation changed the token to %q", got)
	}

	// Rotation rewrites the file with the new token.
	f.deliver(t, credential(stream.CredentialRotated, testNS, testCluster, testMSA))
	if got := token(); got != "token-2" {
		t.Errorf("token after rotation = %q, want token-2", got)
	}

	// A server change keeps the token.
	f.deliver(t, profile(stream.AccessProviderUpdated, testNS, testCluster, provider("https://moved:6443")))
	if cl := load(t, path).Clusters[testCluster]; cl.Server != "https://moved:6443" {
		t.Errorf("server = %q after accessprovider.updated", cl.Server)
	}
	if got := token(); got != "token-2" {
		t.Errorf("token = %q after accessprovider.updated, want token-2", got)
	}

	// The copy goes: so does the file.
	f.deliver(t, credential(stream.CredentialRemoved, testNS, testCluster, testMSA))
	if exists(t, path) {
		t.Error("credential.removed left the token-mode file")
	}

	// It comes back, from the last known profile.
	f.deliver(t, credential(stream.CredentialSynced, testNS, testCluster, testMSA))
	if got := token(); got != "token-2" {
		t.Errorf("token = %q after the copy came back", got)
	}

	// The Secret disappears but a rotation is delivered: the file goes.
	if err := f.kube.CoreV1().Secrets(testNS).Delete(context.Background(), hub.CopyName(testCluster, testMSA), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	f.deliver(t, credential(stream.CredentialRotated, testNS, testCluster, testMSA))
	if exists(t, path) {
		t.Error("a token-mode file without a token in the hub was kept")
	}
	if strings.Contains(f.logs.String(), "token-1") || strings.Contains(f.logs.String(), "token-2") {
		t.Error("a token reached the log")
	}
}

func TestTokenModeHubError(t *testing.T) {
	f := newFixture(t, config.AuthToken)
	f.setToken(t, testNS, "ok", "secret-ok")
	f.setToken(t, testNS, "broken", "secret-broken")
	f.kube.PrependReactor("get", "secrets", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.(k8stesting.GetAction).GetName() == hub.CopyName("broken", testMSA) {
			return true, nil, errors.New("hub unavailable")
		}
		return false, nil, nil
	})
	err := f.sink.Deliver(context.Background(), []stream.Change{
		profile(stream.ProfileCreated, testNS, "broken", provider(testServer)),
		profile(stream.ProfileCreated, testNS, "ok", provider(testServer)),
	})
	if err == nil {
		t.Fatal("Deliver succeeded although the hub failed")
	}
	if !strings.Contains(err.Error(), "hub unavailable") || !strings.Contains(err.Error(), "broken") {
		t.Errorf("error %q does not say what failed", err)
	}
	if strings.Contains(err.Error(), "secret-") {
		t.Errorf("error %q holds a token", err)
	}
	if !exists(t, f.path(testNS, "ok")) {
		t.Error("the change after the failed one was not applied")
	}
	if exists(t, f.path(testNS, "broken")) {
		t.Error("a file was written although its token could not be read")
	}
}

func TestModes(t *testing.T) {
	f := newFixture(t, config.AuthExec)
	// An existing directory with a looser mode is tightened.
	if err := os.MkdirAll(f.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(f.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	f.deliver(t, profile(stream.ProfileCreated, testNS, testCluster, provider(testServer)))
	if fi := stat(t, f.dir); fi.Mode().Perm() != 0o700 {
		t.Errorf("directory mode = %v, want 0700", fi.Mode().Perm())
	}
	path := f.path(testNS, testCluster)
	if fi := stat(t, path); fi.Mode().Perm() != 0o600 {
		t.Errorf("file mode = %v, want 0600", fi.Mode().Perm())
	}
	// A file someone loosened is tightened again, even when its content
	// is current.
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	f.deliver(t, profile(stream.ProfileUpdated, testNS, testCluster, provider(testServer)))
	if fi := stat(t, path); fi.Mode().Perm() != 0o600 {
		t.Errorf("file mode after a redelivery = %v, want 0600", fi.Mode().Perm())
	}
}

func TestUnchangedNotRewritten(t *testing.T) {
	f := newFixture(t, config.AuthExec)
	c := profile(stream.ProfileCreated, testNS, testCluster, provider(testServer))
	f.deliver(t, c)
	path := f.path(testNS, testCluster)
	first := stat(t, path)

	// The same change again, and an update that changes nothing the file
	// holds (a label), leave the same file in place: no rename wakes a
	// watcher.
	f.deliver(t, c)
	upd := profile(stream.ProfileUpdated, testNS, testCluster, provider(testServer))
	upd.Profile.Labels = map[string]string{"env": "prod"}
	f.deliver(t, upd)
	if err := f.sink.Resync(context.Background(), []stream.Change{upd}); err != nil {
		t.Fatalf("Resync: %v", err)
	}
	if !os.SameFile(first, stat(t, path)) {
		t.Error("a file whose content did not change was rewritten")
	}
	if !strings.Contains(f.logs.String(), "unchanged=1") {
		t.Errorf("the resync summary does not count the unchanged file:\n%s", f.logs.String())
	}

	// A change that does change the content replaces the file.
	f.deliver(t, profile(stream.ProfileUpdated, testNS, testCluster, provider("https://new:6443")))
	if os.SameFile(first, stat(t, path)) {
		t.Error("a changed file was not replaced")
	}
	entries, err := os.ReadDir(f.dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 {
		t.Errorf("directory holds %d entries, want only the kubeconfig", len(entries))
	}
}

func TestProfileLifecycle(t *testing.T) {
	tests := []struct {
		name    string
		changes []stream.Change
		want    bool
	}{
		{
			name:    "created",
			changes: []stream.Change{profile(stream.ProfileCreated, testNS, testCluster, provider(testServer))},
			want:    true,
		},
		{
			name: "deleted",
			changes: []stream.Change{
				profile(stream.ProfileCreated, testNS, testCluster, provider(testServer)),
				profile(stream.ProfileDeleted, testNS, testCluster, provider(testServer)),
			},
		},
		{
			name:    "provider missing",
			changes: []stream.Change{profile(stream.ProfileCreated, testNS, testCluster, stream.AccessProviderSummary{Name: "other", Server: testServer})},
		},
		{
			name:    "no providers yet",
			changes: []stream.Change{profile(stream.ProfileCreated, testNS, testCluster)},
		},
		{
			name: "provider appears",
			changes: []stream.Change{
				profile(stream.ProfileCreated, testNS, testCluster),
				profile(stream.AccessProviderUpdated, testNS, testCluster, provider(testServer)),
			},
			want: true,
		},
		{
			name: "provider disappears",
			changes: []stream.Change{
				profile(stream.ProfileCreated, testNS, testCluster, provider(testServer)),
				profile(stream.AccessProviderUpdated, testNS, testCluster),
			},
		},
		{
			name: "deleted twice",
			changes: []stream.Change{
				profile(stream.ProfileCreated, testNS, testCluster, provider(testServer)),
				profile(stream.ProfileDeleted, testNS, testCluster),
				profile(stream.ProfileDeleted, testNS, testCluster),
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, config.AuthExec)
			// One change per Deliver: a batch holds distinct keys.
			for _, c := range tt.changes {
				f.deliver(t, c)
			}
			if got := exists(t, f.path(testNS, testCluster)); got != tt.want {
				t.Errorf("file exists = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestDeleteLeavesForeignFile(t *testing.T) {
	f := newFixture(t, config.AuthExec)
	if err := sinks.EnsureDir(f.dir); err != nil {
		t.Fatal(err)
	}
	path := f.path(testNS, testCluster)
	foreign := []byte("apiVersion: v1\nkind: Config\nclusters: []\n")
	if err := os.WriteFile(path, foreign, 0o600); err != nil {
		t.Fatal(err)
	}
	// Neither a write nor a delete touches a file hubsync did not write.
	f.deliver(t, profile(stream.ProfileCreated, testNS, testCluster, provider(testServer)))
	f.deliver(t, profile(stream.ProfileDeleted, testNS, testCluster))
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("foreign file: %v", err)
	}
	if !bytes.Equal(got, foreign) {
		t.Error("foreign file changed")
	}
}

func TestInvalidNamesIgnored(t *testing.T) {
	f := newFixture(t, config.AuthExec)
	f.deliver(t,
		profile(stream.ProfileCreated, testNS, "../escape", provider(testServer)),
		profile(stream.ProfileCreated, testNS, "good", provider(testServer)),
	)
	entries, err := os.ReadDir(filepath.Dir(f.dir))
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 {
		t.Errorf("a file was written next to the directory: %v", entries)
	}
	if !exists(t, f.path(testNS, "good")) {
		t.Error("the valid change was not applied")
	}
}

func TestLongNamesWritten(t *testing.T) {
	f := newFixture(t, config.AuthExec)
	ns := strings.Repeat("n", 63)
	cluster := strings.Repeat("c", 100) + "." + strings.Repeat("d", 152)
	f.deliver(t, profile(stream.ProfileCreated, ns, cluster, provider(testServer)))
	if !exists(t, f.path(ns, cluster)) {
		t.Fatal("no file for the longest names")
	}
	if cfg := load(t, f.path(ns, cluster)); cfg.CurrentContext != cluster {
		t.Errorf("current-context = %q", cfg.CurrentContext)
	}
	// Resync keeps it: its truncated name is one of the sink's.
	if err := f.sink.Resync(context.Background(), []stream.Change{profile(stream.ProfileUpdated, ns, cluster, provider(testServer))}); err != nil {
		t.Fatal(err)
	}
	if !exists(t, f.path(ns, cluster)) {
		t.Error("resync removed the file of a long name")
	}
	if err := f.sink.Resync(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	if exists(t, f.path(ns, cluster)) {
		t.Error("resync kept the stale file of a long name")
	}
}

func TestResync(t *testing.T) {
	f := newFixture(t, config.AuthExec)
	ctx := context.Background()

	// Files this sink wrote earlier: one still wanted, one stale.
	f.deliver(t,
		profile(stream.ProfileCreated, testNS, "kept", provider("https://old:6443")),
		profile(stream.ProfileCreated, testNS, "stale", provider(testServer)),
	)

	// A kubeconfig of another sink, with a name of the scheme.
	other := newFixture(t, config.AuthExec)
	other.sink.name = "another-sink"
	other.sink.dir = f.dir
	other.deliver(t, profile(stream.ProfileCreated, testNS, "others", provider(testServer)))

	write := func(name, content string, age time.Duration) {
		t.Helper()
		p := filepath.Join(f.dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if age > 0 {
			old := time.Now().Add(-age)
			if err := os.Chtimes(p, old, old); err != nil {
				t.Fatal(err)
			}
		}
	}
	kubeconfigNoMarker := "apiVersion: v1\nkind: Config\nclusters:\n- name: x\n  cluster:\n    server: https://x\n"
	write(FileName(testNS, "foreign"), kubeconfigNoMarker, 0)
	write(FileName(testNS, "garbage"), "not: [a kubeconfig", 0)
	write("notes.txt", "hello", 0)
	write("admin.kubeconfig", kubeconfigNoMarker, 0)
	write("."+FileName(testNS, "x")+".tmp-12345", "partial", time.Hour)
	write("."+FileName(testNS, "y")+".tmp-67890", "partial", 0)
	write(".other.tmp-1", "someone else's", time.Hour)

	snapshot := []stream.Change{
		profile(stream.ProfileUpdated, testNS, "kept", provider(testServer)),
		profile(stream.ProfileUpdated, testNS, "new", provider(testServer)),
		profile(stream.ProfileUpdated, testNS, "no-provider"),
		credential(stream.CredentialSynced, testNS, "kept", testMSA),
	}
	if err := f.sink.Resync(ctx, snapshot); err != nil {
		t.Fatalf("Resync: %v", err)
	}

	want := []string{
		"." + FileName(testNS, "y") + ".tmp-67890", // ours but young
		".other.tmp-1",
		"admin.kubeconfig",
		FileName(testNS, "foreign"),
		FileName(testNS, "garbage"),
		FileName(testNS, "kept"),
		FileName(testNS, "new"),
		FileName(testNS, "others"),
		"notes.txt",
	}
	var got []string
	entries, err := os.ReadDir(f.dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		got = append(got, e.Name())
	}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("directory after resync:\n got %q\nwant %q", got, want)
	}
	if cl := load(t, f.path(testNS, "kept")).Clusters["kept"]; cl.Server != testServer {
		t.Errorf("resync did not update a wanted file: server %q", cl.Server)
	}
	logs := f.logs.String()
	for _, s := range []string{"kubeconfig sink resynced", "written=2", "removed=1", "unchanged=0"} {
		if !strings.Contains(logs, s) {
			t.Errorf("resync summary lacks %q:\n%s", s, logs)
		}
	}

	// The snapshot replaced the state: a later change for "stale" is a
	// fresh start, and an empty snapshot removes every file of the sink.
	if err := f.sink.Resync(ctx, []stream.Change{}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"kept", "new"} {
		if exists(t, f.path(testNS, c)) {
			t.Errorf("empty snapshot kept %s", c)
		}
	}
	if !exists(t, f.path(testNS, "others")) {
		t.Error("resync removed another sink's file")
	}
}

func TestResyncTokenMode(t *testing.T) {
	f := newFixture(t, config.AuthToken)
	ctx := context.Background()
	f.setToken(t, testNS, "with-copy", "tok-a")
	f.setToken(t, testNS, "copy-not-in-snapshot", "tok-b")
	f.setToken(t, testNS, "dropped", "tok-c")
	f.deliver(t, profile(stream.ProfileCreated, testNS, "dropped", provider(testServer)))
	if !exists(t, f.path(testNS, "dropped")) {
		t.Fatal("setup: no file for dropped")
	}

	snapshot := []stream.Change{
		profile(stream.ProfileUpdated, testNS, "with-copy", provider(testServer)),
		credential(stream.CredentialSynced, testNS, "with-copy", testMSA),
		profile(stream.ProfileUpdated, testNS, "copy-not-in-snapshot", provider(testServer)),
		profile(stream.ProfileUpdated, testNS, "other-msa", provider(testServer)),
		credential(stream.CredentialSynced, testNS, "other-msa", "someone-else"),
		profile(stream.ProfileUpdated, testNS, "copy-without-token", provider(testServer)),
		credential(stream.CredentialSynced, testNS, "copy-without-token", testMSA),
	}
	if err := f.sink.Resync(ctx, snapshot); err != nil {
		t.Fatalf("Resync: %v", err)
	}
	for cluster, want := range map[string]bool{
		"with-copy": true, "copy-not-in-snapshot": false, "other-msa": false,
		"copy-without-token": false, "dropped": false,
	} {
		if got := exists(t, f.path(testNS, cluster)); got != want {
			t.Errorf("%s: file exists = %v, want %v", cluster, got, want)
		}
	}
	cfg := load(t, f.path(testNS, "with-copy"))
	if u := cfg.AuthInfos[cfg.Contexts[cfg.CurrentContext].AuthInfo]; u == nil || u.Token != "tok-a" {
		t.Errorf("with-copy user = %+v, want token tok-a", u)
	}

	// The state now knows "copy-not-in-snapshot" from the snapshot, so its
	// copy's arrival writes the file; "dropped" is gone from the state, so
	// a rotation of its copy writes nothing.
	f.deliver(t,
		credential(stream.CredentialSynced, testNS, "copy-not-in-snapshot", testMSA),
		credential(stream.CredentialRotated, testNS, "dropped", testMSA),
	)
	if !exists(t, f.path(testNS, "copy-not-in-snapshot")) {
		t.Error("credential.synced after a resync did not write the file")
	}
	if exists(t, f.path(testNS, "dropped")) {
		t.Error("a rotation wrote the file of a profile the snapshot dropped")
	}
}

func TestResyncKeepsFilesOnHubError(t *testing.T) {
	f := newFixture(t, config.AuthToken)
	f.setToken(t, testNS, testCluster, "tok")
	f.deliver(t, profile(stream.ProfileCreated, testNS, testCluster, provider(testServer)))
	f.kube.PrependReactor("get", "secrets", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("hub unavailable")
	})
	err := f.sink.Resync(context.Background(), []stream.Change{
		profile(stream.ProfileUpdated, testNS, testCluster, provider(testServer)),
		credential(stream.CredentialSynced, testNS, testCluster, testMSA),
	})
	if err == nil {
		t.Fatal("Resync succeeded although the hub failed")
	}
	if !exists(t, f.path(testNS, testCluster)) {
		t.Error("Resync removed a file it could not refresh")
	}
}

func TestNew(t *testing.T) {
	good := func() config.Sink {
		s := config.Sink{Name: "s", Type: config.SinkKubeconfig, Kubeconfig: &config.KubeconfigSink{
			Directory: "/var/lib/kc", AccessProvider: testProvider, ManagedServiceAccount: testMSA,
		}}
		s.SetDefaults()
		return s
	}
	tests := []struct {
		name   string
		mutate func(*config.Sink)
		deps   sinks.Deps
		ok     bool
	}{
		{name: "defaults", mutate: func(*config.Sink) {}, ok: true},
		{name: "no section", mutate: func(c *config.Sink) { c.Kubeconfig = nil }},
		{name: "relative directory", mutate: func(c *config.Sink) { c.Kubeconfig.Directory = "kc" }},
		{name: "no provider", mutate: func(c *config.Sink) { c.Kubeconfig.AccessProvider = "" }},
		{name: "no msa", mutate: func(c *config.Sink) { c.Kubeconfig.ManagedServiceAccount = "" }},
		{name: "undefaulted auth", mutate: func(c *config.Sink) { c.Kubeconfig.Auth = "" }},
		{name: "exec without command", mutate: func(c *config.Sink) { c.Kubeconfig.Exec.Command = "" }},
		{name: "unknown auth", mutate: func(c *config.Sink) { c.Kubeconfig.Auth = "password" }},
		{name: "token without client", mutate: func(c *config.Sink) { c.Kubeconfig.Auth = config.AuthToken }},
		{name: "token", mutate: func(c *config.Sink) { c.Kubeconfig.Auth = config.AuthToken }, deps: sinks.Deps{Kube: fake.NewClientset()}, ok: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := good()
			tt.mutate(&c)
			s, err := New(c, tt.deps)
			if (err == nil) != tt.ok {
				t.Fatalf("New: %v, want ok %v", err, tt.ok)
			}
			if s != nil {
				if err := s.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
			}
		})
	}
}

// TestTakesOverRenamedSinkFile: a file of another hubsync sink under a
// name this sink needs (a sink renamed in place) is overwritten, so the
// renamed sink does not stall; it is never removed unless it becomes ours.
func TestTakesOverRenamedSinkFile(t *testing.T) {
	old := newFixture(t, config.AuthExec)
	old.sink.name = "old-name"
	old.deliver(t, profile(stream.ProfileCreated, testNS, testCluster, provider(testServer)))

	f := newFixture(t, config.AuthExec)
	f.sink.dir, f.dir = old.dir, old.dir
	path := f.path(testNS, testCluster)
	f.deliver(t, profile(stream.ProfileCreated, testNS, testCluster, provider(testServer)))
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if sink, ok := markerOf(data); !ok || sink != testSink {
		t.Errorf("marker = %q, %v after the takeover; want %q", sink, ok, testSink)
	}
	f.deliver(t, profile(stream.ProfileDeleted, testNS, testCluster))
	if exists(t, path) {
		t.Error("the file taken over was not removed with its profile")
	}
}
