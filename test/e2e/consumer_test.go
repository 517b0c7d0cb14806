package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	clusterv1 "open-cluster-management.io/api/cluster/v1"
	cpv1alpha1 "sigs.k8s.io/cluster-inventory-api/apis/v1alpha1"
	"sigs.k8s.io/cluster-inventory-api/pkg/access"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/hub"
	"github.com/hubsync/hubsync/syncer"
	"github.com/hubsync/hubsync/test/controlplane"
	"github.com/hubsync/hubsync/test/fleet"
	"github.com/hubsync/hubsync/test/testutil"
)

// TestConsumerPathSurvivesRotation is the real consumer path, end to end:
// a second kube-apiserver plays a managed cluster; its service-account
// tokens travel through an MSA token Secret on the hub, hubsync's copy in a
// consumer namespace and the `hubsync creds` exec plugin into a client
// built by cluster-inventory-api's pkg/access from the ClusterProfile that
// hubsync wrote, exactly as a consumer (MultiKueue, Argo CD, ...) builds it.
// The token is rotated and the old one revoked while that one long-lived
// client keeps working: not a single request may fail.
//
// A second long-lived client runs beside it with the same plugin minus the
// expirationTimestamp (what upstream cp-creds prints): it must see a 401
// after the revocation, which shows the test would catch a plugin that
// does not make client-go refresh in time.
func TestConsumerPathSurvivesRotation(t *testing.T) {
	start := time.Now()
	bin := testutil.Hubsync(t)
	t.Logf("hubsync built in %s", time.Since(start).Round(time.Millisecond))

	// The managed cluster: a real kube-apiserver of its own.
	mstart := time.Now()
	m := startManagedCluster(t)
	t.Logf("managed cluster's kube-apiserver ready in %s", time.Since(mstart).Round(time.Millisecond))

	h := newHarness(t, withCredentials(t), withOptions(func(o *syncer.Options) {
		o.AccessProviders = []config.AccessProvider{{Name: manager, Type: config.ProviderDirect}}
	}))
	const msaName = "consumer"
	ns := h.namespaces("consumer")[0]
	set := h.name("set")
	cluster := h.name("managed")
	copyName := hub.CopyName(cluster, msaName)
	h.must(h.hub.CreateExclusiveSet(h.ctx, set))
	h.cluster(cluster, set, nil)
	h.must(h.hub.UpdateCluster(h.ctx, cluster, func(c *clusterv1.ManagedCluster) {
		c.Spec.ManagedClusterClientConfigs = []clusterv1.ClientConfig{{URL: m.cfg.Host, CABundle: m.cfg.CAData}}
	}))
	h.must(h.hub.Bind(h.ctx, ns, set, true))

	tokA := m.mintToken(t, "token-a")
	tokB := m.mintToken(t, "token-b")

	_, err := h.hub.CreateMSA(h.ctx, cluster, msaName, true)
	h.must(err)
	h.must(h.hub.PutToken(h.ctx, cluster, msaName, "", map[string][]byte{
		hub.TokenKey: []byte(tokA.Token), hub.CAKey: m.cfg.CAData,
	}))
	// The agent reports the token's expiry in the MSA status, and hubsync
	// prefers it to the JWT's exp claim. Token A is really valid for ten
	// minutes (the TokenRequest minimum), but the status declares that it
	// expires in 8 s: it stands in for a short-lived token, so that the
	// client has to refresh during the test rather than ten minutes later.
	expA := time.Now().Add(8 * time.Second).UTC().Truncate(time.Second)
	h.must(h.hub.SetMSAExpiration(h.ctx, cluster, msaName, expA))

	h.eventually("profile with the direct access provider", func() error {
		p, err := h.hub.Profiles.ApisV1alpha1().ClusterProfiles(ns).Get(h.ctx, cluster, metav1.GetOptions{})
		if err != nil {
			return err
		}
		e := entry(p, manager)
		if e == nil || e.Cluster.Server != m.cfg.Host || string(e.Cluster.CertificateAuthorityData) != string(m.cfg.CAData) {
			return fmt.Errorf("access provider %+v", e)
		}
		if len(e.Cluster.Extensions) != 1 || e.Cluster.Extensions[0].Name != hub.ExecExtensionKey {
			return fmt.Errorf("exec extension %+v", e.Cluster.Extensions)
		}
		return nil
	})
	expectCopy(h, ns, copyName, tokA.Token, expA)

	// Exactly what a consumer does: a provider file in pkg/access's format,
	// loaded with NewFromFile, and BuildConfigFromCP on the profile.
	dir := t.TempDir()
	hubKubeconfig := filepath.Join(dir, "hub.kubeconfig")
	h.must(fleet.WriteKubeconfig(hubConfig, hubKubeconfig))
	plugin := providerFile(t, dir, "providers.json", bin, ns, hubKubeconfig)
	// The contrast: the same plugin with expirationTimestamp removed from
	// its output, as upstream cp-creds prints it.
	noExpiry := filepath.Join(dir, "creds-without-expiry")
	h.must(os.WriteFile(noExpiry, []byte("#!/bin/sh\nout=$(\""+bin+"\" \"$@\") || exit $?\n"+
		"printf '%s\\n' \"$out\" | sed -e 's/\"expirationTimestamp\":\"[^\"]*\",\\{0,1\\}//'\n"), 0o700))
	contrastPlugin := providerFile(t, dir, "providers-no-expiry.json", noExpiry, ns, hubKubeconfig)

	profile := h.profile(ns, cluster)
	consumer := &apiProbe{name: "consumer", client: consumerClient(t, plugin, profile)}
	contrast := &apiProbe{name: "no-expiry", client: consumerClient(t, contrastPlugin, profile)}

	loopCtx, stopLoop := context.WithCancel(h.ctx)
	var wg sync.WaitGroup
	for _, p := range []*apiProbe{consumer, contrast} {
		wg.Add(1)
		go func() { defer wg.Done(); p.run(loopCtx, 100*time.Millisecond) }()
	}
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			stopLoop()
			wg.Wait()
		}
	}
	t.Cleanup(stop)
	loopStart := time.Now()

	// Let the client work with token A for a moment.
	h.eventually("requests made with token A", func() error {
		if n := consumer.okWith(tokA.JTI); n < 5 {
			return fmt.Errorf("%d successful requests with token A", n)
		}
		return nil
	})

	// Rotate, as the agent does: the new token into the hub Secret, then
	// its expiry into the MSA status.
	rotated := time.Now()
	h.must(h.hub.PutToken(h.ctx, cluster, msaName, "", map[string][]byte{
		hub.TokenKey: []byte(tokB.Token), hub.CAKey: m.cfg.CAData,
	}))
	expB := time.Now().Add(10 * time.Minute).UTC().Truncate(time.Second)
	h.must(h.hub.SetMSAExpiration(h.ctx, cluster, msaName, expB))
	expectCopy(h, ns, copyName, tokB.Token, expB)
	t.Logf("copy holds token B %s after the rotation", time.Since(rotated).Round(time.Millisecond))

	// The plugin told client-go that token A expires shortly before expA:
	// by then (with a little slack) the client must have run it again and
	// got token B.
	err = testutil.Poll(h.ctx, time.Until(expA.Add(3*time.Second)), 100*time.Millisecond, func() error {
		if consumer.okWith(tokB.JTI) == 0 {
			return fmt.Errorf("the consumer client made no request with token B %s after token A's declared expiry", time.Since(expA).Round(time.Millisecond))
		}
		if id := consumer.lastCredential(); id != tokB.JTI {
			return fmt.Errorf("the consumer client still uses %q after token A's declared expiry, want token B's %q", id, tokB.JTI)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	// Revoke A: deleting the Secret it is bound to invalidates it.
	revoked := time.Now()
	rejectedAfter := m.revoke(t, tokA)
	t.Logf("token A rejected %s after its bound Secret was deleted", rejectedAfter.Round(time.Millisecond))

	// kube-apiserver caches successful token authentications for about
	// 10 s: keep going until the consumer client has succeeded past the
	// rejection seen above. The contrast client held on to token A (no
	// expiry): it must have hit the revocation, and recovered with B on
	// the plugin's next run.
	contrastErr := testutil.Poll(h.ctx, time.Until(revoked.Add(max(12*time.Second, rejectedAfter+2*time.Second)))+10*time.Second, 100*time.Millisecond, func() error {
		if !consumer.lastSuccess().After(revoked.Add(rejectedAfter + time.Second)) {
			return fmt.Errorf("the consumer client has not yet run past the rejection")
		}
		if len(contrast.failed()) == 0 {
			return fmt.Errorf("no failure yet")
		}
		if contrast.okWith(tokB.JTI) == 0 {
			return fmt.Errorf("not recovered with token B yet")
		}
		return nil
	})
	stop()
	window := time.Since(loopStart)

	ok, fails := consumer.result()
	t.Logf("consumer client: %d successful requests, %d failed, over %s (credentials used: %s)",
		ok, len(fails), window.Round(time.Millisecond), consumer.credentialHistory(tokA.JTI, tokB.JTI))
	for _, f := range fails {
		t.Errorf("consumer request failed at +%s: %v", f.at.Sub(loopStart).Round(time.Millisecond), f.err)
	}
	if minOK := int(window / (400 * time.Millisecond)); ok < minOK {
		t.Errorf("consumer client made %d successful requests in %s, want at least %d", ok, window.Round(time.Millisecond), minOK)
	}
	if consumer.okWith(tokA.JTI) == 0 || consumer.okWith(tokB.JTI) == 0 {
		t.Errorf("consumer client did not use both tokens: %s", consumer.credentialHistory(tokA.JTI, tokB.JTI))
	}

	cok, cfails := contrast.result()
	t.Logf("no-expiry client: %d successful requests, %d failed (credentials used: %s)",
		cok, len(cfails), contrast.credentialHistory(tokA.JTI, tokB.JTI))
	if contrastErr != nil {
		t.Errorf("no-expiry client: %v: the revocation did not bite a client that keeps token A, so this test cannot tell a refreshing plugin from one that does not", contrastErr)
	}
	for _, f := range cfails {
		t.Logf("no-expiry client failed at +%s (%s after the revocation): %v", f.at.Sub(loopStart).Round(time.Millisecond), f.at.Sub(revoked).Round(time.Millisecond), f.err)
		if !apierrors.IsUnauthorized(f.err) || f.at.Before(revoked) {
			t.Errorf("no-expiry client: unexpected failure at +%s: %v", f.at.Sub(loopStart).Round(time.Millisecond), f.err)
		}
	}
}

// managedCluster is a second kube-apiserver standing in for a managed
// cluster, with a ServiceAccount allowed to list namespaces.
type managedCluster struct {
	cfg *rest.Config
	ns  string
	sa  string
}

func startManagedCluster(t *testing.T) *managedCluster {
	t.Helper()
	ctx := context.Background()
	cp, err := controlplane.Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cp.Stop(); err != nil {
			t.Errorf("managed cluster: %v", err)
		}
	})
	kube, err := kubernetes.NewForConfig(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	m := &managedCluster{cfg: cp.Config, ns: "open-cluster-management-agent-addon", sa: "consumer"}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(controlplane.CreateServiceAccount(ctx, cp.Config, m.ns, m.sa))
	_, err = kube.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "list-namespaces"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"namespaces"}, Verbs: []string{"get", "list"}}},
	}, metav1.CreateOptions{})
	must(err)
	_, err = kube.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "consumer-list-namespaces"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "list-namespaces"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: m.ns, Name: m.sa}},
	}, metav1.CreateOptions{})
	must(err)
	return m
}

