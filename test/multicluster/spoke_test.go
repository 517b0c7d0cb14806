package multicluster_test

import (
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/hubsync/hubsync/test/controlplane"
	"github.com/hubsync/hubsync/test/testutil"
)

const (
	// agentNS and msaName name the ServiceAccount on each managed cluster
	// that the ManagedServiceAccount stands for: the controller's
	// identity there.
	agentNS = "open-cluster-management-agent-addon"
	msaName = "mcr-controller"
	// appNS holds the ConfigMaps the controller reconciles.
	appNS = "mcr-apps"
	// watchLabel marks the ConfigMaps the controller reconciles;
	// reconciledBy is the annotation it writes on each, naming the
	// cluster it reached the ConfigMap through.
	watchLabel   = "mcr.hubsync.io/watch"
	reconciledBy = "mcr.hubsync.io/reconciled-by"
)

// spoke is one managed cluster as the test drives it.
type spoke struct {
	name  string
	m     *controlplane.Managed
	admin kubernetes.Interface
}

// newSpoke prepares a managed cluster: the controller's ServiceAccount,
// allowed to read and update ConfigMaps and nothing else, and the
// namespace of the ConfigMaps.
func newSpoke(t *testing.T, name string, m *controlplane.Managed) *spoke {
	t.Helper()
	ctx := t.Context()
	admin, err := kubernetes.NewForConfig(m.Config)
	if err != nil {
		t.Fatal(err)
	}
	s := &spoke{name: name, m: m, admin: admin}
	create := func(what string, err error) {
		t.Helper()
		if err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("%s on %s: %v", what, name, err)
		}
	}
	create("service account", controlplane.CreateServiceAccount(ctx, m.Config, agentNS, msaName))
	_, err = admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: appNS}}, metav1.CreateOptions{})
	create("namespace "+appNS, err)
	_, err = admin.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: msaName},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch", "update", "patch"}}},
	}, metav1.CreateOptions{})
	create("cluster role", err)
	_, err = admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: msaName},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: msaName},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: agentNS, Name: msaName}},
	}, metav1.CreateOptions{})
	create("cluster role binding", err)
	return s
}

// mintToken returns a new token of the controller's ServiceAccount, bound
// to a Secret named secret.
func (s *spoke) mintToken(t *testing.T, secret string) controlplane.BoundToken {
	t.Helper()
	tok, err := controlplane.MintBoundToken(t.Context(), s.m.Config, agentNS, msaName, secret, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// revoke revokes tok and waits until the managed API server rejects it.
// It returns how long the rejection took.
func (s *spoke) revoke(t *testing.T, tok controlplane.BoundToken) time.Duration {
	t.Helper()
	took, err := controlplane.RevokeBoundToken(t.Context(), s.m.Config, tok, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return took
}

// putConfigMap creates a ConfigMap the controller must reconcile.
func (s *spoke) putConfigMap(t *testing.T, name string) {
	t.Helper()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: appNS, Labels: map[string]string{watchLabel: "true"}}}
	if _, err := s.admin.CoreV1().ConfigMaps(appNS).Create(t.Context(), cm, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create ConfigMap %s on %s: %v", name, s.name, err)
	}
}

// awaitReconciled waits until the controller has annotated a ConfigMap
// with the name under which it reached this cluster, and returns how long
// that took.
func (s *spoke) awaitReconciled(t *testing.T, name, clusterKey string) time.Duration {
	t.Helper()
	return testutil.Eventually(t, 60*time.Second, 100*time.Millisecond, func() error {
		cm, err := s.admin.CoreV1().ConfigMaps(appNS).Get(t.Context(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if got := cm.Annotations[reconciledBy]; got != clusterKey {
			return fmt.Errorf("annotation %s=%q, want %q", reconciledBy, got, clusterKey)
		}
		return nil
	}, "ConfigMap %s on %s reconciled through the multicluster manager\ncontroller log:\n%s", name, s.name, env.ctrlLogs)
}

// updaters returns the identities that updated a ConfigMap, from the
// managed API server's audit log.
func (s *spoke) updaters(name string) ([]string, error) {
	evs, err := s.m.AuditEvents("/configmaps/" + name)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range evs {
		if e.Verb == "update" && e.Stage == "ResponseComplete" && e.ResponseStatus != nil && e.ResponseStatus.Code == 200 {
			out = append(out, e.User.Username)
		}
	}
	return out, nil
}
