package tunnel

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	konnectivity "sigs.k8s.io/apiserver-network-proxy/konnectivity-client/pkg/client"
	konnmetrics "sigs.k8s.io/apiserver-network-proxy/konnectivity-client/pkg/client/metrics"
)

// Transports a pool can use to reach managed clusters.
const (
	// TransportKonnectivity dials through the hub's konnectivity
	// proxy-server (gRPC mode) and the agent the cluster registered.
	TransportKonnectivity = "konnectivity"
	// TransportDirect dials the cluster's API server itself.
	TransportDirect = "direct"
)

// Dialer opens the byte stream to one cluster's API server: a TCP
// connection, or a tunnel that behaves like one. The pool does TLS and
// HTTP/2 on top.
type Dialer interface {
	// Dial connects to address (host:port) for cluster. Cancelling ctx
	// aborts the dial; it does not close a connection already returned.
	Dial(ctx context.Context, cluster, address string) (net.Conn, error)
}

// DirectDialer dials the address over TCP.
type DirectDialer struct {
	net.Dialer
}

// Dial connects to address over TCP.
func (d *DirectDialer) Dial(ctx context.Context, _, address string) (net.Conn, error) {
	return d.DialContext(ctx, "tcp", address)
}

// KonnectivityConfig says how to reach the hub's proxy-server.
type KonnectivityConfig struct {
	// Address is the proxy-server's gRPC address for clients (host:port,
	// port 8090 in cluster-proxy's deployment).
	Address string
	// CAFile verifies the proxy-server's certificate; CertFile and KeyFile
	// are hubsync's client certificate (mutual TLS). They are read again
	// at a dial a second or more after the last read, so rotated files
	// take effect without a restart: new connections use them, and the
	// shared connections made with the old ones take no new tunnel.
	CAFile, CertFile, KeyFile string
	// ServerName is the name in the proxy-server's certificate; default
	// the host of Address.
	ServerName string
	// Connections is how many gRPC connections tunnels share
	// (config.DefaultTunnelProxyConns if 0).
	Connections int
	// SingleUse gives every tunnel a gRPC connection of its own, as
	// konnectivity-client's single-use tunnels do.
	SingleUse bool
	// Log receives the dialer's lines (a change of transport); nil: none.
	Log *slog.Logger
	// Registerer registers the dialer's metrics; nil registers none.
	Registerer prometheus.Registerer
}

// tunnelWindow is each tunnel's HTTP/2 flow-control window (stream and
// connection: a tunnel is one gRPC stream on its own connection) toward
// the proxy-server, fixed. gRPC's default estimates the bandwidth-delay
// product instead, with a PING on the first data after each answered
// one: through the gateway, about one more write to the proxy-server and
// one more answer from it per small request (4.0 -> 3.5 read and write
// system calls per small GET at concurrency 32 in hubsync, 11.3 -> 10.7
// in the proxy-server and agent). 4 MiB lets a tunnel carry about 80 MB/s
// to a proxy-server 50 ms away (a large LIST through konnectivity moves
// 30-45 MB/s here, the same with 1 MiB or the estimate), and bounds what
// one tunnel buffers for a reader that stalls, as the estimate does
// (it grows to 16 MiB).
const tunnelWindow = 4 << 20

// tunnelReadBuffer is the gRPC read buffer of each tunnel.
const tunnelReadBuffer = 8 << 10

// KonnectivityDialer opens konnectivity tunnels: a DIAL_REQ that the
// agent registered for the address's host answers. Tunnels share a few
// gRPC connections to the proxy-server, one stream each (see
// sharedTransport); a proxy-server that refuses several streams on one
// connection, or SingleUse, gives each tunnel a connection of its own
// (konnectivity-client's single-use tunnel). A dial that finds no agent on
// the proxy-server(s) it reached tries new connections (see
// noAgentAttempts). The pool runs one long-lived HTTP/2 connection over
// each tunnel, so one tunnel per cluster serves every request to it.
type KonnectivityDialer struct {
	cfg    KonnectivityConfig
	log    *slog.Logger
	shared *sharedTransport // nil with SingleUse
	// singleUse counts the open single-use tunnels (each a connection).
	singleUse atomic.Int64

	mu     sync.Mutex
	loaded *tlsFiles
}

type tlsFiles struct {
	ca, cert, key []byte
	tls           *tls.Config
	read          time.Time // when the files were last read
}

