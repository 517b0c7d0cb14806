package gateway

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/keyutil"
	clusterv1 "open-cluster-management.io/api/cluster/v1"
	cpv1alpha1 "sigs.k8s.io/cluster-inventory-api/apis/v1alpha1"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/test/controlplane"
	"github.com/hubsync/hubsync/test/fleet"
	"github.com/hubsync/hubsync/test/kubelet"
	"github.com/hubsync/hubsync/test/leak"
	"github.com/hubsync/hubsync/test/pki"
	"github.com/hubsync/hubsync/test/testutil"
)

const (
	cluster      = "gw-c1"
	msaName      = "hubsync-gateway"
	msaNamespace = "open-cluster-management-agent-addon"
	// The hub identity the tests use, and its name on the managed cluster.
	hubNS, hubSA = "team-a", "app"
	prefixedUser = "cluster:hub:system:serviceaccount:team-a:app"
	// The consumer namespace whose profile carries the gateway provider.
	consumerNS, consumerSet = "gw-consumers", "gw-set"
)

// setup is one running daemon with the gateway, and what a test needs to
// reach it.
type setup struct {
	h         *fleet.Hub
	d         *fleet.Daemon
	logs      *fleet.LogBuffer
	url       string // the gateway's URL
	caFile    string
	ca        *x509.CertPool
	dir       string
	hubKube   kubernetes.Interface
	mgKube    kubernetes.Interface
	userToken string // the hub identity's token
}

// start joins the managed API server as cluster (its impersonating
// ManagedServiceAccount granted with deploy/gateway/managed-cluster-rbac.yaml,
// the prefixed hub identity granted to read ConfigMaps and pods in
// "apps") and runs the daemon with the gateway.
func start(t *testing.T, ctx context.Context) *setup {
	t.Helper()
	s, conf := prepare(t, ctx)
	s.run(t, ctx, conf)
	s.waitServed(t, cluster)
	return s
}

// run starts the daemon with conf, stopped (and its log checked) when
// the test ends, and waits until it is ready.
func (s *setup) run(t *testing.T, ctx context.Context, conf config.Config) {
	t.Helper()
	var err error
	if s.d, err = fleet.StartDaemon(ctx, env.hubsync, env.hub.Config, conf, s.logs); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = s.d.Stop()
		s.checkLogs(t)
	})
	if err := s.d.WaitReady(ctx, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
}

// checkLogs fails the test if a token is in hubsync's logs, and prints
// them when the test failed.
func (s *setup) checkLogs(t *testing.T) {
	for _, f := range leak.Tokens(s.logs.String(), s.h.Tokens()) {
		t.Errorf("%s appears in hubsync's log", f)
	}
	if t.Failed() {
		t.Logf("hubsync log:\n%s", s.logs.String())
	}
}

// waitServed waits until a request to the cluster goes through the
// gateway.
func (s *setup) waitServed(t *testing.T, name string) {
	t.Helper()
	testutil.Eventually(t, 30*time.Second, 50*time.Millisecond, func() error {
		code, body := s.get(t, "/"+name+"/api/v1/namespaces/apps/configmaps", "Bearer "+s.userToken, nil)
		if code != http.StatusOK {
			return fmt.Errorf("%d: %s", code, body)
		}
		return nil
	})
}

