package tunnel

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hubsync/hubsync/bus"
	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/stream"
	"github.com/hubsync/hubsync/test/fleet"
	"github.com/hubsync/hubsync/test/leak"
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
	bin := filepath.Join(t.TempDir(), "hubsync")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/hubsync/hubsync/cmd/hubsync").CombinedOutput(); err != nil {
		t.Fatalf("build hubsync: %v\n%s", err, out)
	}
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
	deadline := time.Now().Add(30 * time.Second)
	for _, err := js.Stream(ctx, conf.Bus.Stream.Name); err != nil; _, err = js.Stream(ctx, conf.Bus.Stream.Name) {
		if time.Now().After(deadline) {
			t.Fatalf("stream %s: %v", conf.Bus.Stream.Name, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	cons, err := js.OrderedConsumer(ctx, conf.Bus.Stream.Name, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{conf.Bus.SubjectPrefix + "." + ns + ".*.tunnel"}, DeliverPolicy: jetstream.DeliverAllPolicy,
	})
	if err != nil {
		t.Fatal(err)
	}
	events := make(chan bus.Event, 64)
	cc, err := cons.Consume(func(m jetstream.Msg) {
		if err := bus.ValidateEvent(m.Data()); err != nil {
			t.Errorf("event fails the schema: %v\n%s", err, m.Data())
		}
		e, err := bus.Decode(m.Data())
		if err != nil {
			t.Error(err)
			return
		}
		events <- e
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Stop()
	var seen []bus.Event
	// await returns the first event of typ for cluster not awaited yet.
	used := map[int]bool{}
	await := func(typ, cluster string) bus.Event {
		t.Helper()
		timeout := time.After(60 * time.Second)
		for {
			for i, e := range seen {
				if !used[i] && e.Type == typ && e.Data.Cluster == cluster {
					used[i] = true
					return e
				}
			}
			select {
			case e := <-events:
				seen = append(seen, e)
			case <-timeout:
				t.Fatalf("no %s event for %s; saw %d events", typ, cluster, len(seen))
			}
		}
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
	metrics, err := d.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(metrics, `hubsync_tunnel_state{cluster="`+d2+`",state="ready"} 1`) {
		t.Fatalf("metrics lack the tunnel state of %s", d2)
	}

	env.agents[0].Kill()
	e := await(stream.TunnelFailing, d1)
	if e.Data.Tunnel == nil || e.Data.Tunnel.Reason == "" {
		t.Fatalf("failing event without a reason: %+v", e.Data)
	}
	// Operators see it on the ManagedCluster too.
	deadline = time.Now().Add(30 * time.Second)
	for {
		evs, err := h.Kube.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + d1 + ",reason=TunnelFailing"})
		if err == nil && len(evs.Items) > 0 {
			if ev := evs.Items[0]; ev.InvolvedObject.Kind != "ManagedCluster" || ev.InvolvedObject.UID == "" {
				t.Fatalf("event on %+v, want the ManagedCluster with its uid", ev.InvolvedObject)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no TunnelFailing Event for %s: %v", d1, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := env.agents[0].Start(); err != nil {
		t.Fatal(err)
	}
	await(stream.TunnelReady, d1)
	for i, e := range seen {
		if e.Data.Cluster == d2 && !used[i] {
			t.Fatalf("the other cluster's tunnel changed: %s", e.Type)
		}
	}
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
