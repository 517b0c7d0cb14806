package webhook

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/events"
	"github.com/hubsync/hubsync/sinks"
	"github.com/hubsync/hubsync/stream"
	"github.com/hubsync/hubsync/test/testutil"
)

const testSource = "hubsync/test-hub"

// received is one request a test receiver got.
type received struct {
	id, ts, sig, auth, contentType string
	body                           []byte
	at                             time.Time // when it arrived
	answered                       time.Time // just before the answer was written
	code                           int
}

// receiver is a test endpoint. handle decides the answer to request n
// (0-based); nil answers 200.
type receiver struct {
	mu     sync.Mutex
	reqs   []received
	handle func(n int, r *http.Request) (int, http.Header)
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	at := time.Now()
	body, _ := io.ReadAll(r.Body)
	// The handler may read the body too.
	r.Body = io.NopCloser(bytes.NewReader(body))
	rc.mu.Lock()
	n, h := len(rc.reqs), rc.handle
	rc.mu.Unlock()
	code, hdr := http.StatusOK, http.Header(nil)
	if h != nil {
		code, hdr = h(n, r)
	}
	rec := received{
		id: r.Header.Get(HeaderID), ts: r.Header.Get(HeaderTimestamp), sig: r.Header.Get(HeaderSignature),
		auth: r.Header.Get("Authorization"), contentType: r.Header.Get("Content-Type"),
		body: body, at: at, code: code,
	}
	for k, v := range hdr {
		w.Header()[k] = v
	}
	rec.answered = time.Now()
	rc.mu.Lock()
	rc.reqs = append(rc.reqs, rec)
	rc.mu.Unlock()
	w.WriteHeader(code)
}

func (rc *receiver) setHandle(h func(n int, r *http.Request) (int, http.Header)) {
	rc.mu.Lock()
	rc.handle = h
	rc.mu.Unlock()
}

func (rc *receiver) all() []received {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]received(nil), rc.reqs...)
}

// delivered returns the requests answered 2xx, in order.
func (rc *receiver) delivered() []received {
	var out []received
	for _, r := range rc.all() {
		if r.code >= 200 && r.code < 300 {
			out = append(out, r)
		}
	}
	return out
}

func answer(code int) func(int, *http.Request) (int, http.Header) {
	return func(int, *http.Request) (int, http.Header) { return code, nil }
}

// logBuffer collects a sink's log output.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// fakeControl records what a sink asks of its fan-out worker.
type fakeControl struct {
	resyncs atomic.Int32
	retries atomic.Int32
}

func (c *fakeControl) RequestResync() { c.resyncs.Add(1) }
func (c *fakeControl) Retry()         { c.retries.Add(1) }

// env is one test's sink setup: the files, log and registry its sinks
// share, and every secret that must never be logged.
type env struct {
	t        testing.TB
	dir      string
	spoolDir string
	secrets  string // path of the secrets file
	logs     *logBuffer
	reg      *prometheus.Registry
	hidden   []string // must not appear in logs

	cfg  config.Sink
	deps sinks.Deps
	opts options
}

// newServedEnv is newEnv for a plain receiver on a loopback HTTP server
// that lives as long as the test.
func newServedEnv(t *testing.T) (*receiver, *env) {
	t.Helper()
	rc := &receiver{}
	srv := httptest.NewServer(rc)
	t.Cleanup(srv.Close)
	return rc, newEnv(t, srv.URL)
}

// newAnsweringEnv is newServedEnv for a receiver that answers every
// request with code until the test sets another handler.
func newAnsweringEnv(t *testing.T, code int) (*receiver, *env) {
	t.Helper()
	rc := &receiver{handle: answer(code)}
	srv := httptest.NewServer(rc)
	t.Cleanup(srv.Close)
	return rc, newEnv(t, srv.URL)
}

