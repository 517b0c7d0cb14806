package outage

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/hubsync/hubsync/bus"
	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/test/controlplane"
	"github.com/hubsync/hubsync/test/fleet"
)

// natsProcess is a nats-server binary (built from the pinned module) run
// as its own process, so the test can kill it like a crashed server.
type natsProcess struct {
	bin, dir, addr string
	cmd            *exec.Cmd
	logs           fleet.LogBuffer
}

func (n *natsProcess) start(t *testing.T) {
	t.Helper()
	host, port, _ := net.SplitHostPort(n.addr)
	// Every acknowledged message is synced to disk before the ack, so a
	// SIGKILLed server keeps what it acknowledged (by default JetStream
	// syncs every 2 minutes, and a kill loses the unsynced tail).
	conf := filepath.Join(filepath.Dir(n.dir), filepath.Base(n.dir)+".conf")
	data := fmt.Sprintf("host: %q\nport: %s\njetstream {\n  store_dir: %q\n  sync_interval: always\n}\n", host, port, n.dir)
	if err := os.WriteFile(conf, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	n.cmd = exec.Command(n.bin, "-c", conf)
	n.cmd.Stdout, n.cmd.Stderr = &n.logs, &n.logs
	if err := n.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
		c, err := net.Dial("tcp", n.addr)
		if err == nil {
			c.Close()
		}
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("nats-server did not start: %v\n%s", err, n.logs.String())
	}
}

func (n *natsProcess) kill() {
	if n.cmd != nil && n.cmd.Process != nil {
		_ = n.cmd.Process.Signal(syscall.SIGKILL)
		_ = n.cmd.Wait()
	}
}

func freeAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func build(t *testing.T, out, pkg string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), out)
	if b, err := exec.Command("go", "build", "-o", bin, pkg).CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", pkg, err, b)
	}
	return bin
}

// TestNATSOutage kills an external NATS in the middle of a burst of
// changes and restarts it: reconciliation goes on meanwhile, and afterwards
// the KV equals the hub and every change made while NATS was up is in the
// stream.
// natsRig is a real kube-apiserver with a set "fleet" bound in the given
// namespaces, a nats-server process and the hubsync binary, all stopped
// when the test ends.
type natsRig struct {
	ns         *natsProcess
	cp         *controlplane.ControlPlane
	hub        *fleet.Hub
	hubsyncBin string
}

func newNATSRig(ctx context.Context, t *testing.T, namespaces ...string) *natsRig {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	r := &natsRig{hubsyncBin: build(t, "hubsync", "github.com/hubsync/hubsync/cmd/hubsync")}
	r.ns = &natsProcess{bin: build(t, "nats-server", "github.com/nats-io/nats-server/v2"), dir: t.TempDir(), addr: freeAddr(t)}
	r.ns.start(t)
	t.Cleanup(r.ns.kill)
	cp, err := controlplane.Start(ctx)
	must(err)
	t.Cleanup(func() { _ = cp.Stop() })
	r.cp = cp
	r.hub, err = fleet.NewHub(cp.Config)
	must(err)
	must(r.hub.CreateExclusiveSet(ctx, "fleet"))
	for _, n := range namespaces {
		must(r.hub.Namespace(ctx, n))
		must(r.hub.Bind(ctx, n, "fleet", true))
	}
	return r
}

