// Package argocd_test proves that Argo CD's own code reads the cluster
// Secrets the hubsync Argo CD sink writes, and reaches the cluster with
// them: it lives in its own module because Argo CD's dependency graph is
// much heavier than hubsync's.
//
// One kube-apiserver plays both the hub (where the credential copy, the
// Argo CD namespace and the plugin's kubeconfig point) and the managed
// cluster (whose ServiceAccount the credential belongs to).
package argocd_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	appv1 "github.com/argoproj/argo-cd/v3/pkg/apis/application/v1alpha1"
	"github.com/argoproj/argo-cd/v3/util/db"
	"github.com/argoproj/argo-cd/v3/util/settings"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/hubsync/hubsync/config"
	// The type hub below is the test's API server; the package names
	// hubsync's objects on it.
	hubnames "github.com/hubsync/hubsync/hub"
	"github.com/hubsync/hubsync/sinks"
	"github.com/hubsync/hubsync/sinks/argocd"
	"github.com/hubsync/hubsync/stream"
	"github.com/hubsync/hubsync/test/leak"
	"github.com/hubsync/hubsync/test/testutil"
)

const (
	clusterName = "spoke-1"
	msaName     = "argocd-agent"
	providerKey = "open-cluster-management"
	// managedNS holds the ServiceAccount standing for the managed
	// cluster's identity, the one the MSA's token belongs to.
	managedNS = "open-cluster-management-agent-addon"
	// consumerNS holds the profiles' credential copies.
	consumerNS = "team-a"
	// credsUser is the hub identity of the exec plugin: it may read the
	// credential copies of the consumer namespace and nothing else.
	credsUser = "argocd-application-controller"
)

// kubeAssets returns the directory holding kube-apiserver and etcd:
// $KUBEBUILDER_ASSETS, else the newest build of
// test/tools/build-kube-binaries.sh in its cache. It fails the test when
// there is neither: `make argocd-proof` always provides them, so missing
// binaries are a broken set-up, not a reason to pass without running.
func kubeAssets(t *testing.T) string {
	t.Helper()
	if d := os.Getenv("KUBEBUILDER_ASSETS"); d != "" {
		return d
	}
	cache := os.Getenv("XDG_CACHE_HOME")
	if cache == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			t.Fatalf("KUBEBUILDER_ASSETS is unset and there is no home directory to find the binaries in: %v", err)
		}
		cache = filepath.Join(home, ".cache")
	}
	found, _ := filepath.Glob(filepath.Join(cache, "hubsync", "k8s-*", "kube-apiserver"))
	sort.Strings(found)
	for i := len(found) - 1; i >= 0; i-- {
		dir := filepath.Dir(found[i])
		if _, err := os.Stat(filepath.Join(dir, "etcd")); err == nil {
			return dir
		}
	}
	t.Fatalf("KUBEBUILDER_ASSETS is unset and no kube-apiserver and etcd are in %s/hubsync/k8s-*: run `bash test/tools/build-kube-binaries.sh` (it prints the directory)", cache)
	return ""
}

// TestMain removes the hubsync binary testutil builds (in the main
// module, with its own dependency versions: it is what Argo CD runs as
// the exec plugin) once the tests are over.
func TestMain(m *testing.M) { os.Exit(testutil.Main(m)) }

// hub is the shared API server and what the test made on it.
type hub struct {
	cfg  *rest.Config
	kube kubernetes.Interface
}

