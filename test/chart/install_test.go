package chart_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/test/chart"
	"github.com/hubsync/hubsync/test/fleet"
	"github.com/hubsync/hubsync/test/testutil"
)

// fieldManager is the field manager of the test's server-side applies.
const fieldManager = "helm-chart-test"

// notServed are the API groups of rendered kinds whose CRDs no served Go
// module ships, so the test hub does not serve them: prometheus-operator's
// (their objects are still decoded strictly into the operator's v0.95.2
// types by TestRender) and OCM's cluster-permission addon's.
var notServed = []string{"monitoring.coreos.com", "rbac.open-cluster-management.io"}

// applier server-side applies rendered objects to the hub, as `helm
// install` does in effect (and `kubectl apply --server-side` for deploy/).
type applier struct {
	dyn    dynamic.Interface
	mapper meta.RESTMapper
}

func newApplier(t *testing.T, cfg *rest.Config) *applier {
	t.Helper()
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	disc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	groups, err := restmapper.GetAPIGroupResources(disc)
	if err != nil {
		t.Fatalf("discovery: %v", err)
	}
	return &applier{dyn: dyn, mapper: restmapper.NewDiscoveryRESTMapper(groups)}
}

// apply applies every object the hub serves, strictly (an unknown field or
// an invalid value is an error), as a dry run when dryRun is set, and
// returns what it skipped.
func (a *applier) apply(ctx context.Context, t *testing.T, objs []object, dryRun bool) (skipped []string) {
	t.Helper()
	for _, o := range objs {
		if slices.Contains(notServed, o.gvk.Group) {
			skipped = append(skipped, o.gvk.Kind)
			continue
		}
		js, err := yaml.YAMLToJSON(o.yaml)
		if err != nil {
			t.Fatalf("%s: %v", o, err)
		}
		var u unstructured.Unstructured
		if err := u.UnmarshalJSON(js); err != nil {
			t.Fatalf("%s: %v", o, err)
		}
		m, err := a.mapper.RESTMapping(o.gvk.GroupKind(), o.gvk.Version)
		if err != nil {
			t.Fatalf("%s: the API server does not serve it: %v", o, err)
		}
		var res dynamic.ResourceInterface = a.dyn.Resource(m.Resource)
		if m.Scope.Name() == meta.RESTScopeNameNamespace {
			if u.GetNamespace() == "" {
				t.Errorf("%s: namespaced, but rendered without a namespace", o)
			}
			res = a.dyn.Resource(m.Resource).Namespace(u.GetNamespace())
		}
		opts := metav1.PatchOptions{FieldManager: fieldManager, FieldValidation: metav1.FieldValidationStrict}
		if dryRun {
			opts.DryRun = []string{metav1.DryRunAll}
		}
		if _, err := res.Patch(ctx, u.GetName(), types.ApplyPatchType, js, opts); err != nil {
			t.Errorf("apply %s: %v", o, err)
		}
	}
	return skipped
}

