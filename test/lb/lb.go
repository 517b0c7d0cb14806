// Package lb is a small in-process TCP load balancer for tests. It stands
// for a Kubernetes Service in front of several replicas (konnectivity
// proxy-servers, hubsync replicas): each new connection goes to the next
// backend in rotation, round robin, and a backend with a readiness check
// is in rotation only while its last check passed, as a Service routes
// only to ready endpoints. Connections already open are left alone: they
// are spliced byte for byte, both ways, with half-closes passed on, until
// either end closes, whatever happens to the set of backends meanwhile.
//
// A typical test:
//
//	b := lb.New(lb.Options{},
//		lb.Backend{Addr: replica1},
//		lb.Backend{Addr: replica2, ReadyURL: "http://" + health2 + "/readyz"})
//	if err := b.Start(ctx); err != nil {
//		t.Fatal(err)
//	}
//	defer b.Close()
//	// Clients dial b.Addr().
//	b.Remove(replica1)                  // no new connections to replica1
//	b.Add(lb.Backend{Addr: replica3})   // a new replica joins
//	b.Set(lb.Backend{Addr: replica3})   // or replace the whole set
//
// With no backend in rotation, a new connection is accepted and closed at
// once; so is one whose backend refuses it. Close (or the end of Start's
// context) closes the listener and every spliced connection, and returns
// once every goroutine of the balancer has ended.
package lb

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"
)

// Backend is one address behind the balancer.
type Backend struct {
	// Addr is the backend's TCP address (host:port); it names the
	// backend in Add, Set and Remove.
	Addr string
	// Ready, when set, is called every check interval; the backend gets
	// new connections only while its last call returned true.
	Ready func() bool
	// ReadyURL, when set, is fetched (GET) every check interval; the
	// backend gets new connections only while its last answer was 2xx.
	ReadyURL string
}

func (b Backend) checked() bool { return b.Ready != nil || b.ReadyURL != "" }

// Options tune a balancer; the zero value is fine for most tests.
type Options struct {
	// Listen is the address to listen on; default 127.0.0.1:0, a free
	// loopback port.
	Listen string
	// CheckInterval is the time between two readiness checks of a
	// backend; default 100 ms.
	CheckInterval time.Duration
	// CheckTimeout bounds one ReadyURL request; default 1 s.
	CheckTimeout time.Duration
	// DialTimeout bounds connecting to a backend; default 5 s.
	DialTimeout time.Duration
}

// Balancer is a round-robin TCP load balancer. Its methods are safe for
// concurrent use.
type Balancer struct {
	opts Options
	http *http.Client

	mu       sync.Mutex
	backends []*backend
	next     int
	conns    map[net.Conn]struct{}
	ln       net.Listener
	ctx      context.Context
	cancel   context.CancelFunc
	closed   bool
	stopCtx  func() bool

	shutdownOnce sync.Once
	wg           sync.WaitGroup
}

// backend is a Backend with its state, guarded by the balancer's mutex.
type backend struct {
	Backend
	ready   bool
	removed bool
	routed  int
	// stop ends the backend's checker; nil when none runs.
	stop chan struct{}
}

// New returns a balancer over backends; it listens once started.
func New(opts Options, backends ...Backend) *Balancer {
	if opts.Listen == "" {
		opts.Listen = "127.0.0.1:0"
	}
	if opts.CheckInterval <= 0 {
		opts.CheckInterval = 100 * time.Millisecond
	}
	if opts.CheckTimeout <= 0 {
		opts.CheckTimeout = time.Second
	}
	if opts.DialTimeout <= 0 {
		opts.DialTimeout = 5 * time.Second
	}
	b := &Balancer{
		opts:  opts,
		conns: map[net.Conn]struct{}{},
		// No keep-alive: no idle connection outlives a check.
		http: &http.Client{Timeout: opts.CheckTimeout, Transport: &http.Transport{DisableKeepAlives: true}},
	}
	b.update(backends, false)
	return b
}

