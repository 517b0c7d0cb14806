package bus

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/events"
)

// The bus's accounts: hubsync writes in one, each consuming application
// reads in an account of its own. Nothing here rests on what the server
// happens to do with a message; each guarantee is a NATS mechanism:
//
//   - The writer account (WriterAccount) holds the event stream and the KV
//     bucket. Only hubsync's user is in it. No consumer can publish there,
//     reach its JetStream API, or have anything delivered there.
//   - A consumer account holds copies that the server keeps: a stream of
//     the same name that sources the events of the namespaces the consumer
//     may read, and a stream of their KV records, sourced the same way
//     and listening on no subject. Both are created by
//     hubsync (Provision), read-only for the account's users, and deny
//     purging and deleting messages. The copy listens on <prefix>.>, so a
//     lookup by subject finds it (nats sub '<prefix>.>' --all, a
//     js.Subscribe without a bound stream); nothing in the account can
//     publish there: the users may not, a consumer of the copy may not
//     deliver into its own stream's subjects (the server refuses the
//     cycle), the records' copy has no subjects, and the users may not
//     create consumers on it (so none can deliver the records into the
//     copy). The account's JetStream limits allow these two streams and no
//     more.
//   - The copies reach the writer account through the account's own
//     imports of the writer account's exports: the consumer-create API of
//     the two streams under the prefix "$JS.hubsync.API", which the server
//     reserves like its own API (no consumer may deliver to it), flow
//     control, and the delivery subjects of the account's own sources.
//     The exports are public, so that registering an account changes
//     nothing for the others; only the layout's accounts import them. The
//     account's users may publish to none of them.
//   - Every consumer account is separate: its users' inboxes, consumers,
//     acknowledgements and durables are invisible to other consumers.
//
// Users' permissions (ConsumerPermissions) are allow-lists: reading the
// copies, replaying them with consumers of their own, acknowledging those.
// Everything else is refused by the server with a permissions violation,
// among it a core subscription to <prefix>.> (the events are in the copy,
// not published in the account: subscribe with JetStream).

// WriterAccount is the account hubsync writes in.
const WriterAccount = "HUBSYNC"

const (
	// importedAPI is where a consumer account reaches the writer account's
	// consumer-create API. Its third token is API, so the server treats it
	// as a JetStream API prefix: it refuses a consumer whose deliver
	// subject is under it.
	importedAPI = "$JS.hubsync.API"
	// deliverRoot starts the subjects the sources of a consumer account's
	// copies are delivered on, one token per consumer after it.
	deliverRoot = "_HUBSYNC_DELIVER"
	// maxConsumersPerAccount bounds the JetStream consumers a consuming
	// application may have at once on its copies.
	maxConsumersPerAccount = 256
)

// Layout is the account layout of a bus: the names hubsync uses and the
// consuming applications.
type Layout struct {
	// Prefix, Stream and Bucket are bus.subjectPrefix, bus.stream.name and
	// bus.kvBucket.
	Prefix, Stream, Bucket string
	// Consumers are the consuming applications, each in an account of
	// its own.
	Consumers []ConsumerAccess
}

// ConsumerAccess is a consuming application's access to the bus.
type ConsumerAccess struct {
	// Name is the application's name: lowercase letters, digits and '-'.
	Name string
	// Namespaces the application reads the events and records of; empty
	// for every namespace.
	Namespaces []string
}

// Account is the NATS account of a consuming application.
func (c ConsumerAccess) Account() string { return "HUBSYNC_CONSUMER_" + c.Name }

func (c ConsumerAccess) deliverPrefix() string { return deliverRoot + "." + c.Name }

