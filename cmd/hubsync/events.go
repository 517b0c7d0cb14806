package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hubsync/hubsync/bus"
	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/events"
	"github.com/hubsync/hubsync/stream"
)

// hubsync events and hubsync state read the event bus the way any consumer
// would: the events stream through a JetStream ordered consumer, the
// current access records from the key-value bucket. They need no hub access.

// busTimeout bounds connecting to NATS and each JetStream API request.
const busTimeout = 5 * time.Second

// busFlags are the connection flags both commands share.
type busFlags struct {
	configFile string
	server     string
	creds      string
	nkey       string
	tokenFile  string
	tlsCA      string
	tlsCert    string
	tlsKey     string
}

func (b *busFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&b.configFile, "config", "", "hubsync configuration file: its bus section gives the server, credentials and the stream and bucket names")
	fs.StringVar(&b.server, "server", "", "NATS URL (default: the config's first bus.urls entry, else nats://<bus.embedded.listen>, i.e. nats://127.0.0.1:4222)")
	fs.StringVar(&b.creds, "creds", "", "NATS user credentials file (default: the config's bus.credsFile)")
	fs.StringVar(&b.nkey, "nkey", "", "NATS NKey user seed file (default: the config's bus.nkeySeedFile)")
	fs.StringVar(&b.tokenFile, "token-file", "", "file holding the consumer token of hubsync's embedded NATS (default: the config's bus.embedded.authTokenFile)")
	fs.StringVar(&b.tlsCA, "tls-ca", "", "CA bundle to verify the NATS server (default: the config's bus.tls.caFile)")
	fs.StringVar(&b.tlsCert, "tls-cert", "", "client certificate for NATS (default: the config's bus.tls.certFile)")
	fs.StringVar(&b.tlsKey, "tls-key", "", "client key for NATS (default: the config's bus.tls.keyFile)")
}

// busTarget is where to connect and what to read there.
type busTarget struct {
	url                    string
	opts                   []nats.Option
	prefix, stream, bucket string
}

// resolve fills in what the flags leave unset from the configuration file,
// or from the defaults when there is none.
func (b *busFlags) resolve() (*busTarget, error) {
	cfg := config.Default()
	if b.configFile != "" {
		var err error
		if cfg, err = config.Load(b.configFile); err != nil {
			return nil, fmt.Errorf("%s: %w", b.configFile, err)
		}
	}
	bc := cfg.Bus
	t := &busTarget{url: b.server, prefix: bc.SubjectPrefix, stream: bc.Stream.Name, bucket: bc.KVBucket}
	if t.url == "" {
		if len(bc.URLs) > 0 {
			t.url = bc.URLs[0]
		} else {
			t.url = "nats://" + loopback(bc.Embedded.Listen)
		}
	}
	creds, nkey := cmp.Or(b.creds, bc.CredsFile), cmp.Or(b.nkey, bc.NKeySeedFile)
	// The configuration never has both an embedded token and bus.urls.
	tokenFile := cmp.Or(b.tokenFile, bc.Embedded.AuthTokenFile)
	tlsCA, tlsCert, tlsKey := cmp.Or(b.tlsCA, bc.TLS.CAFile), cmp.Or(b.tlsCert, bc.TLS.CertFile), cmp.Or(b.tlsKey, bc.TLS.KeyFile)
	switch {
	case creds != "" && nkey != "":
		return nil, fmt.Errorf("a credentials file (%s) and an NKey seed file (%s) are mutually exclusive", creds, nkey)
	case tokenFile != "" && (creds != "" || nkey != ""):
		return nil, fmt.Errorf("a token file (%s) is for hubsync's embedded NATS, a credentials or NKey seed file for an external one: give one", tokenFile)
	case (tlsCert == "") != (tlsKey == ""):
		return nil, errors.New("a TLS client certificate and key go together (--tls-cert and --tls-key)")
	}
	t.opts = []nats.Option{nats.Name("hubsync-cli/" + buildVersion()), nats.Timeout(busTimeout)}
	if creds != "" {
		t.opts = append(t.opts, nats.UserCredentials(creds))
	}
	if nkey != "" {
		opt, err := nats.NkeyOptionFromSeed(nkey)
		if err != nil {
			return nil, fmt.Errorf("NKey seed %s: %w", nkey, err)
		}
		t.opts = append(t.opts, opt)
	}
	if tokenFile != "" {
		tok, err := readTokenFile(tokenFile)
		if err != nil {
			return nil, err
		}
		t.opts = append(t.opts, nats.Token(tok))
	}
	if tlsCA != "" {
		t.opts = append(t.opts, nats.RootCAs(tlsCA))
	}
	if tlsCert != "" {
		t.opts = append(t.opts, nats.ClientCert(tlsCert, tlsKey))
	}
	return t, nil
}

