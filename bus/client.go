package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/events"
)

// This file holds what every hubsync connection to NATS shares, the
// daemon's bus and a consumer's Client (hubsync events, hubsync state):
// the connection's security options, URL redaction and the KV reader.

// securityOptions are the credentials and TLS settings of cfg: a user
// credentials file or an NKey seed, a CA bundle, a client certificate, and
// bus.requireTLS, which makes the client refuse a server that does not
// offer TLS so that nothing, credentials included, is sent in clear text.
// Files are read here, so a missing one is an error at once; errors never
// hold a file's content.
func securityOptions(cfg config.Bus) ([]nats.Option, error) {
	switch {
	case cfg.CredsFile != "" && cfg.NKeySeedFile != "":
		return nil, fmt.Errorf("bus: a credentials file (%s) and an NKey seed file (%s) are mutually exclusive", cfg.CredsFile, cfg.NKeySeedFile)
	case (cfg.TLS.CertFile == "") != (cfg.TLS.KeyFile == ""):
		return nil, errors.New("bus: a TLS client certificate and key go together")
	}
	var opts []nats.Option
	if cfg.CredsFile != "" {
		opts = append(opts, nats.UserCredentials(cfg.CredsFile))
	}
	if cfg.NKeySeedFile != "" {
		opt, err := nats.NkeyOptionFromSeed(cfg.NKeySeedFile)
		if err != nil {
			return nil, fmt.Errorf("bus: nkey seed %s: %w", cfg.NKeySeedFile, err)
		}
		opts = append(opts, opt)
	}
	if cfg.TLS.CAFile != "" {
		opts = append(opts, nats.RootCAs(cfg.TLS.CAFile))
	}
	if cfg.TLS.CertFile != "" {
		opts = append(opts, nats.ClientCert(cfg.TLS.CertFile, cfg.TLS.KeyFile))
	}
	if cfg.RequireTLS {
		opts = append(opts, nats.Secure())
	}
	return opts, nil
}

// apply applies opts to o.
func apply(o *nats.Options, opts []nats.Option) error {
	for _, opt := range opts {
		if err := opt(o); err != nil {
			return fmt.Errorf("bus: %w", err)
		}
	}
	return nil
}

// RedactURLs hides any user information (user, password or token) in NATS
// URLs and joins them with commas, for logs and errors. Like nats.go it
// takes URLs without a scheme (user@host:4222), and an unparseable URL is
// not shown at all: url.Parse's own error would repeat it whole.
func RedactURLs(urls []string) string {
	out := make([]string, len(urls))
	for i, s := range urls {
		s, added := withScheme(strings.TrimSpace(s))
		out[i] = config.RedactURL(s)
		if added {
			out[i] = strings.TrimPrefix(out[i], "nats://")
		}
	}
	return strings.Join(out, ",")
}

// withScheme is s with nats:// in front when it has no scheme, as nats.go
// reads it, and whether it added one.
func withScheme(s string) (string, bool) {
	if strings.Contains(s, "://") {
		return s, false
	}
	return "nats://" + s, true
}

// checkURLs rejects a URL nats.go could not parse, with an error that does
// not repeat it: url.Parse's would, user information and all.
func checkURLs(urls []string) error {
	for i, s := range urls {
		s, _ = withScheme(s)
		if _, err := url.Parse(s); err != nil {
			var ue *url.Error
			if errors.As(err, &ue) {
				err = ue.Err
			}
			return fmt.Errorf("NATS URL #%d is not a URL: %w", i+1, err)
		}
	}
	return nil
}

// ConsumerURLs are the URLs a consumer on this host dials for cfg (filled
// with its defaults): the external bus.urls, else the embedded server's
// listen address, reached on loopback when it listens on every interface.
func ConsumerURLs(cfg config.Bus) []string {
	if len(cfg.URLs) > 0 {
		return cfg.URLs
	}
	listen := cfg.Embedded.Listen
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return []string{"nats://" + listen}
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	return []string{"nats://" + net.JoinHostPort(host, port)}
}

// Client is a read-only connection to the bus, made the way any consumer
// makes one: hubsync events and hubsync state use it. It connects with the
// daemon's security options and reads the KV bucket with the daemon's
// reader.
type Client struct {
	nc      *nats.Conn
	js      jetstream.JetStream
	where   string // the URLs, redacted
	timeout time.Duration
}

// notRunning ends the errors of a bus that is not there.
const notRunning = "is hubsync running with the bus enabled?"

