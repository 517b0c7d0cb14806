package argocdproof

import (
	"os"
	"path/filepath"
	"sort"
	"testing"

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

// argoNamespaces are the Argo CD namespaces of the scenarios, one each so
// that their Secrets never meet.
var argoNamespaces = []string{"argocd", "argocd-token", "argocd-info", "argocd-cp-creds", "argocd-integration"}

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

// hub is the shared API server and what the test made on it. One
// kube-apiserver plays both the hub (where the credential copy, the Argo
// CD namespaces and the plugin's kubeconfig point) and the managed cluster
// (whose ServiceAccount the credential belongs to).
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
	h.grantAccess(t)
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
	// Argo CD's exec config has an env map, which the sink fills only for
	// cp-creds: the plugin finds the hub the way it does in Argo CD's pod,
	// through the environment it inherits. NAMESPACE is cleared so that
	// only the --namespace argument, or the env map, can name the consumer
	// namespace.
	t.Setenv("KUBECONFIG", path)
	t.Setenv("NAMESPACE", "")
	if err := os.Unsetenv("NAMESPACE"); err != nil {
		t.Fatal(err)
	}
	return h
}

// grantAccess makes the namespaces, the managed cluster's identity, which
// may list namespaces and no more, and the plugin's hub identity, which
// reads the credential copies of the consumer namespace and no more.
func (h *hub) grantAccess(t *testing.T) {
	t.Helper()
	ctx := t.Context()
	kube := h.kube
	for _, ns := range append([]string{managedNS, consumerNS}, argoNamespaces...) {
		h.create(t, func() error {
			_, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
			return err
		})
	}
	// Argo CD's ListClusters reads its settings from argocd-cm and
	// argocd-secret, found by this label, as an installation has them.
	partOf := map[string]string{"app.kubernetes.io/part-of": "argocd"}
	for _, ns := range argoNamespaces {
		h.create(t, func() error {
			_, err := kube.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
				Name: "argocd-cm", Labels: partOf,
			}}, metav1.CreateOptions{})
			return err
		})
		h.create(t, func() error {
			_, err := kube.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{Name: "argocd-secret", Labels: partOf},
				Data:       map[string][]byte{"server.secretkey": []byte("proof-only-signing-key")},
			}, metav1.CreateOptions{})
			return err
		})
	}
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

// sinkConfig is the configuration of an Argo CD sink writing into argoNS,
// defaulted as the daemon does, after mutate.
func sinkConfig(name, argoNS string, mutate func(*config.ArgoCDSink)) config.Sink {
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
	s := config.Sink{Name: name, Type: config.SinkArgoCD, ArgoCD: a}
	s.SetDefaults()
	return s
}

// newSink makes an Argo CD sink writing into argoNS.
func (h *hub) newSink(t *testing.T, name, argoNS string, mutate func(*config.ArgoCDSink)) sinks.Sink {
	t.Helper()
	s, err := argocd.New(sinkConfig(name, argoNS, mutate), sinks.Deps{Kube: h.kube})
	if err != nil {
		t.Fatalf("argocd.New: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}