// Validate checks the names of l's consumers.
func (l Layout) Validate() error {
	var errs []error
	seen := map[string]bool{}
	for _, c := range l.Consumers {
		switch {
		case !config.ValidConsumerName(c.Name):
			errs = append(errs, fmt.Errorf("consumer %q: a name is 1 to 63 lowercase letters, digits and '-', starting and ending with a letter or digit", c.Name))
		case seen[c.Name]:
			errs = append(errs, fmt.Errorf("consumer %q is listed twice", c.Name))
		}
		seen[c.Name] = true
		for _, ns := range c.Namespaces {
			if ns == "" {
				errs = append(errs, fmt.Errorf("consumer %q: an empty namespace", c.Name))
			}
		}
	}
	return errors.Join(errs...)
}

func (l Layout) kvStream() string { return "KV_" + l.Bucket }

// User is a NATS user: an NKey (its public key, U...) or a name and a
// password.
type User struct {
	NKey     string
	Name     string
	Password string
}

// Users are the users of a layout's accounts: hubsync's in the writer
// account; per consuming application (by name) its own users and the
// user hubsync provisions its copies with.
type Users struct {
	Writer       User
	Consumers    map[string][]User
	Provisioners map[string]User
}

// Config is a nats-server configuration's accounts block for l, as JSON
// (a NATS configuration file may be JSON): the writer account with
// JetStream, its user and its exports; each consumer account with its
// JetStream limits, imports and users, the application's with
// ConsumerPermissions. It is the layout an external NATS must have too
// (docs/events.md).
func (l Layout) Config(users Users) ([]byte, error) { return l.config(&users) }

// ServerConfig is Config without users, for a server that authenticates
// its clients itself (embeddedAuth): the writer account and the consumer
// accounts of l, which exist from the server's start, before its routes
// connect. (An account registered later on a clustered node misses the
// interest its peers announced before: their consumers answer nothing
// there. Register adds the accounts of consumers listed later; the
// writer's exports do not depend on the consumers, so adding one changes
// nothing for the connections of the others.)
func (l Layout) ServerConfig() ([]byte, error) { return l.config(nil) }

// importSpec is one import of a consumer account from the writer
// account: a service (requests) or a stream (deliveries), from the
// writer's subject to the consumer account's.
type importSpec struct {
	service  bool
	from, to string
}

// imports are c's imports: the consumer-create API of the two streams
// under importedAPI, their flow control, and the deliveries of c's own
// sources.
func (l Layout) imports(c ConsumerAccess) []importSpec {
	var out []importSpec
	for _, s := range []string{l.Stream, l.kvStream()} {
		create := "$JS.API.CONSUMER.CREATE." + s
		out = append(out,
			importSpec{service: true, from: create, to: importedAPI + ".CONSUMER.CREATE." + s},
			importSpec{service: true, from: create + ".>", to: importedAPI + ".CONSUMER.CREATE." + s + ".>"},
			importSpec{service: true, from: "$JS.FC." + s + ".>", to: "$JS.FC." + s + ".>"},
		)
	}
	return append(out, importSpec{from: c.deliverPrefix() + ".>", to: c.deliverPrefix() + ".>"})
}

// consumerLimits are a consumer account's JetStream limits: its two
// copies and no more streams, a bounded number of consumers.
var consumerLimits = server.JetStreamAccountLimits{MaxStreams: 2, MaxConsumers: maxConsumersPerAccount, MaxMemory: -1, MaxStore: -1}

// Register adds c's account to srv, which runs the writer account of
// ServerConfig, with its imports and JetStream limits. An account
// registered before (a consumer removed and listed again) is kept.
func (l Layout) Register(srv *server.Server, c ConsumerAccess) error {
	if _, err := srv.LookupAccount(c.Account()); err == nil {
		return nil
	}
	writer, err := srv.LookupAccount(WriterAccount)
	if err != nil {
		return fmt.Errorf("the writer account: %w", err)
	}
	acc, err := srv.RegisterAccount(c.Account())
	if err != nil {
		return fmt.Errorf("consumer %s: register its account: %w", c.Name, err)
	}
	for _, im := range l.imports(c) {
		if im.service {
			// In the consumer account "to" is the local subject, mapped
			// to the writer account's "from".
			err = acc.AddServiceImport(writer, im.to, im.from)
		} else {
			err = acc.AddMappedStreamImport(writer, im.from, im.to)
		}
		if err != nil {
			return fmt.Errorf("consumer %s: import %s: %w", c.Name, im.from, err)
		}
	}
	if err := acc.EnableJetStream(map[string]server.JetStreamAccountLimits{"": consumerLimits}, nil); err != nil {
		return fmt.Errorf("consumer %s: JetStream: %w", c.Name, err)
	}
	return nil
}

