package kueue_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	clusterv1beta2 "open-cluster-management.io/api/cluster/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	configapi "sigs.k8s.io/kueue/apis/config/v1beta2"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"
	"sigs.k8s.io/kueue/pkg/features"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/hub"
	"github.com/hubsync/hubsync/test/controlplane"
	"github.com/hubsync/hubsync/test/testutil"
)

// sinkName is the kueue sink's name in every daemon the test runs.
const sinkName = "multikueue"

// activeMessage is what Kueue's AdmissionCheck reconciler says of a check
// whose clusters are all there and Active.
const activeMessage = "The admission check is active"

// tokens records every token the test mints, for the leak checks.
type tokens struct {
	mu  sync.Mutex
	all []string
}

func (k *tokens) add(tok controlplane.BoundToken) controlplane.BoundToken {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.all = append(k.all, tok.Token)
	return tok
}

func (k *tokens) list() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Clone(k.all)
}

// TestKueueMultiKueue runs hubsync's binary and Kueue's own MultiKueue
// controllers against one hub and a real worker kube-apiserver:
//   - secret and clusterProfile: the kueue sink's two sources. Each
//     profile of Kueue's namespace gets a MultiKueueCluster that Kueue
//     reports Active; it stays Active through a token rotation that
//     revokes the old token, and Kueue's remote client keeps working
//     (its Workload lists reach the worker with the new token after the
//     old one is refused); when a profile goes its MultiKueueCluster goes,
//     and Kueue's AdmissionCheck reconciler reports what a user sees.
//   - kubeconfig files: every file the kubeconfig sink writes in token
//     mode or for consumer kueue passes Kueue's kubeconfig validation
//     (a MultiKueueCluster of locationType Path reading it is Active,
//     before and after a rotation); an exec-mode file is refused with
//     InsecureKubeConfig.
//   - rule parity: hubsync's own check of Kueue's kubeconfig rules gives
//     Kueue's verdict, rule by rule.
func TestKueueMultiKueue(t *testing.T) {
	start := time.Now()
	f := newHubFixture(t)
	// Kueue reads Path kubeconfigs from anywhere with this gate off (its
	// default in v0.19); on, only from /etc/multikueue/kubeconfigs/.
	features.SetFeatureGateDuringTest(t, features.MultiKueueKubeConfigPathValidation, false)
	k := startKueue(t, []configapi.ClusterProfileAccessProvider{{
		Name: provider,
		// What a Kueue operator configures for hubsync: its creds plugin
		// reading the credential copies in Kueue's namespace. The short
		// cache makes client-go pick a rotated token up within seconds.
		ExecConfig: clientcmdapi.ExecConfig{
			APIVersion: "client.authentication.k8s.io/v1",
			Command:    f.plugin,
			Args:       []string{"creds", "--managed-serviceaccount=" + msa, "--max-cache-duration=5s"},
			Env: []clientcmdapi.ExecEnvVar{
				{Name: "NAMESPACE", Value: kueueNS},
				{Name: "KUBECONFIG", Value: f.kubeconfig},
			},
			ProvideClusterInfo: true,
			InteractiveMode:    clientcmdapi.NeverExecInteractiveMode,
		},
	}})
	t.Logf("hub, worker, hubsync's build and Kueue's controllers ready in %s", time.Since(start).Round(time.Millisecond))
	for _, tc := range []struct{ source, prefix string }{
		{config.KueueSourceSecret, "sec"},
		{config.KueueSourceClusterProfile, "cp"},
	} {
		t.Run(tc.source, func(t *testing.T) {
			start := time.Now()
			proveSource(t, f, k, tc.source, tc.prefix)
			t.Logf("%s: %s", tc.source, time.Since(start).Round(time.Millisecond))
		})
	}
	t.Run("rule parity", func(t *testing.T) { proveRuleParity(t, k) })
	t.Run("kubeconfig files", func(t *testing.T) {
		start := time.Now()
		proveFiles(t, f, k)
		t.Logf("kubeconfig files: %s", time.Since(start).Round(time.Millisecond))
	})
}