func newEnv(t testing.TB, url string, secrets ...string) *env {
	t.Helper()
	dir := t.TempDir()
	e := &env{t: t, dir: dir, spoolDir: filepath.Join(dir, "spool"), logs: &logBuffer{}, reg: prometheus.NewRegistry()}
	if len(secrets) == 0 {
		secrets = []string{newSecret(t)}
	}
	e.secrets = e.writeFile("secrets", strings.Join(secrets, "\n")+"\n")
	e.hide(secrets...)
	e.cfg = config.Sink{
		Name: "hook", Type: config.SinkWebhook,
		Webhook: &config.WebhookSink{
			URL: url, SecretsFile: e.secrets,
			Timeout:     metav1.Duration{Duration: 5 * time.Second},
			Concurrency: config.DefaultWebhookConcurrency,
			Spool:       config.WebhookSpool{Directory: e.spoolDir, MaxBytes: 1 << 20},
		},
	}
	e.deps = sinks.Deps{
		Source:     testSource,
		Log:        slog.New(slog.NewTextHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Registerer: e.reg,
	}
	e.opts = defaultOptions()
	// Fast retries: tests must not wait for the production backoff.
	e.opts.retryBase, e.opts.retryMax = time.Millisecond, 5*time.Millisecond
	t.Cleanup(func() {
		logs := e.logs.String()
		for _, s := range e.hidden {
			if strings.Contains(logs, s) {
				t.Errorf("a secret or token appears in the log output:\n%s", logs)
			}
		}
	})
	return e
}

// hide adds secrets (whsec_ values or tokens) that must not be logged: the
// whole value and, for a secret, its base64 key.
func (e *env) hide(secrets ...string) {
	for _, s := range secrets {
		e.hidden = append(e.hidden, s)
		if k, ok := strings.CutPrefix(s, SecretPrefix); ok {
			e.hidden = append(e.hidden, k)
		}
	}
}

func (e *env) writeFile(name, content string) string {
	e.t.Helper()
	p := filepath.Join(e.dir, name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		e.t.Fatal(err)
	}
	return p
}

// segments lists the segment files of the env's spool directory.
func (e *env) segments() []string {
	segs, _ := filepath.Glob(filepath.Join(e.spoolDir, "*"+segSuffix))
	return segs
}

// deliverAll hands each batch to s in turn and returns the ids of their
// events, in order.
func deliverAll(t *testing.T, s *sink, batches ...[]stream.Change) []string {
	t.Helper()
	var ids []string
	for _, batch := range batches {
		if err := s.Deliver(t.Context(), batch); err != nil {
			t.Fatalf("Deliver: %v", err)
		}
		for _, c := range batch {
			ids = append(ids, events.ID(c))
		}
	}
	return ids
}

// start makes a sink from the env's configuration; it is closed when the
// test ends (closing twice is fine).
func (e *env) start() *sink {
	e.t.Helper()
	s, err := newSink(e.cfg, e.deps, e.opts)
	if err != nil {
		e.t.Fatalf("newSink: %v", err)
	}
	e.t.Cleanup(func() { _ = s.Close() })
	return s
}

func newSecret(t testing.TB) string {
	t.Helper()
	key := make([]byte, 24)
	if _, err := rand.Read(key); err != nil {
		t.Fatal(err)
	}
	return SecretPrefix + base64.StdEncoding.EncodeToString(key)
}

func newToken(t *testing.T) string {
	t.Helper()
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return "tok-" + hex.EncodeToString(b)
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	testutil.Eventually(t, 15*time.Second, 2*time.Millisecond, cond, "timed out waiting for %s", what)
}

// metric returns the value of the series of name with the given labels in
// reg (a counter's or gauge's value, a histogram's sample count), and
// whether it exists.
func metric(t testing.TB, reg *prometheus.Registry, name string, labels map[string]string) (float64, bool) {
	t.Helper()
	m, err := testutil.Gather(reg)
	if err != nil {
		t.Fatal(err)
	}
	return m.Lookup(name, labels)
}

func (e *env) metric(name string, labels map[string]string) float64 {
	e.t.Helper()
	if labels == nil {
		labels = map[string]string{}
	}
	if _, ok := labels["sink"]; !ok {
		labels["sink"] = e.cfg.Name
	}
	v, _ := metric(e.t, e.reg, name, labels)
	return v
}

// ids returns the webhook-ids of requests.
func ids(rs []received) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.id
	}
	return out
}

// perKey returns the webhook-ids of requests by the (namespace, cluster)
// of their events, in the order they came.
func perKey(t testing.TB, rs []received) map[stream.Key][]string {
	t.Helper()
	out := map[stream.Key][]string{}
	for _, r := range rs {
		ev, err := events.Decode(r.body)
		if err != nil {
			t.Fatal(err)
		}
		k := stream.Key{Namespace: ev.Data.Namespace, Cluster: ev.Data.Cluster}
		out[k] = append(out[k], r.id)
	}
	return out
}

// perKeyOf returns the event ids of batches of changes by (namespace,
// cluster), in order.
func perKeyOf(batches ...[]stream.Change) map[stream.Key][]string {
	out := map[stream.Key][]string{}
	for _, b := range batches {
		for _, c := range b {
			out[c.Key()] = append(out[c.Key()], events.ID(c))
		}
	}
	return out
}

// bySubject sorts events by subject, (namespace, cluster), keeping the
// order of each subject's events: the order that holds when events of
// different keys go side by side.
func bySubject(evs []events.Event) []events.Event {
	slices.SortStableFunc(evs, func(a, b events.Event) int { return strings.Compare(a.Subject, b.Subject) })
	return evs
}
