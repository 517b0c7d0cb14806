package config

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	"sigs.k8s.io/yaml"
)

// writeFile writes content to a new file in a per-test directory.
func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func dur(d time.Duration) metav1.Duration { return metav1.Duration{Duration: d} }

// TestDefaults compares fully defaulted configurations with golden files,
// the one record of every default of the file, so that a changed default
// shows in review: the empty configuration, and one entry of each list
// whose entries have defaults. After a deliberate change:
// UPDATE_GOLDEN=1 go test ./config -run TestDefaults
func TestDefaults(t *testing.T) {
	tests := []struct {
		name, golden string
		// entries defaults the doc's list entries and shows only them.
		doc     string
		entries bool
	}{
		{name: "empty configuration", golden: "testdata/defaults.yaml"},
		{name: "list entries", golden: "testdata/defaults-entries.yaml", entries: true, doc: `
accessProviders:
- {name: server, server: "https://proxy:9092/{{.ClusterName}}", caSecret: {namespace: ocm, name: proxy-ca}}
- {name: gw, type: gateway}
gateway: {url: "https://gw.example:8443", tls: {caFile: /ca.crt}}
sinks:
- {name: files, type: kubeconfig, kubeconfig: {directory: /out, accessProvider: server, managedServiceAccount: m}}
- {name: argo, type: argocd, argocd: {consumerNamespace: team-a, accessProvider: server, managedServiceAccount: m}}
- {name: hook, type: webhook, webhook: {url: "https://hook.example", secretRef: {namespace: ns, name: s}}}
- {name: kueue-files, type: kubeconfig, kubeconfig: {directory: /etc/multikueue/kubeconfigs, accessProvider: server, managedServiceAccount: m, consumer: kueue}}
- {name: multikueue, type: kueue, kueue: {accessProvider: server, managedServiceAccount: m}}
`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &Config{}
			if err := yaml.UnmarshalStrict([]byte(tt.doc), c); err != nil {
				t.Fatal(err)
			}
			c.SetDefaults()
			var shown any = c
			if tt.entries {
				shown = struct {
					AccessProviders []AccessProvider `json:"accessProviders"`
					Sinks           []Sink           `json:"sinks"`
				}{c.AccessProviders, c.Sinks}
			}
			got, err := yaml.Marshal(shown)
			if err != nil {
				t.Fatal(err)
			}
			if os.Getenv("UPDATE_GOLDEN") != "" {
				if err := os.WriteFile(tt.golden, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(tt.golden)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != string(want) {
				t.Errorf("defaulted configuration differs from %s:\n--- got\n%s\n--- want\n%s", tt.golden, got, want)
			}
			// Defaulting twice changes nothing.
			twice := *c
			twice.SetDefaults()
			if !reflect.DeepEqual(twice, *c) {
				t.Errorf("SetDefaults is not idempotent: %+v", twice)
			}
		})
	}
}

// TestDefaultIsValid: the golden file of the empty configuration is itself
// a complete configuration, which parses back to the defaults and is valid.
func TestDefaultIsValid(t *testing.T) {
	golden, err := os.ReadFile("testdata/defaults.yaml")
	if err != nil {
		t.Fatal(err)
	}
	back, err := Parse(golden)
	if err != nil || !reflect.DeepEqual(*back, *Default()) {
		t.Errorf("Parse(defaults.yaml) = %+v, %v; want Default()", back, err)
	}
	if err := Default().Validate(); err != nil {
		t.Errorf("Default().Validate() = %v, want nil", err)
	}
}

func TestParseDefaults(t *testing.T) {
	tests := []struct {
		name string
		doc  string
	}{
		{name: "empty", doc: ""},
		{name: "whitespace only", doc: "  \n\t\n"},
		{name: "comment only", doc: "# nothing here\n"},
		{name: "empty mapping", doc: "{}"},
		{name: "header only", doc: "apiVersion: hubsync.io/v1alpha1\nkind: Config\n"},
		{name: "empty sections", doc: "hub: {}\nworkers: {}\nretry: {}\nlogging: {}\nserver: {}\nleaderElection: {}\n"},
		{name: "null document", doc: "null\n"},
		{name: "explicit zero values", doc: "clusterManager: \"\"\nhub:\n  qps: 0\n  burst: 0\nserver:\n  address: \"\"\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse([]byte(tc.doc))
			if err != nil {
				t.Fatalf("Parse() error: %v", err)
			}
			if !reflect.DeepEqual(*c, *Default()) {
				t.Errorf("Parse() = %+v\nwant      %+v", *c, *Default())
			}
			if err := c.Validate(); err != nil {
				t.Errorf("Validate() = %v", err)
			}
		})
	}
}

