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

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/events"
	"github.com/hubsync/hubsync/test/controlplane"
	"github.com/hubsync/hubsync/test/fleet"
	"github.com/hubsync/hubsync/test/testutil"
)

// natsProcess is a nats-server binary (built from the pinned module) run
// as its own process, so the test can kill it like a crashed server.
type natsProcess struct {
	bin, dir, addr string
	// include, if set, is a configuration file the server's own includes
	// (the accounts hubsync bus-accounts prints).
	include string
	cmd     *exec.Cmd
	logs    fleet.LogBuffer
}

func (n *natsProcess) start(t *testing.T) {
	t.Helper()
	host, port, _ := net.SplitHostPort(n.addr)
	// Every acknowledged message is synced to disk before the ack, so a
	// SIGKILLed server keeps what it acknowledged (by default JetStream
	// syncs every 2 minutes, and a kill loses the unsynced tail).
	conf := filepath.Join(filepath.Dir(n.dir), filepath.Base(n.dir)+".conf")
	data := fmt.Sprintf("host: %q\nport: %s\njetstream {\n  store_dir: %q\n  sync_interval: always\n}\n", host, port, n.dir)
	if n.include != "" {
		// nats-server reads an include relative to the including file.
		rel, err := filepath.Rel(filepath.Dir(conf), n.include)
		if err != nil {
			t.Fatal(err)
		}
		data += fmt.Sprintf("include %q\n", rel)
	}
	if err := os.WriteFile(conf, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	n.cmd = exec.Command(n.bin, "-c", conf)
	n.cmd.Stdout, n.cmd.Stderr = &n.logs, &n.logs
	if err := n.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	err := testutil.Poll(context.Background(), 20*time.Second, 50*time.Millisecond, func() error {
		c, err := net.Dial("tcp", n.addr)
		if err == nil {
			c.Close()
		}
		return err
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
	r := &natsRig{hubsyncBin: testutil.Hubsync(t)}
	r.ns = &natsProcess{bin: testutil.Binary(t, "github.com/nats-io/nats-server/v2"), dir: t.TempDir(), addr: freeAddr(t)}
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
		err := testutil.Poll(ctx, 60*time.Second, 50*time.Millisecond, func() bool {
			for _, nsName := range []string{"team-a", "team-b"} {
				names, err := hub.ProfileNames(ctx, nsName)
				if err != nil || len(names) != n {
					return false
				}
			}
			return true
		})
		if err != nil {
			t.Fatalf("%s: profiles did not converge to %d per namespace\n%s", what, n, logs.String())
		}
	}

	published := func() float64 {
		m, err := d.Scrape()
		if err != nil {
			return -1
		}
		return m.Value("hubsync_bus_events_published_total", nil)
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
	err = testutil.Poll(ctx, 60*time.Second, 5*time.Millisecond, func() bool {
		return published() >= 10
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
	err = testutil.Poll(ctx, 60*time.Second, 50*time.Millisecond, func() bool {
		m, err := d.Scrape()
		if err != nil {
			return false
		}
		connected, ok := m.Lookup("hubsync_bus_connected", nil)
		return ok && connected == 0 && strings.Contains(logs.String(), "disconnected from NATS")
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
			want[events.KVKey(nsName, n)] = true
		}
	}
	err = testutil.Poll(ctx, 60*time.Second, 200*time.Millisecond, func() error {
		kv, err := js.KeyValue(ctx, def.KVBucket)
		if err != nil {
			return err
		}
		keys, err := kv.Keys(ctx)
		if err != nil {
			return err
		}
		sort.Strings(keys)
		got := map[string]bool{}
		for _, k := range keys {
			got[k] = true
		}
		for k := range want {
			if !got[k] {
				return fmt.Errorf("KV lacks %s", k)
			}
		}
		for k := range got {
			if !want[k] {
				return fmt.Errorf("KV has stale %s", k)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("KV never matched the hub: %v\n%s", err, logs.String())
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
		must(events.ValidateEvent(m.Data))
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