// TestInstall installs the chart, rendered with its default values, on a
// real kube-apiserver by server-side apply, checks its configuration with
// `hubsync check-config`, and runs `hubsync run` with that configuration
// as the chart's ServiceAccount, under the chart's RBAC and admission
// policy: it must take the Lease, project a small fleet's clusters into a
// bound namespace and copy a ManagedServiceAccount token there, with no
// request refused. Then other renderings (the gateway on in another
// namespace, credentials off, every optional part on) are applied as
// strict server-side dry runs.
func TestInstall(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	admin := suite.Hub.Config
	hub, err := fleet.NewHub(admin)
	if err != nil {
		t.Fatal(err)
	}
	ch := loadChart(t)
	a := newApplier(t, admin)
	if err := hub.Namespace(ctx, chart.Namespace); err != nil {
		t.Fatal(err)
	}
	objs := render(t, ch, `{}`, chart.Namespace)
	if skipped := a.apply(ctx, t, objs, false); len(skipped) > 0 {
		t.Fatalf("the default rendering has kinds the hub does not serve: %v", skipped)
	}
	if t.Failed() {
		t.FailNow()
	}

	// The configuration, byte for byte as the ConfigMap holds it, but for
	// where the bus's TLS files are: the pods' mount of the Secret, here a
	// directory with the rendered Secret's files.
	_, text := renderedConfig(t, objs)
	tlsDir := writeBusTLS(t, objs)
	const mounted = "/etc/hubsync/bus-tls/"
	if !strings.Contains(text, mounted) {
		t.Fatalf("the rendered configuration does not use %s:\n%s", mounted, text)
	}
	text = strings.ReplaceAll(text, mounted, tlsDir+"/")
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	bin := testutil.Hubsync(t)
	if out, err := exec.CommandContext(ctx, bin, "check-config", path).CombinedOutput(); err != nil {
		t.Fatalf("hubsync check-config on the rendered configuration: %v\n%s", err, out)
	}

	// Run it as the StatefulSet does: three replicas started together,
	// whose NATS nodes form one cluster with the chart's certificate.
	conf, err := config.Decode([]byte(text))
	if err != nil {
		t.Fatal(err)
	}
	asHubsync := serviceAccountConfigIn(ctx, t, hub, chart.Namespace)
	consumer, set := "chart-consumer", "chart-set"
	clusters := []string{"chart-a", "chart-b"}
	if err := hub.Namespace(ctx, consumer); err != nil {
		t.Fatal(err)
	}
	if err := hub.CreateExclusiveSet(ctx, set); err != nil {
		t.Fatal(err)
	}
	for _, c := range clusters {
		if _, err := hub.CreateCluster(ctx, fleet.ClusterSpec{Name: c, Labels: fleet.ExclusiveSetLabels(set, nil), Version: "v1.35.0"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := hub.Bind(ctx, consumer, set, true); err != nil {
		t.Fatal(err)
	}

	replicas := startReplicas(ctx, t, bin, asHubsync, *conf, objs)
	for _, r := range replicas {
		if err := r.d.WaitReady(ctx, 2*time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	testutil.Eventually(t, time.Minute, 100*time.Millisecond, func() error {
		names, err := hub.ProfileNames(ctx, consumer)
		if err != nil {
			return err
		}
		if !slices.Equal(names, clusters) {
			return fmt.Errorf("profiles in %s: %v, want %v", consumer, names, clusters)
		}
		return nil
	}, "the fleet's ClusterProfiles in the bound namespace")
	checkBus(ctx, t, bin, replicas, objs, consumer, clusters)
	le := conf.LeaderElection
	lease, err := hub.Kube.CoordinationV1().Leases(le.Namespace).Get(ctx, le.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the chart's Lease: %v", err)
	}
	if lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity == "" {
		t.Errorf("Lease %s/%s has no holder", le.Namespace, le.Name)
	}

	// A credential copy: written under the chart's hubsync-credentials
	// role and admitted by its admission policy.
	if _, err := hub.CreateMSA(ctx, clusters[0], "app", true); err != nil {
		t.Fatal(err)
	}
	token := fleet.FakeJWT(time.Now().Add(time.Hour))
	if err := hub.PutToken(ctx, clusters[0], "app", token, nil); err != nil {
		t.Fatal(err)
	}
	copyName := clusters[0] + "-app"
	testutil.Eventually(t, time.Minute, 100*time.Millisecond, func() error {
		s, err := hub.Kube.CoreV1().Secrets(consumer).Get(ctx, copyName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if string(s.Data["token"]) != token {
			return fmt.Errorf("copy %s/%s does not hold the current token", consumer, copyName)
		}
		return nil
	}, "the token copy in the bound namespace")

	// The chart's admission policy holds for its ServiceAccount: a Secret
	// without hubsync's labels is refused, whatever the RBAC allows. The
	// API server loads a new policy within moments, so this polls.
	asSA, err := kubernetes.NewForConfig(asHubsync)
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, time.Minute, 200*time.Millisecond, func() error {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "not-hubsyncs", Namespace: consumer}, Type: corev1.SecretTypeOpaque}
		_, err := asSA.CoreV1().Secrets(consumer).Create(ctx, s, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err == nil {
			return fmt.Errorf("the ServiceAccount may create a Secret without hubsync's labels")
		}
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "hubsync may only write Secrets carrying its labels") {
			return testutil.Stop(fmt.Errorf("refused, but not by the admission policy: %w", err))
		}
		return nil
	}, "the admission policy refusing an unlabelled Secret")

	for i, r := range replicas {
		r.stopped = true
		if err := r.d.Stop(); err != nil {
			t.Errorf("hubsync-%d did not stop cleanly: %v", i, err)
		}
		if out := strings.ToLower(r.logs.String()); strings.Contains(out, "forbidden") {
			t.Errorf("a request of hubsync-%d's was refused:\n%s", i, r.logs.String())
		}
	}

	variants := []struct {
		name, values, namespace string
	}{
		{"gateway on, another namespace", `
clusterPermission: {clusters: [chart-a]}
config:
  gateway: {enabled: true}
  tunnel: {enabled: true, managedServiceAccount: hubsync-gateway}
`, "hubsync-system"},
		{"credentials off", `config: {credentials: {enabled: false}}`, chart.Namespace},
		{"monitoring on, one replica", `{replicas: 1, serviceMonitor: {enabled: true}, prometheusRule: {enabled: true}, dashboard: {enabled: true}}`, chart.Namespace},
	}
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			for _, ns := range []string{v.namespace, "open-cluster-management-addon"} {
				if err := hub.Namespace(ctx, ns); err != nil {
					t.Fatal(err)
				}
			}
			a.apply(ctx, t, render(t, ch, v.values, v.namespace), true)
		})
	}
}

