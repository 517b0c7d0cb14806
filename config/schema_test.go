package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// compileSchema compiles JSONSchema with the validator Helm v3 checks
// values.schema.json with, as draft-07.
func compileSchema(t *testing.T) *jsonschema.Schema {
	t.Helper()
	raw, err := json.Marshal(JSONSchema(nil))
	if err != nil {
		t.Fatal(err)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft7)
	if err := c.AddResource("file:///config.schema.json", doc); err != nil {
		t.Fatal(err)
	}
	s, err := c.Compile("file:///config.schema.json")
	if err != nil {
		t.Fatalf("compile the configuration's schema: %v", err)
	}
	return s
}

// validateYAML validates a YAML document against the schema as Helm does
// with values: converted to JSON first.
func validateYAML(s *jsonschema.Schema, doc []byte) error {
	js, err := yaml.YAMLToJSON(doc)
	if err != nil {
		return err
	}
	return validateJSON(s, js)
}

func validateJSON(s *jsonschema.Schema, js []byte) error {
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(js))
	if err != nil {
		return err
	}
	return s.Validate(v)
}

// configKeys are the top-level keys of the configuration file.
func configKeys() map[string]bool {
	keys := map[string]bool{}
	t := reflect.TypeFor[Config]()
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		keys[name] = true
	}
	return keys
}

// corpusDoc is a configuration document found in the repository.
type corpusDoc struct {
	where string
	doc   []byte
}

// docExamples extracts the configuration examples of a Markdown file: the
// YAML documents of its yaml blocks whose top-level keys are all keys of
// the configuration, and lists of sinks entries (shown under sinks:).
func docExamples(t *testing.T, path string) []corpusDoc {
	t.Helper()
	md, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	keys := configKeys()
	var out []corpusDoc
	blocks := regexp.MustCompile("(?ms)^```yaml\n(.*?)^```").FindAllSubmatch(md, -1)
	for i, b := range blocks {
		for j, part := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(b[1]), -1) {
			var v any
			if err := yaml.Unmarshal([]byte(part), &v); err != nil || v == nil {
				continue
			}
			where := fmt.Sprintf("%s, yaml block %d, document %d", path, i+1, j+1)
			switch v := v.(type) {
			case map[string]any:
				// A Helm values example: its config block is a configuration.
				if cfg, ok := v["config"].(map[string]any); ok && !keys["config"] && allKeys(cfg, keys) {
					doc, err := yaml.Marshal(cfg)
					if err != nil {
						t.Fatal(err)
					}
					out = append(out, corpusDoc{where + " (values config)", doc})
					continue
				}
				if !allKeys(v, keys) {
					continue
				}
				out = append(out, corpusDoc{where, []byte(part)})
			case []any:
				if !allSinks(v) {
					continue
				}
				wrapped, err := yaml.Marshal(map[string]any{"sinks": v})
				if err != nil {
					t.Fatal(err)
				}
				out = append(out, corpusDoc{where + " (as sinks:)", wrapped})
			}
		}
	}
	return out
}

func allKeys(m map[string]any, keys map[string]bool) bool {
	for k := range m {
		if !keys[k] {
			return false
		}
	}
	return true
}

// allSinks reports whether every entry of a list is a sinks entry.
func allSinks(list []any) bool {
	for _, e := range list {
		m, ok := e.(map[string]any)
		if !ok {
			return false
		}
		if typ, _ := m["type"].(string); !slices.Contains(SinkTypes, typ) {
			return false
		}
	}
	return len(list) > 0
}

