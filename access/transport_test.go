package access

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hubsync/hubsync/test/testutil"
)

// fakeCluster is the RoundTripper under the transport: it accepts the
// tokens in valid and refuses any other with 401, recording every request
// it got. onRequest, when set, runs before the answer (to rotate the copy
// while a request is in flight).
type fakeCluster struct {
	mu        sync.Mutex
	valid     map[string]bool
	calls     []fakeCall
	onRequest func(n int)
}

type fakeCall struct {
	auth, body string
}

func (f *fakeCluster) RoundTrip(req *http.Request) (*http.Response, error) {
	var body string
	if req.Body != nil {
		b, err := io.ReadAll(req.Body)
		if err != nil {
			return nil, err
		}
		_ = req.Body.Close()
		body = string(b)
	}
	f.mu.Lock()
	f.calls = append(f.calls, fakeCall{auth: req.Header.Get("Authorization"), body: body})
	n := len(f.calls)
	ok := f.valid[strings.TrimPrefix(req.Header.Get("Authorization"), "Bearer ")]
	hook := f.onRequest
	f.mu.Unlock()
	if hook != nil {
		hook(n)
	}
	status := http.StatusOK
	if !ok {
		status = http.StatusUnauthorized
	}
	return &http.Response{StatusCode: status, Body: io.NopCloser(strings.NewReader(`{"kind":"Status"}`)), Header: http.Header{}, Request: req}, nil
}

func (f *fakeCluster) auths() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, c := range f.calls {
		out = append(out, c.auth)
	}
	return out
}

// fakeCopy is the credential copy on the hub: reads return its token and
// count.
type fakeCopy struct {
	mu    sync.Mutex
	token string
	rv    int
	reads atomic.Int32
	// block, when set, holds every read until it is closed.
	block chan struct{}
}

func (c *fakeCopy) read(context.Context) (copyToken, error) {
	c.reads.Add(1)
	if c.block != nil {
		<-c.block
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.token == "" {
		return copyToken{}, errors.New("secrets \"c1-app\" not found")
	}
	return copyToken{token: c.token, resourceVersion: itoa(c.rv)}, nil
}

func (c *fakeCopy) rotate(token string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.token, c.rv = token, c.rv+1
}

func itoa(n int) string {
	if n == 0 {
		return ""
	}
	var b []byte
	for ; n > 0; n /= 10 {
		b = append([]byte{byte('0' + n%10)}, b...)
	}
	return string(b)
}

// rig is one transport over a fake cluster and a fake copy holding token
// "A" at resourceVersion 1.
type rig struct {
	cluster *fakeCluster
	copy    *fakeCopy
	cred    *credential
	stats   *counters
	rt      http.RoundTripper
	now     time.Time
}

func newRig(valid ...string) *rig {
	r := &rig{cluster: &fakeCluster{valid: map[string]bool{}}, copy: &fakeCopy{token: "A", rv: 1}, stats: &counters{}, now: time.Unix(1000, 0)}
	for _, v := range valid {
		r.cluster.valid[v] = true
	}
	r.cred = &credential{
		secret: "team-ml/c1-app", source: "c1/app", read: r.copy.read, minReread: time.Second,
		now: func() time.Time { return r.now }, stats: r.stats, log: slog.New(slog.DiscardHandler),
	}
	r.rt = &transport{cred: r.cred, next: r.cluster, stats: r.stats}
	return r
}

func (r *rig) get(t *testing.T) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "https://cluster.example/api/v1/namespaces", nil)
	resp, err := r.rt.RoundTrip(req)
	if err != nil {
		t.Fatalf("RoundTrip: %v", err)
	}
	_ = resp.Body.Close()
	return resp.StatusCode
}