// proveSource runs a kueue sink of the given source over two clusters,
// prefix-1 and prefix-2.
func proveSource(t *testing.T, f *hubFixture, k *kueueController, source, prefix string) {
	ctx := t.Context()
	toks := &tokens{}
	set, c1, c2 := prefix+"-set", prefix+"-1", prefix+"-2"
	userCfg, hubsyncCfg := prefix+"-user", prefix+"-hubsync"
	a := map[string]controlplane.BoundToken{}
	for _, c := range []string{c1, c2} {
		suite.worker.identity(t, c)
		a[c] = toks.add(suite.worker.mint(t, c, c+"-a"))
	}
	must(t, f.CreateExclusiveSet(ctx, set))
	f.cluster(t, c1, set, a[c1])
	f.cluster(t, c2, set, a[c2])
	// A user's own MultiKueueConfig naming both clusters, and one that
	// hubsync keeps; an AdmissionCheck on each.
	k.userConfig(t, userCfg, c1, c2)
	k.admissionCheck(t, userCfg, userCfg)
	k.admissionCheck(t, hubsyncCfg, hubsyncCfg)

	sink := config.Sink{Name: sinkName, Type: config.SinkKueue, Kueue: &config.KueueSink{
		Namespace: kueueNS, Source: source, MultiKueueConfig: hubsyncCfg,
	}}
	if source == config.KueueSourceSecret {
		sink.Kueue.AccessProvider, sink.Kueue.ManagedServiceAccount = provider, msa
	}
	f.daemon(t, []config.Sink{sink}, toks.list)
	must(t, f.Bind(ctx, kueueNS, set, true))

	// 1. One MultiKueueCluster per profile, Active by Kueue's reconciler.
	for _, c := range []string{c1, c2} {
		expectMKC(t, k, source, c, a[c])
		k.waitActive(t, c)
	}
	k.waitCheck(t, hubsyncCfg, metav1.ConditionTrue, "Active", activeMessage)
	k.waitCheck(t, userCfg, metav1.ConditionTrue, "Active", activeMessage)
	expectConfigClusters(t, k, hubsyncCfg, c1, c2)

	// 2. Rotation of c1's token, then revocation of the old one.
	b := toks.add(suite.worker.mint(t, c1, c1+"-b"))
	rotateAndRevoke(t, f, k, source, c1, a[c1], b, c2)

	// 3. c1 leaves the set: its profile goes, and with it what hubsync
	// wrote for it. A user's config still naming it shows it missing;
	// hubsync's config drops it.
	must(t, f.Relabel(ctx, c1, clusterv1beta2.ClusterSetLabel, ""))
	f.waitProfileGone(t, c1)
	k.waitGone(t, c1)
	if source == config.KueueSourceSecret {
		waitSecretGone(t, k, hub.KubeconfigSecretName(c1))
	}
	k.waitCheck(t, userCfg, metav1.ConditionTrue, "SomeActiveClusters", fmt.Sprintf("Missing clusters: [%s]", c1))
	expectConfigClusters(t, k, hubsyncCfg, c2)
	k.waitCheck(t, hubsyncCfg, metav1.ConditionTrue, "Active", activeMessage)
	k.waitActive(t, c2)

	// The binding goes: so does every profile, every MultiKueueCluster
	// and hubsync's MultiKueueConfig (a config must list a cluster).
	must(t, f.Unbind(ctx, kueueNS, set))
	f.waitProfileGone(t, c2)
	k.waitGone(t, c2)
	if source == config.KueueSourceSecret {
		waitSecretGone(t, k, hub.KubeconfigSecretName(c2))
	}
	k.waitCheck(t, userCfg, metav1.ConditionFalse, "NoUsableClusters", fmt.Sprintf("Missing clusters: [%s %s]", c1, c2))
	k.waitCheck(t, hubsyncCfg, metav1.ConditionFalse, "BadConfig", "not found")
}