// Start listens, runs every backend's readiness check once, and then
// accepts connections. The balancer closes when ctx ends or Close is
// called.
func (b *Balancer) Start(ctx context.Context) error {
	ln, err := net.Listen("tcp", b.opts.Listen)
	if err != nil {
		return fmt.Errorf("lb: listen on %s: %w", b.opts.Listen, err)
	}
	b.mu.Lock()
	if b.ln != nil || b.closed {
		b.mu.Unlock()
		_ = ln.Close()
		return errors.New("lb: already started or closed")
	}
	b.ln = ln
	b.ctx, b.cancel = context.WithCancel(ctx)
	var checked []*backend
	for _, be := range b.backends {
		if be.checked() {
			checked = append(checked, be)
		}
	}
	b.stopCtx = context.AfterFunc(ctx, b.shutdown)
	b.mu.Unlock()
	for _, be := range checked {
		b.startChecker(be)
	}
	b.wg.Add(1)
	go b.serve(ln)
	return nil
}

// Addr is the address clients dial (host:port); empty before Start.
func (b *Balancer) Addr() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ln == nil {
		return ""
	}
	return b.ln.Addr().String()
}

// Add adds backends, or changes the readiness check of those already
// there (they keep their place and their current readiness until the new
// check has run). Once the balancer has started, Add returns after each
// added or changed backend's first check.
func (b *Balancer) Add(backends ...Backend) { b.update(backends, false) }

// Set makes backends the whole set, in this order: others are removed,
// those already there are kept as Add keeps them.
func (b *Balancer) Set(backends ...Backend) { b.update(backends, true) }

// Remove takes backends out of the set by address; their open
// connections go on.
func (b *Balancer) Remove(addrs ...string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.backends = slices.DeleteFunc(b.backends, func(be *backend) bool {
		if !slices.Contains(addrs, be.Addr) {
			return false
		}
		be.removed = true
		be.stopChecker()
		return true
	})
}

// InRotation returns the addresses of the backends that get new
// connections now, in round-robin order.
func (b *Balancer) InRotation() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var addrs []string
	for _, be := range b.backends {
		if be.ready {
			addrs = append(addrs, be.Addr)
		}
	}
	return addrs
}

// Routed returns how many connections have gone to the backend at addr
// while it was in the set (a removed backend counts anew if added back).
func (b *Balancer) Routed(addr string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	if be := b.find(addr); be != nil {
		return be.routed
	}
	return 0
}

// Close stops listening, closes every connection and readiness check,
// and waits for all of them to end.
func (b *Balancer) Close() error {
	b.mu.Lock()
	stop := b.stopCtx
	b.mu.Unlock()
	if stop != nil {
		stop()
	}
	b.shutdown()
	b.wg.Wait()
	return nil
}

// shutdown closes what runs; it does not wait, so that it can run from
// the context's AfterFunc.
func (b *Balancer) shutdown() {
	b.shutdownOnce.Do(func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		b.closed = true
		if b.cancel != nil {
			b.cancel()
		}
		if b.ln != nil {
			_ = b.ln.Close()
		}
		for c := range b.conns {
			_ = c.Close()
		}
		for _, be := range b.backends {
			be.stopChecker()
		}
		b.http.CloseIdleConnections()
	})
}

func (b *Balancer) find(addr string) *backend {
	for _, be := range b.backends {
		if be.Addr == addr {
			return be
		}
	}
	return nil
}

// update adds or changes backends; with replace, the set becomes exactly
// list.
func (b *Balancer) update(list []Backend, replace bool) {
	b.mu.Lock()
	var check []*backend
	var set []*backend
	for _, nb := range list {
		be := b.find(nb.Addr)
		if be == nil {
			be = &backend{Backend: nb, ready: !nb.checked()}
			b.backends = append(b.backends, be)
		} else {
			be.stopChecker()
			be.Backend = nb
			if !nb.checked() {
				be.ready = true
			}
		}
		if nb.checked() {
			check = append(check, be)
		}
		set = append(set, be)
	}
	if replace {
		for _, be := range b.backends {
			if !slices.Contains(set, be) {
				be.removed = true
				be.stopChecker()
			}
		}
		b.backends = set
	}
	started := b.ln != nil
	b.mu.Unlock()
	if started {
		for _, be := range check {
			b.startChecker(be)
		}
	}
}

