package outage

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/test/controlplane"
	"github.com/hubsync/hubsync/test/fleet"
	"github.com/hubsync/hubsync/test/testutil"
)

// TestExternalNATSAccounts follows docs/events.md's recipe for an
// external NATS with the real binaries: hubsync nkey makes hubsync's and
// an application's keys, hubsync bus-accounts prints the accounts that a
// nats-server process includes, hubsync check-config --connect finds
// them in place, and the daemon publishes there: the application, with
// its own key, reads the events and records of its namespace only, with
// hubsync events and hubsync state.
func TestExternalNATSAccounts(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	bin := testutil.Hubsync(t)
	dir := t.TempDir()
	run := func(args ...string) (string, error) {
		var out, errOut bytes.Buffer
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Stdout, cmd.Stderr = &out, &errOut
		err := cmd.Run()
		if err != nil {
			err = fmt.Errorf("hubsync %s: %w\n%s%s", strings.Join(args, " "), err, out.String(), errOut.String())
		}
		return out.String(), err
	}
	newKey := func(name string) (seedFile, pub string) {
		seedFile = filepath.Join(dir, name+".nk")
		out, err := run("nkey", "--seed-file", seedFile, "--name", name)
		must(err)
		return seedFile, strings.TrimSpace(strings.SplitN(out, "\n", 2)[0])
	}
	selfSeed, _ := newKey("hubsync")
	appSeed, appPub := newKey("kueue")

	ns := &natsProcess{bin: testutil.Binary(t, "github.com/nats-io/nats-server/v2"), dir: filepath.Join(dir, "js"), addr: freeAddr(t), include: filepath.Join(dir, "accounts.conf")}
	url := "nats://" + ns.addr
	conf := config.Config{}
	conf.Bus.URLs = []string{url}
	conf.Bus.NKeySeedFile = selfSeed
	conf.Bus.Consumers = []config.BusConsumer{{Name: "kueue", NKeys: []string{appPub}, Namespaces: []string{"team-a"}}}
	data, err := yaml.Marshal(conf)
	must(err)
	confFile := filepath.Join(dir, "hubsync.yaml")
	must(os.WriteFile(confFile, data, 0o600))

	accounts, err := run("bus-accounts", confFile)
	must(err)
	must(os.WriteFile(ns.include, []byte(accounts), 0o600))
	ns.start(t)
	t.Cleanup(ns.kill)
	out, err := run("check-config", "--connect", confFile)
	must(err)
	for _, want := range []string{"ok   hubsync's account has JetStream", "ok   consumer kueue: its provisioning user signs in, in an account of its own (HUBSYNC_CONSUMER_kueue)", "ok   consumer kueue: its account reaches the consumer API of KV_hubsync-access"} {
		if !strings.Contains(out, want) {
			t.Errorf("check-config --connect does not say %q:\n%s", want, out)
		}
	}

	cp, err := controlplane.Start(ctx)
	must(err)
	t.Cleanup(func() { _ = cp.Stop() })
	hub, err := fleet.NewHub(cp.Config)
	must(err)
	must(hub.CreateExclusiveSet(ctx, "fleet"))
	for _, n := range []string{"team-a", "team-b"} {
		must(hub.Namespace(ctx, n))
		must(hub.Bind(ctx, n, "fleet", true))
	}
	var logs fleet.LogBuffer
	d, err := fleet.StartDaemon(ctx, bin, cp.Config, conf, &logs)
	must(err)
	defer d.Stop()
	must(d.WaitReady(ctx, 60*time.Second))
	const clusters = 3
	for i := range clusters {
		_, err := hub.CreateCluster(ctx, fleet.ClusterSpec{Name: fmt.Sprintf("c%d", i), Labels: fleet.ExclusiveSetLabels("fleet", nil)})
		must(err)
	}

	app := []string{"--server", url, "--nkey", appSeed}
	err = testutil.Poll(ctx, 60*time.Second, 250*time.Millisecond, func() error {
		out, err := run(append([]string{"state", "-o", "json"}, app...)...)
		if err != nil {
			return err
		}
		var records []struct {
			Namespace string `json:"namespace"`
			Cluster   string `json:"cluster"`
		}
		if err := json.Unmarshal([]byte(out), &records); err != nil {
			return testutil.Stop(fmt.Errorf("hubsync state -o json: %w\n%s", err, out))
		}
		for _, r := range records {
			if r.Namespace != "team-a" {
				return testutil.Stop(fmt.Errorf("the application reads a record of %s/%s", r.Namespace, r.Cluster))
			}
		}
		if len(records) != clusters {
			return fmt.Errorf("%d records, want %d", len(records), clusters)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("hubsync state as the application: %v\n%s", err, logs.String())
	}
	out, err = run(append([]string{"events", "--all", "--follow=false", "-o", "json"}, app...)...)
	must(err)
	created := 0
	for line := range strings.Lines(out) {
		var e struct {
			Type string `json:"type"`
			Data struct {
				Namespace string `json:"namespace"`
			} `json:"data"`
		}
		must(json.Unmarshal([]byte(line), &e))
		if e.Data.Namespace != "team-a" {
			t.Errorf("the application reads an event of namespace %q", e.Data.Namespace)
		}
		if e.Type == "io.hubsync.profile.created" {
			created++
		}
	}
	if created != clusters {
		t.Errorf("hubsync events as the application: %d profile.created events, want %d:\n%s", created, clusters, out)
	}
	// The daemon reports the application's copies healthy (refreshed
	// every 15 s).
	err = testutil.Poll(ctx, time.Minute, 500*time.Millisecond, func() error {
		m, err := d.Scrape()
		if err != nil {
			return err
		}
		if v, ok := m.Lookup("hubsync_bus_copy_failing", map[string]string{"consumer": "kueue"}); !ok || v != 0 {
			return fmt.Errorf("hubsync_bus_copy_failing{consumer=kueue} = %v (%v), want 0", v, ok)
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}
}
