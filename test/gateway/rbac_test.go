package gateway

import (
	"context"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	gw "github.com/hubsync/hubsync/gateway"
)

// TestHubRBAC installs deploy/gateway/hub-rbac.yaml on the real hub and
// makes the gateway's hub calls as the ServiceAccount it binds: a
// TokenReview and the hub's service-account keys succeed with these
// rights, and the role grants nothing beyond them.
func TestHubRBAC(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin := kubernetes.NewForConfigOrDie(env.hub.Config)
	role, binding := roleAndBinding(t, "hub-rbac.yaml")
	sa := binding.Subjects[0]
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: sa.Namespace}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	user := "system:serviceaccount:" + sa.Namespace + ":" + sa.Name
	asHubsync := rest.CopyConfig(env.hub.Config)
	asHubsync.Impersonate = rest.ImpersonationConfig{UserName: user}
	kube := kubernetes.NewForConfigOrDie(asHubsync)

	// Without the role, the hub refuses hubsync's TokenReviews.
	if _, _, err := (gw.TokenReviewer{Kube: kube}).Review(ctx, "x"); !apierrors.IsForbidden(err) {
		t.Fatalf("TokenReview as %s before hub-rbac.yaml: %v; want Forbidden", user, err)
	}
	if _, err := admin.RbacV1().ClusterRoles().Create(ctx, &role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, &binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	// The gateway's two hub calls, as hubsync (the binding may take a
	// moment to reach the authorizer's cache).
	if _, err := admin.CoreV1().ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "rbac-probe"}},
		metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	tr, err := admin.CoreV1().ServiceAccounts("default").CreateToken(ctx, "rbac-probe", &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		id, ok, err := (gw.TokenReviewer{Kube: kube}).Review(ctx, tr.Status.Token)
		if err == nil && ok && id.Username == "system:serviceaccount:default:rbac-probe" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("TokenReview as %s: %+v %v %v", user, id, ok, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	keys := &gw.HubKeys{Fetch: func(ctx context.Context) ([]byte, error) {
		return kube.CoreV1().RESTClient().Get().AbsPath("/openid/v1/jwks").DoRaw(ctx)
	}}
	if kind, err := keys.Classify(ctx, tr.Status.Token); err != nil || kind != gw.TokenHub {
		t.Fatalf("classifying a hub token as %s: %v %v; want a hub token", user, kind, err)
	}

	// Nothing more: the role's rules are exactly those two.
	for _, a := range []authorizationv1.ResourceAttributes{
		{Group: "authentication.k8s.io", Resource: "tokenreviews", Verb: "delete"},
		{Resource: "secrets", Verb: "list"},
		{Group: "authorization.k8s.io", Resource: "subjectaccessreviews", Verb: "create"},
		{Resource: "serviceaccounts", Subresource: "token", Verb: "create", Namespace: "default"},
		{Resource: "users", Verb: "impersonate"},
	} {
		sar, err := admin.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: user, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + sa.Namespace, "system:authenticated"}, ResourceAttributes: &a,
		}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if sar.Status.Allowed {
			t.Errorf("%s may %s %s/%s: hub-rbac.yaml grants more than the gateway uses", user, a.Verb, a.Group, a.Resource)
		}
	}
	if len(role.Rules) != 2 {
		t.Errorf("hub-rbac.yaml's ClusterRole has %d rules; the gateway uses two (TokenReviews, the JWKS)", len(role.Rules))
	}
}
