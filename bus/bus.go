// Package bus publishes hubsync's changes as cluster-access events on NATS
// JetStream and keeps a KV bucket with the current access record of every
// (namespace, cluster). It is the change stream's consumer named "nats".
//
// The contract (versioned; docs/events.md, schemas in package events):
//   - Each change is one CloudEvents 1.0 JSON event (structured mode) on
//     subject <prefix>.<namespace>.<cluster>.<kind> (events.EscapeToken escapes the
//     names), with Nats-Msg-Id = the event id, so JetStream stores a change
//     republished within the stream's duplicate window once.
//   - The stream keeps events for replay; per subject they are in the order
//     the changes happened.
//   - The KV bucket holds one Record per (namespace, cluster) under events.KVKey.
//   - No event or record ever carries a token or key.
//
// Reconciliation never waits for NATS: the stream's fan-out queues changes
// for the bus (bounded by bus.bufferSize) and calls Deliver from the bus's
// own worker. Changes dropped because the queue was full, and everything
// missed while disconnected, are repaired by Resync, which republishes the
// current state as soon as NATS is reachable.
//
// Client is the other side: a read-only connection made the way any
// consumer makes one (hubsync events and hubsync state use it), with the
// same connection options and KV reader as the bus (client.go).
//
// May import config, stream, events and hub; only daemon and cmd import it.
package bus

import (
	"context"
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
	// provisioned is set once every consumer account of the embedded
	// server has its copies; provisionAt is when to try again after a
	// failure; provMu serializes provisioning (provision.go).
	provisioned atomic.Bool
	provMu      sync.Mutex
	provisionAt time.Time
	// consumers is bus.consumers as last applied (SetConsumers);
	// consumersMu serializes SetConsumers.
	consumers   atomic.Pointer[[]config.BusConsumer]
	consumersMu sync.Mutex
	// nodeStarted is when the embedded server started; nodeCurrent is
	// set once it has caught up with its cluster (NodeReady).
	nodeStarted time.Time
	nodeCurrent atomic.Bool
	// health is the last refreshHealth's reading, for /readyz?verbose.
	health atomic.Pointer[Health]
	// provisionKick has watchHealth make the copies (kickProvision).
	provisionKick chan struct{}
	// healthCancel stops watchHealth, which closes healthDone.
	healthCancel context.CancelFunc
	healthDone   chan struct{}
}

var (
	_ stream.Consumer = (*Bus)(nil)
	_ stream.Attacher = (*Bus)(nil)
)

// Name is the bus's consumer name in the change stream, its logs and
// metrics.
const Name = config.SinkNATS

// New makes a bus from a defaulted configuration (a loaded file, or
// config.Default().Bus): the bus has no defaults of its own and refuses a
// field it needs left empty. source is the CloudEvents source of every
// event, for example "hubsync/open-cluster-management". Metrics are
// registered on reg unless it is nil. Nothing connects until Start.
func New(cfg config.Bus, source string, log *slog.Logger, reg prometheus.Registerer) (*Bus, error) {
	if source == "" {
		return nil, errors.New("bus: event source is empty")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := checkConfig(cfg); err != nil {
		return nil, err
	}
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
		maxBatch:        config.DefaultMaxBatch,
		kvPrefix:        "$KV." + cfg.KVBucket + ".",
		recs:            stream.Records{},
		done:            make(chan struct{}),
		provisionKick:   make(chan struct{}, 1),
	}
	if len(cfg.URLs) == 0 && cfg.Embedded.Clustered() {
		// A publish in flight when the stream's leader moves (a node lost
		// or stopping) is never acknowledged: it is sent again once its
		// ack is overdue, with the same id (JetStream keeps one). An ack
		// on the cluster normally takes milliseconds (a quorum's write),
		// so 2s bounds that pause without mistaking load for a loss.
		b.opTimeout = clusteredOpTimeout
	}
	consumers := cfg.Consumers
	b.consumers.Store(&consumers)
	m, err := newMetrics(reg)
	if err != nil {
		return nil, fmt.Errorf("bus: register metrics: %w", err)
	}
	b.m = m
	return b, nil
}

