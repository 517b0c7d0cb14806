package webhook

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/events"
	"github.com/hubsync/hubsync/sinks"
	"github.com/hubsync/hubsync/stream"
)

// options tune the sender; tests shorten them.
type options struct {
	// retryBase and retryMax bound the exponential backoff between
	// attempts at one event.
	retryBase, retryMax time.Duration
	// retryAfterMax caps a Retry-After, so that an endpoint asking for
	// hours does not stall the sink for hours.
	retryAfterMax time.Duration
	// secretTTL is how long signing secrets and the bearer token (from a
	// file or a hub Secret) are used before they are read again; a failed
	// attempt reads them again at once.
	secretTTL time.Duration
	now       func() time.Time
	// jitter returns a random number in [0, n).
	jitter func(n int64) int64
}

func defaultOptions() options {
	return options{
		retryBase:     200 * time.Millisecond,
		retryMax:      30 * time.Second,
		retryAfterMax: 5 * time.Minute,
		secretTTL:     5 * time.Second,
		now:           time.Now,
		jitter:        rand.Int64N,
	}
}

// defaultToldSaveEvery is how often what the endpoint was told is saved while it
// changes. The file holds a record per (namespace, cluster), so a save
// costs in proportion to the fleet (1.6 MB and an fsync for 4000
// profiles): once a second was a steady load on the disk during an initial
// sync. Until a save, delivered segments stay on disk.
const defaultToldSaveEvery = 5 * time.Second

// errClosed is returned by Deliver and Resync after Close.
var errClosed = errors.New("webhook sink closed")

// sink is a webhook sink. Deliver, Resync and Close are called from the
// fan-out's worker; the sender goroutine posts what they spool.
type sink struct {
	name     string
	url      string // as configured
	logURL   string // without query or credentials: for logs and errors
	source   string
	timeout  time.Duration
	types    []string // event types the sink wants; empty: all
	log      *slog.Logger
	client   *http.Client
	keys     keySource
	token    *tokenFile // nil: no bearer token
	opts     options
	m        *sinkMetrics
	spool    *spool
	toldPath string
	unlock   func() error

	// callMu serialises Deliver, Resync and Close.
	callMu sync.Mutex
	closed bool

	// toldMu guards told, toldDirty, lastToldSave and toldSaveEvery. told is what the endpoint has been
	// told, or will be once the spool is sent: it is updated when events
	// are spooled, and saved to toldPath at most every toldSaveEvery (see
	// saveToldIfDue): a segment is deleted only once a save covers it, and
	// opening the spool replays every segment on disk, so what was told is
	// never lost, while a burst of small batches costs one save every few
	// seconds rather than one per batch.
	toldMu        sync.Mutex
	told          stream.Records
	toldDirty     bool
	lastToldSave  time.Time
	toldSaveEvery time.Duration

	mu      sync.Mutex
	control stream.Control

	// disabled is set when the endpoint answered 410 Gone.
	disabled atomic.Bool

	wake      chan struct{}
	cancel    context.CancelFunc
	stopping  <-chan struct{} // closed when Close has told the sender to stop
	done      chan struct{}
	closeOnce sync.Once
}

var (
	_ sinks.Sink      = (*sink)(nil)
	_ stream.Attacher = (*sink)(nil)
	_ sinks.Factory   = New
)

// New makes a webhook sink from its configuration and starts its sender,
// which first sends what the spool directory still holds from before.
func New(cfg config.Sink, deps sinks.Deps) (sinks.Sink, error) {
	s, err := newSink(cfg, deps, defaultOptions())
	if err != nil {
		return nil, err
	}
	return s, nil
}

