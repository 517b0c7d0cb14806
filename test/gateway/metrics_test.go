package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/hub"
	"github.com/hubsync/hubsync/test/fleet"
	"github.com/hubsync/hubsync/test/testutil"
)

// chartFiles is the chart's directory of files the dashboard and the
// alert rules are in.
var chartFiles = filepath.Join("..", "..", "charts", "hubsync", "files")

// minDashboardMetrics is fewer metrics than the dashboard names: a
// dashboard that names fewer, or an extraction that finds fewer, is
// broken, and the check below would pass for nothing.
const minDashboardMetrics = 50

// prometheusSeries are the series Prometheus itself adds to every
// target's scrape, which a rule may use and no /metrics serves.
var prometheusSeries = map[string]bool{
	"up": true, "scrape_duration_seconds": true, "scrape_samples_scraped": true,
	"scrape_samples_post_metric_relabeling": true, "scrape_series_added": true,
}

// TestDashboardAndAlertMetricsExist runs the daemon with every part the
// dashboard and the alert rules watch (the embedded bus, a webhook sink,
// a kubeconfig sink, the tunnel pool and the gateway), drives a
// reconcile, events to both sinks, a gateway request served through a
// tunnel and one refused, and then requires every metric named by a
// query of charts/hubsync/files/dashboard.json or an expression of
// charts/hubsync/files/alerts.yaml to be in its /metrics, and the served
// request under its cluster's set (cluster_set).
func TestDashboardAndAlertMetricsExist(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	used, err := usedMetrics()
	if err != nil {
		t.Fatal(err)
	}

	s, conf := prepare(t, ctx)
	// A ManagedServiceAccount synced to the consumer namespace: a
	// credentials reconcile, a copy written, and a kubeconfig file. Removed
	// after the daemon stops (cleanups run last first).
	const reader = "dashboard-reader"
	t.Cleanup(func() {
		ctx := context.Background()
		_ = s.h.MSA.AuthenticationV1beta1().ManagedServiceAccounts(cluster).Delete(ctx, reader, metav1.DeleteOptions{})
		_ = s.hubKube.CoreV1().Secrets(cluster).Delete(ctx, reader, metav1.DeleteOptions{})
		_ = s.hubKube.CoreV1().Secrets(consumerNS).Delete(ctx, hub.CopyName(cluster, reader), metav1.DeleteOptions{})
	})
	if _, err := s.h.CreateMSA(ctx, cluster, reader, true); err != nil {
		t.Fatal(err)
	}
	if err := s.h.PutToken(ctx, cluster, reader, fleet.FakeJWT(time.Now().Add(time.Hour)), nil); err != nil {
		t.Fatal(err)
	}
	var delivered atomic.Int32
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		delivered.Add(1)
		w.WriteHeader(http.StatusNoContent)
	}))
	defer hook.Close()
	secrets := filepath.Join(s.dir, "webhook-secrets")
	if err := os.WriteFile(secrets, []byte("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	conf.Sinks = []config.Sink{
		{Name: "hook", Type: config.SinkWebhook, Webhook: &config.WebhookSink{URL: hook.URL, SecretsFile: secrets,
			Spool: config.WebhookSpool{Directory: filepath.Join(s.dir, "spool")}}},
		{Name: "files", Type: config.SinkKubeconfig, Kubeconfig: &config.KubeconfigSink{Directory: filepath.Join(s.dir, "kubeconfigs"),
			AccessProvider: "hubsync-gateway", ManagedServiceAccount: reader}},
	}
	s.run(t, ctx, conf)
	// A request served through the cluster's tunnel (a TokenReview, an
	// impersonated request, a probe and a dial before it), and one the
	// gateway refuses itself.
	s.waitServed(t, cluster)
	if code, body := s.get(t, "/"+cluster+"/api/v1/namespaces/apps/configmaps", "", nil); code != http.StatusUnauthorized {
		t.Fatalf("a request without a token: %d %s; want 401", code, body)
	}
	// The cluster's profile was created (a reconcile and a profile
	// write) and its event reached the bus and the webhook.
	testutil.Eventually(t, time.Minute, 100*time.Millisecond, func() bool { return delivered.Load() > 0 },
		"the webhook sink delivers the profile's event")
	testutil.Eventually(t, time.Minute, 100*time.Millisecond, func() bool {
		files, _ := os.ReadDir(filepath.Join(s.dir, "kubeconfigs"))
		return len(files) > 0
	}, "the kubeconfig sink writes the profile's file")

	var missing []string
	err = testutil.Poll(ctx, time.Minute, 500*time.Millisecond, func() error {
		scraped, err := s.d.Scrape()
		if err != nil {
			return err
		}
		missing = missing[:0]
		for _, name := range used.names() {
			if !scraped.Exposes(name) && !prometheusSeries[name] {
				missing = append(missing, name+" ("+strings.Join(used[name], ", ")+")")
			}
		}
		if len(missing) > 0 {
			return fmt.Errorf("%d missing", len(missing))
		}
		// The request served above, under the set the cluster is in:
		// what the dashboard's panels by cluster set read.
		bySet := testutil.Labels{"cluster": cluster, "cluster_set": consumerSet, "code": "200"}
		if !scraped.Has("hubsync_gateway_requests_total", bySet) ||
			!scraped.Has("hubsync_gateway_request_duration_seconds", testutil.Labels{"cluster_set": consumerSet}) {
			return fmt.Errorf("no request to %s counted and timed under cluster_set=%q", cluster, consumerSet)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("metrics named by the dashboard or the alerts that the daemon does not expose, or the gateway's series by cluster set (%v):\n  %s",
			err, strings.Join(missing, "\n  "))
	}
	t.Logf("all %d metrics named by the dashboard and the alerts are exposed", len(used))
}

// metricUses maps each metric name to where it is used ("dashboard",
// "alerts").
type metricUses map[string][]string

func (u metricUses) add(names []string, where string) {
	for _, n := range names {
		if len(u[n]) == 0 || u[n][len(u[n])-1] != where {
			u[n] = append(u[n], where)
		}
	}
}

func (u metricUses) names() []string {
	out := make([]string, 0, len(u))
	for n := range u {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// usedMetrics reads the metric names of every query of the dashboard and
// every expression of the alert rules, when their file exists (the
// series a rule records are not scraped, and are left out). A rules file
// without rules adds nothing; rules from which no name is read are an
// error.
func usedMetrics() (metricUses, error) {
	used := metricUses{}
	data, err := os.ReadFile(filepath.Join(chartFiles, "dashboard.json"))
	if err != nil {
		return nil, err
	}
	var doc any
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("dashboard.json: %w", err)
	}
	var exprs []string
	collectExprs(doc, &exprs)
	for _, e := range exprs {
		names, err := testutil.MetricNames(e)
		if err != nil {
			return nil, fmt.Errorf("dashboard.json: %w", err)
		}
		used.add(names, "dashboard")
	}
	if len(used) < minDashboardMetrics {
		return nil, fmt.Errorf("dashboard.json names %d metrics in %d queries; want at least %d", len(used), len(exprs), minDashboardMetrics)
	}

	data, err = os.ReadFile(filepath.Join(chartFiles, "alerts.yaml"))
	if err != nil {
		return nil, err
	}
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert  string `json:"alert"`
				Record string `json:"record"`
				Expr   string `json:"expr"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.Unmarshal(data, &rules); err != nil {
		return nil, fmt.Errorf("alerts.yaml: %w", err)
	}
	recorded := map[string]bool{}
	alerts := metricUses{}
	n := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			n++
			if r.Record != "" {
				recorded[r.Record] = true
			}
			names, err := testutil.MetricNames(r.Expr)
			if err != nil {
				return nil, fmt.Errorf("alerts.yaml rule %s%s: %w", r.Alert, r.Record, err)
			}
			alerts.add(names, "alerts")
		}
	}
	if len(alerts) == 0 {
		return nil, fmt.Errorf("alerts.yaml: no metric read from its %d rules", n)
	}
	for n, where := range alerts {
		if !recorded[n] {
			used[n] = append(used[n], where...)
		}
	}
	return used, nil
}

// collectExprs appends the value of every "expr" key in a JSON document:
// the dashboard's queries, wherever panels and rows nest them.
func collectExprs(v any, exprs *[]string) {
	switch x := v.(type) {
	case map[string]any:
		for k, c := range x {
			if s, ok := c.(string); ok && k == "expr" {
				*exprs = append(*exprs, s)
				continue
			}
			collectExprs(c, exprs)
		}
	case []any:
		for _, c := range x {
			collectExprs(c, exprs)
		}
	}
}
