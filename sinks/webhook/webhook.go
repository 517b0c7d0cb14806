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

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"

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

// defaultOptions is the webhook's delivery policy as hubsync runs it;
// config holds its values.
func defaultOptions() options {
	return options{
		retryBase:     config.DefaultWebhookRetryBase,
		retryMax:      config.DefaultWebhookRetryMax,
		retryAfterMax: config.DefaultWebhookRetryAfterMax,
		secretTTL:     config.DefaultWebhookSecretTTL,
		now:           time.Now,
		jitter:        rand.Int64N,
	}
}

// checkDefaulted refuses a webhook section whose defaults were not filled
// (a loaded configuration has them): the sink has none of its own.
func checkDefaulted(w *config.WebhookSink) error {
	var missing []string
	if w.Timeout.Duration <= 0 {
		missing = append(missing, "timeout")
	}
	if w.Spool.Directory == "" {
		missing = append(missing, "spool.directory")
	}
	if w.Spool.MaxBytes <= 0 {
		missing = append(missing, "spool.maxBytes")
	}
	if w.Concurrency <= 0 {
		missing = append(missing, "concurrency")
	}
	if w.SecretRef != nil && w.SecretRef.Key == "" {
		missing = append(missing, "secretRef.key")
	}
	if len(missing) > 0 {
		return fmt.Errorf("%s not set (the configuration's defaults fill them)", strings.Join(missing, ", "))
	}
	return nil
}

// windowPerRequest is the events the sender looks ahead at, per request
// it may have in flight: room to skip the later events of keys that are
// busy and find other keys to send, bounded so that the events delivered
// out of order, which the cursor lists, stay few.
const windowPerRequest = 16

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

	// concurrency bounds the attempts in flight; window bounds the events
	// the sender looks ahead at, from the first one not delivered yet.
	concurrency, window int

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
	// health is the record of the sender's attempts, which the sink's
	// status is computed from (see Report).
	health *health

	wake      chan struct{}
	cancel    context.CancelFunc
	stopping  <-chan struct{} // closed when Close has told the sender to stop
	done      chan struct{}
	closeOnce sync.Once
}