// The configuration's JSON, as nats-server reads it.
type (
	confPerm struct {
		Allow []string `json:"allow"`
	}
	confPerms struct {
		Publish   confPerm `json:"publish"`
		Subscribe confPerm `json:"subscribe"`
	}
	confUser struct {
		NKey        string     `json:"nkey,omitempty"`
		User        string     `json:"user,omitempty"`
		Password    string     `json:"password,omitempty"`
		Permissions *confPerms `json:"permissions,omitempty"`
	}
	confExport struct {
		Service      string `json:"service,omitempty"`
		Stream       string `json:"stream,omitempty"`
		ResponseType string `json:"response_type,omitempty"`
	}
	confRef struct {
		Account string `json:"account"`
		Subject string `json:"subject"`
	}
	confImport struct {
		Service *confRef `json:"service,omitempty"`
		Stream  *confRef `json:"stream,omitempty"`
		To      string   `json:"to"`
	}
	confLimits struct {
		MaxStreams   int `json:"max_streams"`
		MaxConsumers int `json:"max_consumers"`
	}
	confAccount struct {
		JetStream any          `json:"jetstream"`
		Users     []confUser   `json:"users,omitempty"`
		Exports   []confExport `json:"exports,omitempty"`
		Imports   []confImport `json:"imports,omitempty"`
	}
)

// confUserOf is u in the configuration, with permissions p (nil: all).
func confUserOf(u User, p *confPerms) (confUser, error) {
	if (u.NKey == "") == (u.Name == "") || (u.Name != "" && u.Password == "") {
		return confUser{}, errors.New("a user is an NKey, or a name and a password")
	}
	if strings.ContainsFunc(u.Name+u.Password+u.NKey, func(r rune) bool { return r < ' ' || r == 0x7f }) {
		return confUser{}, errors.New("a user's name, password or NKey holds a control character")
	}
	return confUser{NKey: u.NKey, User: u.Name, Password: u.Password, Permissions: p}, nil
}