func (be *backend) stopChecker() {
	if be.stop != nil {
		close(be.stop)
		be.stop = nil
	}
}

// startChecker runs be's check once, then in a goroutine every interval
// until be is removed or changed or the balancer closes.
func (b *Balancer) startChecker(be *backend) {
	b.mu.Lock()
	cfg := be.Backend
	b.mu.Unlock()
	ok := b.probe(cfg)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed || be.removed {
		return
	}
	be.stopChecker()
	be.ready = ok
	stop := make(chan struct{})
	be.stop = stop
	b.wg.Add(1)
	go b.checkLoop(be, cfg, stop)
}

func (b *Balancer) checkLoop(be *backend, cfg Backend, stop chan struct{}) {
	defer b.wg.Done()
	t := time.NewTicker(b.opts.CheckInterval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-b.ctx.Done():
			return
		case <-t.C:
		}
		ok := b.probe(cfg)
		b.mu.Lock()
		if be.stop == stop {
			be.ready = ok
		}
		b.mu.Unlock()
	}
}

// probe runs a backend's checks once.
func (b *Balancer) probe(cfg Backend) bool {
	if cfg.Ready != nil && !cfg.Ready() {
		return false
	}
	if cfg.ReadyURL == "" {
		return true
	}
	req, err := http.NewRequestWithContext(b.ctx, http.MethodGet, cfg.ReadyURL, nil)
	if err != nil {
		return false
	}
	resp, err := b.http.Do(req)
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp.StatusCode >= 200 && resp.StatusCode < 300
}

// serve accepts connections until the listener closes.
func (b *Balancer) serve(ln net.Listener) {
	defer b.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		b.wg.Add(1)
		go b.handle(c)
	}
}

// pick returns the next backend in rotation, or nil.
func (b *Balancer) pick() *backend {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := len(b.backends)
	for i := range n {
		j := (b.next + i) % n
		if be := b.backends[j]; be.ready {
			b.next = (j + 1) % n
			be.routed++
			return be
		}
	}
	return nil
}

// handle connects c to the next backend and splices the two.
func (b *Balancer) handle(c net.Conn) {
	defer b.wg.Done()
	be := b.pick()
	if be == nil {
		_ = c.Close()
		return
	}
	d := net.Dialer{Timeout: b.opts.DialTimeout}
	u, err := d.DialContext(b.ctx, "tcp", be.Addr)
	if err != nil {
		_ = c.Close()
		return
	}
	if !b.track(c, u) {
		_ = c.Close()
		_ = u.Close()
		return
	}
	defer b.untrack(c, u)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); copyHalf(u, c) }()
	go func() { defer wg.Done(); copyHalf(c, u) }()
	wg.Wait()
	_ = c.Close()
	_ = u.Close()
}

// track records an open pair so that Close can end it; false once the
// balancer is closed.
func (b *Balancer) track(conns ...net.Conn) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return false
	}
	for _, c := range conns {
		b.conns[c] = struct{}{}
	}
	return true
}

func (b *Balancer) untrack(conns ...net.Conn) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, c := range conns {
		delete(b.conns, c)
	}
}

// copyHalf copies src to dst until src's end, then closes dst for
// writing only, so that dst's peer reads the end while the other
// direction goes on. An error (a reset, a close) closes both, which ends
// the other direction too.
func copyHalf(dst, src net.Conn) {
	if _, err := io.Copy(dst, src); err != nil {
		_ = dst.Close()
		_ = src.Close()
		return
	}
	if cw, ok := dst.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
		return
	}
	_ = dst.Close()
}