// prepare joins the managed API server as cluster and returns the
// configuration of a daemon with the gateway, not started.
func prepare(t *testing.T, ctx context.Context) (*setup, config.Config) {
	t.Helper()
	s := &setup{dir: t.TempDir()}
	var err error
	if s.h, err = fleet.NewHub(env.hub.Config); err != nil {
		t.Fatal(err)
	}
	s.hubKube = s.h.Kube
	s.mgKube = kubernetes.NewForConfigOrDie(env.managed.Config)
	// A consumer namespace bound to a set holding the clusters, so that
	// it gets a profile with the gateway's access provider.
	if err := s.h.CreateExclusiveSet(ctx, consumerSet); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if err := s.h.Namespace(ctx, consumerNS); err != nil {
		t.Fatal(err)
	}
	if err := s.h.Bind(ctx, consumerNS, consumerSet, true); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	s.join(t, ctx, cluster, env.managed)

	// The hub identity: a ServiceAccount on the hub.
	if err := s.h.Namespace(ctx, hubNS); err != nil {
		t.Fatal(err)
	}
	if _, err := s.hubKube.CoreV1().ServiceAccounts(hubNS).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: hubSA}},
		metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	s.userToken = hubToken(t, ctx, s.hubKube, nil)
	s.h.NoteToken(s.userToken)

	// The gateway's serving certificate.
	ca, err := pki.NewCA("gateway-ca")
	if err != nil {
		t.Fatal(err)
	}
	pair, err := ca.Serving("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile, err := pair.Write(s.dir, "gateway")
	if err != nil {
		t.Fatal(err)
	}
	if s.caFile, err = ca.WriteCA(s.dir, "gateway-ca"); err != nil {
		t.Fatal(err)
	}
	caPEM, _ := os.ReadFile(s.caFile)
	s.ca = x509.NewCertPool()
	s.ca.AppendCertsFromPEM(caPEM)
	addr := freeAddr(t)
	s.url = "https://" + addr

	conf := *config.Default()
	conf.Tunnel = env.server.TunnelConfig(msaName)
	conf.Tunnel.ClusterSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"gateway-test": "yes"}}
	conf.Gateway = config.Gateway{
		Enabled: true, Listen: addr, URL: s.url,
		TLS: config.GatewayTLS{CertFile: certFile, KeyFile: keyFile, CAFile: s.caFile},
		// Short, so that a revoked token is seen refused quickly.
		ReviewCacheTTL:    metav1.Duration{Duration: time.Second},
		ReadHeaderTimeout: metav1.Duration{Duration: 500 * time.Millisecond},
		BodyTimeout:       metav1.Duration{Duration: time.Second},
		Drain:             config.GatewayDrain{Delay: &metav1.Duration{}},
	}
	conf.AccessProviders = []config.AccessProvider{{Name: "hubsync-gateway", Type: config.ProviderGateway}}
	conf.Logging.Level = "debug"
	s.logs = &fleet.LogBuffer{}
	return s, conf
}

