package tunnel

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/test/fleet"
	"github.com/hubsync/hubsync/test/testutil"
	"github.com/hubsync/hubsync/tunnel"
)

// sharedPool runs a pool whose tunnels share connections to the
// proxy-server at addr (at most conns), over clusters that sel matches.
func sharedPool(t *testing.T, ctx context.Context, h *fleet.Hub, addr string, conns int, sel map[string]string) (*tunnel.Pool, *tunnel.KonnectivityDialer) {
	t.Helper()
	kd, err := tunnel.NewKonnectivityDialer(tunnel.KonnectivityConfig{
		Address: addr, CAFile: env.server.CAFile, CertFile: env.server.CertFile, KeyFile: env.server.KeyFile,
		Connections: conns, Log: testLog(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = kd.Close() })
	opts := tunnel.OptionsFor(config.Default().Tunnel)
	opts.Dialer, opts.Transport, opts.Log = kd, tunnel.TransportKonnectivity, testLog(t)
	opts.ProbeInterval, opts.ProbeTimeout, opts.DialTimeout = time.Second, 900*time.Millisecond, 5*time.Second
	opts.BackoffBase, opts.BackoffMax, opts.RetireGrace = 100*time.Millisecond, time.Second, time.Second
	return startPool(t, ctx, h, opts, sel), kd
}

// proxyConns counts this process's TCP connections to the proxy-server
// at addr, as the proxy-server sees them.
func proxyConns(t *testing.T, addr string) int {
	t.Helper()
	n, err := fleet.TCPConnections(os.Getpid(), addr)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestSharedTransport: two clusters' tunnels are two streams on one gRPC
// connection to the real proxy-server (v0.36.0). One cluster's agent
// killed ends that cluster's tunnel only: requests to the other, on the
// same connection, never fail meanwhile and its connection is not
// replaced. The proxy-server restarted: every tunnel comes back, on one
// connection again, and serves requests.
func TestSharedTransport(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	h, err := fleet.NewHub(env.hub)
	if err != nil {
		t.Fatal(err)
	}
	run := runSeq.Add(1)
	sel := map[string]string{"tunnel-test": fmt.Sprintf("shared%d", run)}
	c1, c2 := fmt.Sprintf("shared%d-c1", run), fmt.Sprintf("shared%d-c2", run)
	joinCluster(t, h, c1, env.managed[0], sel)
	joinCluster(t, h, c2, env.managed[1], sel)
	pool, kd := sharedPool(t, ctx, h, env.server.ClientAddress, 1, sel)
	step := func(name string) { t.Logf("--- %s", name) }
	oneConn := func() {
		t.Helper()
		testutil.Eventually(t, 10*time.Second, 10*time.Millisecond, func() error {
			if n, held := proxyConns(t, env.server.ClientAddress), kd.Connections(); n != 1 || held != 1 {
				return fmt.Errorf("%d TCP connections to the proxy-server, the dialer holds %d", n, held)
			}
			return nil
		}, "one connection to the proxy-server")
	}

	step("two clusters ready, their tunnels on one connection")
	waitState(t, pool, c1, tunnel.StateReady, 30*time.Second)
	waitState(t, pool, c2, tunnel.StateReady, 30*time.Second)
	oneConn()
	if !kd.Sharing() {
		t.Fatal("the dialer does not share its connection")
	}

	step("cluster 1's agent killed: its tunnel ends; cluster 2's, on the same connection, serves every request meanwhile")
	before, _ := pool.Status(c2)
	var served, failed atomic.Int32
	var firstErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if got, err := identity(ctx, pool, c2); err != nil || got != env.managed[1].Name {
				failed.Add(1)
				firstErr.CompareAndSwap(nil, fmt.Sprintf("%q, %v", got, err))
			} else {
				served.Add(1)
			}
		}
	})
	env.agents[0].Kill()
	waitState(t, pool, c1, tunnel.StateFailing, 5*time.Second)
	if err := env.agents[0].Start(); err != nil {
		t.Fatal(err)
	}
	waitState(t, pool, c1, tunnel.StateReady, 30*time.Second)
	close(stop)
	wg.Wait()
	if n := failed.Load(); n > 0 {
		t.Fatalf("%d of %d requests to cluster 2 failed while cluster 1's agent was gone; first: %v", n, n+served.Load(), firstErr.Load())
	}
	if served.Load() == 0 {
		t.Fatal("no request to cluster 2 was made")
	}
	if st, _ := pool.Status(c2); st.State != tunnel.StateReady || !st.Since.Equal(before.Since) || st.Dials != before.Dials {
		t.Fatalf("cluster 2 disturbed: %+v, was %+v", st, before)
	}
	t.Logf("%d requests to cluster 2 served meanwhile", served.Load())
	oneConn()

	step("proxy-server restarted: every tunnel back, on one connection")
	env.server.Kill()
	waitState(t, pool, c1, tunnel.StateFailing, 5*time.Second)
	waitState(t, pool, c2, tunnel.StateFailing, 5*time.Second)
	if err := env.server.Start(ctx); err != nil {
		t.Fatal(err)
	}
	waitState(t, pool, c1, tunnel.StateReady, 60*time.Second)
	waitState(t, pool, c2, tunnel.StateReady, 60*time.Second)
	for range 10 {
		for c, want := range map[string]string{c1: env.managed[0].Name, c2: env.managed[1].Name} {
			if got, err := identity(ctx, pool, c); err != nil || got != want {
				t.Fatalf("cluster %s after the restart: %q, %v", c, got, err)
			}
		}
	}
	oneConn()
	if !kd.Sharing() {
		t.Fatal("the restart turned sharing off: streams lost with their connection were taken for refused ones")
	}
}

