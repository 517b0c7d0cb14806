// Package bus publishes hubsync's changes as cluster-access events on NATS
// JetStream and keeps a KV bucket with the current access record of every
// (namespace, cluster). It is the change stream's consumer named "nats".
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
// Reconciliation never waits for NATS: the stream's fan-out queues changes
// for the bus (bounded by bus.bufferSize) and calls Deliver from the bus's
// own worker. Changes dropped because the queue was full, and everything
// missed while disconnected, are repaired by Resync, which republishes the
// current state as soon as NATS is reachable.
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
	"github.com/hubsync/hubsync/events"
	"github.com/hubsync/hubsync/stream"
)

// Bus is the cluster-access event bus. It is a stream.Consumer: add it to
// the fan-out with ConsumerOptions.
type Bus struct {
	cfg    config.Bus
	source string
	log    *slog.Logger
	m      *metrics

	// Tuning; tests shorten some of them.
	storage         jetstream.StorageType
	reconnectWait   time.Duration
	reconnectJitter time.Duration
	opTimeout       time.Duration // one publish or KV write, ack included
	maxBatch        int           // a resync's events in flight at once
	kvPrefix        string        // the KV bucket's subject prefix, "$KV.<bucket>."
	// publishPrefix starts the subjects hubsync publishes events on: the
	// subject prefix, or on the embedded server the private one the event
	// stream maps to it (see streamConfig).
	publishPrefix string

	mu        sync.Mutex
	started   bool
	srv       *server.Server
	auth      *embeddedAuth // the embedded server's
	clientURL string
	cancel    context.CancelFunc
	done      chan struct{}
	closeOnce sync.Once
	control   stream.Control

	embedded bool // set before the connection starts
	// reconnectFailures counts failed attempts since the last connect.
	reconnectFailures atomic.Int64
	nc                atomic.Pointer[nats.Conn]
	js                atomic.Pointer[jetstream.JetStream]
	needEnsure        atomic.Bool
	closing           atomic.Bool

	// Owned by the consumer's worker (Deliver and Resync).
	kv   jetstream.KeyValue
	recs stream.Records
	// typed holds the event types announceUnknown chose for the changes of
	// the batch being delivered, by their original id, so that a retry of
	// a failed batch (whose records recs already holds) announces them the
	// same way.
	typed map[string]string
	// readStored is set once a resync has read the bucket's records: from
	// then on the bucket holds only what recs knows of, so later resyncs
	// need its keys only.
	readStored  bool
	ensuredOnce bool
}

var (
	_ stream.Consumer = (*Bus)(nil)
	_ stream.Attacher = (*Bus)(nil)
)

// Name is the bus's consumer name in the change stream, its logs and
// metrics.
const Name = config.SinkNATS

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
		storage:         jetstream.FileStorage,
		reconnectWait:   time.Second,
		reconnectJitter: time.Second,
		opTimeout:       5 * time.Second,
		maxBatch:        256,
		kvPrefix:        "$KV." + cfg.KVBucket + ".",
		publishPrefix:   cfg.SubjectPrefix,
		recs:            stream.Records{},
		done:            make(chan struct{}),
	}
	m, err := newMetrics(reg)
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
	if c.YieldMax == nil {
		c.YieldMax = d.YieldMax
	}
	if c.Embedded.Listen == "" {
		c.Embedded.Listen = d.Embedded.Listen
	}
	if c.Embedded.DataDir == "" {
		c.Embedded.DataDir = d.Embedded.DataDir
	}
	return c
}

// ConsumerOptions are the bus's options in the change stream's fan-out:
// its queue is bus.bufferSize changes, batched within bus.batchWindow,
// held while the syncer converges a burst for at most bus.yieldMax and at
// most half the queue (the bus shares hubsync's process and the hub's CPU
// with the writes it reports; the other half stays for a NATS outage),
// retried after 100 ms doubling to 5 s.
func (b *Bus) ConsumerOptions() stream.Options {
	return stream.Options{
		Name: Name, Type: config.SinkNATS,
		QueueSize: b.cfg.BufferSize, MaxBatch: b.maxBatch, BatchWindow: b.cfg.BatchWindow.Duration,
		Yield: b.cfg.YieldMax.Duration > 0, YieldMax: b.cfg.YieldMax.Duration, YieldLimit: max(b.cfg.BufferSize/2, 1),
		RetryBase: 100 * time.Millisecond, RetryMax: 5 * time.Second,
		Log: b.log,
	}
}

// Attach implements stream.Attacher: the bus asks for a resync after every
// (re)connect and ends a backoff as soon as NATS is back.
func (b *Bus) Attach(c stream.Control) {
	b.mu.Lock()
	b.control = c
	b.mu.Unlock()
}

func (b *Bus) resyncNow() {
	b.mu.Lock()
	c := b.control
	b.mu.Unlock()
	if c != nil {
		c.RequestResync()
		c.Retry()
	}
}

