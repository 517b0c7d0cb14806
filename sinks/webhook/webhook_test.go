package webhook

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"io"
	"log"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/events"
	"github.com/hubsync/hubsync/stream"
	"github.com/hubsync/hubsync/stream/streamtest"
)

// The test vector of the Standard Webhooks specification's libraries.
func TestSignStandardWebhooksVector(t *testing.T) {
	got, err := Sign("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "msg_p5jXN8AQM9LWM0D4loKWxJek", "1614265330", []byte(`{"test": 2432232314}`))
	if err != nil {
		t.Fatal(err)
	}
	if want := "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="; got != want {
		t.Errorf("Sign = %s, want %s", got, want)
	}
}

func TestSignVerifyRoundTrip(t *testing.T) {
	oldSecret, newSecret, other := newSecret(t), newSecret(t), newSecret(t)
	body := []byte(`{"specversion":"1.0"}`)
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	s1, err := Sign(oldSecret, "id1", ts, body)
	if err != nil {
		t.Fatal(err)
	}
	s2, err := Sign(newSecret, "id1", ts, body)
	if err != nil {
		t.Fatal(err)
	}
	header := s1 + " " + s2
	// During a rotation the sender signs with both; a receiver knowing
	// either, or both, accepts.
	for _, secrets := range [][]string{{oldSecret}, {newSecret}, {other, newSecret}, {oldSecret, newSecret}} {
		if err := Verify(secrets, "id1", ts, body, header); err != nil {
			t.Errorf("Verify with %d secrets: %v", len(secrets), err)
		}
	}
	if err := Verify([]string{other}, "id1", ts, body, header); !errors.Is(err, ErrNoSignature) {
		t.Errorf("Verify with an unknown secret = %v, want ErrNoSignature", err)
	}
	// The secret without its prefix is the same secret.
	if err := Verify([]string{strings.TrimPrefix(newSecret, SecretPrefix)}, "id1", ts, body, s2); err != nil {
		t.Errorf("Verify without whsec_: %v", err)
	}
	if _, err := Sign("whsec_not base64!", "id", ts, body); err == nil {
		t.Error("Sign accepted a malformed secret")
	}
}

func TestVerifyRejects(t *testing.T) {
	secret := newSecret(t)
	body := []byte(`{"a":1}`)
	now := time.Now()
	ts := strconv.FormatInt(now.Unix(), 10)
	sig, err := Sign(secret, "id1", ts, body)
	if err != nil {
		t.Fatal(err)
	}
	old := strconv.FormatInt(now.Add(-10*time.Minute).Unix(), 10)
	oldSig, _ := Sign(secret, "id1", old, body)
	future := strconv.FormatInt(now.Add(10*time.Minute).Unix(), 10)
	futureSig, _ := Sign(secret, "id1", future, body)
	for _, tc := range []struct {
		name, id, ts, header string
		body                 []byte
		want                 error
	}{
		{"tampered body", "id1", ts, sig, []byte(`{"a":2}`), ErrNoSignature},
		{"other id", "id2", ts, sig, body, ErrNoSignature},
		{"other timestamp", "id1", strconv.FormatInt(now.Unix()+1, 10), sig, body, ErrNoSignature},
		{"old timestamp", "id1", old, oldSig, body, ErrTimestamp},
		{"future timestamp", "id1", future, futureSig, body, ErrTimestamp},
		{"wrong version", "id1", ts, "v2" + strings.TrimPrefix(sig, "v1"), body, ErrNoSignature},
		{"empty header", "id1", ts, "", body, ErrNoSignature},
		{"timestamp not a number", "id1", "yesterday", sig, body, nil},
		{"empty id", "", ts, sig, body, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Verify([]string{secret}, tc.id, tc.ts, tc.body, tc.header)
			if err == nil {
				t.Fatal("Verify accepted it")
			}
			if tc.want != nil && !errors.Is(err, tc.want) {
				t.Errorf("Verify = %v, want %v", err, tc.want)
			}
		})
	}
	if err := Verify([]string{secret}, "id1", ts, body, sig); err != nil {
		t.Errorf("the untampered request: %v", err)
	}
}

// The body is the NATS CloudEvent, in structured mode, signed with every
// configured secret.
func TestDeliverSendsSignedCloudEvent(t *testing.T) {
	rc := &receiver{}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	oldSecret, newSecret := newSecret(t), newSecret(t)
	e := newEnv(t, srv.URL, oldSecret, newSecret)
	s := e.start()
	c := streamtest.Profile(stream.ProfileCreated, "team-a", "c1", "10")
	if err := s.Deliver(t.Context(), []stream.Change{c}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the event", func() bool { return len(rc.delivered()) == 1 })
	got := rc.delivered()[0]
	want, err := events.Encode(c, testSource)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.body, want) {
		t.Errorf("body:\n%s\nwant the NATS event:\n%s", got.body, want)
	}
	if got.contentType != "application/cloudevents+json" {
		t.Errorf("Content-Type = %q", got.contentType)
	}
	if got.id != events.ID(c) {
		t.Errorf("webhook-id = %q, want the event id %q", got.id, events.ID(c))
	}
	if ts, _ := strconv.ParseInt(got.ts, 10, 64); time.Since(time.Unix(ts, 0)).Abs() > time.Minute {
		t.Errorf("webhook-timestamp %s is not now", got.ts)
	}
	if n := len(strings.Fields(got.sig)); n != 2 {
		t.Errorf("webhook-signature has %d signatures, want one per secret: %q", n, got.sig)
	}
	// A receiver still on the old secret, and one already on the new one,
	// both accept: rotation without downtime.
	for _, secret := range []string{oldSecret, newSecret} {
		if err := Verify([]string{secret}, got.id, got.ts, got.body, got.sig); err != nil {
			t.Errorf("Verify: %v", err)
		}
	}
	if got.auth != "" {
		t.Errorf("Authorization %q sent without a bearer token file", got.auth)
	}
}