// NewKonnectivityDialer checks the configuration and the files now, so a
// wrong path is reported at start rather than as every cluster failing.
func NewKonnectivityDialer(cfg KonnectivityConfig) (*KonnectivityDialer, error) {
	if _, _, err := net.SplitHostPort(cfg.Address); err != nil {
		return nil, fmt.Errorf("konnectivity address %q: %w", cfg.Address, err)
	}
	d := &KonnectivityDialer{cfg: cfg, log: cfg.Log}
	if d.log == nil {
		d.log = slog.New(slog.DiscardHandler)
	}
	if !cfg.SingleUse {
		d.shared = newSharedTransport(cfg.Address, cfg.Connections)
	}
	if _, err := d.tlsConfig(); err != nil {
		return nil, err
	}
	if err := d.register(cfg.Registerer); err != nil {
		return nil, err
	}
	return d, nil
}

// register adds the dialer's gauges: the gRPC connections it holds to
// the proxy-server and whether tunnels share them.
func (d *KonnectivityDialer) register(reg prometheus.Registerer) error {
	if reg == nil {
		return nil
	}
	for _, c := range []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "hubsync_tunnel_proxy_connections",
			Help: "gRPC connections this replica holds to the konnectivity proxy-server address: the shared ones, plus one per single-use tunnel.",
		}, func() float64 { return float64(d.Connections()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "hubsync_tunnel_proxy_shared",
			Help: "1 while tunnels share their gRPC connections to the proxy-server, 0 once each has its own (configured, or the proxy-server refused several streams on one connection).",
		}, func() float64 {
			if d.Sharing() {
				return 1
			}
			return 0
		}),
	} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// Connections is how many gRPC connections the dialer holds to the
// proxy-server address now.
func (d *KonnectivityDialer) Connections() int {
	n := int(d.singleUse.Load())
	if d.shared != nil {
		n += d.shared.connections()
	}
	return n
}

// Sharing reports whether new tunnels share connections.
func (d *KonnectivityDialer) Sharing() bool {
	return d.shared != nil && !d.shared.singleUse.Load()
}

// Close ends every shared connection, and with them their tunnels at
// once (the pool closes its dialer when it stops). Single-use tunnels
// end with their own connections.
func (d *KonnectivityDialer) Close() error {
	if d.shared != nil {
		d.shared.close()
	}
	return nil
}

// tlsReread is how long the files read for one dial serve the next ones:
// thousands of clusters dialing at once read them once a second, not
// three times each.
const tlsReread = time.Second

// tlsConfig returns the mutual-TLS configuration for the proxy-server,
// rebuilt when a file changed (looked at once per tlsReread).
func (d *KonnectivityDialer) tlsConfig() (*tls.Config, error) {
	d.mu.Lock()
	if l := d.loaded; l != nil && time.Since(l.read) < tlsReread {
		d.mu.Unlock()
		return l.tls, nil
	}
	d.mu.Unlock()
	read := func(what, path string) ([]byte, error) {
		if path == "" {
			return nil, nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("konnectivity %s: %w", what, err)
		}
		return b, nil
	}
	ca, err := read("CA file", d.cfg.CAFile)
	if err != nil {
		return nil, err
	}
	cert, err := read("certificate file", d.cfg.CertFile)
	if err != nil {
		return nil, err
	}
	key, err := read("key file", d.cfg.KeyFile)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if l := d.loaded; l != nil && string(l.ca) == string(ca) && string(l.cert) == string(cert) && string(l.key) == string(key) {
		l.read = time.Now()
		return l.tls, nil
	}
	host, _, _ := net.SplitHostPort(d.cfg.Address)
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: host}
	if d.cfg.ServerName != "" {
		c.ServerName = d.cfg.ServerName
	}
	if len(ca) > 0 {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(ca) {
			return nil, fmt.Errorf("konnectivity CA file %s holds no PEM certificate", d.cfg.CAFile)
		}
		c.RootCAs = pool
	}
	if len(cert) > 0 || len(key) > 0 {
		pair, err := tls.X509KeyPair(cert, key)
		if err != nil {
			// The error names neither file's content.
			return nil, fmt.Errorf("konnectivity client certificate %s / key %s: %w", d.cfg.CertFile, d.cfg.KeyFile, err)
		}
		c.Certificates = []tls.Certificate{pair}
	}
	d.loaded = &tlsFiles{ca: ca, cert: cert, key: key, tls: c, read: time.Now()}
	return c, nil
}

