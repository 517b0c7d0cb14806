package e2e

import (
	"crypto/tls"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/events"
	"github.com/hubsync/hubsync/sinks/webhook"
	"github.com/hubsync/hubsync/test/fleet"
	"github.com/hubsync/hubsync/test/testutil"
)

// receiver is a webhook endpoint that verifies every request's signature
// and records the events it accepts. Its behaviour can be scripted: a
// number of 500s, then of 429s with Retry-After, then success.
type receiver struct {
	t       *testing.T
	secrets []string

	mu        sync.Mutex
	fail500   int
	fail429   int
	last429   time.Time
	early     []time.Duration // requests that came before a Retry-After ran out
	rejected  []string        // signature failures
	accepted  []events.Event
	byID      map[string]int
	lastReqAt time.Time
}

func (r *receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	id, ts, sig := req.Header.Get("webhook-id"), req.Header.Get("webhook-timestamp"), req.Header.Get("webhook-signature")
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	r.lastReqAt = now
	if !r.last429.IsZero() {
		if d := now.Sub(r.last429); d < time.Second {
			r.early = append(r.early, d)
		}
		r.last429 = time.Time{}
	}
	if err := webhook.Verify(r.secrets, id, ts, body, sig); err != nil {
		r.rejected = append(r.rejected, err.Error())
		http.Error(w, "bad signature", http.StatusUnauthorized)
		return
	}
	switch {
	case r.fail500 > 0:
		r.fail500--
		http.Error(w, "broken", http.StatusInternalServerError)
		return
	case r.fail429 > 0:
		r.fail429--
		r.last429 = now
		w.Header().Set("Retry-After", "1")
		http.Error(w, "slow down", http.StatusTooManyRequests)
		return
	}
	if ct := req.Header.Get("Content-Type"); ct != "application/cloudevents+json" {
		r.rejected = append(r.rejected, "content type "+ct)
		http.Error(w, "content type", http.StatusUnsupportedMediaType)
		return
	}
	if err := events.ValidateEvent(body); err != nil {
		r.rejected = append(r.rejected, err.Error())
		http.Error(w, "invalid event", http.StatusBadRequest)
		return
	}
	e, err := events.Decode(body)
	if err != nil || e.ID != id {
		r.rejected = append(r.rejected, fmt.Sprintf("event id %q, webhook-id %q, %v", e.ID, id, err))
		http.Error(w, "id", http.StatusBadRequest)
		return
	}
	r.accepted = append(r.accepted, e)
	r.byID[id]++
	w.WriteHeader(http.StatusNoContent)
}

// has reports whether an event of that type about cluster was accepted.
func (r *receiver) has(typ, cluster string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.accepted {
		if e.Type == typ && e.Data.Cluster == cluster {
			return true
		}
	}
	return false
}

func (r *receiver) ids(typ string) map[string]bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]bool{}
	for _, e := range r.accepted {
		if e.Type == typ {
			out[e.ID] = true
		}
	}
	return out
}

