package tunnel

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/net/http2"
	"k8s.io/client-go/tools/record"

	"github.com/hubsync/hubsync/events"
	"github.com/hubsync/hubsync/stream"
	"github.com/hubsync/hubsync/test/leak"
)

// profiles tells the pool that each namespace/cluster pair has a profile.
func profiles(p *Pool, pairs ...string) {
	for i := 0; i+1 < len(pairs); i += 2 {
		p.SetProfile(pairs[i], pairs[i+1], true)
	}
}

func TestEntriesWarmWithoutRequestsAndReachTheRightServer(t *testing.T) {
	ca := newTestCA(t)
	a := newFakeAPIServer(t, ca, "cluster-a")
	b := newFakeAPIServer(t, ca, "cluster-b")
	p, rec := newTestPool(t, nil)
	p.SetTarget("a", target(a, ca, "token-a"))
	p.SetTarget("b", target(b, ca, "token-b"))
	// A target alone does not make an entry: the cluster needs a profile
	// (or a selector).
	if _, ok := p.Status("a"); ok {
		t.Fatal("entry for a cluster without profile or selector")
	}
	profiles(p, "team1", "a", "team2", "a", "team1", "b")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, c := range []string{"a", "b"} {
		if err := p.WaitReady(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	// Ready means connected and probed before anyone asked.
	if a.opened.Load() != 1 || len(a.seenTokens()) == 0 {
		t.Fatalf("cluster-a: %d connections, %d requests before any request; want 1 connection and a probe", a.opened.Load(), len(a.seenTokens()))
	}
	for _, tok := range a.seenTokens() {
		if tok != "token-a" {
			t.Fatalf("probe of cluster-a carried token %q, want the cluster's token", tok)
		}
	}
	body, err := get(t, p, "a", "/api", nil)
	if err != nil || !strings.Contains(body, `"server":"cluster-a"`) || !strings.Contains(body, `"proto":"HTTP/2.0"`) {
		t.Fatalf("GET through a: %q, %v", body, err)
	}
	if !a.saw("/api", "") || a.saw("/api", "token-a") {
		t.Fatal("RoundTripper added a credential to a request without one")
	}
	body, err = get(t, p, "b", "/api", http.Header{"Authorization": {"Bearer own"}})
	if err != nil || !strings.Contains(body, `"server":"cluster-b"`) {
		t.Fatalf("GET through b: %q, %v", body, err)
	}
	if !b.saw("/api", "own") {
		t.Fatal("a request's own Authorization was replaced")
	}
	// Authorization carries the ManagedServiceAccount's token, for
	// whoever acts as it, and follows a rotation.
	if auth, err := p.Authorization("b"); err != nil || auth != "Bearer token-b" {
		t.Fatalf("Authorization(b) = %q, %v; want the header value of token-b", auth, err)
	}
	if _, err := p.Authorization("nowhere"); !errors.Is(err, ErrNotServed) {
		t.Fatalf("Authorization of a cluster not served: %v, want ErrNotServed", err)
	}
	p.SetTarget("b", target(b, ca, "token-b2"))
	if auth, err := p.Authorization("b"); err != nil || auth != "Bearer token-b2" {
		t.Fatalf("Authorization(b) after a rotation = %q, %v; want the new token's", auth, err)
	}
	// Many concurrent requests share the one connection.
	errs := make(chan error, 64)
	for range 64 {
		go func() { _, err := get(t, p, "a", "/api", nil); errs <- err }()
	}
	for range 64 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if n := a.opened.Load(); n != 1 {
		t.Fatalf("cluster-a saw %d connections, want 1 shared by every request", n)
	}
	// One ready event per namespace that has the cluster, valid against
	// the published schema.
	eventually(t, "ready events", func() bool {
		return rec.count(stream.TunnelReady, "team1", "a") == 1 && rec.count(stream.TunnelReady, "team2", "a") == 1 &&
			rec.count(stream.TunnelReady, "team1", "b") == 1
	})
	for _, c := range rec.list() {
		data, err := events.Encode(c, "hubsync/test")
		if err != nil {
			t.Fatal(err)
		}
		if err := events.ValidateEvent(data); err != nil {
			t.Fatalf("event %s: %v\n%s", c.Type, err, data)
		}
	}
	// A namespace that gets the cluster later hears its current state.
	profiles(p, "team3", "b")
	if rec.count(stream.TunnelReady, "team3", "b") != 1 {
		t.Fatal("a namespace that newly has the cluster was not told its tunnel is ready")
	}
}

func TestNotServedAndNotReadyFailAtOnce(t *testing.T) {
	ca := newTestCA(t)
	p, _ := newTestPool(t, nil)
	if _, err := get(t, p, "nope", "/api", nil); !errors.Is(err, ErrNotServed) {
		t.Fatalf("unknown cluster: %v, want ErrNotServed", err)
	}
	// A cluster whose server does not exist: failing, and requests fail
	// at once with the reason.
	dead := newFakeAPIServer(t, ca, "dead")
	dead.stop()
	p.SetTarget("d", target(dead, ca, ""))
	p.SetSelected("d", true)
	eventually(t, "failing", func() bool { return state(p, "d") == StateFailing })
	start := time.Now()
	_, err := get(t, p, "d", "/api", nil)
	if !errors.Is(err, ErrNotReady) || !strings.Contains(err.Error(), dead.addr) {
		t.Fatalf("request to a failing cluster: %v, want ErrNotReady with the reason", err)
	}
	if time.Since(start) > time.Second {
		t.Fatalf("request to a failing cluster took %s; it must not wait", time.Since(start))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := p.WaitReady(ctx, "d"); !errors.Is(err, ErrNotReady) || !strings.Contains(err.Error(), "failing") {
		t.Fatalf("WaitReady: %v", err)
	}
	// A ready cluster without a token: the pool does not act for it.
	up := newFakeAPIServer(t, ca, "up")
	p.SetTarget("up", target(up, ca, ""))
	p.SetSelected("up", true)
	eventually(t, "ready", func() bool { return state(p, "up") == StateReady })
	if _, err := p.Authorization("up"); !errors.Is(err, ErrNoCredential) {
		t.Fatalf("Authorization of a cluster without a token: %v, want ErrNoCredential", err)
	}
}

func TestFailingAndRecovering(t *testing.T) {
	tests := []struct {
		name  string
		fault func(s *fakeAPIServer)
		heal  func(s *fakeAPIServer)
		want  string // in the failing reason
	}{
		{name: "server killed", fault: (*fakeAPIServer).stop, heal: (*fakeAPIServer).start, want: "connection"},
		{name: "graceful shutdown (GOAWAY)", fault: (*fakeAPIServer).shutdown, heal: (*fakeAPIServer).start, want: ""},
		{name: "probe refused", fault: func(s *fakeAPIServer) { s.status.Store(http.StatusUnauthorized) },
			heal: func(s *fakeAPIServer) { s.status.Store(0) }, want: "401 Unauthorized"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ca := newTestCA(t)
			s := newFakeAPIServer(t, ca, "flaky")
			other := newFakeAPIServer(t, ca, "steady")
			events := record.NewFakeRecorder(10)
			p, rec := newTestPool(t, func(o *Options) { o.Recorder = events })
			p.SetTarget("flaky", target(s, ca, "t"))
			p.SetTarget("steady", target(other, ca, "t"))
			profiles(p, "ns", "flaky", "ns", "steady")
			eventually(t, "both ready", func() bool { return state(p, "flaky") == StateReady && state(p, "steady") == StateReady })
			steadySince, _ := p.Status("steady")
			tt.fault(s)
			eventually(t, "failing", func() bool { return state(p, "flaky") == StateFailing })
			st, _ := p.Status("flaky")
			if !strings.Contains(st.Reason, tt.want) {
				t.Fatalf("reason %q, want it to mention %q", st.Reason, tt.want)
			}
			if rec.count(stream.TunnelFailing, "ns", "flaky") != 1 {
				t.Fatal("no tunnel.failing event")
			}
			tt.heal(s)
			eventually(t, "ready again", func() bool { return state(p, "flaky") == StateReady })
			if rec.count(stream.TunnelReady, "ns", "flaky") != 2 {
				t.Fatalf("%d tunnel.ready events, want 2", rec.count(stream.TunnelReady, "ns", "flaky"))
			}
			if body, err := get(t, p, "flaky", "/api", nil); err != nil || !strings.Contains(body, "flaky") {
				t.Fatalf("after recovery: %q, %v", body, err)
			}
			// Kubernetes Events on the ManagedCluster: the failure and the
			// recovery, not the first ready.
			var got []string
			for len(events.Events) > 0 {
				got = append(got, <-events.Events)
			}
			if len(got) != 2 || !strings.HasPrefix(got[0], "Warning TunnelFailing") || !strings.HasPrefix(got[1], "Normal TunnelReady") {
				t.Fatalf("Kubernetes Events %q, want TunnelFailing then TunnelReady", got)
			}
			// The other cluster never noticed.
			now, _ := p.Status("steady")
			if now.State != StateReady || !now.Since.Equal(steadySince.Since) || now.Dials != 1 {
				t.Fatalf("steady cluster disturbed: %+v", now)
			}
		})
	}
}

// A GOAWAY from a server that keeps answering is a reason to move to a
// new connection, not a failure.
func TestGoAwayMovesToANewConnectionWithoutFailing(t *testing.T) {
	ca := newTestCA(t)
	s := newFakeAPIServer(t, ca, "g")
	p, rec := newTestPool(t, func(o *Options) { o.ProbeInterval = time.Hour })
	p.SetTarget("g", target(s, ca, ""))
	profiles(p, "ns", "g")
	eventually(t, "ready", func() bool { return state(p, "g") == StateReady })
	for i := range 3 {
		s.goaway()
		// No probe runs (the interval is an hour): the transport's
		// report of the GOAWAY makes the entry redial.
		eventually(t, "new connection", func() bool { return s.opened.Load() == int32(i+2) })
		if body, err := get(t, p, "g", "/api", nil); err != nil || !strings.Contains(body, `"server":"g"`) {
			t.Fatalf("after GOAWAY %d: %q, %v", i+1, body, err)
		}
	}
	eventually(t, "old connections closed", func() bool { return s.conns.Load() == 1 })
	if n := rec.count(stream.TunnelFailing, "ns", "g"); n != 0 || state(p, "g") != StateReady {
		t.Fatalf("GOAWAY reported as failing (%d events, state %s)", n, state(p, "g"))
	}
}

// A connection whose every stream is busy (long watches) is not a failing
// one: probes still pass, nothing is redialed or cut, and a further
// request waits for a stream.
func TestBusyConnectionIsNotReplaced(t *testing.T) {
	ca := newTestCA(t)
	s := newFakeAPIServerWith(t, ca, "busy", 2)
	p, rec := newTestPool(t, func(o *Options) {
		o.ProbeInterval, o.ProbeTimeout = 20*time.Millisecond, 200*time.Millisecond
		o.MaxConnsPerCluster = 1 // no overflow connection: the third request waits
	})
	p.SetTarget("busy", target(s, ca, ""))
	profiles(p, "ns", "busy")
	eventually(t, "ready", func() bool { return state(p, "busy") == StateReady })
	done := make(chan error, 3)
	for range 2 {
		go func() { _, err := get(t, p, "busy", "/block", nil); done <- err }()
	}
	eventually(t, "both streams held", func() bool { return s.blocked.Load() == 2 })
	go func() { _, err := get(t, p, "busy", "/block", nil); done <- err }()
	probes := func() float64 { return testutil.ToFloat64(p.m.probes.WithLabelValues("ok")) }
	before := probes()
	eventually(t, "probes passing while every stream is busy", func() bool { return probes() >= before+5 })
	if st, _ := p.Status("busy"); st.State != StateReady || st.Dials != 1 || s.opened.Load() != 1 || rec.count(stream.TunnelFailing, "ns", "busy") != 0 {
		t.Fatalf("a busy connection was treated as failing: %+v, %d connections", st, s.opened.Load())
	}
	close(s.block)
	for range 3 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}

// When every stream is busy, the entry adds connections, up to its
// bound, and closes them once idle.
func TestOverflowConnections(t *testing.T) {
	ca := newTestCA(t)
	s := newFakeAPIServerWith(t, ca, "o", 2)
	p, _ := newTestPool(t, func(o *Options) {
		o.MaxConnsPerCluster, o.ExtraIdle = 2, 50*time.Millisecond
		o.ProbeInterval = 20 * time.Millisecond
	})
	p.SetTarget("o", target(s, ca, ""))
	p.SetSelected("o", true)
	eventually(t, "ready", func() bool { return state(p, "o") == StateReady })
	done := make(chan error, 5)
	block := func() { _, err := get(t, p, "o", "/block", nil); done <- err }
	go block()
	go block()
	eventually(t, "the first connection's streams held", func() bool { return s.blocked.Load() == 2 })
	// A request now gets a second connection and is answered at once.
	if body, err := get(t, p, "o", "/version", nil); err != nil || !strings.Contains(body, `"server":"o"`) {
		t.Fatalf("request while the first connection is busy: %q, %v", body, err)
	}
	if n := s.opened.Load(); n != 2 {
		t.Fatalf("%d connections, want an overflow connection", n)
	}
	go block()
	go block()
	eventually(t, "both connections' streams held", func() bool { return s.blocked.Load() == 4 })
	// At the bound, a request waits for a stream instead of dialing.
	go block()
	e := p.entry("o")
	eventually(t, "the fifth request waiting for a stream", func() bool {
		e.mu.Lock()
		defer e.mu.Unlock()
		n := e.cc.State().StreamsPending
		for _, x := range e.extra {
			n += x.State().StreamsPending
		}
		return n == 1
	})
	if n := s.opened.Load(); n != 2 {
		t.Fatalf("%d connections, want at most MaxConnsPerCluster (2)", n)
	}
	if st, _ := p.Status("o"); st.Connections != 2 {
		t.Fatalf("status says %d connections, want 2", st.Connections)
	}
	close(s.block)
	for range 5 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	// Idle, the overflow connection goes; the entry keeps its own.
	eventually(t, "overflow connection closed", func() bool { return s.conns.Load() == 1 })
	if st, _ := p.Status("o"); st.State != StateReady || st.Dials != 2 {
		t.Fatalf("status %+v", st)
	}
}

func TestLeavingClosesTheConnection(t *testing.T) {
	ca := newTestCA(t)
	s := newFakeAPIServer(t, ca, "c")
	p, _ := newTestPool(t, nil)
	p.SetTarget("c", target(s, ca, ""))
	profiles(p, "ns1", "c", "ns2", "c")
	eventually(t, "ready", func() bool { return state(p, "c") == StateReady })
	p.SetProfile("ns1", "c", false)
	if state(p, "c") != StateReady || s.conns.Load() != 1 {
		t.Fatal("the cluster left the pool while a namespace still has it")
	}
	// The last profile goes: the cluster leaves, and its connection closes.
	p.SetProfile("ns2", "c", false)
	if _, ok := p.Status("c"); ok {
		t.Fatal("entry still there after the cluster left")
	}
	eventually(t, "connection closed", func() bool { return s.conns.Load() == 0 })
	// Back by selector, then gone from the hub.
	p.SetSelected("c", true)
	eventually(t, "ready by selector", func() bool { return state(p, "c") == StateReady })
	p.SetTarget("c", nil)
	eventually(t, "closed with the cluster", func() bool { return s.conns.Load() == 0 })
}

func TestNewTargetIsDialedBeforeTheOldConnectionCloses(t *testing.T) {
	ca := newTestCA(t)
	oldSrv := newFakeAPIServer(t, ca, "c")
	newSrv := newFakeAPIServer(t, ca, "c")
	p, rec := newTestPool(t, nil)
	p.SetTarget("c", target(oldSrv, ca, ""))
	p.SetSelected("c", true)
	profiles(p, "ns", "c")
	eventually(t, "ready", func() bool { return state(p, "c") == StateReady })
	// A token rotation alone keeps the connection.
	tgt := target(oldSrv, ca, "rotated")
	p.SetTarget("c", tgt)
	eventually(t, "rotated token used", func() bool {
		toks := oldSrv.seenTokens()
		return len(toks) > 0 && toks[len(toks)-1] == "rotated"
	})
	if oldSrv.opened.Load() != 1 {
		t.Fatal("a token rotation redialed")
	}
	// A new address (or CA): the entry dials it, stays ready throughout,
	// and retires the old connection.
	p.SetTarget("c", target(newSrv, ca, "rotated"))
	eventually(t, "new connection", func() bool { return newSrv.opened.Load() == 1 })
	eventually(t, "old connection closed", func() bool { return oldSrv.conns.Load() == 0 })
	if state(p, "c") != StateReady || rec.count(stream.TunnelFailing, "ns", "c") != 0 {
		t.Fatal("the entry failed while moving to a new target")
	}
}

func TestDialsAreBounded(t *testing.T) {
	ca := newTestCA(t)
	s := newFakeAPIServer(t, ca, "shared")
	d := &countingDialer{delay: 20 * time.Millisecond}
	p, _ := newTestPool(t, func(o *Options) { o.Dialer = d; o.MaxDials = 3 })
	const n = 40
	for i := range n {
		c := "c" + string(rune('a'+i%26)) + string(rune('a'+i/26))
		p.SetTarget(c, target(s, ca, ""))
		p.SetSelected(c, true)
	}
	eventually(t, "all ready", func() bool {
		ready := 0
		for _, st := range p.Statuses() {
			if st.State == StateReady {
				ready++
			}
		}
		return ready == n
	})
	if peak := d.peak.Load(); peak > 3 || peak < 2 {
		t.Fatalf("%d dials at once, want at most MaxDials (3) and some concurrency", peak)
	}
}

func TestMetricsAndStatuses(t *testing.T) {
	ca := newTestCA(t)
	s := newFakeAPIServer(t, ca, "m")
	reg := prometheus.NewRegistry()
	p, _ := newTestPool(t, func(o *Options) { o.Registerer = reg })
	p.SetTarget("m", target(s, ca, "secret-token"))
	p.SetSelected("m", true)
	eventually(t, "ready", func() bool { return state(p, "m") == StateReady })
	if n := testutil.ToFloat64(p.m.dials.WithLabelValues("ok")); n != 1 {
		t.Fatalf("dials ok = %v", n)
	}
	want := `
# HELP hubsync_tunnel_entries Pool entries by state.
# TYPE hubsync_tunnel_entries gauge
hubsync_tunnel_entries{state="connecting"} 0
hubsync_tunnel_entries{state="failing"} 0
hubsync_tunnel_entries{state="ready"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "hubsync_tunnel_entries"); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, mf := range mfs {
		names = append(names, mf.GetName())
		if strings.Contains(mf.String(), "secret-token") {
			t.Fatalf("metric %s carries the token", mf.GetName())
		}
	}
	for _, n := range []string{"hubsync_tunnel_state", "hubsync_tunnel_state_since_timestamp_seconds", "hubsync_tunnel_probe_duration_seconds", "hubsync_tunnel_dial_duration_seconds"} {
		if !slices.Contains(names, n) {
			t.Fatalf("metric %s missing from %v", n, names)
		}
	}
	st, _ := p.Status("m")
	if st.ProbeLatency <= 0 || st.LastProbe.IsZero() || st.Credential != "sha256:test" || st.Address != s.addr {
		t.Fatalf("status %+v", st)
	}
}

// After many clusters come and go, nothing of theirs is left running.
func TestNoLeakAfterManyCycles(t *testing.T) {
	ca := newTestCA(t)
	s := newFakeAPIServer(t, ca, "cycle")
	p, _ := newTestPool(t, nil)
	warm := func() {
		p.SetTarget("x", target(s, ca, ""))
		p.SetSelected("x", true)
		eventually(t, "ready", func() bool { return state(p, "x") == StateReady })
		if _, err := get(t, p, "x", "/api", nil); err != nil {
			t.Fatal(err)
		}
		p.SetTarget("x", nil)
		eventually(t, "closed", func() bool { return s.conns.Load() == 0 })
	}
	warm() // the first cycle starts what lives as long as the process
	baseG := leak.Baseline()
	baseFD, err := leak.OpenFDs()
	if err != nil {
		t.Skipf("cannot count file descriptors: %v", err)
	}
	for range 100 {
		warm()
	}
	if g := leak.Goroutines(baseG); g > baseG {
		t.Fatalf("goroutines: %d after 100 cycles, %d before", g, baseG)
	}
	if fd, _ := leak.OpenFDs(); fd > baseFD {
		t.Fatalf("open file descriptors: %d after 100 cycles, %d before", fd, baseFD)
	}
}

func TestTruncate(t *testing.T) {
	tests := []struct {
		in   string
		n    int
		want string
	}{
		{"short", 10, "short"},
		{"exactly10!", 10, "exactly10!"},
		{"a long reason", 10, "a long ..."},
		{"ééééé", 8, "éé..."}, // never half a rune
	}
	for _, tt := range tests {
		if got := truncate(tt.in, tt.n); got != tt.want || len(got) > tt.n {
			t.Errorf("truncate(%q, %d) = %q, want %q", tt.in, tt.n, got, tt.want)
		}
	}
}

// gatedDialer holds every dial to one cluster until release is closed
// (whatever the dial's deadline), once hold is set; other dials go
// through.
type gatedDialer struct {
	DirectDialer
	cluster string
	hold    atomic.Bool
	release chan struct{}
	held    atomic.Int32
}

func (d *gatedDialer) Dial(ctx context.Context, cluster, address string) (net.Conn, error) {
	if cluster == d.cluster && d.hold.Load() {
		d.held.Add(1)
		<-d.release
	}
	return d.DirectDialer.Dial(ctx, cluster, address)
}

// TestUpgradeDialsHaveTheirOwnBound: upgrade dials take slots of their
// own: while they are all taken, further upgrades fail with
// ErrUpgradesBusy after a dial's time, and a cluster joining still dials
// although MaxDials is 1.
func TestUpgradeDialsHaveTheirOwnBound(t *testing.T) {
	ca := newTestCA(t)
	up, other := newFakeAPIServer(t, ca, "up"), newFakeAPIServer(t, ca, "other")
	d := &gatedDialer{cluster: "up", release: make(chan struct{})}
	reg := prometheus.NewRegistry()
	p, _ := newTestPool(t, func(o *Options) {
		o.Dialer, o.MaxDials, o.MaxUpgradeDials, o.DialTimeout, o.Registerer = d, 1, 1, 300*time.Millisecond, reg
	})
	p.SetTarget("up", target(up, ca, ""))
	p.SetSelected("up", true)
	eventually(t, "ready", func() bool { return state(p, "up") == StateReady })
	d.hold.Store(true)
	upgrade := func() error {
		req, _ := http.NewRequest(http.MethodGet, "https://up/api/v1/namespaces/a/pods/p/exec", nil)
		req.Header.Set("Connection", "Upgrade")
		req.Header.Set("Upgrade", "websocket")
		resp, err := p.UpgradeRoundTripper("up").RoundTrip(req)
		if err == nil {
			_ = resp.Body.Close()
		}
		return err
	}
	first := make(chan error, 1)
	go func() { first <- upgrade() }()
	eventually(t, "an upgrade dial in progress", func() bool { return d.held.Load() == 1 })
	if err := upgrade(); !errors.Is(err, ErrUpgradesBusy) {
		t.Fatalf("an upgrade while the only slot is taken: %v; want ErrUpgradesBusy", err)
	}
	// The entries' dials are not held up by upgrades.
	p.SetTarget("other", target(other, ca, ""))
	p.SetSelected("other", true)
	eventually(t, "another cluster dialed while the upgrade slot is taken", func() bool { return state(p, "other") == StateReady })
	close(d.release)
	<-first
	if n := testutil.ToFloat64(p.m.upgradeDials.WithLabelValues("busy")); n != 1 {
		t.Fatalf("hubsync_tunnel_upgrade_dials_total{result=busy} = %v; want 1", n)
	}
}

// TestOnDemand: with warm: onDemand a served cluster is not dialed until
// it is asked for, the first request dials it, and the entry closes once
// idle for IdleTimeout; the next request dials again. A cluster the pool
// does not serve is not dialed by asking.
func TestOnDemand(t *testing.T) {
	ca := newTestCA(t)
	s := newFakeAPIServer(t, ca, "c")
	p, _ := newTestPool(t, func(o *Options) { o.OnDemand, o.IdleTimeout = true, 300*time.Millisecond })
	p.SetTarget("c", target(s, ca, "t"))
	p.SetTarget("stranger", target(s, ca, "t"))
	profiles(p, "ns", "c")
	if st, ok := p.Status("c"); !ok || st.State != StateIdle {
		t.Fatalf("status before any request: %+v, %v; want idle", st, ok)
	}
	if connecting, total := p.Pending(); connecting != 0 || total != 0 || s.opened.Load() != 0 {
		t.Fatalf("%d of %d entries connecting, %d connections before any request; want none", connecting, total, s.opened.Load())
	}
	for round := 1; round <= 2; round++ {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := p.WaitReady(ctx, "c")
		cancel()
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		resp, err := (&http.Client{Transport: p.RoundTripper("c")}).Get("https://c/version")
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		_ = resp.Body.Close()
		if s.opened.Load() != int32(round) {
			t.Fatalf("round %d: %d connections opened; want %d", round, s.opened.Load(), round)
		}
		eventually(t, "closed when idle", func() bool {
			st, _ := p.Status("c")
			return st.State == StateIdle && s.conns.Load() == 0
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := p.WaitReady(ctx, "stranger"); !errors.Is(err, ErrNotServed) {
		t.Fatalf("a cluster without a profile: %v; want ErrNotServed", err)
	}
}

// TestOnDemandSlowDialIsNotIdle: an entry dialed on demand whose first
// dial takes longer than IdleTimeout, while a request waits for it, is
// not closed as idle under the waiting request.
func TestOnDemandSlowDialIsNotIdle(t *testing.T) {
	ca := newTestCA(t)
	s := newFakeAPIServer(t, ca, "c")
	d := &countingDialer{delay: 600 * time.Millisecond}
	p, _ := newTestPool(t, func(o *Options) { o.Dialer, o.OnDemand, o.IdleTimeout = d, true, 100*time.Millisecond })
	p.SetTarget("c", target(s, ca, "t"))
	profiles(p, "ns", "c")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := p.WaitReady(ctx, "c"); err != nil {
		t.Fatalf("waiting for a slow dial on demand: %v", err)
	}
}

// dyingDialer dials directly and closes each connection a while after
// it was made, as a flaky network path or proxy would.
type dyingDialer struct {
	DirectDialer
	after time.Duration
	dials atomic.Int32
}

func (d *dyingDialer) Dial(ctx context.Context, cluster, address string) (net.Conn, error) {
	d.dials.Add(1)
	c, err := d.DirectDialer.Dial(ctx, cluster, address)
	if err == nil {
		time.AfterFunc(d.after, func() { _ = c.Close() })
	}
	return c, err
}

// TestDyingConnectionsAreRedialedWithBackoff: a cluster whose
// connections die right after they become ready is redialed at the
// backoff's pace (one quick redial, then the backoff), not in a loop.
func TestDyingConnectionsAreRedialedWithBackoff(t *testing.T) {
	ca := newTestCA(t)
	s := newFakeAPIServer(t, ca, "c")
	d := &dyingDialer{after: 30 * time.Millisecond}
	p, _ := newTestPool(t, func(o *Options) {
		o.Dialer, o.ProbeInterval, o.BackoffBase, o.BackoffMax = d, time.Minute, 400*time.Millisecond, 400*time.Millisecond
	})
	p.SetTarget("c", target(s, ca, ""))
	profiles(p, "ns", "c")
	eventually(t, "failing once", func() bool { return state(p, "c") == StateFailing })
	start, before := time.Now(), d.dials.Load()
	eventually(t, "four more dials", func() bool { return d.dials.Load()-before >= 4 })
	// Four dials take at least two backoff waits of 200–400 ms (the
	// backoff with its jitter; one of them may be the quick redial of a
	// connection that was ready); without the backoff they take a few
	// tens of milliseconds.
	if took := time.Since(start); took < 350*time.Millisecond {
		t.Fatalf("four redials within %s with a 400 ms backoff", took)
	}
}

// perClusterGates holds each cluster's dials until its gate is opened.
type perClusterGates struct {
	DirectDialer
	mu    sync.Mutex
	gates map[string]chan struct{}
}

func (d *perClusterGates) gate(cluster string) chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	g, ok := d.gates[cluster]
	if !ok {
		g = make(chan struct{})
		d.gates[cluster] = g
	}
	return g
}

func (d *perClusterGates) Dial(ctx context.Context, cluster, address string) (net.Conn, error) {
	select {
	case <-d.gate(cluster):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return d.DirectDialer.Dial(ctx, cluster, address)
}

// TestWaitWarm: the warm-up wait returns once every entry has dialed
// once, whatever the order the dials end in, and is not held by an entry
// that left the pool while it was connecting.
func TestWaitWarm(t *testing.T) {
	ca := newTestCA(t)
	s := newFakeAPIServer(t, ca, "shared")
	d := &perClusterGates{gates: map[string]chan struct{}{}}
	p, _ := newTestPool(t, func(o *Options) { o.Dialer = d; o.MaxDials = 100 })
	const n = 30
	var clusters []string
	for i := range n {
		c := fmt.Sprintf("c%02d", i)
		clusters = append(clusters, c)
		p.SetTarget(c, target(s, ca, ""))
		p.SetSelected(c, true)
	}
	done := make(chan error, 1)
	go func() { done <- p.WaitWarm(context.Background()) }()
	// All but two dial, in an order of their own.
	rand.Shuffle(len(clusters), func(i, j int) { clusters[i], clusters[j] = clusters[j], clusters[i] })
	leaving, last := clusters[0], clusters[1]
	for _, c := range clusters[2:] {
		close(d.gate(c))
	}
	eventually(t, "all but two dialed", func() bool { connecting, _ := p.Pending(); return connecting == 2 })
	select {
	case err := <-done:
		t.Fatalf("WaitWarm returned (%v) with two entries connecting", err)
	default:
	}
	// One leaves while connecting: the other still holds the wait.
	p.SetSelected(leaving, false)
	eventually(t, "one left", func() bool { connecting, total := p.Pending(); return connecting == 1 && total == n-1 })
	select {
	case err := <-done:
		t.Fatalf("WaitWarm returned (%v) with an entry connecting", err)
	default:
	}
	close(d.gate(last))
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("WaitWarm did not return once every entry had dialed")
	}
	if connecting, _ := p.Pending(); connecting != 0 {
		t.Fatalf("WaitWarm returned with %d entries connecting", connecting)
	}
}

// goawayServer is an HTTP/2 server that answers each connection's first
// PING and then sends GOAWAY on it, as an API server shutting down does
// to every connection it gets.
type goawayServer struct {
	addr   string
	opened atomic.Int32
}

func newGoawayServer(t *testing.T, ca *testCA, name string) *goawayServer {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{ca.serving(t, "127.0.0.1", name)}, NextProtos: []string{"h2"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	s := &goawayServer{addr: ln.Addr().String()}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.opened.Add(1)
			go s.serve(c)
		}
	}()
	return s
}

func (s *goawayServer) serve(c net.Conn) {
	defer c.Close()
	preface := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(c, preface); err != nil {
		return
	}
	fr := http2.NewFramer(c, c)
	if fr.WriteSettings() != nil {
		return
	}
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() && fr.WriteSettingsAck() != nil {
				return
			}
		case *http2.PingFrame:
			if f.IsAck() {
				continue
			}
			if fr.WritePing(true, f.Data) != nil || fr.WriteGoAway(0, http2.ErrCodeNo, nil) != nil {
				return
			}
		}
	}
}

// TestGoAwaysAreFollowedAtABoundedPace: a server that sends GOAWAY on
// every connection right after its first answer keeps no connection: it
// is redialed after the redial backoff, as a failing one is, not in a
// loop, even while requests keep kicking the entry (each that finds the
// connection gone away does). The entry says it is paced, requests fail
// at once meanwhile, and the cluster is not reported failing for it.
func TestGoAwaysAreFollowedAtABoundedPace(t *testing.T) {
	ca := newTestCA(t)
	s := newGoawayServer(t, ca, "g")
	const base, max = 100 * time.Millisecond, 400 * time.Millisecond
	p, rec := newTestPool(t, func(o *Options) { o.ProbeInterval, o.BackoffBase, o.BackoffMax = time.Hour, base, max })
	p.SetTarget("g", &Target{Address: s.addr, ServerName: "g", CA: ca.pem, TokenFingerprint: "sha256:test"})
	profiles(p, "ns", "g")
	eventually(t, "an entry", func() bool { return p.entry("g") != nil })
	kicks, stop := p.entry("g"), make(chan struct{})
	defer close(stop)
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
				kicks.wake()
			}
		}
	}()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("%d connections opened; statuses: %+v", s.opened.Load(), p.Statuses())
		}
	})
	eventually(t, "the first connection", func() bool { return s.opened.Load() >= 1 })
	start, before := time.Now(), s.opened.Load()
	const redials = 8
	var paced string
	eventually(t, "paced redials", func() bool {
		if st, _ := p.Status("g"); st.Paced != "" {
			paced = st.Paced
		}
		return s.opened.Load() >= before+redials
	})
	// Eight redials wait at least the lower halves of the backoff's
	// steps: 50+100+200 ms, then 200 ms each. At the GOAWAY rate alone
	// (goawayRedials a second after a burst of goawayRedialBurst) they
	// take a few milliseconds.
	if took, least := time.Since(start), 350*time.Millisecond+(redials-3)*max/2; took < least {
		t.Fatalf("%d redials after GOAWAYs within %s, want at least %s with a %s-%s backoff", redials, took, least, base, max)
	}
	if !strings.Contains(paced, "the API server sent GOAWAY") || !strings.Contains(paced, "the next dial waits") {
		t.Fatalf("the entry never said it was paced (last: %q)", paced)
	}
	if v := testutil.ToFloat64(p.m.goawayWaits); v < redials-1 {
		t.Errorf("hubsync_tunnel_goaway_waits_total = %v after %d paced redials", v, redials)
	}
	if n := rec.count(stream.TunnelFailing, "ns", "g"); n != 0 {
		t.Fatalf("GOAWAYs reported as failing (%d events)", n)
	}
}

// TestThrottledProbesKeepTheConnection: an API server that answers the
// probe 429 with Retry-After is reachable and shedding load: the entry
// stays ready on its one connection, probes no sooner than Retry-After
// asks, and says it is paced; once the server answers 200 again, the
// pacing ends.
func TestThrottledProbesKeepTheConnection(t *testing.T) {
	ca := newTestCA(t)
	s := newFakeAPIServer(t, ca, "busy")
	s.status.Store(http.StatusTooManyRequests)
	s.retryAfter.Store("1")
	p, rec := newTestPool(t, nil) // probes every 100 ms
	p.SetTarget("busy", target(s, ca, "tok"))
	profiles(p, "ns", "busy")
	probes := func() int { return s.count("/version") }
	eventually(t, "ready and paced", func() bool {
		st, _ := p.Status("busy")
		return st.State == StateReady && strings.Contains(st.Paced, "429 Too Many Requests (Retry-After 1s)")
	})
	start, before := time.Now(), probes()
	eventually(t, "two more probes", func() bool { return probes() >= before+2 })
	if took := time.Since(start); took < 1500*time.Millisecond {
		t.Fatalf("two probes within %s of a 429 with Retry-After 1s", took)
	}
	if n := s.opened.Load(); n != 1 {
		t.Fatalf("%d connections to a server that answers 429, want the first kept", n)
	}
	if v := testutil.ToFloat64(p.m.probes.WithLabelValues("throttled")); v < 2 {
		t.Errorf("hubsync_tunnel_probes_total{result=\"throttled\"} = %v", v)
	}
	s.status.Store(0)
	eventually(t, "pacing over", func() bool {
		st, _ := p.Status("busy")
		return st.State == StateReady && st.Paced == ""
	})
	if n := rec.count(stream.TunnelFailing, "ns", "busy"); n != 0 {
		t.Fatalf("a throttled cluster reported failing (%d events)", n)
	}
}

// TestRedialsResumeTheTLSSession: after a GOAWAY (the address answering
// on, with the same session ticket key, as API servers behind one name
// do), the entry's next connection resumes the TLS session of the one
// before, with no certificate sent or verified again; after a new CA, the
// first connection is a full handshake.
func TestRedialsResumeTheTLSSession(t *testing.T) {
	ca := newTestCA(t)
	s := newFakeAPIServer(t, ca, "r")
	p, _ := newTestPool(t, func(o *Options) { o.ProbeInterval = time.Hour })
	p.SetTarget("r", target(s, ca, ""))
	profiles(p, "ns", "r")
	eventually(t, "ready", func() bool { return state(p, "r") == StateReady })
	for i := range 2 {
		s.goaway()
		eventually(t, "a new connection", func() bool { return s.opened.Load() == int32(i+2) })
		if _, err := get(t, p, "r", "/api", nil); err != nil {
			t.Fatal(err)
		}
	}
	// A handshake is counted as the server finishes it, which may come
	// after the client has its new connection.
	eventually(t, "3 handshakes", func() bool { return s.handshakes.Load() == 3 })
	if r := s.resumed.Load(); r != 2 {
		t.Fatalf("%d of 3 handshakes resumed; want the 2 redials", r)
	}
	// The same server, trusted through another CA bundle (the old CA and
	// another): a configuration of its own, which starts without sessions.
	tgt := target(s, ca, "")
	tgt.CA = append(append([]byte(nil), ca.pem...), newTestCA(t).pem...)
	p.SetTarget("r", tgt)
	eventually(t, "a handshake for the new CA", func() bool { return s.handshakes.Load() == 4 })
	if _, err := get(t, p, "r", "/api", nil); err != nil {
		t.Fatal(err)
	}
	if h, r := s.handshakes.Load(), s.resumed.Load(); h != 4 || r != 2 {
		t.Fatalf("%d handshakes, %d resumed after the CA changed; want 4 and still 2", h, r)
	}
}