// checkConfig refuses a configuration whose defaults were not filled: an
// empty name would make subjects, the stream or the bucket that NATS
// refuses only once connected, and a zero queue would hold nothing.
func checkConfig(c config.Bus) error {
	var missing []string
	for _, f := range []struct {
		name string
		ok   bool
	}{
		{"subjectPrefix", c.SubjectPrefix != ""},
		{"stream.name", c.Stream.Name != ""},
		{"stream.duplicateWindow", c.Stream.DuplicateWindow.Duration > 0},
		{"stream.replicas", c.Stream.Replicas > 0},
		{"kvBucket", c.KVBucket != ""},
		{"bufferSize", c.BufferSize > 0},
		{"batchWindow", c.BatchWindow != nil},
		{"yieldMax", c.YieldMax != nil},
		{"embedded.listen", len(c.URLs) > 0 || c.Embedded.Listen != ""},
		{"embedded.dataDir", len(c.URLs) > 0 || c.Embedded.DataDir != ""},
	} {
		if !f.ok {
			missing = append(missing, "bus."+f.name)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("bus: %s not set (start from a loaded configuration or config.Default().Bus)", strings.Join(missing, ", "))
	}
	return nil
}

// ConsumerOptions are the bus's options in the change stream's fan-out:
// its queue is bus.bufferSize changes, batched within bus.batchWindow,
// held while the syncer converges a burst for at most bus.yieldMax and at
// most half the queue (the bus shares hubsync's process and the hub's CPU
// with the writes it reports; the other half stays for a NATS outage),
// retried after 100 ms doubling to 5 s.
func (b *Bus) ConsumerOptions() stream.Options {
	o := config.ConsumerOptions(Name, config.SinkNATS)
	o.QueueSize, o.MaxBatch, o.BatchWindow = b.cfg.BufferSize, b.maxBatch, b.cfg.BatchWindow.Duration
	o.Yield, o.YieldMax, o.YieldLimit = b.cfg.YieldMax.Duration > 0, b.cfg.YieldMax.Duration, max(b.cfg.BufferSize/2, 1)
	o.RetryMax = config.DefaultBusRetryMax
	o.Log = b.log
	return o
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

// Start starts publishing: it starts the embedded server when no URLs are
// configured and StartNode has not, then connects in the background. It
// returns as soon as the embedded server is up (or at once for an
// external NATS), and an unreachable NATS is retried forever while the
// fan-out keeps the bus's changes queued. The connection is closed when
// ctx is done; call Close in any case.
func (b *Bus) Start(ctx context.Context) error {
	// A SetConsumers meanwhile waits, then applies to the running server.
	b.consumersMu.Lock()
	defer b.consumersMu.Unlock()
	if err := b.startNode(); err != nil {
		return err
	}
	// Reads the credential files: before the lock.
	opts, err := b.natsOptions(b.cfg)
	if err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.started || b.closing.Load() {
		return errors.New("bus: already started or closed")
	}
	if b.srv != nil {
		opts.InProcessServer = b.srv
		// In-process connections skip TLS but not authorization.
		opts.User, opts.Password = selfUser, b.auth.selfPassword
		opts.InboxPrefix = selfInboxPrefix
	} else {
		b.clientURL = b.cfg.URLs[0]
		b.log.Info("connecting to NATS in the background", "urls", RedactURLs(b.cfg.URLs))
		var hctx context.Context
		hctx, b.healthCancel = context.WithCancel(context.Background())
		b.healthDone = make(chan struct{})
		go b.watchHealth(hctx, b.healthDone)
	}
	b.started = true
	b.needEnsure.Store(true)
	ctx, b.cancel = context.WithCancel(ctx)
	go b.run(ctx, opts)
	return nil
}

// StartNode starts the embedded server, when no URLs are configured,
// without publishing: every replica runs its node, so that the nodes of a
// cluster (bus.embedded.cluster) form one whichever replica leads, and
// consumers reach any of them. Start starts it too when it was not
// started. A no-op for an external NATS.
func (b *Bus) StartNode() error {
	b.consumersMu.Lock()
	defer b.consumersMu.Unlock()
	return b.startNode()
}

// startNode starts the embedded server once; the caller holds
// consumersMu. The server may take seconds to start: b.mu is not held
// meanwhile, so the callbacks of a connection and Attach never wait for
// it. A Close that comes meanwhile stops the server once it is up.
func (b *Bus) startNode() error {
	b.mu.Lock()
	if b.srv != nil || len(b.cfg.URLs) > 0 {
		b.mu.Unlock()
		return nil
	}
	if b.closing.Load() {
		b.mu.Unlock()
		return errors.New("bus: closed")
	}
	cfg := b.current()
	b.mu.Unlock()
	emb, err := b.startServer(cfg)
	b.mu.Lock()
	defer b.mu.Unlock()
	if err == nil && b.closing.Load() {
		err = errors.New("bus: closed while starting")
	}
	if err != nil {
		if emb.srv != nil {
			// Close has run and did not see this server: stop it here.
			emb.srv.Shutdown()
			emb.srv.WaitForShutdown()
		}
		return err
	}
	b.srv, b.auth, b.clientURL, b.embedded = emb.srv, emb.auth, emb.clientURL, true
	b.nodeStarted = time.Now()
	if !cfg.Embedded.Clustered() {
		b.cfg.Stream.Replicas = 1
	}
	var ctx context.Context
	ctx, b.healthCancel = context.WithCancel(context.Background())
	b.healthDone = make(chan struct{})
	go b.watchHealth(ctx, b.healthDone)
	return nil
}

// embeddedServer is what startServer started: the embedded server, its
// authorization and its client URL.
type embeddedServer struct {
	srv       *server.Server
	auth      *embeddedAuth
	clientURL string
}

// startServer starts the embedded server of cfg. It reads files and waits
// for the server: the caller holds no lock.
func (b *Bus) startServer(cfg config.Bus) (embeddedServer, error) {
	if cfg.Stream.Replicas > 1 && !cfg.Embedded.Clustered() {
		b.log.Warn("the embedded NATS server is a single node (no bus.embedded.cluster); using 1 replica", "replicas", cfg.Stream.Replicas)
	}
	var token string
	consumers := "local: on this host, read-only"
	if cfg.Embedded.AuthTokenFile != "" {
		var err error
		if token, err = readToken(cfg.Embedded.AuthTokenFile); err != nil {
			return embeddedServer{}, fmt.Errorf("bus: %w", err)
		}
		consumers = "local: with the token of bus.embedded.authTokenFile, read-only"
	}
	auth, err := newEmbeddedAuth(cfg, token)
	if err != nil {
		return embeddedServer{}, fmt.Errorf("bus: %w", err)
	}
	srv, clientURL, err := startEmbedded(cfg, auth, b.log)
	if err != nil {
		return embeddedServer{}, fmt.Errorf("bus: %w", err)
	}
	attrs := []any{"url", clientURL, "dataDir", cfg.Embedded.DataDir, "consumers", consumers, "applications", len(cfg.Consumers)}
	if c := cfg.Embedded.Cluster; c.Name != "" {
		attrs = append(attrs, "cluster", c.Name, "node", srv.Name(), "routes", len(c.Routes), "replicas", cfg.Stream.Replicas)
	}
	b.log.Info("embedded NATS server started", attrs...)
	return embeddedServer{srv: srv, auth: auth, clientURL: clientURL}, nil
}

// ClientURL is the URL a local consumer can use: the embedded server's
// loopback URL, or the first external URL. Empty before Start.
func (b *Bus) ClientURL() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.clientURL
}

// clusteredOpTimeout is opTimeout on a clustered embedded bus.
const clusteredOpTimeout = 2 * time.Second

// Close closes the connection and shuts the embedded server down. Remove
// the bus from the fan-out (or close the fan-out) first, which delivers
// what is queued for a while.
func (b *Bus) Close() error {
	b.closeOnce.Do(func() {
		// closing is set under the lock, so that a Start in progress
		// either finishes before this reads what it started, or sees
		// closing and stops what it started itself.
		b.mu.Lock()
		b.closing.Store(true)
		cancel, srv := b.cancel, b.srv
		healthCancel, healthDone := b.healthCancel, b.healthDone
		b.mu.Unlock()
		if cancel != nil {
			cancel()
			<-b.done
		}
		if healthCancel != nil {
			healthCancel()
			<-healthDone
		}
		if srv != nil {
			b.handOver(srv)
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

// natsOptions builds the connection options of cfg: the daemon's own
// reconnection policy and callbacks, and the security options every
// hubsync client shares (see securityOptions). Files named in the
// configuration are read here, so a missing one fails Start.
func (b *Bus) natsOptions(cfg config.Bus) (nats.Options, error) {
	o := nats.GetDefaultOptions()
	o.Name = "hubsync"
	o.Servers = cfg.URLs
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
	extra, err := securityOptions(cfg)
	if err != nil {
		return o, err
	}
	if err := apply(&o, extra); err != nil {
		return o, err
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

// ensure creates or updates the stream and the KV bucket.
func (b *Bus) ensure(ctx context.Context) error {
	// A clustered JetStream drops an API request that comes before its
	// nodes have elected a metadata leader: no answer ever comes. Such a
	// request is given up sooner, and the fan-out's retry sends another.
	timeout := 10 * time.Second
	if b.cfg.Embedded.Clustered() || b.cfg.Stream.Replicas > 1 {
		timeout = 3 * time.Second
	}
	ctx, cancel := context.WithTimeout(b.untilAnswered(ctx), timeout)
	defer cancel()
	s := b.cfg.Stream
	js := b.jetStream()
	if js == nil {
		return errNotConnected
	}
	primary := b.primaryConfig()
	if _, err := js.CreateOrUpdateStream(ctx, primary); err != nil {
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
		"kvBucket", b.cfg.KVBucket, "duplicateWindow", primary.Duplicates)
	if b.embedded || b.cfg.NKeySeedFile != "" {
		// The copies follow, beside publishing (watchHealth).
		b.provisioned.Store(false)
		b.kickProvision()
	}
	return nil
}

// untilAnswered is ctx for a JetStream request that makes or changes a
// stream: on the embedded server it does not end with ctx, only at the
// caller's own timeout, so a request once sent is answered before Close
// shuts the server down. nats-server v2.15.3 adds the stream such a
// request makes without looking whether JetStream is shutting down, and a
// stream added after shutdownJetStream has collected the accounts' streams
// is never stopped: its file store and source goroutines outlive the
// server.
func (b *Bus) untilAnswered(ctx context.Context) context.Context {
	if b.embedded {
		return context.WithoutCancel(ctx)
	}
	return ctx
}

// primaryConfig is the writer's stream configuration ensure makes.
func (b *Bus) primaryConfig() jetstream.StreamConfig {
	s := b.cfg.Stream
	maxBytes := s.MaxBytes
	if maxBytes == 0 {
		maxBytes = -1
	}
	dup := s.DuplicateWindow.Duration
	if s.MaxAge.Duration > 0 && dup > s.MaxAge.Duration {
		dup = s.MaxAge.Duration
	}
	return b.streamConfig(maxBytes, dup)
}

// streamConfig is the event stream's configuration. It listens on the
// event subjects: only hubsync's user may publish there (on the embedded
// server, consumers read copies in accounts of their own, layout.go; on
// an external NATS, the operator's permissions decide).
func (b *Bus) streamConfig(maxBytes int64, dup time.Duration) jetstream.StreamConfig {
	s := b.cfg.Stream
	return jetstream.StreamConfig{
		Name:        s.Name,
		Description: "hubsync cluster-access events: CloudEvents 1.0 JSON, " + events.EventSchemaURL,
		Subjects:    []string{b.cfg.SubjectPrefix + ".>"},
		Retention:   jetstream.LimitsPolicy,
		Discard:     jetstream.DiscardOld,
		Storage:     b.storage,
		MaxAge:      s.MaxAge.Duration,
		MaxBytes:    maxBytes,
		MaxMsgs:     -1,
		Duplicates:  dup,
		Replicas:    s.Replicas,
	}
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
	stored, err := readRecords(ctx, b.kv, ">", values)
	if err != nil {
		return nil, err
	}
	out := make(map[string]*Record, len(stored))
	for _, s := range stored {
		if values && s.Record == nil {
			b.log.Debug("KV value is not an access record; removing it without an event", "key", s.Key)
		}
		out[s.Key] = s.Record
	}
	return out, nil
}
