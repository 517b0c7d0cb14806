package gateway

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/test/pki"
	"github.com/hubsync/hubsync/test/testutil"
)

// The paths the drain tests ask for, and what drainCluster does with them.
const (
	slowPath  = "/c1/api/v1/namespaces/a/configmaps/slow" // answered once released
	quickPath = "/c1/api/v1/namespaces/a/configmaps/quick"
	watchPath = "/c1/api/v1/namespaces/a/pods?watch=true"     // streams what the test writes
	execPath  = "/c1/api/v1/namespaces/a/pods/p/exec?stdin=1" // switches protocols to a pipe
)

// drainCluster answers as a managed cluster for the drain tests. Each
// request it holds is handed to the test through a channel.
type drainCluster struct {
	release  chan struct{}
	slow     chan context.Context // a slow request's context, as it arrives
	watches  chan *io.PipeWriter  // a watch's stream
	upgrades chan net.Conn        // the cluster's end of an upgraded connection
}

func newDrainCluster() *drainCluster {
	return &drainCluster{release: make(chan struct{}), slow: make(chan context.Context, 4),
		watches: make(chan *io.PipeWriter, 4), upgrades: make(chan net.Conn, 4)}
}

func (c *drainCluster) RoundTrip(r *http.Request) (*http.Response, error) {
	answer := func(code int, h http.Header, body io.ReadCloser) (*http.Response, error) {
		return &http.Response{StatusCode: code, Header: h, Body: body, Request: r}, nil
	}
	jsonHeader := http.Header{"Content-Type": {"application/json"}}
	switch {
	case strings.HasSuffix(r.URL.Path, "/exec"):
		ours, theirs := net.Pipe()
		c.upgrades <- theirs
		return answer(http.StatusSwitchingProtocols, http.Header{"Connection": {"Upgrade"}, "Upgrade": {r.Header.Get("Upgrade")}}, ours)
	case r.URL.Query().Get("watch") == "true":
		pr, pw := io.Pipe()
		c.watches <- pw
		return answer(http.StatusOK, jsonHeader, pr)
	case strings.HasSuffix(r.URL.Path, "/slow"):
		c.slow <- r.Context()
		select {
		case <-c.release:
		case <-r.Context().Done():
			return nil, r.Context().Err()
		}
	}
	return answer(http.StatusOK, jsonHeader, io.NopCloser(strings.NewReader(`{"kind":"ConfigMap"}`)))
}

// staticCert serves one certificate.
type staticCert struct{ cert *tls.Certificate }

func (s staticCert) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return s.cert, nil
}

// logBuffer is a log that handlers on several goroutines write to.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// drainServer is a Gateway served by Serve over TLS on loopback, in front
// of a drainCluster.
type drainServer struct {
	addr    string
	roots   *x509.CertPool
	token   string
	cluster *drainCluster
	log     *logBuffer
	reg     *prometheus.Registry
	// drain ends Serve's context; done is closed once Serve has returned
	// err.
	drain context.CancelFunc
	done  chan struct{}
	err   error
}

func startDrainServer(t *testing.T, timeout time.Duration) *drainServer {
	t.Helper()
	w := newWorld(t)
	ca, err := pki.NewCA("gateway-ca")
	if err != nil {
		t.Fatal(err)
	}
	pair, err := ca.Serving("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(pair.Cert, pair.Key)
	if err != nil {
		t.Fatal(err)
	}
	s := &drainServer{roots: x509.NewCertPool(), token: w.hubToken, cluster: newDrainCluster(), log: &logBuffer{},
		reg: prometheus.NewRegistry(), done: make(chan struct{})}
	s.roots.AddCert(ca.Cert)
	g, err := New(configured(Options{Pool: fixedPool{fakePool: w.pool(), rt: s.cluster}, Reviewer: w.reviewer(), Registerer: s.reg}))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.addr = ln.Addr().String()
	so := ServerOptionsFor(config.Default().Gateway)
	so.Certs, so.DrainTimeout, so.Log = staticCert{&cert}, timeout, slog.New(slog.NewTextHandler(s.log, nil))
	ctx, cancel := context.WithCancel(context.Background())
	s.drain = cancel
	go func() {
		defer close(s.done)
		s.err = Serve(ctx, ln, g, so)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-s.cluster.release:
		default:
			close(s.cluster.release)
		}
		select {
		case <-s.done:
		case <-time.After(timeout + 10*time.Second):
			t.Errorf("Serve did not return")
		}
	})
	return s
}

