package tunnel

import (
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hubsync/hubsync/config"
	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"
)

func TestKonnectivityDialerChecksItsFiles(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t)
	caFile := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(caFile, ca.pem, 0o600); err != nil {
		t.Fatal(err)
	}
	junk := filepath.Join(dir, "junk")
	if err := os.WriteFile(junk, []byte("not pem"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		cfg     KonnectivityConfig
		wantErr string
	}{
		{name: "CA only", cfg: KonnectivityConfig{Address: "proxy:8090", CAFile: caFile}},
		{name: "no port", cfg: KonnectivityConfig{Address: "proxy", CAFile: caFile}, wantErr: "konnectivity address"},
		{name: "missing CA file", cfg: KonnectivityConfig{Address: "proxy:8090", CAFile: filepath.Join(dir, "nope")}, wantErr: "konnectivity CA file"},
		{name: "CA file without PEM", cfg: KonnectivityConfig{Address: "proxy:8090", CAFile: junk}, wantErr: "holds no PEM certificate"},
		{name: "bad key pair", cfg: KonnectivityConfig{Address: "proxy:8090", CAFile: caFile, CertFile: junk, KeyFile: junk}, wantErr: "client certificate"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewKonnectivityDialer(tt.cfg)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("err %v, want %q", err, tt.wantErr)
			}
			if strings.Contains(err.Error(), "not pem") {
				t.Fatal("the error quotes a file's content")
			}
		})
	}
}

// fakeProxyServer is a konnectivity proxy-server (gRPC mode) that answers
// each DIAL_REQ as answer says: an error text for a failed dial, "" for a
// connection. It counts the TCP connections it accepts, since each dial
// attempt must be a new one for a load balancer to route it elsewhere.
type fakeProxyServer struct {
	client.UnimplementedProxyServiceServer
	// answer gets the 1-based number of the stream.
	answer  func(n int) string
	streams atomic.Int32
	conns   atomic.Int32
	// echo sends every DATA packet back on its connection.
	echo bool
}

func (s *fakeProxyServer) Proxy(stream client.ProxyService_ProxyServer) error {
	n := int(s.streams.Add(1))
	for {
		pkt, err := stream.Recv()
		if err != nil {
			return nil
		}
		switch pkt.Type {
		case client.PacketType_DIAL_REQ:
			rsp := &client.DialResponse{Random: pkt.GetDialRequest().Random}
			if rsp.Error = s.answer(n); rsp.Error == "" {
				rsp.ConnectID = int64(n)
			}
			if err := stream.Send(&client.Packet{Type: client.PacketType_DIAL_RSP, Payload: &client.Packet_DialResponse{DialResponse: rsp}}); err != nil {
				return err
			}
		case client.PacketType_DATA:
			if s.echo {
				if err := stream.Send(pkt); err != nil {
					return err
				}
			}
		case client.PacketType_CLOSE_REQ:
			rsp := &client.CloseResponse{ConnectID: pkt.GetCloseRequest().ConnectID}
			return stream.Send(&client.Packet{Type: client.PacketType_CLOSE_RSP, Payload: &client.Packet_CloseResponse{CloseResponse: rsp}})
		}
	}
}

type countingListener struct {
	net.Listener
	n *atomic.Int32
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// startFakeProxyServer serves s with TLS on loopback and returns a dialer
// for it.
func startFakeProxyServer(t *testing.T, s *fakeProxyServer) *KonnectivityDialer {
	t.Helper()
	return serveFakeProxyServer(t, s, func(ln net.Listener, cert tls.Certificate) (net.Listener, []grpc.ServerOption) {
		return countingListener{Listener: ln, n: &s.conns},
			[]grpc.ServerOption{grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}))}
	})
}

