package kubeconfig

import (
	"context"
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"

	"k8s.io/client-go/kubernetes/fake"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/sinks"
	"github.com/hubsync/hubsync/stream"
)

func consumerKueue(k *config.KubeconfigSink) { k.Consumer = config.ConsumerKueue }

// inode is the inode number of path: a file replaced by a rename has a
// new one, a file written in place keeps it.
func inode(t *testing.T, path string) uint64 {
	t.Helper()
	st, ok := stat(t, path).Sys().(*syscall.Stat_t)
	if !ok {
		t.Skip("no inode numbers on this platform")
	}
	return st.Ino
}

// TestKueueConsumerFiles: with consumer kueue the sink writes token-mode
// files that pass Kueue's rules (token and CA data inline, no token file,
// no exec plugin), and replaces the file with a rename on rotation, so
// Kueue's watch of the directory sees a whole new file and never half of
// one.
func TestKueueConsumerFiles(t *testing.T) {
	f := newFixture(t, "", consumerKueue)
	if !f.sink.tokenMode {
		t.Fatal("consumer kueue did not default to token mode")
	}
	path := f.path(testNS, testCluster)
	f.setToken(t, testNS, testCluster, "token-1")
	f.deliver(t,
		profile(stream.ProfileCreated, testNS, testCluster, provider(testServer)),
		credential(stream.CredentialSynced, testNS, testCluster, testMSA))
	cfg := load(t, path)
	if err := sinks.CheckKueueKubeconfig(cfg); err != nil {
		t.Fatalf("Kueue would refuse the file: %v", err)
	}
	u := cfg.AuthInfos[cfg.Contexts[cfg.CurrentContext].AuthInfo]
	cl := cfg.Clusters[cfg.Contexts[cfg.CurrentContext].Cluster]
	if u.Token != "token-1" || u.TokenFile != "" || u.Exec != nil || string(cl.CertificateAuthorityData) != string(testCA) || cl.CertificateAuthority != "" {
		t.Errorf("user %+v, cluster %+v: want the token and the CA inline", u, cl)
	}
	before := inode(t, path)

	f.setToken(t, testNS, testCluster, "token-2")
	f.deliver(t, credential(stream.CredentialRotated, testNS, testCluster, testMSA))
	cfg = load(t, path)
	if u := cfg.AuthInfos[cfg.Contexts[cfg.CurrentContext].AuthInfo]; u.Token != "token-2" {
		t.Errorf("token after rotation = %q, want token-2", u.Token)
	}
	if err := sinks.CheckKueueKubeconfig(cfg); err != nil {
		t.Errorf("Kueue would refuse the rotated file: %v", err)
	}
	if inode(t, path) == before {
		t.Error("the file was rewritten in place, not replaced by a rename")
	}
	entries, err := os.ReadDir(f.dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 {
		t.Errorf("directory holds %d entries after the rotation, want the one file", len(entries))
	}
}

// TestKueueConsumerRefusesBadHost: a profile whose server host Kueue would
// refuse gets no file, in a delivery or a resync, without an error (a
// retry cannot change the verdict); the refusal is logged without the
// token; a file written before the server changed is left as it was.
func TestKueueConsumerRefusesBadHost(t *testing.T) {
	const bad = "https://proxy_user.ocm:9092/eu"
	f := newFixture(t, "", consumerKueue)
	path := f.path(testNS, testCluster)
	f.setToken(t, testNS, testCluster, "secret-token")
	f.deliver(t,
		profile(stream.ProfileCreated, testNS, testCluster, provider(bad)),
		credential(stream.CredentialSynced, testNS, testCluster, testMSA))
	if exists(t, path) {
		t.Fatal("a file Kueue would refuse was written")
	}
	if !strings.Contains(f.logs.String(), "Kueue's MultiKueue would refuse") || !strings.Contains(f.logs.String(), `server host \"proxy_user.ocm\"`) {
		t.Errorf("the refusal is not logged with its reason:\n%s", f.logs.String())
	}
	snapshot := []stream.Change{
		profile(stream.ProfileCreated, testNS, testCluster, provider(bad)),
		credential(stream.CredentialSynced, testNS, testCluster, testMSA),
	}
	if err := f.sink.Resync(context.Background(), snapshot); err != nil {
		t.Fatalf("Resync: %v", err)
	}
	if exists(t, path) {
		t.Fatal("a resync wrote a file Kueue would refuse")
	}

	f.deliver(t, profile(stream.AccessProviderUpdated, testNS, testCluster, provider(testServer)))
	good, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	f.deliver(t, profile(stream.AccessProviderUpdated, testNS, testCluster, provider(bad)))
	if err := f.sink.Resync(context.Background(), snapshot); err != nil {
		t.Fatalf("Resync: %v", err)
	}
	if after, err := os.ReadFile(path); err != nil || string(after) != string(good) {
		t.Errorf("the file written before the server went bad changed or went (%v)", err)
	}
	if strings.Contains(f.logs.String(), "secret-token") {
		t.Error("the token reached the log")
	}
}

// TestExecFilesRefusedByKueue is why consumer kueue exists: an exec-mode
// file, the kubeconfig sink's default, breaks Kueue's rules.
func TestExecFilesRefusedByKueue(t *testing.T) {
	f := newFixture(t, config.AuthExec)
	f.deliver(t, profile(stream.ProfileCreated, testNS, testCluster, provider(testServer)))
	err := sinks.CheckKueueKubeconfig(load(t, f.path(testNS, testCluster)))
	if !errors.Is(err, sinks.ErrKueueRefuses) || !strings.Contains(err.Error(), "runs an exec plugin") {
		t.Errorf("CheckKueueKubeconfig(exec-mode file) = %v, want refused for its exec plugin", err)
	}
}

// TestNewConsumerKueue: a consumer kueue sink with exec auth (which
// validation refuses) is refused by New as well.
func TestNewConsumerKueue(t *testing.T) {
	c := config.Sink{Name: "s", Type: config.SinkKubeconfig, Kubeconfig: &config.KubeconfigSink{
		Directory: "/etc/multikueue/kubeconfigs", AccessProvider: testProvider, ManagedServiceAccount: testMSA,
		Consumer: config.ConsumerKueue, Auth: config.AuthExec,
	}}
	c.SetDefaults()
	if _, err := New(c, sinks.Deps{Kube: fake.NewClientset()}); err == nil || !strings.Contains(err.Error(), "Kueue refuses exec plugins") {
		t.Errorf("New = %v, want refused", err)
	}
}