func newSink(cfg config.Sink, deps sinks.Deps, opts options) (*sink, error) {
	w := cfg.Webhook
	if w == nil {
		return nil, fmt.Errorf("webhook sink %s: no webhook section", cfg.Name)
	}
	if cfg.Name == "" {
		return nil, errors.New("webhook sink: no name")
	}
	fail := func(err error) (*sink, error) {
		return nil, fmt.Errorf("webhook sink %s: %w", cfg.Name, err)
	}
	if deps.Source == "" {
		return fail(errors.New("no CloudEvents source"))
	}
	u, err := url.Parse(w.URL)
	if err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http") {
		return fail(errors.New("url must be an absolute https URL"))
	}
	if u.User != nil {
		return fail(errors.New("url must not carry credentials; use bearerTokenFile"))
	}
	log := deps.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("sink", cfg.Name)
	s := &sink{
		name: cfg.Name, url: w.URL, logURL: redactURL(w.URL), source: deps.Source,
		timeout: w.Timeout.Duration, types: slices.Clone(cfg.Filter.EventTypes),
		log: log, opts: opts, wake: make(chan struct{}, 1), done: make(chan struct{}),
		toldSaveEvery: defaultToldSaveEvery,
	}
	if s.timeout <= 0 {
		s.timeout = config.DefaultWebhookTimeout
	}

	switch {
	case w.SecretsFile != "" && w.SecretRef != nil:
		return fail(errors.New("secretsFile and secretRef are mutually exclusive"))
	case w.SecretsFile != "":
		f := &fileSecrets{path: w.SecretsFile, ttl: opts.secretTTL, now: opts.now, log: log}
		// A bad secrets file is a configuration error: say so now rather
		// than on every attempt.
		if _, err := f.keys(context.Background()); err != nil {
			return fail(err)
		}
		s.keys = f
	case w.SecretRef != nil:
		if deps.Kube == nil {
			return fail(errors.New("secretRef needs a hub client"))
		}
		ref := *w.SecretRef
		if ref.Key == "" {
			ref.Key = "secrets"
		}
		s.keys = &refSecrets{kube: deps.Kube, ref: ref, ttl: opts.secretTTL, now: opts.now, log: log}
	default:
		return fail(errors.New("no signing secrets: set secretsFile or secretRef"))
	}
	if w.BearerTokenFile != "" {
		s.token = &tokenFile{path: w.BearerTokenFile, ttl: opts.secretTTL, now: opts.now}
		if _, err := s.token.token(); err != nil {
			return fail(err)
		}
	}
	if s.client, err = newClient(w.CAFile); err != nil {
		return fail(err)
	}

	dir := w.Spool.Directory
	if dir == "" {
		dir = filepath.Join(config.DefaultSpoolRoot, cfg.Name)
	}
	maxBytes := w.Spool.MaxBytes
	if maxBytes <= 0 {
		maxBytes = config.DefaultSpoolMaxBytes
	}
	if err := sinks.EnsureDir(dir); err != nil {
		return fail(fmt.Errorf("spool: %w", err))
	}
	if s.unlock, err = lockDir(dir); err != nil {
		return fail(err)
	}
	ok := false
	defer func() {
		if !ok {
			_ = s.unlock()
		}
	}()
	s.toldPath = filepath.Join(dir, toldFile)
	if s.told, err = loadTold(s.toldPath); err != nil {
		if !errors.Is(err, errToldCorrupt) {
			return fail(err)
		}
		// The endpoint gets the whole state on the first resync anyway;
		// only removals of what it was told before cannot be announced.
		log.Error("cannot decode what the webhook endpoint was told; starting afresh, so removals that happened meanwhile are not announced",
			"file", s.toldPath, "err", err)
		s.told = stream.Records{}
	}
	m, err := newMetrics(deps.Registerer)
	if err != nil {
		return fail(err)
	}
	s.m = m.forSink(cfg.Name)

	// The spool may hold events spooled after told was last saved (a
	// crash between the two writes): fold them in again, so that what
	// told says covers everything the endpoint will have received.
	replayed := false
	now := opts.now()
	s.spool, err = openSpool(dir, maxBytes, log, func(e entry) {
		c, err := changeOf(e)
		if err != nil {
			log.Warn("cannot decode a spooled event", "id", e.ID, "err", err)
			return
		}
		if _, touched := s.told.Apply(c, now); touched {
			replayed = true
		}
	})
	if err != nil {
		return fail(err)
	}
	if replayed {
		if err := saveTold(s.toldPath, s.told); err != nil {
			return fail(err)
		}
	}
	s.lastToldSave = opts.now()
	// The told records now cover the segments delivered before the last
	// run stopped.
	if err := s.spool.removeFinished(s.spool.finishedSegments()); err != nil {
		return fail(err)
	}
	s.spool.changed = func(bytes int64, events int) { s.m.state(bytes, events, s.disabled.Load()) }
	bytes, events := s.spool.size()
	s.m.state(bytes, events, false)
	if events > 0 {
		log.Info("webhook spool holds events from before; sending them first", "events", events, "bytes", bytes)
	}

	ctx, cancel := context.WithCancel(context.Background())
	s.cancel, s.stopping = cancel, ctx.Done()
	go s.run(ctx)
	ok = true
	return s, nil
}

