package tunnel

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/events"
	"github.com/hubsync/hubsync/stream"
	"github.com/hubsync/hubsync/test/fleet"
	"github.com/hubsync/hubsync/test/leak"
	"github.com/hubsync/hubsync/test/testutil"
)

// TestDaemonPublishesTunnelState runs the real binary with the pool on:
// a namespace bound to a cluster set gets profiles for two clusters, the
// pool warms them without any request, and the namespace's NATS subjects,
// /readyz and /metrics say so; an agent going away and coming back is
// published too.
func TestDaemonPublishesTunnelState(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	h, err := fleet.NewHub(env.hub)
	if err != nil {
		t.Fatal(err)
	}
	bin := testutil.Hubsync(t)
	// Names unique to the run, so the test can run again in one process.
	run := runSeq.Add(1)
	set, ns := fmt.Sprintf("tunnel-daemon-%d", run), fmt.Sprintf("team-tunnel-%d", run)
	if err := h.CreateExclusiveSet(ctx, set); err != nil {
		t.Fatal(err)
	}
	if err := h.Namespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	if err := h.Bind(ctx, ns, set, true); err != nil {
		t.Fatal(err)
	}
	d1, d2 := fmt.Sprintf("daemon%d-c1", run), fmt.Sprintf("daemon%d-c2", run)
	joinCluster(t, h, d1, env.managed[0], fleet.ExclusiveSetLabels(set, nil))
	joinCluster(t, h, d2, env.managed[1], fleet.ExclusiveSetLabels(set, nil))

	conf := *config.Default()
	conf.Tunnel = env.server.TunnelConfig(msaName)
	logs := &fleet.LogBuffer{}
	d, err := fleet.StartDaemon(ctx, bin, env.hub, conf, logs)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = d.Stop()
		for _, f := range leak.Tokens(logs.String(), h.Tokens()) {
			t.Errorf("%s appears in hubsync's log", f)
		}
		if t.Failed() {
			t.Logf("hubsync log:\n%s", logs.String())
		}
	}()
	if err := d.WaitReady(ctx, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(d.NATSURL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	// Everything the stream keeps about the namespace's tunnels, from
	// the start: the ready events may precede this subscription. The
	// daemon creates the stream once it leads; wait for it.
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, 50*time.Millisecond, func() error {
		_, err := js.Stream(ctx, conf.Bus.Stream.Name)
		return err
	}, "stream %s", conf.Bus.Stream.Name)
	cons, err := js.OrderedConsumer(ctx, conf.Bus.Stream.Name, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{conf.Bus.SubjectPrefix + "." + ns + ".*.tunnel"}, DeliverPolicy: jetstream.DeliverAllPolicy,
	})
	if err != nil {
		t.Fatal(err)
	}
	var got testutil.Recorder[events.Event]
	cc, err := cons.Consume(func(m jetstream.Msg) {
		if err := events.ValidateEvent(m.Data()); err != nil {
			t.Errorf("event fails the schema: %v\n%s", err, m.Data())
		}
		e, err := events.Decode(m.Data())
		if err != nil {
			t.Error(err)
			return
		}
		got.Notify(e)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Stop()
	// await returns the first event of typ for cluster not awaited yet.
	await := func(typ, cluster string) events.Event {
		t.Helper()
		return got.Take(t, 60*time.Second, func(e events.Event) bool {
			return e.Type == typ && e.Data.Cluster == cluster
		}, "no %s event for %s", typ, cluster)
	}
	for _, c := range []string{d1, d2} {
		e := await(stream.TunnelReady, c)
		if e.Data.Tunnel == nil || e.Data.Tunnel.State != "ready" || e.Data.Tunnel.Transport != "konnectivity" || e.Data.Namespace != ns {
			t.Fatalf("ready event %+v", e.Data)
		}
	}
	body := get(t, "http://"+d.Address+"/readyz?verbose")
	for _, want := range []string{"tunnels: 2 ready, 0 failing, 0 connecting", "tunnel " + d1 + ": ready"} {
		if !strings.Contains(body, want) {
			t.Fatalf("/readyz?verbose lacks %q:\n%s", want, body)
		}
	}
	metrics, err := d.Scrape()
	if err != nil {
		t.Fatal(err)
	}
	if v := metrics.Value("hubsync_tunnel_state", testutil.Labels{"cluster": d2, "state": "ready"}); v != 1 {
		t.Fatalf(`hubsync_tunnel_state{cluster=%q,state="ready"} = %v, want 1`, d2, v)
	}
	// since is when each cluster's entry entered its state: it moves with
	// the state only, not with every scrape.
	since := func(m testutil.Metrics, cluster string) float64 {
		t.Helper()
		v, ok := m.Lookup("hubsync_tunnel_state_since_timestamp_seconds", testutil.Labels{"cluster": cluster})
		if !ok || v <= 0 || v > float64(time.Now().Unix()+1) {
			t.Fatalf("hubsync_tunnel_state_since_timestamp_seconds{cluster=%q} = %v (found: %v), want when it became ready", cluster, v, ok)
		}
		return v
	}
	readySince := map[string]float64{d1: since(metrics, d1), d2: since(metrics, d2)}

	env.agents[0].Kill()
	e := await(stream.TunnelFailing, d1)
	if e.Data.Tunnel == nil || e.Data.Tunnel.Reason == "" {
		t.Fatalf("failing event without a reason: %+v", e.Data)
	}
	// Operators see it on the ManagedCluster too.
	testutil.Eventually(t, 30*time.Second, 50*time.Millisecond, func() error {
		evs, err := h.Kube.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + d1 + ",reason=TunnelFailing"})
		if err != nil {
			return err
		}
		if len(evs.Items) == 0 {
			return errors.New("none yet")
		}
		if ev := evs.Items[0]; ev.InvolvedObject.Kind != "ManagedCluster" || ev.InvolvedObject.UID == "" {
			return testutil.Stop(fmt.Errorf("event on %+v, want the ManagedCluster with its uid", ev.InvolvedObject))
		}
		return nil
	}, "TunnelFailing Event for %s", d1)
	if err := env.agents[0].Start(); err != nil {
		t.Fatal(err)
	}
	await(stream.TunnelReady, d1)
	for _, e := range got.Untaken() {
		if e.Data.Cluster == d2 {
			t.Fatalf("the other cluster's tunnel changed: %s", e.Type)
		}
	}
	testutil.Eventually(t, 30*time.Second, 50*time.Millisecond, func() error {
		m, err := d.Scrape()
		if err != nil {
			return err
		}
		if m.Value("hubsync_tunnel_state", testutil.Labels{"cluster": d1, "state": "ready"}) != 1 {
			return errors.New("not ready in /metrics yet")
		}
		if s := since(m, d1); s <= readySince[d1] {
			return testutil.Stop(fmt.Errorf("%s failed and came back, but its state is still since %v", d1, s))
		}
		if s := since(m, d2); s != readySince[d2] {
			return testutil.Stop(fmt.Errorf("%s stayed ready, but its since timestamp moved from %v to %v", d2, readySince[d2], s))
		}
		return nil
	}, "%s ready again in /metrics", d1)
}