func (l Layout) config(users *Users) ([]byte, error) {
	if err := l.Validate(); err != nil {
		return nil, err
	}
	writer, err := l.writerAccount(users)
	if err != nil {
		return nil, err
	}
	accounts := map[string]confAccount{WriterAccount: writer}
	for _, c := range l.Consumers {
		if accounts[c.Account()], err = l.consumerAccount(c, users); err != nil {
			return nil, err
		}
	}
	// NATS's parser takes JSON but not its \u escapes: write >, < and &
	// as they are. Names and subjects hold no control character, and
	// confUserOf refuses one in a password.
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(map[string]any{"accounts": accounts}); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// writerAccount is the writer account: JetStream, hubsync's user, and
// the exports every consumer account imports from (public: the imports
// are all the configuration's own).
func (l Layout) writerAccount(users *Users) (confAccount, error) {
	a := confAccount{JetStream: "enabled"}
	if users != nil {
		w, err := confUserOf(users.Writer, nil)
		if err != nil {
			return a, fmt.Errorf("hubsync's user: %w", err)
		}
		a.Users = []confUser{w}
	}
	for _, s := range []string{l.Stream, l.kvStream()} {
		create := "$JS.API.CONSUMER.CREATE." + s
		a.Exports = append(a.Exports,
			confExport{Service: create, ResponseType: "stream"},
			confExport{Service: create + ".>", ResponseType: "stream"},
			confExport{Service: "$JS.FC." + s + ".>"},
		)
	}
	a.Exports = append(a.Exports, confExport{Stream: deliverRoot + ".>"})
	return a, nil
}

// consumerAccount is c's account: its JetStream limits, its imports, the
// provisioning user and the application's users with
// ConsumerPermissions.
func (l Layout) consumerAccount(c ConsumerAccess, users *Users) (confAccount, error) {
	a := confAccount{JetStream: confLimits{MaxStreams: consumerLimits.MaxStreams, MaxConsumers: consumerLimits.MaxConsumers}}
	for _, im := range l.imports(c) {
		if im.service {
			a.Imports = append(a.Imports, confImport{Service: &confRef{WriterAccount, im.from}, To: im.to})
		} else {
			a.Imports = append(a.Imports, confImport{Stream: &confRef{WriterAccount, im.from}, To: im.to})
		}
	}
	if users == nil {
		return a, nil
	}
	prov, err := confUserOf(users.Provisioners[c.Name], nil)
	if err != nil {
		return a, fmt.Errorf("consumer %s: the provisioning user: %w", c.Name, err)
	}
	a.Users = append(a.Users, prov)
	cp := l.ConsumerPermissions()
	perms := &confPerms{Publish: confPerm{cp.Publish.Allow}, Subscribe: confPerm{cp.Subscribe.Allow}}
	for i, u := range users.Consumers[c.Name] {
		cu, err := confUserOf(u, perms)
		if err != nil {
			return a, fmt.Errorf("consumer %s: user %d: %w", c.Name, i+1, err)
		}
		a.Users = append(a.Users, cu)
	}
	return a, nil
}

// ConsumerPermissions is what a consuming application's users may do in
// its account: look the copies up, read them by sequence or subject,
// replay the events with consumers of their own (pull or push, durable or
// ephemeral, ordered) and acknowledge them; read the records by key. Only
// allow-lists: everything else is refused.
func (l Layout) ConsumerPermissions() *server.Permissions {
	const api = "$JS.API."
	s, kv := l.Stream, l.kvStream()
	pub := []string{api + "INFO", api + "STREAM.NAMES", api + "STREAM.LIST"}
	for _, n := range []string{s, kv} {
		pub = append(pub,
			api+"STREAM.INFO."+n,
			api+"STREAM.MSG.GET."+n,
			api+"DIRECT.GET."+n, api+"DIRECT.GET."+n+".>",
		)
	}
	pub = append(pub,
		api+"CONSUMER.CREATE."+s, api+"CONSUMER.CREATE."+s+".>",
		api+"CONSUMER.DURABLE.CREATE."+s+".*",
		api+"CONSUMER.INFO."+s+".*",
		api+"CONSUMER.LIST."+s, api+"CONSUMER.NAMES."+s,
		api+"CONSUMER.MSG.NEXT."+s+".*",
		api+"CONSUMER.DELETE."+s+".*",
		"$JS.ACK."+s+".>",
		"$JS.FC."+s+".>",
	)
	return &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: pub},
		Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX.>"}},
	}
}