// serveFakeProxyServer serves s on loopback through the listener and with
// the server options serve makes of the raw listener and a serving
// certificate, and returns a dialer for it.
func serveFakeProxyServer(t *testing.T, s *fakeProxyServer,
	serve func(net.Listener, tls.Certificate) (net.Listener, []grpc.ServerOption)) *KonnectivityDialer {
	t.Helper()
	ca := newTestCA(t)
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(caFile, ca.pem, 0o600); err != nil {
		t.Fatal(err)
	}
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln, opts := serve(raw, ca.serving(t, "127.0.0.1"))
	srv := grpc.NewServer(opts...)
	client.RegisterProxyServiceServer(srv, s)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	d, err := NewKonnectivityDialer(KonnectivityConfig{Address: raw.Addr().String(), CAFile: caFile})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestKonnectivityDialerTriesAnotherServer: several proxy-servers behind
// one address (OCM cluster-proxy's replicas) answer "No agent available"
// when the cluster's agent is connected to another one; the dialer then
// tries again on a new connection, a bounded number of times, and says
// so when it gives up. Other dial errors are not retried.
func TestKonnectivityDialerTriesAnotherServer(t *testing.T) {
	const noAgent = "No agent available"
	tests := []struct {
		name string
		// answers are the DIAL_RSP errors of the first streams; later
		// streams get the last one.
		answers   []string
		cancel    bool // cancel the dial's context at the first answer
		wantConns int32
		wantErr   []string
	}{
		{name: "agent on the first server", answers: []string{""}, wantConns: 1},
		{name: "agent on the third server", answers: []string{noAgent, noAgent, ""}, wantConns: 3},
		// The shared connections (as many as allowed, each may reach
		// another server), then one new connection of its own.
		{name: "agent on no server", answers: []string{noAgent}, wantConns: config.DefaultTunnelProxyConns + 1,
			wantErr: []string{"konnectivity: no agent for this cluster on the proxy-server(s) reached at 127.0.0.1:", "(5 connections tried): No agent available"}},
		{name: "agent cannot reach the API server", answers: []string{"dial tcp 10.0.0.1:443: connect: connection refused"}, wantConns: 1,
			wantErr: []string{"konnectivity: dial tcp 10.0.0.1:443: connect: connection refused"}},
		{name: "dial cancelled", answers: []string{noAgent}, cancel: true, wantConns: 1, wantErr: []string{"konnectivity"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			s := &fakeProxyServer{answer: func(n int) string {
				if tt.cancel {
					cancel()
				}
				return tt.answers[min(n, len(tt.answers))-1]
			}}
			d := startFakeProxyServer(t, s)
			c, err := d.Dial(ctx, "c1", "10.0.0.1:443")
			if c != nil {
				_ = c.Close()
			}
			if n := s.conns.Load(); n != tt.wantConns {
				t.Errorf("%d connections to the proxy-server, want %d", n, tt.wantConns)
			}
			if len(tt.wantErr) == 0 {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil {
				t.Fatal("the dial succeeded")
			}
			for _, want := range tt.wantErr {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q lacks %q", err, want)
				}
			}
		})
	}
}

// pingCounter reads the HTTP/2 frames a client sends (after its preface)
// as they pass, and counts its PINGs.
type pingCounter struct {
	net.Conn
	w     *io.PipeWriter
	pings atomic.Int32
}

func newPingCounter(c net.Conn) *pingCounter {
	r, w := io.Pipe()
	pc := &pingCounter{Conn: c, w: w}
	go func() {
		defer r.Close()
		if _, err := io.ReadFull(r, make([]byte, len(http2.ClientPreface))); err != nil {
			return
		}
		fr := http2.NewFramer(nil, r)
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				return
			}
			if p, ok := f.(*http2.PingFrame); ok && !p.IsAck() {
				pc.pings.Add(1)
			}
		}
	}()
	return pc
}

func (c *pingCounter) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		_, _ = c.w.Write(b[:n])
	}
	return n, err
}

type pingCountingListener struct {
	net.Listener
	mu    sync.Mutex
	conns []*pingCounter
}

func (l *pingCountingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	pc := newPingCounter(c)
	l.mu.Lock()
	l.conns = append(l.conns, pc)
	l.mu.Unlock()
	return pc, nil
}

func (l *pingCountingListener) pings() int32 {
	l.mu.Lock()
	defer l.mu.Unlock()
	var n int32
	for _, c := range l.conns {
		n += c.pings.Load()
	}
	return n
}

// TestTunnelSendsNoFlowControlPings: a tunnel's gRPC connection has fixed
// flow-control windows, so receiving data costs no BDP PING to the
// proxy-server (gRPC's default sends one on the first data after each
// answered one: about a write, and the proxy-server's answer, per small
// request through the gateway).
func TestTunnelSendsNoFlowControlPings(t *testing.T) {
	// TLS is ended before the frames are read; the gRPC server is given
	// the decrypted connection.
	var ln *pingCountingListener
	d := serveFakeProxyServer(t, &fakeProxyServer{answer: func(int) string { return "" }, echo: true},
		func(raw net.Listener, cert tls.Certificate) (net.Listener, []grpc.ServerOption) {
			ln = &pingCountingListener{Listener: tls.NewListener(raw, &tls.Config{Certificates: []tls.Certificate{cert},
				MinVersion: tls.VersionTLS12, NextProtos: []string{"h2"}})}
			return ln, nil
		})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := d.Dial(ctx, "c1", "10.0.0.1:443")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 64<<10)
	for i := range 50 {
		msg := bytes.Repeat([]byte{byte('a' + i%26)}, 1000+i*1000)
		if _, err := c.Write(msg); err != nil {
			t.Fatal(err)
		}
		for got := 0; got < len(msg); {
			n, err := c.Read(buf)
			if err != nil {
				t.Fatal(err)
			}
			got += n
		}
	}
	if n := ln.pings(); n != 0 {
		t.Fatalf("the tunnel's gRPC connection sent %d PINGs while it received data", n)
	}
}
