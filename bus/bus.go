// Package bus publishes hubsync's changes as cluster-access events on NATS
// JetStream and keeps a KV bucket with the current access record of every
// (namespace, cluster).
//
// The contract (versioned; docs/events.md, schemas in schema/):
//   - Each change is one CloudEvents 1.0 JSON event (structured mode) on
//     subject <prefix>.<namespace>.<cluster>.<kind> (EscapeToken escapes the
//     names), with Nats-Msg-Id = the event id, so JetStream stores a change
//     republished within the stream's duplicate window once.
//   - The stream keeps events for replay; per subject they are in the order
//     the changes happened.
//   - The KV bucket holds one Record per (namespace, cluster) under KVKey.
//   - No event or record ever carries a token or key.
//
// Reconciliation never waits for NATS: Notify only appends to a bounded
// buffer, and one goroutine publishes it in order. Changes dropped because
// the buffer was full, and everything missed while disconnected, are
// repaired by republishing the current state (Start's snapshot function)
// as soon as NATS is reachable.
package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/syncer"
)

// Bus is the cluster-access event bus. It implements syncer.Notifier.
type Bus struct {
	cfg    config.Bus
	source string
	log    *slog.Logger
	m      *metrics
	q      *queue

	// Tuning; tests shorten some of them.
	storage         jetstream.StorageType
	reconnectWait   time.Duration
	reconnectJitter time.Duration
	opTimeout       time.Duration // one publish or KV write, ack included
	retryBase       time.Duration
	retryMax        time.Duration
	drainTimeout    time.Duration
	snapshotRetry   time.Duration
	batchWindow     time.Duration // see config.Bus.BatchWindow
	maxBatch        int           // changes (or a snapshot's events) in flight at once
	kvPrefix        string        // the KV bucket's subject prefix, "$KV.<bucket>."

	mu        sync.Mutex
	started   bool
	srv       *server.Server
	clientURL string
	cancel    context.CancelFunc
	done      chan struct{}
	closeOnce sync.Once

	embedded bool // set before the publisher starts
	// reconnectFailures counts failed attempts since the last connect.
	reconnectFailures atomic.Int64
	nc                atomic.Pointer[nats.Conn]
	needEnsure        atomic.Bool
	state             chan struct{} // the connection's state changed
	closing           atomic.Bool

	// Owned by the publisher goroutine.
	snapshot func() []syncer.Change
	js       jetstream.JetStream
	kv       jetstream.KeyValue
	recs     records
	// readStored is set once a snapshot has read the bucket's records:
	// from then on the bucket holds only what recs knows of, so later
	// snapshots need its keys only.
	readStored   bool
	ensuredOnce  bool
	nextSnapshot time.Time
}

var _ syncer.Notifier = (*Bus)(nil)

