package kueue_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/hubsync/hubsync/test/controlplane"
	"github.com/hubsync/hubsync/test/testutil"
)

// workerNS holds the worker cluster's ServiceAccounts that the managed
// service accounts stand for.
const workerNS = "open-cluster-management-agent-addon"

// workloadsPath is the path of every request Kueue's remote client makes
// to a worker: its Workload watch and its garbage collector's lists.
// Nothing else in the test touches Workloads there.
const workloadsPath = "/apis/kueue.x-k8s.io/v1beta2/workloads"

// worker is the worker cluster: a real kube-apiserver whose
// ServiceAccounts are the identities hubsync's credentials carry.
type worker struct {
	m    *controlplane.Managed
	kube kubernetes.Interface
}

// server is the worker's URL, as its ManagedCluster reports it.
func (w *worker) server() string { return "https://" + w.m.Address }

// identity creates the ServiceAccount sa, allowed what Kueue's remote
// client does (workerRole).
func (w *worker) identity(t *testing.T, sa string) {
	t.Helper()
	ctx := t.Context()
	if err := controlplane.CreateServiceAccount(ctx, w.m.Config, workerNS, sa); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: workerRole + "-" + sa},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: workerRole},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: workerNS, Name: sa}},
	}
	if _, err := w.kube.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// mint returns a new token of sa, bound to a new Secret named name.
func (w *worker) mint(t *testing.T, sa, name string) controlplane.BoundToken {
	t.Helper()
	tok, err := controlplane.MintBoundToken(t.Context(), w.m.Config, workerNS, sa, name, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// revoke revokes tok and waits until the worker refuses it. It returns
// when the refusal was first seen.
func (w *worker) revoke(t *testing.T, tok controlplane.BoundToken) time.Time {
	t.Helper()
	if _, err := controlplane.RevokeBoundToken(t.Context(), w.m.Config, tok, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	return time.Now()
}

// request is one audited request to the worker's Workloads API.
type request struct {
	verb     string
	username string
	jti      string
	code     int
	at       time.Time
}

// auditEvent is what the test reads of an audit log line.
type auditEvent struct {
	Stage      string `json:"stage"`
	RequestURI string `json:"requestURI"`
	Verb       string `json:"verb"`
	User       struct {
		Username string              `json:"username"`
		Extra    map[string][]string `json:"extra"`
	} `json:"user"`
	ResponseStatus *struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
	StageTimestamp metav1.MicroTime `json:"stageTimestamp"`
}

// workloadRequests returns the worker's audited requests to its Workloads
// API, once each: what Kueue's remote clients did there. A request whose
// authentication failed has no user.
func (w *worker) workloadRequests() ([]request, error) {
	text, err := w.m.AuditLog()
	if err != nil {
		return nil, err
	}
	var out []request
	for _, line := range strings.Split(text, "\n") {
		if !strings.Contains(line, workloadsPath) {
			continue
		}
		var e auditEvent
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			return nil, fmt.Errorf("audit log line: %w", err)
		}
		// A watch is audited when its response starts and again when it
		// ends; the first says whether it was accepted.
		first := e.Stage == "ResponseComplete" && e.Verb != "watch" || e.Stage == "ResponseStarted"
		if !strings.HasPrefix(e.RequestURI, workloadsPath) || !first || e.ResponseStatus == nil {
			continue
		}
		r := request{verb: e.Verb, username: e.User.Username, code: e.ResponseStatus.Code, at: e.StageTimestamp.Time}
		r.jti = controlplane.CredentialJTI(e.User.Extra)
		out = append(out, r)
	}
	return out, nil
}

// requestsSince returns Kueue's requests to the worker's Workloads API
// since t0.
func (w *worker) requestsSince(t0 time.Time) ([]request, error) {
	all, err := w.workloadRequests()
	if err != nil {
		return nil, err
	}
	var out []request
	for _, r := range all {
		if !r.at.Before(t0) {
			out = append(out, r)
		}
	}
	return out, nil
}

// servedWith counts the requests in reqs that the worker served, made
// with tok.
func servedWith(reqs []request, tok controlplane.BoundToken) int {
	n := 0
	for _, r := range reqs {
		if r.code == 200 && r.jti == tok.JTI {
			n++
		}
	}
	return n
}

// usedAfter waits until the worker has served n Workloads requests of
// Kueue's made with tok since t0, and returns every request Kueue made
// since t0.
func (w *worker) usedAfter(t *testing.T, tok controlplane.BoundToken, t0 time.Time, n int, within time.Duration) []request {
	t.Helper()
	var since []request
	testutil.Eventually(t, within, 250*time.Millisecond, func() error {
		var err error
		if since, err = w.requestsSince(t0); err != nil {
			return err
		}
		if got := servedWith(since, tok); got < n {
			return fmt.Errorf("%d of %d requests made with token %s since %s (%d requests in all)", got, n, tok.Secret, t0.Format(time.RFC3339Nano), len(since))
		}
		return nil
	}, "Kueue's remote client for %s used token %s", tok.ServiceAccount, tok.Secret)
	return since
}

// keepsWorking waits until Kueue's remote client has reached the worker
// three times with tok since t0 (its garbage collector lists every
// gcInterval), and fails t if any Workloads request since t0 was refused
// or, from tok's ServiceAccount, made with another token.
func (w *worker) keepsWorking(t *testing.T, tok controlplane.BoundToken, t0 time.Time) {
	t.Helper()
	since := w.usedAfter(t, tok, t0, 3, 30*time.Second)
	for _, r := range since {
		switch {
		case r.code >= 400:
			t.Errorf("the worker answered Kueue's %s of Workloads with %d at %s (user %q)", r.verb, r.code, r.at.Format(time.RFC3339Nano), r.username)
		case r.username == "system:serviceaccount:"+workerNS+":"+tok.ServiceAccount && r.jti != tok.JTI:
			t.Errorf("Kueue's client of %s used a token other than %s at %s", tok.ServiceAccount, tok.Secret, r.at.Format(time.RFC3339Nano))
		}
	}
}
