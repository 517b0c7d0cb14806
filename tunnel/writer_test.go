package tunnel

import (
	"bytes"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hubsync/hubsync/test/testutil"
)

// goroutineID is the id runtime.Stack prints for the calling goroutine.
func goroutineID() int {
	buf := make([]byte, 64)
	buf = buf[:runtime.Stack(buf, false)]
	f := bytes.Fields(buf)
	if len(f) < 2 {
		return -1
	}
	id, _ := strconv.Atoi(string(f[1]))
	return id
}

// recordingConn records each write and the goroutine that made it.
type recordingConn struct {
	net.Conn
	mu      sync.Mutex
	writes  []string
	writers map[int]bool
}

func (c *recordingConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.writes = append(c.writes, string(b))
	c.writers[goroutineID()] = true
	return len(b), nil
}

func (c *recordingConn) Close() error { return nil }

// TestTunnelConnWritesOnItsWriter: a tunnel's writes, from many
// goroutines (the HTTP/2 client starts one per request), all run on the
// connection's one writer goroutine, each whole; the writer ends when the
// connection is idle and starts again with the next write.
func TestTunnelConnWritesOnItsWriter(t *testing.T) {
	rec := &recordingConn{writers: map[int]bool{}}
	c := newTunnelConn(rec, func() {})
	c.idle = 50 * time.Millisecond
	var wg sync.WaitGroup
	callers := make(chan int, 20)
	for i := range 20 {
		wg.Go(func() {
			callers <- goroutineID()
			msg := bytes.Repeat([]byte{byte('a' + i)}, 100)
			if n, err := c.Write(msg); n != len(msg) || err != nil {
				t.Errorf("Write = %d, %v", n, err)
			}
		})
	}
	wg.Wait()
	close(callers)
	rec.mu.Lock()
	if len(rec.writes) != 20 {
		t.Fatalf("%d writes reached the connection, want 20", len(rec.writes))
	}
	for _, w := range rec.writes {
		if len(w) != 100 || strings.Count(w, w[:1]) != 100 {
			t.Fatalf("a write arrived mixed with another: %q", w)
		}
	}
	if len(rec.writers) != 1 {
		t.Fatalf("the writes ran on %d goroutines, want the one writer", len(rec.writers))
	}
	for id := range callers {
		if rec.writers[id] {
			t.Fatalf("a caller's goroutine (%d) wrote to the connection itself", id)
		}
	}
	rec.mu.Unlock()

	testutil.Eventually(t, 5*time.Second, 10*time.Millisecond, func() bool {
		c.wmu.Lock()
		defer c.wmu.Unlock()
		return !c.writing
	}, "the writer did not end after the connection was idle")
	if _, err := c.Write([]byte("again")); err != nil {
		t.Fatal(err)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if last := rec.writes[len(rec.writes)-1]; last != "again" {
		t.Fatalf("the write after the writer ended was %q", last)
	}
}
