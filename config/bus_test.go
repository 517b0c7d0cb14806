package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nkeys"
)

// TestBusConsumers: a consuming application is a name, public user NKeys
// and namespaces; a seed in the file is refused without being shown.
func TestBusConsumers(t *testing.T) {
	key := func() (string, string) {
		kp, err := nkeys.CreateUser()
		if err != nil {
			t.Fatal(err)
		}
		pub, _ := kp.PublicKey()
		seed, _ := kp.Seed()
		return pub, string(seed)
	}
	k1, seed := key()
	k2, _ := key()
	account, _ := nkeys.CreateAccount()
	accountKey, _ := account.PublicKey()
	seedFile := filepath.Join(t.TempDir(), "hubsync.nk")
	if err := os.WriteFile(seedFile, []byte(seed), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, doc string
		wantPaths []string
		notShown  string
	}{
		{name: "two consumers", doc: "bus: {consumers: [{name: kueue, nkeys: [" + k1 + "], namespaces: [kueue-system]}, {name: argo-cd, nkeys: [" + k2 + "]}]}"},
		{name: "name", doc: "bus: {consumers: [{name: Kueue, nkeys: [" + k1 + "]}]}", wantPaths: []string{"bus.consumers[0].name"}},
		{name: "local is taken", doc: "bus: {consumers: [{name: local, nkeys: [" + k1 + "]}]}", wantPaths: []string{"bus.consumers[0].name"}},
		{name: "twice", doc: "bus: {consumers: [{name: a, nkeys: [" + k1 + "]}, {name: a, nkeys: [" + k2 + "]}]}", wantPaths: []string{"bus.consumers[1].name"}},
		{name: "no key", doc: "bus: {consumers: [{name: a}]}", wantPaths: []string{"bus.consumers[0].nkeys"}},
		{name: "a seed", doc: "bus: {consumers: [{name: a, nkeys: [" + seed + "]}]}", wantPaths: []string{"bus.consumers[0].nkeys[0]"}, notShown: seed},
		{name: "a typo in the key", doc: "bus: {consumers: [{name: a, nkeys: [" + typo(k1) + "]}]}", wantPaths: []string{"bus.consumers[0].nkeys[0]"}},
		{name: "an account key", doc: "bus: {consumers: [{name: a, nkeys: [" + accountKey + "]}]}", wantPaths: []string{"bus.consumers[0].nkeys[0]"}},
		{name: "one key, two consumers", doc: "bus: {consumers: [{name: a, nkeys: [" + k1 + "]}, {name: b, nkeys: [" + k1 + "]}]}", wantPaths: []string{"bus.consumers[1].nkeys[0]"}},
		{name: "namespace", doc: "bus: {consumers: [{name: a, nkeys: [" + k1 + "], namespaces: [Team_A]}]}", wantPaths: []string{"bus.consumers[0].namespaces[0]"}},
		{name: "external NATS with hubsync's NKey", doc: "bus: {urls: [tls://nats:4222], nkeySeedFile: " + seedFile + ", consumers: [{name: a, nkeys: [" + k1 + "]}]}"},
		{name: "external NATS without hubsync's NKey", doc: "bus: {urls: [tls://nats:4222], consumers: [{name: a, nkeys: [" + k1 + "]}]}", wantPaths: []string{"bus.nkeySeedFile"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.doc + "\n"))
			if len(tt.wantPaths) == 0 && err != nil {
				t.Fatalf("Parse() error = %v; want none", err)
			}
			for _, p := range tt.wantPaths {
				if err == nil || !strings.Contains(err.Error(), p) {
					t.Errorf("Parse() error = %v; want one naming %s", err, p)
				}
			}
			if tt.notShown != "" && err != nil && strings.Contains(err.Error(), tt.notShown) {
				t.Errorf("the error shows the seed: %v", err)
			}
		})
	}
}

// typo changes one character of k (its checksum no longer matches).
func typo(k string) string {
	c := byte('A')
	if k[10] == 'A' {
		c = 'B'
	}
	return k[:10] + string(c) + k[11:]
}

// TestBusCluster: a cluster's name turns clustering on; routes then need
// an address, peers without credentials in their URLs, and mutual TLS.
func TestBusCluster(t *testing.T) {
	f := writeFile(t, "pem", "x")
	tls := "tls: {certFile: " + f + ", keyFile: " + f + ", caFile: " + f + "}"
	tests := []struct {
		name, cluster string
		wantPaths     []string
	}{
		{name: "three nodes", cluster: "{name: hubsync, listen: '0.0.0.0:6222', routes: ['nats://hubsync-0.hubsync-bus:6222', 'nats://hubsync-1.hubsync-bus:6222'], " + tls + "}"},
		{name: "no name", cluster: "{listen: '0.0.0.0:6222'}", wantPaths: []string{"bus.embedded.cluster.name"}},
		{name: "no routes", cluster: "{name: c, listen: '0.0.0.0:6222', " + tls + "}", wantPaths: []string{"bus.embedded.cluster.routes"}},
		{name: "no TLS", cluster: "{name: c, listen: '0.0.0.0:6222', routes: ['nats://a:6222']}", wantPaths: []string{"bus.embedded.cluster.tls"}},
		{name: "credentials in a route", cluster: "{name: c, listen: '0.0.0.0:6222', routes: ['nats://u:secret@a:6222'], " + tls + "}", wantPaths: []string{"bus.embedded.cluster.routes[0]"}},
		{name: "a route's scheme", cluster: "{name: c, listen: '0.0.0.0:6222', routes: ['tls://a:6222'], " + tls + "}", wantPaths: []string{"bus.embedded.cluster.routes[0]"}},
		{name: "listen", cluster: "{name: c, listen: 'nowhere', routes: ['nats://a:6222'], " + tls + "}", wantPaths: []string{"bus.embedded.cluster.listen"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte("bus: {embedded: {cluster: " + tt.cluster + "}}\n"))
			if len(tt.wantPaths) == 0 && err != nil {
				t.Fatalf("Parse() error = %v; want none", err)
			}
			for _, p := range tt.wantPaths {
				if err == nil || !strings.Contains(err.Error(), p) {
					t.Errorf("Parse() error = %v; want one naming %s", err, p)
				}
			}
			if err != nil && strings.Contains(err.Error(), "secret") {
				t.Errorf("the error shows a route's password: %v", err)
			}
		})
	}
}
