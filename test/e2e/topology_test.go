package e2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "open-cluster-management.io/api/cluster/v1"
	clusterv1beta2 "open-cluster-management.io/api/cluster/v1beta2"
	cpv1alpha1 "sigs.k8s.io/cluster-inventory-api/apis/v1alpha1"

	"github.com/hubsync/hubsync/hub"
	"github.com/hubsync/hubsync/test/fleet"
)

// TestSelectorTypes covers both selector types, a set bound in several
// namespaces, a cluster in two sets bound to one namespace, {} and nil
// selectors, and unbound bindings.
func TestSelectorTypes(t *testing.T) {
	h := newHarness(t)
	ns := h.namespaces("a", "b", "c", "d")
	red, blue, all, none, prod := h.name("red"), h.name("blue"), h.name("all"), h.name("none"), h.name("prod")
	h.must(h.hub.CreateExclusiveSet(h.ctx, red))
	h.must(h.hub.CreateExclusiveSet(h.ctx, blue))
	h.must(h.hub.CreateLabelSelectorSet(h.ctx, all, &metav1.LabelSelector{}))
	h.must(h.hub.CreateLabelSelectorSet(h.ctx, none, nil))
	h.must(h.hub.CreateLabelSelectorSet(h.ctx, prod, &metav1.LabelSelector{MatchLabels: map[string]string{"env": h.name("prod")}}))
	r1, r2, b1 := h.name("r1"), h.name("r2"), h.name("b1")
	h.cluster(r1, red, map[string]string{"env": h.name("prod")})
	h.cluster(r2, red, nil)
	h.cluster(b1, blue, map[string]string{"env": h.name("prod")})

	h.must(h.hub.Bind(h.ctx, ns[0], red, true))
	h.must(h.hub.Bind(h.ctx, ns[1], red, true))
	h.must(h.hub.Bind(h.ctx, ns[1], prod, true)) // r1 through two sets
	h.must(h.hub.Bind(h.ctx, ns[2], all, true))
	h.must(h.hub.Bind(h.ctx, ns[2], none, true))
	h.must(h.hub.Bind(h.ctx, ns[3], blue, false)) // not Bound

	h.expectProfiles(ns[0], r1, r2)
	h.expectProfiles(ns[1], r1, r2, b1)
	h.expectProfiles(ns[2], r1, r2, b1)
	h.expectProfiles(ns[3])
}

func TestBindingLifecycle(t *testing.T) {
	h := newHarness(t)
	ns := h.namespaces("consumer")[0]
	set := h.name("set")
	h.must(h.hub.CreateExclusiveSet(h.ctx, set))
	c1, c2 := h.name("c1"), h.name("c2")
	h.cluster(c1, set, nil)
	h.cluster(c2, set, nil)

	h.must(h.hub.Bind(h.ctx, ns, set, false))
	h.waitIdle()
	h.expectProfiles(ns)

	h.must(h.hub.SetBound(h.ctx, ns, set, true))
	h.expectProfiles(ns, c1, c2)

	h.must(h.hub.SetBound(h.ctx, ns, set, false))
	h.expectProfiles(ns)

	h.must(h.hub.SetBound(h.ctx, ns, set, true))
	h.expectProfiles(ns, c1, c2)

	h.must(h.hub.Unbind(h.ctx, ns, set))
	h.expectProfiles(ns)
}

