// Package outage tests that hubsync survives its hub API server going away
// and converges once it is back. It has its own control plane because it
// stops the API server.
package outage

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	clusterv1beta2 "open-cluster-management.io/api/cluster/v1beta2"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/test/controlplane"
	"github.com/hubsync/hubsync/test/fleet"
	"github.com/hubsync/hubsync/test/testutil"
)

func TestAPIServerOutage(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cp, err := controlplane.Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer cp.Stop()
	hub, err := fleet.NewHub(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	bin := testutil.Hubsync(t)

	must(hub.Namespace(ctx, "consumer"))
	must(hub.CreateExclusiveSet(ctx, "red"))
	must(hub.CreateExclusiveSet(ctx, "blue"))
	must(hub.Bind(ctx, "consumer", "red", true))
	for _, n := range []string{"c1", "c2"} {
		_, err := hub.CreateCluster(ctx, fleet.ClusterSpec{Name: n, Labels: fleet.ExclusiveSetLabels("red", nil)})
		must(err)
	}

	// hubsync reaches the API server through a proxy the test can cut.
	u, err := url.Parse(cp.Config.Host)
	must(err)
	proxy, err := fleet.NewProxy(u.Host)
	must(err)
	defer proxy.Close()
	viaProxy := rest.CopyConfig(cp.Config)
	viaProxy.Host = "https://" + proxy.Addr

	var logs fleet.LogBuffer
	conf := config.Config{}
	conf.Hub.Timeout.Duration = 5 * time.Second
	d, err := fleet.StartDaemon(ctx, bin, viaProxy, conf, &logs)
	must(err)
	defer d.Stop()
	expect := func(what string, want ...string) {
		t.Helper()
		err := testutil.Poll(ctx, 90*time.Second, 50*time.Millisecond, func() bool {
			got, err := hub.ProfileNames(ctx, "consumer")
			return err == nil && strings.Join(got, ",") == strings.Join(want, ",")
		})
		if err != nil {
			got, _ := hub.ProfileNames(ctx, "consumer")
			t.Fatalf("%s: profiles %v, want %v\n%s", what, got, want, logs.String())
		}
	}
	expect("before the outage", "c1", "c2")

	// The API server goes away for hubsync; the fleet changes meanwhile.
	proxy.Cut()
	must(hub.Relabel(ctx, "c1", clusterv1beta2.ClusterSetLabel, "blue"))
	_, err = hub.CreateCluster(ctx, fleet.ClusterSpec{Name: "c3", Labels: fleet.ExclusiveSetLabels("red", nil)})
	must(err)
	// hubsync notices, says so (log and metric), and keeps running.
	err = testutil.Poll(ctx, 60*time.Second, 50*time.Millisecond, func() bool {
		m, err := d.Scrape()
		if err != nil {
			return false
		}
		reachable, ok := m.Lookup("hubsync_hub_reachable", nil)
		return ok && reachable == 0 && strings.Contains(logs.String(), "hub API server unreachable")
	})
	if err != nil {
		t.Fatalf("the outage was not reported (hubsync_hub_reachable 0 and a log line)\n%s", logs.String())
	}
	select {
	case err := <-d.Done():
		t.Fatalf("hubsync exited while the API server was unreachable: %v\n%s", err, logs.String())
	default:
	}
	must(proxy.Restore())

	// Back: what changed meanwhile converges, and new changes flow.
	expect("after the outage", "c2", "c3")
	must(hub.Bind(ctx, "consumer", "blue", true))
	expect("new binding after the outage", "c1", "c2", "c3")

	// No profile was lost or duplicated, and the daemon says what happened.
	p, err := hub.Profiles.ApisV1alpha1().ClusterProfiles("consumer").Get(ctx, "c1", metav1.GetOptions{})
	must(err)
	if p.Labels["multicluster.x-k8s.io/clusterset"] != "blue" {
		t.Fatalf("c1 clusterset label %q", p.Labels["multicluster.x-k8s.io/clusterset"])
	}
	for _, want := range []string{"hub API server unreachable", "connection refused", "hub API server reachable again"} {
		err := testutil.Poll(ctx, 30*time.Second, 50*time.Millisecond, func() bool {
			return strings.Contains(logs.String(), want)
		})
		if err != nil {
			t.Errorf("hubsync did not log %q:\n%s", want, logs.String())
		}
	}
}
