package tunnel

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hubsync/hubsync/config"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"
)

// What the released proxy-server (apiserver-network-proxy v0.36.0, gRPC
// mode) accepts, and so what the shared transport relies on:
//   - any number of Proxy streams on one gRPC connection: its state is
//     kept per stream and per dial, and the end of a stream closes only
//     that stream's tunnel, never the connection;
//   - exactly one DIAL_REQ per stream (a second connection id on a
//     stream makes it close both), so a tunnel is one stream;
//   - each DIAL_REQ picks its agent on its own, so streams on one
//     connection reach different clusters;
//   - a stream that ends before its dial was answered or its tunnel was
//     closed is cleaned up by the server (DIAL_CLS or CLOSE_REQ to the
//     agent), so cancelling a stream is a complete close.
//
// konnectivity-client v0.36.0 offers only single-use tunnels (a gRPC
// connection per tunnel, closed with it), so the shared transport speaks
// the protocol itself, one stream per tunnel.

// proxyConnWindow is the connection-level flow-control window of a shared
// connection. gRPC returns connection-level window as data arrives (a
// stream's own window, tunnelWindow, bounds what one slow reader holds),
// so this bounds only the data in flight across all of a connection's
// tunnels at once.
const proxyConnWindow = 16 << 20

// reconnectMax bounds the wait between a shared connection's attempts to
// reconnect to the proxy-server.
const reconnectMax = 5 * time.Second

// maxDataPacket bounds the payload of one DATA packet (the proxy-server
// and agent accept gRPC messages of 4 MiB).
const maxDataPacket = 1 << 20

// refusalsToSingleUse is how many dials in a row a shared connection must
// lose before their answer, each then made on a single-use connection,
// before the transport stops sharing: a proxy-server (or a proxy in
// front of it) that allows one stream per connection.
const refusalsToSingleUse = 3

// errStreamRefused marks a dial whose stream ended before the proxy-server
// answered it, on a connection that carries other tunnels.
var errStreamRefused = errors.New("the proxy-server ended the tunnel's stream before answering its dial")

// sharedTransport carries many clusters' tunnels as streams over a few
// gRPC connections to the proxy-server. Connections are made as tunnels
// need them, up to size; a new tunnel takes the one with the fewest. A
// connection made with an older TLS configuration (rotated files), or
// found dead (a dial on it had no answer while nothing else arrived on
// it either), takes no new tunnel and closes when its last one ends; the
// tunnels it carries are not touched.
type sharedTransport struct {
	addr string
	size int

	mu     sync.Mutex
	conns  []*sharedConn
	closed bool
	// retired are connections that take no new tunnel and close when
	// their last one ends.
	retired map[*sharedConn]bool
	// refusals counts refused dials in a row (errStreamRefused answered
	// by a single-use connection).
	refusals int
	// singleUse is set once sharing was refused.
	singleUse atomic.Bool
}

type sharedConn struct {
	cc    *grpc.ClientConn
	proxy client.ProxyServiceClient
	tls   *tls.Config
	// streams is how many tunnels are open or dialing on it (under the
	// transport's mu).
	streams int
	// lastRecv is when a packet last arrived on any of its streams (Unix
	// nanoseconds).
	lastRecv atomic.Int64
}

func newSharedTransport(addr string, size int) *sharedTransport {
	if size <= 0 {
		size = config.DefaultTunnelProxyConns
	}
	return &sharedTransport{addr: addr, size: size, retired: map[*sharedConn]bool{}}
}

// connections is how many gRPC connections to the proxy-server are open.
func (s *sharedTransport) connections() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns) + len(s.retired)
}

// close ends every connection, and so every tunnel on them at once:
// without a CLOSE_REQ per tunnel, the proxy-server closes each (one
// CLOSE_REQ to its agent) as its stream ends.
func (s *sharedTransport) close() {
	s.mu.Lock()
	s.closed = true
	all := append([]*sharedConn{}, s.conns...)
	for c := range s.retired {
		all = append(all, c)
	}
	s.conns, s.retired = nil, map[*sharedConn]bool{}
	s.mu.Unlock()
	for _, c := range all {
		_ = c.cc.Close()
	}
}

