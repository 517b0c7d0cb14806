package gateway

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/tools/cache"

	"github.com/hubsync/hubsync/hubcache"
)

// CertSource gives the serving certificate, the current one at every
// handshake.
type CertSource interface {
	GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error)
}

// FileCert serves a certificate and key from PEM files and loads them
// again when either changes (checked at most every CheckEvery, default
// 2s), so that a rotated certificate (a mounted Secret, cert-manager) is
// served without a restart. A pair that does not load is reported and the
// previous one kept.
type FileCert struct {
	CertFile, KeyFile string
	CheckEvery        time.Duration
	Log               *slog.Logger

	mu      sync.Mutex
	cert    *tls.Certificate
	stamp   string
	checked time.Time
}

// NewFileCert loads the pair once, so that a bad pair fails at start.
func NewFileCert(certFile, keyFile string, log *slog.Logger) (*FileCert, error) {
	f := &FileCert{CertFile: certFile, KeyFile: keyFile, Log: log}
	if f.Log == nil {
		f.Log = slog.New(slog.DiscardHandler)
	}
	stamp, err := f.stampNow()
	if err != nil {
		return nil, err
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("gateway serving certificate: %w", err)
	}
	f.cert, f.stamp, f.checked = &cert, stamp, time.Now()
	return f, nil
}

// stampNow identifies the files' current contents by size and time.
func (f *FileCert) stampNow() (string, error) {
	var b bytes.Buffer
	for _, p := range []string{f.CertFile, f.KeyFile} {
		st, err := os.Stat(p)
		if err != nil {
			return "", fmt.Errorf("gateway serving certificate: %w", err)
		}
		fmt.Fprintf(&b, "%d/%d;", st.Size(), st.ModTime().UnixNano())
	}
	return b.String(), nil
}

// GetCertificate is for tls.Config.
func (f *FileCert) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	every := f.CheckEvery
	if every <= 0 {
		every = 2 * time.Second
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if time.Since(f.checked) < every {
		return f.cert, nil
	}
	f.checked = time.Now()
	stamp, err := f.stampNow()
	if err != nil || stamp == f.stamp {
		if err != nil {
			f.Log.Warn("cannot check the gateway's serving certificate; serving the one loaded", "err", err)
		}
		return f.cert, nil
	}
	cert, err := tls.LoadX509KeyPair(f.CertFile, f.KeyFile)
	if err != nil {
		// Often the two files are mid-rotation: try again at the next check.
		f.Log.Warn("the gateway's serving certificate changed but does not load; serving the previous one", "err", err)
		return f.cert, nil
	}
	f.cert, f.stamp = &cert, stamp
	f.Log.Info("gateway serving certificate reloaded", "certFile", f.CertFile)
	return f.cert, nil
}

// SecretCert serves the certificate of a kubernetes.io/tls Secret on the
// hub (tls.crt, tls.key), following its updates through an informer on
// that one Secret. A Secret that does not load is reported and the
// previous certificate kept.
type SecretCert struct {
	Namespace, Name string
	Log             *slog.Logger

	mu   sync.Mutex
	cert *tls.Certificate
	ca   []byte
}

// Run watches the Secret, through an informer of hc (that one Secret,
// by name, and of it only the certificate, key and CA), until ctx ends;
// it returns once the informer has synced. The caller runs hc.
func (s *SecretCert) Run(ctx context.Context, hc *hubcache.Cache) error {
	if s.Log == nil {
		s.Log = slog.New(slog.DiscardHandler)
	}
	inf, err := hc.Secrets(hubcache.Secrets{
		Namespace:     s.Namespace,
		FieldSelector: fields.OneTermEqualSelector("metadata.name", s.Name).String(),
		Keep:          []string{corev1.TLSCertKey, corev1.TLSPrivateKeyKey, "ca.crt"},
	})
	if err != nil {
		return err
	}
	context.AfterFunc(ctx, inf.Release)
	synced, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { s.load(obj) },
		UpdateFunc: func(_, obj any) { s.load(obj) },
		DeleteFunc: func(any) {
			s.Log.Warn("the gateway's serving certificate Secret was deleted; serving the last certificate", "secret", s.Namespace+"/"+s.Name)
		},
	})
	if err != nil {
		return err
	}
	if !cache.WaitForCacheSync(ctx.Done(), synced) {
		return ctx.Err()
	}
	return nil
}