func TestSetChanges(t *testing.T) {
	h := newHarness(t)
	ns := h.namespaces("consumer")[0]
	set := h.name("sel")
	h.must(h.hub.CreateLabelSelectorSet(h.ctx, set, &metav1.LabelSelector{MatchLabels: map[string]string{"tier": "gold"}}))
	g, s := h.name("gold"), h.name("silver")
	h.cluster(g, "", map[string]string{"tier": "gold"})
	h.cluster(s, "", map[string]string{"tier": "silver"})
	h.must(h.hub.Bind(h.ctx, ns, set, true))
	h.expectProfiles(ns, g)

	h.must(h.hub.UpdateSet(h.ctx, set, func(cs *clusterv1beta2.ManagedClusterSet) {
		cs.Spec.ClusterSelector.LabelSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"tier": "silver"}}
	}))
	h.expectProfiles(ns, s)

	h.must(h.hub.UpdateSet(h.ctx, set, func(cs *clusterv1beta2.ManagedClusterSet) {
		cs.Spec.ClusterSelector.LabelSelector = &metav1.LabelSelector{
			MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "tier", Operator: metav1.LabelSelectorOpIn, Values: []string{"gold", "silver"}}},
		}
	}))
	h.expectProfiles(ns, g, s)

	h.must(h.hub.DeleteSet(h.ctx, set))
	h.expectProfiles(ns)
}

func TestClusterLifecycle(t *testing.T) {
	h := newHarness(t)
	ns := h.namespaces("red-consumer", "blue-consumer")
	red, blue := h.name("red"), h.name("blue")
	h.must(h.hub.CreateExclusiveSet(h.ctx, red))
	h.must(h.hub.CreateExclusiveSet(h.ctx, blue))
	h.must(h.hub.Bind(h.ctx, ns[0], red, true))
	h.must(h.hub.Bind(h.ctx, ns[1], blue, true))

	mover, stayer := h.name("mover"), h.name("stayer")
	h.cluster(mover, red, nil)
	h.cluster(stayer, red, nil)
	h.expectProfiles(ns[0], mover, stayer)
	h.expectProfiles(ns[1])

	// Relabelled: moves between sets at once (upstream waits for a resync).
	h.must(h.hub.Relabel(h.ctx, mover, clusterv1beta2.ClusterSetLabel, blue))
	h.expectProfiles(ns[0], stayer)
	h.expectProfiles(ns[1], mover)

	// Deleting behind a finalizer: its profiles go now, not when it is gone.
	held := h.name("held")
	_, err := h.hub.CreateCluster(h.ctx, fleet.ClusterSpec{Name: held, Labels: fleet.ExclusiveSetLabels(red, nil), Finalizers: []string{"test.hubsync.io/hold"}})
	h.must(err)
	h.expectProfiles(ns[0], stayer, held)
	h.must(h.hub.DeleteCluster(h.ctx, held))
	h.expectProfiles(ns[0], stayer)
	h.must(h.hub.UpdateCluster(h.ctx, held, func(c *clusterv1.ManagedCluster) { c.Finalizers = nil }))

	// Deleted.
	h.must(h.hub.DeleteCluster(h.ctx, mover))
	h.expectProfiles(ns[1])
	h.expectProfiles(ns[0], stayer)
}

func TestClusterStatus(t *testing.T) {
	h := newHarness(t)
	ns := h.namespaces("consumer")[0]
	set := h.name("set")
	h.must(h.hub.CreateExclusiveSet(h.ctx, set))
	h.must(h.hub.Bind(h.ctx, ns, set, true))
	c := h.name("c")
	h.cluster(c, set, nil)
	h.expectProfiles(ns, c)

	healthyAt := func() metav1.Time {
		p, err := h.hub.Profiles.ApisV1alpha1().ClusterProfiles(ns).Get(h.ctx, c, metav1.GetOptions{})
		h.must(err)
		return meta.FindStatusCondition(p.Status.Conditions, "ControlPlaneHealthy").LastTransitionTime
	}
	before := healthyAt()

	// Version and claims.
	h.must(h.hub.UpdateClusterStatus(h.ctx, c, func(st *clusterv1.ManagedClusterStatus) {
		st.Version.Kubernetes = "v1.36.0"
		st.ClusterClaims = append(st.ClusterClaims, clusterv1.ManagedClusterClaim{Name: "platform.open-cluster-management.io", Value: "AWS"})
	}))
	h.expectProfiles(ns, c)

	// A message-only change keeps lastTransitionTime.
	time.Sleep(1100 * time.Millisecond) // timestamps have one-second resolution
	h.must(h.hub.UpdateClusterStatus(h.ctx, c, func(st *clusterv1.ManagedClusterStatus) {
		cond := meta.FindStatusCondition(st.Conditions, clusterv1.ManagedClusterConditionAvailable)
		cond.Message = "still available"
	}))
	h.expectProfiles(ns, c)
	if got := healthyAt(); !got.Equal(&before) {
		t.Fatalf("lastTransitionTime moved without a status change: %v -> %v", before, got)
	}

	// Unavailable.
	h.must(h.hub.SetAvailable(h.ctx, c, metav1.ConditionFalse))
	h.expectProfiles(ns, c)
	if got := healthyAt(); got.Equal(&before) {
		t.Fatalf("lastTransitionTime did not move on a status change")
	}
}