// expectMKC waits for the MultiKueueCluster hubsync writes for profile:
// hubsync's labels and the source's clusterSource; for source secret, the
// kubeconfig Secret it names, holding tok inline.
func expectMKC(t *testing.T, k *kueueController, source, profile string, tok controlplane.BoundToken) {
	t.Helper()
	testutil.Eventually(t, 60*time.Second, 100*time.Millisecond, func() error {
		m, err := k.mkc(t.Context(), profile)
		if err != nil || m == nil {
			return fmt.Errorf("MultiKueueCluster %s: %v", profile, err)
		}
		if m.Labels[hub.LabelManagedBy] != hub.ManagedBy || m.Labels[hub.LabelSink] != sinkName {
			return fmt.Errorf("labels %v", m.Labels)
		}
		cs := m.Spec.ClusterSource
		if source == config.KueueSourceClusterProfile {
			if cs.ClusterProfileRef == nil || cs.ClusterProfileRef.Name != profile || cs.KubeConfig != nil {
				return fmt.Errorf("clusterSource %+v, want clusterProfileRef %s", cs, profile)
			}
			return nil
		}
		name := hub.KubeconfigSecretName(profile)
		if cs.KubeConfig == nil || cs.KubeConfig.LocationType != kueue.SecretLocationType || cs.KubeConfig.Location != name || cs.ClusterProfileRef != nil {
			return fmt.Errorf("clusterSource %+v, want kubeConfig Secret %s", cs, name)
		}
		return secretHolds(t, k, name, tok)
	}, "hubsync's MultiKueueCluster %s (source %s)", profile, source)
	if source == config.KueueSourceClusterProfile {
		// No kubeconfig Secret with this source: Kueue builds the client.
		if s, err := k.secret(t.Context(), hub.KubeconfigSecretName(profile)); err != nil || s != nil {
			t.Errorf("source clusterProfile: kubeconfig Secret %s exists (%v)", hub.KubeconfigSecretName(profile), err)
		}
	}
}

// secretHolds checks that the kubeconfig Secret name is hubsync's and
// holds a kubeconfig with tok inline, for the worker.
func secretHolds(t *testing.T, k *kueueController, name string, tok controlplane.BoundToken) error {
	s, err := k.secret(t.Context(), name)
	if err != nil || s == nil {
		return fmt.Errorf("kubeconfig Secret %s: %v", name, err)
	}
	if s.Labels[hub.LabelManagedBy] != hub.ManagedBy || s.Labels[hub.LabelSink] != sinkName {
		return fmt.Errorf("Secret %s labels %v", name, s.Labels)
	}
	kc, err := clientcmd.Load(s.Data[kueue.MultiKueueConfigSecretKey])
	if err != nil {
		return fmt.Errorf("Secret %s: %v", name, err)
	}
	ctx := kc.Contexts[kc.CurrentContext]
	if ctx == nil || kc.AuthInfos[ctx.AuthInfo] == nil || kc.Clusters[ctx.Cluster] == nil {
		return fmt.Errorf("Secret %s: no complete current context", name)
	}
	if kc.AuthInfos[ctx.AuthInfo].Token != tok.Token {
		return fmt.Errorf("Secret %s does not hold token %s", name, tok.Secret)
	}
	if c := kc.Clusters[ctx.Cluster]; c.Server != suite.worker.server() {
		return fmt.Errorf("Secret %s: server %s, want the worker's %s", name, c.Server, suite.worker.server())
	}
	return nil
}