// corpus is every configuration the repository holds: config/testdata,
// deploy/config.yaml's config.yaml, the chart's default config value and
// the examples in the docs. full names the documents that are complete
// configurations Parse accepts (short of the files they name).
func corpus(t *testing.T) (docs []corpusDoc, full map[string]bool) {
	t.Helper()
	full = map[string]bool{}
	testdata, err := filepath.Glob("testdata/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range testdata {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, corpusDoc{p, data})
	}
	full["testdata/defaults.yaml"] = true

	data, err := os.ReadFile("../deploy/config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var cm corev1.ConfigMap
	if err := yaml.UnmarshalStrict(data, &cm); err != nil {
		t.Fatalf("deploy/config.yaml: %v", err)
	}
	if cm.Data["config.yaml"] == "" {
		t.Fatal("deploy/config.yaml has no config.yaml key")
	}
	docs = append(docs, corpusDoc{"deploy/config.yaml", []byte(cm.Data["config.yaml"])})
	full["deploy/config.yaml"] = true

	// The chart's default values, once the chart is there.
	if data, err := os.ReadFile("../charts/hubsync/values.yaml"); err == nil {
		var values struct {
			Config any `json:"config"`
		}
		if err := yaml.Unmarshal(data, &values); err != nil {
			t.Fatalf("charts/hubsync/values.yaml: %v", err)
		}
		doc, err := yaml.Marshal(values.Config)
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, corpusDoc{"charts/hubsync/values.yaml (config)", doc})
		full["charts/hubsync/values.yaml (config)"] = true
	} else if !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}

	mds, err := filepath.Glob("../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range append(mds, "../README.md") {
		docs = append(docs, docExamples(t, p)...)
	}
	// The reference of docs/configuration.md, and the tour's minimal
	// configuration (the README's Helm values example adds to the chart's
	// defaults, so alone it is only checked against the schema; test/chart
	// renders it).
	full["../docs/configuration.md, yaml block 1, document 1"] = true
	full["../docs/tour.md, yaml block 1, document 1"] = true
	return docs, full
}

// TestSchemaAcceptsCorpus: every configuration in the repository validates
// against the schema, and the complete ones are accepted by Parse as well
// (so the corpus is real configuration, not just the schema's idea of it).
func TestSchemaAcceptsCorpus(t *testing.T) {
	s := compileSchema(t)
	docs, full := corpus(t)
	found := map[string]bool{}
	for _, d := range docs {
		found[d.where] = true
		if err := validateYAML(s, d.doc); err != nil {
			t.Errorf("%s does not validate against the configuration's schema: %v", d.where, err)
		}
		if full[d.where] {
			if _, err := Decode(d.doc); err != nil {
				t.Errorf("%s: Decode: %v", d.where, err)
			}
		}
	}
	for w := range full {
		if !found[w] {
			t.Errorf("the corpus lacks %s: has the example moved?", w)
		}
	}
	// The docs hold a dozen examples or more; finding far fewer means the
	// extraction broke.
	if len(docs) < 15 {
		t.Errorf("the corpus has %d documents; want at least 15", len(docs))
	}
}