// loopback turns a listen address into one to dial: an unspecified host
// (":4222", "0.0.0.0:4222") is reached on loopback.
func loopback(listen string) string {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return listen
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port)
}

// readTokenFile reads a token, trimmed; its errors never hold the token.
func readTokenFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("token file: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("token file %s is empty", path)
	}
	return tok, nil
}

// redacted is the URL without its user information, fit for an error
// message: a NATS URL may carry a token as its user name
// (nats://TOKEN@host), which url.URL.Redacted would show. Like nats.go it
// takes a comma-separated list, and URLs without a scheme.
func redacted(u string) string {
	urls := strings.Split(u, ",")
	for i, s := range urls {
		s = strings.TrimSpace(s)
		if strings.Contains(s, "://") {
			urls[i] = config.RedactURL(s)
		} else {
			urls[i] = strings.TrimPrefix(config.RedactURL("nats://"+s), "nats://")
		}
	}
	return strings.Join(urls, ",")
}

const notRunning = "is hubsync running with the bus enabled?"

// connect opens the connection and the JetStream context.
func (t *busTarget) connect() (*nats.Conn, jetstream.JetStream, error) {
	nc, err := nats.Connect(t.url, t.opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("cannot reach NATS at %s: %w (%s otherwise set --server or --config)", redacted(t.url), err, notRunning)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("JetStream on %s: %w", redacted(t.url), err)
	}
	return nc, js, nil
}

// jetStreamError explains a failed lookup of the stream or bucket.
func (t *busTarget) jetStreamError(what, name string, err error) error {
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound), errors.Is(err, jetstream.ErrBucketNotFound):
		return fmt.Errorf("%s %q not found on %s: %s", what, name, redacted(t.url), notRunning)
	case errors.Is(err, jetstream.ErrJetStreamNotEnabled), errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount),
		errors.Is(err, nats.ErrNoResponders):
		return fmt.Errorf("JetStream is not enabled on %s: %s", redacted(t.url), notRunning)
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout):
		return fmt.Errorf("%s %q on %s: no answer within %v: %s", what, name, redacted(t.url), busTimeout, notRunning)
	default:
		return fmt.Errorf("%s %q on %s: %w", what, name, redacted(t.url), err)
	}
}

// eventTypes are the v1 event types.
var eventTypes = []string{
	stream.ProfileCreated, stream.ProfileUpdated, stream.ProfileDeleted,
	stream.CredentialSynced, stream.CredentialRotated, stream.CredentialRemoved,
	stream.AccessProviderUpdated,
}

// parseType reads --type: a full type (io.hubsync.profile.updated), a short
// one (profile.updated) or a kind (profile, credential, accessprovider). It
// returns the subject kind and the full type ("" for a whole kind).
func parseType(s string) (kind, full string, err error) {
	if s == "" {
		return "", "", nil
	}
	short := strings.TrimPrefix(s, events.TypePrefix)
	var valid []string
	for _, t := range eventTypes {
		k, err := events.Kind(t)
		if err != nil {
			return "", "", err
		}
		switch {
		case t == events.TypePrefix+short:
			return k, t, nil
		case k == short:
			return k, "", nil
		}
		valid = append(valid, strings.TrimPrefix(t, events.TypePrefix))
	}
	return "", "", fmt.Errorf("unknown --type %q: want a kind (profile, credential, accessprovider) or a type (%s), with or without %q",
		s, strings.Join(valid, ", "), events.TypePrefix)
}

// parseSince reads --since: 0 (everything kept), a duration back from now,
// or an RFC 3339 time. A zero time means from the beginning of the stream.
func parseSince(s string, now time.Time) (time.Time, error) {
	if s == "0" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(s); err == nil {
		if d < 0 {
			return time.Time{}, fmt.Errorf("--since %s: must not be negative", s)
		}
		return now.Add(-d), nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("--since %q: want 0, a duration such as 10m, or an RFC 3339 time", s)
	}
	return t, nil
}