// TestBareClusterStatus: a cluster that reports no version and no
// conditions gets a profile whose status leaves both fields out, as OCM's
// own controller writes it, from one create and no status write; the
// fields appear as the cluster reports them.
func TestBareClusterStatus(t *testing.T) {
	h := newHarness(t)
	ns := h.namespaces("consumer")[0]
	set := h.name("set")
	h.must(h.hub.CreateExclusiveSet(h.ctx, set))
	h.must(h.hub.Bind(h.ctx, ns, set, true))
	c := h.name("bare")
	_, err := h.hub.Cluster.ClusterV1().ManagedClusters().Create(h.ctx, &clusterv1.ManagedCluster{
		ObjectMeta: metav1.ObjectMeta{Name: c, Labels: fleet.ExclusiveSetLabels(set, nil)},
		Spec:       clusterv1.ManagedClusterSpec{HubAcceptsClient: true},
	}, metav1.CreateOptions{})
	h.must(err)
	h.expectProfiles(ns, c)

	rawStatus := func() map[string]json.RawMessage {
		raw, err := h.hub.Profiles.ApisV1alpha1().RESTClient().Get().
			Namespace(ns).Resource("clusterprofiles").Name(c).DoRaw(h.ctx)
		h.must(err)
		var obj struct {
			Status map[string]json.RawMessage `json:"status"`
		}
		h.must(json.Unmarshal(raw, &obj))
		return obj.Status
	}
	if st := rawStatus(); len(st) != 0 {
		t.Fatalf("status of a bare cluster's profile = %v, want no fields", st)
	}
	h.waitIdle()
	if got := h.metric("hubsync_profile_writes_total", map[string]string{"op": "status"}); got != 0 {
		t.Errorf("status writes for a profile with nothing to report = %v, want 0", got)
	}

	// A claim, still no version or conditions: properties only.
	h.must(h.hub.UpdateClusterStatus(h.ctx, c, func(st *clusterv1.ManagedClusterStatus) {
		st.ClusterClaims = []clusterv1.ManagedClusterClaim{{Name: "id.k8s.io", Value: c}}
	}))
	h.eventually("properties written, version and conditions left out", func() error {
		st := rawStatus()
		if _, ok := st["properties"]; !ok {
			return fmt.Errorf("status = %s", st)
		}
		for _, k := range []string{"version", "conditions"} {
			if v, ok := st[k]; ok {
				return fmt.Errorf("%s written for a cluster that reports none: %s", k, v)
			}
		}
		return nil
	})
	h.must(h.hub.UpdateClusterStatus(h.ctx, c, func(st *clusterv1.ManagedClusterStatus) {
		st.Version.Kubernetes = "v1.35.4"
	}))
	h.eventually("version written, conditions still left out", func() error {
		st := rawStatus()
		if string(st["version"]) != `{"kubernetes":"v1.35.4"}` {
			return fmt.Errorf("status = %s", st)
		}
		if _, ok := st["conditions"]; ok {
			return fmt.Errorf("conditions written for a cluster without conditions: %s", st["conditions"])
		}
		return nil
	})
	h.must(h.hub.SetAvailable(h.ctx, c, metav1.ConditionTrue))
	h.expectProfiles(ns, c)
	if _, ok := rawStatus()["conditions"]; !ok {
		t.Fatal("conditions missing once the cluster reports them")
	}
}