func TestParseFullDocument(t *testing.T) {
	kubeconfig := writeFile(t, "kubeconfig", "apiVersion: v1\nkind: Config\n")
	doc := `apiVersion: hubsync.io/v1alpha1
kind: Config
hub:
  kubeconfig: ` + kubeconfig + `
  context: hub-admin
  qps: 50.5
  burst: 100
  timeout: 45s
clusterManager: my-ocm
workers:
  topology: 4
resyncPeriod: 30m
retry:
  baseDelay: 250ms
  maxDelay: 2m
logging:
  level: debug
  format: json
server:
  address: 127.0.0.1:9090
leaderElection:
  enabled: true
  namespace: hubsync-system
  name: hubsync-lock
  leaseDuration: 30s
  renewDeadline: 20s
  retryPeriod: 5s
accessProviders:
- name: open-cluster-management
  server: https://cluster-proxy-addon-user.open-cluster-management-addon:9092/{{.ClusterName}}
  caSecret:
    namespace: open-cluster-management-addon
    name: cluster-proxy-user-serving-cert
- name: direct
  type: direct
  clusterNameExtension: false
credentials:
  enabled: false
  workers: 3
  coalesce: 250ms
bus:
  urls: [nats://nats-1:4222, tls://nats-2:4222]
  subjectPrefix: ocm.events
  stream: {name: EVENTS, maxAge: 24h, maxBytes: 1073741824, duplicateWindow: 5m, replicas: 3}
  kvBucket: access
  bufferSize: 500
  batchWindow: 0s
  yieldMax: 0s
`
	no := false
	want := Config{
		APIVersion:     APIVersion,
		Kind:           Kind,
		Hub:            Hub{Kubeconfig: kubeconfig, Context: "hub-admin", QPS: 50.5, Burst: 100, Timeout: dur(45 * time.Second)},
		ClusterManager: "my-ocm",
		Workers:        Workers{Topology: 4},
		ResyncPeriod:   dur(30 * time.Minute),
		Retry:          Retry{BaseDelay: dur(250 * time.Millisecond), MaxDelay: dur(2 * time.Minute)},
		Logging:        Logging{Level: "debug", Format: "json"},
		Server:         Server{Address: "127.0.0.1:9090"},
		LeaderElection: LeaderElection{
			Enabled:       true,
			Namespace:     "hubsync-system",
			Name:          "hubsync-lock",
			LeaseDuration: dur(30 * time.Second),
			RenewDeadline: dur(20 * time.Second),
			RetryPeriod:   dur(5 * time.Second),
		},
		AccessProviders: []AccessProvider{
			{
				Name: "open-cluster-management", Type: ProviderServer,
				Server:   "https://cluster-proxy-addon-user.open-cluster-management-addon:9092/{{.ClusterName}}",
				CASecret: &SecretKeyRef{Namespace: "open-cluster-management-addon", Name: "cluster-proxy-user-serving-cert", Key: "tls.crt"},
			},
			{Name: "direct", Type: ProviderDirect, ClusterNameExtension: &no},
		},
		Credentials: Credentials{Enabled: &no, Workers: 3, Coalesce: dur(250 * time.Millisecond)},
		Bus: Bus{
			URLs: []string{"nats://nats-1:4222", "tls://nats-2:4222"}, SubjectPrefix: "ocm.events",
			Stream:   BusStream{Name: "EVENTS", MaxAge: dur(24 * time.Hour), MaxBytes: 1 << 30, DuplicateWindow: dur(5 * time.Minute), Replicas: 3},
			KVBucket: "access", BufferSize: 500, BatchWindow: &metav1.Duration{}, YieldMax: &metav1.Duration{},
			Embedded: BusEmbedded{Listen: "127.0.0.1:4222", DataDir: "/var/lib/hubsync/nats"},
		},
		Tunnel:         Default().Tunnel,
		Gateway:        Default().Gateway,
		ForeignWriters: Default().ForeignWriters,
	}
	c, err := Parse([]byte(doc))
	if err != nil {
		t.Fatalf("Parse() error: %v", err)
	}
	if !reflect.DeepEqual(*c, want) {
		t.Fatalf("Parse() = %+v\nwant      %+v", *c, want)
	}

	tests := []struct {
		name string
		cfg  *Config
	}{
		{name: "full document", cfg: c},
		{name: "defaults", cfg: Default()},
	}
	for _, tc := range tests {
		t.Run("round trip "+tc.name, func(t *testing.T) {
			out, err := yaml.Marshal(tc.cfg)
			if err != nil {
				t.Fatalf("Marshal: %v", err)
			}
			back, err := Parse(out)
			if err != nil {
				t.Fatalf("Parse(Marshal(cfg)) error: %v\n%s", err, out)
			}
			if !reflect.DeepEqual(*back, *tc.cfg) {
				t.Errorf("round trip changed the config:\n got %+v\nwant %+v\nyaml:\n%s", *back, *tc.cfg, out)
			}
		})
	}
}

