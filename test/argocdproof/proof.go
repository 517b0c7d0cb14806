// Package argocdproof proves that Argo CD's own code reads the cluster
// Secrets the hubsync Argo CD sink writes and reaches the cluster with
// them, and that the sink leaves to the argoproj-labs ClusterProfile
// integration the clusters it already gives Argo CD.
//
// Argo CD's dependency graph is much heavier than hubsync's and differs
// from one Argo CD release to the next, so each release is imported by a
// module of its own (test/argocd: v3.2.0; test/argocd-v3.6: v3.6.1) whose
// test hands Run what it needs from Argo CD: the few calls below, made
// with that release's code. Everything else, the scenarios included, is
// here, once.
package argocdproof

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"slices"
	"strings"
	"testing"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/sinks/argocd"
	"github.com/hubsync/hubsync/stream"
	"github.com/hubsync/hubsync/test/leak"
	"github.com/hubsync/hubsync/test/testutil"
)

// ArgoCD is what a proof module gives from the Argo CD release it imports.
type ArgoCD struct {
	// Version names the release in failure messages ("v3.2.0").
	Version string
	// ProvidesClusterInfo says whether the release's exec provider config
	// has provideClusterInfo and config (3.5 and later).
	ProvidesClusterInfo bool
	// Read parses a cluster Secret with the release's
	// util/db.SecretToCluster and builds the cluster's rest.Config with
	// its RawRestConfig.
	Read func(sec *corev1.Secret) (*Cluster, error)
	// Clusters lists the clusters of namespace as Argo CD's controllers
	// see them (util/db's ListClusters over the settings informer).
	Clusters func(ctx context.Context, kube kubernetes.Interface, namespace string) ([]Listed, error)
	// ByServer finds the cluster of server as Argo CD's controllers do
	// (util/db's GetCluster).
	ByServer func(ctx context.Context, kube kubernetes.Interface, namespace, server string) (Listed, error)
	// CPCreds, if set, returns managed-serviceaccount's cp-creds binary,
	// built in the proof module, to run as the exec plugin.
	CPCreds func(t *testing.T) string
}

// Cluster is a cluster as Argo CD's own code reads it from a Secret.
type Cluster struct {
	Name, Server, Project string
	Namespaces            []string
	ClusterResources      bool
	Labels                map[string]string
	// Config is Argo CD's own JSON encoding of the cluster's config, as
	// its UI and CLI write it back when they save a cluster.
	Config      []byte
	BearerToken string
	// Exec is the exec provider config, nil without one.
	Exec *Exec
	// REST is the rest.Config Argo CD connects to the cluster with.
	REST *rest.Config
}

// Exec is Argo CD's ExecProviderConfig; ProvideClusterInfo and
// ClusterConfig stay zero for a release without them.
type Exec struct {
	Command            string
	Args               []string
	Env                map[string]string
	ProvideClusterInfo bool
	// ClusterConfig is the raw config handed to the plugin.
	ClusterConfig []byte
}

// Listed is a cluster as Argo CD lists it: its name, server, and ID, the
// UID of the Secret it comes from.
type Listed struct {
	Name, Server, ID string
}

// Run runs every scenario against Argo CD's code in argo.
func Run(t *testing.T, argo ArgoCD) {
	h := startHub(t)
	first := h.mintToken(t)
	h.putCopy(t, first)
	p := &proof{h: h, argo: argo, tokens: []string{first}}
	t.Run("exec", p.exec)
	t.Run("token", p.token)
	t.Run("provideClusterInfo", p.clusterInfo)
	if argo.CPCreds != nil {
		t.Run("cp-creds", p.cpCreds)
	}
	t.Run("integration", p.integration)
}

// proof is one run's API server, Argo CD release and the tokens minted.
type proof struct {
	h      *hub
	argo   ArgoCD
	tokens []string
}

// rotate mints a new token and puts it in the credential copy.
func (p *proof) rotate(t *testing.T) string {
	tok := p.h.mintToken(t)
	p.h.putCopy(t, tok)
	p.tokens = append(p.tokens, tok)
	return tok
}

