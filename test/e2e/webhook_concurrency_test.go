package e2e

import (
	"bufio"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "open-cluster-management.io/api/cluster/v1"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/events"
	"github.com/hubsync/hubsync/sinks/webhook"
	"github.com/hubsync/hubsync/test/fleet"
	"github.com/hubsync/hubsync/test/testutil"
)

const hookSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

// arrival is one request a keyedReceiver got.
type arrival struct {
	id, typ string
	rv      int64
	at      time.Time // when it arrived
	done    time.Time // when it was answered
	code    int
}

// keyedReceiver is a webhook endpoint far away: it answers after a delay,
// verifies every signature, and follows the requests in flight, overall
// and per (namespace, cluster), and what each key received, in order.
type keyedReceiver struct {
	t *testing.T
	// delay is how long an answer takes; answer, if set, decides it from
	// the request's number (0-based, in order of arrival) and its event's
	// "namespace/cluster".
	delay  func() time.Duration
	answer func(n int, key string, r *http.Request) (int, http.Header)

	mu       sync.Mutex
	n        int
	inFlight int
	most     int
	perKey   map[string]int       // in flight, by "namespace/cluster"
	overlaps []string             // keys that had two requests in flight at once
	rejected []string             // signature or event failures
	got      map[string][]arrival // by "namespace/cluster", in order of arrival
	all      []arrival
}

func newKeyedReceiver(t *testing.T, delay func() time.Duration) *keyedReceiver {
	return &keyedReceiver{t: t, delay: delay, perKey: map[string]int{}, got: map[string][]arrival{}}
}

func (r *keyedReceiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	a := arrival{at: time.Now(), code: http.StatusNoContent}
	body, _ := io.ReadAll(req.Body)
	id, ts, sig := req.Header.Get("webhook-id"), req.Header.Get("webhook-timestamp"), req.Header.Get("webhook-signature")
	ev, err := events.Decode(body)
	if err == nil {
		err = webhook.Verify([]string{hookSecret}, id, ts, body, sig)
	}
	if err == nil && ev.ID != id {
		err = fmt.Errorf("webhook-id %s for event %s", id, ev.ID)
	}
	key := ev.Data.Namespace + "/" + ev.Data.Cluster
	r.mu.Lock()
	n := r.n
	r.n++
	if err != nil {
		r.rejected = append(r.rejected, err.Error())
	}
	r.inFlight++
	r.most = max(r.most, r.inFlight)
	if r.perKey[key]++; r.perKey[key] > 1 {
		r.overlaps = append(r.overlaps, key)
	}
	r.mu.Unlock()
	var hdr http.Header
	if r.answer != nil {
		a.code, hdr = r.answer(n, key, req)
	}
	gone := false
	if r.delay != nil {
		select {
		case <-time.After(r.delay()):
		case <-req.Context().Done():
			// The sender is gone (killed): it never gets this answer, and
			// its request is no longer in flight.
			gone = true
		}
	}
	a.id, a.typ, a.done = id, ev.Type, time.Now()
	a.rv, _ = strconv.ParseInt(ev.Data.ResourceVersion, 10, 64)
	r.mu.Lock()
	r.inFlight--
	r.perKey[key]--
	if gone {
		r.mu.Unlock()
		return
	}
	r.all = append(r.all, a)
	if err == nil && a.code < 300 {
		r.got[key] = append(r.got[key], a)
	}
	r.mu.Unlock()
	for k, v := range hdr {
		w.Header()[k] = v
	}
	w.WriteHeader(a.code)
}

// accepted returns the ids the receiver took.
func (r *keyedReceiver) accepted() map[string]bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]bool{}
	for _, as := range r.got {
		for _, a := range as {
			out[a.id] = true
		}
	}
	return out
}

// has reports whether key received an event of resourceVersion rv.
func (r *keyedReceiver) has(key string, rv int64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.ContainsFunc(r.got[key], func(a arrival) bool { return a.rv == rv })
}