// filterSubject is the stream subject matching a namespace, cluster and
// kind, each a wildcard when empty.
func filterSubject(prefix, namespace, cluster, kind string) string {
	token := func(s string) string {
		if s == "" {
			return "*"
		}
		return events.EscapeToken(s)
	}
	return strings.Join([]string{prefix, token(namespace), token(cluster), cmp.Or(kind, "*")}, ".")
}

type eventsOptions struct {
	bus       busFlags
	since     string
	all       bool
	namespace string
	cluster   string
	typ       string
	output    string
	follow    bool
	now       func() time.Time
}

func eventsCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o := &eventsOptions{now: time.Now}
	fs := flag.NewFlagSet("events", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o.bus.register(fs)
	fs.StringVar(&o.since, "since", "", "replay from: 0 for everything the stream keeps, a duration back from now (10m), or an RFC 3339 time; default: new events only")
	fs.BoolVar(&o.all, "all", false, "replay everything the stream keeps (same as --since 0)")
	fs.StringVar(&o.namespace, "namespace", "", "only events of this consumer namespace")
	fs.StringVar(&o.cluster, "cluster", "", "only events of this cluster")
	fs.StringVar(&o.typ, "type", "", "only this type (profile.updated or io.hubsync.profile.updated) or kind (profile, credential, accessprovider)")
	fs.StringVar(&o.output, "o", "text", "output: text (one line per event) or json (the CloudEvent, one per line)")
	fs.StringVar(&o.output, "output", "text", "same as -o")
	fs.BoolVar(&o.follow, "follow", true, "keep printing new events; false exits once the replay is done")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: hubsync events [--since DURATION|RFC3339|0 | --all] [--namespace NS] [--cluster NAME] [--type TYPE] [-o text|json] [--follow=false] [connection flags]")
		fmt.Fprintln(stderr, "\nPrints hubsync's cluster-access events from the NATS JetStream stream (see docs/events.md).")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	problem := ""
	kind, full, err := parseType(o.typ)
	switch {
	case fs.NArg() != 0:
		problem = fmt.Sprintf("unexpected arguments %v", fs.Args())
	case err != nil:
		problem = err.Error()
	case o.output != "text" && o.output != "json":
		problem = fmt.Sprintf("-o %q: want text or json", o.output)
	case o.all && o.since != "" && o.since != "0":
		problem = "--all and --since are mutually exclusive"
	case !o.follow && !o.all && o.since == "":
		problem = "--follow=false needs --since or --all: new events only, without following, is nothing"
	}
	if problem == "" && o.since != "" {
		if _, err := parseSince(o.since, o.now()); err != nil {
			problem = err.Error()
		}
	}
	if problem != "" {
		fmt.Fprintln(stderr, "hubsync events:", problem)
		fs.Usage()
		return errUsage
	}
	return o.run(ctx, kind, full, stdout, stderr)
}

// consumerConfig is the ordered consumer for the options: new events only
// by default, everything with --all or --since 0, else from a start time.
func (o *eventsOptions) consumerConfig(filter string) jetstream.OrderedConsumerConfig {
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}, DeliverPolicy: jetstream.DeliverNewPolicy}
	if o.all {
		cfg.DeliverPolicy = jetstream.DeliverAllPolicy
		return cfg
	}
	if o.since == "" {
		return cfg
	}
	start, _ := parseSince(o.since, o.now()) // checked by the caller
	if start.IsZero() {
		cfg.DeliverPolicy = jetstream.DeliverAllPolicy
	} else {
		cfg.DeliverPolicy = jetstream.DeliverByStartTimePolicy
		cfg.OptStartTime = &start
	}
	return cfg
}

