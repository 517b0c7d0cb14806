package kueue

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/hub"
	"github.com/hubsync/hubsync/sinks"
	"github.com/hubsync/hubsync/stream"
	"github.com/hubsync/hubsync/test/testutil"
)

const (
	sinkName = "multikueue"
	kueueNS  = "kueue-system"
	provider = "open-cluster-management"
	msa      = "kueue"
)

var testCA = []byte("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")

// env is one sink on fake hub clients, with its log and metrics.
type env struct {
	sink *Sink
	kube *fake.Clientset
	dyn  *dynamicfake.FakeDynamicClient
	reg  *prometheus.Registry
	logs *bytes.Buffer
}

// profileObject is the ClusterProfile the sink lists for UIDs.
func profileObject(name string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{}}
	u.SetAPIVersion("multicluster.x-k8s.io/v1alpha1")
	u.SetKind("ClusterProfile")
	u.SetNamespace(kueueNS)
	u.SetName(name)
	u.SetUID(uid(name))
	return u
}

func uid(profile string) types.UID { return types.UID("uid-" + profile) }

func newEnv(t *testing.T, mutate func(*config.KueueSink), objs ...runtime.Object) *env {
	t.Helper()
	k := &config.KueueSink{AccessProvider: provider, ManagedServiceAccount: msa}
	if mutate != nil {
		mutate(k)
	}
	var kubeObjs, dynObjs []runtime.Object
	for _, o := range objs {
		if _, ok := o.(*unstructured.Unstructured); ok {
			dynObjs = append(dynObjs, o)
		} else {
			kubeObjs = append(kubeObjs, o)
		}
	}
	e := &env{
		kube: fake.NewClientset(kubeObjs...),
		dyn: dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{
			MultiKueueClusters: "MultiKueueClusterList",
			MultiKueueConfigs:  "MultiKueueConfigList",
			clusterProfiles:    "ClusterProfileList",
		}, dynObjs...),
		reg:  prometheus.NewRegistry(),
		logs: &bytes.Buffer{},
	}
	sc := config.Sink{Name: sinkName, Type: config.SinkKueue, Kueue: k}
	sc.SetDefaults()
	s, err := New(sc, sinks.Deps{Kube: e.kube, Dynamic: e.dyn, Log: slog.New(slog.NewTextHandler(e.logs, nil)), Registerer: e.reg})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	e.sink = s.(*Sink)
	t.Cleanup(func() { _ = s.Close() })
	return e
}

func profile(typ, cluster, server string) stream.Change {
	return stream.Change{
		Type: typ, Namespace: kueueNS, Cluster: cluster, Name: cluster,
		Profile: &stream.ProfileSummary{AccessProviders: []stream.AccessProviderSummary{
			{Name: "other", Server: "https://elsewhere.example:443"},
			{Name: provider, Server: server, CAData: testCA},
		}},
	}
}

func credential(typ, cluster string) stream.Change {
	return stream.Change{
		Type: typ, Namespace: kueueNS, Cluster: cluster, Name: hub.CopyName(cluster, msa),
		Credential: &stream.CredentialSummary{ManagedServiceAccount: msa, Secret: hub.CopyName(cluster, msa)},
	}
}

func server(cluster string) string {
	return "https://cluster-proxy-addon-user.ocm-addon:9092/" + cluster
}

// copySecret is the credential copy of cluster holding token.
func copySecret(cluster, token string) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: kueueNS, Name: hub.CopyName(cluster, msa)},
		Type:       corev1.SecretTypeOpaque,
		Data:       map[string][]byte{hub.TokenKey: []byte(token)},
	}
}

