package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// The bare Go proxy is the plainest TLS-terminating HTTP/2 reverse proxy
// Go's standard library makes: httputil.ReverseProxy in front of the
// managed API server, sending each request on as the client sent it,
// with no check, identity, metric or log of its own. It runs as its own
// process (this binary, run again with bareProxyEnv set) so that its CPU
// is counted apart from the clients'. Beside "direct, impersonating"
// (whose headers its clients send) it measures what any proxy of this
// kind written with Go's libraries costs on this machine: the floor
// under the gateway's own hop.
const (
	bareProxyRole = "bare Go proxy"
	// bareProxyEnv holds the child's arguments: listen address, upstream
	// address, upstream CA file, serving certificate and key files,
	// separated by commas.
	bareProxyEnv = "HUBSYNC_BENCH_BARE_PROXY"
)

// bareProxy is a running bare Go proxy.
type bareProxy struct {
	cmd *exec.Cmd
	url string
}

// startBareProxy starts the bare Go proxy toward upstream (host:port,
// its CA in caFile), serving certFile and keyFile on a free loopback
// port, and waits until it accepts connections.
func startBareProxy(ctx context.Context, upstream, caFile, certFile, keyFile string, logs io.Writer) (*bareProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, self)
	cmd.Env = append(os.Environ(), bareProxyEnv+"="+strings.Join([]string{addr, upstream, caFile, certFile, keyFile}, ","))
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("bare Go proxy: %w", err)
	}
	p := &bareProxy{cmd: cmd, url: "https://" + addr}
	var last error
	if err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if last = err; err != nil {
			return false, nil
		}
		_ = c.Close()
		return true, nil
	}); err != nil {
		p.stop()
		return nil, fmt.Errorf("bare Go proxy not listening on %s within 30s: %w", addr, errors.Join(err, last))
	}
	return p, nil
}

func (p *bareProxy) stop() {
	_ = p.cmd.Process.Kill()
	_ = p.cmd.Wait()
}

// runBareProxy is the child process: it serves until killed.
func runBareProxy(spec string) error {
	args := strings.Split(spec, ",")
	if len(args) != 5 {
		return fmt.Errorf("%s: want 5 comma-separated arguments, got %q", bareProxyEnv, spec)
	}
	listen, upstream, caFile, certFile, keyFile := args[0], args[1], args[2], args[3], args[4]
	caPEM, err := os.ReadFile(caFile)
	if err != nil {
		return err
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		return errors.New("bare Go proxy: no CA certificate in " + caFile)
	}
	target := &url.URL{Scheme: "https", Host: upstream}
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.Host = ""
		},
		Transport:  &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}, ForceAttemptHTTP2: true, MaxIdleConnsPerHost: 64},
		BufferPool: &copyBuffers{},
	}
	srv := &http.Server{
		Addr: listen,
		// A whole answer is written without a flush per read, and the
		// copy buffers are reused, as the gateway does: the cheapest a
		// proxy of Go's can be here.
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			proxy.ServeHTTP(noFlush{w}, r)
		}),
		ReadHeaderTimeout: 10 * time.Second,
	}
	return srv.ListenAndServeTLS(certFile, keyFile)
}

// noFlush hides the ResponseWriter's Flush: Go's proxy flushes after
// every read of an answer without a length.
type noFlush struct{ http.ResponseWriter }

// copyBuffers reuses the proxy's 32 KiB copy buffers.
type copyBuffers struct{ p sync.Pool }

func (b *copyBuffers) Get() []byte {
	if v, ok := b.p.Get().(*[32 << 10]byte); ok {
		return v[:]
	}
	return make([]byte, 32<<10)
}

func (b *copyBuffers) Put(buf []byte) {
	if cap(buf) >= 32<<10 {
		b.p.Put((*[32 << 10]byte)(buf[:32<<10]))
	}
}