// join makes the managed API server m the hub's cluster name, in the
// consumer namespace's set: its impersonating ManagedServiceAccount
// granted with deploy/gateway/managed-cluster-rbac.yaml and its token on
// the hub, the prefixed hub identity granted to read ConfigMaps and pods
// in "apps".
func (s *setup) join(t *testing.T, ctx context.Context, name string, m *controlplane.Managed) {
	t.Helper()
	mg := kubernetes.NewForConfigOrDie(m.Config)
	applyManagedRBAC(t, ctx, mg)
	grant(t, ctx, mg)
	// The impersonator's token, held by the hub as the MSA's Secret.
	token, err := m.ServiceAccountToken(ctx, msaNamespace, msaName, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	s.h.NoteToken(token)
	if err := s.h.Namespace(ctx, name); err != nil {
		t.Fatal(err)
	}
	if err := s.h.PutToken(ctx, name, msaName, token, map[string][]byte{"token": []byte(token), "ca.crt": m.CA}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.h.CreateCluster(ctx, fleet.ClusterSpec{Name: name,
		Labels: fleet.ExclusiveSetLabels(consumerSet, map[string]string{"gateway-test": "yes"})}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if err := s.h.UpdateCluster(ctx, name, func(mc *clusterv1.ManagedCluster) {
		mc.Spec.ManagedClusterClientConfigs = []clusterv1.ClientConfig{{URL: "https://" + m.Address, CABundle: m.CA}}
	}); err != nil {
		t.Fatal(err)
	}
}

// freeAddr returns a free loopback address.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// applyManagedRBAC applies the shipped deploy/gateway/managed-cluster-rbac.yaml.
func applyManagedRBAC(t *testing.T, ctx context.Context, kube kubernetes.Interface) {
	t.Helper()
	role, binding := roleAndBinding(t, "managed-cluster-rbac.yaml")
	if _, err := kube.RbacV1().ClusterRoles().Create(ctx, &role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := kube.RbacV1().ClusterRoleBindings().Create(ctx, &binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// roleAndBinding decodes the ClusterRole and ClusterRoleBinding that
// open deploy/gateway/<file>.
func roleAndBinding(t *testing.T, file string) (rbacv1.ClusterRole, rbacv1.ClusterRoleBinding) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "deploy", "gateway", file))
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var role rbacv1.ClusterRole
	var binding rbacv1.ClusterRoleBinding
	for _, into := range []any{&role, &binding} {
		if err := dec.Decode(into); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
	}
	return role, binding
}

// grant lets the prefixed hub identity read ConfigMaps and pods (and
// their logs, exec, attach and port-forward) in "apps", and nothing else.
func grant(t *testing.T, ctx context.Context, kube kubernetes.Interface) {
	t.Helper()
	for _, ns := range []string{"apps", "other"} {
		if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		for i := range 7 {
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cm-%d", i), Namespace: ns}}
			if _, err := kube.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
				t.Fatal(err)
			}
		}
	}
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "app-reader", Namespace: "apps"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"configmaps", "pods", "pods/log"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"pods/exec", "pods/attach", "pods/portforward"}, Verbs: []string{"get", "create"}},
	}}
	if _, err := kube.RbacV1().Roles("apps").Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "app-reader", Namespace: "apps"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "app-reader"},
		Subjects: []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: prefixedUser}}}
	if _, err := kube.RbacV1().RoleBindings("apps").Create(ctx, rb, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// hubToken asks the hub for a token of the hub identity, bound to obj
// when it is set (deleting obj then revokes the token).
func hubToken(t *testing.T, ctx context.Context, kube kubernetes.Interface, bound *corev1.Secret) string {
	t.Helper()
	secs := int64(3600)
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &secs}}
	if bound != nil {
		req.Spec.BoundObjectRef = &authenticationv1.BoundObjectReference{Kind: "Secret", APIVersion: "v1", Name: bound.Name, UID: bound.UID}
	}
	tr, err := kube.CoreV1().ServiceAccounts(hubNS).CreateToken(ctx, hubSA, req, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

func (s *setup) client() *http.Client {
	return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: s.ca}}, Timeout: 30 * time.Second}
}

// get sends GET path (sent as is, never cleaned) with the Authorization
// header auth (none when empty) and extra headers.
func (s *setup) get(t *testing.T, path, auth string, extra http.Header) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, s.url+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.URL.Opaque = "//" + req.URL.Host + pathOnly(path)
	req.URL.RawQuery = queryOnly(path)
	for k, vs := range extra {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := s.client().Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

func pathOnly(p string) string  { before, _, _ := strings.Cut(p, "?"); return before }
func queryOnly(p string) string { _, after, _ := strings.Cut(p, "?"); return after }

// kubectl runs the real kubectl with args and returns its output.
func kubectl(ctx context.Context, kubeconfig string, args ...string) (string, string, error) {
	cmd := exec.CommandContext(ctx, env.kubectl, append([]string{"--kubeconfig", kubeconfig}, args...)...)
	cmd.Env = append(os.Environ(), "KUBECONFIG=")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return stdout.String(), stderr.String(), err
}

// writeHubUserKubeconfig writes the hub identity's own kubeconfig: what a
// person has before running hubsync kubeconfig.
func (s *setup) writeHubUserKubeconfig(t *testing.T) string {
	t.Helper()
	path := filepath.Join(s.dir, "hub-user.kubeconfig")
	doc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: hub, cluster: {server: %q}}]