// check reports every broken promise: a bad signature, two requests of a
// key in flight at once, a key's events out of order (a resourceVersion
// lower than one it received before, duplicates dropped by id), the same
// change under two ids; and that more than one request was in flight at
// once, at most concurrency.
func (r *keyedReceiver) check(t *testing.T, concurrency int) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.rejected) > 0 {
		t.Errorf("rejected requests: %v", r.rejected)
	}
	if len(r.overlaps) > 0 {
		t.Errorf("two requests of one key in flight at once: %v", r.overlaps)
	}
	if r.most < 2 || r.most > concurrency {
		t.Errorf("at most %d requests in flight at once; want more than one, at most %d", r.most, concurrency)
	}
	for key, as := range r.got {
		seen, ids := map[string]bool{}, map[string]string{}
		var last int64
		for _, a := range as {
			change := fmt.Sprintf("%s %d", a.typ, a.rv)
			if prev, ok := ids[change]; ok && prev != a.id {
				t.Errorf("%s: %s delivered under two ids, %s and %s", key, change, prev, a.id)
			}
			ids[change] = a.id
			if seen[a.id] {
				continue // a duplicate, which receivers drop by id
			}
			seen[a.id] = true
			if a.rv < last {
				t.Errorf("%s: resourceVersion %d (%s) after %d: out of order", key, a.rv, a.typ, last)
			}
			last = a.rv
		}
	}
}

// hookRig is one webhook sink on a daemon, with its receiver.
type hookRig struct {
	h    *harness
	bin  string
	recv *keyedReceiver
	srv  *httptest.Server
	dir  string
	conf config.Config
	logs []*fleet.LogBuffer
	// running is the daemon started last, unless it was killed.
	running *fleet.Daemon
}

// newHookRig starts a TLS receiver for recv and the configuration of a
// webhook sink at it with concurrency, for the namespaces.
func newHookRig(t *testing.T, h *harness, recv *keyedReceiver, concurrency int, namespaces []string) *hookRig {
	r := &hookRig{h: h, bin: testutil.Hubsync(t), recv: recv, dir: t.TempDir()}
	r.srv = httptest.NewTLSServer(recv)
	t.Cleanup(r.srv.Close)
	secrets, ca := filepath.Join(r.dir, "secrets"), filepath.Join(r.dir, "ca.pem")
	h.must(os.WriteFile(secrets, []byte(hookSecret+"\n"), 0o600))
	h.must(os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: r.srv.Certificate().Raw}), 0o600))
	r.conf = config.Config{Sinks: []config.Sink{{
		Name: "far", Type: config.SinkWebhook, Filter: config.SinkFilter{Namespaces: namespaces},
		Webhook: &config.WebhookSink{URL: r.srv.URL, SecretsFile: secrets, CAFile: ca, Concurrency: concurrency,
			Spool: config.WebhookSpool{Directory: r.spool()}},
	}}}
	t.Cleanup(func() {
		if r.running != nil {
			_ = r.running.Stop()
		}
		if t.Failed() {
			for i, l := range r.logs {
				t.Logf("hubsync %d's logs:\n%s", i+1, l.String())
			}
		}
	})
	return r
}

func (r *hookRig) spool() string { return filepath.Join(r.dir, "spool") }

// start runs the daemon and waits until it is ready; it is stopped when
// the test ends.
func (r *hookRig) start() {
	r.h.t.Helper()
	logs := &fleet.LogBuffer{}
	r.logs = append(r.logs, logs)
	d, err := fleet.StartDaemon(r.h.ctx, r.bin, hubConfig, r.conf, logs)
	r.h.must(err)
	r.running = d
	r.h.must(d.WaitReady(r.h.ctx, 60*time.Second))
}

// kill ends the daemon with SIGKILL.
func (r *hookRig) kill() {
	r.h.t.Helper()
	d := r.running
	r.running = nil
	r.h.must(d.Kill())
}

// fleetOf makes clusters clusters in a set bound to every namespace and
// returns their names.
func fleetOf(h *harness, clusters int, namespaces []string) []string {
	set := h.name("set")
	h.must(h.hub.CreateExclusiveSet(h.ctx, set))
	for _, ns := range namespaces {
		h.must(h.hub.Bind(h.ctx, ns, set, true))
	}
	var names []string
	for i := range clusters {
		names = append(names, h.name(fmt.Sprintf("c%02d", i)))
		h.cluster(names[i], set, nil)
	}
	return names
}