// client is an HTTP client of the server speaking proto (HTTP/1.1 or
// HTTP/2); dials counts the connections it opens.
func (s *drainServer) client(t *testing.T, proto string, dials *atomic.Int32) *http.Client {
	var p http.Protocols
	if proto == "HTTP/2" {
		p.SetHTTP2(true)
	} else {
		p.SetHTTP1(true)
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: s.roots}, Protocols: &p,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if dials != nil {
				dials.Add(1)
			}
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		}}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// get sends GET path with the hub token.
func (s *drainServer) get(ctx context.Context, c *http.Client, path string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+s.addr+path, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+s.token)
	return c.Do(req)
}

// answer is a request's outcome.
type answer struct {
	code int
	body string
	err  error
}

// goGet sends GET path in the background; the channel gets its outcome.
func (s *drainServer) goGet(c *http.Client, path string) <-chan answer {
	out := make(chan answer, 1)
	go func() {
		resp, err := s.get(context.Background(), c, path)
		if err != nil {
			out <- answer{err: err}
			return
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		out <- answer{code: resp.StatusCode, body: string(body), err: err}
	}()
	return out
}

// returned waits for Serve to return, and returns its error.
func (s *drainServer) returned(t *testing.T) error {
	t.Helper()
	recv(t, s.done, 10*time.Second, "Serve's return")
	return s.err
}

// major is proto's major version.
func major(proto string) int {
	if proto == "HTTP/2" {
		return 2
	}
	return 1
}

// recv waits up to d for what ch sends.
func recv[T any](t *testing.T, ch <-chan T, d time.Duration, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(d):
		t.Fatalf("%s: nothing within %s", what, d)
	}
	panic("unreachable")
}

// refused reports whether a new connection to addr is refused.
func refused(addr string) error {
	c, err := net.Dial("tcp", addr)
	if err == nil {
		_ = c.Close()
		return errors.New("a new connection is still accepted")
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("dial: %w; want connection refused", err)
	}
	return nil
}

