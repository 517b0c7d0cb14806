package config

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func TestSinkValidation(t *testing.T) {
	secrets := writeFile(t, "whsec", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n")
	providers := "accessProviders:\n- name: proxy\n  server: https://proxy:9092/{{.ClusterName}}\n"
	kube := func(extra string) string {
		return providers + "sinks:\n- name: files\n  type: kubeconfig\n  kubeconfig:\n    directory: /var/lib/hubsync/kubeconfigs\n    accessProvider: proxy\n    managedServiceAccount: kueue\n" + extra
	}
	argo := func(extra string) string {
		return providers + "sinks:\n- name: argo\n  type: argocd\n  argocd:\n    consumerNamespace: argocd\n    accessProvider: proxy\n    managedServiceAccount: argocd\n" + extra
	}
	hook := func(extra string) string {
		return "sinks:\n- name: hooks\n  type: webhook\n  webhook:\n    url: https://hooks.example.com/hubsync\n    secretsFile: " + secrets + "\n" + extra
	}
	for _, tc := range []struct {
		name      string
		doc       string
		wantPaths []string
	}{
		{name: "kubeconfig", doc: kube("")},
		{name: "kubeconfig token mode", doc: kube("    auth: token\n")},
		{name: "argocd", doc: argo("    namespaces: [default, kube-system]\n    clusterResources: true\n    labels: {team: ml}\n")},
		{name: "webhook", doc: hook("")},
		{name: "webhook to loopback http", doc: "sinks:\n- name: local\n  type: webhook\n  webhook:\n    url: http://127.0.0.1:9000/\n    secretsFile: " + secrets + "\n"},
		{name: "webhook narrowed to rotations", doc: hook("  filter:\n    eventTypes: [io.hubsync.credential.rotated]\n")},
		{name: "filter", doc: kube("  filter:\n    namespaces: [team-a]\n    clusterSelector: {matchLabels: {env: prod}}\n")},
		{name: "no name or type", doc: "sinks:\n- {}\n", wantPaths: []string{"sinks[0].name", "sinks[0].type"}},
		{name: "unknown type", doc: "sinks:\n- name: s\n  type: kafka\n", wantPaths: []string{"sinks[0].type"}},
		{name: "name taken by the bus", doc: "sinks:\n- name: nats\n  type: webhook\n  webhook: {url: 'https://x', secretsFile: " + secrets + "}\n", wantPaths: []string{"sinks[0].name"}},
		{name: "bad name", doc: "sinks:\n- name: My_Sink\n  type: webhook\n  webhook: {url: 'https://x', secretsFile: " + secrets + "}\n", wantPaths: []string{"sinks[0].name"}},
		{name: "duplicate names", doc: hook("- name: hooks\n  type: webhook\n  webhook: {url: 'https://y', secretsFile: " + secrets + "}\n"), wantPaths: []string{"sinks[1].name"}},
		{name: "section of another type", doc: hook("  kubeconfig: {directory: /x}\n"), wantPaths: []string{"sinks[0].kubeconfig"}},
		{name: "missing section", doc: "sinks:\n- name: s\n  type: kubeconfig\n", wantPaths: []string{"sinks[0].kubeconfig"}},
		{name: "kubeconfig fields", doc: "sinks:\n- name: s\n  type: kubeconfig\n  kubeconfig: {directory: relative, auth: password, managedServiceAccount: 'A B'}\n",
			wantPaths: []string{"sinks[0].kubeconfig.directory", "sinks[0].kubeconfig.accessProvider", "sinks[0].kubeconfig.auth", "sinks[0].kubeconfig.managedServiceAccount"}},
		{name: "unknown access provider", doc: kube("")[len(providers):], wantPaths: []string{"sinks[0].kubeconfig.accessProvider"}},
		{name: "two sinks, one directory", doc: kube("- name: files2\n  type: kubeconfig\n  kubeconfig: {directory: /var/lib/hubsync/kubeconfigs/, accessProvider: proxy, managedServiceAccount: x}\n"),
			wantPaths: []string{"sinks[1].kubeconfig.directory"}},
		{name: "without credentials", doc: "credentials: {enabled: false}\n" + kube(""), wantPaths: []string{"sinks[0].kubeconfig"}},
		{name: "argocd fields", doc: providers + "sinks:\n- name: a\n  type: argocd\n  argocd: {namespace: 'Argo', accessProvider: proxy, managedServiceAccount: m, labels: {'bad key!': v}}\n",
			wantPaths: []string{"sinks[0].argocd.namespace", "sinks[0].argocd.consumerNamespace", "sinks[0].argocd.labels[bad key!]"}},
		{name: "argocd for Argo CD 3.5 with hubsync creds", doc: argo("    provideClusterInfo: true\n")},
		{name: "argocd for Argo CD 3.5 with cp-creds", doc: argo("    provideClusterInfo: true\n    execPlugin: cp-creds\n    exec: {command: /plugins/cp-creds}\n")},
		{name: "argocd cp-creds without cluster info", doc: argo("    execPlugin: cp-creds\n"), wantPaths: []string{"sinks[0].argocd.execPlugin"}},
		{name: "argocd unknown exec plugin", doc: argo("    execPlugin: kubelogin\n"), wantPaths: []string{"sinks[0].argocd.execPlugin"}},
		{name: "argocd cluster info in token mode", doc: argo("    auth: token\n    provideClusterInfo: true\n"), wantPaths: []string{"sinks[0].argocd.provideClusterInfo"}},
		{name: "argocd twice for the same clusters", doc: argo("- name: argo2\n  type: argocd\n  argocd: {consumerNamespace: argocd, accessProvider: proxy, managedServiceAccount: other}\n"),
			wantPaths: []string{"sinks[1].argocd"}},
		{name: "webhook plain http", doc: "sinks:\n- name: h\n  type: webhook\n  webhook: {url: 'http://hooks.example.com/', secretsFile: " + secrets + "}\n", wantPaths: []string{"sinks[0].webhook.url"}},
		{name: "webhook URL with credentials", doc: "sinks:\n- name: h\n  type: webhook\n  webhook: {url: 'https://u:p@hooks.example.com/', secretsFile: " + secrets + "}\n", wantPaths: []string{"sinks[0].webhook.url"}},
		{name: "webhook without secrets", doc: "sinks:\n- name: h\n  type: webhook\n  webhook: {url: 'https://x/'}\n", wantPaths: []string{"sinks[0].webhook.secretsFile"}},
		{name: "webhook limits", doc: hook("    timeout: 1h\n    spool: {maxBytes: 10, directory: rel}\n    caFile: /nonexistent/ca.pem\n"),
			wantPaths: []string{"sinks[0].webhook.timeout", "sinks[0].webhook.spool.maxBytes", "sinks[0].webhook.spool.directory", "sinks[0].webhook.caFile"}},
		{name: "webhook failing after 2 minutes", doc: hook("    failingAfter: 2m\n")},
		{name: "webhook failingAfter out of range", doc: hook("    failingAfter: -1s\n"), wantPaths: []string{"sinks[0].webhook.failingAfter"}},
		{name: "webhook failingAfter beyond a day", doc: hook("    failingAfter: 25h\n"), wantPaths: []string{"sinks[0].webhook.failingAfter"}},
		{name: "webhook one request at a time", doc: hook("    concurrency: 1\n")},
		{name: "webhook concurrency out of range", doc: hook("    concurrency: 257\n"), wantPaths: []string{"sinks[0].webhook.concurrency"}},
		{name: "webhook negative concurrency", doc: hook("    concurrency: -1\n"), wantPaths: []string{"sinks[0].webhook.concurrency"}},
		{name: "event types only for webhooks", doc: kube("  filter: {eventTypes: [io.hubsync.profile.created]}\n"), wantPaths: []string{"sinks[0].filter.eventTypes"}},
		{name: "bad filter", doc: hook("  filter:\n    namespaces: [A_B]\n    eventTypes: [io.hubsync.nothing]\n    clusterSelector: {matchExpressions: [{key: env, operator: Near}]}\n"),
			wantPaths: []string{"sinks[0].filter.namespaces[0]", "sinks[0].filter.eventTypes[0]", "sinks[0].filter.clusterSelector"}},
		{name: "unknown sink field", doc: hook("  retries: 3\n"), wantPaths: []string{"sinks[0].retries"}},
	} {
		t.Run(tc.name, func(t *testing.T) { expectFieldErrors(t, tc.doc, tc.wantPaths) })
	}
}

func TestSinkDefaults(t *testing.T) {
	c, err := Parse([]byte("accessProviders: [{name: p, type: direct}]\nsinks:\n- {name: k, type: kubeconfig, kubeconfig: {directory: /d, accessProvider: p, managedServiceAccount: m}}\n" +
		"- {name: a, type: argocd, argocd: {consumerNamespace: team-a, accessProvider: p, managedServiceAccount: m}}\n" +
		"- {name: w, type: webhook, webhook: {url: 'https://x', secretRef: {namespace: team-a, name: hooks}}}\n"))
	if err != nil {
		t.Fatal(err)
	}
	k, a, w := c.Sinks[0], c.Sinks[1], c.Sinks[2]
	if k.QueueSize != DefaultQueueSize || k.Kubeconfig.Auth != AuthExec || k.Kubeconfig.Exec.Command != "hubsync" {
		t.Errorf("kubeconfig defaults: %+v", k)
	}
	if a.ArgoCD.Namespace != "argocd" || a.ArgoCD.Auth != AuthExec || a.ArgoCD.ExecPlugin != ExecPluginHubsync || a.ArgoCD.ProvideClusterInfo {
		t.Errorf("argocd defaults: %+v", a.ArgoCD)
	}
	if w.Webhook.Timeout.Duration != 10*time.Second || w.Webhook.FailingAfter.Duration != time.Minute || w.Webhook.Concurrency != DefaultWebhookConcurrency || w.Webhook.Spool.MaxBytes != 64<<20 ||
		w.Webhook.Spool.Directory != "/var/lib/hubsync/sinks/w" || w.Webhook.SecretRef.Key != "secrets" {
		t.Errorf("webhook defaults: %+v", w.Webhook)
	}
}

func TestRestartNeeded(t *testing.T) {
	base := func() *Config {
		c, err := Parse([]byte("hub: {qps: 100, burst: 200}\n"))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want []string
	}{
		{name: "nothing", edit: func(*Config) {}},
		{name: "sinks reload live", edit: func(c *Config) { c.Sinks = []Sink{{Name: "s", Type: SinkWebhook}} }},
		{name: "hub and bus need a restart", edit: func(c *Config) { c.Hub.QPS = 5; c.Bus.KVBucket = "other" }, want: []string{"hub", "bus"}},
		{name: "bus consumers reload live", edit: func(c *Config) { c.Bus.Consumers = []BusConsumer{{Name: "app", NKeys: []string{"U"}}} }},
		{name: "bus consumers and more of bus", edit: func(c *Config) {
			c.Bus.Consumers = []BusConsumer{{Name: "app", NKeys: []string{"U"}}}
			c.Bus.BufferSize = 7
		}, want: []string{"bus"}},
		{name: "access providers need a restart", edit: func(c *Config) { c.AccessProviders = []AccessProvider{{Name: "x"}} }, want: []string{"accessProviders"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			next := base()
			tc.edit(next)
			if got := base().RestartNeeded(next); !slices.Equal(got, tc.want) {
				t.Errorf("RestartNeeded = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestWebhookFailingAfterMessage: the refusal names the default that an
// unset failingAfter takes.
func TestWebhookFailingAfterMessage(t *testing.T) {
	secrets := writeFile(t, "whsec", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n")
	_, err := Parse([]byte("sinks:\n- name: h\n  type: webhook\n  webhook: {url: 'https://x/', secretsFile: " + secrets + ", failingAfter: 25h}\n"))
	if err == nil || !strings.Contains(err.Error(), "must be at most 24h (unset: "+DefaultWebhookFailingAfter.String()+")") {
		t.Fatalf("Parse: %v; want the bound and the default", err)
	}
}