// read reads the sink's Secret back and parses it with Argo CD's own
// SecretToCluster; it checks that Argo CD's settings informer, which the
// application controller uses, finds the same cluster by server.
func (p *proof) read(t *testing.T, sink, argoNS string) (*corev1.Secret, *Cluster) {
	t.Helper()
	return p.readAs(t, sink, argoNS, true)
}

// readAs is read, checking Argo CD's encoding of the config only when
// sameBytes is set.
func (p *proof) readAs(t *testing.T, sink, argoNS string, sameBytes bool) (*corev1.Secret, *Cluster) {
	t.Helper()
	ctx := t.Context()
	sec, err := p.h.kube.CoreV1().Secrets(argoNS).Get(ctx, argocd.SecretName(sink, clusterName), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("read the sink's Secret: %v", err)
	}
	c, err := p.argo.Read(sec)
	if err != nil {
		t.Fatalf("Argo CD %s's SecretToCluster or RawRestConfig: %v", p.argo.Version, err)
	}
	server := strings.TrimRight(p.h.cfg.Host, "/")
	switch {
	case c.Name != clusterName:
		t.Errorf("cluster name %q, want %q", c.Name, clusterName)
	case c.Server != server:
		t.Errorf("cluster server %q, want %q", c.Server, server)
	case c.Project != "platform":
		t.Errorf("cluster project %q", c.Project)
	case !slices.Equal(c.Namespaces, []string{consumerNS, "apps"}) || !c.ClusterResources:
		t.Errorf("cluster namespaces %v, clusterResources %v", c.Namespaces, c.ClusterResources)
	case c.Labels[argocd.LabelSink] != sink:
		t.Errorf("cluster labels %v", c.Labels)
	}
	// Argo CD's UI and CLI re-encode the config when they save a cluster:
	// the sink's encoding is byte for byte Argo CD's, so such a save does
	// not make the sink write the Secret back.
	if sameBytes && !bytes.Equal(c.Config, sec.Data["config"]) {
		t.Errorf("Argo CD %s encodes the config as\n%s\nthe sink wrote\n%s", p.argo.Version, c.Config, sec.Data["config"])
	}
	byServer, err := p.argo.ByServer(ctx, p.h.kube, argoNS, c.Server)
	if err != nil {
		t.Fatalf("Argo CD's GetCluster(%s): %v", c.Server, err)
	}
	if byServer.Name != clusterName || byServer.ID != string(sec.UID) {
		t.Errorf("Argo CD's GetCluster found %q (%s), want the sink's Secret %s", byServer.Name, byServer.ID, sec.UID)
	}
	return sec, c
}

// checkAccess connects with Argo CD's rest.Config of c and checks that it
// is the managed cluster's identity, allowed to list namespaces and
// nothing more.
func checkAccess(t *testing.T, c *Cluster) {
	t.Helper()
	ctx := t.Context()
	kube, err := kubernetes.NewForConfig(c.REST)
	if err != nil {
		t.Fatal(err)
	}
	review, err := kube.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authnv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("SelfSubjectReview with Argo CD's config: %v", err)
	}
	if want := "system:serviceaccount:" + managedNS + ":" + msaName; review.Status.UserInfo.Username != want {
		t.Errorf("Argo CD's config authenticates as %q, want %q", review.Status.UserInfo.Username, want)
	}
	nss, err := kube.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("list namespaces with Argo CD's config: %v", err)
	}
	if !slices.ContainsFunc(nss.Items, func(n corev1.Namespace) bool { return n.Name == consumerNS }) {
		t.Errorf("namespaces listed with Argo CD's config lack %s", consumerNS)
	}
	if _, err := kube.CoreV1().Secrets(consumerNS).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("listing Secrets with Argo CD's config: %v, want Forbidden (it must be the cluster's identity, not an admin)", err)
	}
}

