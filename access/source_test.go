package access

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	clientcmdv1 "k8s.io/client-go/tools/clientcmd/api/v1"
	cpv1alpha1 "sigs.k8s.io/cluster-inventory-api/apis/v1alpha1"
	cpfake "sigs.k8s.io/cluster-inventory-api/client/clientset/versioned/fake"

	"github.com/hubsync/hubsync/hub"
	"github.com/hubsync/hubsync/test/testutil"
)

const (
	testNS      = "team-ml"
	testCluster = "c1"
	testMSA     = "app"
)

func profile(providers ...cpv1alpha1.AccessProvider) *cpv1alpha1.ClusterProfile {
	return &cpv1alpha1.ClusterProfile{
		ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: testCluster},
		Status:     cpv1alpha1.ClusterProfileStatus{AccessProviders: providers},
	}
}

func provider(name, server string) cpv1alpha1.AccessProvider {
	return cpv1alpha1.AccessProvider{Name: name, Cluster: clientcmdv1.Cluster{Server: server, CertificateAuthorityData: []byte("CA-" + name)}}
}

func TestProviderConfig(t *testing.T) {
	withProxy := provider(DefaultProvider, "https://proxy.example:9092/c1")
	withProxy.Cluster.ProxyURL = "http://squid.example:3128"
	withProxy.Cluster.TLSServerName = "c1.internal"
	withFile := provider(DefaultProvider, "https://c1.example")
	withFile.Cluster.CertificateAuthorityData = nil
	withFile.Cluster.CertificateAuthority = "/etc/ca.pem"
	deprecated := profile()
	deprecated.Status.CredentialProviders = []cpv1alpha1.AccessProvider{provider(DefaultProvider, "https://old.example")}
	both := profile(provider(DefaultProvider, "https://new.example"))
	both.Status.CredentialProviders = []cpv1alpha1.AccessProvider{provider(DefaultProvider, "https://old.example")}
	tests := []struct {
		name       string
		profile    *cpv1alpha1.ClusterProfile
		provider   string
		wantHost   string
		wantCA     string
		wantCAFile string
		wantServer string
		wantProxy  bool
		wantErr    string
	}{
		{name: "the named provider among others", profile: profile(provider("direct", "https://c1.example"), provider(DefaultProvider, "https://proxy.example:9092/c1")),
			provider: DefaultProvider, wantHost: "https://proxy.example:9092/c1", wantCA: "CA-" + DefaultProvider},
		{name: "another provider by name", profile: profile(provider("direct", "https://c1.example"), provider(DefaultProvider, "https://proxy.example:9092/c1")),
			provider: "direct", wantHost: "https://c1.example", wantCA: "CA-direct"},
		{name: "proxy and TLS server name", profile: profile(withProxy), provider: DefaultProvider,
			wantHost: "https://proxy.example:9092/c1", wantCA: "CA-" + DefaultProvider, wantServer: "c1.internal", wantProxy: true},
		{name: "CA file only without CA data", profile: profile(withFile), provider: DefaultProvider, wantHost: "https://c1.example", wantCAFile: "/etc/ca.pem"},
		{name: "deprecated credentialProviders", profile: deprecated, provider: DefaultProvider, wantHost: "https://old.example", wantCA: "CA-" + DefaultProvider},
		{name: "accessProviders win over credentialProviders", profile: both, provider: DefaultProvider, wantHost: "https://new.example", wantCA: "CA-" + DefaultProvider},
		{name: "no such provider", profile: profile(provider("direct", "https://c1.example")), provider: DefaultProvider, wantErr: `no access provider "open-cluster-management"`},
		{name: "provider without a server", profile: profile(provider(DefaultProvider, " ")), provider: DefaultProvider, wantErr: "has no server"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := providerConfig(tc.profile, tc.provider)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Host != tc.wantHost || string(cfg.CAData) != tc.wantCA || cfg.CAFile != tc.wantCAFile || cfg.ServerName != tc.wantServer {
				t.Errorf("config host %q CA %q CA file %q server name %q", cfg.Host, cfg.CAData, cfg.CAFile, cfg.ServerName)
			}
			if (cfg.Proxy != nil) != tc.wantProxy {
				t.Errorf("proxy set: %v, want %v (a Proxy func defeats client-go's transport cache)", cfg.Proxy != nil, tc.wantProxy)
			}
			if cfg.BearerToken != "" || cfg.ExecProvider != nil || cfg.WrapTransport != nil {
				t.Errorf("the provider's config carries a credential")
			}
		})
	}
}