// newClient makes the HTTP client: TLS verified with caFile's roots if
// set, and redirects returned rather than followed. A redirect would send
// the signed event, and the bearer token on the same host, wherever the
// endpoint says; the sink reports it as a failure so the operator fixes the
// URL.
func newClient(caFile string) (*http.Client, error) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("read CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("CA file %s holds no PEM certificate", caFile)
		}
		tr.TLSClientConfig.RootCAs = pool
	}
	return &http.Client{
		Transport: tr,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}, nil
}

// redactURL is the URL without credentials, query or fragment, which may
// hold an API key.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	u.User, u.RawQuery, u.ForceQuery, u.Fragment, u.RawFragment = nil, "", false, "", ""
	return u.String()
}

// Attach implements stream.Attacher: the sink asks for a resync through it
// once its spool has drained after events were dropped.
func (s *sink) Attach(c stream.Control) {
	s.mu.Lock()
	s.control = c
	s.mu.Unlock()
	// A resync may be owed already (a segment lost before a restart).
	s.signal()
}

// Deliver spools the changes' events and returns once they are on disk;
// the sender posts them. It fails only when the spool cannot be written.
// While the sink is disabled (410 Gone) the changes are dropped.
func (s *sink) Deliver(_ context.Context, changes []stream.Change) error {
	s.callMu.Lock()
	defer s.callMu.Unlock()
	if s.closed {
		return fmt.Errorf("webhook %s: %w", s.name, errClosed)
	}
	if s.disabled.Load() {
		s.log.Debug("webhook sink disabled (410 Gone); dropping changes", "changes", len(changes))
		return nil
	}
	return s.enqueue(changes, false)
}

// Resync spools the snapshot's events, then a removal for everything the
// endpoint was told of that the snapshot no longer holds.
func (s *sink) Resync(_ context.Context, snapshot []stream.Change) error {
	s.callMu.Lock()
	defer s.callMu.Unlock()
	if s.closed {
		return fmt.Errorf("webhook %s: %w", s.name, errClosed)
	}
	if s.disabled.Load() {
		return nil
	}
	s.toldMu.Lock()
	_, changes := stream.Plan(s.told, snapshot, s.opts.now())
	s.toldMu.Unlock()
	if len(s.types) > 0 {
		// The snapshot passed the sink's filter; the removals must too.
		removals := slices.DeleteFunc(changes[len(snapshot):], func(c stream.Change) bool {
			return !slices.Contains(s.types, c.Type)
		})
		changes = append(changes[:len(snapshot)], removals...)
	}
	if err := s.enqueue(changes, true); err != nil {
		return err
	}
	s.log.Debug("webhook resync spooled", "events", len(snapshot), "removals", len(changes)-len(snapshot))
	return nil
}

// enqueue encodes the changes and appends their events to the spool,
// then records them as told. A resync's batch is let in even when an
// overflow episode is under way (see spool.write).
func (s *sink) enqueue(changes []stream.Change, resync bool) error {
	now := s.opts.now()
	entries := make([]entry, 0, len(changes))
	spooled := make([]stream.Change, 0, len(changes))
	for _, c := range changes {
		body, err := events.Encode(c, s.source)
		if err != nil {
			// Retrying cannot make it encodable.
			s.log.Warn("cannot encode a change as an event; skipping it",
				"type", c.Type, "namespace", c.Namespace, "cluster", c.Cluster, "err", err)
			continue
		}
		entries = append(entries, entry{
			ID: events.ID(c), Type: c.Type, Namespace: c.Namespace, Cluster: c.Cluster,
			Spooled: now.UnixNano(), Body: body,
		})
		spooled = append(spooled, c)
	}
	if len(entries) == 0 {
		if resync {
			// An empty current state stands for whatever was dropped.
			s.spool.resynced()
		}
		return nil
	}
	app, dropped, first, err := s.spool.write(entries, resync)
	if err != nil {
		return fmt.Errorf("webhook %s: spool %d events: %w", s.name, len(entries), err)
	}
	if dropped {
		s.m.drop(len(entries))
		if first {
			bytes, events := s.spool.size()
			s.log.Error("webhook spool full: dropping events until the endpoint has caught up; it will then be resynced from the current state",
				"maxBytes", s.spool.max, "spoolBytes", bytes, "spoolEvents", events, "dropped", len(entries))
		}
		// With an empty spool the episode can end at once.
		s.signal()
		return nil
	}
	s.toldMu.Lock()
	for _, c := range spooled {
		if _, ok := s.told.Apply(c, now); ok {
			s.toldDirty = true
		}
	}
	s.toldMu.Unlock()
	s.spool.publish(app, resync)
	s.signal()
	return nil
}