// rotateAndRevoke rotates c's token from a to b and revokes a, with
// Kueue's Active condition of c and of other polled all along: they must
// stay True (and c's must not even flip and back: its transition time
// stays), and Kueue's remote client of c must reach the worker with b
// after the worker has refused a, with no request refused.
func rotateAndRevoke(t *testing.T, f *hubFixture, k *kueueController, source, c string, a, b controlplane.BoundToken, other string) {
	t.Helper()
	before := k.waitActive(t, c)
	watch := k.watchActive(c, other)
	rotated := time.Now()
	f.rotate(t, c, b)
	f.waitCopy(t, c, b)
	if source == config.KueueSourceSecret {
		testutil.Eventually(t, 60*time.Second, 100*time.Millisecond, func() error {
			return secretHolds(t, k, hub.KubeconfigSecretName(c), b)
		}, "hubsync rewrites the kubeconfig Secret of %s with the new token", c)
	}
	// Kueue's client moves to b on its own: the rewritten Secret
	// (source secret) or the plugin's next run (source clusterProfile).
	suite.worker.usedAfter(t, b, rotated, 1, 60*time.Second)
	t.Logf("Kueue's client of %s used the new token %s after the rotation", c, time.Since(rotated).Round(time.Millisecond))
	rejected := suite.worker.revoke(t, a)
	t.Logf("old token refused by the worker %s after the rotation", rejected.Sub(rotated).Round(time.Millisecond))
	// Kueue's garbage collector lists through the remote client every
	// gcInterval: it must go on working past the refusal.
	suite.worker.keepsWorking(t, b, rejected)
	n, bad := watch.result()
	for _, s := range bad {
		t.Errorf("not Active during the rotation: %s", s)
	}
	if n == 0 {
		t.Error("the Active condition was never read during the rotation")
	}
	if now, err := k.active(t.Context(), c); err != nil || !now.LastTransitionTime.Equal(&before.LastTransitionTime) {
		t.Errorf("Active condition of %s after the rotation: %+v (%v), before: %+v", c, now, err, before)
	}
	t.Logf("Active read %d times over the rotation and revocation (%s), never anything but True", n, time.Since(rotated).Round(time.Millisecond))
}

// expectConfigClusters waits until hubsync's MultiKueueConfig lists
// exactly clusters (sorted), in any order.
func expectConfigClusters(t *testing.T, k *kueueController, name string, clusters ...string) {
	t.Helper()
	testutil.Eventually(t, 60*time.Second, 100*time.Millisecond, func() error {
		c := &kueue.MultiKueueConfig{}
		if err := k.c.Get(t.Context(), client.ObjectKey{Name: name}, c); err != nil {
			return err
		}
		// hubsync keeps the order clusters were listed in (Kueue's
		// preference), which depends on which profile came first.
		if !slices.Equal(slices.Sorted(slices.Values(c.Spec.Clusters)), clusters) {
			return fmt.Errorf("spec.clusters %v", c.Spec.Clusters)
		}
		if c.Labels[hub.LabelManagedBy] != hub.ManagedBy {
			return fmt.Errorf("labels %v", c.Labels)
		}
		return nil
	}, "hubsync's MultiKueueConfig %s lists %v", name, clusters)
}

func waitSecretGone(t *testing.T, k *kueueController, name string) {
	t.Helper()
	testutil.Eventually(t, 60*time.Second, 100*time.Millisecond, func() error {
		s, err := k.secret(t.Context(), name)
		if err != nil {
			return err
		}
		if s != nil {
			return fmt.Errorf("still there")
		}
		return nil
	}, "kubeconfig Secret %s deleted", name)
}

