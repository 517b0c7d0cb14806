package e2e

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clusterv1 "open-cluster-management.io/api/cluster/v1"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/hub"
	"github.com/hubsync/hubsync/sinks"
	"github.com/hubsync/hubsync/sinks/kueue"
	"github.com/hubsync/hubsync/test/fleet"
	"github.com/hubsync/hubsync/test/leak"
	"github.com/hubsync/hubsync/test/testutil"
)

// installKueueCRDs installs minimal MultiKueueCluster and MultiKueueConfig
// CRDs (Kueue's module is not a dependency of this one; test/kueue runs
// Kueue's own): kueue.x-k8s.io/v1beta2, cluster-scoped, any fields, with
// the two rules of Kueue's schema that the kueue sink's objects must meet:
// exactly one cluster source, and one to twenty clusters in a config. They
// stay installed for the rest of the suite.
func installKueueCRDs(ctx context.Context, t *testing.T, dyn dynamic.Interface) {
	t.Helper()
	crds := dyn.Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"})
	for _, k := range []struct {
		kind, plural string
		spec         map[string]any
	}{
		{"MultiKueueCluster", "multikueueclusters", map[string]any{"type": "object", "properties": map[string]any{
			"clusterSource": map[string]any{
				"type": "object",
				"properties": map[string]any{
					"kubeConfig":        map[string]any{"type": "object", "x-kubernetes-preserve-unknown-fields": true},
					"clusterProfileRef": map[string]any{"type": "object", "x-kubernetes-preserve-unknown-fields": true},
				},
				"x-kubernetes-validations": []any{map[string]any{
					"rule": "has(self.kubeConfig) != has(self.clusterProfileRef)", "message": "exactly one of kubeConfig and clusterProfileRef",
				}},
			},
		}, "required": []any{"clusterSource"}}},
		{"MultiKueueConfig", "multikueueconfigs", map[string]any{"type": "object", "properties": map[string]any{
			"clusters": map[string]any{"type": "array", "items": map[string]any{"type": "string"}, "minItems": int64(1), "maxItems": int64(20)},
		}, "required": []any{"clusters"}}},
	} {
		crd := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
			"metadata": map[string]any{"name": k.plural + "." + kueue.Group},
			"spec": map[string]any{
				"group": kueue.Group, "scope": "Cluster",
				"names": map[string]any{"kind": k.kind, "listKind": k.kind + "List", "plural": k.plural, "singular": strings.ToLower(k.kind)},
				"versions": []any{map[string]any{
					"name": kueue.Version, "served": true, "storage": true,
					"subresources": map[string]any{"status": map[string]any{}},
					"schema": map[string]any{"openAPIV3Schema": map[string]any{
						"type": "object", "x-kubernetes-preserve-unknown-fields": true,
						"properties": map[string]any{"spec": k.spec},
					}},
				}},
			},
		}}
		if _, err := crds.Create(ctx, crd, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("create the %s CRD: %v", k.kind, err)
		}
	}
	testutil.Eventually(t, 30*time.Second, 50*time.Millisecond, func() error {
		for _, gvr := range []schema.GroupVersionResource{kueue.MultiKueueClusters, kueue.MultiKueueConfigs} {
			if _, err := dyn.Resource(gvr).List(ctx, metav1.ListOptions{}); err != nil {
				return err
			}
		}
		return nil
	}, "the Kueue CRDs serve")
}

// kueueEnv is the hub of TestKueueSink, as an admin sees it.
type kueueEnv struct {
	h   *harness
	dyn dynamic.Interface
	ns  string
}

