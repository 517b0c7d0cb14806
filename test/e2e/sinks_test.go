package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clusterv1 "open-cluster-management.io/api/cluster/v1"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/hub"
	"github.com/hubsync/hubsync/test/controlplane"
	"github.com/hubsync/hubsync/test/fleet"
	"github.com/hubsync/hubsync/test/leak"
	"github.com/hubsync/hubsync/test/testutil"
)

// kubeconfigFiles lists the kubeconfig files a sink keeps in dir (its
// temporary files start with a dot).
func kubeconfigFiles(dir string) (map[string][]byte, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	out := map[string][]byte{}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") || e.IsDir() {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		out[e.Name()] = data
	}
	return out, nil
}

// oneKubeconfig waits for dir to hold exactly one kubeconfig file whose
// server is server, and returns its path.
func oneKubeconfig(h *harness, dir, server string) string {
	h.t.Helper()
	var path string
	h.eventually("one kubeconfig file in "+dir, func() error {
		files, err := kubeconfigFiles(dir)
		if err != nil {
			return err
		}
		if len(files) != 1 {
			return fmt.Errorf("%d files", len(files))
		}
		for name, data := range files {
			kc, err := clientcmd.Load(data)
			if err != nil {
				return fmt.Errorf("%s: %v", name, err)
			}
			for _, c := range kc.Clusters {
				if c.Server != server {
					return fmt.Errorf("%s: server %s, want %s", name, c.Server, server)
				}
			}
			path = filepath.Join(dir, name)
		}
		return nil
	})
	return path
}

// clientFromFile builds a client from a kubeconfig file, as a tool that
// reads files does.
func clientFromFile(t *testing.T, path string) kubernetes.Interface {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Timeout = 10 * time.Second
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return kube
}

// whoami returns the JTI of the token a client authenticates with.
func whoami(ctx context.Context, kube kubernetes.Interface) (string, error) {
	r, err := kube.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		return "", err
	}
	if jti := controlplane.CredentialJTI(r.Status.UserInfo.Extra); jti != "" {
		return jti, nil
	}
	return "", fmt.Errorf("no credential id in %v", r.Status.UserInfo.Extra)
}