func (e *env) setToken(t *testing.T, cluster, token string) {
	t.Helper()
	if _, err := e.kube.CoreV1().Secrets(kueueNS).Update(context.Background(), copySecret(cluster, token), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func (e *env) deliver(t *testing.T, changes ...stream.Change) {
	t.Helper()
	if err := e.sink.Deliver(context.Background(), changes); err != nil {
		t.Fatalf("Deliver: %v", err)
	}
}

func (e *env) resync(t *testing.T, snapshot ...stream.Change) {
	t.Helper()
	if err := e.sink.Resync(context.Background(), snapshot); err != nil {
		t.Fatalf("Resync: %v", err)
	}
}

// mkc returns the MultiKueueCluster named name, nil when there is none.
func (e *env) mkc(t *testing.T, name string) *unstructured.Unstructured {
	t.Helper()
	u, err := e.dyn.Resource(MultiKueueClusters).Get(context.Background(), name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// secret returns the kubeconfig Secret of profile, nil when there is none.
func (e *env) secret(t *testing.T, profile string) *corev1.Secret {
	t.Helper()
	s, err := e.kube.CoreV1().Secrets(kueueNS).Get(context.Background(), hub.KubeconfigSecretName(profile), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// writes returns the create, update and delete actions on resource since
// the last call, as "verb name".
func writes(actions []k8stesting.Action, resource string) []string {
	var out []string
	for _, a := range actions {
		if a.GetResource().Resource != resource {
			continue
		}
		switch a.GetVerb() {
		case "create", "update":
			out = append(out, a.GetVerb()+" "+a.(k8stesting.CreateAction).GetObject().(metav1.Object).GetName())
		case "delete":
			out = append(out, "delete "+a.(k8stesting.DeleteAction).GetName())
		}
	}
	return out
}

func (e *env) writes(resource string) []string {
	var acts []k8stesting.Action
	if resource == "secrets" {
		acts = e.kube.Actions()
		e.kube.ClearActions()
	} else {
		acts = e.dyn.Actions()
		e.dyn.ClearActions()
	}
	return writes(acts, resource)
}

func (e *env) gauge(t *testing.T, name string) float64 {
	t.Helper()
	m, err := testutil.Gather(e.reg)
	if err != nil {
		t.Fatal(err)
	}
	return m.Value(name, map[string]string{"sink": sinkName})
}

// kubeconfigOf parses the kubeconfig of a Secret as Kueue does and checks
// it against Kueue's rules.
func kubeconfigOf(t *testing.T, s *corev1.Secret) (server, token string) {
	t.Helper()
	cfg, err := clientcmd.Load(s.Data[KubeconfigKey])
	if err != nil {
		t.Fatalf("parse the kubeconfig of %s: %v", s.Name, err)
	}
	if err := sinks.CheckKueueKubeconfig(cfg); err != nil {
		t.Errorf("Kueue would refuse %s: %v", s.Name, err)
	}
	ctx := cfg.Contexts[cfg.CurrentContext]
	cl := cfg.Clusters[ctx.Cluster]
	if !bytes.Equal(cl.CertificateAuthorityData, testCA) {
		t.Errorf("%s: CA data %q, want the provider's", s.Name, cl.CertificateAuthorityData)
	}
	return cl.Server, cfg.AuthInfos[ctx.AuthInfo].Token
}

func ownLabelsOK(t *testing.T, what string, l map[string]string) {
	t.Helper()
	if l[hub.LabelManagedBy] != hub.ManagedBy || l[hub.LabelSink] != sinkName {
		t.Errorf("%s labels %v lack the sink's", what, l)
	}
}

// TestSecretSource follows one profile through the secret source: profile
// and copy in → kubeconfig Secret, then MultiKueueCluster pointing at it;
// rotation → Secret rewritten, MultiKueueCluster untouched; the same
// rotation again → nothing written; profile out → both deleted.
func TestSecretSource(t *testing.T) {
	const c = "eu-1"
	e := newEnv(t, nil, copySecret(c, "token-1"), profileObject(c))
	e.deliver(t, profile(stream.ProfileCreated, c, server(c)))
	if e.mkc(t, c) != nil || e.secret(t, c) != nil {
		t.Fatal("written before the credential copy exists")
	}
	e.deliver(t, credential(stream.CredentialSynced, c))

	sec := e.secret(t, c)
	if sec == nil {
		t.Fatal("no kubeconfig Secret")
	}
	ownLabelsOK(t, "Secret", sec.Labels)
	if srv, tok := kubeconfigOf(t, sec); srv != server(c) || tok != "token-1" {
		t.Errorf("kubeconfig server %q token %q, want the provider's server and token-1", srv, tok)
	}
	want := metav1.OwnerReference{APIVersion: "multicluster.x-k8s.io/v1alpha1", Kind: "ClusterProfile", Name: c, UID: uid(c)}
	if len(sec.OwnerReferences) != 1 || sec.OwnerReferences[0] != want {
		t.Errorf("owner references %+v, want the profile", sec.OwnerReferences)
	}
	if sec.Annotations[hub.AnnotationTokenFingerprint] != hub.TokenFingerprint([]byte("token-1")) {
		t.Errorf("annotations %v", sec.Annotations)
	}
	m := e.mkc(t, c)
	if m == nil {
		t.Fatal("no MultiKueueCluster")
	}
	ownLabelsOK(t, "MultiKueueCluster", m.GetLabels())
	loc, _, _ := unstructured.NestedString(m.Object, "spec", "clusterSource", "kubeConfig", "location")
	typ, _, _ := unstructured.NestedString(m.Object, "spec", "clusterSource", "kubeConfig", "locationType")
	if loc != sec.Name || typ != "Secret" {
		t.Errorf("clusterSource %v, want the Secret %s", m.Object["spec"], sec.Name)
	}
	if g := e.gauge(t, "hubsync_kueue_clusters"); g != 1 {
		t.Errorf("hubsync_kueue_clusters = %v, want 1", g)
	}
	e.writes("secrets")
	e.writes("multikueueclusters")

	e.setToken(t, c, "token-2")
	e.writes("secrets")
	e.deliver(t, credential(stream.CredentialRotated, c))
	if _, tok := kubeconfigOf(t, e.secret(t, c)); tok != "token-2" {
		t.Errorf("token after rotation %q, want token-2", tok)
	}
	if got := e.writes("secrets"); !slices.Equal(got, []string{"update " + sec.Name}) {
		t.Errorf("Secret writes on rotation %v, want one update", got)
	}
	if got := e.writes("multikueueclusters"); len(got) != 0 {
		t.Errorf("MultiKueueCluster writes on rotation %v, want none", got)
	}
	e.deliver(t, credential(stream.CredentialRotated, c))
	if got := append(e.writes("secrets"), e.writes("multikueueclusters")...); len(got) != 0 {
		t.Errorf("writes when nothing changed: %v", got)
	}

	// The access provider moves: the Secret follows, with the same token.
	e.deliver(t, profile(stream.AccessProviderUpdated, c, "https://moved.example:443/"+c))
	if srv, tok := kubeconfigOf(t, e.secret(t, c)); srv != "https://moved.example:443/"+c || tok != "token-2" {
		t.Errorf("after the provider moved: server %q token %q", srv, tok)
	}
	if got := append(e.writes("secrets"), e.writes("multikueueclusters")...); !slices.Equal(got, []string{"update " + sec.Name}) {
		t.Errorf("writes when the provider moved: %v, want the Secret's update", got)
	}

	e.deliver(t, profile(stream.ProfileDeleted, c, ""))
	if e.mkc(t, c) != nil || e.secret(t, c) != nil {
		t.Error("the profile went, its objects stayed")
	}
	if g := e.gauge(t, "hubsync_kueue_clusters"); g != 0 {
		t.Errorf("hubsync_kueue_clusters = %v, want 0", g)
	}
	if strings.Contains(e.logs.String(), "token-1") || strings.Contains(e.logs.String(), "token-2") {
		t.Error("a token reached the log")
	}
}

// TestClusterProfileSource: the MultiKueueCluster names the profile and
// no Secret is written or token read; a switch from source secret removes
// the Secrets and points the MultiKueueClusters at their profiles.
func TestClusterProfileSource(t *testing.T) {
	const c = "eu-1"
	e := newEnv(t, nil, copySecret(c, "token-1"), profileObject(c))
	snapshot := []stream.Change{profile(stream.ProfileCreated, c, server(c)), credential(stream.CredentialSynced, c)}
	e.resync(t, snapshot...)
	if e.secret(t, c) == nil || e.mkc(t, c) == nil {
		t.Fatal("source secret wrote nothing")
	}

	// The configuration changes: the manager builds the sink anew, which
	// starts with a resync.
	cp := newEnv(t, func(k *config.KueueSink) { *k = config.KueueSink{Source: config.KueueSourceClusterProfile} })
	cp.kube, cp.dyn = e.kube, e.dyn
	cp.sink.kube, cp.sink.dyn = e.kube, e.dyn
	e.kube.ClearActions()
	cp.resync(t, snapshot...)
	m := cp.mkc(t, c)
	if name, _, _ := unstructured.NestedString(m.Object, "spec", "clusterSource", "clusterProfileRef", "name"); name != c {
		t.Errorf("clusterSource %v, want clusterProfileRef %s", m.Object["spec"], c)
	}
	if _, has, _ := unstructured.NestedMap(m.Object, "spec", "clusterSource", "kubeConfig"); has {
		t.Errorf("clusterSource %v keeps kubeConfig", m.Object["spec"])
	}
	for _, a := range e.kube.Actions() {
		if a.GetVerb() == "get" && a.GetResource().Resource == "secrets" {
			t.Errorf("source clusterProfile read a Secret: %v", a)
		}
	}
	if cp.secret(t, c) != nil {
		t.Error("the kubeconfig Secret stayed after the switch to clusterProfile")
	}
	// Credential changes concern it not at all.
	cp.dyn.ClearActions()
	cp.deliver(t, credential(stream.CredentialRotated, c))
	if acts := cp.dyn.Actions(); len(acts) != 0 {
		t.Errorf("a credential change cost %d requests", len(acts))
	}
}

// foreignMKC is a MultiKueueCluster named name that hubsync did not write.
func foreignMKC(name string, labels map[string]string) *unstructured.Unstructured {
	u := desiredMKC("someone", config.KueueSink{Source: config.KueueSourceClusterProfile}, name)
	u.SetLabels(labels)
	return u
}

// TestForeignObjects: a MultiKueueCluster or Secret of the name the sink
// would write that hubsync did not create is reported (log, gauge,
// health) and left alone, whatever happens to the profile; once it is
// gone, the sink writes its own and the report clears.
func TestForeignObjects(t *testing.T) {
	const a, b = "eu-a", "eu-b"
	theirs := foreignMKC(a, map[string]string{"team": "ml"})
	// Another hubsync sink's is not this sink's either.
	otherSink := foreignMKC(b, map[string]string{hub.LabelManagedBy: hub.ManagedBy, hub.LabelSink: "old-name"})
	e := newEnv(t, nil, copySecret(a, "t"), copySecret(b, "t"), profileObject(a), profileObject(b), theirs, otherSink)
	snapshot := []stream.Change{
		profile(stream.ProfileCreated, a, server(a)), credential(stream.CredentialSynced, a),
		profile(stream.ProfileCreated, b, server(b)), credential(stream.CredentialSynced, b),
	}
	e.resync(t, snapshot...)
	if got := e.writes("multikueueclusters"); len(got) != 0 {
		t.Errorf("writes to MultiKueueClusters that are not the sink's: %v", got)
	}
	if g := e.gauge(t, "hubsync_kueue_conflicts"); g != 2 {
		t.Errorf("hubsync_kueue_conflicts = %v, want 2", g)
	}
	r := e.sink.Report()
	if !r.Failing || !strings.Contains(r.Error, "MultiKueueCluster eu-a exists and hubsync did not create it") || !strings.Contains(r.Error, "eu-b") {
		t.Errorf("report %+v, want failing with both conflicts", r)
	}
	if !strings.Contains(e.logs.String(), "MultiKueueCluster eu-a exists and hubsync did not create it") {
		t.Errorf("the conflict is not logged:\n%s", e.logs.String())
	}
	// The profile goes: the foreign object stays.
	e.deliver(t, profile(stream.ProfileDeleted, a, ""))
	if e.mkc(t, a) == nil {
		t.Fatal("the foreign MultiKueueCluster was deleted with the profile")
	}
	if g := e.gauge(t, "hubsync_kueue_conflicts"); g != 1 {
		t.Errorf("hubsync_kueue_conflicts = %v after the profile went, want 1", g)
	}

	// Its owner removes it: the sink takes the name.
	if err := e.dyn.Resource(MultiKueueClusters).Delete(context.Background(), b, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.resync(t, snapshot[2:]...)
	if m := e.mkc(t, b); m == nil || !owned(m.GetLabels(), sinkName) {
		t.Errorf("MultiKueueCluster %s not written once free: %v", b, m)
	}
	if g := e.gauge(t, "hubsync_kueue_conflicts"); g != 0 {
		t.Errorf("hubsync_kueue_conflicts = %v, want 0", g)
	}
	if r := e.sink.Report(); r.Failing {
		t.Errorf("report %+v, want healthy", r)
	}
}

// TestForeignSecret: a Secret of the kubeconfig Secret's name that
// hubsync did not create is left alone, and no MultiKueueCluster points
// at it.
func TestForeignSecret(t *testing.T) {
	const c = "eu-1"
	theirs := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: kueueNS, Name: hub.KubeconfigSecretName(c)},
		Type: corev1.SecretTypeOpaque, Data: map[string][]byte{KubeconfigKey: []byte("theirs")}}
	e := newEnv(t, nil, copySecret(c, "t"), profileObject(c), theirs)
	e.deliver(t, profile(stream.ProfileCreated, c, server(c)), credential(stream.CredentialSynced, c))
	if s := e.secret(t, c); string(s.Data[KubeconfigKey]) != "theirs" {
		t.Error("the foreign Secret was overwritten")
	}
	if e.mkc(t, c) != nil {
		t.Error("a MultiKueueCluster points at a Secret hubsync does not own")
	}
	if g := e.gauge(t, "hubsync_kueue_conflicts"); g != 1 {
		t.Errorf("hubsync_kueue_conflicts = %v, want 1", g)
	}
	e.deliver(t, profile(stream.ProfileDeleted, c, ""))
	if e.secret(t, c) == nil {
		t.Error("the foreign Secret was deleted with the profile")
	}
	if g := e.gauge(t, "hubsync_kueue_conflicts"); g != 0 {
		t.Errorf("hubsync_kueue_conflicts = %v once the profile went, want 0", g)
	}
}

// TestRefusedKubeconfig: a profile whose server host Kueue would refuse
// gets nothing, is reported without its token, and is written once the
// server is fixed.
func TestRefusedKubeconfig(t *testing.T) {
	const c = "eu-1"
	e := newEnv(t, nil, copySecret(c, "secret-token"), profileObject(c))
	bad := "https://proxy_user.ocm:9092/" + c
	e.deliver(t, profile(stream.ProfileCreated, c, bad), credential(stream.CredentialSynced, c))
	if e.secret(t, c) != nil || e.mkc(t, c) != nil {
		t.Fatal("a kubeconfig Kueue would refuse was written")
	}
	if g := e.gauge(t, "hubsync_kueue_refused_kubeconfigs"); g != 1 {
		t.Errorf("hubsync_kueue_refused_kubeconfigs = %v, want 1", g)
	}
	r := e.sink.Report()
	if !r.Failing || !strings.Contains(r.Error, `server host "proxy_user.ocm"`) {
		t.Errorf("report %+v, want failing with the host", r)
	}
	e.deliver(t, profile(stream.AccessProviderUpdated, c, server(c)))
	if e.secret(t, c) == nil || e.mkc(t, c) == nil {
		t.Error("not written once the server is fixed")
	}
	if g := e.gauge(t, "hubsync_kueue_refused_kubeconfigs"); g != 0 {
		t.Errorf("hubsync_kueue_refused_kubeconfigs = %v, want 0", g)
	}
	metrics, err := testutil.Gather(e.reg)
	if err != nil {
		t.Fatal(err)
	}
	for what, text := range map[string]string{"log": e.logs.String(), "metrics": metrics.Text(), "report": r.Error} {
		if strings.Contains(text, "secret-token") {
			t.Errorf("the token reached the %s", what)
		}
	}
}

// TestResyncPrunes: a resync deletes the sink's objects of profiles that
// no longer exist (also under names no profile maps to), and nothing of
// anyone else.
func TestResyncPrunes(t *testing.T) {
	const keep, gone = "eu-keep", "eu-gone"
	e := newEnv(t, nil, copySecret(keep, "t"), profileObject(keep))
	e.resync(t, profile(stream.ProfileCreated, keep, server(keep)), credential(stream.CredentialSynced, keep),
		profile(stream.ProfileCreated, gone, server(gone)), credential(stream.CredentialSynced, gone))
	// gone had no copy in the hub, so nothing was written for it; make
	// what an earlier run would have left.
	stale := desiredMKC(sinkName, e.sink.cfg, gone)
	stray := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: kueueNS, Name: "hubsync-kubeconfig-renamed",
		Labels: ownLabels(sinkName, nil, "renamed")}, Type: corev1.SecretTypeOpaque}
	foreign := foreignMKC("eu-foreign", nil)
	ctx := context.Background()
	for _, u := range []*unstructured.Unstructured{stale, foreign} {
		if _, err := e.dyn.Resource(MultiKueueClusters).Create(ctx, u, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.kube.CoreV1().Secrets(kueueNS).Create(ctx, stray, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.resync(t, profile(stream.ProfileCreated, keep, server(keep)), credential(stream.CredentialSynced, keep))
	if e.mkc(t, gone) != nil {
		t.Error("the MultiKueueCluster of a profile that no longer exists stayed")
	}
	if _, err := e.kube.CoreV1().Secrets(kueueNS).Get(ctx, stray.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the sink's Secret that no profile maps to stayed: %v", err)
	}
	if e.mkc(t, keep) == nil || e.secret(t, keep) == nil {
		t.Error("the objects of a profile that exists were pruned")
	}
	if e.mkc(t, "eu-foreign") == nil {
		t.Error("a MultiKueueCluster that is not the sink's was pruned")
	}
	if _, err := e.kube.CoreV1().Secrets(kueueNS).Get(ctx, hub.CopyName(keep, msa), metav1.GetOptions{}); err != nil {
		t.Errorf("the credential copy went: %v", err)
	}
}

// TestOtherNamespacesIgnored: the sink serves Kueue's namespace only.
func TestOtherNamespacesIgnored(t *testing.T) {
	e := newEnv(t, nil)
	c := profile(stream.ProfileCreated, "eu-1", server("eu-1"))
	c.Namespace = "team-a"
	e.deliver(t, c)
	if acts := append(e.kube.Actions(), e.dyn.Actions()...); len(acts) != 0 {
		t.Errorf("a change of another namespace cost %d requests", len(acts))
	}
}

// TestMultiKueueConfig: the configured MultiKueueConfig lists the sink's
// MultiKueueClusters, keeping the order it has (Kueue's preference) and
// adding new ones by name; it is deleted when none is left, capped at
// Kueue's limit, and left alone when it is someone else's.
func TestMultiKueueConfig(t *testing.T) {
	const name = "hubsync"
	cfgOf := func(e *env) *unstructured.Unstructured {
		u, err := e.dyn.Resource(MultiKueueConfigs).Get(context.Background(), name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			t.Fatal(err)
		}
		return u
	}
	profiles := func(names ...string) []stream.Change {
		var out []stream.Change
		for _, n := range names {
			out = append(out, profile(stream.ProfileCreated, n, server(n)))
		}
		return out
	}
	withConfig := func(k *config.KueueSink) {
		k.Source, k.AccessProvider, k.ManagedServiceAccount, k.MultiKueueConfig = "clusterProfile", "", "", name
	}

	e := newEnv(t, withConfig)
	e.resync(t, profiles("c", "a")...)
	got := cfgOf(e)
	if got == nil || !slices.Equal(specClusters(got), []string{"a", "c"}) {
		t.Fatalf("MultiKueueConfig %v, want clusters [a c]", got)
	}
	ownLabelsOK(t, "MultiKueueConfig", got.GetLabels())
	// Someone orders them by preference; a new cluster goes last.
	_ = unstructured.SetNestedStringSlice(got.Object, []string{"c", "a"}, "spec", "clusters")
	if _, err := e.dyn.Resource(MultiKueueConfigs).Update(context.Background(), got, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.resync(t, profiles("c", "a", "b")...)
	if got := specClusters(cfgOf(e)); !slices.Equal(got, []string{"c", "a", "b"}) {
		t.Errorf("clusters %v, want [c a b]", got)
	}
	e.deliver(t, profile(stream.ProfileDeleted, "a", ""))
	if got := specClusters(cfgOf(e)); !slices.Equal(got, []string{"c", "b"}) {
		t.Errorf("clusters %v, want [c b]", got)
	}
	e.deliver(t, profile(stream.ProfileDeleted, "b", ""), profile(stream.ProfileDeleted, "c", ""))
	if got := cfgOf(e); got != nil {
		t.Errorf("MultiKueueConfig %v kept with no cluster to list", got)
	}

	// More than Kueue's limit: the first 20 by name, and a report.
	var many []string
	for i := range config.KueueMaxClusters + 2 {
		many = append(many, fmt.Sprintf("c%02d", i))
	}
	e.resync(t, profiles(many...)...)
	if got := specClusters(cfgOf(e)); !slices.Equal(got, many[:config.KueueMaxClusters]) {
		t.Errorf("clusters %v, want the first %d", got, config.KueueMaxClusters)
	}
	if r := e.sink.Report(); !r.Failing || !strings.Contains(r.Error, "lists at most 20 clusters; left out: [c20 c21]") {
		t.Errorf("report %+v, want the left-out clusters", r)
	}

	// Someone else's MultiKueueConfig of that name is left alone.
	theirs := desiredConfig("someone", config.KueueSink{MultiKueueConfig: name}, nil, []string{"x"})
	theirs.SetLabels(nil)
	f := newEnv(t, withConfig, theirs)
	f.resync(t, profiles("a")...)
	if got := specClusters(cfgOf(f)); !slices.Equal(got, []string{"x"}) {
		t.Errorf("someone else's MultiKueueConfig changed to %v", got)
	}
	if g := f.gauge(t, "hubsync_kueue_conflicts"); g != 1 {
		t.Errorf("hubsync_kueue_conflicts = %v, want 1", g)
	}
}

// TestFailedDeliveryRetried: a write that fails fails the delivery (the
// stream retries it), leaves no MultiKueueConfig entry for the cluster,
// and the cluster is decided again with the next delivery, whatever it
// holds.
func TestFailedDeliveryRetried(t *testing.T) {
	const c = "eu-1"
	e := newEnv(t, func(k *config.KueueSink) { k.MultiKueueConfig = "hubsync" }, copySecret(c, "t"), profileObject(c))
	failures := 1
	e.dyn.PrependReactor("create", "multikueueclusters", func(k8stesting.Action) (bool, runtime.Object, error) {
		if failures == 0 {
			return false, nil, nil
		}
		failures--
		return true, nil, apierrors.NewServiceUnavailable("try again")
	})
	err := e.sink.Deliver(context.Background(), []stream.Change{profile(stream.ProfileCreated, c, server(c)), credential(stream.CredentialSynced, c)})
	if err == nil || !strings.Contains(err.Error(), "try again") {
		t.Fatalf("Deliver = %v, want the create's error", err)
	}
	if _, err := e.dyn.Resource(MultiKueueConfigs).Get(context.Background(), "hubsync", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the MultiKueueConfig lists a cluster whose MultiKueueCluster failed: %v", err)
	}
	e.deliver(t)
	if e.mkc(t, c) == nil {
		t.Error("the failed cluster was not decided again")
	}
	if u, err := e.dyn.Resource(MultiKueueConfigs).Get(context.Background(), "hubsync", metav1.GetOptions{}); err != nil || !slices.Equal(specClusters(u), []string{c}) {
		t.Errorf("MultiKueueConfig %v, %v; want [%s]", u, err, c)
	}
}

// TestCredentialRemoved: a profile whose credential copy goes (its
// ManagedServiceAccount no longer synced, say) loses its kubeconfig Secret
// and MultiKueueCluster, and gets them back with a new copy.
func TestCredentialRemoved(t *testing.T) {
	const c = "eu-1"
	e := newEnv(t, nil, copySecret(c, "token-1"), profileObject(c))
	e.deliver(t, profile(stream.ProfileCreated, c, server(c)), credential(stream.CredentialSynced, c))
	if e.secret(t, c) == nil || e.mkc(t, c) == nil {
		t.Fatal("objects not written")
	}
	e.deliver(t, credential(stream.CredentialRemoved, c))
	if e.secret(t, c) != nil || e.mkc(t, c) != nil {
		t.Error("the credential copy went, the kubeconfig Secret or MultiKueueCluster stayed")
	}
	e.deliver(t, credential(stream.CredentialSynced, c))
	if e.secret(t, c) == nil || e.mkc(t, c) == nil {
		t.Error("a new copy did not bring the objects back")
	}
}