// richDoc is a valid configuration that sets every section: each sink
// type, each provider type, the tunnel and the gateway on.
const richDoc = `
apiVersion: hubsync.io/v1alpha1
kind: Config
hub: {kubeconfig: /k, context: c, qps: 50, burst: 100, timeout: 30s}
clusterManager: ocm
workers: {topology: 8}
resyncPeriod: 10m
retry: {baseDelay: 1s, maxDelay: 1m}
logging: {level: debug, format: json}
server: {address: ":8080", pprof: true}
leaderElection: {enabled: true, namespace: ns, name: hubsync, leaseDuration: 15s, renewDeadline: 10s, retryPeriod: 2s}
accessProviders:
- {name: server, type: server, server: "https://proxy:9092/{{.ClusterName}}", caSecret: {namespace: ocm, name: ca, key: tls.crt}, clusterNameExtension: true}
- {name: direct, type: direct}
- {name: gw, type: gateway}
credentials: {enabled: true, workers: 4, coalesce: 1s}
bus:
  enabled: true
  subjectPrefix: hubsync
  stream: {name: S, maxAge: 1h, maxBytes: 1000, duplicateWindow: 1m, replicas: 1}
  kvBucket: kv
  bufferSize: 100
  batchWindow: 10ms
  yieldMax: 1m
  embedded: {listen: "127.0.0.1:4222", dataDir: /d, authTokenFile: /t, tls: {certFile: /c, keyFile: /k, clientCAFile: /ca},
    cluster: {name: hubsync, listen: "0.0.0.0:6222", routes: ["nats://hubsync-0.hubsync-bus:6222"], serverName: hubsync-0, tls: {certFile: /c, keyFile: /k, caFile: /ca}}}
  consumers: [{name: app, nkeys: [UBMFVVZFKJESJFTC4Q6QKVYVEZL3BT67XL2CTUGOSHX3OC7HHIHM6YO3], namespaces: [team-a]}]
sinks:
- name: files
  type: kubeconfig
  filter: {namespaces: [team-a], clusterSelector: {matchLabels: {env: prod}, matchExpressions: [{key: tier, operator: In, values: [gold]}]}}
  queueSize: 100
  kubeconfig: {directory: /out, accessProvider: server, managedServiceAccount: m, auth: exec, exec: {command: hubsync, installHint: get hubsync}, consumer: ""}
- name: argo
  type: argocd
  argocd: {namespace: argocd, consumerNamespace: team-a, accessProvider: server, managedServiceAccount: m, auth: exec, exec: {command: hubsync},
    project: p, namespaces: [a], clusterResources: true, shard: "1", labels: {a: b}, annotations: {a: b}, provideClusterInfo: true, execPlugin: cp-creds}
- name: hook
  type: webhook
  filter: {eventTypes: [io.hubsync.profile.created]}
  webhook: {url: "https://hook.example", secretRef: {namespace: ns, name: s, key: k}, bearerTokenFile: /b, caFile: /ca, timeout: 10s,
    failingAfter: 1m, concurrency: 4, spool: {directory: /spool, maxBytes: 2097152}}
- name: mk
  type: kueue
  kueue: {namespace: kueue-system, source: secret, accessProvider: server, managedServiceAccount: m, multiKueueConfig: hubsync, labels: {a: b}}
tunnel:
  enabled: true
  transport: konnectivity
  konnectivity: {address: "proxy:8090", caFile: /ca, certFile: /c, keyFile: /k, serverName: proxy, dialAddress: "{{.ClusterName}}:443"}
  managedServiceAccount: gw-msa
  clusterSelector: {matchLabels: {a: b}, matchExpressions: [{key: tier, operator: NotIn, values: [bronze]}]}
  serverName: kubernetes.default.svc
  probePath: /version
  probeInterval: 10s
  probeTimeout: 5s
  dialTimeout: 10s
  backoff: {baseDelay: 1s, maxDelay: 30s}
  maxConcurrentDials: 32
  maxConcurrentUpgradeDials: 16
  maxConnectionsPerCluster: 4
  warm: onDemand
  idleTimeout: 10m
  warmupTimeout: 30s
gateway:
  enabled: true
  listen: ":8443"
  url: "https://gw.example:8443"
  tls: {caFile: /ca, secret: {namespace: ns, name: tls}}
  passThrough: jwt
  hubIssuers: ["https://dex.example"]
  forwardGroups: [team-a]
  reviewCacheTTL: 10s
  reviewCacheSize: 100
  maxInFlightReviews: 8
  refusalCacheTTL: 10s
  refusalsPerSecond: 5
  refusalBurst: 50
  clientAddress: {header: X-Forwarded-For, trustedProxies: [10.0.0.0/8]}
  hubQPS: 50
  hubBurst: 100
  maxHeaderBytes: 65536
  readHeaderTimeout: 10s
  bodyTimeout: 1m
  idleTimeout: 2m
  tunnelWait: 10s
  drain: {delay: 5s, timeout: 20s}
foreignWriters: {holdOff: 30s, maxHoldOff: 10m}
`

// externalBus is richDoc's bus section for an external NATS.
const externalBus = `{urls: ["tls://nats:4222"], credsFile: /creds, tls: {caFile: /ca, certFile: /c, keyFile: /k}, requireTLS: true}`

// leaf is a place in a configuration document where the schema describes
// a value, with that value's schema.
type leaf struct {
	path   []any // keys (string) and list indexes (int)
	schema map[string]any
}

func (l leaf) String() string {
	var b strings.Builder
	for _, p := range l.path {
		switch p := p.(type) {
		case int:
			fmt.Fprintf(&b, "[%d]", p)
		default:
			fmt.Fprintf(&b, ".%v", p)
		}
	}
	return strings.TrimPrefix(b.String(), ".")
}

// places lists every place the schema describes, sections and lists
// included: the first entry of each list, one key of each map.
func places(s map[string]any, path []any) []leaf {
	out := []leaf{{path: path, schema: s}}
	at := func(p any) []any { return append(slices.Clone(path), p) }
	if props, ok := s["properties"].(map[string]any); ok {
		for _, k := range slices.Sorted(maps.Keys(props)) {
			out = append(out, places(props[k].(map[string]any), at(k))...)
		}
	}
	if items, ok := s["items"].(map[string]any); ok {
		out = append(out, places(items, at(0))...)
	}
	if values, ok := s["additionalProperties"].(map[string]any); ok {
		out = append(out, places(values, at("example.com/key"))...)
	}
	return out
}

