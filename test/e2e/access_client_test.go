package e2e

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/kubernetes"
	clusterv1 "open-cluster-management.io/api/cluster/v1"

	"github.com/hubsync/hubsync/access"
	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/hub"
	"github.com/hubsync/hubsync/syncer"
	"github.com/hubsync/hubsync/test/controlplane"
	"github.com/hubsync/hubsync/test/fleet"
	"github.com/hubsync/hubsync/test/testutil"
)

// accessRotations is how many revoking rotations TestAccessPackageRevokingRotation
// makes (each waits up to ~10 s for kube-apiserver's token cache).
const accessRotations = 2

// TestAccessPackageRevokingRotation: three long-lived clients of one
// managed cluster (a real kube-apiserver) send requests continuously while
// the token of its ManagedServiceAccount rotates and the old token is
// revoked, twice; hubsync (the syncer) copies each token next to the
// ClusterProfile.
//   - A client built with package access from a running Source: it
//     switches to the new token as soon as the copy holds it, before the
//     old one is revoked; no request fails and none is refused.
//   - A client of a Source that is not started (no informer): it keeps the
//     old token until it is refused, then reads the copy, retries with the
//     new token, and so fails no request either.
//   - The control: the `hubsync creds` exec plugin through
//     cluster-inventory-api's pkg/access, as consumers use it today. The
//     token is valid for ten minutes, so client-go keeps it until a 401:
//     at least one failed request per rotation.
func TestAccessPackageRevokingRotation(t *testing.T) {
	bin := testutil.Hubsync(t)
	mstart := time.Now()
	m := startManagedCluster(t)
	t.Logf("managed cluster's kube-apiserver ready in %s", time.Since(mstart).Round(time.Millisecond))
	h := newHarness(t, withCredentials(t), withOptions(func(o *syncer.Options) {
		o.AccessProviders = []config.AccessProvider{{Name: manager, Type: config.ProviderDirect}}
	}))
	// The exec plugin's provider file names this ManagedServiceAccount.
	const msaName = "consumer"
	ns := h.namespaces("access")[0]
	set, cluster := h.name("set"), h.name("managed")
	h.must(h.hub.CreateExclusiveSet(h.ctx, set))
	h.cluster(cluster, set, nil)
	h.must(h.hub.UpdateCluster(h.ctx, cluster, func(c *clusterv1.ManagedCluster) {
		c.Spec.ManagedClusterClientConfigs = []clusterv1.ClientConfig{{URL: m.cfg.Host, CABundle: m.cfg.CAData}}
	}))
	h.must(h.hub.Bind(h.ctx, ns, set, true))
	tokens := []controlplane.BoundToken{m.mintToken(t, "access-token-0")}
	_, err := h.hub.CreateMSA(h.ctx, cluster, msaName, true)
	h.must(err)
	rotateCopy(h, m, ns, cluster, msaName, tokens[0])

	watching, watchingSrc := accessClient(h, ns, cluster, msaName, true)
	lazy, lazySrc := accessClient(h, ns, cluster, msaName, false)
	dir := t.TempDir()
	hubKubeconfig := dir + "/hub.kubeconfig"
	h.must(fleet.WriteKubeconfig(hubConfig, hubKubeconfig))
	plugin := &apiProbe{name: "exec plugin", client: consumerClient(t, providerFile(t, dir, "providers.json", bin, ns, hubKubeconfig), h.profile(ns, cluster))}
	probes := []*apiProbe{watching, lazy, plugin}

	loopCtx, stopLoop := context.WithCancel(h.ctx)
	var wg sync.WaitGroup
	for _, p := range probes {
		wg.Go(func() { p.run(loopCtx, 100*time.Millisecond) })
	}
	stop := sync.OnceFunc(func() { stopLoop(); wg.Wait() })
	t.Cleanup(stop)
	loopStart := time.Now()
	h.eventually("every client succeeds with the first token", func() error {
		for _, p := range probes {
			if p.okWith(tokens[0].JTI) < 3 {
				return fmt.Errorf("%s: %d successful requests with the first token", p.name, p.okWith(tokens[0].JTI))
			}
		}
		return nil
	})

	for i := range accessRotations {
		old, next := tokens[i], m.mintToken(t, fmt.Sprintf("access-token-%d", i+1))
		tokens = append(tokens, next)
		rotateCopy(h, m, ns, cluster, msaName, next)
		// The running Source's informer brings the new token before the
		// old one is revoked.
		testutil.Eventually(t, 5*time.Second, 20*time.Millisecond, func() error {
			if id := watching.lastCredential(); id != next.JTI {
				return fmt.Errorf("the access client still uses %q", id)
			}
			return nil
		}, "rotation %d: the access client (informer) switched to the new token", i+1)
		revokeAndWait(h, m, old, next, probes)
	}
	stop()
	window := time.Since(loopStart)

	for _, p := range []*apiProbe{watching, lazy} {
		ok, fails := p.result()
		t.Logf("%s: %d successful requests, %d failed, over %s", p.name, ok, len(fails), window.Round(time.Millisecond))
		for _, f := range fails {
			t.Errorf("%s: request failed at +%s: %v", p.name, f.at.Sub(loopStart).Round(time.Millisecond), f.err)
		}
		for _, tok := range tokens {
			if p.okWith(tok.JTI) == 0 {
				t.Errorf("%s made no request with %s", p.name, tok.Secret)
			}
		}
	}
	if st := watchingSrc.Stats(); st.Refused != 0 {
		t.Errorf("access client (informer): %+v: a request was refused, so the client did not switch before the revocation", st)
	}
	st := lazySrc.Stats()
	t.Logf("access client (no informer): %+v", st)
	if st.Retried < accessRotations {
		t.Errorf("access client (no informer): %+v: want a retry per rotation", st)
	}
	ok, fails := plugin.result()
	t.Logf("exec plugin: %d successful requests, %d failed (the control)", ok, len(fails))
	if len(fails) < accessRotations {
		t.Errorf("exec plugin: %d failed requests over %d revoking rotations; want at least one per rotation, or this test cannot tell", len(fails), accessRotations)
	}
	for _, f := range fails {
		t.Logf("exec plugin failed at +%s: %v", f.at.Sub(loopStart).Round(time.Millisecond), f.err)
		if !apierrors.IsUnauthorized(f.err) {
			t.Errorf("exec plugin: unexpected failure: %v", f.err)
		}
	}
}

