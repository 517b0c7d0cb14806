package multicluster_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	clusterv1 "open-cluster-management.io/api/cluster/v1"
	"sigs.k8s.io/cluster-inventory-api/pkg/access"
	"sigs.k8s.io/multicluster-runtime/pkg/multicluster"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/hub"
	"github.com/hubsync/hubsync/test/controlplane"
	"github.com/hubsync/hubsync/test/fleet"
	"github.com/hubsync/hubsync/test/leak"
	"github.com/hubsync/hubsync/test/pki"
	"github.com/hubsync/hubsync/test/testutil"
)

const (
	// providerName is the access provider hubsync writes and the
	// provider file names.
	providerName = "open-cluster-management"
	consumerNS   = "mcr-consumer"
	setName      = "mcr-proof"
	// memberLabel selects the clusters of the set.
	memberLabel = "mcr.hubsync.io/member"
	// phaseClaim is the cluster claim a phase's barrier sets: hubsync
	// copies it into the profile's properties, and the test waits until
	// the provider has read that version, so that every write a phase
	// caused is in before the next phase starts.
	phaseClaim = "mcr.hubsync.io/phase"
)

func clusterKey(name string) string { return consumerNS + "/" + name }

// proof is the fleet, hubsync and the consumer of the test.
type proof struct {
	hub    *fleet.Hub
	spokes []*spoke
	tokens map[string]controlplane.BoundToken
	logs   *fleet.LogBuffer
	hist   *history
	c      *consumer
	phases []phase
}

// phase is a step of the churn and the version of each profile its
// barrier wrote.
type phase struct {
	name    string
	quiet   bool // nothing a profile reflects changes: hubsync must not write
	barrier map[string]uint64
	took    time.Duration
}

// TestMulticlusterRuntimeProof: a multicluster-runtime controller engages
// both clusters through the profiles hubsync writes and `hubsync creds`,
// keeps reconciling across a rotation that revokes the old token, loses
// exactly the cluster whose profile goes; and while hubsync runs through
// heartbeats, relabels, the rotation and a CA change, every rebuild of a
// cluster is attributed to the write that caused it. A write that changes
// nothing a consumer reads fails the test.
func TestMulticlusterRuntimeProof(t *testing.T) {
	start := time.Now()
	p := newProof(t)
	p.startHubsync(t)
	p.awaitProfiles(t)
	dir := t.TempDir()
	hubKubeconfig := filepath.Join(dir, "hub.kubeconfig")
	if err := fleet.WriteKubeconfig(env.hub.Config, hubKubeconfig); err != nil {
		t.Fatal(err)
	}
	file := providerFile(t, dir, consumerNS, hubKubeconfig)
	// The history reads the provider file as the consumer does, and
	// starts first, so that it holds every write after the versions the
	// clusters are first engaged from.
	conf, err := access.NewFromFile(file)
	if err != nil {
		t.Fatal(err)
	}
	p.hist = startHistory(t, p.hub, conf, consumerNS)
	p.c = startConsumer(t, env.hub.Config, file)
	p.awaitEngaged(t, clusterNames...)
	p.reconcileEverywhere(t, "first")
	t.Logf("both clusters engaged and reconciled %s after the start", time.Since(start).Round(time.Millisecond))

	p.phase(t, "heartbeats", true, p.heartbeats)
	p.phase(t, "unrelated-relabel", true, func(t *testing.T) { p.relabelAll(t, "env", "b", "c") })
	p.phase(t, "clusterset-relabel", false, func(t *testing.T) { p.relabelSet(t, "green") })
	p.phase(t, "token-rotation", true, p.rotate)
	p.phase(t, "ca-bundle-change", false, p.changeCA)
	p.reconcileEverywhere(t, "after-ca-change")

	p.removeOne(t)
	p.report(t)
	t.Logf("proof ran %s", time.Since(start).Round(time.Millisecond))
}