// New makes a bus from its configuration; fields left empty get the
// defaults of config.Default. source is the CloudEvents source of every
// event, for example "hubsync/open-cluster-management". Metrics are
// registered on reg unless it is nil. Nothing connects until Start.
func New(cfg config.Bus, source string, log *slog.Logger, reg prometheus.Registerer) (*Bus, error) {
	if source == "" {
		return nil, errors.New("bus: event source is empty")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	cfg = withDefaults(cfg)
	if _, err := url.Parse(source); err != nil {
		return nil, fmt.Errorf("bus: event source %q is not a URI reference: %w", source, err)
	}
	b := &Bus{
		cfg:             cfg,
		source:          source,
		log:             log,
		q:               newQueue(cfg.BufferSize),
		storage:         jetstream.FileStorage,
		reconnectWait:   time.Second,
		reconnectJitter: time.Second,
		opTimeout:       5 * time.Second,
		retryBase:       100 * time.Millisecond,
		retryMax:        5 * time.Second,
		drainTimeout:    3 * time.Second,
		snapshotRetry:   time.Second,
		batchWindow:     cfg.BatchWindow.Duration,
		maxBatch:        256,
		kvPrefix:        "$KV." + cfg.KVBucket + ".",
		state:           make(chan struct{}, 1),
		recs:            records{},
		done:            make(chan struct{}),
	}
	m, err := newMetrics(reg, func() float64 { return float64(b.q.depth()) })
	if err != nil {
		return nil, fmt.Errorf("bus: register metrics: %w", err)
	}
	b.m = m
	return b, nil
}

func withDefaults(c config.Bus) config.Bus {
	d := config.Default().Bus
	if c.SubjectPrefix == "" {
		c.SubjectPrefix = d.SubjectPrefix
	}
	if c.Stream.Name == "" {
		c.Stream.Name = d.Stream.Name
	}
	if c.Stream.DuplicateWindow.Duration == 0 {
		c.Stream.DuplicateWindow = d.Stream.DuplicateWindow
	}
	if c.Stream.Replicas == 0 {
		c.Stream.Replicas = d.Stream.Replicas
	}
	if c.KVBucket == "" {
		c.KVBucket = d.KVBucket
	}
	if c.BufferSize <= 0 {
		c.BufferSize = d.BufferSize
	}
	if c.BatchWindow == nil {
		c.BatchWindow = d.BatchWindow
	}
	if c.Embedded.Listen == "" {
		c.Embedded.Listen = d.Embedded.Listen
	}
	if c.Embedded.DataDir == "" {
		c.Embedded.DataDir = d.Embedded.DataDir
	}
	return c
}

// Start starts the embedded server when no URLs are configured, then
// connects and publishes in the background: it returns as soon as the
// embedded server is up (or at once for an external NATS), and an
// unreachable NATS is retried forever while changes are buffered.
//
// snapshot returns the current state as changes (for example one
// profile.updated per profile and one credential.synced per credential
// copy). It is called from the bus's goroutine after every (re)connect and
// after dropped changes; its changes are republished and the KV bucket is
// rewritten from them, deleting records it does not mention. Returning nil
// means "not known yet" (caches not synced): the bus asks again a second
// later and deletes nothing; a state known to be empty is a non-nil empty
// slice. With the syncer:
//
//	func() []syncer.Change {
//		if !s.Ready() {
//			return nil
//		}
//		return append([]syncer.Change{}, s.Snapshot()...)
//	}
//
// A nil snapshot function turns resyncs off.
//
// The publisher stops when ctx is done; call Close in any case.
func (b *Bus) Start(ctx context.Context, snapshot func() []syncer.Change) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.started || b.closing.Load() {
		return errors.New("bus: already started or closed")
	}
	opts, err := b.natsOptions()
	if err != nil {
		return err
	}
	if len(b.cfg.URLs) == 0 {
		if b.cfg.Stream.Replicas > 1 {
			b.log.Warn("the embedded NATS server is a single node; using 1 replica", "replicas", b.cfg.Stream.Replicas)
			b.cfg.Stream.Replicas = 1
		}
		srv, clientURL, err := startEmbedded(b.cfg.Embedded, b.log)
		if err != nil {
			return fmt.Errorf("bus: %w", err)
		}
		b.srv, b.clientURL, b.embedded = srv, clientURL, true
		opts.InProcessServer = srv
		b.log.Info("embedded NATS server started", "url", clientURL, "dataDir", b.cfg.Embedded.DataDir)
	} else {
		b.clientURL = b.cfg.URLs[0]
		b.log.Info("connecting to NATS in the background", "urls", redactURLs(b.cfg.URLs))
	}
	b.started = true
	b.snapshot = snapshot
	b.needEnsure.Store(true)
	if snapshot != nil {
		// The KV bucket may hold records of an earlier run.
		b.q.markResync()
	}
	ctx, b.cancel = context.WithCancel(ctx)
	go b.run(ctx, opts)
	return nil
}

// ClientURL is the URL a local consumer can use: the embedded server's
// loopback URL, or the first external URL. Empty before Start.
func (b *Bus) ClientURL() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.clientURL
}

// Notify enqueues a change for publishing. It never blocks: when the
// buffer is full the change is dropped, counted, and the current state is
// republished once NATS is reachable.
func (b *Bus) Notify(c syncer.Change) {
	ok, first := b.q.push(c)
	if ok {
		return
	}
	b.m.dropped.Inc()
	if first {
		b.log.Warn("event buffer full: dropping changes until NATS catches up; the current state will be republished",
			"bufferSize", b.cfg.BufferSize, "connected", b.connected())
	}
}

