package kueue_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "open-cluster-management.io/api/cluster/v1"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/hub"
	"github.com/hubsync/hubsync/test/controlplane"
	"github.com/hubsync/hubsync/test/fleet"
	"github.com/hubsync/hubsync/test/leak"
	"github.com/hubsync/hubsync/test/testutil"
)

const (
	// provider is the access provider hubsync writes into every profile:
	// the worker's own endpoint (type direct, from the ManagedCluster's
	// client config), under the name Kueue's configuration matches.
	provider = "open-cluster-management"
	// msa is the ManagedServiceAccount whose synced credential Kueue uses.
	msa = "kueue"
)

// hubFixture is the test's OCM fleet on the hub and hubsync's binary.
type hubFixture struct {
	*fleet.Hub
	bin string
	// plugin is hubsync as `hubsync install` puts it in Kueue's pod
	// (docs/consumers.md).
	plugin string
	// kubeconfig is an admin kubeconfig of the hub, for hubsync creds.
	kubeconfig string
}

func newHubFixture(t *testing.T) *hubFixture {
	t.Helper()
	h, err := fleet.NewHub(suite.hub.Config)
	if err != nil {
		t.Fatal(err)
	}
	f := &hubFixture{Hub: h, bin: testutil.Hubsync(t), plugin: testutil.Plugin(t), kubeconfig: filepath.Join(t.TempDir(), "hub.kubeconfig")}
	if err := fleet.WriteKubeconfig(suite.hub.Config, f.kubeconfig); err != nil {
		t.Fatal(err)
	}
	if err := h.Namespace(t.Context(), kueueNS); err != nil {
		t.Fatal(err)
	}
	return f
}

// cluster registers a managed cluster in set whose API server is the
// worker, with a ManagedServiceAccount synced to its profiles holding tok.
func (f *hubFixture) cluster(t *testing.T, name, set string, tok controlplane.BoundToken) {
	t.Helper()
	ctx := t.Context()
	_, err := f.CreateCluster(ctx, fleet.ClusterSpec{
		Name:          name,
		Labels:        fleet.ExclusiveSetLabels(set, nil),
		ClientConfigs: []clusterv1.ClientConfig{{URL: suite.worker.server(), CABundle: suite.worker.m.CA}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.CreateMSA(ctx, name, msa, true); err != nil {
		t.Fatal(err)
	}
	f.rotate(t, name, tok)
}

// rotate does what the managed-serviceaccount agent does on a refresh:
// the new token into the hub token Secret, its expiry into the MSA's
// status.
func (f *hubFixture) rotate(t *testing.T, cluster string, tok controlplane.BoundToken) {
	t.Helper()
	ctx := t.Context()
	data := map[string][]byte{hub.TokenKey: []byte(tok.Token), hub.CAKey: suite.worker.m.CA}
	if err := f.PutToken(ctx, cluster, msa, "", data); err != nil {
		t.Fatal(err)
	}
	if err := f.SetMSAExpiration(ctx, cluster, msa, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
}

// waitCopy waits until the credential copy of cluster in Kueue's
// namespace holds tok.
func (f *hubFixture) waitCopy(t *testing.T, cluster string, tok controlplane.BoundToken) {
	t.Helper()
	name := hub.CopyName(cluster, msa)
	testutil.Eventually(t, 60*time.Second, 100*time.Millisecond, func() error {
		sec, err := f.Kube.CoreV1().Secrets(kueueNS).Get(t.Context(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if string(sec.Data[hub.TokenKey]) != tok.Token {
			return fmt.Errorf("copy %s does not hold token %s", name, tok.Secret)
		}
		return nil
	}, "credential copy %s/%s", kueueNS, name)
}

// waitProfileGone waits until the profile of cluster has left Kueue's
// namespace.
func (f *hubFixture) waitProfileGone(t *testing.T, cluster string) {
	t.Helper()
	testutil.Eventually(t, 60*time.Second, 100*time.Millisecond, func() error {
		_, err := f.Profiles.ApisV1alpha1().ClusterProfiles(kueueNS).Get(t.Context(), cluster, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("profile %s/%s still there (%v)", kueueNS, cluster, err)
	}, "profile %s leaves %s", cluster, kueueNS)
}

// daemon runs the hubsync binary with sinks, the access provider and
// defaults for everything else, until t ends. At the end no token of
// tokens may appear in its log or metrics.
func (f *hubFixture) daemon(t *testing.T, sinks []config.Sink, tokens func() []string) {
	t.Helper()
	conf := config.Config{
		AccessProviders: []config.AccessProvider{{Name: provider, Type: config.ProviderDirect}},
		Sinks:           sinks,
	}
	logs := &fleet.LogBuffer{}
	// Not t's context: it ends before the clean-up, which still reads the
	// daemon's metrics.
	ctx, cancel := context.WithCancel(context.Background())
	d, err := fleet.StartDaemon(ctx, f.bin, suite.hub.Config, conf, logs)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		defer cancel()
		metrics, merr := d.Metrics()
		if err := d.Stop(); err != nil {
			t.Errorf("hubsync: %v", err)
		}
		texts := map[string]string{"hubsync's log": logs.String(), "hubsync's /metrics": metrics}
		if merr != nil {
			t.Errorf("read hubsync's metrics: %v", merr)
		}
		for what, text := range texts {
			for _, found := range leak.Tokens(text, tokens()) {
				t.Errorf("%s appears in %s", found, what)
			}
		}
		if t.Failed() {
			t.Logf("hubsync's log:\n%s", logs.String())
		}
	})
	if err := d.WaitReady(t.Context(), 60*time.Second); err != nil {
		t.Fatalf("%v\n%s", err, logs.String())
	}
}