// set puts v at path in doc, creating the sections and list entries on
// the way, and returns doc.
func set(doc any, path []any, v any) any {
	if len(path) == 0 {
		return v
	}
	switch p := path[0].(type) {
	case string:
		m, ok := doc.(map[string]any)
		if !ok {
			m = map[string]any{}
		}
		m[p] = set(m[p], path[1:], v)
		return m
	case int:
		l, _ := doc.([]any)
		for len(l) <= p {
			l = append(l, map[string]any{})
		}
		l[p] = set(l[p], path[1:], v)
		return l
	}
	panic(fmt.Sprintf("path element %v", path[0]))
}

// entries expands the list indexes of path (always 0, from places) into
// every index the lists of doc have there.
func entries(doc any, path []any) [][]any {
	if len(path) == 0 {
		return [][]any{nil}
	}
	var heads []any
	var next func(i any) any
	switch p := path[0].(type) {
	case string:
		m, _ := doc.(map[string]any)
		heads, next = []any{p}, func(any) any { return m[p] }
	case int:
		l, _ := doc.([]any)
		for i := range max(len(l), 1) {
			heads = append(heads, i)
		}
		next = func(i any) any {
			if i.(int) < len(l) {
				return l[i.(int)]
			}
			return nil
		}
	}
	var out [][]any
	for _, h := range heads {
		for _, rest := range entries(next(h), path[1:]) {
			out = append(out, append([]any{h}, rest...))
		}
	}
	return out
}

// fits reports whether the schema's types include v's.
func fits(s map[string]any, v any) bool {
	var types []any
	switch t := s["type"].(type) {
	case string:
		types = []any{t}
	case []any:
		types = t
	default:
		return true
	}
	var want []any
	switch v := v.(type) {
	case nil:
		want = []any{"null"}
	case string:
		want = []any{"string"}
	case bool:
		want = []any{"boolean"}
	case int, int64:
		want = []any{"integer", "number"}
	case float64:
		want = []any{"number"}
		if v == float64(int64(v)) {
			want = append(want, "integer")
		}
	case map[string]any:
		want = []any{"object"}
	case []any:
		want = []any{"array"}
	}
	return slices.ContainsFunc(want, func(w any) bool { return slices.Contains(types, w) })
}

func isIndex(p any) bool { _, ok := p.(int); return ok }

// get returns the value at path in doc, if there is one.
func get(doc any, path []any) (any, bool) {
	for _, p := range path {
		switch p := p.(type) {
		case string:
			m, ok := doc.(map[string]any)
			if !ok {
				return nil, false
			}
			if doc, ok = m[p]; !ok {
				return nil, false
			}
		case int:
			l, ok := doc.([]any)
			if !ok || p >= len(l) {
				return nil, false
			}
			doc = l[p]
		}
	}
	return doc, true
}

// probes are the values tried at a place: null, the zero values and a few
// of each type, the schema's own enum and range edges.
func probes(s map[string]any) []any {
	out := []any{nil, "", "x", "0", "1s", 0, 1, -1, 0.5, true, map[string]any{}, []any{}, []any{"x"}}
	if enum, ok := s["enum"].([]any); ok {
		out = append(out, enum...)
	}
	if items, ok := s["items"].(map[string]any); ok {
		if enum, ok := items["enum"].([]any); ok {
			out = append(out, []any{enum[0]}, []any{""})
		}
	}
	if m, ok := s["maximum"]; ok {
		out = append(out, m, toInt(m)+1)
	}
	return out
}

func toInt(v any) int64 {
	switch v := v.(type) {
	case int:
		return int64(v)
	case int64:
		return v
	}
	panic(fmt.Sprintf("maximum %T", v))
}

