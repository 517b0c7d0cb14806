// Command demo runs hubsync's main job end to end on this machine: a real
// kube-apiserver + etcd, a simulated OCM fleet, and the hubsync binary. It
// prints the ClusterProfiles hubsync projects into each consumer namespace,
// then changes the fleet and prints how hubsync converged and how long it
// took; then the tunnel pool's warm connections through a real konnectivity
// proxy-server, one of them failing and recovering; credentials; sinks.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1beta2 "open-cluster-management.io/api/cluster/v1beta2"
	cpv1alpha1 "sigs.k8s.io/cluster-inventory-api/apis/v1alpha1"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/test/controlplane"
	"github.com/hubsync/hubsync/test/fleet"
	"github.com/hubsync/hubsync/test/testutil"
)

func main() {
	binary := flag.String("hubsync", "bin/hubsync", "hubsync binary to run")
	keep := flag.Bool("keep-running", false, "keep the API server and hubsync running after the demo until interrupted")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *binary, *keep); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

// model is the demo's own account of the fleet, from which it derives the
// profiles every namespace must hold, independently of hubsync's code.
type model struct {
	clusters map[string]map[string]string // name -> labels
	bindings map[string][]string          // namespace -> bound sets
	sets     map[string]func(labels map[string]string) bool
	down     map[string]bool // clusters whose Available condition is False
}

func (m *model) expected() map[string][]string {
	out := map[string][]string{}
	for ns, sets := range m.bindings {
		seen := map[string]bool{}
		for _, set := range sets {
			for name, labels := range m.clusters {
				if m.sets[set](labels) && !seen[name] {
					seen[name] = true
					out[ns] = append(out[ns], name)
				}
			}
		}
		sort.Strings(out[ns])
	}
	return out
}

func exclusive(set string) func(map[string]string) bool {
	return func(l map[string]string) bool { return l[clusterv1beta2.ClusterSetLabel] == set }
}