var (
	_ sinks.Sink      = (*sink)(nil)
	_ stream.Attacher = (*sink)(nil)
	_ stream.Reporter = (*sink)(nil)
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
		concurrency: w.Concurrency, window: windowPerRequest * w.Concurrency,
		log: log, opts: opts, wake: make(chan struct{}, 1), done: make(chan struct{}),
		toldSaveEvery: defaultToldSaveEvery, health: &health{failingAfter: w.FailingAfter.Duration},
	}
	if err := checkDefaulted(w); err != nil {
		return fail(err)
	}
	if err := s.setAuth(w, deps.Kube); err != nil {
		return fail(err)
	}
	if s.client, err = newClient(w.CAFile, w.Concurrency); err != nil {
		return fail(err)
	}
	if err := s.open(w.Spool, deps.Registerer); err != nil {
		return fail(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel, s.stopping = cancel, ctx.Done()
	go s.run(ctx)
	return s, nil
}

// setAuth sets where the sink's signing secrets and bearer token come
// from. A secrets or token file that cannot be read is a configuration
// error: it is reported now rather than on every attempt.
func (s *sink) setAuth(w *config.WebhookSink, kube kubernetes.Interface) error {
	opts := s.opts
	switch {
	case w.SecretsFile != "" && w.SecretRef != nil:
		return errors.New("secretsFile and secretRef are mutually exclusive")
	case w.SecretsFile != "":
		f := &fileSecrets{path: w.SecretsFile, ttl: opts.secretTTL, now: opts.now, log: s.log}
		if _, err := f.keys(context.Background()); err != nil {
			return err
		}
		s.keys = f
	case w.SecretRef != nil:
		if kube == nil {
			return errors.New("secretRef needs a hub client")
		}
		s.keys = &refSecrets{kube: kube, ref: *w.SecretRef, ttl: opts.secretTTL, now: opts.now, log: s.log}
	default:
		return errors.New("no signing secrets: set secretsFile or secretRef")
	}
	if w.BearerTokenFile != "" {
		s.token = &tokenFile{path: w.BearerTokenFile, ttl: opts.secretTTL, now: opts.now}
		if _, err := s.token.token(); err != nil {
			return err
		}
	}
	return nil
}

// open locks the spool directory and opens the spool in it, with what the
// endpoint was told, and the sink's metrics. On error the directory is
// unlocked.
func (s *sink) open(sp config.WebhookSpool, reg prometheus.Registerer) (err error) {
	dir, maxBytes := sp.Directory, sp.MaxBytes
	if err := sinks.EnsureDir(dir); err != nil {
		return fmt.Errorf("spool: %w", err)
	}
	if s.unlock, err = lockDir(dir); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = s.unlock()
		}
	}()
	s.toldPath = filepath.Join(dir, toldFile)
	if s.told, err = loadTold(s.toldPath); err != nil {
		if !errors.Is(err, errToldCorrupt) {
			return err
		}
		// The endpoint gets the whole state on the first resync anyway;
		// only removals of what it was told before cannot be announced.
		s.log.Error("cannot decode what the webhook endpoint was told; starting afresh, so removals that happened meanwhile are not announced",
			"file", s.toldPath, "err", err)
		s.told = stream.Records{}
	}
	m, err := newMetrics(reg)
	if err != nil {
		return err
	}
	s.m = m.forSink(s.name)
	if err := s.openSpool(dir, maxBytes); err != nil {
		return err
	}
	s.spool.changed = func(bytes int64, events int) { s.m.state(bytes, events, s.disabled.Load()) }
	bytes, events := s.spool.size()
	s.m.state(bytes, events, false)
	if events > 0 {
		s.log.Info("webhook spool holds events from before; sending them first", "events", events, "bytes", bytes)
	}
	return nil
}

// openSpool opens the spool in dir. The spool may hold events spooled
// after told was last saved (a crash between the two writes): they are
// folded in again, so that what told says covers everything the endpoint
// will have received. Then the segments delivered before the last run
// stopped, which told now covers, are removed.
func (s *sink) openSpool(dir string, maxBytes int64) error {
	replayed := false
	now := s.opts.now()
	sp, err := openSpool(dir, maxBytes, s.log, func(e entry) {
		c, err := changeOf(e)
		if err != nil {
			s.log.Warn("cannot decode a spooled event", "id", e.ID, "err", err)
			return
		}
		if _, touched := s.told.Apply(c, now); touched {
			replayed = true
		}
	})
	if err != nil {
		return err
	}
	s.spool = sp
	if replayed {
		if err := saveTold(s.toldPath, s.told); err != nil {
			return err
		}
	}
	s.lastToldSave = s.opts.now()
	return s.spool.removeFinished(s.spool.finishedSegments())
}

// newClient makes the HTTP client: TLS verified with caFile's roots if
// set, and redirects returned rather than followed. A redirect would send
// the signed event, and the bearer token on the same host, wherever the
// endpoint says; the sink reports it as a failure so the operator fixes the
// URL. It keeps a connection per request in flight (conns) open between
// requests: the default two would make every further request pay a new
// TCP and TLS handshake, several round trips to a far endpoint.
func newClient(caFile string, conns int) (*http.Client, error) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = conns
	tr.MaxIdleConns = max(tr.MaxIdleConns, conns)
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

// Report implements stream.Reporter. Deliver only spools, so the fan-out
// worker sees a sink whose endpoint is down as healthy with nothing
// queued: the sink's status comes from where its backlog is, the spool,
// and from the sender's record of attempts.
func (s *sink) Report() stream.Report {
	r := s.health.report(s.opts.now())
	_, r.Backlog = s.spool.size()
	r.Oldest = s.spool.oldest()
	return r
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