// TestSchemaNeverStricterThanParse sets, at every place the schema
// describes, values of every kind, in an empty document and in complete
// ones: each document that Decode (Parse without the file checks, so
// accepting at least as much) accepts must validate against the schema.
func TestSchemaNeverStricterThanParse(t *testing.T) {
	s := compileSchema(t)
	// Each base document is tried at the places under its prefix. The
	// decoder's view of a value's type does not depend on the rest of the
	// document, so values of a type the schema refuses are tried in the
	// small base only.
	type base struct {
		doc      any
		prefix   string
		anyValue bool
	}
	var bases []base
	for _, b := range []struct {
		doc, prefix string
		anyValue    bool
	}{{"{}", "", true}, {richDoc, "", false}, {richDoc + "\nbus: " + externalBus, "bus", false}} {
		var v any
		if err := yaml.Unmarshal([]byte(b.doc), &v); err != nil {
			t.Fatal(err)
		}
		raw, _ := json.Marshal(v)
		if _, err := Decode(raw); err != nil {
			t.Fatalf("a base document is not valid: %v", err)
		}
		bases = append(bases, base{v, b.prefix, b.anyValue})
	}
	accepted := map[string]int{}
	all := places(JSONSchema(nil), nil)
	start := time.Now()
	for _, b := range bases {
		for _, l := range all {
			if !strings.HasPrefix(l.String(), b.prefix) {
				continue
			}
			// A place in a list is tried in each entry the base has
			// that holds the place's section (each sink type, each
			// provider type).
			for _, path := range entries(b.doc, l.path) {
				if _, ok := get(b.doc, path[:max(len(path)-1, 0)]); !ok && slices.ContainsFunc(path, isIndex) {
					continue
				}
				at := leaf{path: path}
				for _, p := range probes(l.schema) {
					if !b.anyValue && !fits(l.schema, p) {
						continue
					}
					doc := set(deepCopy(b.doc), path, p)
					raw, err := json.Marshal(doc)
					if err != nil {
						t.Fatal(err)
					}
					if _, err := Decode(raw); err != nil {
						continue
					}
					accepted[l.String()]++
					if err := validateJSON(s, raw); err != nil {
						t.Errorf("%s: %s accepted by Parse, refused by the schema: %v", at, mustJSON(p), err)
					}
				}
				if _, ok := get(b.doc, path); ok {
					accepted[l.String()]++ // the base's own value
				}
			}
		}
	}
	// Every place holds a value Parse accepts in some base, or took one, so
	// no field goes untried.
	for _, l := range all {
		if accepted[l.String()] == 0 {
			t.Errorf("%s: no probe was accepted by Parse; add a base document that reaches it", l)
		}
	}
	t.Logf("%d places, %d documents accepted by Parse, in %s", len(all), sum(accepted), time.Since(start).Round(time.Millisecond))
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// deepCopy copies a decoded document.
func deepCopy(v any) any {
	switch v := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, e := range v {
			out[k] = deepCopy(e)
		}
		return out
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = deepCopy(e)
		}
		return out
	}
	return v
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// TestSchemaRefuses: a typo, a wrong type or a value outside a fixed set
// fails the schema, as it fails Parse, at the path of the mistake.
func TestSchemaRefuses(t *testing.T) {
	s := compileSchema(t)
	tests := []struct {
		name, doc string
		// at is the instance location the schema reports.
		at string
	}{
		{name: "unknown top-level key", doc: "resyncPeriode: 10m", at: ""},
		{name: "unknown nested key", doc: "hub: {qsp: 5}", at: "/hub"},
		{name: "key in the wrong case", doc: "hub: {QPS: 5}", at: "/hub"},
		{name: "unknown key in a list entry", doc: "accessProviders: [{name: a, type: direct, url: x}]", at: "/accessProviders/0"},
		{name: "unknown key in a sink section", doc: "sinks: [{name: w, type: webhook, webhook: {url: 'https://h', secretsFile: /s, retries: 3}}]", at: "/sinks/0/webhook"},
		{name: "unknown key in a label selector", doc: "tunnel: {clusterSelector: {matchLabel: {a: b}}}", at: "/tunnel/clusterSelector"},
		{name: "string for an integer", doc: "workers: {topology: many}", at: "/workers/topology"},
		{name: "fraction for an integer", doc: "bus: {bufferSize: 1.5}", at: "/bus/bufferSize"},
		{name: "integer for a string", doc: "clusterManager: 5", at: "/clusterManager"},
		{name: "string for a boolean", doc: "server: {pprof: 'true'}", at: "/server/pprof"},
		{name: "scalar for a section", doc: "logging: debug", at: "/logging"},
		{name: "section for a list", doc: "sinks: {name: x}", at: "/sinks"},
		{name: "scalar for a map", doc: "sinks: [{name: k, type: kueue, kueue: {source: clusterProfile, labels: x}}]", at: "/sinks/0/kueue/labels"},
		{name: "number for a duration", doc: "resyncPeriod: 600", at: "/resyncPeriod"},
		{name: "duration without a unit", doc: "retry: {maxDelay: '10'}", at: "/retry/maxDelay"},
		{name: "duration in words", doc: "credentials: {coalesce: 1 second}", at: "/credentials/coalesce"},
		{name: "empty duration", doc: "hub: {timeout: ''}", at: "/hub/timeout"},
		{name: "null duration", doc: "hub: {timeout: null}", at: "/hub/timeout"},
		{name: "log level", doc: "logging: {level: loud}", at: "/logging/level"},
		{name: "log format", doc: "logging: {format: xml}", at: "/logging/format"},
		{name: "apiVersion", doc: "apiVersion: hubsync.io/v1", at: "/apiVersion"},
		{name: "kind", doc: "kind: Configuration", at: "/kind"},
		{name: "provider type", doc: "accessProviders: [{name: a, type: proxy}]", at: "/accessProviders/0/type"},
		{name: "sink type", doc: "sinks: [{name: k, type: kafka}]", at: "/sinks/0/type"},
		{name: "sink without a type", doc: "sinks: [{name: k}]", at: "/sinks/0"},
		{name: "event type", doc: "sinks: [{name: w, type: webhook, filter: {eventTypes: [io.hubsync.profile.renamed]}, webhook: {url: 'https://h', secretsFile: /s}}]",
			at: "/sinks/0/filter/eventTypes/0"},
		{name: "auth mode", doc: "accessProviders: [{name: p, server: 'https://p/{{.ClusterName}}'}]\nsinks: [{name: f, type: kubeconfig, kubeconfig: {directory: /o, accessProvider: p, managedServiceAccount: m, auth: password}}]",
			at: "/sinks/0/kubeconfig/auth"},
		{name: "kubeconfig consumer", doc: "accessProviders: [{name: p, server: 'https://p/{{.ClusterName}}'}]\nsinks: [{name: f, type: kubeconfig, kubeconfig: {directory: /o, accessProvider: p, managedServiceAccount: m, consumer: argocd}}]",
			at: "/sinks/0/kubeconfig/consumer"},
		{name: "exec plugin", doc: "accessProviders: [{name: p, server: 'https://p/{{.ClusterName}}'}]\nsinks: [{name: a, type: argocd, argocd: {consumerNamespace: c, accessProvider: p, managedServiceAccount: m, execPlugin: kubelogin}}]",
			at: "/sinks/0/argocd/execPlugin"},
		{name: "kueue source", doc: "sinks: [{name: k, type: kueue, kueue: {source: configMap}}]", at: "/sinks/0/kueue/source"},
		{name: "tunnel transport", doc: "tunnel: {transport: ssh}", at: "/tunnel/transport"},
		{name: "tunnel warm mode", doc: "tunnel: {warm: some}", at: "/tunnel/warm"},
		{name: "pass-through mode of an enabled gateway", doc: "gateway: {enabled: true, passThrough: all}", at: "/gateway/passThrough"},
		{name: "too many workers", doc: "workers: {topology: 1025}", at: "/workers/topology"},
		{name: "negative workers", doc: "credentials: {workers: -1}", at: "/credentials/workers"},
		{name: "too many stream replicas", doc: "bus: {stream: {replicas: 6}}", at: "/bus/stream/replicas"},
		{name: "webhook concurrency", doc: "sinks: [{name: w, type: webhook, webhook: {url: 'https://h', secretsFile: /s, concurrency: 257}}]", at: "/sinks/0/webhook/concurrency"},
		{name: "connections per cluster", doc: "tunnel: {maxConnectionsPerCluster: 65}", at: "/tunnel/maxConnectionsPerCluster"},
		{name: "negative queue size", doc: "sinks: [{name: w, type: webhook, queueSize: -1, webhook: {url: 'https://h', secretsFile: /s}}]", at: "/sinks/0/queueSize"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := Decode([]byte(tt.doc)); err == nil {
				t.Fatalf("Decode accepts %q: the schema must not refuse it", tt.doc)
			}
			err := validateYAML(s, []byte(tt.doc))
			if err == nil {
				t.Fatalf("the schema accepts %q", tt.doc)
			}
			ve, ok := err.(*jsonschema.ValidationError)
			if !ok {
				t.Fatalf("not a validation error: %v", err)
			}
			if !slices.Contains(locations(ve), tt.at) {
				t.Errorf("the schema refuses %q at %v; want at %q:\n%v", tt.doc, locations(ve), tt.at, err)
			}
		})
	}
}