// pick returns the connection for a new tunnel and how many other
// tunnels it carries: the least loaded healthy one not in tried, or a new
// one while fewer than size exist and every one carries tunnels. It
// returns nil when every connection was tried.
func (s *sharedTransport) pick(tc *tls.Config, tried map[*sharedConn]bool) (*sharedConn, int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, 0, errors.New("the tunnel transport is closed")
	}
	live := s.conns[:0]
	for _, c := range s.conns {
		if c.tls != tc {
			s.retireLocked(c)
			continue
		}
		live = append(live, c)
	}
	clear(s.conns[len(live):])
	s.conns = live
	var best *sharedConn
	for _, c := range s.conns {
		if tried[c] || c.cc.GetState() == connectivity.TransientFailure {
			continue
		}
		if best == nil || c.streams < best.streams {
			best = c
		}
	}
	if len(s.conns) < s.size && (best == nil || best.streams > 0) {
		c, err := s.newConn(tc)
		if err != nil {
			return nil, 0, err
		}
		s.conns = append(s.conns, c)
		best = c
	}
	if best == nil {
		// Every connection is failing or was tried: one not tried yet,
		// which gRPC is reconnecting.
		for _, c := range s.conns {
			if !tried[c] {
				best = c
				break
			}
		}
	}
	if best == nil {
		return nil, 0, nil
	}
	best.streams++
	return best, best.streams - 1, nil
}

func (s *sharedTransport) newConn(tc *tls.Config) (*sharedConn, error) {
	// passthrough: the address is dialed as it is, as a single-use
	// tunnel does, so that a Service spreads the connections over its
	// proxy-servers.
	cc, err := grpc.NewClient("passthrough:///"+s.addr,
		grpc.WithTransportCredentials(credentials.NewTLS(tc)),
		// A proxy-server back after a restart is reached again within
		// seconds, not after gRPC's default backoff (up to 2 minutes):
		// each connection tries at most every 5s meanwhile.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: time.Second, Multiplier: 1.6, Jitter: 0.2, MaxDelay: reconnectMax},
			MinConnectTimeout: 10 * time.Second,
		}),
		grpc.WithSharedWriteBuffer(true),
		grpc.WithReadBufferSize(tunnelReadBuffer),
		grpc.WithStaticStreamWindowSize(tunnelWindow),
		grpc.WithStaticConnWindowSize(proxyConnWindow))
	if err != nil {
		return nil, fmt.Errorf("konnectivity proxy-server %s: %w", s.addr, err)
	}
	c := &sharedConn{cc: cc, proxy: client.NewProxyServiceClient(cc), tls: tc}
	c.lastRecv.Store(time.Now().UnixNano())
	return c, nil
}

// retireLocked takes c out of service: it closes when its last tunnel
// ends. The caller holds s.mu and removes c from s.conns.
func (s *sharedTransport) retireLocked(c *sharedConn) {
	if c.streams == 0 {
		go func() { _ = c.cc.Close() }()
		return
	}
	s.retired[c] = true
}

// retire takes c out of service if it still is in.
func (s *sharedTransport) retire(c *sharedConn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, x := range s.conns {
		if x == c {
			s.conns = append(s.conns[:i], s.conns[i+1:]...)
			s.retireLocked(c)
			return
		}
	}
}

// streamsOn is how many tunnels are open or dialing on c.
func (s *sharedTransport) streamsOn(c *sharedConn) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return c.streams
}

// release ends one tunnel's claim on c.
func (s *sharedTransport) release(c *sharedConn) {
	s.mu.Lock()
	c.streams--
	last := c.streams == 0 && s.retired[c]
	if last {
		delete(s.retired, c)
	}
	s.mu.Unlock()
	if last {
		_ = c.cc.Close()
	}
}