users: [{name: app, user: {token: %q}}]
contexts: [{name: hub, context: {cluster: hub, user: app}}]
current-context: hub
`, env.hub.Config.Host, s.userToken)
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// gatewayKubeconfig runs `hubsync kubeconfig` for the hub identity (its
// own hub kubeconfig holds its token) and returns the file, checked 0600.
func (s *setup) gatewayKubeconfig(t *testing.T, ctx context.Context) string {
	t.Helper()
	hubUser := s.writeHubUserKubeconfig(t)
	kc := filepath.Join(s.dir, cluster+".kubeconfig")
	cmd := exec.CommandContext(ctx, env.hubsync, "kubeconfig", "--cluster", cluster, "--gateway", s.url, "--ca-file", s.caFile,
		"--hub-kubeconfig", hubUser, "-o", kc)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("hubsync kubeconfig: %v\n%s", err, out)
	}
	if st, err := os.Stat(kc); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("kubeconfig mode: %v %v; want 0600", st, err)
	}
	return kc
}

// metric returns the sum of the daemon's series of name that carry
// labels.
func (s *setup) metric(t *testing.T, name string, labels testutil.Labels) float64 {
	t.Helper()
	return testutil.Metric(t, "http://"+s.d.Address+"/metrics", name, labels)
}

// TestKubectlThroughGateway runs the real kubectl through a kubeconfig
// from `hubsync kubeconfig`: as the hub identity (impersonated with the
// prefix), it gets, lists in chunks and watches exactly what the managed
// cluster's RBAC grants the prefixed name, and nothing more; as a managed
// cluster's own token it acts as itself.
func TestKubectlThroughGateway(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s := start(t, ctx)
	kc := s.gatewayKubeconfig(t, ctx)

	// Who am I on the managed cluster: the prefixed name and prefixed
	// groups, plus system:authenticated, which the API server adds.
	out, errOut, err := kubectl(ctx, kc, "auth", "whoami", "-o", "json")
	if err != nil {
		t.Fatalf("kubectl auth whoami: %v\n%s", err, errOut)
	}
	var review authenticationv1.SelfSubjectReview
	if err := json.Unmarshal([]byte(out), &review); err != nil {
		t.Fatal(err)
	}
	ui := review.Status.UserInfo
	if ui.Username != prefixedUser {
		t.Fatalf("managed cluster sees user %q; want %q", ui.Username, prefixedUser)
	}
	for _, g := range ui.Groups {
		if g != "system:authenticated" && !strings.HasPrefix(g, "cluster:hub:") {
			t.Errorf("managed cluster sees unprefixed group %q", g)
		}
	}
	if !containsStr(ui.Groups, "cluster:hub:system:serviceaccounts:team-a") {
		t.Errorf("groups %q lack the prefixed hub group cluster:hub:system:serviceaccounts:team-a", ui.Groups)
	}
	if ui.UID != "" || len(ui.Extra) != 0 {
		t.Errorf("uid %q, extra %v forwarded; want neither", ui.UID, ui.Extra)
	}

	// Get and a chunked list (kubectl follows continue tokens): allowed.
	if out, errOut, err = kubectl(ctx, kc, "get", "configmap", "cm-3", "-n", "apps", "-o", "name"); err != nil || strings.TrimSpace(out) != "configmap/cm-3" {
		t.Fatalf("kubectl get: %q %v\n%s", out, err, errOut)
	}
	out, errOut, err = kubectl(ctx, kc, "get", "configmaps", "-n", "apps", "--chunk-size=2", "-o", "name", "-v=6")
	if err != nil {
		t.Fatalf("kubectl get --chunk-size: %v\n%s", err, errOut)
	}
	if n := strings.Count(out, "configmap/cm-"); n != 7 {
		t.Fatalf("chunked list returned %d of 7 ConfigMaps:\n%s", n, out)
	}
	if !strings.Contains(errOut, "continue=") {
		t.Errorf("kubectl did not page (no continue token in its requests):\n%s", errOut)
	}

	// Exactly as granted: nothing else in apps, nothing in other.
	for _, args := range [][]string{
		{"get", "secrets", "-n", "apps"},
		{"get", "configmaps", "-n", "other"},
		{"delete", "configmap", "cm-1", "-n", "apps"},
		{"get", "namespaces"},
	} {
		_, errOut, err := kubectl(ctx, kc, args...)
		if err == nil || !strings.Contains(errOut, "Forbidden") || !strings.Contains(errOut, `User "`+prefixedUser+`"`) {
			t.Errorf("kubectl %v: err %v; want Forbidden for %s:\n%s", args, err, prefixedUser, errOut)
		}
	}
	if _, err := s.mgKube.CoreV1().ConfigMaps("apps").Get(ctx, "cm-1", metav1.GetOptions{}); err != nil {
		t.Fatalf("the refused delete deleted: %v", err)
	}

	// A watch streams through the gateway and the tunnel.
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	watch := exec.CommandContext(wctx, env.kubectl, "--kubeconfig", kc, "get", "configmaps", "-n", "apps", "--watch-only", "-o", "name")
	pipe, err := watch.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var watchErr bytes.Buffer
	watch.Stderr = &watchErr
	if err := watch.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(pipe)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	// The watch may start after the first create: create until one is seen.
	seen := false
	for i := 0; i < 100 && !seen; i++ {
		name := fmt.Sprintf("watched-%d", i)
		if _, err := s.mgKube.CoreV1().ConfigMaps("apps").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("the watch ended: %s", watchErr.String())
			}
			seen = strings.HasPrefix(l, "configmap/watched-")
		case <-time.After(200 * time.Millisecond):
		}
	}
	if !seen {
		t.Fatalf("the watch saw no ConfigMap created: %s", watchErr.String())
	}
	wcancel()
	_ = watch.Wait()

	// A managed cluster's own token is not the hub's: it passes through
	// and acts as itself.
	ownToken, err := env.managed.ServiceAccountToken(ctx, "apps", "own", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	s.h.NoteToken(ownToken)
	ownKC := filepath.Join(s.dir, "own.kubeconfig")
	doc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: gw, cluster: {server: %q, certificate-authority: %q}}]
users: [{name: own, user: {token: %q}}]
contexts: [{name: gw, context: {cluster: gw, user: own}}]
current-context: gw
`, s.url+"/"+cluster, s.caFile, ownToken)
	if err := os.WriteFile(ownKC, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, errOut, err = kubectl(ctx, ownKC, "auth", "whoami", "-o", "jsonpath={.status.userInfo.username}"); err != nil || out != "system:serviceaccount:apps:own" {
		t.Fatalf("pass-through whoami: %q %v\n%s", out, err, errOut)
	}
	if _, errOut, err = kubectl(ctx, ownKC, "get", "configmaps", "-n", "apps"); err == nil || !strings.Contains(errOut, "system:serviceaccount:apps:own") {
		t.Fatalf("pass-through get: want the managed cluster's refusal of the token's own identity, got %v\n%s", err, errOut)
	}
	// The profile's gateway access provider leads a consumer there: its
	// server and CA, with the hub identity's token, reach the cluster.
	var provider *cpv1alpha1.AccessProvider
	testutil.Eventually(t, 30*time.Second, 50*time.Millisecond, func() error {
		profiles, err := s.h.ProfilesIn(ctx, consumerNS)
		if err != nil {
			return err
		}
		p, ok := profiles[cluster]
		if !ok {
			return fmt.Errorf("no profile for %s in %s", cluster, consumerNS)
		}
		for i := range p.Status.AccessProviders {
			if p.Status.AccessProviders[i].Name == "hubsync-gateway" {
				provider = &p.Status.AccessProviders[i]
				return nil
			}
		}
		return fmt.Errorf("profile has no hubsync-gateway provider: %+v", p.Status.AccessProviders)
	})
	caPEM, _ := os.ReadFile(s.caFile)
	if provider.Cluster.Server != s.url+"/"+cluster || !bytes.Equal(provider.Cluster.CertificateAuthorityData, caPEM) {
		t.Fatalf("provider %q with CA %d bytes; want %q with the gateway's CA", provider.Cluster.Server, len(provider.Cluster.CertificateAuthorityData), s.url+"/"+cluster)
	}
	consumer := kubernetes.NewForConfigOrDie(&rest.Config{Host: provider.Cluster.Server,
		TLSClientConfig: rest.TLSClientConfig{CAData: provider.Cluster.CertificateAuthorityData}, BearerToken: s.userToken})
	if cms, err := consumer.CoreV1().ConfigMaps("apps").List(ctx, metav1.ListOptions{}); err != nil || len(cms.Items) < 7 {
		t.Fatalf("list through the profile's provider: %v", err)
	}
	if v := s.metric(t, "hubsync_gateway_requests_total", testutil.Labels{"mode": "passthrough"}); v < 2 {
		t.Errorf("hubsync_gateway_requests_total{mode=passthrough} = %v; want ≥ 2", v)
	}
	if v := s.metric(t, "hubsync_gateway_requests_total", testutil.Labels{"cluster": cluster, "code": "403", "mode": "impersonate"}); v < 4 {
		t.Errorf("hubsync_gateway_requests_total{code=403,mode=impersonate} = %v; want ≥ 4", v)
	}
}