// noTokens fails t when any token minted so far is in sec, in any
// encoding.
func (p *proof) noTokens(t *testing.T, sec *corev1.Secret) {
	t.Helper()
	raw, err := json.Marshal(sec)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range leak.Tokens(string(raw), p.tokens) {
		t.Errorf("%s appears in the exec-mode Secret", f)
	}
}

// exec: the default, for every Argo CD release. Argo CD runs `hubsync
// creds` with the cluster in its arguments.
func (p *proof) exec(t *testing.T) {
	bin := testutil.Plugin(t)
	ctx := t.Context()
	s := p.h.newSink(t, "proof", "argocd", func(a *config.ArgoCDSink) {
		a.Exec = config.ExecAuth{Command: bin, InstallHint: "hubsync must be in Argo CD's image"}
	})
	if err := s.Resync(ctx, p.h.snapshot()); err != nil {
		t.Fatalf("Resync: %v", err)
	}
	sec, c := p.read(t, "proof", "argocd")
	e := c.Exec
	if e == nil || e.Command != bin || c.BearerToken != "" || !slices.Contains(e.Args, "--cluster="+clusterName) || e.ProvideClusterInfo {
		t.Fatalf("exec config %+v, bearer token set: %v", e, c.BearerToken != "")
	}
	checkAccess(t, c)

	// A rotation changes the copy, not Argo CD's Secret.
	p.rotate(t)
	if err := s.Deliver(ctx, []stream.Change{{
		Type: stream.CredentialRotated, Namespace: consumerNS, Cluster: clusterName,
		Credential: &stream.CredentialSummary{ManagedServiceAccount: msaName},
	}}); err != nil {
		t.Fatalf("Deliver: %v", err)
	}
	after, c := p.read(t, "proof", "argocd")
	if after.ResourceVersion != sec.ResourceVersion {
		t.Errorf("a rotation rewrote the exec-mode Secret (resourceVersion %s → %s)", sec.ResourceVersion, after.ResourceVersion)
	}
	checkAccess(t, c)
	p.noTokens(t, after)
}

// token: the token in the Secret, rewritten on rotation.
func (p *proof) token(t *testing.T) {
	ctx := t.Context()
	first := p.rotate(t)
	s := p.h.newSink(t, "proof-token", "argocd-token", func(a *config.ArgoCDSink) { a.Auth = config.AuthToken })
	if err := s.Resync(ctx, p.h.snapshot()); err != nil {
		t.Fatalf("Resync: %v", err)
	}
	_, c := p.read(t, "proof-token", "argocd-token")
	if c.Exec != nil || c.BearerToken != first {
		t.Fatalf("token mode: exec config %+v, bearer token is the copy's: %v", c.Exec, c.BearerToken == first)
	}
	checkAccess(t, c)

	second := p.rotate(t)
	if err := s.Deliver(ctx, []stream.Change{{
		Type: stream.CredentialRotated, Namespace: consumerNS, Cluster: clusterName,
		Credential: &stream.CredentialSummary{ManagedServiceAccount: msaName},
	}}); err != nil {
		t.Fatalf("Deliver: %v", err)
	}
	_, c = p.read(t, "proof-token", "argocd-token")
	if c.BearerToken != second {
		t.Fatal("token mode: the rotated token is not in the Secret")
	}
	checkAccess(t, c)
}

// clusterInfo: provideClusterInfo on. On a release that has it, `hubsync
// creds` is named no cluster and learns it from KUBERNETES_EXEC_INFO; on
// one that lacks it (3.2), the plugin is handed no cluster and says what
// to do, which is why the switch is off by default.
func (p *proof) clusterInfo(t *testing.T) {
	bin := testutil.Plugin(t)
	s := p.h.newSink(t, "proof-info", "argocd-info", func(a *config.ArgoCDSink) {
		a.ProvideClusterInfo = true
		a.Exec = config.ExecAuth{Command: bin}
	})
	if err := s.Resync(t.Context(), p.h.snapshot()); err != nil {
		t.Fatalf("Resync: %v", err)
	}
	sec, c := p.readAs(t, "proof-info", "argocd-info", p.argo.ProvidesClusterInfo)
	e := c.Exec
	if e == nil || slices.ContainsFunc(e.Args, func(a string) bool { return strings.HasPrefix(a, "--cluster") }) {
		t.Fatalf("exec config %+v: the cluster must not be in the arguments", e)
	}
	if !p.argo.ProvidesClusterInfo {
		expectNoClusterInfo(t, p.argo.Version, sec, c)
		return
	}
	if !e.ProvideClusterInfo || string(e.ClusterConfig) != `{"clusterName":"`+clusterName+`"}` {
		t.Fatalf("Argo CD %s reads provideClusterInfo %v, config %s", p.argo.Version, e.ProvideClusterInfo, e.ClusterConfig)
	}
	checkAccess(t, c)
	p.noTokens(t, sec)
}