func TestNATSOutage(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	r := newNATSRig(ctx, t, "team-a", "team-b")
	ns, cp, hub, hubsyncBin := r.ns, r.cp, r.hub, r.hubsyncBin

	var logs fleet.LogBuffer
	conf := config.Config{}
	conf.Bus.URLs = []string{"nats://" + ns.addr}
	d, err := fleet.StartDaemon(ctx, hubsyncBin, cp.Config, conf, &logs)
	must(err)
	defer d.Stop()
	must(d.WaitReady(ctx, 60*time.Second))

	expectProfiles := func(what string, n int) {
		t.Helper()
		err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
			for _, nsName := range []string{"team-a", "team-b"} {
				names, err := hub.ProfileNames(ctx, nsName)
				if err != nil || len(names) != n {
					return false, nil
				}
			}
			return true, nil
		})
		if err != nil {
			t.Fatalf("%s: profiles did not converge to %d per namespace\n%s", what, n, logs.String())
		}
	}

	published := func() float64 {
		m, err := d.Metrics()
		if err != nil {
			return -1
		}
		return fleet.MetricSum(m, "hubsync_events_published_total")
	}

	// A burst of 40 clusters (80 profiles). NATS is killed in its middle:
	// once some events are published and while clusters are still being
	// created.
	const total = 40
	var made atomic.Int32
	burstDone := make(chan error, 1)
	go func() {
		for i := range total {
			if _, err := hub.CreateCluster(ctx, fleet.ClusterSpec{Name: fmt.Sprintf("c%02d", i), Labels: fleet.ExclusiveSetLabels("fleet", nil)}); err != nil {
				burstDone <- err
				return
			}
			made.Add(1)
		}
		burstDone <- nil
	}()
	err = wait.PollUntilContextTimeout(ctx, 5*time.Millisecond, 60*time.Second, true, func(context.Context) (bool, error) {
		return published() >= 10, nil
	})
	must(err)
	ns.kill()
	atKill := made.Load()
	t.Logf("NATS killed with %d of %d clusters created and %v events published", atKill, total, published())
	if atKill >= total {
		t.Fatalf("the burst was over before NATS was killed")
	}
	must(<-burstDone)
	must(hub.DeleteCluster(ctx, "c03"))
	must(hub.Relabel(ctx, "c04", "tier", "gold"))
	expectProfiles("while NATS is down", total-1)
	// hubsync says NATS is gone and keeps running.
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 60*time.Second, true, func(context.Context) (bool, error) {
		m, err := d.Metrics()
		return err == nil && strings.Contains(m, "\nhubsync_bus_connected 0\n") && strings.Contains(logs.String(), "disconnected from NATS"), nil
	})
	if err != nil {
		t.Fatalf("the NATS outage was not reported\n%s", logs.String())
	}
	select {
	case err := <-d.Done():
		t.Fatalf("hubsync exited while NATS was down: %v\n%s", err, logs.String())
	default:
	}
	ns.start(t)

	nc, err := nats.Connect("nats://" + ns.addr)
	must(err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	must(err)
	def := config.Default().Bus

	// Afterwards the KV equals the hub: one record per profile, no others.
	want := map[string]bool{}
	for _, nsName := range []string{"team-a", "team-b"} {
		names, err := hub.ProfileNames(ctx, nsName)
		must(err)
		for _, n := range names {
			want[bus.KVKey(nsName, n)] = true
		}
	}
	var lastErr error
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		kv, err := js.KeyValue(ctx, def.KVBucket)
		if err != nil {
			lastErr = err
			return false, nil
		}
		keys, err := kv.Keys(ctx)
		if err != nil {
			lastErr = err
			return false, nil
		}
		sort.Strings(keys)
		got := map[string]bool{}
		for _, k := range keys {
			got[k] = true
		}
		for k := range want {
			if !got[k] {
				lastErr = fmt.Errorf("KV lacks %s", k)
				return false, nil
			}
		}
		for k := range got {
			if !want[k] {
				lastErr = fmt.Errorf("KV has stale %s", k)
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("KV never matched the hub: %v\n%s", lastErr, logs.String())
	}

	// Every profile's creation is in the stream, those made before the kill
	// and those queued while NATS was down alike.
	stream, err := js.Stream(ctx, def.Stream.Name)
	must(err)
	info, err := stream.Info(ctx)
	must(err)
	created := map[string]bool{}
	types := map[string][]string{} // subject -> event types, in order
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		m, err := stream.GetMsg(ctx, seq)
		if err != nil {
			continue
		}
		must(bus.ValidateEvent(m.Data))
		var e struct {
			Type    string `json:"type"`
			Subject string `json:"subject"`
		}
		must(json.Unmarshal(m.Data, &e))
		types[e.Subject] = append(types[e.Subject], strings.TrimPrefix(e.Type, "io.hubsync."))
		if e.Type == "io.hubsync.profile.created" {
			created[e.Subject] = true
		}
	}
	for i := range total {
		for _, nsName := range []string{"team-a", "team-b"} {
			if s := fmt.Sprintf("%s/c%02d", nsName, i); !created[s] {
				t.Errorf("profile.created for %s missing from the stream; its events: %v", s, types[s])
			}
		}
	}
	if !strings.Contains(logs.String(), "reconnected to NATS") {
		t.Errorf("hubsync's log does not say it reconnected to NATS:\n%s", logs.String())
	}
}