// mkc returns the MultiKueueCluster named name, nil when there is none.
func (e kueueEnv) mkc(name string) (*unstructured.Unstructured, error) {
	u, err := e.dyn.Resource(kueue.MultiKueueClusters).Get(e.h.ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	return u, err
}

// expectSource waits until the MultiKueueCluster of profile is the sink's
// and reads from a kubeconfig Secret (secret) or the profile.
func (e kueueEnv) expectSource(profile string, secret bool) *unstructured.Unstructured {
	e.h.t.Helper()
	var m *unstructured.Unstructured
	e.h.eventually("MultiKueueCluster "+profile, func() error {
		var err error
		if m, err = e.mkc(profile); err != nil || m == nil {
			return fmt.Errorf("%v, %v", m, err)
		}
		if m.GetLabels()[hub.LabelManagedBy] != hub.ManagedBy || m.GetLabels()[hub.LabelSink] != "multikueue" {
			return fmt.Errorf("labels %v", m.GetLabels())
		}
		src, _, _ := unstructured.NestedMap(m.Object, "spec", "clusterSource")
		want := map[string]any{"clusterProfileRef": map[string]any{"name": profile}}
		if secret {
			want = map[string]any{"kubeConfig": map[string]any{"location": hub.KubeconfigSecretName(profile), "locationType": "Secret"}}
		}
		if fmt.Sprint(src) != fmt.Sprint(want) {
			return fmt.Errorf("clusterSource %v, want %v", src, want)
		}
		return nil
	})
	return m
}

// expectKubeconfig waits until the kubeconfig Secret of profile holds the
// token of the profile's credential copy, with the CA inline, passing
// Kueue's rules, owned by the profile; it returns the Secret and the
// kubeconfig as a client-go configuration.
func (e kueueEnv) expectKubeconfig(profile, token string, ca []byte) (*corev1.Secret, *rest.Config) {
	e.h.t.Helper()
	var sec *corev1.Secret
	var cfg *rest.Config
	e.h.eventually("kubeconfig Secret of "+profile+" holds the copy's token", func() error {
		copied, err := e.h.hub.Kube.CoreV1().Secrets(e.ns).Get(e.h.ctx, hub.CopyName(profile, "kueue"), metav1.GetOptions{})
		if err != nil {
			return err
		}
		if string(copied.Data[hub.TokenKey]) != token {
			return errors.New("the copy does not hold the token yet")
		}
		if sec, err = e.h.hub.Kube.CoreV1().Secrets(e.ns).Get(e.h.ctx, hub.KubeconfigSecretName(profile), metav1.GetOptions{}); err != nil {
			return err
		}
		kc, err := clientcmd.Load(sec.Data[kueue.KubeconfigKey])
		if err != nil {
			return testutil.Stop(fmt.Errorf("the kubeconfig does not parse: %w", err))
		}
		if err := sinks.CheckKueueKubeconfig(kc); err != nil {
			return testutil.Stop(err)
		}
		ctx := kc.Contexts[kc.CurrentContext]
		if got := kc.AuthInfos[ctx.AuthInfo].Token; got != string(copied.Data[hub.TokenKey]) {
			return errors.New("the kubeconfig's token is not the copy's")
		}
		if got := kc.Clusters[ctx.Cluster].CertificateAuthorityData; string(got) != string(ca) {
			return fmt.Errorf("CA data %q", got)
		}
		if cfg, err = clientcmd.RESTConfigFromKubeConfig(sec.Data[kueue.KubeconfigKey]); err != nil {
			return testutil.Stop(err)
		}
		return nil
	})
	p, err := e.h.hub.Profiles.ApisV1alpha1().ClusterProfiles(e.ns).Get(e.h.ctx, profile, metav1.GetOptions{})
	e.h.must(err)
	if o := sec.OwnerReferences; len(o) != 1 || o[0].Kind != "ClusterProfile" || o[0].Name != profile || o[0].UID != p.UID {
		e.h.t.Errorf("Secret %s owner references %+v, want profile %s (%s)", sec.Name, o, profile, p.UID)
	}
	cfg.Timeout = 10 * time.Second
	return sec, cfg
}

// expectConfig waits until the MultiKueueConfig lists clusters, in any
// order (the sink adds clusters in the order it learns of them), and is
// gone for none.
func (e kueueEnv) expectConfig(name string, clusters ...string) {
	e.h.t.Helper()
	e.h.eventually(fmt.Sprintf("MultiKueueConfig %s lists %v", name, clusters), func() error {
		u, err := e.dyn.Resource(kueue.MultiKueueConfigs).Get(e.h.ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err) && len(clusters) == 0:
			return nil
		case err != nil:
			return err
		}
		got, _, _ := unstructured.NestedStringSlice(u.Object, "spec", "clusters")
		if !slices.Equal(slices.Sorted(slices.Values(got)), slices.Sorted(slices.Values(clusters))) {
			return fmt.Errorf("lists %v", got)
		}
		return nil
	})
}