func TestSecretsFileReread(t *testing.T) {
	rc := &receiver{}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	oldSecret, newSecret := newSecret(t), newSecret(t)
	e := newEnv(t, srv.URL, oldSecret)
	e.opts.secretTTL = 0 // read before every attempt (TestSecretsFileCache covers the TTL)
	s := e.start()
	if err := s.Deliver(t.Context(), []stream.Change{streamtest.Profile(stream.ProfileCreated, "ns", "c1", "1")}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the first event", func() bool { return len(rc.delivered()) == 1 })
	e.hide(newSecret)
	e.writeFile("secrets", "# rotated\n\n"+newSecret+"\n")
	if err := s.Deliver(t.Context(), []stream.Change{streamtest.Profile(stream.ProfileCreated, "ns", "c2", "2")}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the second event", func() bool { return len(rc.delivered()) == 2 })
	first, second := rc.delivered()[0], rc.delivered()[1]
	if err := Verify([]string{oldSecret}, first.id, first.ts, first.body, first.sig); err != nil {
		t.Errorf("first event with the old secret: %v", err)
	}
	if err := Verify([]string{newSecret}, second.id, second.ts, second.body, second.sig); err != nil {
		t.Errorf("second event with the new secret: %v", err)
	}
	if err := Verify([]string{oldSecret}, second.id, second.ts, second.body, second.sig); err == nil {
		t.Error("second event still signed with the removed secret")
	}
	if !strings.Contains(e.logs.String(), "signing secrets changed") {
		t.Error("the change of secrets was not logged")
	}
}

// TestSecretsFileCache: the secrets file and the bearer token file are
// read at most once per TTL, and again at once after a failed attempt.
func TestSecretsFileCache(t *testing.T) {
	dir := t.TempDir()
	secrets, token := filepath.Join(dir, "secrets"), filepath.Join(dir, "token")
	first, second := newSecret(t), newSecret(t)
	write := func(path, data string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(secrets, first+"\n")
	write(token, "tok-1\n")
	now := time.Unix(1000, 0)
	clock := func() time.Time { return now }
	f := &fileSecrets{path: secrets, ttl: 5 * time.Second, now: clock, log: slog.New(slog.DiscardHandler)}
	tf := &tokenFile{path: token, ttl: 5 * time.Second, now: clock}
	read := func() (string, string) {
		t.Helper()
		keys, err := f.keys(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		tok, err := tf.token()
		if err != nil {
			t.Fatal(err)
		}
		return base64.StdEncoding.EncodeToString(keys[0]), tok
	}
	want := func(secret string) string { return strings.TrimPrefix(secret, "whsec_") }
	if k, tok := read(); k != want(first) || tok != "tok-1" {
		t.Fatalf("first read: key %v token %q", k == want(first), tok)
	}
	write(secrets, second+"\n")
	write(token, "tok-2\n")
	for _, step := range []struct {
		name    string
		advance time.Duration
		stale   bool
		key     string
		tok     string
	}{
		{"within the TTL: cached", 4 * time.Second, false, first, "tok-1"},
		{"TTL passed: read again", 2 * time.Second, false, second, "tok-2"},
		{"failed attempt: read again at once", 0, true, first, "tok-1"},
	} {
		if step.stale {
			write(secrets, first+"\n")
			write(token, "tok-1\n")
			f.stale()
			tf.stale()
		}
		now = now.Add(step.advance)
		if k, tok := read(); k != want(step.key) || tok != step.tok {
			t.Errorf("%s: got the expected key: %v, token %q, want %q", step.name, k == want(step.key), tok, step.tok)
		}
	}
}

func TestSecretRef(t *testing.T) {
	rc := &receiver{}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	first, second := newSecret(t), newSecret(t)
	e := newEnv(t, srv.URL)
	e.hide(first, second)
	kube := fake.NewClientset(&corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: "hubsync", Name: "hook"},
		Data:       map[string][]byte{"secrets": []byte(first + "\n")},
	})
	e.deps.Kube = kube
	e.cfg.Webhook.SecretsFile = ""
	e.cfg.Webhook.SecretRef = &config.SecretKeyRef{Namespace: "hubsync", Name: "hook", Key: config.DefaultWebhookSecrets}
	// The sender reads the clock from its own goroutine.
	var clock atomic.Int64
	now := time.Now()
	clock.Store(now.UnixNano())
	e.opts.now = func() time.Time { return time.Unix(0, clock.Load()) }
	e.opts.secretTTL = time.Minute
	s := e.start()
	deliver := func(cluster string) received {
		t.Helper()
		n := len(rc.delivered())
		if err := s.Deliver(t.Context(), []stream.Change{streamtest.Profile(stream.ProfileCreated, "ns", cluster, "1")}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the event", func() bool { return len(rc.delivered()) == n+1 })
		return rc.delivered()[n]
	}
	verify := func(r received, secret string) error { return Verify([]string{secret}, r.id, r.ts, r.body, r.sig) }

	if err := verify(deliver("c1"), first); err != nil {
		t.Fatalf("signed with the Secret's key: %v", err)
	}
	sec, err := kube.CoreV1().Secrets("hubsync").Get(t.Context(), "hook", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sec.Data["secrets"] = []byte(second + "\n")
	if _, err := kube.CoreV1().Secrets("hubsync").Update(t.Context(), sec, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Within the cache's lifetime the Secret is not read again.
	if err := verify(deliver("c2"), first); err != nil {
		t.Errorf("within the cache lifetime: %v", err)
	}
	clock.Store(now.Add(2 * time.Minute).UnixNano())
	if err := verify(deliver("c3"), second); err != nil {
		t.Errorf("after the cache expired: %v", err)
	}
	if err := kube.CoreV1().Secrets("hubsync").Delete(t.Context(), "hook", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	clock.Store(now.Add(4 * time.Minute).UnixNano())
	// The API failing keeps the last secrets in use.
	if err := verify(deliver("c4"), second); err != nil {
		t.Errorf("with the Secret gone: %v", err)
	}
	if !strings.Contains(e.logs.String(), "cannot re-read webhook signing secrets") {
		t.Error("the failed re-read was not logged")
	}
}

// A receiver failing with 500 gets the same event, with the same id,
// until it takes it, then the following ones of its key in order.
func TestRetriesServerErrorsInOrder(t *testing.T) {
	rc := &receiver{handle: func(n int, _ *http.Request) (int, http.Header) {
		if n < 3 {
			return http.StatusInternalServerError, nil
		}
		return http.StatusNoContent, nil
	}}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	secret := newSecret(t)
	e := newEnv(t, srv.URL, secret)
	s := e.start()
	changes := []stream.Change{
		streamtest.Profile(stream.ProfileCreated, "ns", "a", "1"),
		streamtest.Credential(stream.CredentialSynced, "ns", "b", "msa", "2"),
	}
	if err := s.Deliver(t.Context(), changes); err != nil {
		t.Fatalf("Deliver failed while the endpoint fails: %v", err)
	}
	next := streamtest.Profile(stream.ProfileUpdated, "ns", "a", "3")
	if err := s.Deliver(t.Context(), []stream.Change{next}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "all three events", func() bool { return len(rc.delivered()) == 3 })
	want := perKeyOf([]stream.Change{changes[0], next}, changes[1:])
	if got := perKey(t, rc.delivered()); !maps.EqualFunc(got, want, slices.Equal) {
		t.Errorf("delivered per key:\n%v\nwant\n%v", got, want)
	}
	// Every attempt of a key repeats its first undelivered event, id and
	// all, until the endpoint takes it.
	all := rc.all()
	if got := perKey(t, all); !maps.EqualFunc(got, want, func(attempts, delivered []string) bool {
		return slices.Equal(slices.Compact(slices.Clone(attempts)), delivered)
	}) {
		t.Errorf("attempts per key:\n%v\nwant each event repeated until taken:\n%v", got, want)
	}
	for i, r := range all {
		if err := Verify([]string{secret}, r.id, r.ts, r.body, r.sig); err != nil {
			t.Errorf("request %d: %v", i, err)
		}
	}
	// A delivered event leaves the spool after its metrics are updated.
	waitFor(t, "an empty spool", func() bool { return e.metric("hubsync_webhook_spool_events", nil) == 0 })
	if v := e.metric("hubsync_webhook_requests_total", map[string]string{"code": "500"}); v != 3 {
		t.Errorf("requests_total{code=500} = %v, want 3", v)
	}
	if v := e.metric("hubsync_webhook_requests_total", map[string]string{"code": "204"}); v != 3 {
		t.Errorf("requests_total{code=204} = %v, want 3", v)
	}
	if v := e.metric("hubsync_webhook_delivery_duration_seconds", nil); v != 3 {
		t.Errorf("delivery_seconds count = %v, want 3", v)
	}
}

func TestRetryAfterHonoured(t *testing.T) {
	rc := &receiver{handle: func(n int, _ *http.Request) (int, http.Header) {
		if n == 0 {
			return http.StatusTooManyRequests, http.Header{"Retry-After": {"1"}}
		}
		return http.StatusOK, nil
	}}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	e := newEnv(t, srv.URL)
	s := e.start()
	if err := s.Deliver(t.Context(), []stream.Change{streamtest.Profile(stream.ProfileCreated, "ns", "a", "1")}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the retry", func() bool { return len(rc.delivered()) == 1 })
	all := rc.all()
	if len(all) != 2 {
		t.Fatalf("%d requests, want 2", len(all))
	}
	// The backoff alone would retry after a few milliseconds.
	if gap := all[1].at.Sub(all[0].answered); gap < time.Second {
		t.Errorf("retried %s after a 429 with Retry-After: 1", gap)
	}
	if all[0].id != all[1].id {
		t.Errorf("the retry has webhook-id %s, the first attempt %s", all[1].id, all[0].id)
	}
}

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"1", time.Second, true},
		{" 120 ", 2 * time.Minute, true},
		{"0", 0, true},
		{"3600", 5 * time.Minute, true},
		{"99999999999999999999", 0, false},
		{now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second, true},
		{now.Add(time.Hour).Format(http.TimeFormat), 5 * time.Minute, true},
		{now.Add(-time.Hour).Format(http.TimeFormat), 0, true},
		{"-1", 0, false},
		{"soon", 0, false},
		{"", 0, false},
	} {
		got, ok := parseRetryAfter(tc.in, now, 5*time.Minute)
		if got != tc.want || ok != tc.ok {
			t.Errorf("parseRetryAfter(%q) = %s, %v; want %s, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

func TestBackoff(t *testing.T) {
	ms := time.Millisecond
	tests := []struct {
		name      string
		base, max time.Duration
		// jitter is the random part as a fraction of its range, half the
		// step: 0 gives the least delay, 1 the most.
		jitter float64
		want   []time.Duration
	}{
		{name: "least: half of each step", base: 200 * ms, max: 1600 * ms, jitter: 0,
			want: []time.Duration{100 * ms, 200 * ms, 400 * ms, 800 * ms, 800 * ms, 800 * ms}},
		{name: "most: the whole step", base: 200 * ms, max: 1600 * ms, jitter: 1,
			want: []time.Duration{200 * ms, 400 * ms, 800 * ms, 1600 * ms, 1600 * ms}},
		{name: "capped between steps", base: 200 * ms, max: 500 * ms, jitter: 0,
			want: []time.Duration{100 * ms, 200 * ms, 250 * ms, 250 * ms}},
		{name: "a base above the cap is capped", base: time.Second, max: 400 * ms, jitter: 0,
			want: []time.Duration{200 * ms, 200 * ms}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := defaultOptions()
			o.retryBase, o.retryMax = tt.base, tt.max
			o.jitter = func(n int64) int64 { return int64(float64(n-1) * tt.jitter) }
			b := o.newBackoff()
			for i, want := range tt.want {
				if got := o.delay(&b); got != want {
					t.Errorf("delay after failure %d = %s, want %s", i+1, got, want)
				}
			}
		})
	}
}

func TestGoneDisables(t *testing.T) {
	rc, e := newAnsweringEnv(t, http.StatusGone)
	s := e.start()
	if v := e.metric("hubsync_webhook_disabled", nil); v != 0 {
		t.Fatalf("disabled = %v at start", v)
	}
	// Two events of one cluster: the second waits for the first.
	batch := []stream.Change{streamtest.Profile(stream.ProfileCreated, "ns", "a", "1"), streamtest.Profile(stream.ProfileUpdated, "ns", "a", "2")}
	if err := s.Deliver(t.Context(), batch); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the sink to be disabled", func() bool { return e.metric("hubsync_webhook_disabled", nil) == 1 })
	// The second event, spooled with the first, is dropped unsent.
	waitFor(t, "an empty spool", func() bool { return e.metric("hubsync_webhook_spool_events", nil) == 0 })
	for range 3 {
		if err := s.Deliver(t.Context(), []stream.Change{streamtest.Profile(stream.ProfileUpdated, "ns", "a", "2")}); err != nil {
			t.Fatalf("Deliver while disabled: %v", err)
		}
		if err := s.Resync(t.Context(), batch); err != nil {
			t.Fatalf("Resync while disabled: %v", err)
		}
	}
	if _, n := s.spool.size(); n != 0 {
		t.Errorf("%d events spooled while disabled", n)
	}
	if n := len(rc.all()); n != 1 {
		t.Errorf("%d requests, want 1", n)
	}
	if n := strings.Count(e.logs.String(), "410 Gone: the sink is disabled"); n != 1 {
		t.Errorf("the 410 was logged %d times, want once", n)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	// Recreating the sink (a configuration reload) enables it again.
	rc.setHandle(nil)
	s2 := e.start()
	if v := e.metric("hubsync_webhook_disabled", nil); v != 0 {
		t.Errorf("disabled = %v after the sink was recreated", v)
	}
	if err := s2.Deliver(t.Context(), []stream.Change{streamtest.Profile(stream.ProfileUpdated, "ns", "a", "3")}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a delivery", func() bool { return len(rc.delivered()) == 1 })
}

func TestRedirectNotFollowed(t *testing.T) {
	target := &receiver{}
	tsrv := httptest.NewServer(target)
	defer tsrv.Close()
	rc := &receiver{handle: func(int, *http.Request) (int, http.Header) {
		return http.StatusTemporaryRedirect, http.Header{"Location": {tsrv.URL + "/elsewhere?key=abc"}}
	}}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	e := newEnv(t, srv.URL)
	s := e.start()
	if err := s.Deliver(t.Context(), []stream.Change{streamtest.Profile(stream.ProfileCreated, "ns", "a", "1")}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a retry", func() bool { return len(rc.all()) >= 3 })
	if n := len(target.all()); n != 0 {
		t.Errorf("the redirect was followed: the target got %d requests", n)
	}
	logs := e.logs.String()
	if !strings.Contains(logs, "redirects are not followed") {
		t.Errorf("the failure does not say redirects are not followed:\n%s", logs)
	}
	if strings.Contains(logs, "key=abc") {
		t.Error("the Location's query was logged")
	}
	waitFor(t, "requests_total{code=307}", func() bool {
		return e.metric("hubsync_webhook_requests_total", map[string]string{"code": "307"}) >= 3
	})
	if _, n := s.spool.size(); n != 1 {
		t.Errorf("spool holds %d events, want the undelivered one", n)
	}
}

// Events spooled while the endpoint is down survive a restart and are
// sent first, in order per key, once each.
func TestSpoolSurvivesRestart(t *testing.T) {
	rc, e := newAnsweringEnv(t, http.StatusBadGateway)
	a := e.start()
	var batches [][]stream.Change
	for i := range 5 {
		batches = append(batches, []stream.Change{
			streamtest.Profile(stream.ProfileUpdated, "ns", "a", strconv.Itoa(10+i)),
			streamtest.Credential(stream.CredentialRotated, "ns", "b", "msa", strconv.Itoa(20+i)),
		})
	}
	deliverAll(t, a, batches...)
	waitFor(t, "a few failed attempts", func() bool { return len(rc.all()) >= 3 })
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if len(rc.delivered()) != 0 {
		t.Fatal("delivered while the endpoint was down")
	}
	// A write interrupted by a crash leaves a temporary file: not an event.
	if err := os.WriteFile(filepath.Join(e.spoolDir, ".00000000000000000099.seg.tmp-1"), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}

	b := e.start()
	if v := e.metric("hubsync_webhook_spool_events", nil); v != 10 {
		t.Errorf("spool_events = %v after the restart, want 10", v)
	}
	rc.setHandle(nil)
	last := streamtest.Profile(stream.ProfileUpdated, "ns", "a", "99")
	if err := b.Deliver(t.Context(), []stream.Change{last}); err != nil {
		t.Fatal(err)
	}
	want := perKeyOf(append(batches, []stream.Change{last})...)
	waitFor(t, "every event", func() bool { return len(rc.delivered()) >= 11 })
	waitFor(t, "an empty spool", func() bool { _, n := b.spool.size(); return n == 0 })
	if got := perKey(t, rc.delivered()); !maps.EqualFunc(got, want, slices.Equal) {
		t.Errorf("delivered, in order per key:\n%v\nwant\n%v", got, want)
	}
	if _, err := os.Stat(filepath.Join(e.spoolDir, ".00000000000000000099.seg.tmp-1")); !os.IsNotExist(err) {
		t.Errorf("leftover temporary file: %v", err)
	}
	// Delivered segments go once what the endpoint was told is saved
	// after them, within a second.
	waitFor(t, "no segments left after delivery", func() bool {
		return len(e.segments()) == 0
	})
}

// A partly sent segment resumes at its cursor after a restart: the events
// the endpoint took, whichever they were, are not sent again.
func TestSpoolResumesAtCursor(t *testing.T) {
	rc := &receiver{handle: func(n int, _ *http.Request) (int, http.Header) {
		if n < 2 {
			return http.StatusOK, nil
		}
		return http.StatusInternalServerError, nil
	}}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	e := newEnv(t, srv.URL)
	a := e.start()
	var batch []stream.Change
	for i := range 4 {
		batch = append(batch, streamtest.Profile(stream.ProfileCreated, "ns", "c"+strconv.Itoa(i), "1"))
	}
	if err := a.Deliver(t.Context(), batch); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "two deliveries and a failure", func() bool { return len(rc.all()) >= 3 })
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	rc.setHandle(nil)
	e.start()
	waitFor(t, "the rest", func() bool { return len(rc.delivered()) >= 4 })
	waitFor(t, "an empty spool", func() bool { return e.metric("hubsync_webhook_spool_events", nil) == 0 })
	want := []string{events.ID(batch[0]), events.ID(batch[1]), events.ID(batch[2]), events.ID(batch[3])}
	if got := ids(rc.delivered()); !slices.Equal(slices.Sorted(slices.Values(got)), slices.Sorted(slices.Values(want))) {
		t.Errorf("delivered:\n%v\nwant each of\n%v\nonce", got, want)
	}
}

func TestSpoolFullRequestsResync(t *testing.T) {
	rc, e := newAnsweringEnv(t, http.StatusServiceUnavailable)
	e.cfg.Webhook.Spool.MaxBytes = 3000
	ctl := &fakeControl{}
	s := e.start()
	s.Attach(ctl)
	var spooled []string
	for i := range 20 {
		c := streamtest.Profile(stream.ProfileUpdated, "ns", "c"+strconv.Itoa(i), "1")
		if err := s.Deliver(t.Context(), []stream.Change{c}); err != nil {
			t.Fatalf("Deliver with a full spool: %v", err)
		}
		if bytes, _ := s.spool.size(); bytes > 3000 {
			t.Fatalf("spool grew to %d bytes, beyond its 3000", bytes)
		}
		if e.metric("hubsync_webhook_spool_dropped_total", nil) == 0 {
			spooled = append(spooled, events.ID(c))
		}
	}
	if len(spooled) == 0 || len(spooled) == 20 {
		t.Fatalf("%d of 20 events spooled; the test needs some spooled and some dropped", len(spooled))
	}
	if v := e.metric("hubsync_webhook_spool_dropped_total", nil); v != float64(20-len(spooled)) {
		t.Errorf("spool_dropped_total = %v, want %d", v, 20-len(spooled))
	}
	if n := strings.Count(e.logs.String(), "webhook spool full"); n != 1 {
		t.Errorf("the overflow was logged %d times, want once", n)
	}
	if n := ctl.resyncs.Load(); n != 0 {
		t.Errorf("%d resyncs requested while the endpoint is down", n)
	}

	rc.setHandle(nil)
	waitFor(t, "a resync request", func() bool { return ctl.resyncs.Load() == 1 })
	if got := ids(rc.delivered()); !slices.Equal(slices.Sorted(slices.Values(got)), slices.Sorted(slices.Values(spooled))) {
		t.Errorf("delivered %v, want the spooled %v", got, spooled)
	}
	// The fan-out answers with a resync, which ends the episode: no
	// further request, and new changes are spooled again.
	var snap []stream.Change
	for i := range 3 {
		snap = append(snap, streamtest.Profile(stream.ProfileUpdated, "ns", "c"+strconv.Itoa(i), "2"))
	}
	if err := s.Resync(t.Context(), snap); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the resync", func() bool { _, n := s.spool.size(); return n == 0 })
	extra := streamtest.Profile(stream.ProfileUpdated, "ns", "c0", "3")
	if err := s.Deliver(t.Context(), []stream.Change{extra}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the resync and the new change", func() bool {
		return slices.Contains(ids(rc.delivered()), events.ID(extra))
	})
	if n := ctl.resyncs.Load(); n != 1 {
		t.Errorf("%d resyncs requested, want 1", n)
	}
}

// Everything the endpoint was told of and that is gone from the snapshot
// is announced as removed, also across a restart.
func TestResyncAnnouncesRemovals(t *testing.T) {
	rc, e := newServedEnv(t)
	s := e.start()
	snap1 := []stream.Change{
		streamtest.Profile(stream.ProfileUpdated, "ns", "a", "5"),
		streamtest.Credential(stream.CredentialSynced, "ns", "a", "m1", "6"),
		streamtest.Credential(stream.CredentialSynced, "ns", "a", "m2", "7"),
		streamtest.Profile(stream.ProfileUpdated, "ns", "b", "8"),
	}
	if err := s.Resync(t.Context(), snap1); err != nil {
		t.Fatal(err)
	}
	extra := streamtest.Profile(stream.ProfileCreated, "other", "c", "9")
	if err := s.Deliver(t.Context(), []stream.Change{extra}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the first snapshot", func() bool { return len(rc.delivered()) == 5 })

	snap2 := []stream.Change{streamtest.Profile(stream.ProfileUpdated, "ns", "a", "10"), streamtest.Credential(stream.CredentialSynced, "ns", "a", "m1", "6")}
	if err := s.Resync(t.Context(), snap2); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the second snapshot", func() bool { return len(rc.delivered()) == 5+5 })
	got := bySubject(decodedEvents(t, rc.delivered()[5:]))
	want := []string{
		stream.ProfileUpdated + " ns/a", stream.CredentialSynced + " ns/a",
		stream.CredentialRemoved + " ns/a", stream.ProfileDeleted + " ns/b", stream.ProfileDeleted + " other/c",
	}
	if !slices.Equal(typesOf(got), want) {
		t.Fatalf("second resync sent %v, want %v", typesOf(got), want)
	}
	if c := got[2].Data.Credential; c == nil || c.ManagedServiceAccount != "m2" {
		t.Errorf("credential.removed is about %+v, want m2", c)
	}
	// The deletion carries the profile's last resourceVersion, so its id
	// is the one a real deletion would have had.
	if got[3].Data.ResourceVersion != "8" {
		t.Errorf("profile.deleted of b has resourceVersion %q, want 8", got[3].Data.ResourceVersion)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	// What the endpoint was told survives a restart.
	s2 := e.start()
	if err := s2.Resync(t.Context(), nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the removals after the restart", func() bool { return len(rc.delivered()) == 10+2 })
	got = decodedEvents(t, rc.delivered()[10:])
	want = []string{stream.CredentialRemoved + " ns/a", stream.ProfileDeleted + " ns/a"}
	if !slices.Equal(typesOf(got), want) {
		t.Errorf("after the restart sent %v, want %v", typesOf(got), want)
	}
	if got[1].ID != events.ID(stream.Change{Type: stream.ProfileDeleted, Namespace: "ns", Cluster: "a", Name: "a", ResourceVersion: "10"}) {
		t.Errorf("profile.deleted after the restart lost the profile's resourceVersion: %+v", got[1].Data)
	}
	// Nothing more to remove.
	if err := s2.Resync(t.Context(), nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "an empty spool", func() bool { _, n := s2.spool.size(); return n == 0 })
	if n := len(rc.delivered()); n != 12 {
		t.Errorf("an empty resync of an empty endpoint sent %d events", n-12)
	}
}

// A told record must cover events still in the spool even if told.json
// did not get them (a crash between the two writes).
func TestToldRebuiltFromSpool(t *testing.T) {
	rc, e := newAnsweringEnv(t, http.StatusInternalServerError)
	a := e.start()
	if err := a.Deliver(t.Context(), []stream.Change{streamtest.Profile(stream.ProfileCreated, "ns", "a", "1")}); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(e.spoolDir, toldFile)); err != nil {
		t.Fatal(err)
	}
	rc.setHandle(nil)
	b := e.start()
	if err := b.Resync(t.Context(), nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the event and its removal", func() bool { return len(rc.delivered()) == 2 })
	if got := typesOf(decodedEvents(t, rc.delivered())); !slices.Equal(got, []string{stream.ProfileCreated + " ns/a", stream.ProfileDeleted + " ns/a"}) {
		t.Errorf("sent %v", got)
	}
}

func TestEventTypeFilterAppliesToRemovals(t *testing.T) {
	rc, e := newServedEnv(t)
	e.cfg.Filter.EventTypes = []string{stream.ProfileUpdated, stream.CredentialSynced, stream.CredentialRemoved}
	s := e.start()
	if err := s.Resync(t.Context(), []stream.Change{
		streamtest.Profile(stream.ProfileUpdated, "ns", "a", "1"), streamtest.Credential(stream.CredentialSynced, "ns", "a", "m", "2"),
	}); err != nil {
		t.Fatal(err)
	}
	if err := s.Resync(t.Context(), nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "an empty spool", func() bool { _, n := s.spool.size(); return n == 0 })
	if got := typesOf(decodedEvents(t, rc.delivered())); !slices.Equal(got, []string{
		stream.ProfileUpdated + " ns/a", stream.CredentialSynced + " ns/a", stream.CredentialRemoved + " ns/a",
	}) {
		t.Errorf("sent %v; a profile.deleted is not wanted", got)
	}
}

func TestBearerToken(t *testing.T) {
	rc, e := newServedEnv(t)
	tok1, tok2 := newToken(t), newToken(t)
	e.hide(tok1, tok2)
	e.cfg.Webhook.BearerTokenFile = e.writeFile("token", tok1+"\n")
	e.opts.secretTTL = 0 // read before every attempt (TestSecretsFileCache covers the TTL)
	s := e.start()
	if err := s.Deliver(t.Context(), []stream.Change{streamtest.Profile(stream.ProfileCreated, "ns", "a", "1")}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the event", func() bool { return len(rc.delivered()) == 1 })
	if got := rc.delivered()[0].auth; got != "Bearer "+tok1 {
		t.Errorf("Authorization = %q, want the token", got)
	}
	e.writeFile("token", tok2)
	if err := s.Deliver(t.Context(), []stream.Change{streamtest.Profile(stream.ProfileCreated, "ns", "b", "1")}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the second event", func() bool { return len(rc.delivered()) == 2 })
	if got := rc.delivered()[1].auth; got != "Bearer "+tok2 {
		t.Errorf("Authorization after the token changed = %q", got)
	}
}

func TestTLSWithCAFile(t *testing.T) {
	rc := &receiver{}
	srv := httptest.NewUnstartedServer(rc)
	// The untrusting client's handshake failures are expected.
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.StartTLS()
	defer srv.Close()
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})

	// Without the CA the server is not trusted.
	e := newEnv(t, srv.URL)
	untrusted := e.start()
	if err := untrusted.Deliver(t.Context(), []stream.Change{streamtest.Profile(stream.ProfileCreated, "ns", "a", "1")}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a failed attempt", func() bool { return strings.Contains(e.logs.String(), "certificate") })
	if err := untrusted.Close(); err != nil {
		t.Fatal(err)
	}
	if n := len(rc.all()); n != 0 {
		t.Fatalf("the untrusted server got %d requests", n)
	}

	e.cfg.Webhook.CAFile = e.writeFile("ca.pem", string(ca))
	s := e.start()
	waitFor(t, "the spooled event over TLS", func() bool { return len(rc.delivered()) == 1 })
	_ = s

	e.cfg.Webhook.CAFile = e.writeFile("bad.pem", "not a certificate")
	if _, err := newSink(e.cfg, e.deps, e.opts); err == nil {
		t.Error("a CA file without a certificate was accepted")
	}
}

func TestUnencodableChangeSkipped(t *testing.T) {
	rc, e := newServedEnv(t)
	s := e.start()
	bad := streamtest.Profile(stream.ProfileCreated, "", "a", "1")
	good := streamtest.Profile(stream.ProfileCreated, "ns", "b", "1")
	if err := s.Deliver(t.Context(), []stream.Change{bad, good}); err != nil {
		t.Fatalf("Deliver: %v", err)
	}
	waitFor(t, "the good event", func() bool { return len(rc.delivered()) == 1 })
	if got := rc.delivered()[0].id; got != events.ID(good) {
		t.Errorf("delivered %s, want the good event", got)
	}
	if !strings.Contains(e.logs.String(), "cannot encode a change") {
		t.Error("the skipped change was not logged")
	}
}

// Every path that logs an error about secrets or the token, and every
// failed delivery, leaves them out of the logs (newEnv checks the log
// output when the test ends).
func TestNoSecretsInLogs(t *testing.T) {
	rc := &receiver{handle: func(n int, _ *http.Request) (int, http.Header) {
		switch n {
		case 0:
			return http.StatusInternalServerError, nil
		case 1:
			return http.StatusFound, http.Header{"Location": {"https://elsewhere.example/"}}
		case 2:
			return http.StatusTooManyRequests, http.Header{"Retry-After": {"0"}}
		case 3:
			return http.StatusUnauthorized, nil
		}
		return http.StatusGone, nil
	}}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	secret := newSecret(t)
	e := newEnv(t, srv.URL+"/hook?apikey=querysecret", secret)
	e.hide("querysecret")
	tok := newToken(t)
	e.hide(tok)
	tokenFile := e.writeFile("token", tok)
	e.cfg.Webhook.BearerTokenFile = tokenFile
	e.opts.secretTTL = 0 // files read before every attempt
	s := e.start()
	if err := s.Deliver(t.Context(), []stream.Change{streamtest.Profile(stream.ProfileCreated, "ns", "a", "1")}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the sink to be disabled", func() bool { return s.disabled.Load() })
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	// A malformed secrets file is reported by line, not by content.
	rc.setHandle(nil)
	bad := "whsec_" + strings.Repeat("Zm9v", 4) + "!!leaked"
	e.hide(bad, "!!leaked")
	e.writeFile("secrets", secret+"\n"+bad+"\n")
	if _, err := newSink(e.cfg, e.deps, e.opts); err == nil {
		t.Fatal("a malformed secret was accepted")
	} else {
		e.deps.Log.Error("newSink failed", "err", err)
		if !strings.Contains(err.Error(), "line 2") {
			t.Errorf("the error does not say where the bad secret is: %v", err)
		}
	}
	// The files changing under a running sink.
	e.writeFile("secrets", secret+"\n")
	s2 := e.start()
	e.writeFile("secrets", secret+"\n"+bad+"\n")
	if err := os.Remove(tokenFile); err != nil {
		t.Fatal(err)
	}
	if err := s2.Deliver(t.Context(), []stream.Change{streamtest.Profile(stream.ProfileCreated, "ns", "b", "1")}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a failed attempt", func() bool { return strings.Contains(e.logs.String(), "line 2") })
	e.writeFile("secrets", secret+"\n")
	waitFor(t, "the token error", func() bool { return strings.Contains(e.logs.String(), "read bearer token") })
	e.writeFile("token", tok)
	waitFor(t, "the delivery", func() bool { return len(rc.delivered()) == 1 })
	if !strings.Contains(e.logs.String(), "/hook") {
		t.Error("the endpoint's path is not in the logs")
	}
}

func TestMetricsSharedAndForgotten(t *testing.T) {
	rc, e := newServedEnv(t)
	s1 := e.start()
	cfg2 := e.cfg
	hook := *e.cfg.Webhook
	hook.Spool.Directory = filepath.Join(e.dir, "spool2")
	cfg2.Name, cfg2.Webhook = "hook2", &hook
	s2, err := newSink(cfg2, e.deps, e.opts)
	if err != nil {
		t.Fatalf("a second webhook sink on the same registry: %v", err)
	}
	defer s2.Close()
	for _, s := range []*sink{s1, s2} {
		if err := s.Deliver(t.Context(), []stream.Change{streamtest.Profile(stream.ProfileCreated, "ns", s.name, "1")}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "both events", func() bool { return len(rc.delivered()) == 2 })
	waitFor(t, "both spools to drain", func() bool {
		_, n1 := s1.spool.size()
		_, n2 := s2.spool.size()
		return n1 == 0 && n2 == 0
	})
	if err := s1.Close(); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"hubsync_webhook_requests_total", "hubsync_webhook_spool_bytes", "hubsync_webhook_spool_events",
		"hubsync_webhook_disabled", "hubsync_webhook_delivery_duration_seconds"} {
		if _, ok := metric(t, e.reg, name, map[string]string{"sink": "hook"}); ok {
			t.Errorf("%s{sink=hook} still there after Close", name)
		}
		if _, ok := metric(t, e.reg, name, map[string]string{"sink": "hook2"}); !ok {
			t.Errorf("%s{sink=hook2} missing", name)
		}
	}
}

func TestSpoolDirectoryExclusive(t *testing.T) {
	e := newEnv(t, "http://127.0.0.1:1")
	s := e.start()
	if _, err := newSink(e.cfg, e.deps, e.opts); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Errorf("a second sink on the same spool directory: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(e.spoolDir)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o700 {
		t.Errorf("spool directory mode %v, want 0700", st.Mode().Perm())
	}
	s2 := e.start()
	if err := s2.Deliver(t.Context(), []stream.Change{streamtest.Profile(stream.ProfileCreated, "ns", "a", "1")}); err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(e.spoolDir, "*"))
	for _, f := range files {
		st, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o600 {
			t.Errorf("%s has mode %v, want 0600", filepath.Base(f), st.Mode().Perm())
		}
	}
	if err := s2.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s2.Deliver(context.Background(), nil); !errors.Is(err, errClosed) {
		t.Errorf("Deliver after Close = %v", err)
	}
}

func decodedEvents(t *testing.T, rs []received) []events.Event {
	t.Helper()
	out := make([]events.Event, len(rs))
	for i, r := range rs {
		ev, err := events.Decode(r.body)
		if err != nil {
			t.Fatal(err)
		}
		if ev.ID != r.id {
			t.Errorf("webhook-id %s for event %s", r.id, ev.ID)
		}
		out[i] = ev
	}
	return out
}

func typesOf(evs []events.Event) []string {
	out := make([]string, len(evs))
	for i, ev := range evs {
		out[i] = ev.Type + " " + ev.Subject
	}
	return out
}

// Failed attempts are spaced by the exponential backoff.
func TestBackoffBetweenAttempts(t *testing.T) {
	rc, e := newAnsweringEnv(t, http.StatusInternalServerError)
	e.opts.retryBase, e.opts.retryMax = 40*time.Millisecond, 160*time.Millisecond
	e.opts.jitter = func(int64) int64 { return 0 } // half of each delay
	s := e.start()
	if err := s.Deliver(t.Context(), []stream.Change{streamtest.Profile(stream.ProfileCreated, "ns", "a", "1")}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "five attempts", func() bool { return len(rc.all()) >= 5 })
	all := rc.all()
	for i, want := range []time.Duration{20 * time.Millisecond, 40 * time.Millisecond, 80 * time.Millisecond, 80 * time.Millisecond} {
		if gap := all[i+1].at.Sub(all[i].answered); gap < want {
			t.Errorf("attempt %d came %s after the failure before it, want at least %s", i+2, gap, want)
		}
	}
}

// Close lets a request under way finish and records its outcome, so the
// event is not sent again by the next sink.
func TestCloseWaitsForRequestInFlight(t *testing.T) {
	arrived, release, aborted := make(chan struct{}), make(chan struct{}), make(chan struct{})
	rc := &receiver{handle: func(n int, r *http.Request) (int, http.Header) {
		if n > 0 {
			return http.StatusOK, nil
		}
		close(arrived)
		select {
		case <-release:
		case <-r.Context().Done():
			close(aborted)
		}
		return http.StatusOK, nil
	}}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	e := newEnv(t, srv.URL)
	s := e.start()
	first := streamtest.Profile(stream.ProfileCreated, "ns", "a", "1")
	if err := s.Deliver(t.Context(), []stream.Change{first}); err != nil {
		t.Fatal(err)
	}
	<-arrived
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	<-s.stopping
	// An aborted request shows within milliseconds; this only bounds how
	// long the test looks for one.
	select {
	case <-aborted:
		t.Fatal("Close aborted the request in flight")
	case err := <-closed:
		t.Fatalf("Close returned (%v) before the request in flight ended", err)
	case <-time.After(300 * time.Millisecond):
	}
	close(release)
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	s2 := e.start()
	if _, n := s2.spool.size(); n != 0 {
		t.Errorf("%d events still spooled after their delivery", n)
	}
	second := streamtest.Profile(stream.ProfileCreated, "ns", "b", "1")
	if err := s2.Deliver(t.Context(), []stream.Change{second}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the next event", func() bool { return len(rc.delivered()) == 2 })
	if got, want := ids(rc.delivered()), []string{events.ID(first), events.ID(second)}; !slices.Equal(got, want) {
		t.Errorf("delivered %v, want %v", got, want)
	}
}

// A crash after an event was delivered but before what the endpoint was
// told was saved leaves the delivered segment on disk; the next sink
// replays it, so a removal that happens meanwhile is still announced.
func TestToldSurvivesACrashBeforeItIsSaved(t *testing.T) {
	rc, e := newServedEnv(t)
	a := e.start()
	a.toldMu.Lock()
	a.toldSaveEvery = time.Hour // no save but at Close
	a.toldMu.Unlock()
	created := streamtest.Profile(stream.ProfileCreated, "ns", "a", "5")
	if err := a.Deliver(t.Context(), []stream.Change{created}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the event delivered", func() bool { return len(rc.delivered()) == 1 })
	waitFor(t, "the cursor past the segment", func() bool { return len(a.spool.finishedSegments()) == 1 })
	if err := a.spool.saveCursor(true); err != nil {
		t.Fatal(err)
	}
	// What a crash now leaves on disk: a copy of the spool directory.
	crashed := filepath.Join(e.dir, "crashed")
	if err := os.CopyFS(crashed, os.DirFS(e.spoolDir)); err != nil {
		t.Fatal(err)
	}
	delivered, _ := filepath.Glob(filepath.Join(crashed, "*"+segSuffix))
	if len(delivered) != 1 {
		t.Fatalf("segments at the crash: %v, want the delivered one", delivered)
	}
	if told, err := loadTold(filepath.Join(crashed, toldFile)); err == nil && len(told) != 0 {
		t.Fatalf("told.json was saved before the crash (%d records): the test cannot tell", len(told))
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	e.cfg.Webhook.Spool.Directory = crashed
	b := e.start()
	if err := b.Resync(t.Context(), []stream.Change{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the removal", func() bool { return len(rc.delivered()) == 2 })
	if got := typesOf(decodedEvents(t, rc.delivered())); !slices.Equal(got, []string{stream.ProfileCreated + " ns/a", stream.ProfileDeleted + " ns/a"}) {
		t.Errorf("sent %v", got)
	}
	// Once replayed, the delivered segment goes.
	if _, err := os.Stat(delivered[0]); !os.IsNotExist(err) {
		t.Errorf("the delivered segment is still there after the restart: %v", err)
	}
}

// Batches are appended to one tail segment while events keep coming, and
// a segment whose last line a crash of the machine cut short loses only
// that line: the rest is sent, and the endpoint is resynced.
func TestTailSegmentAndTornLine(t *testing.T) {
	rc, e := newAnsweringEnv(t, http.StatusBadGateway)
	a := e.start()
	var batches [][]stream.Change
	for i := range 4 {
		batches = append(batches, []stream.Change{streamtest.Profile(stream.ProfileUpdated, "ns", "c"+strconv.Itoa(i), "1")})
	}
	want := deliverAll(t, a, batches...)
	segs := e.segments()
	if len(segs) != 1 {
		t.Fatalf("4 batches made %d segment files, want them appended to one", len(segs))
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	// The crash: the last event's line is cut short.
	data, err := os.ReadFile(segs[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(segs[0], data[:len(data)-20], 0o600); err != nil {
		t.Fatal(err)
	}
	ctl := &fakeControl{}
	b := e.start()
	b.Attach(ctl)
	if !strings.Contains(e.logs.String(), "cut short by a crash") {
		t.Error("the torn segment was not reported")
	}
	rc.setHandle(nil)
	waitFor(t, "the events before the torn line", func() bool { return len(rc.delivered()) == 3 })
	if got := ids(rc.delivered()); !slices.Equal(slices.Sorted(slices.Values(got)), slices.Sorted(slices.Values(want[:3]))) {
		t.Errorf("delivered %v, want %v", got, want[:3])
	}
	waitFor(t, "a resync for the lost event", func() bool { return ctl.resyncs.Load() == 1 })
}

// Past the memory bound a batch gets a segment file of its own, read back
// from disk to be sent; past the roll size the tail gives way to a new
// segment. Either way every event goes, in order.
func TestSpoolBeyondMemoryAndRoll(t *testing.T) {
	for _, tc := range []struct {
		name             string
		memMax, roll     int64
		wantSegs         int
		wantInMemAtStart bool
	}{
		{name: "nothing in memory: a file per batch", memMax: 1, roll: 1 << 20, wantSegs: 4},
		{name: "tail rolls after each batch", memMax: 1 << 20, roll: 1, wantSegs: 4, wantInMemAtStart: true},
		{name: "one tail", memMax: 1 << 20, roll: 1 << 20, wantSegs: 1, wantInMemAtStart: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rc, e := newAnsweringEnv(t, http.StatusBadGateway)
			s := e.start()
			s.spool.mu.Lock()
			s.spool.memMax, s.spool.rollBytes = tc.memMax, tc.roll
			s.spool.mu.Unlock()
			var batches [][]stream.Change
			for i := range 4 {
				batches = append(batches, []stream.Change{
					streamtest.Profile(stream.ProfileUpdated, "ns", "a", strconv.Itoa(10+i)),
					streamtest.Profile(stream.ProfileUpdated, "ns", "b", strconv.Itoa(10+i)),
				})
			}
			deliverAll(t, s, batches...)
			want := perKeyOf(batches...)
			if segs := e.segments(); len(segs) != tc.wantSegs {
				t.Errorf("%d segment files, want %d", len(segs), tc.wantSegs)
			}
			s.spool.mu.Lock()
			inMem := s.spool.segs[0].entries != nil
			s.spool.mu.Unlock()
			if inMem != tc.wantInMemAtStart {
				t.Errorf("head segment in memory: %v, want %v", inMem, tc.wantInMemAtStart)
			}
			rc.setHandle(nil)
			waitFor(t, "every event", func() bool { return len(rc.delivered()) >= 8 })
			if got := perKey(t, rc.delivered()); !maps.EqualFunc(got, want, slices.Equal) {
				t.Errorf("delivered, in order per key:\n%v\nwant\n%v", got, want)
			}
			waitFor(t, "no segments left after delivery", func() bool {
				return len(e.segments()) == 0
			})
		})
	}
}

// The drop counter has its series from the sink's start, beside the
// spool's gauges, so that rate() and an alert on drops see 0 before the
// first drop.
func TestDroppedSeriesFromStart(t *testing.T) {
	_, e := newServedEnv(t)
	e.start()
	v, ok := metric(t, e.reg, "hubsync_webhook_spool_dropped_total", map[string]string{"sink": e.cfg.Name})
	if !ok || v != 0 {
		t.Fatalf("hubsync_webhook_spool_dropped_total = %v (present %v) before any drop; want a series at 0", v, ok)
	}
}