var runSeq atomic.Int32

func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// TestProbesWithoutTokenKeepTheConnection: once a cluster's
// ManagedServiceAccount Secret is gone, its entry probes without a
// token, and kube-apiserver closes an HTTP/2 connection after an
// anonymous request (UnauthenticatedHTTP2DOSMitigation). The probes are
// then HTTP/2 PINGs: the entry keeps its one connection rather than
// redialing after every probe.
func TestProbesWithoutTokenKeepTheConnection(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	h, err := fleet.NewHub(env.hub)
	if err != nil {
		t.Fatal(err)
	}
	run := runSeq.Add(1)
	set, ns, name := fmt.Sprintf("tokenless-%d", run), fmt.Sprintf("team-tokenless-%d", run), fmt.Sprintf("tokenless%d-c1", run)
	for _, err := range []error{h.CreateExclusiveSet(ctx, set), h.Namespace(ctx, ns), h.Bind(ctx, ns, set, true)} {
		if err != nil {
			t.Fatal(err)
		}
	}
	joinCluster(t, h, name, env.managed[0], fleet.ExclusiveSetLabels(set, nil))
	conf := *config.Default()
	conf.Tunnel = env.server.TunnelConfig(msaName)
	logs := &fleet.LogBuffer{}
	d, err := fleet.StartDaemon(ctx, testutil.Hubsync(t), env.hub, conf, logs)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = d.Stop()
		if t.Failed() {
			t.Logf("hubsync log:\n%s", logs.String())
		}
	}()
	if err := d.WaitReady(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	metric := func(name string, labels testutil.Labels) float64 {
		m, err := d.Scrape()
		if err != nil {
			t.Fatal(err)
		}
		return m.Value(name, labels)
	}
	testutil.Eventually(t, time.Minute, 50*time.Millisecond, func() error {
		if metric("hubsync_tunnel_state", testutil.Labels{"cluster": name, "state": "ready"}) != 1 {
			return errors.New("not ready")
		}
		return nil
	})
	if err := h.Kube.CoreV1().Secrets(name).Delete(ctx, msaName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	dials, probes := metric("hubsync_tunnel_dials_total", nil), metric("hubsync_tunnel_probes_total", nil)
	// Four probe intervals (1 s) without the token.
	testutil.Eventually(t, time.Minute, 100*time.Millisecond, func() error {
		if metric("hubsync_tunnel_probes_total", nil) < probes+4 {
			return errors.New("fewer than four probes since the Secret went")
		}
		return nil
	})
	if now := metric("hubsync_tunnel_dials_total", nil); now != dials || strings.Contains(logs.String(), "connection lost") {
		t.Fatalf("%v dials since the token went (want none), or a connection lost", now-dials)
	}
}