func TestOptionsCheck(t *testing.T) {
	tests := []struct {
		name string
		o    Options
		want string
	}{
		{name: "valid", o: Options{Namespace: testNS, ManagedServiceAccount: testMSA}},
		{name: "no namespace", o: Options{ManagedServiceAccount: testMSA}, want: "Namespace"},
		{name: "bad namespace", o: Options{Namespace: "Team_ML", ManagedServiceAccount: testMSA}, want: "Namespace"},
		{name: "no managed service account", o: Options{Namespace: testNS}, want: "ManagedServiceAccount"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewForClients(Clients{Kube: fake.NewClientset()}, tc.o)
			if (err != nil) != (tc.want != "") || (err != nil && !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("err = %v, want one naming %q", err, tc.want)
			}
		})
	}
}

// copySecret is the credential copy of testCluster holding token.
func copySecret(token string, annotations map[string]string) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: testNS, Name: hub.CopyName(testCluster, testMSA), Annotations: annotations,
			Labels: map[string]string{hub.LabelSyncedFrom: hub.SyncedFromValue(testCluster, testMSA)},
		},
		Data: map[string][]byte{hub.TokenKey: []byte(token), hub.CAKey: []byte("CA")},
	}
}

// logBuffer is a log the test reads while the Source writes it.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func newTestSource(t *testing.T, kube *fake.Clientset) (*Source, *logBuffer) {
	t.Helper()
	logs := &logBuffer{}
	s, err := NewForClients(Clients{Kube: kube, Profiles: cpfake.NewSimpleClientset(profile(provider(DefaultProvider, "https://c1.example")))},
		Options{Namespace: testNS, ManagedServiceAccount: testMSA, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	return s, logs
}

// send makes one request through cfg's transport to the fake cluster.
func send(t *testing.T, rt http.RoundTripper) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "https://c1.example/api", nil)
	resp, err := rt.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
}

// TestSourceFollowsCopy: with Start running, a rotated copy reaches the
// configs already handed out before any request is refused.
func TestSourceFollowsCopy(t *testing.T) {
	kube := fake.NewClientset(copySecret("token-A", nil))
	s, logs := newTestSource(t, kube)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	if !s.WaitForCacheSync(ctx) {
		t.Fatal("cache not synced")
	}
	cfg, err := s.ConfigForName(ctx, testCluster)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Host != "https://c1.example" {
		t.Errorf("host %q", cfg.Host)
	}
	cluster := &fakeCluster{valid: map[string]bool{"token-A": true, "token-B": true}}
	rt := cfg.WrapTransport(cluster)
	send(t, rt)
	if _, err := kube.CoreV1().Secrets(testNS).Update(ctx, copySecret("token-B", nil), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, 10*time.Millisecond, func() bool {
		send(t, rt)
		auths := cluster.auths()
		return auths[len(auths)-1] == "Bearer token-B"
	}, "requests carry the rotated token")
	if st := s.Stats(); st != (Stats{}) {
		t.Errorf("stats %+v: the switch needed a refusal", st)
	}
	// A second config for the cluster shares the credential.
	cfg2, err := s.ConfigFor(ctx, s.mustProfile(t))
	if err != nil {
		t.Fatal(err)
	}
	send(t, cfg2.WrapTransport(cluster))
	if auths := cluster.auths(); auths[len(auths)-1] != "Bearer token-B" {
		t.Errorf("a new config sent %q", auths[len(auths)-1])
	}
	// The copy's handler switches the token, then logs it: a request
	// may carry the new token a moment before the line is written.
	testutil.Eventually(t, 10*time.Second, 10*time.Millisecond, func() bool {
		return strings.Contains(logs.String(), "switched to the credential copy's new token")
	}, "the switch logged")
	for _, tok := range []string{"token-A", "token-B"} {
		if strings.Contains(logs.String(), tok) {
			t.Errorf("the log holds a token: %s", logs)
		}
	}
}

