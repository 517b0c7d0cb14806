package tunnel

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hubsync/hubsync/stream"
	"github.com/hubsync/hubsync/test/pki"
	"github.com/hubsync/hubsync/test/testutil"
)

// testCA issues serving certificates.
type testCA struct {
	*pki.CA
	pem []byte
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	ca, err := pki.NewCA("test-ca")
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{CA: ca, pem: ca.PEM}
}

func (ca *testCA) serving(t *testing.T, names ...string) tls.Certificate {
	t.Helper()
	pair, err := ca.Serving(names...)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(pair.Cert, pair.Key)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

// fakeAPIServer is an HTTPS server with HTTP/2 that answers /version with
// its name and can be stopped and started again on the same address.
type fakeAPIServer struct {
	t    *testing.T
	name string
	addr string
	cert tls.Certificate

	mu     sync.Mutex
	srv    *http.Server
	ln     net.Listener
	cur    *chanListener
	tokens []string
	// requests holds "<path> <token>" for every request.
	requests []string
	// conns counts open connections; opened counts every connection.
	conns, opened atomic.Int32
	status        atomic.Int32 // answer of /version; 0: 200
	// retryAfter is the Retry-After header of a /version answer that is
	// not 200 ("": none).
	retryAfter atomic.Value
	// maxStreams, when set before start, limits each connection's
	// concurrent streams.
	maxStreams int
	// block holds requests to /block until it is closed; blocked counts
	// the requests it holds.
	block   chan struct{}
	blocked atomic.Int32
	// ticketKey is the session ticket key of every server at the
	// address (a new one after goaway too), as with API servers that
	// share one; handshakes and resumed count the TLS handshakes, and
	// those that resumed a session.
	ticketKey           [32]byte
	handshakes, resumed atomic.Int32
}

func newFakeAPIServer(t *testing.T, ca *testCA, name string) *fakeAPIServer {
	t.Helper()
	return newFakeAPIServerWith(t, ca, name, 0)
}

// newFakeAPIServerWith starts a server that allows maxStreams concurrent
// streams per connection (0: Go's default).
func newFakeAPIServerWith(t *testing.T, ca *testCA, name string, maxStreams int) *fakeAPIServer {
	t.Helper()
	s := &fakeAPIServer{t: t, name: name, addr: "127.0.0.1:0", cert: ca.serving(t, "127.0.0.1", name),
		maxStreams: maxStreams, block: make(chan struct{})}
	if _, err := rand.Read(s.ticketKey[:]); err != nil {
		t.Fatal(err)
	}
	s.start()
	t.Cleanup(s.stop)
	return s
}

func (s *fakeAPIServer) start() {
	s.t.Helper()
	var ln net.Listener
	var err error
	// The port of a stopped server may take a moment to be free again.
	for i := 0; i < 100; i++ {
		if ln, err = net.Listen("tcp", s.addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		s.t.Fatalf("listen %s: %v", s.addr, err)
	}
	s.addr = ln.Addr().String()
	s.mu.Lock()
	s.ln = ln
	s.mu.Unlock()
	// One accept loop hands connections to the current server, so that
	// goaway can replace the server while the address keeps answering.
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			cl := s.cur
			s.mu.Unlock()
			if cl == nil {
				_ = c.Close()
				continue
			}
			select {
			case cl.ch <- c:
			case <-cl.done:
				_ = c.Close()
			}
		}
	}()
	s.serveOn(newChanListener(ln.Addr()))
}

// chanListener is a listener fed by the accept loop.
type chanListener struct {
	addr net.Addr
	ch   chan net.Conn
	done chan struct{}
	once sync.Once
}

func newChanListener(addr net.Addr) *chanListener {
	return &chanListener{addr: addr, ch: make(chan net.Conn), done: make(chan struct{})}
}

func (l *chanListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *chanListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *chanListener) Addr() net.Addr { return l.addr }

func (s *fakeAPIServer) serveOn(cl *chanListener) {
	cfg := &tls.Config{
		Certificates: []tls.Certificate{s.cert},
		NextProtos:   []string{"h2"},
		VerifyConnection: func(cs tls.ConnectionState) error {
			if cs.DidResume {
				s.resumed.Add(1)
			}
			s.handshakes.Add(1) // last: a test waits for it, then reads resumed
			return nil
		},
	}
	cfg.SetSessionTicketKeys([][32]byte{s.ticketKey})
	srv := &http.Server{
		Handler:   http.HandlerFunc(s.serve),
		TLSConfig: cfg,
		HTTP2:     &http.HTTP2Config{MaxConcurrentStreams: s.maxStreams},
		ConnState: func(_ net.Conn, st http.ConnState) {
			switch st {
			case http.StateNew:
				s.conns.Add(1)
				s.opened.Add(1)
			case http.StateClosed, http.StateHijacked:
				s.conns.Add(-1)
			}
		},
	}
	s.mu.Lock()
	s.srv, s.cur = srv, cl
	s.mu.Unlock()
	go func() { _ = srv.ServeTLS(cl, "", "") }()
}