// TestKubeconfigSinkThroughRotation runs the daemon with two kubeconfig
// sinks, exec and token mode, against a real second kube-apiserver as the
// managed cluster. A long-lived client-go client built from the exec-mode
// file keeps working through a rotation and the revocation of the old
// token (the file itself never changes); the token-mode file is rewritten
// with the new token. Files are 0600 in 0700 directories, and leave with
// the profile.
func TestKubeconfigSinkThroughRotation(t *testing.T) {
	bin := testutil.Hubsync(t)
	m := startManagedCluster(t)
	h := newHarnessWithoutSyncer(t)
	const msa = "kueue"
	ns := h.namespaces("kueue")[0]
	set, cluster := h.name("set"), h.name("edge-eu-1")
	h.must(h.hub.CreateExclusiveSet(h.ctx, set))
	h.cluster(cluster, set, nil)
	h.must(h.hub.UpdateCluster(h.ctx, cluster, func(c *clusterv1.ManagedCluster) {
		c.Spec.ManagedClusterClientConfigs = []clusterv1.ClientConfig{{URL: m.cfg.Host, CABundle: m.cfg.CAData}}
	}))
	h.must(h.hub.Bind(h.ctx, ns, set, true))
	tokA, tokB := m.mintToken(t, "token-a"), m.mintToken(t, "token-b")
	_, err := h.hub.CreateMSA(h.ctx, cluster, msa, true)
	h.must(err)
	h.must(h.hub.PutToken(h.ctx, cluster, msa, "", map[string][]byte{hub.TokenKey: []byte(tokA.Token), hub.CAKey: m.cfg.CAData}))
	// A short declared expiry makes client-go run the plugin again during
	// the test (see TestConsumerPathSurvivesRotation).
	expA := time.Now().Add(8 * time.Second).UTC().Truncate(time.Second)
	h.must(h.hub.SetMSAExpiration(h.ctx, cluster, msa, expA))

	// The exec plugin reads the copy from the hub with this kubeconfig.
	dir := t.TempDir()
	hubKubeconfig := filepath.Join(dir, "hub.kubeconfig")
	h.must(fleet.WriteKubeconfig(hubConfig, hubKubeconfig))
	t.Setenv("KUBECONFIG", hubKubeconfig)
	execDir, tokenDir := filepath.Join(dir, "exec"), filepath.Join(dir, "token")
	sink := func(name, dir, auth string) config.Sink {
		return config.Sink{Name: name, Type: config.SinkKubeconfig, Filter: config.SinkFilter{Namespaces: []string{ns}},
			Kubeconfig: &config.KubeconfigSink{Directory: dir, AccessProvider: "direct", ManagedServiceAccount: msa, Auth: auth,
				Exec: config.ExecAuth{Command: bin}}}
	}
	conf := config.Config{
		AccessProviders: []config.AccessProvider{{Name: "direct", Type: config.ProviderDirect}},
		Sinks:           []config.Sink{sink("files-exec", execDir, config.AuthExec), sink("files-token", tokenDir, config.AuthToken)},
	}
	logs := &fleet.LogBuffer{}
	d, err := fleet.StartDaemon(h.ctx, bin, hubConfig, conf, logs)
	h.must(err)
	t.Cleanup(func() {
		_ = d.Stop()
		if t.Failed() {
			t.Logf("hubsync logs:\n%s", logs.String())
		}
	})
	h.must(d.WaitReady(h.ctx, 60*time.Second))

	execFile := oneKubeconfig(h, execDir, m.cfg.Host)
	tokenFile := oneKubeconfig(h, tokenDir, m.cfg.Host)
	for _, p := range []struct {
		path string
		mode os.FileMode
	}{{execFile, 0o600}, {tokenFile, 0o600}, {execDir, 0o700 | os.ModeDir}, {tokenDir, 0o700 | os.ModeDir}} {
		fi, err := os.Stat(p.path)
		h.must(err)
		if fi.Mode() != p.mode {
			t.Errorf("%s: mode %v, want %v", p.path, fi.Mode(), p.mode)
		}
	}
	if !strings.Contains(filepath.Base(execFile), cluster) {
		t.Errorf("file name %s does not name the cluster %s", filepath.Base(execFile), cluster)
	}
	execBefore, err := os.ReadFile(execFile)
	h.must(err)
	if strings.Contains(string(execBefore), tokA.Token) {
		t.Fatal("the exec-mode file holds the token")
	}

	// One long-lived client from the exec-mode file, probing all along.
	longLived := clientFromFile(t, execFile)
	var mu sync.Mutex
	var seen []string // JTIs in order of use
	var failures []error
	probeCtx, stopProbe := context.WithCancel(h.ctx)
	probeDone := make(chan struct{})
	go func() {
		defer close(probeDone)
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			jti, err := whoami(probeCtx, longLived)
			if probeCtx.Err() != nil {
				return
			}
			mu.Lock()
			if err != nil {
				failures = append(failures, err)
			} else if len(seen) == 0 || seen[len(seen)-1] != jti {
				seen = append(seen, jti)
			}
			mu.Unlock()
			select {
			case <-probeCtx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	h.eventually("the exec-mode client authenticates with token A", func() error {
		mu.Lock()
		defer mu.Unlock()
		if !slices.Contains(seen, tokA.JTI) {
			return fmt.Errorf("seen %v", seen)
		}
		return nil
	})
	if jti, err := whoami(h.ctx, clientFromFile(t, tokenFile)); err != nil || jti != tokA.JTI {
		t.Fatalf("token-mode file: %q, %v; want token A", jti, err)
	}

	// Rotate as the agent does, then revoke token A.
	h.must(h.hub.PutToken(h.ctx, cluster, msa, "", map[string][]byte{hub.TokenKey: []byte(tokB.Token), hub.CAKey: m.cfg.CAData}))
	h.must(h.hub.SetMSAExpiration(h.ctx, cluster, msa, time.Now().Add(10*time.Minute)))
	h.eventually("the token-mode file holds token B", func() error {
		data, err := os.ReadFile(tokenFile)
		if err != nil {
			return err
		}
		kc, err := clientcmd.Load(data)
		if err != nil {
			return err
		}
		for _, a := range kc.AuthInfos {
			if a.Token == tokB.Token {
				return nil
			}
		}
		return fmt.Errorf("not yet")
	})
	m.revoke(t, tokA)
	h.eventually("the exec-mode client moved to token B", func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(seen) == 0 || seen[len(seen)-1] != tokB.JTI {
			return fmt.Errorf("seen %v", seen)
		}
		return nil
	})
	h.eventually("a client from the rewritten token-mode file authenticates with token B", func() error {
		jti, err := whoami(h.ctx, clientFromFile(t, tokenFile))
		if err != nil {
			return err
		}
		if jti != tokB.JTI {
			return fmt.Errorf("authenticated with %s", jti)
		}
		return nil
	})
	stopProbe()
	<-probeDone
	mu.Lock()
	if len(failures) > 0 {
		t.Errorf("the long-lived exec-mode client failed %d times through the rotation; first: %v", len(failures), failures[0])
	}
	mu.Unlock()
	execAfter, err := os.ReadFile(execFile)
	h.must(err)
	if string(execAfter) != string(execBefore) {
		t.Error("the exec-mode file changed on rotation")
	}
	// Nothing but the token-mode files holds a token, in any encoding:
	// every file of the exec-mode directory, the daemon's metrics and log.
	tokens := []string{tokA.Token, tokB.Token}
	h.must(filepath.WalkDir(execDir, func(path string, e os.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, f := range leak.Tokens(string(b), tokens) {
			t.Errorf("%s appears in the exec-mode sink's %s", f, path)
		}
		return nil
	}))
	metricsText, err := d.Metrics()
	h.must(err)
	for what, text := range map[string]string{"the daemon's /metrics": metricsText, "the daemon's log": logs.String()} {
		for _, f := range leak.Tokens(text, tokens) {
			t.Errorf("%s appears in %s", f, what)
		}
	}

	// The profile leaves with the binding; so do both files.
	h.must(h.hub.Cluster.ClusterV1beta2().ManagedClusterSetBindings(ns).Delete(h.ctx, set, metav1.DeleteOptions{}))
	h.eventually("files removed with the profile", func() error {
		for _, dir := range []string{execDir, tokenDir} {
			files, err := kubeconfigFiles(dir)
			if err != nil {
				return err
			}
			if len(files) != 0 {
				return fmt.Errorf("%s still holds %d files", dir, len(files))
			}
		}
		return nil
	})
}

// TestSinksHotReload edits the daemon's configuration the way a ConfigMap
// update does (a symlink swap in the mounted directory): a sink is added,
// changed and removed with no restart; a broken edit is rejected with
// every field-path error while the running sinks keep delivering.
func TestSinksHotReload(t *testing.T) {
	bin := testutil.Hubsync(t)
	h := newHarnessWithoutSyncer(t)
	ns := h.namespaces("tools")[0]
	set := h.name("set")
	h.must(h.hub.CreateExclusiveSet(h.ctx, set))
	h.must(h.hub.Bind(h.ctx, ns, set, true))
	addCluster := func(name string) {
		h.cluster(name, set, nil)
		h.must(h.hub.UpdateCluster(h.ctx, name, func(c *clusterv1.ManagedCluster) {
			c.Spec.ManagedClusterClientConfigs = []clusterv1.ClientConfig{{URL: "https://" + name + ".example:6443", CABundle: []byte("a CA")}}
		}))
	}
	addCluster(h.name("c1"))
	dir := t.TempDir()
	dirOne, dirTwo, dirThree := filepath.Join(dir, "one"), filepath.Join(dir, "two"), filepath.Join(dir, "three")
	sink := func(name, dir string) config.Sink {
		return config.Sink{Name: name, Type: config.SinkKubeconfig, Filter: config.SinkFilter{Namespaces: []string{ns}},
			Kubeconfig: &config.KubeconfigSink{Directory: dir, AccessProvider: "direct", ManagedServiceAccount: "tools"}}
	}
	conf := config.Config{
		AccessProviders: []config.AccessProvider{{Name: "direct", Type: config.ProviderDirect}},
		Sinks:           []config.Sink{sink("one", dirOne)},
	}
	d, cm, logs := h.startDaemonConfigMap(bin, hubConfig, conf)
	files := func(dir string, n int) {
		t.Helper()
		h.eventually(fmt.Sprintf("%d files in %s", n, filepath.Base(dir)), func() error {
			got, err := kubeconfigFiles(dir)
			if err != nil {
				return err
			}
			if len(got) != n {
				return fmt.Errorf("%d files", len(got))
			}
			return nil
		})
	}
	// metric waits until name's series with labels has the value want,
	// or, with present false, until there is no such series.
	metric := func(name string, labels testutil.Labels, want float64, present bool) {
		t.Helper()
		h.eventually(fmt.Sprintf("%s%v = %v (present %v)", name, labels, want, present), func() error {
			m, err := d.Scrape()
			if err != nil {
				return err
			}
			if got, ok := m.Lookup(name, labels); ok != present || got != want {
				return fmt.Errorf("%s%v = %v (present %v)", name, labels, got, ok)
			}
			return nil
		})
	}
	files(dirOne, 1)

	// Added.
	conf.Sinks = append(conf.Sinks, sink("two", dirTwo))
	h.must(d.WriteConfig(cm, conf))
	files(dirTwo, 1)
	metric("hubsync_sink_up", testutil.Labels{"sink": "two", "type": "kubeconfig"}, 1, true)
	metric("hubsync_config_reloads_total", testutil.Labels{"result": "applied"}, 1, true)

	// Changed: the sink starts anew in its new directory.
	conf.Sinks[1] = sink("two", dirThree)
	h.must(d.WriteConfig(cm, conf))
	files(dirThree, 1)
	metric("hubsync_config_reloads_total", testutil.Labels{"result": "applied"}, 2, true)

	// Broken: rejected with every problem, and delivery goes on.
	h.must(cm.Write([]byte("sinks:\n- name: two\n  type: kubeconfig\n  kubeconfig: {directory: relative}\n  retries: 3\n")))
	metric("hubsync_config_last_reload_successful", nil, 0, true)
	for _, want := range []string{"configuration reload rejected", "sinks[0].retries", "sinks[0].kubeconfig.directory", "sinks[0].kubeconfig.accessProvider"} {
		if err := testutil.Poll(h.ctx, 10*time.Second, 10*time.Millisecond, func() bool {
			return strings.Contains(logs.String(), want)
		}); err != nil {
			t.Errorf("log lacks %q", want)
		}
	}
	addCluster(h.name("c2"))
	files(dirOne, 2)
	files(dirThree, 2)

	// Removed: it stops, leaving its files as they are.
	conf.Sinks = conf.Sinks[:1]
	h.must(d.WriteConfig(cm, conf))
	metric("hubsync_config_last_reload_successful", nil, 1, true)
	metric("hubsync_sink_up", testutil.Labels{"sink": "two", "type": "kubeconfig"}, 0, false)
	addCluster(h.name("c3"))
	files(dirOne, 3)
	if got, err := kubeconfigFiles(dirThree); err != nil || len(got) != 2 {
		t.Errorf("the removed sink's directory holds %d files (%v), want the 2 it wrote", len(got), err)
	}
	select {
	case err := <-d.Done():
		t.Fatalf("hubsync exited: %v", err)
	default:
	}
	if n := strings.Count(logs.String(), "hubsync starting"); n != 1 {
		t.Errorf("hubsync started %d times, want once", n)
	}
}