func TestTransportRetry(t *testing.T) {
	tests := []struct {
		name string
		// valid are the tokens the cluster accepts; the copy holds "A".
		valid []string
		// setup runs before the request.
		setup     func(r *rig)
		wantCode  int
		wantAuths []string
		wantReads int32
		wantStats Stats
	}{
		{
			name: "accepted: one request with the copy's token", valid: []string{"A"},
			wantCode: 200, wantAuths: []string{"Bearer A"}, wantReads: 1,
		},
		{
			name: "refused, the informer brought B meanwhile: retried once with B, no hub read", valid: []string{"B"},
			setup: func(r *rig) {
				r.cluster.onRequest = func(n int) {
					if n == 1 {
						r.cred.offer(copyToken{token: "B", resourceVersion: "2"})
					}
				}
			},
			wantCode: 200, wantAuths: []string{"Bearer A", "Bearer B"}, wantReads: 1,
			wantStats: Stats{Refused: 1, Retried: 1},
		},
		{
			name: "refused, the informer lags: the copy is read again and holds B: retried with B", valid: []string{"B"},
			setup: func(r *rig) {
				r.cluster.onRequest = func(n int) {
					if n == 1 {
						r.copy.rotate("B")
					}
				}
			},
			wantCode: 200, wantAuths: []string{"Bearer A", "Bearer B"}, wantReads: 2,
			wantStats: Stats{Refused: 1, Retried: 1, Rereads: 1},
		},
		{
			name: "refused, the copy still holds the same token: the 401 is returned, no retry", valid: []string{"B"},
			wantCode: 401, wantAuths: []string{"Bearer A"}, wantReads: 2,
			wantStats: Stats{Refused: 1, Rereads: 1},
		},
		{
			name: "refused again with the new token: returned, never a third request", valid: nil,
			setup: func(r *rig) {
				r.cluster.onRequest = func(n int) { r.copy.rotate(itoa(n) + "-new") }
			},
			wantCode: 401, wantAuths: []string{"Bearer A", "Bearer 1-new"}, wantReads: 2,
			wantStats: Stats{Refused: 2, Retried: 1, Rereads: 1},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(tc.valid...)
			if tc.setup != nil {
				tc.setup(r)
			}
			if code := r.get(t); code != tc.wantCode {
				t.Errorf("status %d, want %d", code, tc.wantCode)
			}
			if got := r.cluster.auths(); strings.Join(got, ",") != strings.Join(tc.wantAuths, ",") {
				t.Errorf("requests sent with %q, want %q", got, tc.wantAuths)
			}
			if got := r.copy.reads.Load(); got != tc.wantReads {
				t.Errorf("%d reads of the copy, want %d", got, tc.wantReads)
			}
			if got := (Stats{Refused: r.stats.refused.Load(), Retried: r.stats.retried.Load(), Rereads: r.stats.rereads.Load()}); got != tc.wantStats {
				t.Errorf("stats %+v, want %+v", got, tc.wantStats)
			}
		})
	}
}

// TestTransportStaleOffer: once a read after a 401 returned the copy at a
// newer resourceVersion, the informer's older version of it is ignored.
func TestTransportStaleOffer(t *testing.T) {
	r := newRig("B")
	r.cluster.onRequest = func(n int) {
		if n == 1 {
			r.copy.rotate("B") // resourceVersion 2
		}
	}
	if code := r.get(t); code != 200 {
		t.Fatalf("status %d", code)
	}
	if r.cred.offer(copyToken{token: "A", resourceVersion: "1"}) {
		t.Fatal("an older version of the copy replaced the newer token")
	}
	if code := r.get(t); code != 200 {
		t.Errorf("status %d after the stale offer", code)
	}
	if got := r.cluster.auths(); got[len(got)-1] != "Bearer B" {
		t.Errorf("last request sent with %q, want B", got[len(got)-1])
	}
}

func TestTransportBodyReplay(t *testing.T) {
	tests := []struct {
		name      string
		req       func() *http.Request
		wantCode  int
		wantCalls int
		wantBody  string // of every call
	}{
		{
			name: "body with GetBody: retried with the same body",
			req: func() *http.Request {
				req, _ := http.NewRequest(http.MethodPost, "https://cluster.example/api/v1/namespaces", bytes.NewReader([]byte(`{"kind":"Namespace"}`)))
				return req
			},
			wantCode: 200, wantCalls: 2, wantBody: `{"kind":"Namespace"}`,
		},
		{
			name: "body without GetBody: not replayable, the 401 is returned",
			req: func() *http.Request {
				req, _ := http.NewRequest(http.MethodPost, "https://cluster.example/api/v1/namespaces", io.NopCloser(strings.NewReader(`{"kind":"Namespace"}`)))
				return req
			},
			wantCode: 401, wantCalls: 1, wantBody: `{"kind":"Namespace"}`,
		},
		{
			name: "http.NoBody: retried",
			req: func() *http.Request {
				req, _ := http.NewRequest(http.MethodDelete, "https://cluster.example/api/v1/namespaces/x", http.NoBody)
				return req
			},
			wantCode: 200, wantCalls: 2,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig("B")
			r.cluster.onRequest = func(n int) {
				if n == 1 {
					r.cred.offer(copyToken{token: "B", resourceVersion: "2"})
				}
			}
			resp, err := r.rt.RoundTrip(tc.req())
			if err != nil {
				t.Fatal(err)
			}
			_ = resp.Body.Close()
			if resp.StatusCode != tc.wantCode {
				t.Errorf("status %d, want %d", resp.StatusCode, tc.wantCode)
			}
			r.cluster.mu.Lock()
			defer r.cluster.mu.Unlock()
			if len(r.cluster.calls) != tc.wantCalls {
				t.Fatalf("%d requests, want %d", len(r.cluster.calls), tc.wantCalls)
			}
			for i, c := range r.cluster.calls {
				if c.body != tc.wantBody {
					t.Errorf("request %d body %q, want %q", i+1, c.body, tc.wantBody)
				}
			}
		})
	}
}

