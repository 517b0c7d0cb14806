package lb

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hubsync/hubsync/test/leak"
	"github.com/hubsync/hubsync/test/testutil"
)

// testBackend is a TCP server that greets each connection with its name
// and a newline. An echoing backend then echoes what it reads until the
// client's end of writing, writes "bye" and closes. A quiet backend
// closes its writing side right after the greeting and reports, on got,
// everything it reads until the client's end.
type testBackend struct {
	name string
	ln   net.Listener
	got  chan string

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

func startBackend(t *testing.T, name string, quiet bool) *testBackend {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &testBackend{name: name, ln: ln, got: make(chan string, 16), conns: map[net.Conn]struct{}{}}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns[c] = struct{}{}
			s.mu.Unlock()
			s.wg.Add(1)
			go s.serve(c.(*net.TCPConn), quiet)
		}
	}()
	t.Cleanup(s.close)
	return s
}

func (s *testBackend) serve(c *net.TCPConn, quiet bool) {
	defer s.wg.Done()
	defer func() {
		_ = c.Close()
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
	}()
	if _, err := io.WriteString(c, s.name+"\n"); err != nil {
		return
	}
	if quiet {
		_ = c.CloseWrite()
		b, _ := io.ReadAll(c)
		s.got <- string(b)
		return
	}
	if _, err := io.Copy(c, c); err == nil {
		_, _ = io.WriteString(c, "bye")
	}
}

func (s *testBackend) addr() string { return s.ln.Addr().String() }

// close stops the backend and ends its connections.
func (s *testBackend) close() {
	_ = s.ln.Close()
	s.mu.Lock()
	for c := range s.conns {
		_ = c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// connect dials addr and returns the connection and the name of the
// backend that greeted it ("" when the balancer closed it at once).
func connect(t *testing.T, addr string) (*net.TCPConn, *bufio.Reader, string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		t.Fatalf("read the greeting: %v", err)
	}
	return c.(*net.TCPConn), r, strings.TrimSuffix(line, "\n")
}

// names connects n times and returns the greeting backends, in order.
func names(t *testing.T, b *Balancer, n int) []string {
	t.Helper()
	var got []string
	for range n {
		c, _, name := connect(t, b.Addr())
		_ = c.Close()
		got = append(got, name)
	}
	return got
}

// echo checks that c, greeted already, still echoes.
func echo(t *testing.T, c net.Conn, r *bufio.Reader, msg string) {
	t.Helper()
	if _, err := io.WriteString(c, msg+"\n"); err != nil {
		t.Fatal(err)
	}
	line, err := r.ReadString('\n')
	if err != nil || line != msg+"\n" {
		t.Fatalf("echo: %q, %v; want %q", line, err, msg)
	}
}

func start(t *testing.T, opts Options, backends ...Backend) *Balancer {
	t.Helper()
	b := New(opts, backends...)
	if err := b.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeWithin(t, b, 10*time.Second) })
	return b
}

func TestRoundRobin(t *testing.T) {
	a, bb, c := startBackend(t, "a", false), startBackend(t, "b", false), startBackend(t, "c", false)
	b := start(t, Options{}, Backend{Addr: a.addr()}, Backend{Addr: bb.addr()}, Backend{Addr: c.addr()})
	if got, want := names(t, b, 7), []string{"a", "b", "c", "a", "b", "c", "a"}; !slices.Equal(got, want) {
		t.Fatalf("connections went to %v, want %v", got, want)
	}
	if n := b.Routed(bb.addr()); n != 2 {
		t.Fatalf("Routed(b) = %d, want 2", n)
	}
}