func startHub(t *testing.T) *hub {
	t.Helper()
	env := &envtest.Environment{BinaryAssetsDirectory: kubeAssets(t)}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("start kube-apiserver and etcd: %v", err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stop the control plane: %v", err)
		}
	})
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h := &hub{cfg: cfg, kube: kube}
	ctx := t.Context()
	for _, ns := range []string{managedNS, consumerNS, "argocd", "argocd-token"} {
		h.create(t, func() error {
			_, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
			return err
		})
	}
	// The managed cluster's identity may list namespaces, no more.
	h.create(t, func() error {
		_, err := kube.CoreV1().ServiceAccounts(managedNS).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: msaName}}, metav1.CreateOptions{})
		return err
	})
	h.create(t, func() error {
		_, err := kube.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
			ObjectMeta: metav1.ObjectMeta{Name: "list-namespaces"},
			Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"namespaces"}, Verbs: []string{"list"}}},
		}, metav1.CreateOptions{})
		return err
	})
	h.create(t, func() error {
		_, err := kube.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "list-namespaces"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "list-namespaces"},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: managedNS, Name: msaName}},
		}, metav1.CreateOptions{})
		return err
	})
	// The plugin's hub identity reads the copies of the consumer namespace.
	h.create(t, func() error {
		_, err := kube.RbacV1().Roles(consumerNS).Create(ctx, &rbacv1.Role{
			ObjectMeta: metav1.ObjectMeta{Name: "read-credentials"},
			Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get"}}},
		}, metav1.CreateOptions{})
		return err
	})
	h.create(t, func() error {
		_, err := kube.RbacV1().RoleBindings(consumerNS).Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "read-credentials"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "read-credentials"},
			Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: credsUser}},
		}, metav1.CreateOptions{})
		return err
	})
	user, err := env.AddUser(envtest.User{Name: credsUser}, nil)
	if err != nil {
		t.Fatalf("add the plugin's hub user: %v", err)
	}
	kubeconfig, err := user.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "hub.kubeconfig")
	if err := os.WriteFile(path, kubeconfig, 0o600); err != nil {
		t.Fatal(err)
	}
	// Argo CD's exec config has an env map, but the sink writes none: the
	// plugin finds the hub the way it does in Argo CD's pod, through the
	// environment it inherits. NAMESPACE is cleared so that only the
	// --namespace argument can name the consumer namespace.
	t.Setenv("KUBECONFIG", path)
	t.Setenv("NAMESPACE", "")
	if err := os.Unsetenv("NAMESPACE"); err != nil {
		t.Fatal(err)
	}
	return h
}

func (h *hub) create(t *testing.T, f func() error) {
	t.Helper()
	if err := f(); err != nil {
		t.Fatal(err)
	}
}

// mintToken returns a new token of the managed cluster's ServiceAccount.
func (h *hub) mintToken(t *testing.T) string {
	t.Helper()
	tr, err := h.kube.CoreV1().ServiceAccounts(managedNS).CreateToken(t.Context(), msaName, &authnv1.TokenRequest{
		Spec: authnv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("TokenRequest: %v", err)
	}
	return tr.Status.Token
}

// putCopy writes the credential copy "<cluster>-<msa>" as the syncer
// does, holding token.
func (h *hub) putCopy(t *testing.T, token string) {
	t.Helper()
	ctx := t.Context()
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: consumerNS, Name: hubnames.CopyName(clusterName, msaName)},
		Type:       corev1.SecretTypeOpaque,
		Data:       map[string][]byte{hubnames.TokenKey: []byte(token)},
	}
	cur, err := h.kube.CoreV1().Secrets(consumerNS).Get(ctx, sec.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = h.kube.CoreV1().Secrets(consumerNS).Create(ctx, sec, metav1.CreateOptions{})
	case err == nil:
		cur.Data = sec.Data
		_, err = h.kube.CoreV1().Secrets(consumerNS).Update(ctx, cur, metav1.UpdateOptions{})
	}
	if err != nil {
		t.Fatalf("write the credential copy: %v", err)
	}
}

// snapshot is the stream's current state: the cluster's profile, with the
// API server as its access provider, and its credential copy.
func (h *hub) snapshot() []stream.Change {
	return []stream.Change{{
		Type: stream.ProfileUpdated, Namespace: consumerNS, Cluster: clusterName, Name: clusterName,
		Profile: &stream.ProfileSummary{AccessProviders: []stream.AccessProviderSummary{{
			Name: providerKey, Server: h.cfg.Host, CAData: h.cfg.CAData,
		}}},
	}, {
		Type: stream.CredentialSynced, Namespace: consumerNS, Cluster: clusterName,
		Name:       hubnames.CopyName(clusterName, msaName),
		Credential: &stream.CredentialSummary{ManagedServiceAccount: msaName, Secret: hubnames.CopyName(clusterName, msaName)},
	}}
}