// accessClient builds a long-lived client of cluster with package access,
// from a Source that runs its informer when started is true.
func accessClient(h *harness, ns, cluster, msaName string, started bool) (*apiProbe, *access.Source) {
	h.t.Helper()
	name := "access client (no informer)"
	if started {
		name = "access client (informer)"
	}
	logs := &fleet.LogBuffer{}
	h.watchLog(name, logs)
	src, err := access.New(hubConfig, access.Options{
		Namespace: ns, ManagedServiceAccount: msaName, Provider: manager,
		Logger: slog.New(slog.NewTextHandler(logs, nil)),
	})
	h.must(err)
	if started {
		done := make(chan error, 1)
		ctx, cancel := context.WithCancel(h.ctx)
		go func() { done <- src.Start(ctx) }()
		h.t.Cleanup(func() {
			cancel()
			if err := <-done; err != nil {
				h.t.Error(err)
			}
		})
		if !src.WaitForCacheSync(h.ctx) {
			h.t.Fatal("the Source's informer did not sync")
		}
	}
	cfg, err := src.ConfigForName(h.ctx, cluster)
	h.must(err)
	// client-go's default of 5 requests/s would thin out the probe loop.
	cfg.QPS, cfg.Burst = 50, 100
	c, err := kubernetes.NewForConfig(cfg)
	h.must(err)
	return &apiProbe{name: name, client: c}, src
}

// rotateCopy writes tok into the hub token Secret, as the agent does on a
// refresh, and waits until hubsync has copied it into ns.
func rotateCopy(h *harness, m *managedCluster, ns, cluster, msaName string, tok controlplane.BoundToken) {
	h.t.Helper()
	h.must(h.hub.PutToken(h.ctx, cluster, msaName, "", map[string][]byte{hub.TokenKey: []byte(tok.Token), hub.CAKey: m.cfg.CAData}))
	exp, ok := hub.JWTExpiry([]byte(tok.Token))
	if !ok {
		h.t.Fatalf("token %s has no exp claim", tok.Secret)
	}
	expectCopy(h, ns, hub.CopyName(cluster, msaName), tok.Token, exp)
}

// revokeAndWait revokes old, waits until the managed cluster refuses it
// (kube-apiserver caches a successful authentication for about 10 s), and
// then until every probe has succeeded with next after that.
func revokeAndWait(h *harness, m *managedCluster, old, next controlplane.BoundToken, probes []*apiProbe) {
	h.t.Helper()
	took := m.revoke(h.t, old)
	refused := time.Now()
	h.t.Logf("%s refused %s after its revocation", old.Secret, took.Round(time.Millisecond))
	testutil.Eventually(h.t, 20*time.Second, 100*time.Millisecond, func() error {
		for _, p := range probes {
			if !p.lastSuccess().After(refused.Add(time.Second)) || p.okWith(next.JTI) == 0 {
				return fmt.Errorf("%s has not yet succeeded with %s after the revocation", p.name, next.Secret)
			}
		}
		return nil
	}, "every client works with %s after %s was revoked", next.Secret, old.Secret)
}