// TestSplice: bytes go both ways, and each side's end of writing reaches
// the other while the other direction goes on.
func TestSplice(t *testing.T) {
	t.Run("client ends first", func(t *testing.T) {
		a := startBackend(t, "a", false)
		b := start(t, Options{}, Backend{Addr: a.addr()})
		c, r, _ := connect(t, b.Addr())
		echo(t, c, r, "hello")
		if err := c.CloseWrite(); err != nil {
			t.Fatal(err)
		}
		// The backend sees the end, and its answer still comes back.
		rest, err := io.ReadAll(r)
		if err != nil || string(rest) != "bye" {
			t.Fatalf("after the client's end: %q, %v; want bye", rest, err)
		}
	})
	t.Run("backend ends first", func(t *testing.T) {
		a := startBackend(t, "a", true)
		b := start(t, Options{}, Backend{Addr: a.addr()})
		c, r, _ := connect(t, b.Addr())
		if rest, err := io.ReadAll(r); err != nil || len(rest) != 0 {
			t.Fatalf("after the backend's end: %q, %v; want the end", rest, err)
		}
		// The client can still write.
		if _, err := io.WriteString(c, "late data"); err != nil {
			t.Fatal(err)
		}
		if err := c.CloseWrite(); err != nil {
			t.Fatal(err)
		}
		select {
		case got := <-a.got:
			if got != "late data" {
				t.Fatalf("backend got %q", got)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("the backend never read the client's end")
		}
	})
}

// TestReadiness: a backend with a check gets new connections only while
// it passes; connections already open stay.
func TestReadiness(t *testing.T) {
	var funcReady atomic.Bool
	var status atomic.Int32
	status.Store(http.StatusServiceUnavailable)
	readyz := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(int(status.Load()))
	}))
	defer readyz.Close()
	tests := []struct {
		name     string
		backend  func(addr string) Backend
		setReady func(bool)
	}{
		{name: "func", backend: func(addr string) Backend { return Backend{Addr: addr, Ready: funcReady.Load} }, setReady: funcReady.Store},
		{name: "URL", backend: func(addr string) Backend { return Backend{Addr: addr, ReadyURL: readyz.URL + "/readyz"} },
			setReady: func(ok bool) {
				if ok {
					status.Store(http.StatusOK)
				} else {
					status.Store(http.StatusServiceUnavailable)
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := startBackend(t, "a", false)
			tt.setReady(false)
			b := start(t, Options{CheckInterval: 10 * time.Millisecond}, tt.backend(a.addr()))
			if got := b.InRotation(); len(got) != 0 {
				t.Fatalf("in rotation before its check passed: %v", got)
			}
			if got := names(t, b, 1); got[0] != "" {
				t.Fatalf("a connection with no backend ready reached %q", got[0])
			}
			tt.setReady(true)
			testutil.Eventually(t, 5*time.Second, 5*time.Millisecond, func() bool { return len(b.InRotation()) == 1 }, "never in rotation")
			c, r, name := connect(t, b.Addr())
			if name != "a" {
				t.Fatalf("connection to a ready backend greeted by %q", name)
			}
			tt.setReady(false)
			testutil.Eventually(t, 5*time.Second, 5*time.Millisecond, func() bool { return len(b.InRotation()) == 0 }, "still in rotation")
			if got := names(t, b, 1); got[0] != "" {
				t.Fatalf("a connection reached %q, which is not ready", got[0])
			}
			echo(t, c, r, "still open")
		})
	}
	t.Run("an added backend waits for its first check", func(t *testing.T) {
		a := startBackend(t, "a", false)
		b := start(t, Options{CheckInterval: time.Hour})
		checking, release := make(chan struct{}), make(chan struct{})
		added := make(chan struct{})
		go func() {
			b.Add(Backend{Addr: a.addr(), Ready: func() bool {
				close(checking)
				<-release
				return true
			}})
			close(added)
		}()
		<-checking
		if got := names(t, b, 1); got[0] != "" {
			t.Fatalf("a connection reached %q before its first check passed", got[0])
		}
		close(release)
		<-added
		if got := names(t, b, 1); got[0] != "a" {
			t.Fatalf("after the first check: greeted by %q", got[0])
		}
	})
	t.Run("Start runs the first check", func(t *testing.T) {
		a := startBackend(t, "a", false)
		b := start(t, Options{CheckInterval: time.Hour}, Backend{Addr: a.addr(), Ready: func() bool { return true }})
		if got := names(t, b, 1); got[0] != "a" {
			t.Fatalf("first connection greeted by %q", got[0])
		}
	})
}

