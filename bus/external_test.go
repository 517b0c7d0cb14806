package bus

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/hubsync/hubsync/bus/bustest"
	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/stream"
	"github.com/hubsync/hubsync/stream/streamtest"
	"github.com/hubsync/hubsync/test/testutil"
)

// externalRig is an external nats-server whose configuration includes
// the accounts file hubsync prints (AccountsConfig), and the bus
// configuration hubsync runs with against it.
type externalRig struct {
	t        *testing.T
	dir      string
	cfg      config.Bus
	srv      *server.Server
	accounts string // the included accounts file
	seeds    map[string]nkeys.KeyPair
}

// newExternalRig writes hubsync's seed and one NKey per consumer, and
// starts a nats-server with the accounts of the consumers in printed
// (a subset of cfg's, for a server that lags behind hubsync's
// configuration).
func newExternalRig(t *testing.T, consumers []config.BusConsumer, printed int) *externalRig {
	t.Helper()
	r := &externalRig{t: t, dir: t.TempDir(), seeds: map[string]nkeys.KeyPair{}}
	self, _ := nkeys.CreateUser()
	seed, _ := self.Seed()
	r.cfg = busConfig(t)
	r.cfg.NKeySeedFile = filepath.Join(r.dir, "hubsync.nk")
	if err := os.WriteFile(r.cfg.NKeySeedFile, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	for i := range consumers {
		kp, _ := nkeys.CreateUser()
		pub, _ := kp.PublicKey()
		consumers[i].NKeys = []string{pub}
		r.seeds[consumers[i].Name] = kp
	}
	r.cfg.Consumers = consumers
	r.cfg.URLs = []string{"nats://127.0.0.1:1"} // AccountsConfig does not dial
	r.accounts = filepath.Join(r.dir, "accounts.conf")
	r.printAccounts(consumers[:printed])
	conf := fmt.Sprintf("listen: 127.0.0.1:%d\nserver_name: external\njetstream: {store_dir: %q}\ninclude ./accounts.conf\n", freePort(t), filepath.Join(r.dir, "js"))
	if err := os.WriteFile(filepath.Join(r.dir, "nats.conf"), []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	r.run()
	t.Cleanup(func() { stopServer(r.srv) })
	r.cfg.URLs = []string{r.srv.ClientURL()}
	return r
}

// run starts the server from its configuration file.
func (r *externalRig) run() {
	r.t.Helper()
	opts, err := server.ProcessConfigFile(filepath.Join(r.dir, "nats.conf"))
	if err != nil {
		r.t.Fatalf("nats-server does not take the printed accounts: %v", err)
	}
	opts.NoSigs, opts.NoLog = true, true
	if r.srv, err = server.NewServer(opts); err != nil {
		r.t.Fatal(err)
	}
	go r.srv.Start()
	if !r.srv.ReadyForConnections(10 * time.Second) {
		r.t.Fatal("nats-server not ready")
	}
}

// restart stops the server and starts it again on the same address and
// store, with its configuration file as it is now.
func (r *externalRig) restart() {
	r.t.Helper()
	stopServer(r.srv)
	r.run()
}

// printAccounts writes the accounts file for consumers, as an operator
// runs hubsync bus-accounts.
func (r *externalRig) printAccounts(consumers []config.BusConsumer) {
	r.t.Helper()
	cfg := r.cfg
	cfg.Consumers = consumers
	out, err := AccountsConfig(cfg)
	if err != nil {
		r.t.Fatal(err)
	}
	if err := os.WriteFile(r.accounts, out, 0o600); err != nil {
		r.t.Fatal(err)
	}
}

// consumer connects as consumer's application, its permissions
// violations going to errs.
func (r *externalRig) consumer(name string, errs bustest.Errors) *nats.Conn {
	r.t.Helper()
	kp := r.seeds[name]
	pub, _ := kp.PublicKey()
	opts := []nats.Option{nats.Nkey(pub, kp.Sign)}
	if errs != nil {
		opts = append(opts, errs.Handler())
	}
	nc, err := nats.Connect(r.srv.ClientURL(), opts...)
	if err != nil {
		r.t.Fatalf("%s signs in: %v", name, err)
	}
	r.t.Cleanup(nc.Close)
	return nc
}

func copyOf(copies []CopyState, consumer string) (CopyState, bool) {
	for _, c := range copies {
		if c.Consumer == consumer {
			return c, true
		}
	}
	return CopyState{}, false
}

// TestExternalNATSAccounts: on an external NATS configured with the
// accounts hubsync prints, hubsync publishes in its own account and makes
// each application's copies through that account's provisioning user; an
// application reads its namespaces by subject and can neither write, erase
// nor spy. An application added to bus.consumers before the servers have
// its account is reported failing, and gets its copies once the printed
// accounts are reloaded, without restarting hubsync.
func TestExternalNATSAccounts(t *testing.T) {
	r := newExternalRig(t, []config.BusConsumer{{Name: "kueue", Namespaces: []string{"team-a"}}, {Name: "argocd"}}, 1)
	b, reg := newBus(t, r.cfg)
	start(t, b, nil)
	b.Notify(streamtest.Profile(stream.ProfileCreated, "team-a", "c1", "1"))
	b.Notify(streamtest.Profile(stream.ProfileCreated, "team-b", "c2", "1"))
	flush(t, b)

	ctx := t.Context()
	until(t, "kueue's copies, and argocd's failing", func() error {
		b.refreshHealth(ctx)
		h, _ := b.Health()
		k, _ := copyOf(h.Copies, "kueue")
		a, ok := copyOf(h.Copies, "argocd")
		switch {
		case k.Err != nil || k.Events != 1 || k.Records != 1:
			return fmt.Errorf("kueue: %+v", k)
		case !ok || a.Err == nil:
			return fmt.Errorf("argocd: %+v", a)
		}
		return nil
	})
	if m, err := testutil.Gather(reg); err != nil {
		t.Fatal(err)
	} else if got := m.Value("hubsync_bus_copy_failing", map[string]string{"consumer": "argocd"}); got != 1 {
		t.Errorf("hubsync_bus_copy_failing{consumer=argocd} = %v, want 1", got)
	}
	if err := FindingsErr(VerifyExternal(ctx, r.cfg)); err == nil || !strings.Contains(err.Error(), "consumer argocd: its provisioning user signs in") {
		t.Errorf("VerifyExternal with argocd's account missing: %v", err)
	}
	lines := strings.Join(b.HealthLines(time.Now()), "\n")
	if !strings.Contains(lines, "bus stream: healthy, replicas 1 current") || !strings.Contains(lines, "bus copy argocd: failing") {
		t.Errorf("health lines:\n%s", lines)
	}

	// The operator prints the accounts again and restarts the server
	// (docs/events.md: an account added by a reload gets no imports).
	r.printAccounts(r.cfg.Consumers)
	r.restart()
	until(t, "argocd's copies", func() error {
		a, _ := copyOf(b.Copies(ctx), "argocd")
		if a.Err != nil || a.Events != 2 || a.Records != 2 {
			return fmt.Errorf("argocd: %+v", a)
		}
		return nil
	})
	for _, f := range VerifyExternal(ctx, r.cfg) {
		if f.Err != nil {
			t.Errorf("VerifyExternal: %s: %v", f.What, f.Err)
		}
	}

	// nats sub 'hubsync.>' --all, as kueue.
	js, err := r.consumer("kueue", nil).JetStream()
	if err != nil {
		t.Fatal(err)
	}
	sub, err := js.SubscribeSync(r.cfg.SubjectPrefix+".>", nats.DeliverAll(), nats.OrderedConsumer())
	if err != nil {
		t.Fatalf("subscribe by subject: %v", err)
	}
	if m, err := sub.NextMsg(5 * time.Second); err != nil || !strings.Contains(m.Subject, ".team-a.") {
		t.Fatalf("kueue's first event: %v, %v", m, err)
	}
	if m, err := sub.NextMsg(300 * time.Millisecond); err == nil {
		t.Fatalf("kueue got %s, of a namespace it does not read", m.Subject)
	}

	errs := bustest.NewErrors()
	attack, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	names := bustest.Names{Prefix: r.cfg.SubjectPrefix, Stream: r.cfg.Stream.Name, Bucket: r.cfg.KVBucket, Namespace: "team-a"}
	if allowed := bustest.Attack(attack, r.consumer("kueue", errs), errs, names); len(allowed) > 0 {
		t.Errorf("the server allowed kueue:\n%s", strings.Join(allowed, "\n"))
	}
	self, err := nats.NkeyOptionFromSeed(r.cfg.NKeySeedFile)
	if err != nil {
		t.Fatal(err)
	}
	w := connectWith(t, r.srv.ClientURL(), self)
	if got := len(w.messages(t, r.cfg.Stream.Name)); got != 2 {
		t.Errorf("hubsync's stream holds %d events after the attack, want 2", got)
	}
	if got := len(w.records(t, r.cfg.KVBucket)); got != 2 {
		t.Errorf("hubsync's bucket holds %d records after the attack, want 2", got)
	}

	// Removed from bus.consumers: its copies go.
	if err := b.SetConsumers(ctx, r.cfg.Consumers[:1]); err != nil {
		t.Fatal(err)
	}
	if _, ok := copyOf(b.Copies(ctx), "argocd"); ok {
		t.Error("argocd's copies are still watched after its removal")
	}
}

// TestVerifyExternal: check-config --connect names what an external
// NATS's accounts lack, for each way of getting them wrong.
func TestVerifyExternal(t *testing.T) {
	tests := []struct {
		name  string
		edit  func(accounts map[string]map[string]any)
		wants string // "" for a layout as printed
	}{
		{name: "as printed"},
		{
			name:  "an application's account missing",
			edit:  func(a map[string]map[string]any) { delete(a, "HUBSYNC_CONSUMER_argocd") },
			wants: "consumer argocd: its provisioning user signs in",
		},
		{
			name: "two applications in one account",
			edit: func(a map[string]map[string]any) {
				k, g := a["HUBSYNC_CONSUMER_kueue"], a["HUBSYNC_CONSUMER_argocd"]
				k["users"] = append(k["users"].([]any), g["users"].([]any)...)
				delete(a, "HUBSYNC_CONSUMER_argocd")
			},
			wants: "each application needs an account of its own",
		},
		{
			name: "an application in hubsync's account",
			edit: func(a map[string]map[string]any) {
				w, g := a[WriterAccount], a["HUBSYNC_CONSUMER_argocd"]
				w["users"] = append(w["users"].([]any), g["users"].([]any)...)
				delete(a, "HUBSYNC_CONSUMER_argocd")
			},
			wants: "with hubsync: each application needs an account of its own",
		},
		{
			name:  "no imports",
			edit:  func(a map[string]map[string]any) { delete(a["HUBSYNC_CONSUMER_kueue"], "imports") },
			wants: "consumer kueue: its account reaches the consumer API",
		},
		{
			name:  "JetStream without limits",
			edit:  func(a map[string]map[string]any) { a["HUBSYNC_CONSUMER_kueue"]["jetstream"] = "enabled" },
			wants: "consumer kueue: its account has JetStream for its two copies only",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newExternalRig(t, []config.BusConsumer{{Name: "kueue"}, {Name: "argocd"}}, 2)
			if tt.edit != nil {
				users, err := ExternalUsers(r.cfg)
				if err != nil {
					t.Fatal(err)
				}
				raw, err := layoutOf(r.cfg).Config(users)
				if err != nil {
					t.Fatal(err)
				}
				var conf struct {
					Accounts map[string]map[string]any `json:"accounts"`
				}
				if err := json.Unmarshal(raw, &conf); err != nil {
					t.Fatal(err)
				}
				tt.edit(conf.Accounts)
				var out strings.Builder
				enc := json.NewEncoder(&out)
				enc.SetEscapeHTML(false) // nats-server's parser knows no \u escapes
				if err := enc.Encode(map[string]any{"accounts": conf.Accounts}); err != nil {
					t.Fatal(err)
				}
				body := strings.TrimSuffix(strings.TrimPrefix(strings.TrimSpace(out.String()), "{"), "}")
				if err := os.WriteFile(r.accounts, []byte(body), 0o600); err != nil {
					t.Fatal(err)
				}
				r.restart()
			}
			err := FindingsErr(VerifyExternal(t.Context(), r.cfg))
			switch {
			case tt.wants == "" && err != nil:
				t.Errorf("VerifyExternal: %v", err)
			case tt.wants != "" && (err == nil || !strings.Contains(err.Error(), tt.wants)):
				t.Errorf("VerifyExternal: %v; want it to say %q", err, tt.wants)
			}
		})
	}
}

// TestProvisionerKey: the same seed and consumer give the same key;
// another consumer or another seed another one; a key that is not a
// user seed is refused without being shown.
func TestProvisionerKey(t *testing.T) {
	a, _ := nkeys.CreateUser()
	b, _ := nkeys.CreateUser()
	seedA, _ := a.Seed()
	seedB, _ := b.Seed()
	pub := func(seed []byte, consumer string) string {
		kp, err := ProvisionerKey(seed, consumer)
		if err != nil {
			t.Fatal(err)
		}
		p, _ := kp.PublicKey()
		return p
	}
	selfPub, _ := a.PublicKey()
	k := pub(seedA, "kueue")
	for _, other := range []string{pub(seedA, "argocd"), pub(seedB, "kueue"), selfPub} {
		if other == k {
			t.Errorf("two identities share the key %s", k)
		}
	}
	if again := pub(append([]byte("  "), append(seedA, '\n')...), "kueue"); again != k {
		t.Errorf("the same seed gave %s, then %s", k, again)
	}
	acc, _ := nkeys.CreateAccount()
	accSeed, _ := acc.Seed()
	for _, bad := range [][]byte{accSeed, []byte("SUnot-a-seed")} {
		_, err := ProvisionerKey(bad, "kueue")
		if err == nil || strings.Contains(err.Error(), string(bad)) {
			t.Errorf("ProvisionerKey(%.4s…) = %v", bad, err)
		}
	}
}
