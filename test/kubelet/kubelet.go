// Package kubelet is a fake kubelet for end-to-end tests: an HTTPS server
// that a real kube-apiserver reaches as a node's kubelet for pods/exec,
// pods/attach, pods/portforward and pods/log, so the real kubectl works
// against a real kube-apiserver on a machine without a kubelet or
// container runtime.
//
// The streaming protocols (SPDY and WebSocket) are the kubelet's own code,
// k8s.io/kubelet/pkg/cri/streaming; only the "containers" are fake:
//
//   - exec runs a tiny built-in command set (see Exec);
//   - attach echoes stdin to stdout;
//   - port-forward connects every port to Options.PortForwardTarget;
//   - containerLogs writes numbered lines and, with follow=true, keeps
//     writing one every Options.LogInterval until the client goes away.
//
// Every request is recorded (Requests, Count), so a test can assert that
// it really reached the node. Register creates the Node and a Running Pod
// bound to it in a kube-apiserver.
package kubelet

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/hubsync/hubsync/test/pki"
)

// Kind is the kind of a kubelet request.
type Kind string

// The request kinds the fake kubelet serves.
const (
	KindExec        Kind = "exec"
	KindAttach      Kind = "attach"
	KindPortForward Kind = "portforward"
	KindLogs        Kind = "logs"
)

// Options configures a Kubelet. The zero value is usable: it listens on
// 127.0.0.1 and refuses port-forwards.
type Options struct {
	// IP is the address to listen on (a free port is chosen); the Node
	// that Register creates reports it as its InternalIP. Default
	// 127.0.0.1.
	IP string
	// PortForwardTarget is the TCP address (host:port) every forwarded
	// pod port connects to, e.g. a test's echo server. Empty refuses
	// port-forwards with an error.
	PortForwardTarget string
	// LogLines is how many numbered lines containerLogs writes at once
	// (default 3); with follow=true more follow.
	LogLines int
	// LogInterval is the pause between followed log lines (default
	// 100ms).
	LogInterval time.Duration
	// StreamIdleTimeout and StreamCreationTimeout are passed to the
	// kubelet's streaming code (defaults 4h and 30s, the kubelet's).
	StreamIdleTimeout, StreamCreationTimeout time.Duration
}

// Request is one request the kubelet received.
type Request struct {
	Kind                         Kind
	Namespace, Pod, Container    string
	Command                      []string // exec
	Follow                       bool     // logs
	Method, Path, Query, Upgrade string
	// Protocols are the streaming protocols the client offered
	// (X-Stream-Protocol-Version for SPDY, Sec-WebSocket-Protocol).
	Protocols []string
	UserAgent string
	Header    http.Header
	Time      time.Time
}

// Kubelet is a running fake kubelet.
type Kubelet struct {
	// IP and Port are where it listens; Address is IP:Port.
	IP      string
	Port    int
	Address string
	// CA verifies its serving certificate (the kube-apiserver does not
	// check it unless given --kubelet-certificate-authority).
	CA []byte

	opts   Options
	srv    *http.Server
	ctx    context.Context // canceled by Close; bounds all streams
	cancel context.CancelFunc
	served chan struct{}

	mu       sync.Mutex
	requests []Request
}

// Start starts a fake kubelet. It runs until Close or until ctx is done.
func Start(ctx context.Context, opts Options) (*Kubelet, error) {
	if opts.IP == "" {
		opts.IP = "127.0.0.1"
	}
	if opts.LogLines <= 0 {
		opts.LogLines = 3
	}
	if opts.LogInterval <= 0 {
		opts.LogInterval = 100 * time.Millisecond
	}
	if opts.StreamIdleTimeout <= 0 {
		opts.StreamIdleTimeout = 4 * time.Hour
	}
	if opts.StreamCreationTimeout <= 0 {
		opts.StreamCreationTimeout = 30 * time.Second
	}
	ca, err := pki.NewCA("fake-kubelet-ca")
	if err != nil {
		return nil, fmt.Errorf("fake kubelet CA: %w", err)
	}
	pair, err := ca.Serving(opts.IP, "localhost")
	if err != nil {
		return nil, fmt.Errorf("fake kubelet serving certificate: %w", err)
	}
	cert, err := tls.X509KeyPair(pair.Cert, pair.Key)
	if err != nil {
		return nil, fmt.Errorf("fake kubelet serving certificate: %w", err)
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", net.JoinHostPort(opts.IP, "0"))
	if err != nil {
		return nil, fmt.Errorf("fake kubelet listen on %s: %w", opts.IP, err)
	}
	kctx, cancel := context.WithCancel(ctx)
	k := &Kubelet{
		IP: opts.IP, Port: ln.Addr().(*net.TCPAddr).Port, CA: ca.PEM,
		opts: opts, ctx: kctx, cancel: cancel, served: make(chan struct{}),
	}
	k.Address = net.JoinHostPort(k.IP, strconv.Itoa(k.Port))
	k.srv = &http.Server{
		Handler:           k.routes(),
		ReadHeaderTimeout: 30 * time.Second,
		// HTTP/1.1 only: SPDY and WebSocket upgrade an HTTP/1.1
		// connection (a non-nil empty map turns HTTP/2 off).
		TLSNextProto: map[string]func(*http.Server, *tls.Conn, http.Handler){},
		TLSConfig:    &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12, NextProtos: []string{"http/1.1"}},
		BaseContext:  func(net.Listener) context.Context { return kctx },
	}
	go func() {
		defer close(k.served)
		_ = k.srv.ServeTLS(ln, "", "")
	}()
	go func() {
		<-kctx.Done()
		_ = k.srv.Close()
	}()
	return k, nil
}

// Close stops the kubelet: the listener, idle connections and every
// stream it serves (in-flight exec, attach and followed logs end).
func (k *Kubelet) Close() error {
	k.cancel()
	err := k.srv.Close()
	<-k.served
	if err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("stop fake kubelet: %w", err)
	}
	return nil
}

// Requests returns the requests received so far, oldest first.
func (k *Kubelet) Requests() []Request {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]Request(nil), k.requests...)
}

// Count returns how many requests of kind were received.
func (k *Kubelet) Count(kind Kind) int {
	k.mu.Lock()
	defer k.mu.Unlock()
	n := 0
	for _, r := range k.requests {
		if r.Kind == kind {
			n++
		}
	}
	return n
}

func (k *Kubelet) record(r Request) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.requests = append(k.requests, r)
}
