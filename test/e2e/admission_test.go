package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/hubsync/hubsync/test/testutil"
)

const (
	labelSyncedFrom = "authentication.open-cluster-management.io/synced-from"
	policyProbe     = "hubsync-policy-probe"
)

// installAdmissionPolicy creates deploy/admission-policy.yaml's policy and
// binding for the test and waits until the API server enforces them:
// until hubsync's ServiceAccount is refused a dry-run create of an
// unlabelled Secret in ns (its RBAC must allow creating Secrets there).
func installAdmissionPolicy(ctx context.Context, t *testing.T, admin kubernetes.Interface, asHubsync kubernetes.Interface, ns string) {
	t.Helper()
	d := loadDeploy(t, "admission-policy.yaml")
	var policies, bindings int
	for _, o := range d.other {
		switch o := o.(type) {
		case *admissionv1.ValidatingAdmissionPolicy:
			policies++
			if _, err := admin.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, o, metav1.CreateOptions{}); err != nil {
				t.Fatalf("create policy: %v", err)
			}
			t.Cleanup(func() {
				_ = admin.AdmissionregistrationV1().ValidatingAdmissionPolicies().Delete(context.Background(), o.Name, metav1.DeleteOptions{})
			})
		case *admissionv1.ValidatingAdmissionPolicyBinding:
			bindings++
			if _, err := admin.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, o, metav1.CreateOptions{}); err != nil {
				t.Fatalf("create policy binding: %v", err)
			}
			t.Cleanup(func() {
				_ = admin.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Delete(context.Background(), o.Name, metav1.DeleteOptions{})
			})
		default:
			t.Fatalf("admission-policy.yaml: unexpected %T", o)
		}
	}
	if policies != 1 || bindings != 1 {
		t.Fatalf("admission-policy.yaml holds %d policies and %d bindings, want 1 and 1", policies, bindings)
	}
	probe := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: policyProbe, Namespace: ns}}
	var last error
	err := testutil.Poll(ctx, 30*time.Second, 50*time.Millisecond, func() bool {
		_, last = asHubsync.CoreV1().Secrets(ns).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return last != nil && strings.Contains(last.Error(), "hubsync may only write")
	})
	if err != nil {
		t.Fatalf("admission policy not in effect: last dry-run create: %v", last)
	}
}