// asHubsyncServiceAccount installs deploy/rbac.yaml and the admission
// policy, and returns a configuration with a token of hubsync's
// ServiceAccount, so that what the daemon does is done with exactly the
// permissions deploy/ gives it.
func asHubsyncServiceAccount(h *harness, ns string) *rest.Config {
	h.t.Helper()
	d := loadDeploy(h.t, "serviceaccount.yaml", "rbac.yaml")
	installRBAC(h.ctx, h.t, h.hub.Kube, d)
	expiry := int64(600)
	tr, err := h.hub.Kube.CoreV1().ServiceAccounts(hubNamespace).CreateToken(h.ctx, hubServiceAccount, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &expiry},
	}, metav1.CreateOptions{})
	h.must(err)
	cfg := &rest.Config{Host: hubConfig.Host, BearerToken: tr.Status.Token, TLSClientConfig: rest.TLSClientConfig{CAData: hubConfig.CAData}}
	kube, err := kubernetes.NewForConfig(cfg)
	h.must(err)
	installAdmissionPolicy(h.ctx, h.t, h.hub.Kube, kube, ns)
	return cfg
}

// TestKueueSink runs the daemon, as hubsync's ServiceAccount with
// deploy/'s RBAC and admission policy, with a kueue sink over Kueue's
// namespace and a real second kube-apiserver as a managed cluster. With
// source secret: one MultiKueueCluster per profile reading a kubeconfig
// Secret that client-go parses, that holds the copy's token and the CA
// inline and reaches the cluster; a rotation rewrites the Secret and not
// the MultiKueueCluster; a profile whose host Kueue refuses gets nothing
// and is counted; someone else's MultiKueueCluster of a profile's name is
// left alone and counted; the MultiKueueConfig lists the sink's clusters;
// a profile that goes takes its objects along. Then the configuration
// switches to source clusterProfile (a reload): the MultiKueueClusters name
// their profiles and the Secrets go. When the binding goes, everything of
// the sink goes, and someone else's object stays.
func TestKueueSink(t *testing.T) {
	bin := testutil.Hubsync(t)
	h := newHarnessWithoutSyncer(t)
	dyn, err := dynamic.NewForConfig(hubConfig)
	h.must(err)
	installKueueCRDs(h.ctx, t, dyn)
	m := startManagedCluster(t)
	e := kueueEnv{h: h, dyn: dyn, ns: h.namespaces("kueue-system")[0]}
	asHubsync := asHubsyncServiceAccount(h, e.ns)

	// live reaches the managed cluster; other has a server Kueue accepts;
	// bad one Kueue refuses; taken has the name of someone else's
	// MultiKueueCluster.
	set := h.name("set")
	live, other, bad, taken := h.name("live"), h.name("other"), h.name("bad"), h.name("taken")
	h.must(h.hub.CreateExclusiveSet(h.ctx, set))
	servers := map[string]clusterv1.ClientConfig{
		live:  {URL: m.cfg.Host, CABundle: m.cfg.CAData},
		other: {URL: "https://" + other + ".example:6443", CABundle: []byte("other CA")},
		bad:   {URL: "https://api_" + bad + ".example:6443", CABundle: []byte("bad CA")},
		taken: {URL: "https://" + taken + ".example:6443", CABundle: []byte("taken CA")},
	}
	tokA, tokB := m.mintToken(t, "kueue-a"), m.mintToken(t, "kueue-b")
	tokens := map[string]string{}
	for name, cc := range servers {
		h.cluster(name, set, nil)
		h.must(h.hub.UpdateCluster(h.ctx, name, func(c *clusterv1.ManagedCluster) { c.Spec.ManagedClusterClientConfigs = []clusterv1.ClientConfig{cc} }))
		_, err := h.hub.CreateMSA(h.ctx, name, "kueue", true)
		h.must(err)
		tok := fleet.FakeJWT(time.Now().Add(time.Hour))
		if name == live {
			tok = tokA.Token
		}
		tokens[name] = tok
		h.must(h.hub.PutToken(h.ctx, name, "kueue", "", map[string][]byte{hub.TokenKey: []byte(tok), hub.CAKey: m.cfg.CAData}))
	}
	theirs := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{"clusterSource": map[string]any{"clusterProfileRef": map[string]any{"name": "elsewhere"}}}}}
	theirs.SetAPIVersion(kueue.Group + "/" + kueue.Version)
	theirs.SetKind(kueue.KindMKC)
	theirs.SetName(taken)
	theirs, err = dyn.Resource(kueue.MultiKueueClusters).Create(h.ctx, theirs, metav1.CreateOptions{})
	h.must(err)
	mkConfig := h.name("multikueue")
	t.Cleanup(func() {
		ctx := context.Background()
		for _, n := range []string{live, other, bad, taken} {
			_ = dyn.Resource(kueue.MultiKueueClusters).Delete(ctx, n, metav1.DeleteOptions{})
		}
		_ = dyn.Resource(kueue.MultiKueueConfigs).Delete(ctx, mkConfig, metav1.DeleteOptions{})
	})
	h.must(h.hub.Bind(h.ctx, e.ns, set, true))

	sink := config.Sink{Name: "multikueue", Type: config.SinkKueue, Kueue: &config.KueueSink{
		Namespace: e.ns, AccessProvider: "direct", ManagedServiceAccount: "kueue", MultiKueueConfig: mkConfig,
	}}
	conf := config.Config{AccessProviders: []config.AccessProvider{{Name: "direct", Type: config.ProviderDirect}}, Sinks: []config.Sink{sink}}
	d, cm, logs := h.startDaemonConfigMap(bin, asHubsync, conf)
	metric := func(name string, want float64) {
		t.Helper()
		h.eventually(fmt.Sprintf("%s = %v", name, want), func() error {
			got, err := d.Scrape()
			if err != nil {
				return err
			}
			if v, ok := got.Lookup(name, testutil.Labels{"sink": "multikueue"}); !ok || v != want {
				return fmt.Errorf("%s = %v (present %v)", name, v, ok)
			}
			return nil
		})
	}

	// Source secret.
	e.expectSource(live, true)
	e.expectSource(other, true)
	sec, cfg := e.expectKubeconfig(live, tokA.Token, m.cfg.CAData)
	e.expectKubeconfig(other, tokens[other], servers[other].CABundle)
	kube, err := kubernetes.NewForConfig(cfg)
	h.must(err)
	if jti, err := whoami(h.ctx, kube); err != nil || jti != tokA.JTI {
		t.Fatalf("a client from the kubeconfig Secret: %q, %v; want token A", jti, err)
	}
	e.expectConfig(mkConfig, other, live)
	metric("hubsync_kueue_clusters", 2)
	metric("hubsync_kueue_refused_kubeconfigs", 1)
	metric("hubsync_kueue_conflicts", 1)
	metric("hubsync_sink_up", 0) // blocked profiles make the sink's health fail
	if got, err := e.mkc(bad); err != nil || got != nil {
		t.Errorf("a MultiKueueCluster for the profile whose host Kueue refuses: %v, %v", got, err)
	}
	if _, err := h.hub.Kube.CoreV1().Secrets(e.ns).Get(h.ctx, hub.KubeconfigSecretName(bad), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("a kubeconfig Secret for the profile whose host Kueue refuses: %v", err)
	}

	// Rotation: the Secret holds token B, the MultiKueueCluster is as it was.
	before := e.expectSource(live, true)
	h.must(h.hub.PutToken(h.ctx, live, "kueue", "", map[string][]byte{hub.TokenKey: []byte(tokB.Token), hub.CAKey: m.cfg.CAData}))
	rotated, cfg := e.expectKubeconfig(live, tokB.Token, m.cfg.CAData)
	if rotated.ResourceVersion == sec.ResourceVersion {
		t.Error("the Secret was not rewritten")
	}
	kube, err = kubernetes.NewForConfig(cfg)
	h.must(err)
	if jti, err := whoami(h.ctx, kube); err != nil || jti != tokB.JTI {
		t.Errorf("a client from the rotated kubeconfig Secret: %q, %v; want token B", jti, err)
	}
	if after := e.expectSource(live, true); after.GetResourceVersion() != before.GetResourceVersion() {
		t.Error("the MultiKueueCluster was rewritten on rotation")
	}

	// A profile goes: its MultiKueueCluster and Secret go, and the config
	// lists one cluster fewer.
	h.must(h.hub.DeleteCluster(h.ctx, other))
	h.eventually("other's objects gone with its profile", func() error {
		if m, err := e.mkc(other); err != nil || m != nil {
			return fmt.Errorf("MultiKueueCluster %v, %v", m, err)
		}
		if _, err := h.hub.Kube.CoreV1().Secrets(e.ns).Get(h.ctx, hub.KubeconfigSecretName(other), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("Secret: %v", err)
		}
		return nil
	})
	e.expectConfig(mkConfig, live)

	// Source clusterProfile, by a configuration reload.
	conf.Sinks[0].Kueue = &config.KueueSink{Namespace: e.ns, Source: config.KueueSourceClusterProfile, MultiKueueConfig: mkConfig}
	h.must(d.WriteConfig(cm, conf))
	e.expectSource(live, false)
	e.expectSource(bad, false) // Kueue builds its client itself: no kubeconfig to refuse
	h.eventually("no kubeconfig Secret with source clusterProfile", func() error {
		l, err := h.hub.Kube.CoreV1().Secrets(e.ns).List(h.ctx, metav1.ListOptions{LabelSelector: hub.LabelSink + "=multikueue"})
		if err != nil || len(l.Items) > 0 {
			return fmt.Errorf("%d Secrets, %v", len(l.Items), err)
		}
		return nil
	})
	e.expectConfig(mkConfig, live, bad)
	metric("hubsync_kueue_refused_kubeconfigs", 0)

	// The binding goes: every profile, and with them everything the sink
	// wrote; someone else's MultiKueueCluster stays as it was.
	h.must(h.hub.Unbind(h.ctx, e.ns, set))
	h.eventually("the sink's MultiKueueClusters gone", func() error {
		for _, n := range []string{live, bad} {
			if m, err := e.mkc(n); err != nil || m != nil {
				return fmt.Errorf("%s: %v, %v", n, m, err)
			}
		}
		return nil
	})
	e.expectConfig(mkConfig)
	metric("hubsync_kueue_clusters", 0)
	metric("hubsync_kueue_conflicts", 0)
	metric("hubsync_sink_up", 1)
	if got, err := e.mkc(taken); err != nil || got == nil || got.GetResourceVersion() != theirs.GetResourceVersion() {
		t.Errorf("someone else's MultiKueueCluster changed or went: %v, %v", got, err)
	}

	out := logs.String()
	if !strings.Contains(out, "MultiKueueCluster "+taken+" exists and hubsync did not create it") {
		t.Error("the foreign MultiKueueCluster was not logged")
	}
	if strings.Contains(strings.ToLower(out), "forbidden") {
		t.Errorf("the daemon was refused something (RBAC or the admission policy):\n%s", out)
	}
	metricsText, err := d.Metrics()
	h.must(err)
	for what, text := range map[string]string{"the daemon's /metrics": metricsText, "the daemon's log": out} {
		for _, f := range leak.Tokens(text, []string{tokA.Token, tokB.Token}) {
			t.Errorf("%s appears in %s", f, what)
		}
	}
}