// Dial connects once, without retrying, to the bus that cfg (filled with
// its defaults) describes: ConsumerURLs, cfg's credentials and TLS
// settings, bus.requireTLS, and the consumer token of the embedded server
// when cfg.Embedded.AuthTokenFile is set. name names the connection;
// timeout bounds the connection and each JetStream request. Its errors
// never hold a credential.
func Dial(cfg config.Bus, name string, timeout time.Duration) (*Client, error) {
	urls := ConsumerURLs(cfg)
	c := &Client{where: RedactURLs(urls), timeout: timeout}
	if err := checkURLs(urls); err != nil {
		return nil, err
	}
	token := cfg.Embedded.AuthTokenFile
	if token != "" && (cfg.CredsFile != "" || cfg.NKeySeedFile != "") {
		return nil, fmt.Errorf("a token file (%s) is for hubsync's embedded NATS, a credentials or NKey seed file for an external one: give one", token)
	}
	opts, err := securityOptions(cfg)
	if err != nil {
		return nil, err
	}
	if token != "" {
		tok, err := readToken(token)
		if err != nil {
			return nil, err
		}
		opts = append(opts, nats.Token(tok))
	}
	o := nats.GetDefaultOptions()
	o.Servers, o.Name, o.Timeout, o.AllowReconnect = urls, name, timeout, false
	if err := apply(&o, opts); err != nil {
		return nil, err
	}
	if c.nc, err = o.Connect(); err != nil {
		return nil, fmt.Errorf("cannot reach NATS at %s: %w (%s)", c.where, err, notRunning)
	}
	if c.js, err = jetstream.New(c.nc); err != nil {
		c.nc.Close()
		return nil, fmt.Errorf("JetStream on %s: %w", c.where, err)
	}
	return c, nil
}

// Close closes the connection.
func (c *Client) Close() { c.nc.Close() }

// Stream looks the event stream up.
func (c *Client) Stream(ctx context.Context, name string) (jetstream.Stream, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	s, err := c.js.Stream(ctx, name)
	if err != nil {
		return nil, c.explain("stream", name, err)
	}
	return s, nil
}

// EventQuery selects events from the stream: by namespace, cluster and
// kind (each "" for any), from a start.
type EventQuery struct {
	Namespace, Cluster, Kind string
	// From: All replays everything the stream keeps, else Start the
	// events stored since then, else (zero) only events to come.
	All   bool
	Start time.Time
	// Follow keeps delivering new events until ctx ends; without it
	// Events returns once it has delivered what was stored when it began.
	Follow bool
}

// Subject is the stream subject filter of q under prefix.
func (q EventQuery) Subject(prefix string) string {
	token := func(s string) string {
		if s == "" {
			return "*"
		}
		return events.EscapeToken(s)
	}
	kind := q.Kind
	if kind == "" {
		kind = "*"
	}
	return strings.Join([]string{prefix, token(q.Namespace), token(q.Cluster), kind}, ".")
}

func (q EventQuery) consumerConfig(prefix string) jetstream.OrderedConsumerConfig {
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{q.Subject(prefix)}, DeliverPolicy: jetstream.DeliverNewPolicy}
	switch {
	case q.All:
		cfg.DeliverPolicy = jetstream.DeliverAllPolicy
	case !q.Start.IsZero():
		cfg.DeliverPolicy = jetstream.DeliverByStartTimePolicy
		cfg.OptStartTime = &q.Start
	}
	return cfg
}

// Events hands fn the messages of the event stream q selects, in the
// stream's order, through an ordered consumer (any consumer may create
// one). An end of ctx while following is a normal end; an error from fn
// ends Events with it.
func (c *Client) Events(ctx context.Context, bc config.Bus, q EventQuery, fn func(subject string, data []byte) error) error {
	s, err := c.Stream(ctx, bc.Stream.Name)
	if err != nil {
		return err
	}
	lookup, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	filter := q.Subject(bc.SubjectPrefix)
	// Without Follow, the replay ends at the last event the stream held
	// for the filter when it began, as the stream's leader answers. What
	// the consumer says is pending is not the end: an ordered consumer is
	// one copy, on any of a replicated stream's nodes, and one on a node
	// that has not stored the latest events yet counts them out.
	var end uint64
	if !q.Follow {
		if end, err = replayEnd(lookup, s, q, filter); err != nil || end == 0 {
			return err
		}
	}
	cons, err := s.OrderedConsumer(lookup, q.consumerConfig(bc.SubjectPrefix))
	if err != nil {
		return fmt.Errorf("consume %s from stream %q: %w", filter, bc.Stream.Name, err)
	}
	it, err := cons.Messages()
	if err != nil {
		return fmt.Errorf("consume %s from stream %q: %w", filter, bc.Stream.Name, err)
	}
	defer it.Stop()
	for {
		msg, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			if ctx.Err() != nil {
				return nil // interrupted: a normal end when following
			}
			return fmt.Errorf("read stream %q: %w", bc.Stream.Name, err)
		}
		if err := fn(msg.Subject(), msg.Data()); err != nil {
			return err
		}
		if !q.Follow {
			if meta, err := msg.Metadata(); err == nil && meta.Sequence.Stream >= end {
				return nil
			}
		}
	}
}