func (o *eventsOptions) run(ctx context.Context, kind, fullType string, stdout, stderr io.Writer) error {
	t, err := o.bus.resolve()
	if err != nil {
		return err
	}
	nc, js, err := t.connect()
	if err != nil {
		return err
	}
	defer nc.Close()
	filter := filterSubject(t.prefix, o.namespace, o.cluster, kind)
	lookup, cancel := context.WithTimeout(ctx, busTimeout)
	defer cancel()
	stream, err := js.Stream(lookup, t.stream)
	if err != nil {
		return t.jetStreamError("stream", t.stream, err)
	}
	cons, err := stream.OrderedConsumer(lookup, o.consumerConfig(filter))
	if err != nil {
		return fmt.Errorf("consume %s from stream %q: %w", filter, t.stream, err)
	}
	// Without --follow, the replay is over when the consumer has delivered
	// every message it had pending when it was created, or at once when it
	// had none.
	if !o.follow && cons.CachedInfo().NumPending == 0 {
		return nil
	}
	it, err := cons.Messages()
	if err != nil {
		return fmt.Errorf("consume %s from stream %q: %w", filter, t.stream, err)
	}
	defer it.Stop()
	for {
		msg, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			if ctx.Err() != nil {
				return nil // interrupted: a normal end when following
			}
			return fmt.Errorf("read stream %q: %w", t.stream, err)
		}
		if err := o.print(msg.Data(), msg.Subject(), fullType, stdout, stderr); err != nil {
			return err
		}
		if !o.follow {
			if meta, err := msg.Metadata(); err == nil && meta.NumPending == 0 {
				return nil
			}
		}
	}
}

// print writes one event; a message that is not an event is reported on
// stderr and skipped, so one bad publisher cannot stop a tail.
func (o *eventsOptions) print(data []byte, subject, fullType string, stdout, stderr io.Writer) error {
	var ev events.Event
	if err := json.Unmarshal(data, &ev); err != nil {
		fmt.Fprintf(stderr, "hubsync events: skipping a message on %s: not a JSON event: %v\n", subject, err)
		return nil
	}
	if fullType != "" && ev.Type != fullType {
		return nil
	}
	var line []byte
	if o.output == "json" {
		var b bytes.Buffer
		if err := json.Compact(&b, data); err != nil {
			return err
		}
		line = b.Bytes()
	} else {
		line = []byte(formatEvent(&ev))
	}
	_, err := stdout.Write(append(line, '\n'))
	return err
}

// formatEvent is the text line of one event:
//
//	2026-11-21T04:00:00Z profile.created        team-ml/eu-prod-01  v1.35.4 healthy=True providers=open-cluster-management
//	2026-11-21T04:00:00Z credential.rotated     team-ml/eu-prod-01  secret=eu-prod-01-kueue fp=sha256:… expires=…
func formatEvent(ev *events.Event) string {
	when := "-"
	if t, err := time.Parse(time.RFC3339Nano, ev.Time); err == nil {
		when = t.UTC().Truncate(time.Second).Format(time.RFC3339)
	}
	where := ev.Subject
	if ev.Data.Namespace != "" || ev.Data.Cluster != "" {
		where = ev.Data.Namespace + "/" + ev.Data.Cluster
	}
	var details []string
	if p := ev.Data.Profile; p != nil {
		if p.KubernetesVersion != "" {
			details = append(details, p.KubernetesVersion)
		}
		if p.Healthy != "" {
			details = append(details, "healthy="+p.Healthy)
		}
		if len(p.AccessProviders) > 0 {
			details = append(details, "providers="+providerNames(p.AccessProviders))
		}
	}
	if c := ev.Data.Credential; c != nil {
		details = append(details, "secret="+c.Secret)
		if c.Fingerprint != "" {
			details = append(details, "fp="+c.Fingerprint)
		}
		if c.Expiration != nil {
			details = append(details, "expires="+c.Expiration.UTC().Format(time.RFC3339))
		}
	}
	return strings.TrimRight(fmt.Sprintf("%s %-22s %s  %s", when, strings.TrimPrefix(ev.Type, events.TypePrefix), where, strings.Join(details, " ")), " ")
}

func providerNames(ps []stream.AccessProviderSummary) string {
	names := make([]string, len(ps))
	for i, p := range ps {
		names[i] = p.Name
	}
	return strings.Join(names, ",")
}

type stateOptions struct {
	bus       busFlags
	namespace string
	output    string
}

func stateCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o := &stateOptions{}
	fs := flag.NewFlagSet("state", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o.bus.register(fs)
	fs.StringVar(&o.namespace, "namespace", "", "only the records of this consumer namespace")
	fs.StringVar(&o.output, "o", "table", "output: table, or json (an array of the records)")
	fs.StringVar(&o.output, "output", "table", "same as -o")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: hubsync state [--namespace NS] [-o table|json] [connection flags]")
		fmt.Fprintln(stderr, "\nPrints the current access records from the NATS key-value bucket (see docs/events.md).")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	problem := ""
	switch {
	case fs.NArg() != 0:
		problem = fmt.Sprintf("unexpected arguments %v", fs.Args())
	case o.output != "table" && o.output != "json":
		problem = fmt.Sprintf("-o %q: want table or json", o.output)
	}
	if problem != "" {
		fmt.Fprintln(stderr, "hubsync state:", problem)
		fs.Usage()
		return errUsage
	}
	return o.run(ctx, stdout, stderr)
}

// accessRecord is an access record as the table needs it; raw is the value as
// stored, for -o json.
type accessRecord struct {
	bus.Record
	raw json.RawMessage
}

func (o *stateOptions) run(ctx context.Context, stdout, stderr io.Writer) error {
	t, err := o.bus.resolve()
	if err != nil {
		return err
	}
	nc, js, err := t.connect()
	if err != nil {
		return err
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(ctx, busTimeout)
	defer cancel()
	kv, err := js.KeyValue(ctx, t.bucket)
	if err != nil {
		return t.jetStreamError("key-value bucket", t.bucket, err)
	}
	keys := "*.*"
	if o.namespace != "" {
		// KVKey escapes each part on its own: the namespace's part of the
		// key is what precedes the dot of KVKey(namespace, "").
		keys = strings.TrimSuffix(events.KVKey(o.namespace, ""), ".") + ".*"
	}
	records, err := readRecords(ctx, kv, keys, stderr)
	if err != nil {
		return fmt.Errorf("read bucket %q: %w", t.bucket, err)
	}
	slices.SortFunc(records, func(a, b accessRecord) int {
		return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Cluster, b.Cluster))
	})
	if o.output == "json" {
		raws := make([]json.RawMessage, len(records))
		for i, r := range records {
			raws[i] = r.raw
		}
		out, err := json.MarshalIndent(raws, "", "  ")
		if err != nil {
			return err
		}
		_, err = stdout.Write(append(out, '\n'))
		return err
	}
	return writeStateTable(stdout, records)
}

// readRecords reads the current value of every key matching keys: a watch
// delivers them all, then a nil entry.
func readRecords(ctx context.Context, kv jetstream.KeyValue, keys string, stderr io.Writer) ([]accessRecord, error) {
	w, err := kv.Watch(ctx, keys, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, err
	}
	defer func() { _ = w.Stop() }()
	var records []accessRecord
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				return nil, errors.New("watch closed")
			}
			if e == nil {
				return records, nil
			}
			var r accessRecord
			if err := json.Unmarshal(e.Value(), &r); err != nil {
				fmt.Fprintf(stderr, "hubsync state: skipping key %s: not a JSON record: %v\n", e.Key(), err)
				continue
			}
			r.raw = json.RawMessage(slices.Clone(e.Value()))
			records = append(records, r)
		}
	}
}

func writeStateTable(w io.Writer, records []accessRecord) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "NAMESPACE\tCLUSTER\tK8S\tHEALTHY\tPROVIDERS\tCREDENTIALS")
	for _, r := range records {
		k8s, healthy, providers := "-", "-", "-"
		if p := r.Profile; p != nil {
			k8s, healthy = cmp.Or(p.KubernetesVersion, "-"), cmp.Or(p.Healthy, "-")
			if len(p.AccessProviders) > 0 {
				providers = providerNames(p.AccessProviders)
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.Namespace, r.Cluster, k8s, healthy, providers, credentialsCell(r.Credentials))
	}
	return tw.Flush()
}

// credentialsCell is the count of credentials and the nearest expiry.
func credentialsCell(cs []stream.CredentialSummary) string {
	var next time.Time
	for _, c := range cs {
		if c.Expiration != nil && (next.IsZero() || c.Expiration.Before(next)) {
			next = *c.Expiration
		}
	}
	if next.IsZero() {
		return fmt.Sprint(len(cs))
	}
	return fmt.Sprintf("%d, next expiry %s", len(cs), next.UTC().Format(time.RFC3339))
}