// expectNoClusterInfo shows why provideClusterInfo is off by default: a
// release without it (3.2) reads past the two fields, so its UI or CLI
// would drop them on a save (and the sink would write them back, making
// Argo CD re-list the cluster), and runs the plugin without the cluster,
// which refuses and says what is missing.
func expectNoClusterInfo(t *testing.T, version string, sec *corev1.Secret, c *Cluster) {
	t.Helper()
	// The JSON key, quoted: the plugin's path may hold the words.
	key := []byte(`"provideClusterInfo"`)
	if bytes.Contains(c.Config, key) || !bytes.Contains(sec.Data["config"], key) {
		t.Errorf("Argo CD %s encodes the config as\n%s\nwant it without the sink's provideClusterInfo", version, c.Config)
	}
	if c.REST.ExecProvider == nil || c.REST.ExecProvider.ProvideClusterInfo || c.REST.ExecProvider.Config != nil {
		t.Fatalf("Argo CD %s's exec provider %+v", version, c.REST.ExecProvider)
	}
	var err error
	stderr := captureStderr(t, func() {
		var kube kubernetes.Interface
		if kube, err = kubernetes.NewForConfig(c.REST); err == nil {
			_, err = kube.CoreV1().Namespaces().List(t.Context(), metav1.ListOptions{})
		}
	})
	if err == nil || !strings.Contains(stderr, "set provideClusterInfo: true") {
		t.Fatalf("Argo CD %s with provideClusterInfo set: %v, plugin said %q; want a failure naming provideClusterInfo", version, err, stderr)
	}
}

// captureStderr returns what f writes to os.Stderr, where client-go's exec
// authenticator sends its plugins' standard error (it takes os.Stderr
// when it is built, inside f).
func captureStderr(t *testing.T, f func()) string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	saved := os.Stderr
	os.Stderr = w
	read := make(chan string)
	go func() {
		b, _ := io.ReadAll(r)
		read <- string(b)
	}()
	f()
	os.Stderr = saved
	_ = w.Close()
	out := <-read
	_, _ = io.WriteString(saved, out)
	return out
}

// cpCreds: managed-serviceaccount's own cp-creds as the plugin, which
// knows one flag, learns the cluster from KUBERNETES_EXEC_INFO only and the
// copy's namespace from NAMESPACE, which only the Secret's env map sets.
func (p *proof) cpCreds(t *testing.T) {
	bin := p.argo.CPCreds(t)
	s := p.h.newSink(t, "proof-cp", "argocd-cp-creds", func(a *config.ArgoCDSink) {
		a.ProvideClusterInfo, a.ExecPlugin = true, config.ExecPluginCPCreds
		a.Exec = config.ExecAuth{Command: bin}
	})
	if err := s.Resync(t.Context(), p.h.snapshot()); err != nil {
		t.Fatalf("Resync: %v", err)
	}
	sec, c := p.read(t, "proof-cp", "argocd-cp-creds")
	if e := c.Exec; e == nil || e.Command != bin || !slices.Equal(e.Args, []string{"--managed-serviceaccount=" + msaName}) || e.Env["NAMESPACE"] != consumerNS {
		t.Fatalf("exec config %+v", e)
	}
	checkAccess(t, c)
	p.noTokens(t, sec)
}