// saveToldIfDue saves what the endpoint was told when it changed and the
// last save is toldSaveEvery old (or force is set), then deletes the
// segments delivered before the save, which it covers.
func (s *sink) saveToldIfDue(force bool) error {
	if err := s.spool.saveCursor(false); err != nil {
		return err
	}
	s.toldMu.Lock()
	if !force && s.opts.now().Sub(s.lastToldSave) < s.toldSaveEvery {
		s.toldMu.Unlock()
		return nil
	}
	finished := s.spool.finishedSegments()
	var err error
	if s.toldDirty {
		if err = saveTold(s.toldPath, s.told); err == nil {
			s.toldDirty = false
		}
	}
	s.lastToldSave = s.opts.now()
	s.toldMu.Unlock()
	if err != nil {
		return err
	}
	return s.spool.removeFinished(finished)
}

// signal wakes the sender.
func (s *sink) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Close stops the sender, letting a request under way finish (it is
// bounded by the timeout), and leaves the spool on disk for the next sink
// with the same directory.
func (s *sink) Close() error {
	var err error
	s.closeOnce.Do(func() {
		s.callMu.Lock()
		s.closed = true
		s.callMu.Unlock()
		s.cancel()
		<-s.done
		if serr := errors.Join(s.spool.saveCursor(true), s.saveToldIfDue(true)); serr != nil {
			err = fmt.Errorf("webhook %s: %w", s.name, serr)
		}
		s.spool.close()
		s.client.CloseIdleConnections()
		s.m.forget()
		if uerr := s.unlock(); uerr != nil {
			err = errors.Join(err, fmt.Errorf("webhook %s: unlock spool: %w", s.name, uerr))
		}
	})
	return err
}

// storedRecord is a told record as saved: with the profile's
// resourceVersion, so that a removal announced after a restart shares its
// id with the deletion it stands for.
type storedRecord struct {
	stream.Record
	ProfileRV string `json:"profileResourceVersion,omitempty"`
}

type toldState struct {
	Records []storedRecord `json:"records"`
}

var errToldCorrupt = errors.New("told records corrupt")

func loadTold(path string) (stream.Records, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return stream.Records{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read told records: %w", err)
	}
	var st toldState
	if err := json.Unmarshal(data, &st); err != nil {
		return nil, fmt.Errorf("%w: %w", errToldCorrupt, err)
	}
	rs := make(stream.Records, len(st.Records))
	for _, r := range st.Records {
		rec := r.Record
		rec.ProfileResourceVersion = r.ProfileRV
		rs[stream.Key{Namespace: rec.Namespace, Cluster: rec.Cluster}] = &rec
	}
	return rs, nil
}

func saveTold(path string, rs stream.Records) error {
	st := toldState{Records: make([]storedRecord, 0, len(rs))}
	for _, r := range rs {
		st.Records = append(st.Records, storedRecord{Record: *r, ProfileRV: r.ProfileResourceVersion})
	}
	slices.SortFunc(st.Records, func(a, b storedRecord) int {
		if c := strings.Compare(a.Namespace, b.Namespace); c != 0 {
			return c
		}
		return strings.Compare(a.Cluster, b.Cluster)
	})
	data, err := json.Marshal(st)
	if err != nil {
		return fmt.Errorf("encode told records: %w", err)
	}
	if err := sinks.WriteFileDurable(path, data); err != nil {
		return fmt.Errorf("save told records: %w", err)
	}
	return nil
}

// changeOf rebuilds the change of a spooled event, as far as told records
// need it.
func changeOf(e entry) (stream.Change, error) {
	ev, err := events.Decode(e.Body)
	if err != nil {
		return stream.Change{}, err
	}
	t, err := time.Parse(time.RFC3339Nano, ev.Time)
	if err != nil {
		return stream.Change{}, fmt.Errorf("event %s: time: %w", ev.ID, err)
	}
	return stream.Change{
		Type: ev.Type, Namespace: ev.Data.Namespace, Cluster: ev.Data.Cluster, Name: ev.Data.Name,
		ResourceVersion: ev.Data.ResourceVersion, Time: t,
		Profile: ev.Data.Profile, Credential: ev.Data.Credential,
	}, nil
}