// drained checks the drain's last log line and its metrics.
func (s *drainServer) drained(t *testing.T, counts string, metrics map[string]float64) {
	t.Helper()
	if !strings.Contains(s.log.String(), `msg="gateway drained" `+counts) {
		t.Errorf("the drain's log does not say %q:\n%s", counts, s.log)
	}
	m, err := testutil.Gather(s.reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, kind := range []string{endedWatch, endedUpgrade, endedForced} {
		if got := m.Value("hubsync_gateway_drain_ended_requests_total", testutil.Labels{"kind": kind}); got != metrics[kind] {
			t.Errorf("hubsync_gateway_drain_ended_requests_total{kind=%q} = %v; want %v", kind, got, metrics[kind])
		}
	}
}

// TestServeDrainWatchesEndRequestsFinish: once Serve's context ends, a
// watch in flight ends at once as a clean end of stream (the client
// decodes up to EOF with no error, as client-go's watch does, and the
// cluster's stream is released), while a slow GET goes on, uncancelled,
// and later answers 200; new connections are refused meanwhile, and Serve
// returns once the GET is done, long before the drain timeout.
func TestServeDrainWatchesEndRequestsFinish(t *testing.T) {
	const timeout = 30 * time.Second
	for _, proto := range []string{"HTTP/1.1", "HTTP/2"} {
		t.Run(proto, func(t *testing.T) {
			s := startDrainServer(t, timeout)
			c := s.client(t, proto, nil)
			slow := s.goGet(c, slowPath)
			slowCtx := recv(t, s.cluster.slow, 10*time.Second, "the slow request at the cluster")

			wctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			resp, err := s.get(wctx, c, watchPath)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.ProtoMajor != major(proto) || resp.StatusCode != http.StatusOK {
				t.Fatalf("watch: %s %s; want %s 200", resp.Proto, resp.Status, proto)
			}
			stream := recv(t, s.cluster.watches, 10*time.Second, "the watch at the cluster")
			events := make(chan error, 1)
			go func() { events <- decodeEvents(resp.Body) }()
			if _, err := io.WriteString(stream, `{"type":"ADDED","object":{"kind":"Pod"}}`+"\n"); err != nil {
				t.Fatal(err)
			}

			drainStart := time.Now()
			s.drain()
			if err := recv(t, events, 10*time.Second, "the watch's end"); err != nil {
				t.Fatalf("the watch ended with %v; want a clean end of stream", err)
			}
			if took := time.Since(drainStart); took > timeout/2 {
				t.Fatalf("the watch ended %s after the drain began; want at once", took)
			}
			if _, err := io.WriteString(stream, "{}\n"); !errors.Is(err, io.ErrClosedPipe) {
				t.Errorf("the cluster's watch stream is still read (write: %v)", err)
			}
			testutil.Eventually(t, 10*time.Second, 10*time.Millisecond, func() error { return refused(s.addr) },
				"new connections while draining")
			select {
			case a := <-slow:
				t.Fatalf("the slow request ended before the cluster answered it: %+v", a)
			case <-s.done:
				t.Fatalf("Serve returned with a request in flight: %v", s.err)
			default:
			}
			if err := slowCtx.Err(); err != nil {
				t.Fatalf("the drain cancelled the slow request: %v", err)
			}
			close(s.cluster.release)
			if a := recv(t, slow, 10*time.Second, "the slow answer"); a.err != nil || a.code != 200 || a.body != `{"kind":"ConfigMap"}` {
				t.Fatalf("slow request: %+v; want 200 and the cluster's answer", a)
			}
			if err := s.returned(t); err != nil {
				t.Fatal(err)
			}
			s.drained(t, "finished=1 watchesEnded=1 upgradesEnded=0 forced=0", map[string]float64{endedWatch: 1})
		})
	}
}

// decodeEvents reads a watch stream as client-go's decoder does, one JSON
// event after another, and returns nil at a clean end of stream.
func decodeEvents(r io.Reader) error {
	dec := json.NewDecoder(r)
	for {
		var ev map[string]any
		err := dec.Decode(&ev)
		switch {
		case errors.Is(err, io.EOF):
			return nil
		case err != nil:
			return err
		}
	}
}

// TestServeDrainClosesUpgrades: an upgraded connection (exec) is closed
// at once when the drain begins, on both sides, for the client to
// reconnect elsewhere, and Serve returns.
func TestServeDrainClosesUpgrades(t *testing.T) {
	const timeout = 30 * time.Second
	s := startDrainServer(t, timeout)
	conn, err := tls.Dial("tcp", s.addr, &tls.Config{RootCAs: s.roots, NextProtos: []string{"http/1.1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(conn, "GET "+execPath+" HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer "+s.token+"\r\n"+
		"Connection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v %v; want 101", resp, err)
	}
	cluster := recv(t, s.cluster.upgrades, 10*time.Second, "the upgrade at the cluster")
	defer cluster.Close()
	_ = cluster.SetDeadline(time.Now().Add(10 * time.Second))
	// Both ways work before the drain.
	if _, err := io.WriteString(conn, "ping"); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(cluster, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("the cluster read %q, %v", buf, err)
	}
	if _, err := io.WriteString(cluster, "pong"); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(br, buf); err != nil || string(buf) != "pong" {
		t.Fatalf("the client read %q, %v", buf, err)
	}

	drainStart := time.Now()
	s.drain()
	if n, err := br.Read(buf); !errors.Is(err, io.EOF) {
		t.Fatalf("the client's upgraded connection: read %d, %v; want it closed", n, err)
	}
	if n, err := cluster.Read(buf); !errors.Is(err, io.EOF) {
		t.Fatalf("the cluster's side: read %d, %v; want it closed", n, err)
	}
	if took := time.Since(drainStart); took > timeout/2 {
		t.Fatalf("the upgraded connection was closed %s after the drain began; want at once", took)
	}
	if err := s.returned(t); err != nil {
		t.Fatal(err)
	}
	s.drained(t, "finished=0 watchesEnded=0 upgradesEnded=1 forced=0", map[string]float64{endedUpgrade: 1})
}

// TestServeDrainCutsAtTimeout: a request still running at the drain
// timeout, and only then, is cut (its context ends, the client gets an
// error or 499), and Serve returns soon after.
func TestServeDrainCutsAtTimeout(t *testing.T) {
	const timeout = 300 * time.Millisecond
	for _, proto := range []string{"HTTP/1.1", "HTTP/2"} {
		t.Run(proto, func(t *testing.T) {
			s := startDrainServer(t, timeout)
			slow := s.goGet(s.client(t, proto, nil), slowPath)
			slowCtx := recv(t, s.cluster.slow, 10*time.Second, "the slow request at the cluster")
			drainStart := time.Now()
			s.drain()
			recv(t, slowCtx.Done(), 10*time.Second, "the slow request's cancellation")
			if took := time.Since(drainStart); took < timeout {
				t.Fatalf("the slow request was cancelled %s after the drain began; want at the timeout, %s", took, timeout)
			}
			if err := s.returned(t); err != nil {
				t.Fatal(err)
			}
			// Cut: the connection closes under it, or, when the
			// handler's answer to its cancelled context wins the race,
			// it gets that answer (499).
			if a := recv(t, slow, 10*time.Second, "the slow answer"); a.err == nil && a.code != 499 {
				t.Fatalf("the cut request answered %d %s; want an error or 499", a.code, a.body)
			}
			s.drained(t, "finished=0 watchesEnded=0 upgradesEnded=0 forced=1", map[string]float64{endedForced: 1})
		})
	}
}

// TestServeDrainGoAway: an HTTP/2 client whose connection is still open
// (a request in flight on it) gets GOAWAY, so that a new request goes to
// a new connection, refused since the listener is closed, instead of to
// the draining replica or hanging; the request in flight still finishes.
func TestServeDrainGoAway(t *testing.T) {
	s := startDrainServer(t, time.Minute)
	var dials atomic.Int32
	c := s.client(t, "HTTP/2", &dials)
	resp, err := s.get(context.Background(), c, quickPath)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	slow := s.goGet(c, slowPath)
	recv(t, s.cluster.slow, 10*time.Second, "the slow request at the cluster")
	if n := dials.Load(); n != 1 || resp.ProtoMajor != 2 {
		t.Fatalf("%d connections, %s; want both requests on one HTTP/2 connection", n, resp.Proto)
	}

	s.drain()
	testutil.Eventually(t, 20*time.Second, 10*time.Millisecond, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resp, err := s.get(ctx, c, quickPath)
		if err == nil && resp.ProtoMajor != 2 {
			_ = resp.Body.Close()
			return testutil.Stop(fmt.Errorf("answered over %s; want HTTP/2", resp.Proto))
		}
		if err == nil {
			_ = resp.Body.Close()
			return errors.New("a new request is still served on the draining connection")
		}
		var op *net.OpError
		if !errors.As(err, &op) || op.Op != "dial" {
			return testutil.Stop(fmt.Errorf("a new request failed with %w; want a refused dial", err))
		}
		return nil
	}, "a new request after GOAWAY")
	if n := dials.Load(); n < 2 {
		t.Fatalf("%d dials; want a new connection tried", n)
	}
	close(s.cluster.release)
	if a := recv(t, slow, 10*time.Second, "the slow answer"); a.err != nil || a.code != 200 {
		t.Fatalf("slow request: %+v; want 200", a)
	}
	if err := s.returned(t); err != nil {
		t.Fatal(err)
	}
}