// newProof makes the fleet: a consumer namespace bound to a label-selector
// set, and per managed cluster the controller's ServiceAccount, a token
// of it in an MSA token Secret (synced to profiles), and the
// ManagedCluster with its API server's URL and CA.
func newProof(t *testing.T) *proof {
	t.Helper()
	ctx := t.Context()
	h, err := fleet.NewHub(env.hub.Config)
	if err != nil {
		t.Fatal(err)
	}
	p := &proof{hub: h, tokens: map[string]controlplane.BoundToken{}}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(h.Namespace(ctx, consumerNS))
	must(h.CreateLabelSelectorSet(ctx, setName, &metav1.LabelSelector{MatchLabels: map[string]string{memberLabel: "yes"}}))
	must(h.Bind(ctx, consumerNS, setName, true))
	for i, name := range clusterNames {
		s := newSpoke(t, name, env.managed[i])
		p.spokes = append(p.spokes, s)
		tok := s.mintToken(t, "token-1")
		p.tokens[name] = tok
		_, err := h.CreateMSA(ctx, name, msaName, true)
		must(err)
		must(h.PutToken(ctx, name, msaName, tok.Token, map[string][]byte{hub.TokenKey: []byte(tok.Token), hub.CAKey: s.m.CA}))
		_, err = h.CreateCluster(ctx, fleet.ClusterSpec{
			Name:          name,
			Labels:        map[string]string{memberLabel: "yes", hub.LabelClusterSet: "blue", "env": "a"},
			ClientConfigs: []clusterv1.ClientConfig{{URL: s.m.Config.Host, CABundle: s.m.CA}},
		})
		must(err)
	}
	return p
}

// startHubsync runs the hubsync binary with a direct access provider
// (each managed API server's own URL and CA) until the test ends.
func (p *proof) startHubsync(t *testing.T) {
	t.Helper()
	conf := *config.Default()
	conf.AccessProviders = []config.AccessProvider{{Name: providerName, Type: config.ProviderDirect}}
	conf.Bus.Enabled = ptr.To(false)
	p.logs = &fleet.LogBuffer{}
	d, err := fleet.StartDaemon(context.Background(), env.hubsync, env.hub.Config, conf, p.logs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.Stop(); err != nil {
			t.Errorf("hubsync: %v", err)
		}
		texts := map[string]string{"hubsync's log": p.logs.String(), "the controller's log": env.ctrlLogs.String()}
		for what, text := range texts {
			for _, f := range leak.Tokens(text, p.hub.Tokens()) {
				t.Errorf("%s appears in %s", f, what)
			}
		}
		if t.Failed() {
			t.Logf("hubsync log:\n%s\ncontroller log:\n%s", p.logs, env.ctrlLogs)
		}
	})
	if err := d.WaitReady(t.Context(), 2*time.Minute); err != nil {
		t.Fatal(err)
	}
}