// TestChangeBackends: Add, Remove and Set change where new connections
// go, and leave open ones alone.
func TestChangeBackends(t *testing.T) {
	a, bb, c, d := startBackend(t, "a", false), startBackend(t, "b", false), startBackend(t, "c", false), startBackend(t, "d", false)
	b := start(t, Options{}, Backend{Addr: a.addr()}, Backend{Addr: bb.addr()})
	ca, ra, name := connect(t, b.Addr())
	if name != "a" {
		t.Fatalf("first connection greeted by %q", name)
	}
	steps := []struct {
		name   string
		change func()
		want   []string
	}{
		{name: "remove a", change: func() { b.Remove(a.addr()) }, want: []string{"b", "b"}},
		{name: "add c", change: func() { b.Add(Backend{Addr: c.addr()}) }, want: []string{"b", "c", "b", "c"}},
		{name: "set c, d", change: func() { b.Set(Backend{Addr: c.addr()}, Backend{Addr: d.addr()}) }, want: []string{"c", "d", "c", "d"}},
		{name: "add a backend that is not ready", change: func() { b.Add(Backend{Addr: a.addr(), Ready: func() bool { return false }}) }, want: []string{"c", "d", "c", "d"}},
		{name: "a refusing backend", change: func() { b.Set(Backend{Addr: closedAddr(t)}) }, want: []string{""}},
	}
	for _, s := range steps {
		s.change()
		// The rotation may start anywhere in the new set.
		got := names(t, b, len(s.want))
		if !slices.Equal(got, s.want) && !slices.Equal(slices.Concat(got[1:], got[:1]), s.want) {
			t.Fatalf("%s: connections went to %v, want %v", s.name, got, s.want)
		}
	}
	echo(t, ca, ra, "a is out of the set")
}

// closedAddr is an address that refuses connections.
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

// TestCloseEndsEverything: Close, or the end of Start's context, ends the
// listener, every connection and every check, and no goroutine is left.
func TestCloseEndsEverything(t *testing.T) {
	for _, how := range []string{"Close", "context"} {
		t.Run(how, func(t *testing.T) {
			base := leak.Baseline()
			func() {
				a := startBackend(t, "a", false)
				defer a.close()
				readyz := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
				defer readyz.Close()
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				b := New(Options{CheckInterval: 5 * time.Millisecond}, Backend{Addr: a.addr(), ReadyURL: readyz.URL})
				if err := b.Start(ctx); err != nil {
					t.Fatal(err)
				}
				var open []*bufio.Reader
				for range 3 {
					_, r, name := connect(t, b.Addr())
					if name != "a" {
						t.Fatalf("greeted by %q", name)
					}
					open = append(open, r)
				}
				if how == "Close" {
					closeWithin(t, b, 10*time.Second)
				} else {
					cancel()
				}
				for i, r := range open {
					if _, err := io.ReadAll(r); err != nil && !isClosed(err) {
						t.Fatalf("connection %d after the balancer closed: %v", i, err)
					}
				}
				testutil.Eventually(t, 5*time.Second, 5*time.Millisecond, func() error {
					c, err := net.Dial("tcp", b.Addr())
					if err == nil {
						_ = c.Close()
						return fmt.Errorf("%s still accepts connections", b.Addr())
					}
					return nil
				})
				closeWithin(t, b, 10*time.Second)
			}()
			if n := leak.Goroutines(base); n > base {
				t.Fatalf("%d goroutines after the balancer closed, %d before", n, base)
			}
		})
	}
}

// closeWithin fails the test if Close has not returned within d.
func closeWithin(t *testing.T, b *Balancer, d time.Duration) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		_ = b.Close()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("Close has not returned after %s", d)
	}
}

func isClosed(err error) bool {
	return errors.Is(err, net.ErrClosed) || strings.Contains(err.Error(), "connection reset")
}