func (s *SecretCert) load(obj any) {
	sec, ok := obj.(*corev1.Secret)
	if !ok {
		return
	}
	cert, err := tls.X509KeyPair(sec.Data[corev1.TLSCertKey], sec.Data[corev1.TLSPrivateKeyKey])
	if err != nil {
		s.Log.Warn("the gateway's serving certificate Secret does not hold a certificate and key; serving the previous one",
			"secret", s.Namespace+"/"+s.Name, "err", err)
		return
	}
	s.mu.Lock()
	first := s.cert == nil
	s.cert, s.ca = &cert, sec.Data["ca.crt"]
	s.mu.Unlock()
	if !first {
		s.Log.Info("gateway serving certificate reloaded", "secret", s.Namespace+"/"+s.Name)
	}
}

// GetCertificate is for tls.Config.
func (s *SecretCert) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cert == nil {
		return nil, fmt.Errorf("no serving certificate yet in Secret %s/%s", s.Namespace, s.Name)
	}
	return s.cert, nil
}

// ServerOptions configure the gateway's HTTPS server. They arrive filled
// (ServerOptionsFor, from the configuration).
type ServerOptions struct {
	Certs CertSource
	// MaxHeaderBytes bounds a request's headers (HTTP/1.1 and HTTP/2).
	MaxHeaderBytes int
	// ReadHeaderTimeout bounds reading a request's headers: a client
	// that sends them slowly is cut off.
	ReadHeaderTimeout time.Duration
	// IdleTimeout closes keep-alive connections left idle.
	IdleTimeout time.Duration
	// DrainTimeout bounds how long the requests in flight when Serve's
	// context ends may finish; what is left then is cut.
	DrainTimeout time.Duration
	Log          *slog.Logger
}

// forceGrace is how long Serve waits, once it has cut what was left at the
// drain timeout, for those requests' handlers to return.
const forceGrace = time.Second