// bumpVersions changes every cluster's Kubernetes version, rounds times:
// each change is a profile.updated for every namespace.
func bumpVersions(h *harness, clusters []string, rounds int) {
	for round := range rounds {
		for _, c := range clusters {
			h.must(h.hub.UpdateClusterStatus(h.ctx, c, func(st *clusterv1.ManagedClusterStatus) {
				st.Version.Kubernetes = fmt.Sprintf("v1.3%d.%d", round, rand.IntN(100))
			}))
		}
	}
}

// expectCurrent waits until the receiver has every profile's current
// resourceVersion.
func (r *hookRig) expectCurrent(namespaces []string, clusters []string) {
	r.h.t.Helper()
	testutil.Eventually(r.h.t, 60*time.Second, 50*time.Millisecond, func() error {
		for _, ns := range namespaces {
			ps, err := r.h.hub.ProfilesIn(r.h.ctx, ns)
			if err != nil {
				return err
			}
			if len(ps) != len(clusters) {
				return fmt.Errorf("%d profiles in %s", len(ps), ns)
			}
			for name, p := range ps {
				rv, _ := strconv.ParseInt(p.ResourceVersion, 10, 64)
				if !r.recv.has(ns+"/"+name, rv) {
					return fmt.Errorf("%s/%s: resourceVersion %d not received", ns, name, rv)
				}
			}
		}
		return nil
	}, "the receiver has every profile's current state")
}

// TestWebhookConcurrentOrderPerKey runs the daemon with a webhook sink
// whose receiver answers after a random delay of up to 20 ms, for 16
// clusters in two namespaces whose versions change three times: requests
// of different keys are in flight side by side, up to the concurrency,
// while every (namespace, cluster) gets its events one at a time and in
// order.
func TestWebhookConcurrentOrderPerKey(t *testing.T) {
	const concurrency = 8
	h := newHarnessWithoutSyncer(t)
	namespaces := h.namespaces("far-a", "far-b")
	recv := newKeyedReceiver(t, func() time.Duration { return time.Duration(rand.IntN(20)) * time.Millisecond })
	rig := newHookRig(t, h, recv, concurrency, namespaces)
	rig.start()
	clusters := fleetOf(h, 16, namespaces)
	bumpVersions(h, clusters, 3)
	rig.expectCurrent(namespaces, clusters)
	recv.check(t, concurrency)
	recv.mu.Lock()
	t.Logf("%d requests, at most %d in flight at once", len(recv.all), recv.most)
	recv.mu.Unlock()
}

// spooledIDs returns the ids of the events in the segment files of a
// webhook spool directory: what a crash leaves to deliver (and what was
// delivered but not yet removed).
func spooledIDs(t *testing.T, dir string) []string {
	t.Helper()
	segs, err := filepath.Glob(filepath.Join(dir, "*.seg"))
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, seg := range segs {
		f, err := os.Open(seg)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(nil, 16<<20)
		for sc.Scan() {
			var e struct {
				ID string `json:"id"`
			}
			if json.Unmarshal(sc.Bytes(), &e) == nil && e.ID != "" {
				ids = append(ids, e.ID)
			}
		}
		_ = f.Close()
	}
	return ids
}

