package bus

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"fmt"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/hubsync/hubsync/config"
)

// Who may do what on the embedded server: hubsync writes, consumers read.
//
// hubsync's own connection is in-process and authenticates as selfUser
// with a password made at start, held in memory only. The server accepts
// that user on an in-process connection only, so the password would be
// of no use to anyone who read it from the process.
//
// Every other client is a consumer. With bus.embedded.authTokenFile a
// consumer must present that token; without it (loopback, or mutual TLS),
// a client needs no credential. Either way it gets consumerPermissions,
// which let it read the event stream and the KV bucket, never write them.
//
// The server publishes events on their public subjects itself, after it
// has stored them (see Bus.streamConfig): hubsync publishes them on a
// private subject consumers cannot touch. A consumer can create push
// consumers, and a push consumer sends copies of stored messages to any
// subject that has a subscriber, its creator's permissions aside; were
// the stream listening on the public subjects, such a copy (of a KV
// record, say) sent to <prefix>.x.y.z would be stored as an event.

const (
	// selfUser is hubsync's own user on the embedded server.
	selfUser = "hubsync"
	// consumerUser names consumer connections in the server's logs.
	consumerUser = "consumer"
	// privateRoot starts the subject hubsync publishes events on when it
	// runs the server: "$HUBSYNC.<prefix>.<namespace>.<cluster>.<kind>".
	// A subject prefix cannot hold "$", so it never clashes with one.
	privateRoot = "$HUBSYNC"
	// selfInboxPrefix is the inbox of hubsync's own connection: consumers
	// may subscribe to _INBOX.>, and must neither see hubsync's
	// acknowledgements nor be able to aim anything at them.
	selfInboxPrefix = "_HUBSYNC_INBOX"
)

// embeddedAuth authenticates the embedded server's clients; it implements
// server.Authentication.
type embeddedAuth struct {
	selfPassword string
	token        string // a consumer's token; empty: consumers need none
	consumer     *server.Permissions
}

// newEmbeddedAuth makes the authenticator for cfg with a new password for
// hubsync's own connection; token is the consumers' ("" for none).
func newEmbeddedAuth(cfg config.Bus, token string) (*embeddedAuth, error) {
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		return nil, fmt.Errorf("generate hubsync's own NATS password: %w", err)
	}
	return &embeddedAuth{selfPassword: hex.EncodeToString(secret), token: token, consumer: consumerPermissions(cfg)}, nil
}

// Check implements server.Authentication.
func (a *embeddedAuth) Check(c server.ClientAuthentication) bool {
	if c.Kind() != server.CLIENT {
		return false
	}
	o := c.GetOpts()
	if o.Username == selfUser {
		// Refused rather than made a consumer: no one else uses this name.
		if !inProcess(c) || !equalSecret(o.Password, a.selfPassword) {
			return false
		}
		c.RegisterUser(&server.User{Username: selfUser})
		return true
	}
	if a.token != "" && !equalSecret(o.Token, a.token) {
		return false
	}
	c.RegisterUser(&server.User{Username: consumerUser, Permissions: a.consumer})
	return true
}

// inProcess reports whether c came through Server.InProcessConn, which
// is a net.Pipe: no network listener gives a "pipe" address.
func inProcess(c server.ClientAuthentication) bool {
	addr := c.RemoteAddress()
	return addr != nil && addr.Network() == "pipe"
}

func equalSecret(got, want string) bool {
	return subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}

// consumerPermissions is what a consumer may do: read the event stream and
// the KV bucket, live or replayed, through consumers of its own. Only
// allow-lists; everything else is refused, among it publishing on the
// event subjects, writing the bucket ($KV.<bucket>.>), creating, updating,
// purging or deleting a stream or bucket, and deleting messages.
//
// The JetStream API subjects are those nats.go (jetstream and the legacy
// JetStreamContext) and the nats CLI use:
//   - $JS.API.INFO: account information, which clients ask for first;
//   - $JS.API.STREAM.NAMES: the stream of a subject, which a legacy
//     js.Subscribe without BindStream looks up;
//   - per stream (the events, and KV_<bucket> behind the bucket):
//     STREAM.INFO (also how a client opens a bucket), STREAM.MSG.GET and
//     DIRECT.GET (reading one message or KV value, by sequence or by last
//     subject), CONSUMER.CREATE (ephemeral: the bare subject; named or
//     filtered: more tokens), CONSUMER.DURABLE.CREATE (older clients),
//     CONSUMER.INFO, CONSUMER.LIST, CONSUMER.NAMES, CONSUMER.MSG.NEXT (pull)
//     and CONSUMER.DELETE (an ordered consumer deletes the one it replaces);
//   - $JS.ACK.<stream>.> to acknowledge, $JS.FC.<stream>.> to answer a push
//     consumer's flow control (a KV watch).
//
// Consumer names are not scoped: every consumer shares one identity, so
// its consumers are all "its own", and one could delete another's
// durable. Consumers that need to be kept apart need an external NATS.
//
// A consumer subscribes to the event subjects and to _INBOX.>, where
// replies and push deliveries come; a deliver subject must be an inbox.
func consumerPermissions(cfg config.Bus) *server.Permissions {
	const api = "$JS.API."
	pub := []string{api + "INFO", api + "STREAM.NAMES"}
	for _, s := range []string{cfg.Stream.Name, "KV_" + cfg.KVBucket} {
		pub = append(pub,
			api+"STREAM.INFO."+s,
			api+"STREAM.MSG.GET."+s,
			api+"DIRECT.GET."+s, api+"DIRECT.GET."+s+".>",
			api+"CONSUMER.CREATE."+s, api+"CONSUMER.CREATE."+s+".>",
			api+"CONSUMER.DURABLE.CREATE."+s+".*",
			api+"CONSUMER.INFO."+s+".*",
			api+"CONSUMER.LIST."+s, api+"CONSUMER.NAMES."+s,
			api+"CONSUMER.MSG.NEXT."+s+".*",
			api+"CONSUMER.DELETE."+s+".*",
			"$JS.ACK."+s+".>",
			"$JS.FC."+s+".>",
		)
	}
	return &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: pub},
		Subscribe: &server.SubjectPermission{Allow: []string{cfg.SubjectPrefix + ".>", "_INBOX.>"}},
	}
}