// TestAdmissionPolicy: with the shipped ValidatingAdmissionPolicy, even a
// hubsync ServiceAccount allowed every Secret verb by RBAC can write only
// Opaque Secrets that carry its labels and already carried them; other
// users are not affected.
func TestAdmissionPolicy(t *testing.T) {
	h := newHarnessWithoutSyncer(t)
	ctx, admin := h.ctx, h.hub.Kube
	ns := h.namespaces("policy")[0]

	// Broad RBAC, so that every refusal below is the policy's.
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: h.name("all-secrets")},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"*"}}},
	}
	_, err := admin.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{})
	h.must(err)
	t.Cleanup(func() {
		_ = admin.RbacV1().ClusterRoles().Delete(context.Background(), role.Name, metav1.DeleteOptions{})
	})
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role.Name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: hubServiceAcctUser}},
	}
	_, err = admin.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{})
	h.must(err)
	t.Cleanup(func() {
		_ = admin.RbacV1().ClusterRoleBindings().Delete(context.Background(), binding.Name, metav1.DeleteOptions{})
	})
	cfg := rest.CopyConfig(hubConfig)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: hubServiceAcctUser}
	hubsync, err := kubernetes.NewForConfig(cfg)
	h.must(err)
	h.eventually("RBAC in effect", func() error {
		_, err := hubsync.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{})
		return err
	})
	installAdmissionPolicy(ctx, t, admin, hubsync, ns)

	secret := func(name string, typ corev1.SecretType, labels map[string]string) *corev1.Secret {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels}, Type: typ,
			Data: map[string][]byte{"token": []byte("x")}}
	}
	copyLabels := map[string]string{labelSyncedFrom: "c1-app"}
	argoLabels := map[string]string{"argocd.argoproj.io/secret-type": "cluster", "app.kubernetes.io/managed-by": "hubsync", "hubsync.io/sink": "argocd"}
	refused := func(what string, err error) {
		t.Helper()
		if err == nil || !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "hubsync may only write") {
			t.Errorf("%s: got %v, want refused by the policy", what, err)
		}
	}
	allowed := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Errorf("%s: %v", what, err)
		}
	}
	s := hubsync.CoreV1().Secrets(ns)

	// hubsync's own Secrets.
	cp, err := s.Create(ctx, secret("c1-app", corev1.SecretTypeOpaque, copyLabels), metav1.CreateOptions{})
	allowed("create a credential copy", err)
	if cp != nil {
		cp.Data["token"] = []byte("y")
		cp, err = s.Update(ctx, cp, metav1.UpdateOptions{})
		allowed("update a credential copy", err)
	}
	_, err = s.Create(ctx, secret("argocd-c1", corev1.SecretTypeOpaque, argoLabels), metav1.CreateOptions{})
	allowed("create an Argo CD cluster Secret", err)
	kueueLabels := map[string]string{"app.kubernetes.io/managed-by": "hubsync", "hubsync.io/sink": "multikueue"}
	_, err = s.Create(ctx, secret("hubsync-kubeconfig-c1", corev1.SecretTypeOpaque, kueueLabels), metav1.CreateOptions{})
	allowed("create a kueue sink's kubeconfig Secret", err)

	// Anything else.
	_, err = s.Create(ctx, secret("plain", corev1.SecretTypeOpaque, nil), metav1.CreateOptions{})
	refused("create an unlabelled Secret", err)
	_, err = s.Create(ctx, secret("argo-other", corev1.SecretTypeOpaque, map[string]string{"argocd.argoproj.io/secret-type": "cluster", "app.kubernetes.io/managed-by": "someone", "hubsync.io/sink": "x"}), metav1.CreateOptions{})
	refused("create an Argo CD Secret managed by someone else", err)
	_, err = s.Create(ctx, secret("kubeconfig-c1", corev1.SecretTypeOpaque, kueueLabels), metav1.CreateOptions{})
	refused("create a Secret with a kueue sink's labels but not its name", err)
	tokenSecret := secret("mint", corev1.SecretTypeServiceAccountToken, copyLabels)
	tokenSecret.Annotations = map[string]string{corev1.ServiceAccountNameKey: "default"}
	_, err = s.Create(ctx, tokenSecret, metav1.CreateOptions{})
	if err == nil || !strings.Contains(err.Error(), "only write Opaque") {
		t.Errorf("create a service-account token Secret with hubsync's label: got %v, want refused as not Opaque", err)
	}
	if cp != nil {
		stripped := cp.DeepCopy()
		stripped.Labels = nil
		_, err = s.Update(ctx, stripped, metav1.UpdateOptions{})
		refused("strip the labels of a copy", err)
	}

	// Someone else's Secret: hubsync can neither take it over nor delete it.
	theirs, err := admin.CoreV1().Secrets(ns).Create(ctx, secret("theirs", corev1.SecretTypeOpaque, nil), metav1.CreateOptions{})
	h.must(err) // other users are not affected
	taken := theirs.DeepCopy()
	taken.Labels = copyLabels
	_, err = s.Update(ctx, taken, metav1.UpdateOptions{})
	refused("label and overwrite someone else's Secret", err)
	refused("delete someone else's Secret", s.Delete(ctx, "theirs", metav1.DeleteOptions{}))
	got, err := admin.CoreV1().Secrets(ns).Get(ctx, "theirs", metav1.GetOptions{})
	h.must(err)
	if len(got.Labels) != 0 || string(got.Data["token"]) != "x" {
		t.Errorf("someone else's Secret changed: %+v", got)
	}

	// hubsync deletes its own.
	allowed("delete a credential copy", s.Delete(ctx, "c1-app", metav1.DeleteOptions{}))
	allowed("delete an Argo CD cluster Secret", s.Delete(ctx, "argocd-c1", metav1.DeleteOptions{}))
	allowed("delete a kueue sink's kubeconfig Secret", s.Delete(ctx, "hubsync-kubeconfig-c1", metav1.DeleteOptions{}))
}