// TestRestoresOwnProfiles: a profile of ours deleted or edited by someone
// else is restored; entries others added to its status are kept.
func TestRestoresOwnProfiles(t *testing.T) {
	h := newHarness(t)
	ns := h.namespaces("consumer")[0]
	set := h.name("set")
	h.must(h.hub.CreateExclusiveSet(h.ctx, set))
	h.must(h.hub.Bind(h.ctx, ns, set, true))
	c := h.name("c")
	h.cluster(c, set, nil)
	h.expectProfiles(ns, c)
	profiles := h.hub.Profiles.ApisV1alpha1().ClusterProfiles(ns)

	// Deleted by someone else.
	p, err := profiles.Get(h.ctx, c, metav1.GetOptions{})
	h.must(err)
	h.must(profiles.Delete(h.ctx, c, metav1.DeleteOptions{}))
	h.eventually("profile recreated", func() error {
		np, err := profiles.Get(h.ctx, c, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if np.UID == p.UID {
			return fmt.Errorf("not recreated yet")
		}
		return nil
	})
	h.expectProfiles(ns, c)

	// Edited: display name and our label changed, a foreign label added.
	p, err = profiles.Get(h.ctx, c, metav1.GetOptions{})
	h.must(err)
	p.Spec.DisplayName = "hijacked"
	p.Labels["multicluster.x-k8s.io/clusterset"] = "wrong"
	p.Labels["team"] = "payments"
	_, err = profiles.Update(h.ctx, p, metav1.UpdateOptions{})
	h.must(err)
	h.expectProfiles(ns, c)
	p, err = profiles.Get(h.ctx, c, metav1.GetOptions{})
	h.must(err)
	if p.Labels["team"] != "payments" {
		t.Fatalf("a label set by someone else was removed: %v", p.Labels)
	}

	// Someone else's condition and access provider in status, and a
	// tampered condition of ours.
	p.Status.Conditions = append(p.Status.Conditions, metav1.Condition{Type: "ExampleReady", Status: metav1.ConditionTrue, Reason: "Ready", LastTransitionTime: metav1.Now()})
	p.Status.AccessProviders = append(p.Status.AccessProviders, cpv1alpha1.AccessProvider{Name: "other-provider"})
	meta.FindStatusCondition(p.Status.Conditions, "ControlPlaneHealthy").Message = "tampered"
	p.Status.Version.Kubernetes = "v0.0.1"
	_, err = profiles.UpdateStatus(h.ctx, p, metav1.UpdateOptions{})
	h.must(err)
	h.expectProfiles(ns, c)
	p, err = profiles.Get(h.ctx, c, metav1.GetOptions{})
	h.must(err)
	if meta.FindStatusCondition(p.Status.Conditions, "ExampleReady") == nil {
		t.Fatalf("foreign condition removed: %+v", p.Status.Conditions)
	}
	if len(p.Status.AccessProviders) != 1 || p.Status.AccessProviders[0].Name != "other-provider" {
		t.Fatalf("foreign access provider removed: %+v", p.Status.AccessProviders)
	}
}

// TestWritesSkippedWhenUnchanged: events that change nothing hubsync
// writes cause no writes.
func TestWritesSkippedWhenUnchanged(t *testing.T) {
	h := newHarness(t)
	ns := h.namespaces("consumer")[0]
	set := h.name("set")
	h.must(h.hub.CreateExclusiveSet(h.ctx, set))
	var names []string
	for i := range 5 {
		names = append(names, h.name(fmt.Sprintf("c%d", i)))
		h.cluster(names[i], set, nil)
	}
	h.must(h.hub.Bind(h.ctx, ns, set, true))
	h.expectProfiles(ns, names...)
	h.waitIdle()
	// One create and one status write per profile, nothing else.
	if got := h.writes(); got != 10 {
		t.Fatalf("writes for 5 new profiles = %v, want 10 (create + status each)", got)
	}
	reconciles := func() float64 {
		return h.metric("hubsync_reconcile_total", map[string]string{"controller": "topology"})
	}
	before := reconciles()
	for _, n := range names {
		h.must(h.hub.UpdateCluster(h.ctx, n, func(c *clusterv1.ManagedCluster) {
			if c.Annotations == nil {
				c.Annotations = map[string]string{}
			}
			c.Annotations["touched"] = "yes"
		}))
	}
	h.must(h.hub.SetBound(h.ctx, ns, set, true))
	// Every touched cluster is reconciled (the binding's change too), then
	// nothing is left to do.
	h.eventually("the no-op changes reconciled", func() error {
		if got := reconciles() - before; got < float64(len(names)) {
			return fmt.Errorf("%v reconciles", got)
		}
		return nil
	})
	h.waitIdle()
	if got := h.writes(); got != 10 {
		t.Fatalf("writes after no-op changes = %v, want still 10", got)
	}
}

// TestForeignProfiles: profiles of another manager are never touched; a
// same-named one is reported (log, Event, metric) and retried with backoff
// while the other namespaces are served; when it goes, ours appears.
func TestForeignProfiles(t *testing.T) {
	h := newHarness(t)
	ns := h.namespaces("blocked", "free")
	set := h.name("set")
	h.must(h.hub.CreateExclusiveSet(h.ctx, set))
	c, other := h.name("c"), h.name("other")
	foreign := func(ns, name string) *cpv1alpha1.ClusterProfile {
		p, err := h.hub.Profiles.ApisV1alpha1().ClusterProfiles(ns).Create(h.ctx, &cpv1alpha1.ClusterProfile{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"x-k8s.io/cluster-manager": "someone-else"}},
			Spec:       cpv1alpha1.ClusterProfileSpec{DisplayName: "theirs", ClusterManager: cpv1alpha1.ClusterManager{Name: "someone-else"}},
		}, metav1.CreateOptions{})
		h.must(err)
		return p
	}
	blocker := foreign(ns[0], c)
	unrelated := foreign(ns[1], other) // not a cluster of ours at all
	h.cluster(c, set, nil)
	h.must(h.hub.Bind(h.ctx, ns[0], set, true))
	h.must(h.hub.Bind(h.ctx, ns[1], set, true))

	h.eventually("ours created beside the unrelated foreign profile", func() error {
		return h.checkProfile(ns[1], c)
	})
	h.expectEvent(ns[0], c, "ProfileConflict")
	h.eventually("conflict metric", func() error {
		if h.metric("hubsync_profile_conflicts", nil) != 1 {
			return fmt.Errorf("conflicts = %v", h.metric("hubsync_profile_conflicts", nil))
		}
		return nil
	})
	if !strings.Contains(h.logs.String(), "another cluster manager blocks") {
		t.Fatalf("no log line for the conflict")
	}

	// Retried with backoff, not hot-looped: over two seconds the number of
	// attempts stays small.
	before := h.metric("hubsync_reconcile_total", map[string]string{"result": "error"})
	time.Sleep(2 * time.Second)
	attempts := h.metric("hubsync_reconcile_total", map[string]string{"result": "error"}) - before
	if attempts > 10 {
		t.Fatalf("%v failed attempts in 2s: hot loop", attempts)
	}

	// A new cluster keeps flowing to both namespaces meanwhile.
	n := h.name("newcomer")
	h.cluster(n, set, nil)
	h.eventually("newcomer in blocked namespace", func() error { return h.checkProfile(ns[0], n) })
	h.eventually("newcomer in free namespace", func() error { return h.checkProfile(ns[1], n) })

	// The foreign profiles were never touched.
	for _, f := range []*cpv1alpha1.ClusterProfile{blocker, unrelated} {
		got, err := h.hub.Profiles.ApisV1alpha1().ClusterProfiles(f.Namespace).Get(h.ctx, f.Name, metav1.GetOptions{})
		h.must(err)
		if got.ResourceVersion != f.ResourceVersion {
			t.Fatalf("foreign profile %s/%s was modified", f.Namespace, f.Name)
		}
	}

	// The conflict clears as soon as the foreign profile goes.
	h.must(h.hub.Profiles.ApisV1alpha1().ClusterProfiles(ns[0]).Delete(h.ctx, c, metav1.DeleteOptions{}))
	h.eventually("ours created after the foreign one went", func() error { return h.checkProfile(ns[0], c) })
	h.eventually("conflict cleared", func() error {
		if v := h.metric("hubsync_profile_conflicts", nil); v != 0 {
			return fmt.Errorf("conflicts = %v", v)
		}
		return nil
	})
	// Deleting our cluster leaves the unrelated foreign profile alone.
	h.must(h.hub.DeleteCluster(h.ctx, c))
	h.eventually("ours deleted", func() error {
		names, err := h.hub.ProfileNames(h.ctx, ns[1])
		if err != nil {
			return err
		}
		if strings.Join(names, ",") != strings.Join([]string{n, other}, ",") && strings.Join(names, ",") != strings.Join([]string{other, n}, ",") {
			return fmt.Errorf("profiles %v", names)
		}
		return nil
	})
}