// replayEnd is the stream sequence of the last event q replays without
// following, read from s's leader (a message get, which the events
// streams do not allow replicas to answer); 0 when there is none.
func replayEnd(ctx context.Context, s jetstream.Stream, q EventQuery, filter string) (uint64, error) {
	if !q.All && q.Start.IsZero() {
		return 0, nil // only events to come: nothing to replay
	}
	last, err := s.GetLastMsgForSubject(ctx, filter)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return 0, nil
	case err != nil:
		return 0, fmt.Errorf("the last event of %s in stream %q: %w", filter, s.CachedInfo().Config.Name, err)
	case !q.All && last.Time.Before(q.Start):
		return 0, nil
	}
	return last.Sequence, nil
}

// Records reads the access records of the KV bucket, those of namespace
// only when it is not empty. It reads the bucket's stream as any reader
// of a bucket may, a consumer's read-only copy included (layout.go): the
// keys it holds, then each key's last value. A key whose last value is a
// deletion is left out.
func (c *Client) Records(ctx context.Context, bucket, namespace string) ([]StoredRecord, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	s, err := c.js.Stream(ctx, "KV_"+bucket)
	if err != nil {
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			err = jetstream.ErrBucketNotFound
		}
		return nil, c.explain("key-value bucket", bucket, err)
	}
	pre := "$KV." + bucket + "."
	filter := pre + "*.*"
	if namespace != "" {
		// KVKey escapes each part on its own: the namespace's part of the
		// key is what precedes the dot of KVKey(namespace, "").
		filter = pre + events.KVKey(namespace, "") + "*"
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(filter))
	if err != nil {
		return nil, fmt.Errorf("read bucket %q: %w", bucket, err)
	}
	subjects := make([]string, 0, len(info.State.Subjects))
	for subj := range info.State.Subjects {
		subjects = append(subjects, subj)
	}
	slices.Sort(subjects)
	var out []StoredRecord
	for _, subj := range subjects {
		m, err := s.GetLastMsgForSubject(ctx, subj)
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
			continue // purged since the listing
		case err != nil:
			return nil, fmt.Errorf("read bucket %q: %w", bucket, err)
		}
		if op := m.Header.Get("KV-Operation"); op == "DEL" || op == "PURGE" {
			continue
		}
		out = append(out, StoredRecord{Key: strings.TrimPrefix(subj, pre), Record: decodeRecord(m.Data), Value: m.Data})
	}
	return out, nil
}

// explain says why the lookup of a stream or bucket failed.
func (c *Client) explain(what, name string, err error) error {
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound), errors.Is(err, jetstream.ErrBucketNotFound):
		return fmt.Errorf("%s %q not found on %s: %s", what, name, c.where, notRunning)
	case errors.Is(err, jetstream.ErrJetStreamNotEnabled), errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount),
		errors.Is(err, nats.ErrNoResponders):
		return fmt.Errorf("JetStream is not enabled on %s: %s", c.where, notRunning)
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout):
		return fmt.Errorf("%s %q on %s: no answer within %v: %s", what, name, c.where, c.timeout, notRunning)
	default:
		return fmt.Errorf("%s %q on %s: %w", what, name, c.where, err)
	}
}

// StoredRecord is one key of the KV bucket as read back.
type StoredRecord struct {
	Key string
	// Record is the value decoded; nil when the value is not an access
	// record, or when only keys were read.
	Record *Record
	// Value is the value as stored; nil when only keys were read.
	Value []byte
}

// readRecords reads the current value of every key of kv matching keys (a
// KV key filter; ">" for all), or only the keys when values is false. A
// watch delivers each key's latest value, then a nil entry that marks the
// end of the current values: a watch that ends before that marker is an
// error, never a partial result taken for the whole bucket.
func readRecords(ctx context.Context, kv jetstream.KeyValue, keys string, values bool) ([]StoredRecord, error) {
	opts := []jetstream.WatchOpt{jetstream.IgnoreDeletes()}
	if !values {
		opts = append(opts, jetstream.MetaOnly())
	}
	w, err := kv.Watch(ctx, keys, opts...)
	if err != nil {
		return nil, fmt.Errorf("read the KV bucket: %w", err)
	}
	defer func() { _ = w.Stop() }()
	var out []StoredRecord
	for {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("read the KV bucket: %w", ctx.Err())
		case e, ok := <-w.Updates():
			switch {
			case !ok:
				return nil, fmt.Errorf("read the KV bucket: the watch ended after %d keys, before the last", len(out))
			case e == nil:
				return out, nil
			case !values:
				out = append(out, StoredRecord{Key: e.Key()})
			default:
				out = append(out, StoredRecord{Key: e.Key(), Record: decodeRecord(e.Value()), Value: e.Value()})
			}
		}
	}
}

// decodeRecord is the access record value holds, or nil when it holds
// none.
func decodeRecord(value []byte) *Record {
	var r Record
	if err := json.Unmarshal(value, &r); err != nil || r.Namespace == "" || r.Cluster == "" {
		return nil
	}
	return &r
}
