package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/hub"
	"github.com/hubsync/hubsync/syncer"
	"github.com/hubsync/hubsync/test/fleet"
	"github.com/hubsync/hubsync/test/leak"
	"github.com/hubsync/hubsync/test/testutil"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"
	clusterv1 "open-cluster-management.io/api/cluster/v1"
	cpv1alpha1 "sigs.k8s.io/cluster-inventory-api/apis/v1alpha1"
)

const manager = "open-cluster-management"

var testSeq atomic.Int32

// harness runs one hubsync syncer against the shared control plane for one
// test, with its own metrics registry and captured logs.
type harness struct {
	t      *testing.T
	ctx    context.Context
	hub    *fleet.Hub
	syncer *syncer.Syncer
	reg    *prometheus.Registry
	logs   *fleet.LogBuffer
	// moreLogs are other hubsync logs of the test (a daemon's), checked
	// for tokens at the end like logs.
	moreLogs map[string]*fleet.LogBuffer
	// prefix makes every name a test creates unique, so that late events
	// from an earlier test cannot affect this one.
	prefix string
}

// harnessOption changes how newHarness runs the syncer.
type harnessOption func(*harnessOptions)

type harnessOptions struct {
	syncerConfig *rest.Config
	tune         []func(*syncer.Options)
}

// withOptions adjusts the syncer's options before it starts.
func withOptions(f func(*syncer.Options)) harnessOption {
	return func(o *harnessOptions) { o.tune = append(o.tune, f) }
}

// withSyncerConfig makes the syncer and its event recorder talk to the API
// server with cfg (for example as an impersonated ServiceAccount); the
// fleet helpers, checks and clean-up keep the admin config.
func withSyncerConfig(cfg *rest.Config) harnessOption {
	return func(o *harnessOptions) { o.syncerConfig = cfg }
}

func newHarness(t *testing.T, opts ...harnessOption) *harness {
	t.Helper()
	var o harnessOptions
	for _, opt := range opts {
		opt(&o)
	}
	hub, err := fleet.NewHub(hubConfig)
	if err != nil {
		t.Fatal(err)
	}
	clients := syncer.Clients{Kube: hub.Kube, Cluster: hub.Cluster, Profiles: hub.Profiles}
	if o.syncerConfig != nil {
		as, err := fleet.NewHub(o.syncerConfig)
		if err != nil {
			t.Fatal(err)
		}
		clients = syncer.Clients{Kube: as.Kube, Cluster: as.Cluster, Profiles: as.Profiles}
	}
	ctx, cancel := context.WithCancel(context.Background())
	h := &harness{
		t: t, ctx: ctx, hub: hub,
		reg:    prometheus.NewRegistry(),
		logs:   &fleet.LogBuffer{},
		prefix: fmt.Sprintf("t%d", testSeq.Add(1)),
	}
	log := slog.New(slog.NewTextHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: clients.Kube.CoreV1().Events("")})
	sch, err := syncer.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	recorder := broadcaster.NewRecorder(sch, corev1.EventSource{Component: "hubsync"})
	sopts := syncer.Options{
		ClusterManager: manager,
		Workers:        4,
		// Far beyond any test: every reaction must come from an event.
		ResyncPeriod:   time.Hour,
		RetryBase:      50 * time.Millisecond,
		RetryMax:       2 * time.Second,
		RequestTimeout: config.Default().Hub.Timeout.Duration,
		ForeignWriters: syncer.ForeignOptions{
			HoldOff: config.Default().ForeignWriters.HoldOff.Duration, MaxHoldOff: config.Default().ForeignWriters.MaxHoldOff.Duration,
		},
	}
	for _, f := range o.tune {
		f(&sopts)
	}
	s, err := syncer.New(clients, sopts, log, h.reg, recorder)
	if err != nil {
		t.Fatal(err)
	}
	h.syncer = s
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("syncer: %v", err)
		}
		broadcaster.Shutdown()
		// Whatever the test did: no token it wrote to the hub may appear
		// in a log or an Event.
		h.assertNoTokenLeak(h.hub.Tokens())
		if t.Failed() {
			t.Logf("hubsync logs:\n%s", h.logs.String())
		}
		h.cleanup()
	})
	h.eventually("syncer ready", func() error {
		if !s.Ready() {
			return errors.New("not ready")
		}
		return nil
	})
	return h
}

// watchLog adds a daemon's log to those checked for tokens at the end.
func (h *harness) watchLog(what string, l *fleet.LogBuffer) {
	if h.moreLogs == nil {
		h.moreLogs = map[string]*fleet.LogBuffer{}
	}
	h.moreLogs[what] = l
}