// Flush waits until every change notified before the call has been
// published and written to the KV bucket, or ctx is done.
func (b *Bus) Flush(ctx context.Context) error {
	seq := b.q.lastSeq()
	for {
		done, changed := b.q.doneUpTo(seq)
		if done {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("bus: flush: %d changes still buffered: %w", b.q.depth(), ctx.Err())
		}
	}
}

// Close publishes what is buffered for a few seconds if connected, then
// stops the publisher, closes the connection and shuts the embedded server
// down. Changes notified afterwards are ignored.
func (b *Bus) Close() error {
	b.closeOnce.Do(func() {
		b.mu.Lock()
		cancel, srv := b.cancel, b.srv
		b.mu.Unlock()
		b.closing.Store(true)
		if cancel != nil {
			if b.connected() {
				ctx, done := context.WithTimeout(context.Background(), b.drainTimeout)
				if ferr := b.Flush(ctx); ferr != nil {
					b.log.Warn("closing the event bus with changes unpublished", "buffered", b.q.depth())
				}
				done()
			} else if n := b.q.depth(); n > 0 {
				b.log.Warn("closing the event bus while NATS is unreachable; buffered changes are lost (the next start republishes the current state)", "buffered", n)
			}
			b.q.close()
			cancel()
			<-b.done
		}
		if srv != nil {
			srv.Shutdown()
			srv.WaitForShutdown()
		}
	})
	return nil
}

func (b *Bus) connected() bool {
	nc := b.nc.Load()
	return nc != nil && nc.IsConnected()
}

func (b *Bus) signalState() {
	select {
	case b.state <- struct{}{}:
	default:
	}
}

// natsOptions builds the connection options; files named in the
// configuration are read here, so a missing one fails Start.
func (b *Bus) natsOptions() (nats.Options, error) {
	o := nats.GetDefaultOptions()
	o.Name = "hubsync"
	o.Servers = b.cfg.URLs
	o.AllowReconnect = true
	o.MaxReconnect = -1
	o.RetryOnFailedConnect = true
	o.ReconnectWait = b.reconnectWait
	o.ReconnectJitter = b.reconnectJitter
	o.ReconnectJitterTLS = b.reconnectJitter
	// Requests made while disconnected fail at once instead of being sent
	// late from nats.go's buffer; the publisher retries them itself.
	o.ReconnectBufSize = -1
	o.PingInterval = 10 * time.Second
	o.MaxPingsOut = 3
	o.ConnectedCB = func(nc *nats.Conn) { b.onConnect(nc, "connected to NATS") }
	o.ReconnectedCB = func(nc *nats.Conn) { b.onConnect(nc, "reconnected to NATS") }
	o.DisconnectedErrCB = func(_ *nats.Conn, err error) {
		b.m.connected.Set(0)
		b.signalState()
		if b.closing.Load() {
			return
		}
		b.log.Warn("disconnected from NATS; buffering events and reconnecting", "err", err, "buffered", b.q.depth())
	}
	// Keep retrying after authorization errors: credentials are re-read on
	// every attempt, so a fixed file or a newly trusted account converges.
	o.IgnoreAuthErrorAbort = true
	o.ReconnectErrCB = func(_ *nats.Conn, err error) {
		// Why the first attempt failed (refused, TLS, authorization), then
		// every 30 attempts (about a minute). nats.go's errors carry no
		// credentials.
		if n := b.reconnectFailures.Add(1); n == 1 || n%30 == 0 {
			b.log.Warn("cannot connect to NATS; retrying", "attempts", n, "err", err, "buffered", b.q.depth())
		}
	}
	o.ClosedCB = func(*nats.Conn) { b.m.connected.Set(0) }
	o.AsyncErrorCB = func(_ *nats.Conn, _ *nats.Subscription, err error) {
		b.log.Warn("NATS error", "err", err)
	}
	var extra []nats.Option
	if b.cfg.CredsFile != "" {
		extra = append(extra, nats.UserCredentials(b.cfg.CredsFile))
	}
	if b.cfg.NKeySeedFile != "" {
		opt, err := nats.NkeyOptionFromSeed(b.cfg.NKeySeedFile)
		if err != nil {
			return o, fmt.Errorf("bus: nkey seed %s: %w", b.cfg.NKeySeedFile, err)
		}
		extra = append(extra, opt)
	}
	if b.cfg.TLS.CAFile != "" {
		extra = append(extra, nats.RootCAs(b.cfg.TLS.CAFile))
	}
	if b.cfg.TLS.CertFile != "" || b.cfg.TLS.KeyFile != "" {
		extra = append(extra, nats.ClientCert(b.cfg.TLS.CertFile, b.cfg.TLS.KeyFile))
	}
	for _, opt := range extra {
		if err := opt(&o); err != nil {
			return o, fmt.Errorf("bus: %w", err)
		}
	}
	return o, nil
}