// TestWebhookKilledMidBurst SIGKILLs the daemon while its webhook sink
// has a burst of events in flight to a slow receiver (40 to 100 ms per
// answer, 8 at a time): 60 profiles created, then their versions changed
// three times, 300 events and more, killed after 64 were received, while the
// receiver holds the first event of one cluster, so that the events of
// the others were delivered out of order past it. After the restart every
// event the spool held is delivered, the held one and those the restart's
// resync does not bring again (their profile has changed since) included:
// none is lost, every key's events still come in order, and a duplicate
// only ever repeats an id.
func TestWebhookKilledMidBurst(t *testing.T) {
	const concurrency = 8
	h := newHarnessWithoutSyncer(t)
	namespaces := h.namespaces("burst-a", "burst-b")
	recv := newKeyedReceiver(t, func() time.Duration { return time.Duration(40+rand.IntN(60)) * time.Millisecond })
	held := namespaces[0] + "/" + h.name("c00")
	var holding atomic.Bool
	holding.Store(true)
	recv.answer = func(_ int, key string, r *http.Request) (int, http.Header) {
		if key == held && holding.Load() {
			<-r.Context().Done() // until the sender is killed
		}
		return http.StatusNoContent, nil
	}
	rig := newHookRig(t, h, recv, concurrency, namespaces)
	// The held request must still be in flight when the daemon is
	// killed: a timeout would make the sender probe that one event, and
	// nothing else would be delivered (on a loaded machine the burst can
	// take longer than the default 10 s to reach the kill).
	rig.conf.Sinks[0].Webhook.Timeout = metav1.Duration{Duration: 5 * time.Minute}
	rig.start()
	clusters := fleetOf(h, 30, namespaces)
	bumpVersions(h, clusters, 3)
	// The held event stops the sender at its window (16 events per
	// request of concurrency, from the held one on), less the held key's
	// own events in it. How many events a profile's creation makes
	// depends on how the informers coalesce its updates (two or three
	// here), so past half the window is what can be counted on.
	const killAfter = 16 * concurrency / 2
	testutil.Eventually(t, 90*time.Second, 5*time.Millisecond, func() error {
		if n := len(recv.accepted()); n < killAfter {
			return fmt.Errorf("%d events received", n)
		}
		return nil
	}, "the burst under way")
	rig.kill()
	holding.Store(false)
	spooled := spooledIDs(t, rig.spool())
	took := recv.accepted()
	pending := slices.DeleteFunc(slices.Clone(spooled), func(id string) bool { return took[id] })
	if len(pending) < concurrency {
		t.Fatalf("the kill came after the burst: %d of the %d spooled events were not delivered", len(pending), len(spooled))
	}
	t.Logf("killed with %d events received, %d of %d spooled not delivered", len(took), len(pending), len(spooled))

	rig.start()
	rig.expectCurrent(namespaces, clusters)
	testutil.Eventually(t, 30*time.Second, 50*time.Millisecond, func() error {
		took := recv.accepted()
		for _, id := range spooled {
			if !took[id] {
				return fmt.Errorf("spooled event %s not delivered", id)
			}
		}
		return nil
	}, "every event spooled at the kill delivered")
	recv.check(t, concurrency)
}

// TestWebhookRetryAfterHoldsEveryKey: the receiver throttles the first
// four requests, one per cluster, with 429 and Retry-After: 2, all at
// once. No request of any cluster comes before the two seconds pass, the
// first one after goes alone, and then every event is delivered.
func TestWebhookRetryAfterHoldsEveryKey(t *testing.T) {
	const concurrency = 4
	h := newHarnessWithoutSyncer(t)
	namespaces := h.namespaces("throttle")
	recv := newKeyedReceiver(t, nil)
	var (
		throttleMu sync.Mutex
		held       int
		throttled  time.Time
		release    = make(chan struct{})
	)
	recv.answer = func(n int, _ string, r *http.Request) (int, http.Header) {
		if n >= concurrency {
			return http.StatusNoContent, nil
		}
		throttleMu.Lock()
		if held++; held == concurrency {
			// Every request the sink may have in flight is here: answer
			// them all at once.
			throttled = time.Now()
			close(release)
		}
		throttleMu.Unlock()
		select {
		case <-release:
		case <-r.Context().Done():
		}
		return http.StatusTooManyRequests, http.Header{"Retry-After": {"2"}}
	}
	rig := newHookRig(t, h, recv, concurrency, namespaces)
	rig.start()
	clusters := fleetOf(h, 10, namespaces)
	rig.expectCurrent(namespaces, clusters)

	throttleMu.Lock()
	at := throttled
	throttleMu.Unlock()
	if at.IsZero() {
		t.Fatalf("never %d requests in flight at once", concurrency)
	}
	recv.mu.Lock()
	all := slices.Clone(recv.all)
	recv.mu.Unlock()
	slices.SortFunc(all, func(a, b arrival) int { return a.at.Compare(b.at) })
	after := all[concurrency:]
	if early := after[0].at.Sub(at); early < 2*time.Second {
		t.Errorf("a request came %s after %d requests were answered 429 with Retry-After: 2", early, concurrency)
	}
	if len(after) > 1 && after[1].at.Before(after[0].done) {
		t.Errorf("the first request after the pause did not go alone")
	}
	var codes []string
	for _, a := range all[:concurrency] {
		codes = append(codes, strconv.Itoa(a.code))
	}
	if strings.Join(codes, ",") != "429,429,429,429" {
		t.Errorf("the first answers were %v, want four 429s", codes)
	}
	recv.check(t, concurrency)
}