func TestParseDecodeErrors(t *testing.T) {
	tests := []struct {
		name string
		doc  string
		want []string // substrings of the error
	}{
		{name: "unknown top-level key", doc: "workerz: 3\n", want: []string{"workerz"}},
		{name: "unknown nested key", doc: "hub:\n  qpss: 3\n", want: []string{"qpss"}},
		{name: "unknown key in logging", doc: "logging:\n  colour: true\n", want: []string{"colour"}},
		{name: "unknown key in leaderElection", doc: "leaderElection:\n  leaseDurationSeconds: 15\n", want: []string{"leaseDurationSeconds"}},
		{name: "wrong type", doc: "hub:\n  qps: fast\n", want: []string{"parse config"}},
		{name: "bad duration", doc: "resyncPeriod: 10 parsecs\n", want: []string{"parse config"}},
		{name: "unknown key, wrong case", doc: "ClusterManager: x\n", want: []string{"ClusterManager"}},
		{name: "several unknown keys reported together", doc: "workerz: 3\nhub:\n  qpss: 3\n", want: []string{"workerz", "hub.qpss"}},
		{
			name: "unknown keys reported with validation problems",
			doc:  "workerz: 3\nlogging:\n  level: verbose\n",
			want: []string{"workerz", "logging.level"},
		},
		// YAML mapping keys must be unique; a repeated key must not silently
		// override (or, for a section, discard) what came before it.
		{name: "duplicate key", doc: "clusterManager: a\nclusterManager: b\n", want: []string{"clusterManager"}},
		{name: "duplicate section", doc: "hub:\n  qps: 1\nhub:\n  burst: 500\n", want: []string{"hub"}},
		{name: "not a mapping", doc: "- a\n- b\n", want: []string{"parse config"}},
		{name: "invalid yaml", doc: "hub: [\n", want: []string{"parse config"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse([]byte(tc.doc))
			if err == nil {
				t.Fatalf("Parse() = %+v, nil; want an error", c)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func TestParseValidation(t *testing.T) {
	const (
		tunnelOn  = "tunnel: {enabled: true, transport: direct, managedServiceAccount: gateway-impersonator}\n"
		providers = "accessProviders:\n- name: proxy\n  server: https://proxy:9092/{{.ClusterName}}\n"
	)
	tests := []struct {
		name      string
		doc       string
		wantPaths []string // field paths expected in the error; none means valid
	}{
		// Header.
		{name: "wrong apiVersion", doc: "apiVersion: hubsync.io/v1\n", wantPaths: []string{"apiVersion"}},
		{name: "wrong kind", doc: "kind: Configuration\n", wantPaths: []string{"kind"}},
		{name: "wrong apiVersion and kind", doc: "apiVersion: v1\nkind: ConfigMap\n", wantPaths: []string{"apiVersion", "kind"}},

		// Hub.
		{name: "negative qps other than -1", doc: "hub:\n  qps: -5\n", wantPaths: []string{"hub.qps"}},
		{name: "qps -1: no client-side limit", doc: "hub:\n  qps: -1\n"},
		{name: "negative burst", doc: "hub:\n  burst: -1\n", wantPaths: []string{"hub.burst"}},
		{name: "burst below qps", doc: "hub:\n  qps: 100\n  burst: 50\n", wantPaths: []string{"hub.burst"}},
		{name: "burst equal to qps", doc: "hub:\n  qps: 100\n  burst: 100\n"},
		{name: "negative timeout", doc: "hub:\n  timeout: -1s\n", wantPaths: []string{"hub.timeout"}},
		{name: "missing kubeconfig", doc: "hub:\n  kubeconfig: /nonexistent/hubsync-test/kubeconfig\n", wantPaths: []string{"hub.kubeconfig", "/nonexistent/hubsync-test/kubeconfig"}},

		// Cluster manager.
		{name: "clusterManager not a label value", doc: "clusterManager: not valid!\n", wantPaths: []string{"clusterManager"}},
		{name: "clusterManager too long", doc: "clusterManager: " + strings.Repeat("m", 64) + "\n", wantPaths: []string{"clusterManager"}},
		{name: "clusterManager of 63 characters", doc: "clusterManager: " + strings.Repeat("m", 63) + "\n"},

		// Workers.
		{name: "negative workers", doc: "workers:\n  topology: -1\n", wantPaths: []string{"workers.topology"}},
		{name: "too many workers", doc: "workers:\n  topology: 1025\n", wantPaths: []string{"workers.topology"}},
		{name: "1024 workers", doc: "workers:\n  topology: 1024\n"},

		// Resync.
		{name: "resync 10s", doc: "resyncPeriod: 10s\n", wantPaths: []string{"resyncPeriod"}},
		{name: "resync 59s", doc: "resyncPeriod: 59s\n", wantPaths: []string{"resyncPeriod"}},
		{name: "resync 1m", doc: "resyncPeriod: 1m\n"},

		// Retry.
		{name: "negative base delay", doc: "retry:\n  baseDelay: -1s\n", wantPaths: []string{"retry.baseDelay"}},
		{name: "max delay below base", doc: "retry:\n  baseDelay: 2s\n  maxDelay: 1s\n", wantPaths: []string{"retry.maxDelay"}},
		{name: "max delay below default base", doc: "retry:\n  maxDelay: 50ms\n", wantPaths: []string{"retry.maxDelay"}},
		{name: "max delay equal to base", doc: "retry:\n  baseDelay: 1s\n  maxDelay: 1s\n"},

		// Logging.
		{name: "bad level", doc: "logging:\n  level: verbose\n", wantPaths: []string{"logging.level"}},
		{name: "level is case sensitive", doc: "logging:\n  level: INFO\n", wantPaths: []string{"logging.level"}},
		{name: "bad format", doc: "logging:\n  format: xml\n", wantPaths: []string{"logging.format"}},
		{name: "every level", doc: "logging:\n  level: warn\n  format: json\n"},

		// Server.
		{name: "address without port", doc: "server:\n  address: localhost\n", wantPaths: []string{"server.address"}},
		{name: "address with named port", doc: "server:\n  address: \":http\"\n", wantPaths: []string{"server.address"}},
		{name: "address with port out of range", doc: "server:\n  address: \":70000\"\n", wantPaths: []string{"server.address"}},
		{name: "address with empty port", doc: "server:\n  address: \"localhost:\"\n", wantPaths: []string{"server.address"}},
		{name: "address port only", doc: "server:\n  address: \":8080\"\n"},
		{name: "address ipv6", doc: "server:\n  address: \"[::1]:9090\"\n"},
		{name: "address port 0", doc: "server:\n  address: \"127.0.0.1:0\"\n"},
		{name: "address disabled turns the endpoint off", doc: "server:\n  address: disabled\n"},
		{name: "address Disabled is not disabled", doc: "server:\n  address: Disabled\n", wantPaths: []string{"server.address"}},

		// Leader election.
		{name: "lease not above renew", doc: "leaderElection:\n  enabled: true\n  leaseDuration: 10s\n  renewDeadline: 10s\n", wantPaths: []string{"leaderElection.leaseDuration"}},
		{name: "renew not above retry", doc: "leaderElection:\n  enabled: true\n  renewDeadline: 2s\n  retryPeriod: 2s\n", wantPaths: []string{"leaderElection.renewDeadline"}},
		{name: "bad lease namespace", doc: "leaderElection:\n  enabled: true\n  namespace: Bad_NS\n", wantPaths: []string{"leaderElection.namespace"}},
		{name: "bad lease name", doc: "leaderElection:\n  enabled: true\n  name: bad name\n", wantPaths: []string{"leaderElection.name"}},
		{name: "negative retry period", doc: "leaderElection:\n  retryPeriod: -1s\n", wantPaths: []string{"leaderElection.retryPeriod"}},
		{name: "timings not checked when disabled", doc: "leaderElection:\n  leaseDuration: 10s\n  renewDeadline: 10s\n  namespace: Bad_NS\n"},
		{name: "enabled with defaults", doc: "leaderElection:\n  enabled: true\n"},

		// Sinks and the gateway's impersonating ManagedServiceAccount.
		{name: "kubeconfig sink naming the tunnel's MSA", doc: tunnelOn + providers +
			"sinks:\n- {name: k, type: kubeconfig, kubeconfig: {directory: /d, accessProvider: proxy, managedServiceAccount: gateway-impersonator}}\n",
			wantPaths: []string{"sinks[0].kubeconfig.managedServiceAccount", "is the gateway's impersonating credential", "use another ManagedServiceAccount"}},
		{name: "argocd sink naming the tunnel's MSA", doc: tunnelOn + providers +
			"sinks:\n- {name: a, type: argocd, argocd: {consumerNamespace: team-a, accessProvider: proxy, managedServiceAccount: gateway-impersonator}}\n",
			wantPaths: []string{"sinks[0].argocd.managedServiceAccount", "never handed to consumers"}},
		{name: "sink naming another MSA beside the tunnel's", doc: tunnelOn + providers +
			"sinks:\n- {name: k, type: kubeconfig, kubeconfig: {directory: /d, accessProvider: proxy, managedServiceAccount: kueue}}\n"},
		{name: "sink naming the MSA of a tunnel that is off", doc: "tunnel: {transport: direct, managedServiceAccount: gateway-impersonator}\n" + providers +
			"sinks:\n- {name: k, type: kubeconfig, kubeconfig: {directory: /d, accessProvider: proxy, managedServiceAccount: gateway-impersonator}}\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse([]byte(tc.doc))
			if len(tc.wantPaths) == 0 {
				if err != nil {
					t.Fatalf("Parse() error: %v", err)
				}
				if err := c.Validate(); err != nil {
					t.Fatalf("Validate() of the parsed config: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Parse() = %+v, nil; want an error mentioning %v", c, tc.wantPaths)
			}
			if c != nil {
				t.Errorf("Parse() returned a config along with the error")
			}
			for _, p := range tc.wantPaths {
				if !strings.Contains(err.Error(), p) {
					t.Errorf("error %q does not mention %q", err, p)
				}
			}
		})
	}
}

func TestParseReportsAllProblems(t *testing.T) {
	doc := `hub:
  qps: -3
logging:
  level: verbose
server:
  address: localhost
resyncPeriod: 10s
retry:
  baseDelay: 2s
  maxDelay: 1s
leaderElection:
  enabled: true
  leaseDuration: 10s
  renewDeadline: 10s
`
	wantPaths := []string{
		"hub.qps",
		"logging.level",
		"server.address",
		"resyncPeriod",
		"retry.maxDelay",
		"leaderElection.leaseDuration",
	}
	_, err := Parse([]byte(doc))
	if err == nil {
		t.Fatal("Parse() = nil error, want every problem reported")
	}
	for _, p := range wantPaths {
		t.Run(p, func(t *testing.T) {
			if !strings.Contains(err.Error(), p+":") {
				t.Errorf("error does not report %s:\n%v", p, err)
			}
		})
	}
	var agg utilerrors.Aggregate
	if !errors.As(err, &agg) {
		t.Fatalf("error is %T, want an aggregate", err)
	}
	if n := len(agg.Errors()); n != len(wantPaths) {
		t.Errorf("aggregate has %d errors, want %d:\n%v", n, len(wantPaths), err)
	}
}

func TestLoad(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "no-such-config.yaml")
	tests := []struct {
		name     string
		path     string
		wantErr  []string // substrings; none means success
		notExist bool
	}{
		{name: "missing file", path: missing, wantErr: []string{"read config", missing}, notExist: true},
		{name: "empty file", path: writeFile(t, "empty.yaml", "")},
		{name: "valid file", path: writeFile(t, "ok.yaml", "apiVersion: hubsync.io/v1alpha1\nkind: Config\nworkers:\n  topology: 2\n")},
		{name: "invalid file", path: writeFile(t, "bad.yaml", "workers:\n  topology: 5000\n"), wantErr: []string{"workers.topology"}},
		{name: "unknown key in file", path: writeFile(t, "unknown.yaml", "bogus: 1\n"), wantErr: []string{"bogus"}},
		{name: "directory", path: t.TempDir(), wantErr: []string{"read config"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Load(tc.path)
			if len(tc.wantErr) == 0 {
				if err != nil {
					t.Fatalf("Load() error: %v", err)
				}
				if c == nil {
					t.Fatal("Load() = nil config")
				}
				return
			}
			if err == nil {
				t.Fatalf("Load() = %+v, nil; want an error", c)
			}
			for _, w := range tc.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			if tc.notExist && !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("error %v does not wrap fs.ErrNotExist", err)
			}
		})
	}
}

func TestAccessProviderValidation(t *testing.T) {
	for _, tc := range []struct {
		name      string
		doc       string
		wantPaths []string
	}{
		{name: "server provider", doc: "accessProviders:\n- name: p\n  server: https://proxy:9092/{{.ClusterName}}\n"},
		{name: "direct provider", doc: "accessProviders:\n- name: d\n  type: direct\n"},
		{name: "missing name and server", doc: "accessProviders:\n- caFile: \"\"\n", wantPaths: []string{"accessProviders[0].name", "accessProviders[0].server"}},
		{name: "duplicate names", doc: "accessProviders:\n- name: p\n  type: direct\n- name: p\n  type: direct\n", wantPaths: []string{"accessProviders[1].name"}},
		{name: "bad template", doc: "accessProviders:\n- name: p\n  server: https://x/{{.Cluster}}\n", wantPaths: []string{"accessProviders[0].server"}},
		{name: "not a URL", doc: "accessProviders:\n- name: p\n  server: proxy/{{.ClusterName}}\n", wantPaths: []string{"accessProviders[0].server"}},
		{name: "unknown type", doc: "accessProviders:\n- name: p\n  type: magic\n", wantPaths: []string{"accessProviders[0].type"}},
		{name: "direct with server", doc: "accessProviders:\n- name: p\n  type: direct\n  server: https://x\n", wantPaths: []string{"accessProviders[0]"}},
		{name: "both CA sources", doc: "accessProviders:\n- name: p\n  server: https://x\n  caFile: /etc/hostname\n  caSecret: {namespace: a, name: b}\n", wantPaths: []string{"accessProviders[0]"}},
		{name: "unreadable CA file", doc: "accessProviders:\n- name: p\n  server: https://x\n  caFile: /nonexistent/ca.pem\n", wantPaths: []string{"accessProviders[0].caFile"}},
		{name: "bad CA secret ref", doc: "accessProviders:\n- name: p\n  server: https://x\n  caSecret: {namespace: A_B, name: '', key: 'a/b'}\n",
			wantPaths: []string{"accessProviders[0].caSecret.namespace", "accessProviders[0].caSecret.name", "accessProviders[0].caSecret.key"}},
		{name: "credential limits", doc: "credentials:\n  workers: -1\n  coalesce: 1m\n", wantPaths: []string{"credentials.workers", "credentials.coalesce"}},
	} {
		t.Run(tc.name, func(t *testing.T) { expectFieldErrors(t, tc.doc, tc.wantPaths) })
	}
}

func TestRenderServer(t *testing.T) {
	got, err := RenderServer("https://cluster-proxy-addon-user.ns:9092/{{.ClusterName}}", "c1")
	if err != nil || got != "https://cluster-proxy-addon-user.ns:9092/c1" {
		t.Fatalf("RenderServer = %q, %v", got, err)
	}
}

func TestBusValidation(t *testing.T) {
	dir := t.TempDir()
	readable := writeFile(t, "creds", "x")
	for _, tc := range []struct {
		name      string
		doc       string
		wantPaths []string
	}{
		{name: "embedded default", doc: "bus: {}\n"},
		{name: "external with creds and TLS", doc: "bus:\n  urls: [nats://a:4222]\n  credsFile: " + readable + "\n  tls: {caFile: " + readable + "}\n"},
		{name: "bad URL", doc: "bus:\n  urls: [\"http://a:4222\", \"::\"]\n", wantPaths: []string{"bus.urls[0]", "bus.urls[1]"}},
		{name: "missing creds file", doc: "bus:\n  urls: [nats://a:4222]\n  credsFile: " + dir + "/nope.creds\n", wantPaths: []string{"bus.credsFile"}},
		{name: "unreadable CA", doc: "bus:\n  urls: [nats://a:4222]\n  tls: {caFile: " + dir + "/nope.pem}\n", wantPaths: []string{"bus.tls.caFile"}},
		{name: "cert without key", doc: "bus:\n  urls: [nats://a:4222]\n  tls: {certFile: " + readable + "}\n", wantPaths: []string{"bus.tls"}},
		{name: "creds without URLs", doc: "bus:\n  credsFile: " + readable + "\n", wantPaths: []string{"bus"}},
		{name: "creds and nkey", doc: "bus:\n  urls: [nats://a:4222]\n  credsFile: " + readable + "\n  nkeySeedFile: " + readable + "\n", wantPaths: []string{"bus"}},
		{name: "bad names", doc: "bus:\n  subjectPrefix: 'a.*'\n  stream: {name: 'a.b', replicas: 9}\n  kvBucket: 'x y'\n",
			wantPaths: []string{"bus.subjectPrefix", "bus.stream.name", "bus.stream.replicas", "bus.kvBucket"}},
		{name: "bad embedded listen", doc: "bus:\n  embedded: {listen: nowhere}\n", wantPaths: []string{"bus.embedded.listen"}},
		{name: "negative batch window", doc: "bus:\n  batchWindow: -1ms\n", wantPaths: []string{"bus.batchWindow"}},
		{name: "batch window over a second", doc: "bus:\n  batchWindow: 2s\n", wantPaths: []string{"bus.batchWindow"}},
		{name: "negative yield", doc: "bus:\n  yieldMax: -1s\n", wantPaths: []string{"bus.yieldMax"}},
		{name: "yield over ten minutes", doc: "bus:\n  yieldMax: 11m\n", wantPaths: []string{"bus.yieldMax"}},
		{name: "embedded on every interface without auth", doc: "bus:\n  embedded: {listen: ':4222'}\n", wantPaths: []string{"bus.embedded.listen"}},
		{name: "embedded on a pod address without auth", doc: "bus:\n  embedded: {listen: '10.0.0.5:4222'}\n", wantPaths: []string{"bus.embedded.listen"}},
		{name: "embedded non-loopback with TLS (clients sign in: NKeys, else refused)", doc: "bus:\n  embedded: {listen: '0.0.0.0:4222', tls: {certFile: " + readable + ", keyFile: " + readable + "}}\n"},
		{name: "embedded non-loopback, token but no TLS", doc: "bus:\n  embedded: {listen: '0.0.0.0:4222', authTokenFile: " + readable + "}\n", wantPaths: []string{"bus.embedded.listen"}},
		{name: "embedded non-loopback, TLS and token", doc: "bus:\n  embedded: {listen: '0.0.0.0:4222', authTokenFile: " + readable + ", tls: {certFile: " + readable + ", keyFile: " + readable + "}}\n"},
		{name: "embedded non-loopback, mutual TLS", doc: "bus:\n  embedded: {listen: '0.0.0.0:4222', tls: {certFile: " + readable + ", keyFile: " + readable + ", clientCAFile: " + readable + "}}\n"},
		{name: "embedded on localhost", doc: "bus:\n  embedded: {listen: 'localhost:4222'}\n"},
		{name: "embedded on loopback with a token", doc: "bus:\n  embedded: {listen: '127.0.0.1:4222', authTokenFile: " + readable + "}\n"},
		{name: "embedded missing token file", doc: "bus:\n  embedded: {authTokenFile: " + dir + "/nope}\n", wantPaths: []string{"bus.embedded.authTokenFile"}},
		{name: "embedded client CA without server cert", doc: "bus:\n  embedded: {tls: {clientCAFile: " + readable + "}}\n", wantPaths: []string{"bus.embedded.tls.certFile"}},
		{name: "embedded empty token file", doc: "bus:\n  embedded: {authTokenFile: " + writeFile(t, "empty-token", " \n") + "}\n", wantPaths: []string{"bus.embedded.authTokenFile"}},
		{name: "embedded settings with an external NATS", doc: "bus:\n  urls: [nats://a:4222]\n  embedded: {authTokenFile: " + readable + "}\n", wantPaths: []string{"bus.embedded"}},
		{name: "requireTLS with tls:// and nats://", doc: "bus:\n  urls: [tls://a:4222, nats://b:4222]\n  requireTLS: true\n"},
		{name: "requireTLS refuses ws://", doc: "bus:\n  urls: [ws://a:80]\n  requireTLS: true\n", wantPaths: []string{"bus.urls[0]"}},
		{name: "requireTLS without URLs", doc: "bus:\n  requireTLS: true\n", wantPaths: []string{"bus"}},
	} {
		t.Run(tc.name, func(t *testing.T) { expectFieldErrors(t, tc.doc, tc.wantPaths) })
	}
}

func TestBusURLsNeverInErrorsOrWarnings(t *testing.T) {
	const secret = "s3cr3t-pw"
	for _, doc := range []string{
		"bus:\n  urls: [\"http://u:" + secret + "@a:4222\"]\n",
		"bus:\n  urls: [\"nats://u:" + secret + "@a b:4222\"]\n",
		"bus:\n  urls: [\"ws://u:" + secret + "@a:80\"]\n  requireTLS: true\n",
	} {
		_, err := Parse([]byte(doc))
		if err == nil {
			t.Fatalf("%q: no error", doc)
		}
		if strings.Contains(err.Error(), secret) {
			t.Errorf("error shows the password: %v", err)
		}
	}
}

func TestWarnings(t *testing.T) {
	const secret = "s3cr3t-pw"
	for _, tc := range []struct {
		name string
		doc  string
		want int
	}{
		{name: "password over nats://", doc: "bus:\n  urls: [\"nats://u:" + secret + "@a:4222\"]\n", want: 1},
		{name: "token over ws://", doc: "bus:\n  urls: [\"ws://" + secret + "@a:80\"]\n", want: 1},
		{name: "password over tls://", doc: "bus:\n  urls: [\"tls://u:" + secret + "@a:4222\"]\n"},
		{name: "password over nats:// with requireTLS", doc: "bus:\n  urls: [\"nats://u:" + secret + "@a:4222\"]\n  requireTLS: true\n"},
		{name: "no credentials", doc: "bus:\n  urls: [nats://a:4222]\n"},
		{name: "bus disabled", doc: "bus:\n  enabled: false\n  urls: [\"nats://u:" + secret + "@a:4222\"]\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse([]byte(tc.doc))
			if err != nil {
				t.Fatal(err)
			}
			w := c.Warnings()
			if len(w) != tc.want {
				t.Fatalf("warnings = %q, want %d", w, tc.want)
			}
			for _, s := range w {
				if strings.Contains(s, secret) {
					t.Errorf("warning shows the credentials: %s", s)
				}
			}
		})
	}
}

// expectFieldErrors parses doc and checks that it fails with an error for
// each of the field paths, or succeeds when there are none.
func expectFieldErrors(t *testing.T, doc string, paths []string) {
	t.Helper()
	_, err := Parse([]byte(doc))
	if len(paths) == 0 {
		if err != nil {
			t.Fatalf("unexpected error: %v", err)
		}
		return
	}
	if err == nil {
		t.Fatalf("no error, want one for %v", paths)
	}
	for _, p := range paths {
		if !strings.Contains(err.Error(), p+":") {
			t.Errorf("error lacks %q: %v", p, err)
		}
	}
}