// newSink makes an Argo CD sink writing into argoNS.
func (h *hub) newSink(t *testing.T, name, argoNS string, mutate func(*config.ArgoCDSink)) sinks.Sink {
	t.Helper()
	a := &config.ArgoCDSink{
		Namespace:             argoNS,
		ConsumerNamespace:     consumerNS,
		AccessProvider:        providerKey,
		ManagedServiceAccount: msaName,
		Namespaces:            []string{consumerNS, "apps"},
		ClusterResources:      true,
		Project:               "platform",
	}
	mutate(a)
	s, err := argocd.New(config.Sink{Name: name, Type: config.SinkArgoCD, ArgoCD: a}, sinks.Deps{Kube: h.kube})
	if err != nil {
		t.Fatalf("argocd.New: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// argoCluster reads the sink's Secret back and parses it with Argo CD's
// own SecretToCluster; it checks that Argo CD's settings informer, which
// the application controller uses, finds the same cluster by server.
func (h *hub) argoCluster(t *testing.T, sink, argoNS string) (*corev1.Secret, *appv1.Cluster) {
	t.Helper()
	ctx := t.Context()
	sec, err := h.kube.CoreV1().Secrets(argoNS).Get(ctx, argocd.SecretName(sink, clusterName), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("read the sink's Secret: %v", err)
	}
	c, err := db.SecretToCluster(sec)
	if err != nil {
		t.Fatalf("Argo CD's SecretToCluster: %v", err)
	}
	server := strings.TrimRight(h.cfg.Host, "/")
	switch {
	case c.Name != clusterName:
		t.Errorf("cluster name %q, want %q", c.Name, clusterName)
	case c.Server != server:
		t.Errorf("cluster server %q, want %q", c.Server, server)
	case c.Project != "platform":
		t.Errorf("cluster project %q", c.Project)
	case !slices.Equal(c.Namespaces, []string{consumerNS, "apps"}) || !c.ClusterResources:
		t.Errorf("cluster namespaces %v, clusterResources %v", c.Namespaces, c.ClusterResources)
	case c.Labels[argocd.LabelSink] != sink:
		t.Errorf("cluster labels %v", c.Labels)
	}
	// Argo CD's UI and CLI re-encode the config when they save a cluster:
	// the sink's encoding is byte for byte Argo CD's, so such a save does
	// not make the sink write the Secret back.
	if enc, err := json.Marshal(c.Config); err != nil || !bytes.Equal(enc, sec.Data["config"]) {
		t.Errorf("Argo CD encodes the config as\n%s\nthe sink wrote\n%s", enc, sec.Data["config"])
	}

	mgrCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	argoDB := db.NewDB(argoNS, settings.NewSettingsManager(mgrCtx, h.kube, argoNS), h.kube)
	byServer, err := argoDB.GetCluster(mgrCtx, c.Server)
	if err != nil {
		t.Fatalf("Argo CD's GetCluster(%s): %v", c.Server, err)
	}
	if byServer.Name != clusterName || byServer.ID != string(sec.UID) {
		t.Errorf("Argo CD's GetCluster found %q (%s), want the sink's Secret %s", byServer.Name, byServer.ID, sec.UID)
	}
	return sec, c
}

// checkAccess connects with Argo CD's rest.Config of c and checks that it
// is the managed cluster's identity, allowed to list namespaces and
// nothing more.
func checkAccess(t *testing.T, c *appv1.Cluster) {
	t.Helper()
	ctx := t.Context()
	rc, err := c.RawRestConfig()
	if err != nil {
		t.Fatalf("Argo CD's RawRestConfig: %v", err)
	}
	kube, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	review, err := kube.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authnv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("SelfSubjectReview with Argo CD's config: %v", err)
	}
	if want := "system:serviceaccount:" + managedNS + ":" + msaName; review.Status.UserInfo.Username != want {
		t.Errorf("Argo CD's config authenticates as %q, want %q", review.Status.UserInfo.Username, want)
	}
	nss, err := kube.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("list namespaces with Argo CD's config: %v", err)
	}
	if !slices.ContainsFunc(nss.Items, func(n corev1.Namespace) bool { return n.Name == consumerNS }) {
		t.Errorf("namespaces listed with Argo CD's config lack %s", consumerNS)
	}
	if _, err := kube.CoreV1().Secrets(consumerNS).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("listing Secrets with Argo CD's config: %v, want Forbidden (it must be the cluster's identity, not an admin)", err)
	}
}