// replica is one hubsync process standing in for a pod of the chart's
// StatefulSet.
type replica struct {
	d       *fleet.Daemon
	logs    *fleet.LogBuffer
	stopped bool
}

// startReplicas starts the rendered StatefulSet's replicas with conf, the
// rendered configuration, as its pods would run it. Outside a pod some
// fields must differ, and only these are changed: hub.kubeconfig (a file
// for the ServiceAccount's token instead of the in-cluster
// configuration), server.address and bus.embedded.listen (free loopback
// ports instead of the pod's own network), bus.embedded.dataDir (a
// temporary directory instead of the pod's emptyDir), the cluster's
// listen address and routes (loopback ports instead of the headless
// Service's names) and each node's name (a pod's host name); conf's TLS
// files are the rendered Secret's, written by writeBusTLS. Everything else is the rendered configuration: leader election on the
// chart's Lease, the cluster-proxy access provider, credential copies,
// the stream at three replicas, TLS on the client listener and mutual TLS
// on the routes.
func startReplicas(ctx context.Context, t *testing.T, bin string, asHubsync *rest.Config, conf config.Config, objs []object) []*replica {
	t.Helper()
	sts := find[*appsv1.StatefulSet](objs, "hubsync")
	n := int(*sts.Spec.Replicas)
	cl := conf.Bus.Embedded.Cluster
	if cl.Name == "" || len(cl.Routes) != n {
		t.Fatalf("the rendered configuration's cluster %+v: want %d routes", cl, n)
	}
	var routeAddrs, routes []string
	var held []net.Listener
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, l) // n distinct ports: closed once all are picked
		routeAddrs = append(routeAddrs, l.Addr().String())
		routes = append(routes, "nats://"+l.Addr().String())
	}
	for _, l := range held {
		_ = l.Close()
	}
	var out []*replica
	for i := range n {
		c := conf
		e := &c.Bus.Embedded
		e.Listen, e.DataDir = "", ""
		e.Cluster.Listen, e.Cluster.Routes, e.Cluster.ServerName = routeAddrs[i], routes, fmt.Sprintf("hubsync-%d", i)
		r := &replica{logs: &fleet.LogBuffer{}}
		d, err := fleet.StartDaemon(ctx, bin, asHubsync, c, r.logs)
		if err != nil {
			t.Fatal(err)
		}
		r.d = d
		out = append(out, r)
	}
	t.Cleanup(func() {
		for i, r := range out {
			if !r.stopped {
				_ = r.d.Stop()
			}
			if t.Failed() {
				t.Logf("hubsync-%d's log:\n%s", i, r.logs.String())
			}
		}
	})
	return out
}