// mintToken returns a new token of the ServiceAccount, valid for ten
// minutes (the least TokenRequest allows) and bound to a Secret named
// name.
func (m *managedCluster) mintToken(t *testing.T, name string) controlplane.BoundToken {
	t.Helper()
	tok, err := controlplane.MintBoundToken(t.Context(), m.cfg, m.ns, m.sa, name, 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// revoke revokes tok and waits until the managed cluster refuses it;
// it returns how long that took.
func (m *managedCluster) revoke(t *testing.T, tok controlplane.BoundToken) time.Duration {
	t.Helper()
	took, err := controlplane.RevokeBoundToken(t.Context(), m.cfg, tok, 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return took
}

// providerFile writes a pkg/access provider file whose provider runs
// command as the cp-creds compatible plugin, reading copies in namespace
// from the hub, and returns its path.
func providerFile(t *testing.T, dir, name, command, namespace, hubKubeconfig string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	file := map[string]any{"providers": []any{map[string]any{
		"name": manager,
		"execConfig": map[string]any{
			"apiVersion":         "client.authentication.k8s.io/v1",
			"command":            command,
			"args":               []string{"creds", "--managed-serviceaccount=consumer"},
			"provideClusterInfo": true,
			"env": []map[string]string{
				{"name": "NAMESPACE", "value": namespace},
				{"name": "KUBECONFIG", "value": hubKubeconfig},
			},
			"interactiveMode": "Never",
		},
	}}}
	data, err := json.MarshalIndent(file, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// consumerClient builds a long-lived clientset the way a consumer does.
func consumerClient(t *testing.T, providerFile string, profile *cpv1alpha1.ClusterProfile) kubernetes.Interface {
	t.Helper()
	conf, err := access.NewFromFile(providerFile)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := conf.BuildConfigFromCP(profile)
	if err != nil {
		t.Fatal(err)
	}
	// client-go's default of 5 requests/s would throttle the probe loop
	// (two requests every 100 ms); throttling never fails a request, but
	// it would thin out the sample.
	cfg.QPS, cfg.Burst = 50, 100
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// expectCopy waits until the consumer namespace's copy holds token with
// the given declared expiry.
func expectCopy(h *harness, ns, name, token string, exp time.Time) {
	h.t.Helper()
	h.eventually("copy "+ns+"/"+name+" with the current token", func() error {
		sec, err := h.hub.Kube.CoreV1().Secrets(ns).Get(h.ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if got, want := sec.Annotations[hub.AnnotationTokenFingerprint], hub.TokenFingerprint([]byte(token)); got != want {
			return fmt.Errorf("fingerprint %s, want %s", got, want)
		}
		if got, want := sec.Annotations[hub.AnnotationTokenExpiration], rfc3339(exp); got != want {
			return fmt.Errorf("expiration %s, want %s", got, want)
		}
		if string(sec.Data[hub.TokenKey]) != token {
			return fmt.Errorf("token data not current")
		}
		return nil
	})
}

// apiProbe lists namespaces on the managed cluster and asks who it is
// (SelfSubjectReview, for the JTI of the token used) over and over,
// recording every outcome.
type apiProbe struct {
	name   string
	client kubernetes.Interface

	mu       sync.Mutex
	ok       int
	failures []probeFailure
	byCred   map[string]int // successful identity checks per token JTI
	history  []string       // token JTIs in the order first used
	last     string         // token JTI of the latest identity check
	lastOK   time.Time      // when the latest request succeeded
}

type probeFailure struct {
	at  time.Time
	err error
}

func (p *apiProbe) run(ctx context.Context, every time.Duration) {
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		p.once(ctx)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func (p *apiProbe) once(ctx context.Context) {
	rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := p.client.CoreV1().Namespaces().List(rctx, metav1.ListOptions{})
	p.record(ctx, err, "")
	if err != nil {
		return
	}
	r, err := p.client.AuthenticationV1().SelfSubjectReviews().Create(rctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	cred := ""
	if err == nil {
		cred = controlplane.CredentialJTI(r.Status.UserInfo.Extra)
	}
	p.record(ctx, err, cred)
}

func (p *apiProbe) record(ctx context.Context, err error, cred string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case err == nil:
		p.ok++
		p.lastOK = time.Now()
		if cred != "" {
			if p.byCred == nil {
				p.byCred = map[string]int{}
			}
			if p.byCred[cred] == 0 {
				p.history = append(p.history, cred)
			}
			p.byCred[cred]++
			p.last = cred
		}
	case ctx.Err() != nil:
		// Stopped mid-request: not the client's failure.
	default:
		p.failures = append(p.failures, probeFailure{at: time.Now(), err: err})
	}
}

func (p *apiProbe) okWith(jti string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.byCred[jti]
}

func (p *apiProbe) lastSuccess() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lastOK
}

func (p *apiProbe) lastCredential() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.last
}

func (p *apiProbe) failed() []probeFailure {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]probeFailure(nil), p.failures...)
}

func (p *apiProbe) result() (int, []probeFailure) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ok, append([]probeFailure(nil), p.failures...)
}

// credentialHistory names the tokens used, in order, with their counts.
func (p *apiProbe) credentialHistory(jtiA, jtiB string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var parts []string
	for _, id := range p.history {
		name := id
		switch id {
		case jtiA:
			name = "A"
		case jtiB:
			name = "B"
		}
		parts = append(parts, fmt.Sprintf("%s x%d", name, p.byCred[id]))
	}
	if len(parts) == 0 {
		return "none reported"
	}
	return strings.Join(parts, " then ")
}