func (b *Bus) onConnect(nc *nats.Conn, msg string) {
	b.m.connected.Set(1)
	b.reconnectFailures.Store(0)
	b.needEnsure.Store(true)
	b.q.markResync()
	b.signalState()
	where := nc.ConnectedUrlRedacted()
	if b.embedded {
		where = "in-process"
	}
	b.log.Info(msg, "url", where, "server", nc.ConnectedServerName(), "buffered", b.q.depth())
}

// redactURLs hides any user information (user, password or token) in URLs.
func redactURLs(urls []string) string {
	out := make([]string, len(urls))
	for i, s := range urls {
		u, err := url.Parse(s)
		switch {
		case err != nil:
			out[i] = "(unparsable URL)"
		case u.User != nil:
			u.User = url.User("redacted")
			out[i] = u.String()
		default:
			out[i] = s
		}
	}
	return strings.Join(out, ",")
}

// ensure creates or updates the stream and the KV bucket.
func (b *Bus) ensure(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	s := b.cfg.Stream
	maxBytes := s.MaxBytes
	if maxBytes == 0 {
		maxBytes = -1
	}
	dup := s.DuplicateWindow.Duration
	if s.MaxAge.Duration > 0 && dup > s.MaxAge.Duration {
		dup = s.MaxAge.Duration
	}
	if _, err := b.js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        s.Name,
		Description: "hubsync cluster-access events: CloudEvents 1.0 JSON, " + EventSchemaURL,
		Subjects:    []string{b.cfg.SubjectPrefix + ".>"},
		Retention:   jetstream.LimitsPolicy,
		Discard:     jetstream.DiscardOld,
		Storage:     b.storage,
		MaxAge:      s.MaxAge.Duration,
		MaxBytes:    maxBytes,
		MaxMsgs:     -1,
		Duplicates:  dup,
		Replicas:    s.Replicas,
	}); err != nil {
		return fmt.Errorf("create or update stream %s: %w", s.Name, err)
	}
	kv, err := b.js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      b.cfg.KVBucket,
		Description: "hubsync access records per (namespace, cluster), " + RecordSchemaURL,
		History:     1,
		Replicas:    s.Replicas,
		Storage:     b.storage,
	})
	if err != nil {
		return fmt.Errorf("create or update KV bucket %s: %w", b.cfg.KVBucket, err)
	}
	b.kv = kv
	level := slog.LevelDebug
	if !b.ensuredOnce {
		level = slog.LevelInfo
		b.ensuredOnce = true
	}
	b.log.Log(ctx, level, "JetStream stream and KV bucket ready", "stream", s.Name, "subjects", b.cfg.SubjectPrefix+".>",
		"kvBucket", b.cfg.KVBucket, "duplicateWindow", dup)
	return nil
}

// kvRecords reads the whole KV bucket: every key, with its record when
// values is true (nil for a value that is not an access record), or keys
// only (every record nil).
func (b *Bus) kvRecords(ctx context.Context, values bool) (map[string]*Record, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	opts := []jetstream.WatchOpt{jetstream.IgnoreDeletes()}
	if !values {
		opts = append(opts, jetstream.MetaOnly())
	}
	w, err := b.kv.WatchAll(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("read the KV bucket: %w", err)
	}
	defer func() { _ = w.Stop() }()
	out := map[string]*Record{}
	for {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("read the KV bucket: %w", ctx.Err())
		case entry := <-w.Updates():
			if entry == nil { // the current values have all been delivered
				return out, nil
			}
			if !values {
				out[entry.Key()] = nil
				continue
			}
			var r Record
			if err := json.Unmarshal(entry.Value(), &r); err != nil || r.Namespace == "" || r.Cluster == "" {
				b.log.Debug("KV value is not an access record; removing it without an event", "key", entry.Key())
				out[entry.Key()] = nil
				continue
			}
			out[entry.Key()] = &r
		}
	}
}