// Start starts the embedded server when no URLs are configured, then
// connects in the background: it returns as soon as the embedded server is
// up (or at once for an external NATS), and an unreachable NATS is retried
// forever while the fan-out keeps the bus's changes queued. The connection
// is closed when ctx is done; call Close in any case.
func (b *Bus) Start(ctx context.Context) error {
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
		token, consumers := "", "without credentials, read-only"
		if b.cfg.Embedded.AuthTokenFile != "" {
			if token, err = readToken(b.cfg.Embedded.AuthTokenFile); err != nil {
				return fmt.Errorf("bus: %w", err)
			}
			consumers = "with the token of bus.embedded.authTokenFile, read-only"
		}
		auth, err := newEmbeddedAuth(b.cfg, token)
		if err != nil {
			return fmt.Errorf("bus: %w", err)
		}
		srv, clientURL, err := startEmbedded(b.cfg.Embedded, auth, b.log)
		if err != nil {
			return fmt.Errorf("bus: %w", err)
		}
		b.srv, b.auth, b.clientURL, b.embedded = srv, auth, clientURL, true
		b.publishPrefix = privateRoot + "." + b.cfg.SubjectPrefix
		opts.InProcessServer = srv
		// In-process connections skip TLS but not authorization.
		opts.User, opts.Password = selfUser, auth.selfPassword
		opts.InboxPrefix = selfInboxPrefix
		b.log.Info("embedded NATS server started", "url", clientURL, "dataDir", b.cfg.Embedded.DataDir, "consumers", consumers)
	} else {
		b.clientURL = b.cfg.URLs[0]
		b.log.Info("connecting to NATS in the background", "urls", RedactURLs(b.cfg.URLs))
	}
	b.started = true
	b.needEnsure.Store(true)
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

// Close closes the connection and shuts the embedded server down. Remove
// the bus from the fan-out (or close the fan-out) first, which delivers
// what is queued for a while.
func (b *Bus) Close() error {
	b.closeOnce.Do(func() {
		b.mu.Lock()
		cancel, srv := b.cancel, b.srv
		b.mu.Unlock()
		b.closing.Store(true)
		if cancel != nil {
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
		if b.closing.Load() {
			return
		}
		b.log.Warn("disconnected from NATS; events wait in the bus's queue while it reconnects", "err", err)
	}
	// Keep retrying after authorization errors: credentials are re-read on
	// every attempt, so a fixed file or a newly trusted account converges.
	o.IgnoreAuthErrorAbort = true
	o.ReconnectErrCB = func(_ *nats.Conn, err error) {
		// Why the first attempt failed (refused, TLS, authorization), then
		// every 30 attempts (about a minute). nats.go's errors carry no
		// credentials.
		if n := b.reconnectFailures.Add(1); n == 1 || n%30 == 0 {
			b.log.Warn("cannot connect to NATS; retrying", "attempts", n, "err", err)
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
	if b.cfg.RequireTLS {
		// The client refuses a server that does not offer TLS, so nothing
		// (credentials included) is ever sent in clear text.
		extra = append(extra, nats.Secure())
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
	where := nc.ConnectedUrlRedacted()
	if b.embedded {
		where = "in-process"
	}
	b.log.Info(msg, "url", where, "server", nc.ConnectedServerName())
	// Whatever was missed while disconnected is repaired from the current
	// state, and a delivery waiting out its backoff goes now.
	b.resyncNow()
}

// RedactURLs hides any user information (user, password or token) in URLs
// and joins them with commas, for logs.
func RedactURLs(urls []string) string {
	out := make([]string, len(urls))
	for i, s := range urls {
		out[i] = config.RedactURL(s)
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
	js := b.jetStream()
	if js == nil {
		return errNotConnected
	}
	if _, err := js.CreateOrUpdateStream(ctx, b.streamConfig(maxBytes, dup)); err != nil {
		return fmt.Errorf("create or update stream %s: %w", s.Name, err)
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      b.cfg.KVBucket,
		Description: "hubsync access records per (namespace, cluster), " + events.RecordSchemaURL,
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

// streamConfig is the event stream's configuration. On an external NATS
// the stream listens on the event subjects, and the operator's permissions
// decide who may publish there. On the embedded server hubsync publishes
// on a private subject (publishPrefix) that only it may use; the stream
// stores each event under its public subject and then the server
// republishes it there for live subscribers. So the stream stores nothing
// sent on the public subjects, which matters because a consumer, which
// may create push consumers, can have the server send copies of stored
// messages to any subject with a subscriber (see authz.go). A side
// effect: a change published twice within the duplicate window reaches
// live subscribers once, as it is stored once.
func (b *Bus) streamConfig(maxBytes int64, dup time.Duration) jetstream.StreamConfig {
	s := b.cfg.Stream
	public := b.cfg.SubjectPrefix + ".>"
	c := jetstream.StreamConfig{
		Name:        s.Name,
		Description: "hubsync cluster-access events: CloudEvents 1.0 JSON, " + events.EventSchemaURL,
		Subjects:    []string{public},
		Retention:   jetstream.LimitsPolicy,
		Discard:     jetstream.DiscardOld,
		Storage:     b.storage,
		MaxAge:      s.MaxAge.Duration,
		MaxBytes:    maxBytes,
		MaxMsgs:     -1,
		Duplicates:  dup,
		Replicas:    s.Replicas,
	}
	if b.publishPrefix != b.cfg.SubjectPrefix {
		private := b.publishPrefix + ".>"
		c.Subjects = []string{private}
		c.SubjectTransform = &jetstream.SubjectTransformConfig{Source: private, Destination: public}
		c.RePublish = &jetstream.RePublish{Source: public, Destination: public}
	}
	return c
}

func (b *Bus) jetStream() jetstream.JetStream {
	if p := b.js.Load(); p != nil {
		return *p
	}
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