// assertNoTokenLeak checks that none of tokens appears, in any encoding
// leak.Tokens knows, in hubsync's logs, in any Event on the hub, or in
// hubsync's metrics.
func (h *harness) assertNoTokenLeak(tokens []string) {
	if len(tokens) == 0 {
		return
	}
	texts := map[string]string{"hubsync's log": h.logs.String()}
	for what, l := range h.moreLogs {
		texts[what] = l.String()
	}
	evs, err := h.hub.Kube.CoreV1().Events("").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		h.t.Errorf("list events: %v", err)
		return
	}
	for _, e := range evs.Items {
		raw, _ := json.Marshal(e)
		texts[fmt.Sprintf("Event %s/%s", e.Namespace, e.Name)] = string(raw)
	}
	if m, err := testutil.Gather(h.reg); err == nil {
		texts["/metrics"] = m.Text()
	} else {
		h.t.Error(err)
	}
	for what, text := range texts {
		for _, f := range leak.Tokens(text, tokens) {
			h.t.Errorf("%s appears in %s", f, what)
		}
	}
}

// cleanup removes every object the test may have left, so the next test
// starts from an empty fleet. Namespaces stay (a test API server has no
// namespace controller to finish deleting them); their names are unique.
func (h *harness) cleanup() {
	ctx := context.Background()
	cc := h.hub.Cluster
	clusters, _ := cc.ClusterV1().ManagedClusters().List(ctx, metav1.ListOptions{})
	for _, c := range clusters.Items {
		if len(c.Finalizers) > 0 {
			_ = h.hub.UpdateCluster(ctx, c.Name, func(c *clusterv1.ManagedCluster) { c.Finalizers = nil })
		}
	}
	_ = cc.ClusterV1().ManagedClusters().DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
	_ = cc.ClusterV1beta2().ManagedClusterSets().DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
	nss, _ := h.hub.Kube.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	for _, ns := range nss.Items {
		_ = cc.ClusterV1beta2().ManagedClusterSetBindings(ns.Name).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
		_ = h.hub.Profiles.ApisV1alpha1().ClusterProfiles(ns.Name).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
		_ = h.hub.MSA.AuthenticationV1beta1().ManagedServiceAccounts(ns.Name).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
		for _, sel := range []string{fleet.LabelIsMSA, "authentication.open-cluster-management.io/synced-from"} {
			_ = h.hub.Kube.CoreV1().Secrets(ns.Name).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: sel})
		}
	}
}

// name returns a name unique to this test.
func (h *harness) name(base string) string { return h.prefix + "-" + base }

// startDaemonConfigMap runs the hubsync binary with conf as a hub
// ConfigMap (so sinks can be reloaded), as cfg, until the test ends, and
// waits for it to be ready; its log is shown when the test fails.
func (h *harness) startDaemonConfigMap(bin string, cfg *rest.Config, conf config.Config) (*fleet.Daemon, *fleet.ConfigMapDir, *fleet.LogBuffer) {
	h.t.Helper()
	logs := &fleet.LogBuffer{}
	d, cm, err := fleet.StartDaemonConfigMap(h.ctx, bin, cfg, conf, logs)
	h.must(err)
	h.t.Cleanup(func() {
		_ = d.Stop()
		if h.t.Failed() {
			h.t.Logf("hubsync logs:\n%s", logs.String())
		}
	})
	h.must(d.WaitReady(h.ctx, 60*time.Second))
	return d, cm, logs
}

func (h *harness) must(err error) {
	h.t.Helper()
	if err != nil {
		h.t.Fatal(err)
	}
}

// eventually polls check until it returns nil; the bound is a generous
// sanity limit, not a performance claim.
func (h *harness) eventually(what string, check func() error) {
	h.t.Helper()
	testutil.Eventually(h.t, 20*time.Second, 25*time.Millisecond, check, "%s", what)
}

// waitIdle waits until the syncer has nothing queued or in flight.
func (h *harness) waitIdle() {
	h.t.Helper()
	h.eventually("syncer idle", func() error {
		if !h.syncer.Idle() {
			return errors.New("busy")
		}
		return nil
	})
}

func (h *harness) namespaces(names ...string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = h.name(n)
		h.must(h.hub.Namespace(h.ctx, out[i]))
	}
	return out
}

// cluster creates a cluster in an exclusive set (if set != "") with extra
// labels.
func (h *harness) cluster(name, set string, extra map[string]string) *clusterv1.ManagedCluster {
	h.t.Helper()
	labels := map[string]string{}
	if set != "" {
		labels = fleet.ExclusiveSetLabels(set, nil)
	}
	for k, v := range extra {
		labels[k] = v
	}
	c, err := h.hub.CreateCluster(h.ctx, fleet.ClusterSpec{
		Name: name, Labels: labels,
		Claims: map[string]string{"id.k8s.io": name, "region.open-cluster-management.io": "eu-west-1"},
	})
	h.must(err)
	return c
}