func containsStr(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// TestGatewayRefusesAttacks sends each attack to the running gateway: each
// gets a clear refusal, and nothing reaches the cluster (the pool's
// request counter does not move).
func TestGatewayRefusesAttacks(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s := start(t, ctx)
	good := "Bearer " + s.userToken
	base := "/" + cluster + "/api/v1/namespaces/apps/configmaps"
	forwarded := func() float64 { return s.metric(t, "hubsync_tunnel_requests_total", nil) }

	// An expired hub token: signed with the hub's own key.
	keyFile, issuer := env.hub.ServiceAccountSigner()
	expired := mintHubToken(t, keyFile, issuer, time.Now().Add(-time.Hour))
	s.h.NoteToken(expired)
	// A revoked hub token: bound to a Secret, then the Secret is deleted.
	sec, err := s.hubKube.CoreV1().Secrets(hubNS).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{GenerateName: "bound-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	revoked := hubToken(t, ctx, s.hubKube, sec)
	s.h.NoteToken(revoked)
	if code, body := s.get(t, base, "Bearer "+revoked, nil); code != http.StatusOK {
		t.Fatalf("the bound token before revocation: %d %s", code, body)
	}
	if err := s.hubKube.CoreV1().Secrets(hubNS).Delete(ctx, sec.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// Refused once the cached review expires (reviewCacheTTL 1s here).
	revokedAt := time.Now()
	testutil.Eventually(t, 30*time.Second, 50*time.Millisecond, func() error {
		if code, _ := s.get(t, base, "Bearer "+revoked, nil); code != http.StatusUnauthorized {
			tr, err := s.hubKube.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: revoked}}, metav1.CreateOptions{})
			return fmt.Errorf("revoked token: %d (hub says %+v %v)", code, tr.Status, err)
		}
		return nil
	})
	t.Logf("revoked token refused %s after its Secret was deleted", time.Since(revokedAt).Round(time.Millisecond))

	tests := []struct {
		name   string
		path   string
		auth   string
		header http.Header
		code   int
		says   string
	}{
		{"forged Impersonate-User", base, good, http.Header{"Impersonate-User": {"system:admin"}}, 403, "Impersonate-* headers are refused"},
		{"forged Impersonate-Group", base, good, http.Header{"Impersonate-Group": {"system:masters"}}, 403, "Impersonate-"},
		{"forged Impersonate-Uid", base, good, http.Header{"Impersonate-Uid": {"1"}}, 403, "Impersonate-"},
		{"forged Impersonate-Extra", base, good, http.Header{"Impersonate-Extra-Scopes": {"all"}}, 403, "Impersonate-"},
		{"two Authorization headers", base, "", http.Header{"Authorization": {good, good}}, 401, "more than one Authorization"},
		{"no token", base, "", nil, 401, "no anonymous requests"},
		{"hub token in a WebSocket subprotocol", base, "Bearer " + expired,
			http.Header{"Sec-Websocket-Protocol": {"base64url.bearer.authorization.k8s.io." + base64.RawURLEncoding.EncodeToString([]byte(s.userToken))}}, 401, "Sec-WebSocket-Protocol"},
		{"expired hub token", base, "Bearer " + expired, nil, 401, "hub tokens are never forwarded"},
		{"revoked hub token", base, "Bearer " + revoked, nil, 401, "hub tokens are never forwarded"},
		{"opaque unknown token", base, "Bearer 0123456789abcdef", nil, 401, "only a managed cluster's JWT"},
		{"dot-dot to another cluster", "/" + cluster + "/../other/api", good, nil, 400, "dot segments"},
		{"encoded slash", "/" + cluster + "%2Fapi/v1", good, nil, 400, "encoded slashes"},
		{"encoded dot-dot", "/" + cluster + "/%2e%2e/%2e%2e/api", good, nil, 400, "dot segments"},
		{"cluster name with dots", "/" + cluster + ".evil.example/api", good, nil, 404, "not served"},
		{"huge headers", base, good, http.Header{"X-Big": {strings.Repeat("a", 100<<10)}}, 431, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := forwarded()
			code, body := s.get(t, tt.path, tt.auth, tt.header)
			if code != tt.code || !strings.Contains(body, tt.says) {
				t.Fatalf("%d %s; want %d saying %q", code, body, tt.code, tt.says)
			}
			if after := forwarded(); after != before {
				t.Fatalf("%v requests reached the cluster", after-before)
			}
		})
	}

	t.Run("slow client headers", func(t *testing.T) {
		conn, err := tls.Dial("tcp", strings.TrimPrefix(s.url, "https://"), &tls.Config{RootCAs: s.ca, NextProtos: []string{"http/1.1"}})
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		before := forwarded()
		if _, err := io.WriteString(conn, "GET "+base+" HTTP/1.1\r\nHost: x\r\nAuthorization: "+good+"\r\n"); err != nil {
			t.Fatal(err)
		}
		// The rest of the headers never come: the server hangs up after
		// readHeaderTimeout (500ms here).
		start := time.Now()
		_ = conn.SetReadDeadline(time.Now().Add(20 * time.Second))
		_, err = io.ReadAll(conn)
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatalf("the server kept a client that never finished its headers for %s", time.Since(start))
		}
		if forwarded() != before {
			t.Fatal("a request with unfinished headers reached the cluster")
		}
	})

	t.Run("failing cluster", func(t *testing.T) {
		env.agent.Kill()
		defer func() {
			if err := env.agent.Start(); err != nil {
				t.Fatal(err)
			}
			testutil.Eventually(t, 30*time.Second, 50*time.Millisecond, func() error {
				if code, body := s.get(t, base, good, nil); code != 200 {
					return fmt.Errorf("%d %s", code, body)
				}
				return nil
			})
		}()
		testutil.Eventually(t, 20*time.Second, 50*time.Millisecond, func() error {
			start := time.Now()
			req, _ := http.NewRequest(http.MethodGet, s.url+base, nil)
			req.Header.Set("Authorization", good)
			resp, err := s.client().Do(req)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if took := time.Since(start); took > 5*time.Second {
				t.Fatalf("a request to a failing cluster took %s", took)
			}
			if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || !strings.Contains(string(body), "failing") {
				return fmt.Errorf("%d (Retry-After %q) %s", resp.StatusCode, resp.Header.Get("Retry-After"), body)
			}
			return nil
		})
	})

	if v := s.metric(t, "hubsync_gateway_refused_total", testutil.Labels{"reason": "hub_token_refused"}); v < 2 {
		t.Errorf("hubsync_gateway_refused_total{reason=hub_token_refused} = %v; want ≥ 2", v)
	}
	if strings.Contains(s.logs.String(), expired) || strings.Contains(s.logs.String(), revoked) {
		t.Error("a refused token appears in the log")
	}
}