func (s *fakeAPIServer) serve(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.tokens = append(s.tokens, strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "))
	s.requests = append(s.requests, r.URL.Path+" "+strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "))
	s.mu.Unlock()
	if r.URL.Path == "/block" {
		s.blocked.Add(1)
		defer s.blocked.Add(-1)
		select {
		case <-s.block:
		case <-r.Context().Done():
		}
	}
	if code := s.status.Load(); code != 0 && r.URL.Path == "/version" {
		if ra, _ := s.retryAfter.Load().(string); ra != "" {
			w.Header().Set("Retry-After", ra)
		}
		w.WriteHeader(int(code))
		return
	}
	fmt.Fprintf(w, `{"server":%q,"path":%q,"proto":%q}`, s.name, r.URL.Path, r.Proto)
}

// take stops accepting and returns the server to stop, if it runs.
func (s *fakeAPIServer) take() *http.Server {
	s.mu.Lock()
	srv, ln := s.srv, s.ln
	s.srv, s.ln, s.cur = nil, nil, nil
	s.mu.Unlock()
	if srv != nil {
		_ = ln.Close()
	}
	return srv
}

// stop closes the listener and every connection at once.
func (s *fakeAPIServer) stop() {
	if srv := s.take(); srv != nil {
		_ = srv.Close()
	}
}

// shutdown stops gracefully: HTTP/2 clients get a GOAWAY.
func (s *fakeAPIServer) shutdown() {
	if srv := s.take(); srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}
}

// goaway hands the address to a new server and shuts the old one down:
// clients get a GOAWAY while the address keeps answering, as with an API
// server's --goaway-chance or a rolling restart behind a load balancer.
func (s *fakeAPIServer) goaway() {
	s.mu.Lock()
	old := s.srv
	addr := s.ln.Addr()
	s.mu.Unlock()
	s.serveOn(newChanListener(addr))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = old.Shutdown(ctx)
}

// saw reports whether a request to path carried token ("" for none).
func (s *fakeAPIServer) saw(path, token string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Contains(s.requests, path+" "+token)
}

func (s *fakeAPIServer) seenTokens() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.tokens...)
}

// recorder collects the changes the pool notifies.
type recorder struct {
	testutil.Recorder[stream.Change]
}

func (r *recorder) list() []stream.Change { return r.All() }

// count returns how many changes of type typ were notified for ns/cluster.
func (r *recorder) count(typ, ns, cluster string) int {
	return r.Count(func(c stream.Change) bool { return c.Type == typ && c.Namespace == ns && c.Cluster == cluster })
}

// countingDialer dials directly and records how many dials run at once.
type countingDialer struct {
	DirectDialer
	delay         time.Duration
	now, peak     atomic.Int32
	total, failed atomic.Int32
}

func (d *countingDialer) Dial(ctx context.Context, cluster, address string) (net.Conn, error) {
	n := d.now.Add(1)
	defer d.now.Add(-1)
	for {
		p := d.peak.Load()
		if n <= p || d.peak.CompareAndSwap(p, n) {
			break
		}
	}
	d.total.Add(1)
	if d.delay > 0 {
		select {
		case <-time.After(d.delay):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	c, err := d.DirectDialer.Dial(ctx, cluster, address)
	if err != nil {
		d.failed.Add(1)
	}
	return c, err
}

// newTestPool returns a started pool with fast probes and backoff.
func newTestPool(t *testing.T, tune func(*Options)) (*Pool, *recorder) {
	t.Helper()
	rec := &recorder{}
	// hubsync's defaults, with fast probes and backoff.
	opts := configOptions()
	opts.Transport = TransportDirect
	opts.ProbeInterval, opts.ProbeTimeout, opts.DialTimeout = 100*time.Millisecond, time.Second, 2*time.Second
	opts.BackoffBase, opts.BackoffMax, opts.RetireGrace = 20*time.Millisecond, 200*time.Millisecond, time.Second
	opts.Notifier, opts.Log = rec, testLogger(t)
	if tune != nil {
		tune(&opts)
	}
	p, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p.Start(ctx)
	t.Cleanup(func() {
		cancel()
		p.Close()
	})
	return p, rec
}

func testLogger(t *testing.T) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("test", t.Name())
	}
	return slog.New(slog.DiscardHandler)
}

func target(s *fakeAPIServer, ca *testCA, token string) *Target {
	return &Target{Address: s.addr, ServerName: s.name, CA: ca.pem, Token: token, TokenFingerprint: "sha256:test"}
}

// eventually polls cond until it holds or 10 s pass.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testutil.Eventually(t, 10*time.Second, 5*time.Millisecond, cond, "timed out waiting: %s", what)
}

func state(p *Pool, cluster string) State {
	st, ok := p.Status(cluster)
	if !ok {
		return ""
	}
	return st.State
}

// get sends GET path to the cluster through the pool's RoundTripper and
// returns the body.
func get(t *testing.T, p *Pool, cluster, path string, header http.Header) (string, error) {
	t.Helper()
	return getWith(t, p.RoundTripper(cluster), cluster, path, header)
}

// getWith sends GET path through rt and returns the body.
func getWith(t *testing.T, rt http.RoundTripper, cluster, path string, header http.Header) (string, error) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, "https://"+cluster+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// count is how many requests for path the server has had.
func (s *fakeAPIServer) count(path string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, r := range s.requests {
		if p, _, _ := strings.Cut(r, " "); p == path {
			n++
		}
	}
	return n
}