// refused records the outcome of a single-use dial made after a shared
// connection refused the stream: ok counts toward giving up sharing.
func (s *sharedTransport) refused(ok bool) (nowSingleUse bool) {
	if !ok {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refusals++
	if s.refusals >= refusalsToSingleUse && !s.singleUse.Load() {
		s.singleUse.Store(true)
		return true
	}
	return false
}

func (s *sharedTransport) shared() {
	s.mu.Lock()
	s.refusals = 0
	s.mu.Unlock()
}

// dial opens a tunnel to address on a shared connection. A dial that
// finds no agent is tried on each other connection (each may have reached
// another proxy-server) before the no-agent answer is returned; tried is
// how many connections were.
func (s *sharedTransport) dial(ctx context.Context, tc *tls.Config, address string) (_ net.Conn, tried int, _ error) {
	seen := map[*sharedConn]bool{}
	var noAgent error
	for {
		c, others, err := s.pick(tc, seen)
		if err != nil {
			return nil, len(seen), err
		}
		if c == nil {
			return nil, len(seen), noAgent
		}
		seen[c] = true
		conn, err := s.open(ctx, c, address)
		switch {
		case err == nil:
			if others > 0 {
				s.shared()
			}
			return conn, len(seen), nil
		case isNoAgent(err) && ctx.Err() == nil:
			noAgent = err
			continue
		case ctx.Err() == nil && s.streamsOn(c) > 0 && refusedStream(c, err):
			// Other tunnels use the connection (counted now: streams
			// reach the server in another order than they were picked).
			return nil, len(seen), fmt.Errorf("%w: %w", errStreamRefused, err)
		}
		return nil, len(seen), err
	}
}

// refusedStream reports whether a dial's stream on c, which carries other
// tunnels, was refused by the server: it ended before the dial's answer
// (with an error of the server's, or none), while the connection itself
// stayed up. A connection that broke (the proxy-server restarting: gRPC's
// Unavailable, a state other than ready) refuses nothing, nor does a
// server that answered the dial.
func refusedStream(c *sharedConn, err error) bool {
	if isEndpoint(err) || c.cc.GetState() != connectivity.Ready {
		return false
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.Canceled, codes.DeadlineExceeded:
		return false
	}
	return true
}

// errUnanswered is a dial that ended (its context did) without an answer.
var errUnanswered = errors.New("no answer from the proxy-server")

// open starts one stream on c and dials address on it.
//
// A dial that ctx ends before its answer is abandoned, not cancelled: its
// stream waits for the answer (up to abandonedDialWait) and closes a
// connection the agent made with a CLOSE_REQ, as a client closing a
// tunnel does. Cancelling the stream instead would leave the proxy-server
// to close that connection from the goroutine that reads the agent's
// stream (v0.36.0 sends it CLOSE_REQ from there), which stalls every
// tunnel through that agent while the agent itself waits to send.
func (s *sharedTransport) open(ctx context.Context, c *sharedConn, address string) (net.Conn, error) {
	start := time.Now()
	sctx, cancel := context.WithCancel(context.Background())
	sc := &streamConn{conn: c, cancel: cancel, release: func() { s.release(c) }, remote: tunnelAddr(address)}
	fail := func(err error) (net.Conn, error) {
		sc.finish()
		return nil, err
	}
	// The stream waits for the connection to be ready, within ctx.
	stop := context.AfterFunc(ctx, cancel)
	stream, err := c.proxy.Proxy(sctx)
	if !stop() {
		return fail(s.unanswered(ctx, c, start))
	}
	if err != nil {
		return fail(fmt.Errorf("konnectivity proxy-server %s: %w", s.addr, err))
	}
	sc.stream = stream
	random := rand.Int64()
	err = stream.Send(&client.Packet{Type: client.PacketType_DIAL_REQ, Payload: &client.Packet_DialRequest{
		DialRequest: &client.DialRequest{Protocol: "tcp", Address: address, Random: random},
	}})
	if err != nil {
		return fail(fmt.Errorf("konnectivity proxy-server %s: %w", s.addr, err))
	}
	answer := make(chan dialAnswer, 1)
	go sc.awaitDial(random, answer)
	select {
	case a := <-answer:
		if a.err != nil {
			return fail(fmt.Errorf("konnectivity proxy-server %s: %w", s.addr, a.err))
		}
		return sc, nil
	case <-ctx.Done():
		if !sc.dial.CompareAndSwap(dialWaiting, dialAbandoned) {
			// Answered meanwhile.
			if a := <-answer; a.err == nil {
				return sc, nil
			}
			return fail(s.unanswered(ctx, c, start))
		}
		return nil, s.unanswered(ctx, c, start)
	}
}

// unanswered is the error of a dial ctx ended. A connection on which
// nothing at all arrived while the dial waited is taken out of service
// (its tunnels stay).
func (s *sharedTransport) unanswered(ctx context.Context, c *sharedConn, start time.Time) error {
	if c.lastRecv.Load() < start.UnixNano() {
		s.retire(c)
	}
	return fmt.Errorf("konnectivity proxy-server %s: %w: %w", s.addr, errUnanswered, context.Cause(ctx))
}

// abandonedDialWait bounds how long an abandoned dial's stream waits for
// its answer, and then for the CLOSE_RSP of the connection it got; then
// the stream is cancelled.
const abandonedDialWait = time.Minute

// closeWait bounds how long a closed tunnel's stream waits for its
// CLOSE_RSP (the proxy-server answers for an agent that is gone) before
// it is cancelled.
const closeWait = 30 * time.Second

// The states of a dial (streamConn.dial).
const (
	dialWaiting int32 = iota
	dialAnswered
	dialAbandoned
)

type dialAnswer struct{ err error }

// awaitDial reads the stream until the dial's answer and hands it to the
// dialer, or, when the dial was abandoned, closes what it got.
func (c *streamConn) awaitDial(random int64, out chan<- dialAnswer) {
	t := time.AfterFunc(abandonedDialWait, c.finish)
	defer t.Stop()
	answer := func(err error) {
		if c.dial.CompareAndSwap(dialWaiting, dialAnswered) {
			out <- dialAnswer{err}
			return
		}
		if err != nil {
			c.finish()
			return
		}
		// Abandoned, and connected: close it, then end the stream.
		c.closing.Store(true)
		if c.sendClose() != nil {
			c.finish()
			return
		}
		c.readToClose()
	}
	for {
		pkt, err := c.stream.Recv()
		if err != nil {
			if err == io.EOF {
				err = errors.New("the proxy-server ended the stream")
			}
			answer(err)
			return
		}
		c.conn.lastRecv.Store(time.Now().UnixNano())
		switch pkt.Type {
		case client.PacketType_DIAL_RSP:
			rsp := pkt.GetDialResponse()
			if rsp.GetRandom() != random {
				continue
			}
			if rsp.GetError() != "" {
				answer(&endpointError{rsp.GetError()})
				return
			}
			c.connID = rsp.GetConnectID()
			answer(nil)
			return
		case client.PacketType_DIAL_CLS:
			answer(&endpointError{"the proxy-server closed the dial"})
			return
		}
	}
}

// endpointError is the proxy-server's answer to a dial that failed: no
// agent for the address, or the agent could not reach it.
type endpointError struct{ msg string }

func (e *endpointError) Error() string { return "konnectivity: " + e.msg }

func isEndpoint(err error) bool {
	var e *endpointError
	return errors.As(err, &e)
}

func isSharedNoAgent(err error) bool {
	var e *endpointError
	return errors.As(err, &e) && strings.Contains(e.msg, noAgentMessage)
}

// streamConn is one tunnel: a Proxy stream on a shared connection,
// carrying one connection to a cluster's API server. Reads receive on the
// stream in the reader's goroutine (the HTTP/2 client's read loop), so a
// tunnel costs no goroutine of its own beyond gRPC's for the stream.
type streamConn struct {
	conn    *sharedConn
	stream  client.ProxyService_ProxyClient
	cancel  context.CancelFunc
	release func()
	connID  int64
	remote  net.Addr

	rmu  sync.Mutex
	rbuf []byte
	rerr error

	wmu     sync.Mutex
	closing atomic.Bool
	once    sync.Once
	closed  sync.Once
	// dial is dialWaiting until the dial is answered or abandoned.
	dial atomic.Int32
}

// finish ends the stream and gives its connection slot back, once.
func (c *streamConn) finish() {
	c.once.Do(func() {
		c.cancel()
		c.release()
	})
}

func (c *streamConn) Read(b []byte) (int, error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	for len(c.rbuf) == 0 {
		if c.rerr != nil {
			return 0, c.rerr
		}
		pkt, err := c.stream.Recv()
		if err != nil {
			c.rerr = io.EOF
			if !c.closing.Load() {
				c.rerr = fmt.Errorf("tunnel stream: %w", err)
			}
			c.finish()
			return 0, c.rerr
		}
		c.conn.lastRecv.Store(time.Now().UnixNano())
		switch pkt.Type {
		case client.PacketType_DATA:
			d := pkt.GetData()
			if d.GetConnectID() != c.connID {
				continue
			}
			if d.GetError() != "" {
				c.rerr = fmt.Errorf("tunnel: %s", d.GetError())
			}
			c.rbuf = d.GetData()
		case client.PacketType_CLOSE_RSP:
			// The agent closed its connection to the API server (asked
			// to, or the API server closed it): the tunnel has ended.
			c.rerr = io.EOF
			c.finish()
		}
	}
	n := copy(b, c.rbuf)
	c.rbuf = c.rbuf[n:]
	if len(c.rbuf) == 0 {
		c.rbuf = nil
	}
	return n, nil
}

func (c *streamConn) Write(b []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.closing.Load() {
		return 0, net.ErrClosed
	}
	n := 0
	for n < len(b) {
		chunk := b[n:min(len(b), n+maxDataPacket)]
		err := c.stream.Send(&client.Packet{Type: client.PacketType_DATA, Payload: &client.Packet_Data{
			Data: &client.Data{ConnectID: c.connID, Data: chunk},
		}})
		if err != nil {
			return n, fmt.Errorf("tunnel stream: %w", err)
		}
		n += len(chunk)
	}
	return n, nil
}

// Close asks the proxy-server to close the tunnel (CLOSE_REQ) and reads
// the stream until the answer (CLOSE_RSP), unless a reader does: only
// then does the stream end, so that the proxy-server never holds data
// for a tunnel whose stream is gone (see open). An answer that takes
// closeWait ends the stream anyway.
func (c *streamConn) Close() error {
	c.closed.Do(func() {
		c.closing.Store(true)
		t := time.AfterFunc(closeWait, c.finish)
		if c.sendClose() != nil {
			t.Stop()
			c.finish()
			return
		}
		go func() {
			defer t.Stop()
			c.readToClose()
		}()
	})
	return nil
}

func (c *streamConn) sendClose() error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.stream.Send(&client.Packet{Type: client.PacketType_CLOSE_REQ, Payload: &client.Packet_CloseRequest{
		CloseRequest: &client.CloseRequest{ConnectID: c.connID},
	}})
}

// readToClose reads and drops what the stream carries until its
// CLOSE_RSP, unless a reader already ended it.
func (c *streamConn) readToClose() {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	for c.rerr == nil {
		pkt, err := c.stream.Recv()
		if err != nil || pkt.Type == client.PacketType_CLOSE_RSP {
			c.rerr = io.EOF
			c.finish()
			return
		}
	}
}

func (c *streamConn) LocalAddr() net.Addr              { return tunnelAddr("konnectivity") }
func (c *streamConn) RemoteAddr() net.Addr             { return c.remote }
func (c *streamConn) SetDeadline(time.Time) error      { return nil }
func (c *streamConn) SetReadDeadline(time.Time) error  { return nil }
func (c *streamConn) SetWriteDeadline(time.Time) error { return nil }

// tunnelAddr is the address a tunnel reaches.
type tunnelAddr string

func (a tunnelAddr) Network() string { return "konnectivity" }
func (a tunnelAddr) String() string  { return string(a) }