func run(ctx context.Context, binary string, keep bool) error {
	if _, err := os.Stat(binary); err != nil {
		return fmt.Errorf("hubsync binary: %w (run `make demo`, which builds it)", err)
	}
	step("Starting a real kube-apiserver and etcd (built from pinned Go modules) with the OCM and ClusterProfile CRDs")
	start := time.Now()
	cp, err := controlplane.Start(ctx)
	if err != nil {
		return err
	}
	defer cp.Stop()
	fmt.Printf("   API server %s ready in %s\n", cp.Config.Host, since(start))
	hub, err := fleet.NewHub(cp.Config)
	if err != nil {
		return err
	}

	m := &model{
		clusters: map[string]map[string]string{},
		bindings: map[string][]string{
			"team-payments": {"prod-eu", "prod-us"},
			"team-ml":       {"gpu", "staging"},
			"argocd":        {"everything"},
			"kueue-system":  {"gpu"},
		},
		sets: map[string]func(map[string]string) bool{
			"prod-eu":    exclusive("prod-eu"),
			"prod-us":    exclusive("prod-us"),
			"staging":    exclusive("staging"),
			"gpu":        func(l map[string]string) bool { return l["accelerator"] == "nvidia" },
			"everything": func(map[string]string) bool { return true },
		},
		down: map[string]bool{},
	}
	step("Creating a simulated fleet: 24 ManagedClusters with claims and conditions, 5 ManagedClusterSets, 4 consumer namespaces")
	if err := createFleet(ctx, hub, m); err != nil {
		return err
	}
	fmt.Println("   sets:  prod-eu, prod-us, staging (ExclusiveClusterSetLabel); gpu (LabelSelector accelerator=nvidia); everything (LabelSelector {})")
	for _, ns := range sortedKeys(m.bindings) {
		fmt.Printf("   %-14s bound to %s\n", ns, strings.Join(m.bindings[ns], ", "))
	}

	dir, err := os.MkdirTemp("", "hubsync-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	logPath := filepath.Join(dir, "hubsync.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer logFile.Close()
	step("Starting hubsync (`hubsync run --config ...`, log: " + logPath + ")")
	start = time.Now()
	// cluster-proxy's provider, with its CA in a Secret hubsync watches.
	if err := hub.Namespace(ctx, proxyNamespace); err != nil {
		return err
	}
	if err := putProxyCA(ctx, hub, "demo-proxy-ca-1"); err != nil {
		return err
	}
	sinks, err := startDemoSinks(ctx, hub, dir)
	if err != nil {
		return err
	}
	defer sinks.close()
	fmt.Println("   with a real konnectivity proxy-server, two kube-apiservers standing for managed clusters and an agent for each")
	tunnels, tunnelConf, err := startDemoTunnels(ctx, cp, hub, m, dir)
	if err != nil {
		return err
	}
	defer tunnels.close()
	gw, gwConf, err := startDemoGateway(ctx, hub, tunnels.managed[0], dir)
	if err != nil {
		return err
	}
	conf := config.Config{AccessProviders: []config.AccessProvider{{
		Name:     "open-cluster-management",
		Server:   "https://cluster-proxy-addon-user." + proxyNamespace + ":9092/{{.ClusterName}}",
		CASecret: &config.SecretKeyRef{Namespace: proxyNamespace, Name: proxyCASecret, Key: "tls.crt"},
	}}, Sinks: sinks.sinks(), Tunnel: tunnelConf, Gateway: gwConf}
	// Leader election, so that a second replica can join later and take
	// over; a short drain delay, since the demo's balancer follows
	// readiness within 100 ms.
	conf.LeaderElection = config.LeaderElection{Enabled: true, Namespace: "default", Name: "hubsync-demo"}
	conf.Gateway.Drain.Delay = &metav1.Duration{Duration: time.Second}
	d, err := fleet.StartDaemon(ctx, binary, cp.Config, conf, logFile)
	if err != nil {
		return err
	}
	defer d.Stop()
	if err := converge(ctx, hub, m, d); err != nil {
		return err
	}
	fmt.Printf("   all %d profiles projected with full status %s after hubsync started\n", total(m.expected()), since(start))
	tail, err := tailEvents(d.NATSURL)
	if err != nil {
		return err
	}
	defer tail.close()
	// Once its caches are synced the bus republishes the whole state (as
	// after any outage); let that pass so each change shows its own events.
	time.Sleep(1500 * time.Millisecond)
	fmt.Printf("   events on hubsync's embedded NATS (%s), subjects hubsync.<namespace>.<cluster>.<kind>:\n", d.NATSURL)
	fmt.Printf("   %d state events republished once the caches synced; each change's events are shown below\n", tail.skip())
	if err := printProfiles(ctx, hub, m); err != nil {
		return err
	}

	changes := []struct {
		what  string
		apply func() error
	}{
		{"Relabel cluster staging-02 into set prod-eu (it leaves team-ml, joins team-payments)", func() error {
			m.clusters["staging-02"][clusterv1beta2.ClusterSetLabel] = "prod-eu"
			return hub.Relabel(ctx, "staging-02", clusterv1beta2.ClusterSetLabel, "prod-eu")
		}},
		{"Unbind set staging from namespace team-ml", func() error {
			m.bindings["team-ml"] = []string{"gpu"}
			return hub.Unbind(ctx, "team-ml", "staging")
		}},
		{"Delete cluster us-prod-03", func() error {
			delete(m.clusters, "us-prod-03")
			return hub.DeleteCluster(ctx, "us-prod-03")
		}},
		{"Flip cluster eu-prod-01 unavailable (its registration agent stopped)", func() error {
			m.down["eu-prod-01"] = true
			return hub.SetAvailable(ctx, "eu-prod-01", metav1.ConditionFalse)
		}},
		{"Give cluster us-prod-01 a GPU label (it joins team-ml and kueue-system through the gpu set)", func() error {
			m.clusters["us-prod-01"]["accelerator"] = "nvidia"
			return hub.Relabel(ctx, "us-prod-01", "accelerator", "nvidia")
		}},
	}
	for i, c := range changes {
		step(fmt.Sprintf("Change %d: %s", i+1, c.what))
		before, err := snapshot(ctx, hub, m)
		if err != nil {
			return err
		}
		t0 := time.Now()
		if err := c.apply(); err != nil {
			return err
		}
		if err := converge(ctx, hub, m, d); err != nil {
			return err
		}
		took := time.Since(t0)
		after, err := snapshot(ctx, hub, m)
		if err != nil {
			return err
		}
		for _, line := range diff(before, after) {
			fmt.Println("   " + line)
		}
		fmt.Printf("   hubsync converged in %s\n", took.Round(time.Millisecond))
		tail.flush(12)
	}

	if err := tunnels.show(ctx, d, m, tail); err != nil {
		return err
	}
	if err := gw.show(ctx, binary, cp.Config.Host); err != nil {
		return err
	}
	if err := demoCredentials(ctx, hub, m, tail); err != nil {
		return err
	}
	if err := sinks.print(ctx, hub, d); err != nil {
		return err
	}

	step("hubsync status: what an operator sees of the running daemon (through kubectl port-forward on a hub)")
	out, err := exec.CommandContext(ctx, binary, "status", "--address", d.Address).CombinedOutput()
	if err != nil {
		return fmt.Errorf("hubsync status: %w\n%s", err, out)
	}
	for _, line := range strings.Split(strings.TrimRight(string(out), "\n"), "\n") {
		fmt.Println("   " + line)
	}

	step("What hubsync wrote (from its /metrics)")
	if text, err := d.Metrics(); err == nil {
		for _, line := range strings.Split(text, "\n") {
			for _, p := range []string{"hubsync_profile_writes_total{", "hubsync_profile_conflicts ", "hubsync_profiles_managed ",
				"hubsync_credential_writes_total{", "hubsync_credential_rotations_total ", "hubsync_access_provider_ca_changes_total ", "hubsync_bus_events_published_total{", "hubsync_bus_kv_writes_total{",
				"hubsync_sink_delivered_total{"} {
				if strings.HasPrefix(line, p) {
					fmt.Println("   " + line)
				}
			}
		}
	}
	second, err := showReplicas(ctx, binary, cp, d, gw, logFile)
	if second != nil {
		defer second.Stop()
	}
	if err != nil {
		return err
	}
	d = second
	if !keep {
		step("Done; stopping hubsync and the API server")
		return nil
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := fleet.WriteKubeconfig(cp.Config, kubeconfig); err != nil {
		return err
	}
	step("Still running. Try: kubectl --kubeconfig " + kubeconfig + " get clusterprofiles -A ; metrics: http://" + d.Address + "/metrics ; Ctrl-C to stop")
	select {
	case <-ctx.Done():
	case err := <-d.Done():
		return fmt.Errorf("hubsync exited: %v", err)
	}
	return nil
}

func createFleet(ctx context.Context, hub *fleet.Hub, m *model) error {
	for _, s := range []string{"prod-eu", "prod-us", "staging"} {
		if err := hub.CreateExclusiveSet(ctx, s); err != nil {
			return err
		}
	}
	if err := hub.CreateLabelSelectorSet(ctx, "gpu", &metav1.LabelSelector{MatchLabels: map[string]string{"accelerator": "nvidia"}}); err != nil {
		return err
	}
	if err := hub.CreateLabelSelectorSet(ctx, "everything", &metav1.LabelSelector{}); err != nil {
		return err
	}
	platforms := []string{"AWS", "GCP", "Azure"}
	versions := []string{"v1.33.7", "v1.34.4", "v1.35.4"}
	n := 0
	for _, g := range []struct {
		prefix, set, region string
		count               int
	}{
		{"eu-prod", "prod-eu", "eu-west-1", 9},
		{"us-prod", "prod-us", "us-east-1", 9},
		{"staging", "staging", "eu-central-1", 6},
	} {
		for i := 1; i <= g.count; i++ {
			name := fmt.Sprintf("%s-%02d", g.prefix, i)
			labels := fleet.ExclusiveSetLabels(g.set, map[string]string{"region": g.region})
			if i%4 == 0 {
				labels["accelerator"] = "nvidia"
			}
			if _, err := hub.CreateCluster(ctx, fleet.ClusterSpec{
				Name: name, Labels: labels, Version: versions[n%len(versions)],
				Claims: map[string]string{
					"id.k8s.io":                              name,
					"region.open-cluster-management.io":      g.region,
					"platform.open-cluster-management.io":    platforms[n%len(platforms)],
					"kubeversion.open-cluster-management.io": versions[n%len(versions)],
				},
			}); err != nil {
				return err
			}
			m.clusters[name] = labels
			n++
		}
	}
	for _, ns := range sortedKeys(m.bindings) {
		if err := hub.Namespace(ctx, ns); err != nil {
			return err
		}
		for _, set := range m.bindings[ns] {
			if err := hub.Bind(ctx, ns, set, true); err != nil {
				return err
			}
		}
	}
	return nil
}

// converge waits until every namespace holds exactly the model's profiles,
// each with status and the model's health.
func converge(ctx context.Context, hub *fleet.Hub, m *model, d *fleet.Daemon) error {
	err := testutil.Poll(ctx, 60*time.Second, 10*time.Millisecond, func() error {
		select {
		case err := <-d.Done():
			return testutil.Stop(fmt.Errorf("hubsync exited: %v", err))
		default:
		}
		return matches(ctx, hub, m)
	})
	if err != nil {
		return fmt.Errorf("hub did not converge: %w", err)
	}
	return nil
}

func matches(ctx context.Context, hub *fleet.Hub, m *model) error {
	for ns, want := range m.expected() {
		got, err := hub.ProfilesIn(ctx, ns)
		if err != nil {
			return err
		}
		if len(got) != len(want) {
			return fmt.Errorf("%s: %d profiles, want %d", ns, len(got), len(want))
		}
		for _, name := range want {
			p := got[name]
			if p == nil {
				return fmt.Errorf("%s: missing %s", ns, name)
			}
			if p.Labels["multicluster.x-k8s.io/clusterset"] != m.clusters[name][clusterv1beta2.ClusterSetLabel] {
				return fmt.Errorf("%s/%s: stale clusterset label", ns, name)
			}
			c := meta.FindStatusCondition(p.Status.Conditions, "ControlPlaneHealthy")
			if c == nil || (c.Status == metav1.ConditionFalse) != m.down[name] {
				return fmt.Errorf("%s/%s: health not yet mirrored", ns, name)
			}
		}
	}
	return nil
}

type row struct{ set, version, healthy string }

func snapshot(ctx context.Context, hub *fleet.Hub, m *model) (map[string]map[string]row, error) {
	out := map[string]map[string]row{}
	for ns := range m.bindings {
		ps, err := hub.ProfilesIn(ctx, ns)
		if err != nil {
			return nil, err
		}
		out[ns] = map[string]row{}
		for name, p := range ps {
			out[ns][name] = rowOf(p)
		}
	}
	return out, nil
}

func rowOf(p *cpv1alpha1.ClusterProfile) row {
	r := row{set: p.Labels["multicluster.x-k8s.io/clusterset"], version: p.Status.Version.Kubernetes, healthy: "?"}
	if c := meta.FindStatusCondition(p.Status.Conditions, "ControlPlaneHealthy"); c != nil {
		r.healthy = string(c.Status)
	}
	return r
}

func diff(before, after map[string]map[string]row) []string {
	var out []string
	for _, ns := range sortedKeys(after) {
		for _, name := range sortedKeys(before[ns]) {
			if _, ok := after[ns][name]; !ok {
				out = append(out, fmt.Sprintf("- %s/%s removed", ns, name))
			}
		}
		for _, name := range sortedKeys(after[ns]) {
			b, existed := before[ns][name]
			a := after[ns][name]
			switch {
			case !existed:
				out = append(out, fmt.Sprintf("+ %s/%s created (clusterset %q, %s, ControlPlaneHealthy=%s)", ns, name, a.set, a.version, a.healthy))
			case a != b:
				var what []string
				if a.set != b.set {
					what = append(what, fmt.Sprintf("clusterset %q -> %q", b.set, a.set))
				}
				if a.healthy != b.healthy {
					what = append(what, fmt.Sprintf("ControlPlaneHealthy %s -> %s", b.healthy, a.healthy))
				}
				if a.version != b.version {
					what = append(what, fmt.Sprintf("version %s -> %s", b.version, a.version))
				}
				out = append(out, fmt.Sprintf("~ %s/%s updated: %s", ns, name, strings.Join(what, ", ")))
			}
		}
	}
	if len(out) == 0 {
		out = append(out, "(no profile changed)")
	}
	return out
}

func printProfiles(ctx context.Context, hub *fleet.Hub, m *model) error {
	for _, ns := range sortedKeys(m.bindings) {
		ps, err := hub.ProfilesIn(ctx, ns)
		if err != nil {
			return err
		}
		fmt.Printf("\n   namespace %s: %d ClusterProfiles\n", ns, len(ps))
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "   CLUSTER\tCLUSTERSET\tKUBERNETES\tHEALTHY\tJOINED\tPROPERTIES")
		for _, name := range sortedKeys(ps) {
			p := ps[name]
			r := rowOf(p)
			joined := "?"
			if c := meta.FindStatusCondition(p.Status.Conditions, "Joined"); c != nil {
				joined = string(c.Status)
			}
			var props []string
			for _, pr := range p.Status.Properties {
				if pr.Name == "platform.open-cluster-management.io" || pr.Name == "region.open-cluster-management.io" {
					props = append(props, pr.Value)
				}
			}
			fmt.Fprintf(tw, "   %s\t%s\t%s\t%s\t%s\t%d (%s)\n", name, r.set, r.version, r.healthy, joined, len(p.Status.Properties), strings.Join(props, ", "))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	return nil
}

func step(s string) { fmt.Printf("\n== %s\n", s) }

func since(t time.Time) string { return time.Since(t).Round(time.Millisecond).String() }

func total(m map[string][]string) int {
	n := 0
	for _, v := range m {
		n += len(v)
	}
	return n
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