// copyConfigs are the two streams hubsync keeps in c's account, with the
// limits of the writer's stream (primary): the events of c's namespaces,
// on the event subjects, and their records, a bucket's stream (KV_<bucket>:
// a KV reader opens it by that name, and reads a key by direct get) with
// no subjects, so that nothing in the account can be delivered into it.
// Both source hubsync's streams: the server keeps them current, and after
// a node's restart resumes where each stopped.
func (l Layout) copyConfigs(c ConsumerAccess, primary jetstream.StreamConfig) (jetstream.StreamConfig, jetstream.StreamConfig) {
	ext := &jetstream.ExternalStream{APIPrefix: importedAPI, DeliverPrefix: c.deliverPrefix()}
	src := &jetstream.StreamSource{Name: l.Stream, External: ext}
	kvSrc := &jetstream.StreamSource{Name: l.kvStream(), External: ext}
	for _, ns := range c.Namespaces {
		f := l.Prefix + "." + events.EscapeToken(ns) + ".>"
		src.SubjectTransforms = append(src.SubjectTransforms, jetstream.SubjectTransformConfig{Source: f, Destination: f})
		kf := "$KV." + l.Bucket + "." + events.KVKey(ns, "") + ">"
		kvSrc.SubjectTransforms = append(kvSrc.SubjectTransforms, jetstream.SubjectTransformConfig{Source: kf, Destination: kf})
	}
	events := jetstream.StreamConfig{
		Name:        l.Stream,
		Description: fmt.Sprintf("hubsync's events for consumer %s, kept by hubsync: read-only", c.Name),
		Subjects:    []string{l.Prefix + ".>"},
		Sources:     []*jetstream.StreamSource{src},
		Retention:   jetstream.LimitsPolicy,
		Discard:     jetstream.DiscardOld,
		Storage:     primary.Storage,
		MaxAge:      primary.MaxAge,
		MaxBytes:    primary.MaxBytes,
		MaxMsgs:     -1,
		Duplicates:  primary.Duplicates,
		Replicas:    primary.Replicas,
		DenyDelete:  true,
		DenyPurge:   true,
	}
	records := jetstream.StreamConfig{
		Name:              l.kvStream(),
		Description:       fmt.Sprintf("hubsync's access records for consumer %s, kept by hubsync: read-only", c.Name),
		Sources:           []*jetstream.StreamSource{kvSrc},
		Retention:         jetstream.LimitsPolicy,
		Discard:           jetstream.DiscardNew,
		Storage:           primary.Storage,
		MaxMsgs:           -1,
		MaxBytes:          -1,
		MaxMsgsPerSubject: 1,
		Replicas:          primary.Replicas,
		AllowDirect:       true,
		DenyDelete:        true,
		DenyPurge:         true,
	}
	return events, records
}

// Provision creates or updates c's copies through js, a connection in
// c's account with every right there. A copy whose sources changed (the
// consumer's namespaces), or made another way before, is deleted and made
// again, so that it never keeps events of a namespace the consumer may no
// longer read.
func (l Layout) Provision(ctx context.Context, js jetstream.JetStream, c ConsumerAccess, primary jetstream.StreamConfig) error {
	evCfg, kvCfg := l.copyConfigs(c, primary)
	if err := l.ensureCopy(ctx, js, evCfg); err != nil {
		return fmt.Errorf("consumer %s: events copy: %w", c.Name, err)
	}
	if err := l.ensureCopy(ctx, js, kvCfg); err != nil {
		return fmt.Errorf("consumer %s: records copy: %w", c.Name, err)
	}
	return nil
}

func (l Layout) ensureCopy(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig) error {
	s, err := js.Stream(ctx, cfg.Name)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
	case err != nil:
		return err
	case len(s.CachedInfo().Config.Sources) != 1 || !sameSources(s.CachedInfo().Config.Sources[0], cfg.Sources[0]):
		if err := js.DeleteStream(ctx, cfg.Name); err != nil {
			return fmt.Errorf("replace: %w", err)
		}
	}
	_, err = js.CreateOrUpdateStream(ctx, cfg)
	return err
}

// sameSources reports whether two sources read the same stream, subjects
// and account.
func sameSources(a, b *jetstream.StreamSource) bool {
	if a == nil || b == nil {
		return a == b
	}
	filters := func(s *jetstream.StreamSource) []string {
		var out []string
		if s.FilterSubject != "" {
			out = append(out, s.FilterSubject)
		}
		for _, t := range s.SubjectTransforms {
			out = append(out, t.Source+"→"+t.Destination)
		}
		slices.Sort(out)
		return out
	}
	ext := func(s *jetstream.StreamSource) jetstream.ExternalStream {
		if s.External == nil {
			return jetstream.ExternalStream{}
		}
		return *s.External
	}
	return a.Name == b.Name && slices.Equal(filters(a), filters(b)) && ext(a) == ext(b)
}