// TestNamespaceTerminating: a namespace deleted mid-sync is left alone and
// the other namespaces keep being served.
func TestNamespaceTerminating(t *testing.T) {
	h := newHarness(t)
	ns := h.namespaces("doomed", "alive")
	set := h.name("set")
	h.must(h.hub.CreateExclusiveSet(h.ctx, set))
	h.must(h.hub.Bind(h.ctx, ns[0], set, true))
	h.must(h.hub.Bind(h.ctx, ns[1], set, true))
	var names []string
	for i := range 20 {
		names = append(names, h.name(fmt.Sprintf("c%02d", i)))
	}
	// Delete the namespace while its profiles are being created.
	go func() {
		for _, n := range names {
			h.cluster(n, set, nil)
		}
	}()
	h.eventually("first profiles in the doomed namespace", func() error {
		got, err := h.hub.ProfileNames(h.ctx, ns[0])
		if err != nil || len(got) == 0 {
			return fmt.Errorf("none yet (%v)", err)
		}
		return nil
	})
	h.must(h.hub.Kube.CoreV1().Namespaces().Delete(h.ctx, ns[0], metav1.DeleteOptions{}))
	h.expectProfiles(ns[1], names...)
	h.waitIdle()
	// Creates racing the namespace's deletion are not errors to retry.
	if v := h.metric("hubsync_reconcile_total", map[string]string{"result": "error"}); v != 0 {
		t.Errorf("%v reconcile errors during the namespace's deletion, want none: a write refused because the namespace is terminating is not an error to retry", v)
	}
	nsObj, err := h.hub.Kube.CoreV1().Namespaces().Get(h.ctx, ns[0], metav1.GetOptions{})
	h.must(err)
	if nsObj.Status.Phase != corev1.NamespaceTerminating {
		t.Fatalf("namespace phase %s", nsObj.Status.Phase)
	}
	// Changes keep flowing to the live namespace.
	h.must(h.hub.DeleteCluster(h.ctx, names[0]))
	h.expectProfiles(ns[1], names[1:]...)
}