// locations are the instance locations of a validation error's causes, as
// JSON pointers.
func locations(e *jsonschema.ValidationError) []string {
	var out []string
	var walk func(*jsonschema.ValidationError)
	walk = func(e *jsonschema.ValidationError) {
		if len(e.Causes) == 0 {
			out = append(out, "/"+strings.Join(e.InstanceLocation, "/"))
			if len(e.InstanceLocation) == 0 {
				out[len(out)-1] = ""
			}
		}
		for _, c := range e.Causes {
			walk(c)
		}
	}
	walk(e)
	return out
}

// TestSchemaRefusesUnknownKeys adds a key to every section the schema
// describes: both the schema and Parse refuse it; a map (labels,
// matchLabels) takes any key in both.
func TestSchemaRefusesUnknownKeys(t *testing.T) {
	s := compileSchema(t)
	var base any
	if err := yaml.Unmarshal([]byte(richDoc), &base); err != nil {
		t.Fatal(err)
	}
	sections := 0
	for _, l := range places(JSONSchema(nil), nil) {
		if _, ok := l.schema["properties"]; !ok {
			continue
		}
		sections++
		doc := set(deepCopy(base), append(slices.Clone(l.path), "notAField"), "x")
		raw, _ := json.Marshal(doc)
		if _, err := Decode(raw); err == nil || !strings.Contains(err.Error(), "unknown field") {
			t.Errorf("%s.notAField: Decode = %v, want an unknown field", l, err)
		}
		if err := validateYAML(s, raw); err == nil {
			t.Errorf("%s.notAField: the schema accepts it", l)
		}
	}
	if sections < 30 {
		t.Errorf("found %d sections; want at least 30", sections)
	}
}