func TestArgoCDUsesSinkSecrets(t *testing.T) {
	h := startHub(t)
	first := h.mintToken(t)
	h.putCopy(t, first)

	t.Run("exec", func(t *testing.T) {
		bin := testutil.Hubsync(t)
		ctx := t.Context()
		s := h.newSink(t, "proof", "argocd", func(a *config.ArgoCDSink) {
			a.Auth = config.AuthExec
			a.Exec = config.ExecAuth{Command: bin, InstallHint: "hubsync must be in Argo CD's image"}
		})
		if err := s.Resync(ctx, h.snapshot()); err != nil {
			t.Fatalf("Resync: %v", err)
		}
		sec, c := h.argoCluster(t, "proof", "argocd")
		e := c.Config.ExecProviderConfig
		if e == nil || e.Command != bin || c.Config.BearerToken != "" {
			t.Fatalf("exec config %+v, bearer token set: %v", e, c.Config.BearerToken != "")
		}
		// Argo CD runs `hubsync creds`, which reads the copy from the hub.
		checkAccess(t, c)

		// A rotation changes the copy, not Argo CD's Secret.
		second := h.mintToken(t)
		h.putCopy(t, second)
		if err := s.Deliver(ctx, []stream.Change{{
			Type: stream.CredentialRotated, Namespace: consumerNS, Cluster: clusterName,
			Credential: &stream.CredentialSummary{ManagedServiceAccount: msaName},
		}}); err != nil {
			t.Fatalf("Deliver: %v", err)
		}
		after, _ := h.argoCluster(t, "proof", "argocd")
		if after.ResourceVersion != sec.ResourceVersion {
			t.Errorf("a rotation rewrote the exec-mode Secret (resourceVersion %s → %s)", sec.ResourceVersion, after.ResourceVersion)
		}
		// The exec-mode Secret holds no token, in any encoding.
		raw, err := json.Marshal(after)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range leak.Tokens(string(raw), []string{first, second}) {
			t.Errorf("%s appears in the exec-mode Secret", f)
		}
	})

	t.Run("token", func(t *testing.T) {
		ctx := t.Context()
		h.putCopy(t, first)
		s := h.newSink(t, "proof-token", "argocd-token", func(a *config.ArgoCDSink) { a.Auth = config.AuthToken })
		if err := s.Resync(ctx, h.snapshot()); err != nil {
			t.Fatalf("Resync: %v", err)
		}
		_, c := h.argoCluster(t, "proof-token", "argocd-token")
		if c.Config.ExecProviderConfig != nil || c.Config.BearerToken != first {
			t.Fatalf("token mode: exec config %+v, bearer token is the copy's: %v", c.Config.ExecProviderConfig, c.Config.BearerToken == first)
		}
		checkAccess(t, c)

		second := h.mintToken(t)
		h.putCopy(t, second)
		if err := s.Deliver(ctx, []stream.Change{{
			Type: stream.CredentialRotated, Namespace: consumerNS, Cluster: clusterName,
			Credential: &stream.CredentialSummary{ManagedServiceAccount: msaName},
		}}); err != nil {
			t.Fatalf("Deliver: %v", err)
		}
		_, c = h.argoCluster(t, "proof-token", "argocd-token")
		if c.Config.BearerToken != second {
			t.Fatal("token mode: the rotated token is not in the Secret")
		}
		checkAccess(t, c)
	})
}