// expectProfiles waits until namespace holds exactly the named profiles,
// each exactly as hubsync must write it for the cluster's current state.
func (h *harness) expectProfiles(ns string, clusters ...string) {
	h.t.Helper()
	sort.Strings(clusters)
	h.eventually(fmt.Sprintf("profiles in %s = %v", ns, clusters), func() error {
		got, err := h.hub.ProfileNames(h.ctx, ns)
		if err != nil {
			return err
		}
		if strings.Join(got, ",") != strings.Join(clusters, ",") {
			return fmt.Errorf("got %v", got)
		}
		for _, c := range clusters {
			if err := h.checkProfile(ns, c); err != nil {
				return err
			}
		}
		return nil
	})
}

// checkProfile compares one profile with the exact labels, spec and status
// the contract requires for its cluster.
func (h *harness) checkProfile(ns, name string) error {
	p, err := h.hub.Profiles.ApisV1alpha1().ClusterProfiles(ns).Get(h.ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	c, err := h.hub.Cluster.ClusterV1().ManagedClusters().Get(h.ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	wantLabels := map[string]string{
		"x-k8s.io/cluster-manager":                manager,
		"open-cluster-management.io/cluster-name": hub.ClusterNameLabelValue(name),
		"multicluster.x-k8s.io/clusterset":        c.Labels["cluster.open-cluster-management.io/clusterset"],
	}
	for k, v := range wantLabels {
		if p.Labels[k] != v {
			return fmt.Errorf("%s/%s label %s = %q, want %q", ns, name, k, p.Labels[k], v)
		}
	}
	wantSpec := cpv1alpha1.ClusterProfileSpec{DisplayName: name, ClusterManager: cpv1alpha1.ClusterManager{Name: manager}}
	if p.Spec != wantSpec {
		return fmt.Errorf("%s/%s spec = %+v", ns, name, p.Spec)
	}
	if p.Status.Version.Kubernetes != c.Status.Version.Kubernetes {
		return fmt.Errorf("%s/%s version = %q, want %q", ns, name, p.Status.Version.Kubernetes, c.Status.Version.Kubernetes)
	}
	var wantProps []cpv1alpha1.Property
	for _, cl := range c.Status.ClusterClaims {
		wantProps = append(wantProps, cpv1alpha1.Property{Name: cl.Name, Value: cl.Value})
	}
	sort.Slice(wantProps, func(i, j int) bool { return wantProps[i].Name < wantProps[j].Name })
	if !equality.Semantic.DeepEqual(p.Status.Properties, wantProps) {
		return fmt.Errorf("%s/%s properties = %v, want %v", ns, name, p.Status.Properties, wantProps)
	}
	for from, to := range map[string]string{
		clusterv1.ManagedClusterConditionAvailable: "ControlPlaneHealthy",
		clusterv1.ManagedClusterConditionJoined:    "Joined",
	} {
		src := findCondition(c.Status.Conditions, from)
		got := findCondition(p.Status.Conditions, to)
		if src == nil {
			continue
		}
		if got == nil || got.Status != src.Status || got.Reason != src.Reason || got.Message != src.Message {
			return fmt.Errorf("%s/%s condition %s = %+v, want mirror of %+v", ns, name, to, got, src)
		}
	}
	return nil
}

func findCondition(cs []metav1.Condition, t string) *metav1.Condition {
	for i := range cs {
		if cs[i].Type == t {
			return &cs[i]
		}
	}
	return nil
}

// metric returns the sum of the in-process syncer's series of name that
// carry the given labels.
func (h *harness) metric(name string, labels map[string]string) float64 {
	h.t.Helper()
	m, err := testutil.Gather(h.reg)
	h.must(err)
	return m.Value(name, labels)
}

// writes is the number of profile writes hubsync has sent.
func (h *harness) writes() float64 { return h.metric("hubsync_profile_writes_total", nil) }

// expectEvent waits for a Kubernetes Event with the given reason about the
// named object.
func (h *harness) expectEvent(ns, objectName, reason string) {
	h.t.Helper()
	h.eventually("event "+reason+" on "+objectName, func() error {
		evs, err := h.hub.Kube.CoreV1().Events(ns).List(h.ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, e := range evs.Items {
			if e.Reason == reason && e.InvolvedObject.Name == objectName {
				return nil
			}
		}
		return errors.New("not yet")
	})
}