func (s *Source) mustProfile(t *testing.T) *cpv1alpha1.ClusterProfile {
	t.Helper()
	p, err := s.clients.Profiles.ApisV1alpha1().ClusterProfiles(testNS).Get(context.Background(), testCluster, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestSourceRefresh: Refresh reads the copy unless the token held has the
// fingerprint given.
func TestSourceRefresh(t *testing.T) {
	kube := fake.NewClientset(copySecret("token-A", nil))
	s, _ := newTestSource(t, kube)
	ctx := context.Background()
	cfg, err := s.ConfigFor(ctx, s.mustProfile(t))
	if err != nil {
		t.Fatal(err)
	}
	cluster := &fakeCluster{valid: map[string]bool{"token-A": true, "token-B": true}}
	rt := cfg.WrapTransport(cluster)
	if _, err := kube.CoreV1().Secrets(testNS).Update(ctx, copySecret("token-B", nil), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		name        string
		cluster     string
		fingerprint string
		want        string
	}{
		{name: "fingerprint of the token held: no read", cluster: testCluster, fingerprint: hub.TokenFingerprint([]byte("token-A")), want: "Bearer token-A"},
		{name: "another cluster: nothing to refresh", cluster: "c2", want: "Bearer token-A"},
		{name: "fingerprint of the new token: read", cluster: testCluster, fingerprint: hub.TokenFingerprint([]byte("token-B")), want: "Bearer token-B"},
	}
	for _, st := range steps {
		if err := s.Refresh(ctx, st.cluster, st.fingerprint); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		send(t, rt)
		if auths := cluster.auths(); auths[len(auths)-1] != st.want {
			t.Errorf("%s: request sent with %q, want %q", st.name, auths[len(auths)-1], st.want)
		}
	}
}

// TestSourceCopyOfAnotherPair: a copy that hubsync made for another
// (cluster, msa) pair with the same name is never used.
func TestSourceCopyOfAnotherPair(t *testing.T) {
	kube := fake.NewClientset(copySecret("token-of-c1-x", map[string]string{hub.AnnotationSource: "c1-x/app"}))
	s, _ := newTestSource(t, kube)
	// The profile is "c1" and the MSA "app": the copy "c1-app" above is
	// c1-x/app's (hypothetically "c1" + "x-app" would collide the same way).
	_, err := s.ConfigFor(context.Background(), s.mustProfile(t))
	if err == nil || !strings.Contains(err.Error(), "is the token of c1-x/app, not of c1/app") {
		t.Fatalf("err = %v, want the copy refused", err)
	}
	if strings.Contains(err.Error(), "token-of-c1-x") {
		t.Errorf("the error holds the token: %v", err)
	}
}

func TestSourceConfigForErrors(t *testing.T) {
	s, _ := newTestSource(t, fake.NewClientset())
	ctx := context.Background()
	other := profile(provider(DefaultProvider, "https://c1.example"))
	other.Namespace = "elsewhere"
	if _, err := s.ConfigFor(ctx, other); err == nil || !strings.Contains(err.Error(), "not in namespace team-ml") {
		t.Errorf("profile of another namespace: err = %v", err)
	}
	if _, err := s.ConfigFor(ctx, s.mustProfile(t)); err == nil || !strings.Contains(err.Error(), `secrets "c1-app" not found`) {
		t.Errorf("no copy: err = %v, want the copy reported missing", err)
	}
	if _, err := s.ConfigForName(ctx, "c9"); err == nil || !strings.Contains(err.Error(), "get cluster profile team-ml/c9") {
		t.Errorf("no profile: err = %v", err)
	}
}

func TestStripSecret(t *testing.T) {
	in := copySecret("token-A", map[string]string{hub.AnnotationSource: "c1/app", "other": "x"})
	in.ResourceVersion = "7"
	in.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "hubsync"}}
	out, err := stripSecret(in)
	if err != nil {
		t.Fatal(err)
	}
	sec := out.(*corev1.Secret)
	if sec.Name != in.Name || sec.ResourceVersion != "7" || len(sec.Data) != 1 || string(sec.Data[hub.TokenKey]) != "token-A" ||
		len(sec.Annotations) != 1 || sec.ManagedFields != nil || sec.Labels != nil {
		t.Errorf("stripped secret %+v", sec)
	}
}