// awaitProfiles waits for each cluster's profile, healthy and with the
// direct access provider, and its credential copy.
func (p *proof) awaitProfiles(t *testing.T) {
	t.Helper()
	for _, s := range p.spokes {
		testutil.Eventually(t, 60*time.Second, 100*time.Millisecond, func() error {
			prof, err := p.hub.Profiles.ApisV1alpha1().ClusterProfiles(consumerNS).Get(t.Context(), s.name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if c := meta.FindStatusCondition(prof.Status.Conditions, "ControlPlaneHealthy"); c == nil || c.Status != metav1.ConditionTrue {
				return fmt.Errorf("ControlPlaneHealthy %+v", c)
			}
			for _, e := range prof.Status.AccessProviders {
				if e.Name == providerName && e.Cluster.Server == s.m.Config.Host {
					return p.copyHolds(t, s.name, p.tokens[s.name])
				}
			}
			return fmt.Errorf("access providers %+v", prof.Status.AccessProviders)
		}, "profile and credential copy of %s", s.name)
	}
}

// copyHolds says whether the cluster's credential copy holds tok.
func (p *proof) copyHolds(t *testing.T, cluster string, tok controlplane.BoundToken) error {
	sec, err := p.hub.Kube.CoreV1().Secrets(consumerNS).Get(t.Context(), hub.CopyName(cluster, msaName), metav1.GetOptions{})
	if err != nil {
		return err
	}
	if got, want := sec.Annotations[hub.AnnotationTokenFingerprint], hub.TokenFingerprint([]byte(tok.Token)); got != want {
		return fmt.Errorf("copy of %s holds fingerprint %s, want %s", cluster, got, want)
	}
	return nil
}

// awaitEngaged waits until the provider has engaged the named clusters.
func (p *proof) awaitEngaged(t *testing.T, names ...string) {
	t.Helper()
	testutil.Eventually(t, 60*time.Second, 100*time.Millisecond, func() error {
		engaged := p.c.provider.Engaged()
		for _, n := range names {
			if _, ok := engaged[clusterKey(n)]; !ok {
				return fmt.Errorf("%s not engaged (engaged: %v)", n, engaged)
			}
		}
		return nil
	}, "clusters engaged by the multicluster provider\ncontroller log:\n%s", env.ctrlLogs)
}

// reconcileEverywhere creates a ConfigMap on every managed cluster and
// waits until the controller has reconciled each, through the
// controller's own identity on that cluster.
func (p *proof) reconcileEverywhere(t *testing.T, name string) {
	t.Helper()
	for _, s := range p.spokes {
		s.putConfigMap(t, name)
	}
	for _, s := range p.spokes {
		took := s.awaitReconciled(t, name, clusterKey(s.name))
		who, err := s.updaters(name)
		if err != nil {
			t.Fatal(err)
		}
		want := "system:serviceaccount:" + agentNS + ":" + msaName
		if len(who) == 0 || who[len(who)-1] != want {
			t.Errorf("ConfigMap %s on %s updated by %v, want %s (the ManagedServiceAccount's identity)", name, s.name, who, want)
		}
		t.Logf("ConfigMap %s on %s reconciled in %s", name, s.name, took.Round(time.Millisecond))
	}
}

// phase runs one step of the churn, then its barrier: a claim hubsync
// copies into each profile, whose version the provider must have read.
func (p *proof) phase(t *testing.T, name string, quiet bool, do func(t *testing.T)) {
	t.Helper()
	start := time.Now()
	do(t)
	ph := phase{name: name, quiet: quiet, barrier: map[string]uint64{}}
	for _, s := range p.spokes {
		err := p.hub.UpdateClusterStatus(t.Context(), s.name, func(st *clusterv1.ManagedClusterStatus) {
			claims := []clusterv1.ManagedClusterClaim{{Name: phaseClaim, Value: name}}
			for _, c := range st.ClusterClaims {
				if c.Name != phaseClaim {
					claims = append(claims, c)
				}
			}
			st.ClusterClaims = claims
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range p.spokes {
		key := clusterKey(s.name)
		testutil.Eventually(t, 60*time.Second, 50*time.Millisecond, func() error {
			w, ok := p.hist.firstWith(key, phaseClaim, name)
			if !ok {
				return fmt.Errorf("no profile version with %s=%s yet", phaseClaim, name)
			}
			if got := rv(p.c.provider.LastRead(key)); got < w.rv {
				return fmt.Errorf("the provider read version %d, the barrier wrote %d", got, w.rv)
			}
			ph.barrier[key] = w.rv
			return nil
		}, "barrier of phase %s on %s", name, s.name)
	}
	ph.took = time.Since(start)
	p.phases = append(p.phases, ph)
	t.Logf("phase %s done in %s", name, ph.took.Round(time.Millisecond))
}

// heartbeats does what a registration agent does while nothing changes:
// it renews its lease and reports its status (capacity moves, conditions
// are set again as they are), three times over.
func (p *proof) heartbeats(t *testing.T) {
	ctx := t.Context()
	for round := range 3 {
		for _, s := range p.spokes {
			if err := p.renewLease(ctx, s.name); err != nil {
				t.Fatal(err)
			}
			err := p.hub.UpdateClusterStatus(ctx, s.name, func(st *clusterv1.ManagedClusterStatus) {
				q := clusterv1.ResourceList{
					clusterv1.ResourceCPU:    resource.MustParse(fmt.Sprint(4 + round)),
					clusterv1.ResourceMemory: resource.MustParse(fmt.Sprintf("%dGi", 16+round)),
				}
				st.Capacity, st.Allocatable = q, q
				meta.SetStatusCondition(&st.Conditions, metav1.Condition{
					Type: clusterv1.ManagedClusterConditionAvailable, Status: metav1.ConditionTrue,
					Reason: "ManagedClusterAvailable", Message: "Managed cluster is available",
				})
			})
			if err != nil {
				t.Fatal(err)
			}
		}
	}
}

// renewLease renews the registration agent's lease in the cluster's
// namespace on the hub.
func (p *proof) renewLease(ctx context.Context, cluster string) error {
	leases := p.hub.Kube.CoordinationV1().Leases(cluster)
	now := metav1.NewMicroTime(time.Now())
	l, err := leases.Get(ctx, "managed-cluster-lease", metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = leases.Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: "managed-cluster-lease", Namespace: cluster},
			Spec:       coordinationv1.LeaseSpec{RenewTime: &now},
		}, metav1.CreateOptions{})
		return err
	}
	if err != nil {
		return err
	}
	l.Spec.RenewTime = &now
	_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
	return err
}

// relabelAll sets a label of every cluster to each value in turn.
func (p *proof) relabelAll(t *testing.T, key string, values ...string) {
	for _, v := range values {
		for _, s := range p.spokes {
			if err := p.hub.Relabel(t.Context(), s.name, key, v); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// relabelSet moves every cluster to another clusterset label value; the
// label-selector set keeps them, and hubsync must relabel the profiles.
func (p *proof) relabelSet(t *testing.T, value string) {
	p.relabelAll(t, hub.LabelClusterSet, value)
	for _, s := range p.spokes {
		testutil.Eventually(t, 30*time.Second, 50*time.Millisecond, func() error {
			prof, err := p.hub.Profiles.ApisV1alpha1().ClusterProfiles(consumerNS).Get(t.Context(), s.name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if got := prof.Labels[hub.LabelProfileSet]; got != value {
				return fmt.Errorf("profile label %s=%q", hub.LabelProfileSet, got)
			}
			return nil
		}, "profile of %s relabelled", s.name)
	}
}

// rotate rotates every cluster's token as the managed-serviceaccount
// agent does, waits for the copies, revokes the old tokens, waits until
// the managed API servers reject them, and then requires new ConfigMaps
// to be reconciled: the controller's long-lived clusters must switch to
// the new token.
func (p *proof) rotate(t *testing.T) {
	old := map[string]controlplane.BoundToken{}
	for _, s := range p.spokes {
		tok := s.mintToken(t, "token-2")
		old[s.name], p.tokens[s.name] = p.tokens[s.name], tok
		if err := p.hub.PutToken(t.Context(), s.name, msaName, tok.Token, map[string][]byte{hub.TokenKey: []byte(tok.Token), hub.CAKey: s.m.CA}); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range p.spokes {
		testutil.Eventually(t, 30*time.Second, 50*time.Millisecond, func() error {
			return p.copyHolds(t, s.name, p.tokens[s.name])
		}, "copy of %s rotated", s.name)
	}
	for _, s := range p.spokes {
		took := s.revoke(t, old[s.name])
		t.Logf("old token of %s rejected %s after its revocation", s.name, took.Round(time.Millisecond))
	}
	p.reconcileEverywhere(t, "after-rotation")
	_, failures, lastErr := p.c.reconciler.counts()
	for _, s := range p.spokes {
		t.Logf("%s: %d failed ConfigMap updates so far (last: %q)", s.name, failures[clusterKey(s.name)], lastErr[clusterKey(s.name)])
	}
}

// changeCA adds a second CA to every cluster's CA bundle, as the first
// step of a CA rotation: a real change of the access config, which must
// rebuild the cluster.
func (p *proof) changeCA(t *testing.T) {
	extra, err := pki.NewCA("mcr-next-ca")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range p.spokes {
		bundle := append(append([]byte(nil), s.m.CA...), extra.PEM...)
		err := p.hub.UpdateCluster(t.Context(), s.name, func(c *clusterv1.ManagedCluster) {
			c.Spec.ManagedClusterClientConfigs = []clusterv1.ClientConfig{{URL: s.m.Config.Host, CABundle: bundle}}
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// removeOne takes the second cluster out of the set: its profile goes,
// the provider disengages it, and the first keeps working without being
// rebuilt.
func (p *proof) removeOne(t *testing.T) {
	t.Helper()
	ctx := t.Context()
	keep, gone := p.spokes[0], p.spokes[1]
	keptVersion := p.c.provider.Engaged()[clusterKey(keep.name)]
	if err := p.hub.Relabel(ctx, gone.name, memberLabel, ""); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 60*time.Second, 50*time.Millisecond, func() error {
		if _, ok := p.c.provider.Engaged()[clusterKey(gone.name)]; ok {
			return errors.New("still engaged")
		}
		return nil
	}, "%s disengaged once its profile is gone", gone.name)
	if _, err := p.c.mgr.GetCluster(ctx, clusterKey(gone.name)); !errors.Is(err, multicluster.ErrClusterNotFound) {
		t.Errorf("the manager still finds %s: %v", gone.name, err)
	}
	gone.putConfigMap(t, "after-removal")
	keep.putConfigMap(t, "after-removal")
	keep.awaitReconciled(t, "after-removal", clusterKey(keep.name))
	if p.c.reconciler.saw(clusterKey(gone.name), "after-removal") {
		t.Errorf("the controller reconciled a ConfigMap of %s after its profile was removed", gone.name)
	}
	if v := p.c.provider.Engaged()[clusterKey(keep.name)]; v != keptVersion {
		t.Errorf("%s was rebuilt (version %s, was %s) when %s was removed", keep.name, v, keptVersion, gone.name)
	}
	st := p.c.provider.Stats()
	t.Logf("%s disengaged (disengagements: %d); %s kept working", gone.name, st.Disengaged, keep.name)
}