// serve starts an HTTPS server for r on addr ("127.0.0.1:0" for a free
// port) with cert (nil: a new one).
func (r *receiver) serve(t *testing.T, addr string, cert *tls.Certificate) *httptest.Server {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(r)
	srv.Listener.Close()
	srv.Listener = ln
	if cert != nil {
		srv.TLS = &tls.Config{Certificates: []tls.Certificate{*cert}}
	}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

// TestWebhookSinkSurvivesOutagesAndRestart runs the daemon with two
// webhook sinks: "flaky" points at a receiver that first fails, then
// throttles with Retry-After, then disappears while hubsync restarts, and
// comes back; "control" at one that always answers. Every profile change
// reaches the flaky receiver, none is lost, duplicates only ever repeat an
// id, Retry-After is honoured, and every signature verifies.
func TestWebhookSinkSurvivesOutagesAndRestart(t *testing.T) {
	bin := testutil.Hubsync(t)
	h := newHarnessWithoutSyncer(t)
	ns := h.namespaces("hooks")[0]
	set := h.name("set")
	h.must(h.hub.CreateExclusiveSet(h.ctx, set))
	h.must(h.hub.Bind(h.ctx, ns, set, true))

	dir := t.TempDir()
	secretOld, secretNew := "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD"
	secretsFile := filepath.Join(dir, "secrets")
	// Two secrets: hubsync signs with both; the receiver knows only the
	// new one, as in the middle of a key rotation.
	h.must(os.WriteFile(secretsFile, []byte("# rotating\n"+secretOld+"\n"+secretNew+"\n"), 0o600))
	flaky := &receiver{t: t, secrets: []string{secretNew}, byID: map[string]int{}, fail500: 3, fail429: 2}
	control := &receiver{t: t, secrets: []string{secretOld}, byID: map[string]int{}}
	flakySrv := flaky.serve(t, "127.0.0.1:0", nil)
	controlSrv := control.serve(t, "127.0.0.1:0", nil)
	flakyAddr, flakyCert := flakySrv.Listener.Addr().String(), flakySrv.TLS.Certificates[0]
	caFile := filepath.Join(dir, "ca.pem")
	var pemCAs []byte
	for _, s := range []*httptest.Server{flakySrv, controlSrv} {
		pemCAs = append(pemCAs, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: s.Certificate().Raw})...)
	}
	h.must(os.WriteFile(caFile, pemCAs, 0o600))
	sink := func(name, url string) config.Sink {
		return config.Sink{Name: name, Type: config.SinkWebhook, Filter: config.SinkFilter{Namespaces: []string{ns}},
			Webhook: &config.WebhookSink{URL: url, SecretsFile: secretsFile, CAFile: caFile,
				Spool: config.WebhookSpool{Directory: filepath.Join(dir, "spool", name)}}}
	}
	conf := config.Config{Sinks: []config.Sink{sink("flaky", flakySrv.URL), sink("control", controlSrv.URL)}}
	var logs1, logs2 fleet.LogBuffer
	start := func(logs *fleet.LogBuffer) *fleet.Daemon {
		d, err := fleet.StartDaemon(h.ctx, bin, hubConfig, conf, logs)
		h.must(err)
		h.must(d.WaitReady(h.ctx, 60*time.Second))
		return d
	}
	d := start(&logs1)
	t.Cleanup(func() {
		_ = d.Stop()
		if t.Failed() {
			t.Logf("first hubsync's logs:\n%s\nsecond's:\n%s", logs1.String(), logs2.String())
		}
	})
	c := func(i int) string { return h.name(fmt.Sprintf("c%d", i)) }
	for i := 1; i <= 3; i++ {
		h.cluster(c(i), set, nil)
	}
	h.eventually("the flaky receiver accepts c1..c3 after 500s and 429s", func() error {
		for i := 1; i <= 3; i++ {
			if !flaky.has("io.hubsync.profile.created", c(i)) {
				return fmt.Errorf("no profile.created for %s", c(i))
			}
		}
		return nil
	})

	// The endpoint goes away; a change is spooled; hubsync restarts;
	// more changes happen while it is down and after it is back.
	flakySrv.Close()
	h.cluster(c(4), set, nil)
	h.eventually("the control receiver has c4", func() error {
		if !control.has("io.hubsync.profile.created", c(4)) {
			return fmt.Errorf("not yet")
		}
		return nil
	})
	h.must(d.Stop())
	h.cluster(c(5), set, nil)
	h.must(h.hub.DeleteCluster(h.ctx, c(1)))
	d = start(&logs2)
	h.cluster(c(6), set, nil)
	h.eventually("the control receiver has c6 and c1's deletion", func() error {
		if !control.has("io.hubsync.profile.created", c(6)) || !control.has("io.hubsync.profile.deleted", c(1)) {
			return fmt.Errorf("not yet")
		}
		return nil
	})
	// The endpoint comes back at the same address.
	flaky.serve(t, flakyAddr, &flakyCert)
	h.eventually("the flaky receiver catches up", func() error {
		for i := 1; i <= 6; i++ {
			if !flaky.has("io.hubsync.profile.created", c(i)) {
				return fmt.Errorf("no profile.created for %s", c(i))
			}
		}
		if !flaky.has("io.hubsync.profile.deleted", c(1)) {
			return fmt.Errorf("no profile.deleted for %s", c(1))
		}
		// None lost: every creation the control receiver saw (they are
		// never resync events) reached the flaky one, id for id.
		got := flaky.ids("io.hubsync.profile.created")
		for id := range control.ids("io.hubsync.profile.created") {
			if !got[id] {
				return fmt.Errorf("profile.created %s missing", id)
			}
		}
		return nil
	})

	flaky.mu.Lock()
	defer flaky.mu.Unlock()
	if len(flaky.rejected) > 0 || len(control.rejected) > 0 {
		t.Errorf("rejected requests: flaky %v, control %v", flaky.rejected, control.rejected)
	}
	if flaky.fail500 != 0 || flaky.fail429 != 0 {
		t.Errorf("scripted failures not all served: %d 500s, %d 429s left", flaky.fail500, flaky.fail429)
	}
	if len(flaky.early) > 0 {
		t.Errorf("retries came before Retry-After (1s) ran out: %v", flaky.early)
	}
	// Duplicates only ever repeat an id: one id per (type, cluster, version).
	ids := map[string]string{}
	dups := 0
	for _, e := range flaky.accepted {
		k := e.Type + "/" + e.Data.Cluster + "/" + e.Data.ResourceVersion
		if prev, ok := ids[k]; ok && prev != e.ID {
			t.Errorf("%s delivered under two ids: %s and %s", k, prev, e.ID)
		}
		ids[k] = e.ID
		if flaky.byID[e.ID] > 1 {
			dups++
		}
		if e.Data.Namespace != ns {
			t.Errorf("event of namespace %s passed the filter", e.Data.Namespace)
		}
	}
	t.Logf("flaky receiver: %d events accepted (%d distinct ids, %d deliveries of repeated ids); control: %d",
		len(flaky.accepted), len(flaky.byID), dups, len(control.accepted))
	for _, l := range []string{logs1.String(), logs2.String()} {
		for _, s := range []string{secretOld, secretNew, strings.TrimPrefix(secretNew, "whsec_")} {
			if strings.Contains(l, s) {
				t.Fatal("a webhook secret appears in hubsync's log")
			}
		}
	}
}