// proveFiles runs three kubeconfig sinks over one cluster, token mode,
// consumer kueue and the default exec mode, and has Kueue read each file
// they write through a MultiKueueCluster of locationType Path: Kueue's
// own validateKubeconfig decides.
func proveFiles(t *testing.T, f *hubFixture, k *kueueController) {
	ctx := t.Context()
	toks := &tokens{}
	const set, c, ns = "files-set", "files-1", "kueue-files"
	suite.worker.identity(t, c)
	a := toks.add(suite.worker.mint(t, c, c+"-a"))
	must(t, f.CreateExclusiveSet(ctx, set))
	f.cluster(t, c, set, a)
	must(t, f.Namespace(ctx, ns))
	root := t.TempDir()
	sink := func(name string, k config.KubeconfigSink) config.Sink {
		k.Directory, k.AccessProvider, k.ManagedServiceAccount = filepath.Join(root, name), provider, msa
		return config.Sink{Name: name, Type: config.SinkKubeconfig, Filter: config.SinkFilter{Namespaces: []string{ns}}, Kubeconfig: &k}
	}
	sinks := []config.Sink{
		sink("files-token", config.KubeconfigSink{Auth: config.AuthToken}),
		sink("files-kueue", config.KubeconfigSink{Consumer: config.ConsumerKueue}),
		sink("files-exec", config.KubeconfigSink{Exec: config.ExecAuth{Command: f.plugin}}),
	}
	f.daemon(t, sinks, toks.list)
	must(t, f.Bind(ctx, ns, set, true))

	files := map[string]string{}
	for _, s := range sinks {
		files[s.Name] = oneFile(t, s.Kubeconfig.Directory)
		k.pathCluster(t, "path-"+s.Name, files[s.Name])
	}
	k.waitActive(t, "path-files-token")
	k.waitActive(t, "path-files-kueue")
	// The negative control: Kueue refuses the default exec-mode file.
	cond := k.waitInactive(t, "path-files-exec", insecureKubeConfig)
	if !strings.Contains(cond.Message, "exec plugins are not allowed") {
		t.Errorf("exec-mode file refused for another reason: %s", cond.Message)
	}

	// The files rewritten on rotation pass too: Kueue reads them again
	// (it watches their directory) and stays Active, and its clients
	// reach the worker with the new token once the old one is refused.
	b := toks.add(suite.worker.mint(t, c, c+"-b"))
	watch := k.watchActive("path-files-token", "path-files-kueue")
	rotated := time.Now()
	f.rotate(t, c, b)
	for _, name := range []string{"files-token", "files-kueue"} {
		testutil.Eventually(t, 60*time.Second, 100*time.Millisecond, func() error {
			return fileHolds(files[name], b)
		}, "sink %s rewrites its file with the new token", name)
	}
	suite.worker.usedAfter(t, b, rotated, 1, 60*time.Second)
	rejected := suite.worker.revoke(t, a)
	suite.worker.keepsWorking(t, b, rejected)
	n, bad := watch.result()
	for _, s := range bad {
		t.Errorf("not Active during the rotation: %s", s)
	}
	t.Logf("Active read %d times over the rotation and revocation", n)
	k.waitInactive(t, "path-files-exec", insecureKubeConfig)
}

// oneFile waits until dir holds one kubeconfig file (the sinks' temporary
// files start with a dot) and returns its path.
func oneFile(t *testing.T, dir string) string {
	t.Helper()
	var path string
	testutil.Eventually(t, 60*time.Second, 100*time.Millisecond, func() error {
		entries, err := os.ReadDir(dir)
		if err != nil {
			return err
		}
		var names []string
		for _, e := range entries {
			if !e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
				names = append(names, e.Name())
			}
		}
		if len(names) != 1 {
			return fmt.Errorf("files %v", names)
		}
		path = filepath.Join(dir, names[0])
		return nil
	}, "one kubeconfig file in %s", dir)
	return path
}

// fileHolds checks that the kubeconfig file at path holds tok.
func fileHolds(path string, tok controlplane.BoundToken) error {
	kc, err := clientcmd.LoadFromFile(path)
	if err != nil {
		return err
	}
	for _, a := range kc.AuthInfos {
		if a.Token == tok.Token {
			return nil
		}
	}
	return fmt.Errorf("%s does not hold token %s", path, tok.Secret)
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