// TestBadInput: a binding to a missing set, a binding whose name differs
// from its set, an invalid selector, and a 253-character dotted cluster
// name; the other namespaces are served throughout.
func TestBadInput(t *testing.T) {
	h := newHarness(t)
	ns := h.namespaces("missing", "badsel", "good", "longname")
	good, missing, bad := h.name("good"), h.name("missing"), h.name("bad")
	h.must(h.hub.CreateExclusiveSet(h.ctx, good))
	g := h.name("g")
	h.cluster(g, good, map[string]string{"app": "x"})
	h.must(h.hub.Bind(h.ctx, ns[2], good, true))
	h.expectProfiles(ns[2], g)

	// A binding to a set that does not exist yet: nothing, until it does.
	h.must(h.hub.Bind(h.ctx, ns[0], missing, true))
	h.waitIdle()
	h.expectProfiles(ns[0])
	h.must(h.hub.CreateExclusiveSet(h.ctx, missing))
	m := h.name("m")
	h.cluster(m, missing, nil)
	h.expectProfiles(ns[0], m)

	// A binding whose name is not its set's name is ignored.
	_, err := h.hub.Cluster.ClusterV1beta2().ManagedClusterSetBindings(ns[0]).Create(h.ctx, &clusterv1beta2.ManagedClusterSetBinding{
		ObjectMeta: metav1.ObjectMeta{Name: h.name("alias"), Namespace: ns[0]},
		Spec:       clusterv1beta2.ManagedClusterSetBindingSpec{ClusterSet: good},
	}, metav1.CreateOptions{})
	h.must(err)
	h.must(h.hub.SetBound(h.ctx, ns[0], h.name("alias"), true))
	h.waitIdle()
	h.expectProfiles(ns[0], m)

	// An invalid selector: reported, and the namespace's profiles held.
	h.must(h.hub.CreateLabelSelectorSet(h.ctx, bad, &metav1.LabelSelector{MatchLabels: map[string]string{"app": "x"}}))
	h.must(h.hub.Bind(h.ctx, ns[1], bad, true))
	h.expectProfiles(ns[1], g)
	h.must(h.hub.UpdateSet(h.ctx, bad, func(s *clusterv1beta2.ManagedClusterSet) {
		s.Spec.ClusterSelector.LabelSelector = &metav1.LabelSelector{
			MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: "Sometimes", Values: []string{"x"}}},
		}
	}))
	h.expectEvent("default", bad, "InvalidClusterSelector")
	h.eventually("invalid set metric", func() error {
		if v := h.metric("hubsync_invalid_cluster_sets", nil); v != 1 {
			return fmt.Errorf("invalid sets = %v", v)
		}
		return nil
	})
	h.must(h.hub.Relabel(h.ctx, g, "app", "y")) // would remove it, were the selector valid
	h.waitIdle()
	h.expectProfiles(ns[1], g)
	h.expectProfiles(ns[2], g) // still served
	h.must(h.hub.UpdateSet(h.ctx, bad, func(s *clusterv1beta2.ManagedClusterSet) {
		s.Spec.ClusterSelector.LabelSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"app": "x"}}
	}))
	h.expectProfiles(ns[1])
	if v := h.metric("hubsync_invalid_cluster_sets", nil); v != 0 {
		t.Fatalf("invalid sets after the fix = %v", v)
	}

	// A 253-character cluster name with dots.
	long := h.prefix + "." + strings.Repeat("a", 60) + "." + strings.Repeat("b", 60) + "." + strings.Repeat("c", 60) + "."
	long += strings.Repeat("d", 253-len(long))
	if len(long) != 253 {
		t.Fatalf("name length %d", len(long))
	}
	lset := h.name("long")
	h.must(h.hub.CreateExclusiveSet(h.ctx, lset))
	h.must(h.hub.Bind(h.ctx, ns[3], lset, true))
	h.cluster(long, lset, nil)
	h.expectProfiles(ns[3], long)
	p, err := h.hub.Profiles.ApisV1alpha1().ClusterProfiles(ns[3]).Get(h.ctx, long, metav1.GetOptions{})
	h.must(err)
	if v := p.Labels["open-cluster-management.io/cluster-name"]; len(v) > 63 || v != hub.ClusterNameLabelValue(long) {
		t.Fatalf("cluster-name label %q", v)
	}
	if h.metric("hubsync_reconcile_total", map[string]string{"result": "error"}) != 0 {
		t.Fatalf("bad input caused reconcile errors:\n%s", h.logs.String())
	}
}
