package gateway

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/hubsync/hubsync/test/controlplane"
	"github.com/hubsync/hubsync/test/fleet"
	"github.com/hubsync/hubsync/test/leak"
	"github.com/hubsync/hubsync/test/pki"
	"github.com/hubsync/hubsync/test/testutil"
)

// The identities a managed cluster can see through the gateway.
const (
	seenImpersonated = "impersonated" // the MSA impersonating the prefixed hub identity
	seenOwn          = "own"          // the cluster's own token, passed through
	seenNothing      = "nothing"      // the request never reached the cluster
)

const (
	msaUser = "system:serviceaccount:" + msaNamespace + ":" + msaName
	ownUser = "system:serviceaccount:apps:own"
)

// selfSignedJWT is a service-account token for the cluster's issuer,
// signed with a key of the client's own.
func selfSignedJWT(t *testing.T, issuer, sub string) string {
	t.Helper()
	tok, err := pki.SelfSignedJWT(issuer, sub, "made-up")
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// seen reads the managed cluster's audit log for the requests whose URI
// holds marker and says which identity they arrived as. It first sends a
// sentinel request and waits for its event: the API server writes events
// as requests complete, so every earlier request is in the log by then.
func (s *setup) seen(t *testing.T, marker string) []string {
	t.Helper()
	sentinel := "sentinel-" + marker[len("probe-"):]
	if code, body := s.get(t, "/"+cluster+"/api/v1/namespaces/apps/configmaps/"+sentinel, "Bearer "+s.userToken, nil); code != http.StatusNotFound {
		t.Fatalf("sentinel: %d %s", code, body)
	}
	var events []controlplane.AuditEvent
	testutil.Eventually(t, 20*time.Second, 50*time.Millisecond, func() error {
		got, err := env.managed.AuditEvents(sentinel)
		if err != nil || len(got) == 0 {
			return fmt.Errorf("no audit event for the sentinel yet (%v)", err)
		}
		if events, err = env.managed.AuditEvents(marker); err != nil {
			return err
		}
		return nil
	})
	var out []string
	for _, e := range events {
		var who string
		switch {
		case e.ImpersonatedUser != nil && e.User.Username == msaUser && e.ImpersonatedUser.Username == prefixedUser:
			who = seenImpersonated
		case e.ImpersonatedUser == nil && e.User.Username == ownUser:
			who = seenOwn
		default:
			who = fmt.Sprintf("user %q", e.User.Username)
			if e.ImpersonatedUser != nil {
				who += fmt.Sprintf(" impersonating %q", e.ImpersonatedUser.Username)
			}
		}
		if !slices.Contains(out, who) {
			out = append(out, who)
		}
	}
	if len(out) == 0 {
		out = []string{seenNothing}
	}
	return out
}

// TestClientCannotChooseTheIdentity sends every way a client could try to
// add, remove or replace the identity a cluster sees (hop-by-hop lists,
// duplicates, spellings, trailers, protocol headers, the query string),
// as raw HTTP/1.1 and over HTTP/2, in both modes, and reads the real
// managed kube-apiserver's audit log for the identity that arrived.
func TestClientCannotChooseTheIdentity(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	s := start(t, ctx)
	own, err := env.managed.ServiceAccountToken(ctx, "apps", "own", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	s.h.NoteToken(own)
	forged := selfSignedJWT(t, "https://"+env.managed.Address, "system:serviceaccount:kube-system:clusterrole-aggregation-controller")
	hub := "Bearer " + s.userToken
	auth := func(v string) field { return field{"Authorization", v} }
	const cm = "/api/v1/namespaces/apps/configmaps/"
	const exec = "/api/v1/namespaces/apps/pods/"

	tests := []struct {
		name   string
		protos []string // h1, h2
		method string
		path   string // after /<cluster>; the marker is appended to the last segment
		query  string
		fields []field
		body   string
		want   string
	}{
		{name: "a hub identity", fields: []field{auth(hub)}, want: seenImpersonated},
		{name: "a cluster's own token", fields: []field{auth("Bearer " + own)}, want: seenOwn},
		{name: "a self-signed JWT", fields: []field{auth("Bearer " + forged)}, want: seenNothing},
		{name: "no token", want: seenNothing},

		// Hop-by-hop lists (HTTP/2 has no Connection header: Go's server
		// refuses one).
		{name: "Connection names Authorization, self-signed JWT", fields: []field{auth("Bearer " + forged), {"Connection", "keep-alive, Authorization"}}, want: seenNothing},
		{name: "Connection names Authorization, own token", fields: []field{auth("Bearer " + own), {"Connection", "keep-alive, Authorization"}}, want: seenNothing},
		{name: "Connection names Authorization, hub identity", fields: []field{auth(hub), {"Connection", "Authorization"}}, want: seenNothing},
		{name: "Connection names it in lower case, twice", fields: []field{auth(hub), {"connection", "close"}, {"connection", "authorization"}}, want: seenNothing},
		{name: "Connection names Impersonate-User", fields: []field{auth(hub), {"Connection", "Impersonate-User, Impersonate-Group"}}, want: seenNothing},
		{name: "an upgrade whose Connection names Authorization", protos: []string{"h1"}, path: exec, query: "/exec?command=id&stdout=true",
			fields: []field{auth("Bearer " + forged), {"Connection", "Upgrade, Authorization"}, {"Upgrade", "websocket"},
				{"Sec-WebSocket-Version", "13"}, {"Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="}, {"Sec-WebSocket-Protocol", "v5.channel.k8s.io"}}, want: seenNothing},
		{name: "Proxy-Authorization with a token", fields: []field{auth(hub), {"Proxy-Authorization", "Bearer " + own}}, want: seenNothing},
		{name: "Proxy-Authorization is hop-by-hop", fields: []field{auth(hub), {"Proxy-Authorization", "Basic eDp5"}}, want: seenImpersonated},
		{name: "an allowed Connection header", protos: []string{"h1"}, fields: []field{auth(hub), {"Connection", "keep-alive, TE"}, {"TE", "trailers"}}, want: seenImpersonated},

		// Identity headers, duplicates and spellings.
		{name: "Impersonate-User", fields: []field{auth(hub), {"Impersonate-User", "system:admin"}}, want: seenNothing},
		{name: "impersonate-group in lower case", fields: []field{auth("Bearer " + own), {"impersonate-group", "system:masters"}}, want: seenNothing},
		{name: "X-Remote-User", fields: []field{auth(hub), {"X-Remote-User", "system:admin"}, {"X-Remote-Group", "system:masters"}}, want: seenNothing},
		{name: "two Authorization headers", fields: []field{auth(hub), auth("Bearer " + own)}, want: seenNothing},
		{name: "two spellings of Authorization", fields: []field{auth("Bearer " + forged), {"authorization", hub}}, want: seenNothing},
		{name: "a bearer token in a WebSocket subprotocol", fields: []field{auth("Bearer " + forged),
			{"Sec-WebSocket-Protocol", "base64url.bearer.authorization.k8s.io." + base64.RawURLEncoding.EncodeToString([]byte(own))}}, want: seenNothing},
		{name: "request trailers naming Authorization", protos: []string{"h1"}, method: http.MethodPost, path: "/api/v1/namespaces/apps/configmaps",
			fields: []field{auth("Bearer " + own), {"Content-Type", "application/json"}, {"Transfer-Encoding", "chunked"}, {"Trailer", "Authorization"}},
			body:   "2\r\n{}\r\n0\r\nAuthorization: " + hub + "\r\n\r\n", want: seenNothing},

		// Credentials in the URL and in other headers.
		{name: "access_token in the query", query: "?access_token=" + s.userToken, fields: []field{auth(hub)}, want: seenNothing},
		{name: "the hub token in a query value", query: "?labelSelector=" + s.userToken, fields: []field{auth(hub)}, want: seenNothing},
		{name: "the hub token in another header", fields: []field{auth(hub), {"X-Debug", s.userToken}}, want: seenNothing},
	}
	for i, tt := range tests {
		protos := tt.protos
		if protos == nil {
			protos = []string{"h1", "h2"}
		}
		for _, proto := range protos {
			t.Run(tt.name+"/"+proto, func(t *testing.T) {
				marker := fmt.Sprintf("probe-%02d-%s", i, proto)
				path := tt.path
				if path == "" {
					path = cm
				}
				method := tt.method
				if method == "" {
					method = http.MethodGet
				}
				target := "/" + cluster + path + marker + tt.query
				if method == http.MethodPost {
					target = "/" + cluster + path + "?fieldManager=" + marker + strings.ReplaceAll(tt.query, "?", "&")
				}
				var ans rawAnswer
				var err error
				if proto == "h1" {
					ans, err = rawHTTP1(strings.TrimPrefix(s.url, "https://"), s.ca, method, target, tt.fields, tt.body)
				} else {
					ans, err = rawHTTP2(strings.TrimPrefix(s.url, "https://"), s.ca, method, target, tt.fields)
				}
				if err != nil {
					t.Fatal(err)
				}
				got := s.seen(t, marker)
				if !slices.Equal(got, []string{tt.want}) {
					t.Fatalf("the cluster saw %v; want %s (the gateway answered %d %s)", got, tt.want, ans.code, ans.body)
				}
				if tt.want == seenNothing && ans.code != 0 && (ans.code < 400 || ans.code >= 500) {
					t.Fatalf("a refused request answered %d %s; want 4xx from the gateway or a reset", ans.code, ans.body)
				}
				// Go's HTTP/2 server refuses a Connection header itself, in
				// plain text; every other refusal is the gateway's Status.
				goRefused := proto == "h2" && strings.Contains(ans.body, "is not valid in HTTP/2")
				if tt.want == seenNothing && ans.code != 0 && !goRefused && !strings.Contains(ans.body, `"kind":"Status"`) {
					t.Errorf("the refusal is not a Kubernetes Status: %s", ans.body)
				}
			})
		}
	}

	// No hub token reached the cluster in any form, in any request.
	audit, err := env.managed.AuditLog()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range leak.Tokens(audit, []string{s.userToken}) {
		t.Errorf("%s appears in the managed cluster's audit log", f)
	}
}

// TestSelfSignedTokensCostNothing: a JWT no key of the target cluster
// signs gets 401 from the gateway itself, the same whether or not the
// cluster exists, and neither reaches the cluster nor dials it, not even
// as an upgrade.
func TestSelfSignedTokensCostNothing(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s := start(t, ctx)
	forged := selfSignedJWT(t, "https://"+env.managed.Address, "system:serviceaccount:kube-system:admin")
	s.readClusterKeys(t, ctx)
	requests := s.metric(t, "hubsync_tunnel_requests_total", nil)
	dials := s.metric(t, "hubsync_tunnel_upgrade_dials_total", nil)
	addr := strings.TrimPrefix(s.url, "https://")
	var bodies []string
	for _, c := range []string{cluster, "no-such-cluster"} {
		for _, path := range []string{"/api/v1/namespaces", "/api/v1/namespaces/apps/pods/p1/exec?command=id&stdout=true"} {
			fields := []field{{"Authorization", "Bearer " + forged}}
			if strings.Contains(path, "/exec") {
				fields = append(fields, field{"Connection", "Upgrade"}, field{"Upgrade", "websocket"}, field{"Sec-WebSocket-Version", "13"},
					field{"Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="}, field{"Sec-WebSocket-Protocol", "v5.channel.k8s.io"})
			}
			ans, err := rawHTTP1(addr, s.ca, http.MethodGet, "/"+c+path, fields, "")
			if err != nil {
				t.Fatal(err)
			}
			if ans.code != http.StatusUnauthorized {
				t.Fatalf("%s%s: %d %s; want 401", c, path, ans.code, ans.body)
			}
			bodies = append(bodies, strings.ReplaceAll(ans.body, c, "<cluster>"))
		}
	}
	if bodies[0] != bodies[2] {
		t.Errorf("the answers tell an existing cluster from another:\n%s\n%s", bodies[0], bodies[2])
	}
	if n := s.metric(t, "hubsync_tunnel_requests_total", nil) - requests; n != 0 {
		t.Errorf("%v requests went through the pool for self-signed tokens (the key set was fetched before: none expected)", n)
	}
	if n := s.metric(t, "hubsync_tunnel_upgrade_dials_total", nil) - dials; n != 0 {
		t.Errorf("%v upgrade dials for self-signed tokens", n)
	}
}

// TestClusterKeyRotation: a cluster that starts signing its tokens with a
// new key (the old one still valid) keeps working through the gateway:
// a token naming a key id the gateway's copy of the cluster's key set
// lacks makes it fetch the set again, then pass the token; tokens of the
// old key pass throughout.
func TestClusterKeyRotation(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s := start(t, ctx)
	path := "/" + cluster + "/api/v1/namespaces/apps/configmaps"
	// passes reports whether token reached the cluster as itself: the
	// cluster refuses that ServiceAccount the ConfigMaps by name.
	passes := func(token string) error {
		code, body := s.get(t, path, "Bearer "+token, nil)
		if code != http.StatusForbidden || !strings.Contains(body, ownUser) {
			return fmt.Errorf("%d %s", code, body)
		}
		return nil
	}
	old, err := env.managed.ServiceAccountToken(ctx, "apps", "own", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	s.h.NoteToken(old)
	if err := passes(old); err != nil {
		t.Fatalf("a token of the cluster's key: %v", err)
	}
	fetches := s.metric(t, "hubsync_gateway_key_fetches_total", testutil.Labels{"keys": "cluster", "result": "ok"})
	if err := env.managed.RotateServiceAccountKey(ctx); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, time.Minute, 50*time.Millisecond, func() error {
		if code, body := s.get(t, path, "Bearer "+s.userToken, nil); code != http.StatusOK {
			return fmt.Errorf("the cluster is not served again: %d %s", code, body)
		}
		return nil
	})
	rotated, err := env.managed.ServiceAccountToken(ctx, "apps", "own", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	s.h.NoteToken(rotated)
	if err := passes(old); err != nil {
		t.Fatalf("a token of the old key after the rotation: %v", err)
	}
	// The key set is fetched again at most every 30 s: within a minute
	// the new key's tokens pass.
	testutil.Eventually(t, time.Minute, 50*time.Millisecond, func() error { return passes(rotated) })
	if n := s.metric(t, "hubsync_gateway_key_fetches_total", testutil.Labels{"keys": "cluster", "result": "ok"}) - fetches; n < 1 {
		t.Fatalf("the cluster's keys were not fetched again (%v fetches)", n)
	}
}

// TestSignedButRefusedTokensTravelAlone: tokens the cluster signed but
// refuses (another audience) reach it on connections of their own, so
// its 401 (after which kube-apiserver closes an HTTP/2 connection) never
// cuts the connection every other client of the cluster shares: a watch
// open through the gateway goes on, the pool dials nothing, and each
// refused token is answered from memory when sent again.
func TestSignedButRefusedTokensTravelAlone(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s := start(t, ctx)
	cfg, err := clientcmd.BuildConfigFromFlags("", s.gatewayKubeconfig(t, ctx))
	if err != nil {
		t.Fatal(err)
	}
	gw := kubernetes.NewForConfigOrDie(cfg)
	w, err := gw.CoreV1().ConfigMaps("apps").Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	dials := s.metric(t, "hubsync_tunnel_dials_total", testutil.Labels{"result": "ok"})
	var refused []string
	for i := range 10 {
		tok, err := env.managed.ServiceAccountToken(ctx, "apps", "own", time.Hour, fmt.Sprintf("not-this-cluster-%d", i))
		if err != nil {
			t.Fatal(err)
		}
		s.h.NoteToken(tok)
		refused = append(refused, tok)
	}
	path := "/" + cluster + "/api/v1/namespaces/apps/configmaps"
	for round := range 2 {
		for i, tok := range refused {
			if code, body := s.get(t, path, "Bearer "+tok, nil); code != http.StatusUnauthorized {
				t.Fatalf("round %d, token %d: %d %s; want the cluster's 401", round, i, code, body)
			}
		}
	}
	// The watch still delivers.
	name := runPrefix() + "after-refusals"
	mg := kubernetes.NewForConfigOrDie(env.managed.Config)
	if _, err := mg.CoreV1().ConfigMaps("apps").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.After(30 * time.Second)
	for seen := false; !seen; {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatal("the watch through the gateway ended: the shared connection was closed")
			}
			if cm, isCM := ev.Object.(*corev1.ConfigMap); isCM && cm.Name == name {
				seen = true
			}
		case <-deadline:
			t.Fatal("the watch did not see the new ConfigMap")
		}
	}
	if n := s.metric(t, "hubsync_tunnel_dials_total", testutil.Labels{"result": "ok"}) - dials; n != 0 {
		t.Errorf("the pool dialed %v connections while the refused tokens were sent: the shared one was closed", n)
	}
	if n := s.metric(t, "hubsync_gateway_refused_total", testutil.Labels{"reason": "cluster_refused_token"}); n < 10 {
		t.Errorf("%v requests answered from memory as refused by the cluster; want the second round's 10", n)
	}
}

// TestImpersonatorNeverActsAsItself: a token of the ServiceAccount the
// gateway impersonates with (a new one from the cluster's TokenRequest,
// not the very token the hub holds) is refused: that identity never acts
// as itself through the gateway, and the cluster sees nothing of it.
func TestImpersonatorNeverActsAsItself(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s := start(t, ctx)
	s.readClusterKeys(t, ctx)
	tok, err := env.managed.ServiceAccountToken(ctx, msaNamespace, msaName, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	s.h.NoteToken(tok)
	requests := s.metric(t, "hubsync_tunnel_requests_total", nil)
	code, body := s.get(t, "/"+cluster+"/api/v1/namespaces", "Bearer "+tok, nil)
	if code != http.StatusUnauthorized || !strings.Contains(body, "may not pass through") {
		t.Fatalf("the impersonator's own identity: %d %s; want 401", code, body)
	}
	if n := s.metric(t, "hubsync_tunnel_requests_total", nil) - requests; n != 0 {
		t.Errorf("%v requests reached the cluster", n)
	}
}

// TestReRegisteredClusterForgetsItsKeys: a cluster deleted and
// registered again under the same name, now another API server (a new
// uid, address and CA), does not accept the old cluster's tokens through
// the gateway: its key set is dropped with the old identity, so the old
// token is a stranger's (401 from the gateway) and never reaches the new
// cluster as a trial.
func TestReRegisteredClusterForgetsItsKeys(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s := start(t, ctx)
	name := runPrefix() + "again"
	s.join(t, ctx, name, env.managed2)
	t.Cleanup(func() { _ = s.h.DeleteCluster(context.Background(), name) })
	s.waitServed(t, name)
	old, err := env.managed2.ServiceAccountToken(ctx, "apps", "own", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	s.h.NoteToken(old)
	path := "/" + name + "/api/v1/namespaces/apps/configmaps"
	if code, body := s.get(t, path, "Bearer "+old, nil); code != http.StatusForbidden || !strings.Contains(body, ownUser) {
		t.Fatalf("the first cluster's own token: %d %s; want the cluster's 403 to it", code, body)
	}

	if err := s.h.DeleteCluster(ctx, name); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, time.Minute, 50*time.Millisecond, func() error {
		if code, _ := s.get(t, path, "Bearer "+s.userToken, nil); code == http.StatusOK {
			return fmt.Errorf("%s is still served", name)
		}
		return nil
	})
	s.join(t, ctx, name, env.managed)
	s.waitServed(t, name)
	trials := s.metric(t, "hubsync_gateway_trials_total", nil)
	if code, body := s.get(t, path, "Bearer "+old, nil); code != http.StatusUnauthorized {
		t.Fatalf("the old cluster's token after the name was registered again: %d %s; want 401", code, body)
	}
	if n := s.metric(t, "hubsync_gateway_trials_total", nil) - trials; n != 0 {
		t.Errorf("the old cluster's token reached the new cluster (%v trials): its key set was kept", n)
	}
}

// TestUnfetchableKeysTellNothingE2E: a served cluster whose keys cannot be
// fetched (its agent never connected, the hub holds no token for it)
// answers a stranger's JWT exactly as a cluster that does not exist.
func TestUnfetchableKeysTellNothingE2E(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s := start(t, ctx)
	dark := runPrefix() + "dark"
	if err := s.h.Namespace(ctx, dark); err != nil {
		t.Fatal(err)
	}
	if _, err := s.h.CreateCluster(ctx, fleet.ClusterSpec{Name: dark,
		Labels: fleet.ExclusiveSetLabels(consumerSet, map[string]string{"gateway-test": "yes"})}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.h.DeleteCluster(context.Background(), dark) })
	testutil.Eventually(t, time.Minute, 100*time.Millisecond, func() error {
		if v := s.metric(t, "hubsync_tunnel_entries", testutil.Labels{"state": "failing"}); v < 1 {
			return fmt.Errorf("no failing entry yet (%v)", v)
		}
		return nil
	})
	forged := selfSignedJWT(t, "https://"+env.managed.Address, "system:serviceaccount:kube-system:admin")
	var bodies []string
	for _, c := range []string{dark, "no-such-cluster"} {
		code, body := s.get(t, "/"+c+"/api/v1/namespaces", "Bearer "+forged, nil)
		if code != http.StatusUnauthorized {
			t.Fatalf("%s: %d %s; want 401", c, code, body)
		}
		bodies = append(bodies, strings.ReplaceAll(body, c, "<cluster>"))
	}
	if bodies[0] != bodies[1] {
		t.Errorf("the answers tell a served cluster without keys from one that does not exist:\n%s\n%s", bodies[0], bodies[1])
	}
}

// readClusterKeys sends a cluster's own token through the gateway, which
// reads the cluster's keys through the pool once: a test counting the
// pool's requests starts after it.
func (s *setup) readClusterKeys(t *testing.T, ctx context.Context) {
	t.Helper()
	own, err := env.managed.ServiceAccountToken(ctx, "apps", "own", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	s.h.NoteToken(own)
	if code, body := s.get(t, "/"+cluster+"/api/v1/namespaces/apps/configmaps", "Bearer "+own, nil); code != http.StatusForbidden {
		t.Fatalf("a cluster's own token: %d %s; want the cluster's 403 for what it may not read", code, body)
	}
}
