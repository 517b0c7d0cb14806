package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

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
	fs.StringVar(&b.server, "server", "", "NATS URL, or a comma-separated list (default: the config's bus.urls, else nats://<bus.embedded.listen>, i.e. nats://127.0.0.1:4222)")
	fs.StringVar(&b.creds, "creds", "", "NATS user credentials file (default: the config's bus.credsFile)")
	fs.StringVar(&b.nkey, "nkey", "", "NATS NKey user seed file (default: the config's bus.nkeySeedFile)")
	fs.StringVar(&b.tokenFile, "token-file", "", "file holding the consumer token of hubsync's embedded NATS (default: the config's bus.embedded.authTokenFile)")
	fs.StringVar(&b.tlsCA, "tls-ca", "", "CA bundle to verify the NATS server (default: the config's bus.tls.caFile)")
	fs.StringVar(&b.tlsCert, "tls-cert", "", "client certificate for NATS (default: the config's bus.tls.certFile)")
	fs.StringVar(&b.tlsKey, "tls-key", "", "client key for NATS (default: the config's bus.tls.keyFile)")
}

// busConfig is the bus section of the configuration file (or the
// defaults) with the flags applied over it. The file must be valid, but
// the files it names need not be readable here (a laptop has no gateway
// key): the bus's own are opened when it is dialed, and say so then.
func (b *busFlags) busConfig() (config.Bus, error) {
	cfg := config.Default()
	if b.configFile != "" {
		data, err := os.ReadFile(b.configFile)
		if err != nil {
			return config.Bus{}, err
		}
		if cfg, err = config.Decode(data); err != nil {
			return config.Bus{}, fmt.Errorf("%s: %w", b.configFile, err)
		}
	}
	bc := cfg.Bus
	if b.server != "" {
		// Like nats.go, --server takes a comma-separated list.
		bc.URLs = strings.Split(b.server, ",")
	}
	for _, f := range []struct{ flag, field *string }{
		{&b.creds, &bc.CredsFile}, {&b.nkey, &bc.NKeySeedFile}, {&b.tokenFile, &bc.Embedded.AuthTokenFile},
		{&b.tlsCA, &bc.TLS.CAFile}, {&b.tlsCert, &bc.TLS.CertFile}, {&b.tlsKey, &bc.TLS.KeyFile},
	} {
		*f.field = cmp.Or(*f.flag, *f.field)
	}
	return bc, nil
}

// dial connects to the bus as a consumer, with the daemon's connection
// options (credentials, TLS, bus.requireTLS).
func (b *busFlags) dial() (*bus.Client, config.Bus, error) {
	bc, err := b.busConfig()
	if err != nil {
		return nil, bc, err
	}
	c, err := bus.Dial(bc, "hubsync-cli/"+buildVersion(), busTimeout)
	return c, bc, err
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
	fs.StringVar(&o.typ, "type", "", "only this type (profile.updated or io.hubsync.profile.updated) or kind (profile, credential, accessprovider, tunnel)")
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
	kind, full, err := events.ParseType(o.typ)
	switch {
	case fs.NArg() != 0:
		problem = fmt.Sprintf("unexpected arguments %v", fs.Args())
	case err != nil:
		problem = "--type: " + err.Error()
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

// query is the events the options select.
func (o *eventsOptions) query(kind string) bus.EventQuery {
	q := bus.EventQuery{Namespace: o.namespace, Cluster: o.cluster, Kind: kind, Follow: o.follow, All: o.all}
	if o.since != "" {
		start, _ := parseSince(o.since, o.now()) // checked by the caller
		q.All, q.Start = start.IsZero(), start
	}
	return q
}

func (o *eventsOptions) run(ctx context.Context, kind, fullType string, stdout, stderr io.Writer) error {
	c, bc, err := o.bus.dial()
	if err != nil {
		return err
	}
	defer c.Close()
	return c.Events(ctx, bc, o.query(kind), func(subject string, data []byte) error {
		return o.print(data, subject, fullType, stdout, stderr)
	})
}

// print writes one event; a message that is not an event is reported on
// stderr and skipped, so one bad publisher cannot stop a tail.
func (o *eventsOptions) print(data []byte, subject, fullType string, stdout, stderr io.Writer) error {
	ev, err := events.Decode(data)
	if err != nil {
		fmt.Fprintf(stderr, "hubsync events: skipping a message on %s: not a hubsync event: %v\n", subject, err)
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
		line = []byte(events.Line(&ev))
	}
	_, err = stdout.Write(append(line, '\n'))
	return err
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

func (o *stateOptions) run(ctx context.Context, stdout, stderr io.Writer) error {
	c, bc, err := o.bus.dial()
	if err != nil {
		return err
	}
	defer c.Close()
	stored, err := c.Records(ctx, bc.KVBucket, o.namespace)
	if err != nil {
		return err
	}
	stored = slices.DeleteFunc(stored, func(s bus.StoredRecord) bool {
		if s.Record == nil {
			fmt.Fprintf(stderr, "hubsync state: skipping key %s: not an access record\n", s.Key)
		}
		return s.Record == nil
	})
	slices.SortFunc(stored, func(a, b bus.StoredRecord) int {
		return cmp.Or(strings.Compare(a.Record.Namespace, b.Record.Namespace), strings.Compare(a.Record.Cluster, b.Record.Cluster))
	})
	if o.output == "json" {
		raws := make([]json.RawMessage, len(stored))
		for i, s := range stored {
			raws[i] = s.Value
		}
		out, err := json.MarshalIndent(raws, "", "  ")
		if err != nil {
			return err
		}
		_, err = stdout.Write(append(out, '\n'))
		return err
	}
	records := make([]bus.Record, len(stored))
	for i, s := range stored {
		records[i] = *s.Record
	}
	return writeStateTable(stdout, records)
}

func writeStateTable(w io.Writer, records []bus.Record) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "NAMESPACE\tCLUSTER\tK8S\tHEALTHY\tPROVIDERS\tCREDENTIALS")
	for _, r := range records {
		k8s, healthy, providers := "-", "-", "-"
		if p := r.Profile; p != nil {
			k8s, healthy = cmp.Or(p.KubernetesVersion, "-"), cmp.Or(p.Healthy, "-")
			if len(p.AccessProviders) > 0 {
				providers = events.ProviderNames(p.AccessProviders)
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