// writeBusTLS writes the rendered Secret hubsync-bus-tls's files into a
// directory, as the pods mount it, and returns the directory.
func writeBusTLS(t *testing.T, objs []object) string {
	t.Helper()
	sec := find[*corev1.Secret](objs, "hubsync-bus-tls")
	if sec == nil {
		t.Fatal("no Secret hubsync-bus-tls")
	}
	dir := t.TempDir()
	for _, k := range []string{"ca.crt", "tls.crt", "tls.key"} {
		if err := os.WriteFile(filepath.Join(dir, k), sec.Data[k], 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// checkBus: the replicas' nodes are one JetStream cluster holding the
// stream at three replicas, and an application reads the bus from any
// node over TLS, verifying it with the CA the ConfigMap hubsync-bus-ca
// publishes: `hubsync state` lists the bound namespace's clusters and
// `hubsync events` replays their events.
func checkBus(ctx context.Context, t *testing.T, bin string, replicas []*replica, objs []object, ns string, clusters []string) {
	t.Helper()
	testutil.Eventually(t, time.Minute, 200*time.Millisecond, func() error {
		for i, r := range replicas {
			m, err := r.d.Scrape()
			if err != nil {
				return err
			}
			if !r.d.Leading() {
				continue
			}
			if cur := m.Value("hubsync_bus_stream_replicas", map[string]string{"state": "current"}); cur != 3 {
				return fmt.Errorf("hubsync-%d (leading): hubsync_bus_stream_replicas{state=current} %v, want 3", i, cur)
			}
			return nil
		}
		return fmt.Errorf("no replica leads")
	}, "the event stream current on three nodes")

	caFile := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(caFile, []byte(find[*corev1.ConfigMap](objs, "hubsync-bus-ca").Data["ca.crt"]), 0o600); err != nil {
		t.Fatal(err)
	}
	for i, r := range replicas {
		server := "tls://" + r.d.Conf.Bus.Embedded.Listen
		testutil.Eventually(t, time.Minute, 200*time.Millisecond, func() error {
			out, err := exec.CommandContext(ctx, bin, "state", "--server", server, "--tls-ca", caFile, "--namespace", ns, "-o", "json").CombinedOutput()
			if err != nil {
				return fmt.Errorf("hubsync state: %v: %s", err, out)
			}
			var records []struct {
				Cluster string `json:"cluster"`
			}
			if err := json.Unmarshal(out, &records); err != nil {
				return fmt.Errorf("hubsync state -o json: %v: %s", err, out)
			}
			var got []string
			for _, rec := range records {
				got = append(got, rec.Cluster)
			}
			slices.Sort(got)
			if !slices.Equal(got, clusters) {
				return fmt.Errorf("hubsync state on hubsync-%d: %v, want %v", i, got, clusters)
			}
			return nil
		}, fmt.Sprintf("the records, read from hubsync-%d's node", i))
	}
	out, err := exec.CommandContext(ctx, bin, "events", "--server", "tls://"+replicas[len(replicas)-1].d.Conf.Bus.Embedded.Listen,
		"--tls-ca", caFile, "--all", "--follow=false", "--namespace", ns).CombinedOutput()
	if err != nil {
		t.Fatalf("hubsync events: %v: %s", err, out)
	}
	for _, c := range clusters {
		if !strings.Contains(string(out), c) {
			t.Errorf("hubsync events has no event of %s:\n%s", c, out)
		}
	}
}
