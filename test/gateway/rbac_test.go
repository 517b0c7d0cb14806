package gateway

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	gw "github.com/hubsync/hubsync/gateway"
	"github.com/hubsync/hubsync/test/testutil"
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
	testutil.Eventually(t, 20*time.Second, 50*time.Millisecond, func() error {
		id, ok, err := (gw.TokenReviewer{Kube: kube}).Review(ctx, tr.Status.Token)
		if err != nil || !ok || id.Username != "system:serviceaccount:default:rbac-probe" {
			return fmt.Errorf("%+v %v %v", id, ok, err)
		}
		return nil
	}, "TokenReview as %s", user)
	keys := &gw.KeySet{Fetch: func(ctx context.Context) ([]byte, error) {
		return kube.CoreV1().RESTClient().Get().AbsPath("/openid/v1/jwks").DoRaw(ctx)
	}}
	jws, err := jose.ParseSigned(tr.Status.Token, []jose.SignatureAlgorithm{jose.RS256, jose.ES256})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok, err := keys.Verify(ctx, jws); err != nil || !ok {
		t.Fatalf("verifying a hub token with the hub's keys read as %s: %v %v; want verified", user, ok, err)
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

// TestHubFlowControl applies deploy/gateway/flowcontrol.yaml to the real
// hub and checks, from the API server's own answer headers, that the
// gateway's TokenReviews and key reads made as hubsync's ServiceAccount
// land in the gateway's priority level, and hubsync's other requests do
// not.
func TestHubFlowControl(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin := kubernetes.NewForConfigOrDie(env.hub.Config)
	data, err := os.ReadFile(filepath.Join("..", "..", "deploy", "gateway", "flowcontrol.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var level flowcontrolv1.PriorityLevelConfiguration
	var schema flowcontrolv1.FlowSchema
	for _, into := range []any{&level, &schema} {
		if err := dec.Decode(into); err != nil {
			t.Fatal(err)
		}
	}
	created, err := admin.FlowcontrolV1().PriorityLevelConfigurations().Create(ctx, &level, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = admin.FlowcontrolV1().PriorityLevelConfigurations().Delete(context.Background(), level.Name, metav1.DeleteOptions{})
	})
	if _, err := admin.FlowcontrolV1().FlowSchemas().Create(ctx, &schema, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = admin.FlowcontrolV1().FlowSchemas().Delete(context.Background(), schema.Name, metav1.DeleteOptions{})
	})

	sa := schema.Spec.Rules[0].Subjects[0].ServiceAccount
	asHubsync := rest.CopyConfig(env.hub.Config)
	asHubsync.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + sa.Namespace + ":" + sa.Name,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + sa.Namespace, "system:authenticated"}}
	rt, err := rest.TransportFor(asHubsync)
	if err != nil {
		t.Fatal(err)
	}
	// level returns the UID of the priority level the API server put a
	// request in (whatever its answer: the level is chosen before
	// authorization).
	levelOf := func(method, path, body string) string {
		req, _ := http.NewRequestWithContext(ctx, method, strings.TrimSuffix(env.hub.Config.Host, "/")+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := rt.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		return resp.Header.Get("X-Kubernetes-Pf-Prioritylevel-Uid")
	}
	review := `{"apiVersion":"authentication.k8s.io/v1","kind":"TokenReview","spec":{"token":"x"}}`
	// The API server takes up a new schema within moments.
	testutil.Eventually(t, 30*time.Second, 100*time.Millisecond, func() bool {
		return levelOf(http.MethodPost, "/apis/authentication.k8s.io/v1/tokenreviews", review) == string(created.UID)
	}, "hubsync's TokenReviews are not in priority level %s", level.Name)
	if got := levelOf(http.MethodGet, "/openid/v1/jwks", ""); got != string(created.UID) {
		t.Errorf("hubsync's reads of the hub's keys are in priority level %s; want %s", got, created.UID)
	}
	for _, p := range []string{"/apis/multicluster.x-k8s.io/v1alpha1/clusterprofiles", "/api/v1/namespaces/default/secrets"} {
		if got := levelOf(http.MethodGet, p, ""); got == string(created.UID) || got == "" {
			t.Errorf("GET %s by hubsync is in priority level %q; want another than the gateway's", p, got)
		}
	}
}