// oneStreamFront stands before the proxy-server and allows one Proxy
// stream per TCP connection (each forwarded on a connection of its own):
// a later stream on a connection is refused at once, before its dial is
// answered.
type oneStreamFront struct {
	client.UnimplementedProxyServiceServer
	upstream string
	tls      *tls.Config
	mu       sync.Mutex
	seen     map[int64]bool // connections that opened a stream
	refused  atomic.Int32
}

// connTagger numbers the front's connections, for its streams to tell
// theirs apart (a peer's address may come again on a later connection).
type connTagger struct{ n atomic.Int64 }

type connKey struct{}

func (c *connTagger) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return context.WithValue(ctx, connKey{}, c.n.Add(1))
}
func (*connTagger) HandleConn(context.Context, stats.ConnStats) {}
func (*connTagger) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context {
	return ctx
}
func (*connTagger) HandleRPC(context.Context, stats.RPCStats) {}

func (f *oneStreamFront) Proxy(down client.ProxyService_ProxyServer) error {
	conn, _ := down.Context().Value(connKey{}).(int64)
	f.mu.Lock()
	again := f.seen[conn]
	f.seen[conn] = true
	f.mu.Unlock()
	if again {
		f.refused.Add(1)
		return status.Error(codes.ResourceExhausted, "one tunnel per connection")
	}
	cc, err := grpc.NewClient("passthrough:///"+f.upstream, grpc.WithTransportCredentials(credentials.NewTLS(f.tls)))
	if err != nil {
		return err
	}
	defer cc.Close()
	ctx, cancel := context.WithCancel(down.Context())
	defer cancel()
	up, err := client.NewProxyServiceClient(cc).Proxy(ctx)
	if err != nil {
		return err
	}
	done := make(chan struct{}, 2)
	go func() {
		defer func() { done <- struct{}{} }()
		for {
			pkt, err := down.Recv()
			if err != nil || up.Send(pkt) != nil {
				return
			}
		}
	}()
	go func() {
		defer func() { done <- struct{}{} }()
		for {
			pkt, err := up.Recv()
			if err != nil || down.Send(pkt) != nil {
				return
			}
		}
	}()
	<-done
	return nil
}

// startOneStreamFront serves a oneStreamFront for the suite's proxy-server
// on loopback, with the proxy-server's own certificate.
func startOneStreamFront(t *testing.T) (*oneStreamFront, string) {
	t.Helper()
	serving, err := tls.LoadX509KeyPair(env.server.ServingCertFile, env.server.ServingKeyFile)
	if err != nil {
		t.Fatal(err)
	}
	mine, err := tls.LoadX509KeyPair(env.server.CertFile, env.server.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	caPEM, err := os.ReadFile(env.server.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	f := &oneStreamFront{upstream: env.server.ClientAddress, seen: map[int64]bool{},
		tls: &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: roots, Certificates: []tls.Certificate{mine}, ServerName: "127.0.0.1"}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{serving}})),
		grpc.StatsHandler(&connTagger{}))
	client.RegisterProxyServiceServer(s, f)
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(s.Stop)
	return f, ln.Addr().String()
}

// TestSingleUseWhereStreamsAreRefused: behind something that allows one
// tunnel per connection, the tunnels that a shared connection loses
// before their dial is answered are dialed on connections of their own,
// and after a few such refusals every new tunnel is: every cluster is
// ready at its first dial, and serves requests.
func TestSingleUseWhereStreamsAreRefused(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	h, err := fleet.NewHub(env.hub)
	if err != nil {
		t.Fatal(err)
	}
	front, addr := startOneStreamFront(t)
	run := runSeq.Add(1)
	sel := map[string]string{"tunnel-test": fmt.Sprintf("refused%d", run)}
	var clusters []string
	for i := range 6 {
		c := fmt.Sprintf("refused%d-c%d", run, i+1)
		joinCluster(t, h, c, env.managed[i%2], sel)
		clusters = append(clusters, c)
	}
	pool, kd := sharedPool(t, ctx, h, addr, 1, sel)
	for i, c := range clusters {
		waitState(t, pool, c, tunnel.StateReady, 30*time.Second)
		if st, _ := pool.Status(c); st.Dials != 1 {
			t.Fatalf("cluster %s: %d dials, want ready at its first: %+v", c, st.Dials, st)
		}
		if got, err := identity(ctx, pool, c); err != nil || got != env.managed[i%2].Name {
			t.Fatalf("cluster %s: %q, %v", c, got, err)
		}
	}
	if kd.Sharing() {
		t.Fatalf("the dialer still shares its connections after %d refused streams", front.refused.Load())
	}
	if n := front.refused.Load(); n < 3 {
		t.Fatalf("%d streams refused, want at least 3 before sharing stops", n)
	}
	if n := kd.Connections(); n != len(clusters) {
		t.Fatalf("the dialer holds %d connections for %d tunnels", n, len(clusters))
	}
	t.Logf("%d streams refused; %d connections for %d tunnels", front.refused.Load(), kd.Connections(), len(clusters))
}