// noAgentAttempts bounds the gRPC connections one dial opens while the
// proxy-server answers "No agent available". Deployments such as OCM
// cluster-proxy run several proxy-servers behind one Service address, and
// an agent reaches them one at a time, so a connection can land on a
// server the cluster's agent is not connected to (yet) while another
// server has it. Each attempt is a new connection, which the Service may
// route elsewhere: when the agent is connected to one server of two and
// connections are routed at random, four attempts all miss it one time in
// sixteen, and the pool's backoff covers that. A cluster without any
// agent costs four short-lived connections per dial instead of one.
const noAgentAttempts = 4

// noAgentMessage is the proxy-server's DIAL_RSP error when no agent
// registered the dialed host is connected to it (apiserver-network-proxy
// pkg/server ErrNotFound, unchanged up to v0.36.0).
const noAgentMessage = "No agent available"

// Dial opens a tunnel to address through the proxy-server. The returned
// connection owns the tunnel: closing it ends the tunnel (and a
// single-use tunnel's gRPC connection). A dial that finds no agent for
// the address on the proxy-server(s) it reached is tried again on new
// connections, up to noAgentAttempts in all; any other error ends the
// dial.
func (d *KonnectivityDialer) Dial(ctx context.Context, _, address string) (net.Conn, error) {
	tc, err := d.tlsConfig()
	if err != nil {
		return nil, err
	}
	if !d.Sharing() {
		return d.dialSingleUse(ctx, tc, address, 0)
	}
	c, tried, err := d.shared.dial(ctx, tc, address)
	switch {
	case err == nil:
		return newTunnelConn(c, nil), nil
	case errors.Is(err, errStreamRefused):
		// Perhaps a proxy-server (or a proxy before it) that allows one
		// stream per connection: this tunnel gets its own, and sharing
		// stops after refusalsToSingleUse such dials in a row.
		c, serr := d.dialSingleUse(ctx, tc, address, 0)
		if d.shared.refused(serr == nil) {
			d.log.Warn("tunnel: the konnectivity proxy-server ended tunnels that shared a connection before answering them, and answered them on connections of their own: every tunnel now opens its own connection",
				"address", d.cfg.Address, "err", err)
		}
		return c, serr
	case isNoAgent(err):
		// Every shared connection reached a proxy-server without the
		// cluster's agent: a new connection may reach another (at least
		// one, up to noAgentAttempts connections in all).
		c, err := d.dialSingleUse(ctx, tc, address, tried)
		if err != nil {
			return nil, err
		}
		// The agent answered there: it may just have (re)connected,
		// and the shared connections reach it now too. The tunnel keeps
		// a connection of its own only if they do not.
		if sc, _, err := d.shared.dial(ctx, tc, address); err == nil {
			_ = c.Close()
			return newTunnelConn(sc, nil), nil
		}
		return c, nil
	}
	return nil, err
}

// dialSingleUse opens a tunnel on a gRPC connection of its own, trying
// new connections while the proxy-server reached has no agent for the
// address: up to noAgentAttempts connections counting the shared ones
// that had none, and at least one.
func (d *KonnectivityDialer) dialSingleUse(ctx context.Context, tc *tls.Config, address string, shared int) (net.Conn, error) {
	attempts := max(1, noAgentAttempts-shared)
	for attempt := 1; ; attempt++ {
		t, cancel, err := d.open(ctx, tc)
		if err != nil {
			return nil, err
		}
		c, err := t.DialContext(ctx, "tcp", address)
		if err == nil {
			d.singleUse.Add(1)
			var once sync.Once
			return newTunnelConn(c, func() {
				cancel()
				once.Do(func() { d.singleUse.Add(-1) })
			}), nil
		}
		cancel()
		if !isNoAgent(err) {
			return nil, fmt.Errorf("konnectivity: %w", err)
		}
		if attempt >= attempts || ctx.Err() != nil {
			return nil, fmt.Errorf("konnectivity: no agent for this cluster on the proxy-server(s) reached at %s (%d connections tried): %w",
				d.cfg.Address, shared+attempt, err)
		}
	}
}

// isNoAgent reports whether err is the proxy-server's answer that no agent
// for the dialed host is connected to it. konnectivity-client reports
// every DIAL_RSP error as a dial failure of reason "endpoint", which also
// covers an agent that could not reach the address, so the message tells
// the two apart.
func isNoAgent(err error) bool {
	if isSharedNoAgent(err) {
		return true
	}
	ok, reason := konnectivity.GetDialFailureReason(err)
	return ok && reason == konnmetrics.DialFailureEndpoint && strings.Contains(err.Error(), noAgentMessage)
}