// mintHubToken signs a ServiceAccount token for the hub identity with the
// hub's own key, expiring at exp.
func mintHubToken(t *testing.T, keyFile, issuer string, exp time.Time) string {
	t.Helper()
	pemData, err := os.ReadFile(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	key, err := keyutil.ParsePrivateKeyPEM(pemData)
	if err != nil {
		t.Fatal(err)
	}
	iat := exp.Add(-time.Hour).Unix()
	return signJWT(t, key, "", map[string]any{
		"iss": issuer, "aud": []string{issuer}, "sub": "system:serviceaccount:" + hubNS + ":" + hubSA,
		"exp": exp.Unix(), "iat": iat, "nbf": iat,
		"kubernetes.io": map[string]any{"namespace": hubNS, "serviceaccount": map[string]any{"name": hubSA, "uid": "0"}},
	})
}

// signJWT signs claims with key (RSA or ECDSA), naming kid when it is set.
func signJWT(t *testing.T, key any, kid string, claims map[string]any) string {
	t.Helper()
	tok, err := pki.SignJWT(key, kid, claims)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// TestStreamingThroughGateway runs kubectl exec, attach and port-forward
// (over WebSocket and over SPDY) and logs -f through the gateway and the
// tunnel. No kubelet runs here: the managed kube-apiserver reaches a fake
// one (test/kubelet) that serves the kubelet's own streaming code, so the
// upgraded connection goes kubectl → gateway → konnectivity → the real
// kube-apiserver → the kubelet's streaming server, as on a real cluster.
func TestStreamingThroughGateway(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s := start(t, ctx)
	echo := kubelet.StartEcho(t)
	k, err := kubelet.Start(ctx, kubelet.Options{IP: managedIP, PortForwardTarget: echo, LogInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = k.Close() }()
	pod := kubelet.Pod{Namespace: "apps", Name: "p1", Container: "main"}
	if _, err := k.Register(ctx, env.managed.Config, pod); err != nil {
		t.Fatal(err)
	}
	kc := s.gatewayKubeconfig(t, ctx)
	before := s.metric(t, "hubsync_gateway_requests_total", testutil.Labels{"code": "101"})
	kubelet.Suite(ctx, t, k, &kubelet.Kubectl{Bin: env.kubectl, Kubeconfig: kc, Home: s.dir, Namespace: pod.Namespace}, pod)
	// Exec, attach and port-forward over two transports: 12 upgrades
	// (port-forward's two connections share one).
	if n := s.metric(t, "hubsync_gateway_requests_total", testutil.Labels{"code": "101"}) - before; n < 12 {
		t.Errorf("%v upgraded requests through the gateway; want ≥ 12", n)
	}
	testutil.Eventually(t, 10*time.Second, 50*time.Millisecond, func() error {
		if v := s.metric(t, "hubsync_gateway_upgraded_connections", nil); v != 0 {
			return fmt.Errorf("%v upgraded connections still open after kubectl exited", v)
		}
		return nil
	})
	// The prefixed identity may exec only where it is granted.
	res, errOut, err := kubectl(ctx, kc, "exec", "-n", "other", "p1", "--", "echo", "x")
	if err == nil || !strings.Contains(errOut, "Forbidden") && !strings.Contains(errOut, "forbidden") {
		t.Errorf("exec in a namespace not granted: %q %v\n%s", res, err, errOut)
	}
}

// TestKubeconfigFromProfile: `hubsync kubeconfig --from-profile NS` needs
// neither the gateway's URL nor its CA: it reads both from the cluster's
// ClusterProfile in a namespace the user may read (the gateway's access
// provider, which hubsync keeps current), and kubectl reaches the cluster
// through the gateway with the file.
func TestKubeconfigFromProfile(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s := start(t, ctx)
	// The hub identity may read its namespace's profiles, as a consumer's.
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "profile-reader", Namespace: consumerNS}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{"multicluster.x-k8s.io"}, Resources: []string{"clusterprofiles"}, Verbs: []string{"get"}},
	}}
	if _, err := s.hubKube.RbacV1().Roles(consumerNS).Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "profile-reader", Namespace: consumerNS},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "profile-reader"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: hubSA, Namespace: hubNS}}}
	if _, err := s.hubKube.RbacV1().RoleBindings(consumerNS).Create(ctx, rb, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	hubUser, err := controlplane.WriteKubeconfig(s.dir, "hub-user-verified.kubeconfig",
		&rest.Config{Host: env.hub.Config.Host, BearerToken: s.userToken, TLSClientConfig: rest.TLSClientConfig{CAData: env.hub.Config.CAData}})
	if err != nil {
		t.Fatal(err)
	}
	kc := filepath.Join(s.dir, "from-profile.kubeconfig")
	testutil.Eventually(t, time.Minute, 200*time.Millisecond, func() error {
		out, err := exec.CommandContext(ctx, env.hubsync, "kubeconfig", "--cluster", cluster, "--from-profile", consumerNS,
			"--hub-kubeconfig", hubUser, "-o", kc).CombinedOutput()
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	}, "hubsync kubeconfig --from-profile")
	out, errOut, err := kubectl(ctx, kc, "get", "configmaps", "-n", "apps", "-o", "name")
	if err != nil || !strings.Contains(out, "configmap/cm-0") {
		t.Fatalf("kubectl through the profile's gateway: %v\n%s%s", err, out, errOut)
	}
}
