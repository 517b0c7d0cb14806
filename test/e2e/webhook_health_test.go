package e2e

import (
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/test/fleet"
	"github.com/hubsync/hubsync/test/testutil"
)

// TestWebhookDownIsShownFailing runs the daemon with a webhook sink whose
// receiver answers 503. Every change is spooled at once, so the fan-out's
// own view of the sink stays "delivered, nothing queued"; what shows is
// what the spool holds: past failingAfter, /readyz?verbose says the sink
// is failing, with the receiver's answer, its backlog and the age of its
// oldest event, hubsync_sink_up is 0 and hubsync_sink_queue_depth equals
// the spool's events. Once the receiver takes events again the sink is ok
// with nothing queued.
func TestWebhookDownIsShownFailing(t *testing.T) {
	bin := testutil.Hubsync(t)
	h := newHarnessWithoutSyncer(t)
	ns := h.namespaces("hookdown")[0]
	set := h.name("set")
	h.must(h.hub.CreateExclusiveSet(h.ctx, set))
	h.must(h.hub.Bind(h.ctx, ns, set, true))

	var accepting atomic.Bool
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if !accepting.Load() {
			http.Error(w, "down for maintenance", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	secretsFile, caFile := filepath.Join(dir, "secrets"), filepath.Join(dir, "ca.pem")
	h.must(os.WriteFile(secretsFile, []byte("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n"), 0o600))
	h.must(os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600))
	conf := config.Config{Sinks: []config.Sink{{
		Name: "hook", Type: config.SinkWebhook, Filter: config.SinkFilter{Namespaces: []string{ns}},
		Webhook: &config.WebhookSink{URL: srv.URL, SecretsFile: secretsFile, CAFile: caFile,
			FailingAfter: metav1.Duration{Duration: 2 * time.Second},
			Spool:        config.WebhookSpool{Directory: filepath.Join(dir, "spool")}},
	}}}
	var logs fleet.LogBuffer
	d, err := fleet.StartDaemon(h.ctx, bin, hubConfig, conf, &logs)
	h.must(err)
	t.Cleanup(func() {
		_ = d.Stop()
		if t.Failed() {
			t.Logf("hubsync's logs:\n%s", logs.String())
		}
	})
	h.must(d.WaitReady(h.ctx, 60*time.Second))
	for i := range 3 {
		h.cluster(h.name(fmt.Sprintf("c%d", i)), set, nil)
	}

	metricsURL := "http://" + d.Address + "/metrics"
	sink := testutil.Labels{"sink": "hook"}
	line := regexp.MustCompile(`(?m)^sink hook \(webhook\): (.*)$`)
	// readyz returns the sink's line of /readyz?verbose.
	readyz := func() (string, error) {
		resp, err := http.Get("http://" + d.Address + "/readyz?verbose")
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			return "", err
		}
		if resp.StatusCode != http.StatusOK {
			return "", fmt.Errorf("/readyz?verbose: %s (a failing sink must not make hubsync unready): %s", resp.Status, body)
		}
		m := line.FindStringSubmatch(string(body))
		if m == nil {
			return "", fmt.Errorf("no line for sink hook in %q", body)
		}
		return m[1], nil
	}
	queued := regexp.MustCompile(`, (\d+) queued, oldest (\S+),`)
	var failing string
	testutil.Eventually(t, 30*time.Second, 100*time.Millisecond, func() error {
		state, err := readyz()
		if err != nil {
			return err
		}
		failing = state
		if !strings.HasPrefix(state, "failing for ") || !strings.Contains(state, "503 Service Unavailable") {
			return fmt.Errorf("sink hook is %q, want failing with the receiver's 503", state)
		}
		q := queued.FindStringSubmatch(state)
		if q == nil {
			return fmt.Errorf("sink hook is %q, want its backlog and the age of its oldest event", state)
		}
		if _, err := time.ParseDuration(q[2]); err != nil {
			return fmt.Errorf("oldest %q: %v", q[2], err)
		}
		m, err := testutil.Scrape(metricsURL)
		if err != nil {
			return err
		}
		spooled := m.Value("hubsync_webhook_spool_events", sink)
		n, _ := strconv.Atoi(q[1])
		switch {
		case spooled < 3:
			return fmt.Errorf("hubsync_webhook_spool_events = %v, want at least the 3 profiles' events", spooled)
		case float64(n) != spooled:
			return fmt.Errorf("/readyz?verbose says %d queued, the spool holds %v events", n, spooled)
		case m.Value("hubsync_sink_up", sink) != 0:
			return fmt.Errorf("hubsync_sink_up = %v while the receiver is down", m.Value("hubsync_sink_up", sink))
		case m.Value("hubsync_sink_queue_depth", sink) != spooled:
			return fmt.Errorf("hubsync_sink_queue_depth = %v, the spool holds %v events", m.Value("hubsync_sink_queue_depth", sink), spooled)
		}
		oldest := m.Value("hubsync_sink_oldest_waiting_timestamp_seconds", sink)
		if now := float64(time.Now().Unix()); oldest <= 0 || oldest > now+1 || now-oldest < 1 {
			return fmt.Errorf("hubsync_sink_oldest_waiting_timestamp_seconds = %v, want the time of an event spooled more than failingAfter ago", oldest)
		}
		return nil
	}, "the webhook sink shown failing with its backlog")
	t.Logf("/readyz?verbose: sink hook (webhook): %s", failing)

	// The receiver is back: the backlog goes, and the sink is ok again.
	accepting.Store(true)
	testutil.Eventually(t, 30*time.Second, 100*time.Millisecond, func() error {
		state, err := readyz()
		if err != nil {
			return err
		}
		if !strings.HasPrefix(state, "ok, 0 queued, last attempt ") || !strings.HasSuffix(state, ": 204 No Content") {
			return fmt.Errorf("sink hook is %q, want ok with nothing queued after a 204", state)
		}
		m, err := testutil.Scrape(metricsURL)
		if err != nil {
			return err
		}
		for name, want := range map[string]float64{
			"hubsync_sink_up": 1, "hubsync_sink_queue_depth": 0, "hubsync_webhook_spool_events": 0,
			"hubsync_sink_oldest_waiting_timestamp_seconds": 0,
		} {
			if got := m.Value(name, sink); got != want {
				return fmt.Errorf("%s = %v, want %v", name, got, want)
			}
		}
		return nil
	}, "the webhook sink ok again")
}