// Serve serves h over TLS on ln until ctx ends, then drains: it stops
// accepting connections at once, closes idle ones and sends HTTP/2 clients
// GOAWAY (so that they reconnect to another replica), ends watches and
// upgraded connections at once (h marks them: see flight), lets other
// requests finish for up to DrainTimeout, and then cuts what is left.
// Requests are never cancelled by ctx itself: a replica that stops must
// not fail the requests it can still finish.
func Serve(ctx context.Context, ln net.Listener, h http.Handler, o ServerOptions) error {
	if o.Certs == nil {
		return errors.New("gateway: no serving certificate")
	}
	if err := o.check(); err != nil {
		return err
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	fs := newFlights(h)
	srv := &http.Server{
		Handler: fs,
		TLSConfig: &tls.Config{
			MinVersion:     tls.VersionTLS12,
			GetCertificate: o.Certs.GetCertificate,
			NextProtos:     []string{"h2", "http/1.1"},
		},
		MaxHeaderBytes:    o.MaxHeaderBytes,
		ReadHeaderTimeout: o.ReadHeaderTimeout,
		IdleTimeout:       o.IdleTimeout,
		ErrorLog:          slog.NewLogLogger(o.Log.Handler(), slog.LevelDebug),
		BaseContext:       func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
	}
	// Shutdown runs this once it has closed the listener, beside the
	// GOAWAYs it sends: no connection comes after it, and a request marked
	// long-running later is ended as it is marked.
	started := make(chan struct{})
	srv.RegisterOnShutdown(func() {
		defer close(started)
		n := fs.drain()
		o.Log.Info("gateway draining: no new connections; watches and upgraded connections ended, other requests finishing",
			"inFlight", n.inFlight, "watches", n.watches, "upgrades", n.upgrades, "timeout", o.DrainTimeout)
	})
	errc := make(chan error, 1)
	go func() { errc <- srv.ServeTLS(ln, "", "") }()
	select {
	case err := <-errc:
		return fmt.Errorf("gateway server: %w", err)
	case <-ctx.Done():
	}
	stop(srv, fs, started, o)
	<-errc
	return nil
}

// stop drains srv for up to o.DrainTimeout, then cuts what is left.
func stop(srv *http.Server, fs *flights, started <-chan struct{}, o ServerOptions) {
	begin := time.Now()
	deadline, cancel := context.WithTimeout(context.Background(), o.DrainTimeout)
	defer cancel()
	// Shutdown waits for the connections it tracks until the deadline;
	// upgraded ones are no longer its own, so the flights are waited for
	// too.
	_ = srv.Shutdown(deadline)
	<-started
	select {
	case <-fs.idle:
	case <-deadline.Done():
	}
	if deadline.Err() != nil {
		fs.force()
		_ = srv.Close()
		grace := time.NewTimer(forceGrace)
		defer grace.Stop()
		select {
		case <-fs.idle:
		case <-grace.C:
		}
	}
	n := fs.counts()
	level := slog.LevelInfo
	if n.forced > 0 {
		level = slog.LevelWarn
	}
	o.Log.Log(context.Background(), level, "gateway drained", "finished", n.finished, "watchesEnded", n.watches,
		"upgradesEnded", n.upgrades, "forced", n.forced, "took", time.Since(begin).Round(time.Millisecond))
}

// What a drain did to a request, as flight.endedBy says it.
const (
	endedWatch   = "watch"   // a watch or followed log, ended as a clean end of stream
	endedUpgrade = "upgrade" // an upgraded connection (exec, attach, port-forward), closed
	endedForced  = "forced"  // still running at the drain timeout, cut
)

// flights are the requests in flight through Serve, so that a drain can
// end the long-running ones at once, wait for the others, and cut what is
// left at the timeout. Long-running requests never finish by themselves:
// a client re-establishes them, on another replica, once they end.
type flights struct {
	h http.Handler

	mu       sync.Mutex
	all      map[*flight]struct{}
	draining bool
	// idle is closed once draining with nothing in flight.
	idle       chan struct{}
	idleClosed bool
	n          drainCounts
}

// drainCounts say what a drain found and did.
type drainCounts struct {
	inFlight, watches, upgrades int // found in flight when the drain began
	finished, forced            int // ordinary requests that finished, and requests cut
}

func newFlights(h http.Handler) *flights {
	return &flights{h: h, all: map[*flight]struct{}{}, idle: make(chan struct{})}
}

// flight is one request in flight through Serve, and its context: it
// ends when the request does, when the drain closes it (an upgraded
// connection), or when it is cut; never when Serve's context ends.
//
// An HTTP/2 request's context is its stream's, which the server ends
// when the stream does and when stop closes the connection, so a
// flight adds nothing to it but itself as a value: no cancellation of
// its own per request. An HTTP/1 request (and so every upgrade: HTTP/2
// has none) gets one, since a hijacked connection is not the server's
// to close and a request whose body is still unread is not ended by
// closing its connection.
type flight struct {
	context.Context
	fs     *flights
	cancel context.CancelFunc // nil for HTTP/2

	// Guarded by fs.mu.
	kind    string // "", endedWatch or endedUpgrade
	end     func() // ends a long-running request
	stopped bool   // by the drain
	forced  bool
}

type flightKey struct{}

// flightOf is the flight of a request served by Serve; nil for any other
// (a handler tested on its own), whose methods then do nothing.
func flightOf(ctx context.Context) *flight {
	f, _ := ctx.Value(flightKey{}).(*flight)
	return f
}

// Value makes the flight its own context's value for flightKey.
func (f *flight) Value(key any) any {
	if _, ok := key.(flightKey); ok {
		return f
	}
	return f.Context.Value(key)
}

func (fs *flights) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f := &flight{Context: r.Context(), fs: fs}
	if r.ProtoMajor < 2 {
		f.Context, f.cancel = context.WithCancel(f.Context)
	}
	fs.mu.Lock()
	fs.all[f] = struct{}{}
	fs.mu.Unlock()
	defer fs.land(f)
	fs.h.ServeHTTP(w, r.WithContext(f))
}

