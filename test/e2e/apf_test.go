package e2e

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/syncer"
	"github.com/hubsync/hubsync/test/testutil"
)

// TestPriorityAndFairness: with the default hub.qps (no client-side
// limit) hubsync runs at the API server's pace. Under a priority level that
// admits a few of its requests at a time and rejects the rest with 429,
// it still converges every profile: client-go waits out each Retry-After.
func TestPriorityAndFairness(t *testing.T) {
	def := config.Default().Hub
	if def.QPS != -1 {
		t.Fatalf("default hub.qps = %v; this test proves the default of no client-side limit", def.QPS)
	}
	admin := newHarnessWithoutSyncer(t)
	ctx, kube := admin.ctx, admin.hub.Kube
	user := admin.name("apf-user")
	level := admin.name("apf-level")

	// The user may do anything (RBAC is not under test here)...
	crb := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: user},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}},
	}
	_, err := kube.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{})
	admin.must(err)
	t.Cleanup(func() {
		_ = kube.RbacV1().ClusterRoleBindings().Delete(context.Background(), crb.Name, metav1.DeleteOptions{})
	})
	// ...but only a few of its requests at once: the rest are rejected.
	plc := &flowcontrolv1.PriorityLevelConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: level},
		Spec: flowcontrolv1.PriorityLevelConfigurationSpec{
			Type: flowcontrolv1.PriorityLevelEnablementLimited,
			Limited: &flowcontrolv1.LimitedPriorityLevelConfiguration{
				NominalConcurrencyShares: ptr.To[int32](1),
				LendablePercent:          ptr.To[int32](0),
				// No borrowing from idle levels: a few seats, strictly.
				BorrowingLimitPercent: ptr.To[int32](0),
				LimitResponse:         flowcontrolv1.LimitResponse{Type: flowcontrolv1.LimitResponseTypeReject},
			},
		},
	}
	plc, err = kube.FlowcontrolV1().PriorityLevelConfigurations().Create(ctx, plc, metav1.CreateOptions{})
	admin.must(err)
	t.Cleanup(func() {
		_ = kube.FlowcontrolV1().PriorityLevelConfigurations().Delete(context.Background(), level, metav1.DeleteOptions{})
	})
	all := []string{flowcontrolv1.VerbAll}
	fs := &flowcontrolv1.FlowSchema{
		ObjectMeta: metav1.ObjectMeta{Name: level},
		Spec: flowcontrolv1.FlowSchemaSpec{
			PriorityLevelConfiguration: flowcontrolv1.PriorityLevelConfigurationReference{Name: level},
			MatchingPrecedence:         100,
			DistinguisherMethod:        &flowcontrolv1.FlowDistinguisherMethod{Type: flowcontrolv1.FlowDistinguisherMethodByUserType},
			Rules: []flowcontrolv1.PolicyRulesWithSubjects{{
				Subjects: []flowcontrolv1.Subject{{Kind: flowcontrolv1.SubjectKindUser, User: &flowcontrolv1.UserSubject{Name: user}}},
				ResourceRules: []flowcontrolv1.ResourcePolicyRule{{
					Verbs: all, APIGroups: []string{flowcontrolv1.APIGroupAll}, Resources: []string{flowcontrolv1.ResourceAll},
					ClusterScope: true, Namespaces: []string{flowcontrolv1.NamespaceEvery},
				}},
				NonResourceRules: []flowcontrolv1.NonResourcePolicyRule{{Verbs: all, NonResourceURLs: []string{flowcontrolv1.NonResourceAll}}},
			}},
		},
	}
	_, err = kube.FlowcontrolV1().FlowSchemas().Create(ctx, fs, metav1.CreateOptions{})
	admin.must(err)
	t.Cleanup(func() {
		_ = kube.FlowcontrolV1().FlowSchemas().Delete(context.Background(), level, metav1.DeleteOptions{})
	})

	// hubsync's client as the daemon builds it by default.
	as := rest.CopyConfig(hubConfig)
	as.Impersonate = rest.ImpersonationConfig{UserName: user}
	as.QPS, as.Burst = def.QPS, def.Burst
	// The API server names the priority level a request was given.
	probe := rest.CopyConfig(as)
	var gotLevel string
	probe.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			resp, err := rt.RoundTrip(r)
			if err == nil {
				gotLevel = resp.Header.Get("X-Kubernetes-PF-PriorityLevel-UID")
			}
			return resp, err
		})
	})
	pc, err := rest.HTTPClientFor(probe)
	admin.must(err)
	err = testutil.Poll(ctx, 30*time.Second, 50*time.Millisecond, func() bool {
		resp, err := pc.Get(probe.Host + "/api/v1/namespaces?limit=1")
		if err == nil {
			resp.Body.Close()
		}
		return gotLevel == string(plc.UID)
	})
	if err != nil {
		t.Fatalf("the flow schema is not in effect: requests get priority level %q, want %q", gotLevel, plc.UID)
	}
	rejected := func() float64 { return apfRejected(t, level) }
	before := rejected()

	// A fleet whose initial sync needs far more concurrent writes than
	// the level admits.
	h := newHarness(t, withSyncerConfig(as), withOptions(func(o *syncer.Options) { o.Workers = 32 }))
	ns := h.namespaces("a", "b")
	set := h.name("set")
	h.must(h.hub.CreateExclusiveSet(h.ctx, set))
	var names []string
	for i := range 40 {
		names = append(names, h.name(fmt.Sprintf("c%02d", i)))
		h.cluster(names[i], set, nil)
	}
	start := time.Now()
	for _, n := range ns {
		h.must(h.hub.Bind(h.ctx, n, set, true))
	}
	err = testutil.Poll(h.ctx, 3*time.Minute, 100*time.Millisecond, func() bool {
		for _, n := range ns {
			got, err := h.hub.ProfileNames(h.ctx, n)
			if err != nil || len(got) != len(names) {
				return false
			}
		}
		return true
	})
	if err != nil {
		t.Fatalf("profiles did not converge under Priority and Fairness\n%s", h.logs.String())
	}
	for _, n := range ns {
		h.expectProfiles(n, names...)
	}
	r := rejected() - before
	t.Logf("%d profiles converged in %s; the API server rejected %v of hubsync's requests with 429", len(ns)*len(names), time.Since(start).Round(time.Millisecond), r)
	if r == 0 {
		t.Fatal("no request was rejected: the priority level did not limit hubsync, so this test proves nothing")
	}
}

// apfRejected sums the API server's count of requests rejected at a
// priority level.
func apfRejected(t *testing.T, level string) float64 {
	t.Helper()
	c, err := kubernetes.NewForConfig(hubConfig)
	if err != nil {
		t.Fatal(err)
	}
	body, err := c.Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	m, err := testutil.ParseMetrics(string(body))
	if err != nil {
		t.Fatal(err)
	}
	return m.Value("apiserver_flowcontrol_rejected_requests_total", testutil.Labels{"priority_level": level})
}