// TestTransportOwnAuthorization: a request that carries its own
// credential goes out unchanged and is not retried.
func TestTransportOwnAuthorization(t *testing.T) {
	r := newRig("B")
	req, _ := http.NewRequest(http.MethodGet, "https://cluster.example/version", nil)
	req.Header.Set("Authorization", "Bearer mine")
	resp, err := r.rt.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if got := r.cluster.auths(); len(got) != 1 || got[0] != "Bearer mine" {
		t.Errorf("requests sent with %q, want one with the caller's own", got)
	}
	if req.Header.Get("Authorization") != "Bearer mine" || r.copy.reads.Load() != 0 {
		t.Errorf("the request was changed or the copy read")
	}
}

// TestTransportDoesNotChangeRequest: the caller's request keeps its
// headers (a RoundTripper must not modify it).
func TestTransportDoesNotChangeRequest(t *testing.T) {
	r := newRig("A")
	req, _ := http.NewRequest(http.MethodGet, "https://cluster.example/version", nil)
	resp, err := r.rt.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if v := req.Header.Get("Authorization"); v != "" {
		t.Errorf("the caller's request got Authorization %q", v)
	}
}

// TestTransportRereadThrottle: while the copy keeps the refused token,
// 401s read it at most once per minReread.
func TestTransportRereadThrottle(t *testing.T) {
	r := newRig() // every token refused
	for range 5 {
		if code := r.get(t); code != 401 {
			t.Fatalf("status %d, want 401", code)
		}
	}
	// One read to load the token, one after the first 401.
	if got := r.copy.reads.Load(); got != 2 {
		t.Errorf("%d reads within minReread, want 2", got)
	}
	r.now = r.now.Add(time.Second)
	r.get(t)
	if got := r.copy.reads.Load(); got != 3 {
		t.Errorf("%d reads after minReread passed, want 3", got)
	}
}

// TestTransportConcurrentRefusals: requests refused together share one
// read of the copy, and each is retried with the new token.
func TestTransportConcurrentRefusals(t *testing.T) {
	r := newRig("B")
	if _, err := r.cred.current(context.Background()); err != nil {
		t.Fatal(err)
	}
	r.copy.rotate("B")
	r.copy.block = make(chan struct{})
	const n = 8
	codes := make(chan int, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			req, _ := http.NewRequest(http.MethodGet, "https://cluster.example/api/v1/namespaces", nil)
			resp, err := r.rt.RoundTrip(req)
			if err != nil {
				t.Error(err)
				codes <- 0
				return
			}
			_ = resp.Body.Close()
			codes <- resp.StatusCode
		})
	}
	// Every request is refused before the single read returns.
	testutil.Eventually(t, 10*time.Second, time.Millisecond, func() bool { return r.stats.refused.Load() == n },
		"every request refused before the read returns")
	close(r.copy.block)
	wg.Wait()
	close(codes)
	for code := range codes {
		if code != 200 {
			t.Errorf("a request ended with %d, want 200", code)
		}
	}
	if got := r.copy.reads.Load(); got != 2 {
		t.Errorf("%d reads of the copy, want 2 (the load and one after the refusals)", got)
	}
}

// TestTransportNoCopy: without a copy, the request fails with an error
// that names the Secret and holds no token, and its body is closed.
func TestTransportNoCopy(t *testing.T) {
	r := newRig("A")
	r.copy.token = ""
	body := &closeRecorder{Reader: strings.NewReader("x")}
	req, _ := http.NewRequest(http.MethodPost, "https://cluster.example/api", body)
	_, err := r.rt.RoundTrip(req)
	if err == nil || !strings.Contains(err.Error(), "not found") {
		t.Fatalf("err = %v, want the read's error", err)
	}
	if !body.closed {
		t.Error("the request body was not closed")
	}
}

type closeRecorder struct {
	io.Reader
	closed bool
}

func (c *closeRecorder) Close() error { c.closed = true; return nil }