// land counts a request that has ended.
func (fs *flights) land(f *flight) {
	if f.cancel != nil {
		f.cancel()
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	delete(fs.all, f)
	if !fs.draining {
		return
	}
	switch {
	case f.forced: // counted when cut
	case f.stopped && f.kind == endedWatch:
		fs.n.watches++
	case f.stopped:
		fs.n.upgrades++
	default:
		fs.n.finished++
	}
	fs.checkIdleLocked()
}

func (fs *flights) checkIdleLocked() {
	if fs.draining && len(fs.all) == 0 && !fs.idleClosed {
		fs.idleClosed = true
		close(fs.idle)
	}
}

// drain ends every long-running request; those marked later are ended as
// they are marked. It returns what was in flight.
func (fs *flights) drain() drainCounts {
	fs.mu.Lock()
	fs.draining = true
	n := drainCounts{inFlight: len(fs.all)}
	var ends []func()
	for f := range fs.all {
		if f.end == nil {
			continue
		}
		f.stopped = true
		ends = append(ends, f.end)
		if f.kind == endedWatch {
			n.watches++
		} else {
			n.upgrades++
		}
	}
	fs.checkIdleLocked()
	fs.mu.Unlock()
	for _, end := range ends {
		end()
	}
	return n
}

// force cuts every request still in flight: HTTP/1 ones here, HTTP/2
// ones as stop then closes their connections.
func (fs *flights) force() {
	fs.mu.Lock()
	left := make([]*flight, 0, len(fs.all))
	for f := range fs.all {
		f.forced = true
		left = append(left, f)
	}
	fs.n.forced += len(left)
	fs.mu.Unlock()
	for _, f := range left {
		if f.cancel != nil {
			f.cancel()
		}
	}
}

// counts are the drain's counts so far.
func (fs *flights) counts() drainCounts {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.n
}

// mark makes f a long-running request that end ends, at once if the
// drain has begun.
func (f *flight) mark(kind string, end func()) {
	fs := f.fs
	fs.mu.Lock()
	f.kind, f.end = kind, end
	now := fs.draining && !f.forced
	f.stopped = now
	fs.mu.Unlock()
	if now {
		end()
	}
}

// watch returns the body of a watch (or a followed log) from the cluster
// made to end as a clean end of stream when the server drains: the client
// then sees the watch close, as when an API server ends it, and watches
// again.
func (f *flight) watch(body io.ReadCloser) io.ReadCloser {
	if f == nil {
		return body
	}
	b := &endingBody{ReadCloser: body}
	f.mark(endedWatch, b.end)
	return b
}

// upgraded marks an upgraded connection, closed when the server drains:
// its request's context ends, and the reverse proxy then closes both
// sides.
func (f *flight) upgraded() {
	if f != nil && f.cancel != nil {
		f.mark(endedUpgrade, f.cancel)
	}
}

// endedBy says what the drain did to the request (endedWatch,
// endedUpgrade, endedForced), or "" when it ended by itself.
func (f *flight) endedBy() string {
	if f == nil {
		return ""
	}
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	switch {
	case f.forced:
		return endedForced
	case f.stopped:
		return f.kind
	}
	return ""
}

// endingBody is a streamed body from the cluster that the drain can end.
// Closing it releases a read blocked on the cluster, and what that read
// returns is then an end of stream: the reverse proxy finishes the answer
// as it would at the cluster's own end (a chunked terminator, END_STREAM)
// instead of aborting it, which clients would see as an error.
type endingBody struct {
	io.ReadCloser
	ended atomic.Bool
}

func (b *endingBody) Read(p []byte) (int, error) {
	if b.ended.Load() {
		return 0, io.EOF
	}
	n, err := b.ReadCloser.Read(p)
	if err != nil && b.ended.Load() {
		err = io.EOF
	}
	return n, err
}

func (b *endingBody) end() {
	b.ended.Store(true)
	_ = b.ReadCloser.Close()
}