// open starts a single-use tunnel on a new gRPC connection to the
// proxy-server. The tunnel lives until cancel is called; ctx bounds only
// the connection's setup.
func (d *KonnectivityDialer) open(ctx context.Context, tc *tls.Config) (konnectivity.Tunnel, context.CancelFunc, error) {
	tunnelCtx, cancel := context.WithCancel(context.Background())
	t, err := konnectivity.CreateSingleUseGrpcTunnelWithContext(ctx, tunnelCtx, d.cfg.Address,
		grpc.WithTransportCredentials(credentials.NewTLS(tc)),
		// A warm tunnel is idle most of the time: its write buffer goes
		// back to a shared pool after each flush instead of staying
		// allocated, and its read buffer is smaller than gRPC's 32 KiB.
		// Thousands of entries then cost far less memory.
		grpc.WithSharedWriteBuffer(true),
		grpc.WithReadBufferSize(tunnelReadBuffer),
		grpc.WithStaticStreamWindowSize(tunnelWindow),
		grpc.WithStaticConnWindowSize(tunnelWindow))
	if err != nil {
		cancel()
		return nil, nil, fmt.Errorf("konnectivity proxy-server %s: %w", d.cfg.Address, err)
	}
	return t, cancel, nil
}

// closeGrace bounds how long closing a tunnel waits for the proxy-server
// to confirm (konnectivity-client waits up to 10 s for a CLOSE_RSP that a
// dead agent never sends); then the tunnel's context ends it.
const closeGrace = 2 * time.Second

// tunnelConn ends a single-use tunnel's context on Close (cancel; nil
// for a shared connection's tunnel, which closes itself), so that no
// goroutine or gRPC connection of a single-use tunnel outlives the
// connection.
//
// Its writes run on a writer goroutine of their own. A write to a tunnel
// goes deep (konnectivity-client, gRPC's encoder and framer), and the HTTP/2
// client writes each request's headers from a goroutine it starts for that
// request: every request then grew a fresh goroutine's stack (about an
// eighth of the gateway's CPU per small GET). The writer's stack grows
// once. It ends after writerIdle without a write, so that an idle warm
// tunnel holds no goroutine for it.
type tunnelConn struct {
	net.Conn
	cancel context.CancelFunc
	once   sync.Once

	wmu     sync.Mutex // serialises writes; held while one is handed over
	writing bool       // the writer runs (under wmu)
	in      chan []byte
	out     chan writeResult
	idle    time.Duration // writerIdle
}

type writeResult struct {
	n   int
	err error
}

// writerIdle is how long the writer goroutine waits for the next write
// before it ends.
const writerIdle = time.Second

func newTunnelConn(c net.Conn, cancel context.CancelFunc) *tunnelConn {
	return &tunnelConn{Conn: c, cancel: cancel, in: make(chan []byte), out: make(chan writeResult), idle: writerIdle}
}

// Write hands b to the writer goroutine, starting it if it has ended, and
// waits for its result: b is not used once Write returns.
func (c *tunnelConn) Write(b []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if !c.writing {
		c.writing = true
		go c.writer()
	}
	c.in <- b
	r := <-c.out
	return r.n, r.err
}

// writer writes what Write hands it until it has been idle for writerIdle
// and no Write is under way (a Write holds wmu until its result is back).
func (c *tunnelConn) writer() {
	idle := time.NewTimer(c.idle)
	defer idle.Stop()
	for {
		select {
		case b := <-c.in:
			n, err := c.Conn.Write(b)
			c.out <- writeResult{n, err}
			idle.Reset(c.idle)
		case <-idle.C:
			if c.wmu.TryLock() {
				c.writing = false
				c.wmu.Unlock()
				return
			}
			// A Write holds the lock and is about to hand its bytes
			// over.
			idle.Reset(c.idle)
		}
	}
}

func (c *tunnelConn) Close() error {
	if c.cancel == nil {
		return c.Conn.Close()
	}
	var err error
	c.once.Do(func() {
		t := time.AfterFunc(closeGrace, c.cancel)
		err = c.Conn.Close()
		t.Stop()
		c.cancel()
	})
	return err
}