// TestSchemaConditionalPassThrough: a disabled gateway's settings are not
// validated, so the schema takes any pass-through mode there.
func TestSchemaConditionalPassThrough(t *testing.T) {
	s := compileSchema(t)
	doc := []byte("gateway: {enabled: false, passThrough: anything}")
	if _, err := Decode(doc); err != nil {
		t.Fatalf("Decode: %v", err)
	}
	if err := validateYAML(s, doc); err != nil {
		t.Errorf("the schema refuses a disabled gateway's passThrough: %v", err)
	}
}

// TestDurationPattern: the pattern accepts what time.ParseDuration does.
func TestDurationPattern(t *testing.T) {
	re := regexp.MustCompile(DurationPattern)
	for _, d := range []string{"0", "-0", "+0", "1s", "1m30s", "1.5h", ".5h", "1.h", "-1s", "+2ms", "3us", "3µs", "3μs", "4ns",
		"", "1", "s", "1d", "1 s", "1S", ".h", "1.5", "--1s", "1s-1s", "0s0", "5 m", " 1s"} {
		_, err := time.ParseDuration(d)
		if got, want := re.MatchString(d), err == nil; got != want {
			t.Errorf("%q: pattern matches %v, time.ParseDuration accepts %v", d, got, want)
		}
	}
}

// TestJSONSchemaDescriptions: docs become descriptions of the fields and,
// where a field has none, of its section's type.
func TestJSONSchemaDescriptions(t *testing.T) {
	s := JSONSchema(map[string]string{"Config": "the file", "Bus.BatchWindow": "batching", "BusTLS": "tls files"})
	bus := s["properties"].(map[string]any)["bus"].(map[string]any)
	props := bus["properties"].(map[string]any)
	for _, c := range []struct {
		got  any
		want string
	}{
		{s["description"], "the file"},
		{props["batchWindow"].(map[string]any)["description"], "batching"},
		{props["tls"].(map[string]any)["description"], "tls files"},
	} {
		if c.got != c.want {
			t.Errorf("description %v, want %q", c.got, c.want)
		}
	}
	if _, ok := props["urls"].(map[string]any)["description"]; ok {
		t.Error("a field without a doc has a description")
	}
}
