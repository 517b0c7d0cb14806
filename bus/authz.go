package bus

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net"
	"strings"
	"sync"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"

	"github.com/hubsync/hubsync/config"
)

// Who may do what on the embedded server: hubsync writes, consumers read,
// each in its own account (layout.go).
//
// hubsync's own connection is in-process and authenticates as selfUser
// with a password made at start, held in memory only; it is put in the
// writer account. The copies of each consumer account are made by an
// in-process user of that account (provisionerUser), with a password of
// its own made the same way. The server accepts those users on an
// in-process connection only, so a password would be of no use to anyone
// who read it from the process.
//
// Every other client is a consumer, with Layout.ConsumerPermissions in
// the account of its application: a client signing in with an NKey of
// bus.consumers is in that consumer's account; any other client is the
// local consumer (config.LocalConsumer, every namespace), which must
// present the token of bus.embedded.authTokenFile when one is set, and
// otherwise connect from this host or with a verified client certificate.

const (
	// selfUser is hubsync's own user on the embedded server.
	selfUser = "hubsync"
	// provisionerUser starts the name of the in-process user that keeps a
	// consumer account's copies: "hubsync-provisioner:<consumer>".
	provisionerUser = "hubsync-provisioner:"
	// consumerUser names the local consumer's connections in the
	// server's logs.
	consumerUser = "consumer"
	// selfInboxPrefix is the inbox of hubsync's own connection.
	selfInboxPrefix = "_HUBSYNC_INBOX"
)

// layoutOf is the account layout of cfg: on the embedded server the
// local consumer, then bus.consumers.
func layoutOf(cfg config.Bus) Layout {
	l := Layout{Prefix: cfg.SubjectPrefix, Stream: cfg.Stream.Name, Bucket: cfg.KVBucket}
	if len(cfg.URLs) == 0 {
		l.Consumers = []ConsumerAccess{{Name: config.LocalConsumer}}
	}
	for _, c := range cfg.Consumers {
		l.Consumers = append(l.Consumers, ConsumerAccess{Name: c.Name, Namespaces: c.Namespaces})
	}
	return l
}

// embeddedAuth authenticates the embedded server's clients and puts each
// in its account; it implements server.Authentication. Its consumers can
// change while the server runs (setConsumers).
type embeddedAuth struct {
	selfPassword string
	token        string // the local consumer's token; empty: none needed
	perms        *server.Permissions

	mu  sync.RWMutex
	srv *server.Server // set once the server exists
	// provisioners holds the password of each consumer account's
	// provisioning user, by consumer name.
	provisioners map[string]string
	// nkeys maps each public NKey of bus.consumers to its consumer.
	nkeys map[string]string
}

// newEmbeddedAuth makes the authenticator for cfg with new passwords for
// hubsync's own connection and each provisioning user; token is the local
// consumer's ("" for none).
func newEmbeddedAuth(cfg config.Bus, token string) (*embeddedAuth, error) {
	self, err := newPassword()
	if err != nil {
		return nil, fmt.Errorf("generate hubsync's own NATS password: %w", err)
	}
	a := &embeddedAuth{selfPassword: self, token: token, perms: layoutOf(cfg).ConsumerPermissions(), provisioners: map[string]string{}}
	if err := a.setConsumers(cfg); err != nil {
		return nil, err
	}
	return a, nil
}

func newPassword() (string, error) {
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		return "", err
	}
	return hex.EncodeToString(secret), nil
}

// setConsumers takes the consumers of cfg: their NKeys, and a provisioning
// password for each consumer that has none yet.
func (a *embeddedAuth) setConsumers(cfg config.Bus) error {
	keys := map[string]string{}
	for _, c := range cfg.Consumers {
		for _, k := range c.NKeys {
			keys[k] = c.Name
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, c := range layoutOf(cfg).Consumers {
		if a.provisioners[c.Name] == "" {
			pw, err := newPassword()
			if err != nil {
				return fmt.Errorf("generate a NATS password: %w", err)
			}
			a.provisioners[c.Name] = pw
		}
	}
	a.nkeys = keys
	return nil
}

func (a *embeddedAuth) setServer(srv *server.Server) {
	a.mu.Lock()
	a.srv = srv
	a.mu.Unlock()
}

// provisionerPassword is the password of consumer's provisioning user.
func (a *embeddedAuth) provisionerPassword(consumer string) string {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return a.provisioners[consumer]
}

// Check implements server.Authentication.
func (a *embeddedAuth) Check(c server.ClientAuthentication) bool {
	if c.Kind() != server.CLIENT {
		return false
	}
	a.mu.RLock()
	defer a.mu.RUnlock()
	if a.srv == nil {
		return false
	}
	o := c.GetOpts()
	switch {
	case o.Username == selfUser:
		// Refused rather than made a consumer: no one else uses this name.
		if !inProcess(c) || !equalSecret(o.Password, a.selfPassword) {
			return false
		}
		return a.register(c, &server.User{Username: selfUser}, WriterAccount)
	case strings.HasPrefix(o.Username, provisionerUser):
		name := strings.TrimPrefix(o.Username, provisionerUser)
		pw, ok := a.provisioners[name]
		if !ok || !inProcess(c) || !equalSecret(o.Password, pw) {
			return false
		}
		return a.register(c, &server.User{Username: o.Username}, ConsumerAccess{Name: name}.Account())
	case o.Nkey != "":
		name, ok := a.nkeys[o.Nkey]
		if !ok || !signedNonce(o.Nkey, o.Sig, c.GetNonce()) {
			return false
		}
		// Named by its key, so that a key removed later finds its
		// connections (Bus.SetConsumers).
		return a.register(c, &server.User{Username: o.Nkey, Permissions: a.perms}, ConsumerAccess{Name: name}.Account())
	}
	switch {
	case a.token != "":
		if !equalSecret(o.Token, a.token) {
			return false
		}
	case !local(c):
		// Without the token, the local consumer is a client on this host
		// (or with a client certificate the server verified): on a
		// listener others reach, they sign in with their NKeys.
		return false
	}
	return a.register(c, &server.User{Username: consumerUser, Permissions: a.perms}, ConsumerAccess{Name: config.LocalConsumer}.Account())
}

// local reports whether c connects from this host, in-process or over
// loopback, or presented a client certificate the server verified.
func local(c server.ClientAuthentication) bool {
	if inProcess(c) {
		return true
	}
	if st := c.GetTLSConnectionState(); st != nil && len(st.VerifiedChains) > 0 {
		return true
	}
	addr, ok := c.RemoteAddress().(*net.TCPAddr)
	return ok && addr.IP.IsLoopback()
}

// register puts c in account as u; false when the account does not exist
// (a consumer removed meanwhile).
func (a *embeddedAuth) register(c server.ClientAuthentication, u *server.User, account string) bool {
	acc, err := a.srv.LookupAccount(account)
	if err != nil {
		return false
	}
	u.Account = acc
	c.RegisterUser(u)
	return true
}

// signedNonce reports whether sig (base64, as clients send it) is the
// signature of nonce by the NKey pub.
func signedNonce(pub, sig string, nonce []byte) bool {
	if len(nonce) == 0 {
		return false
	}
	raw, err := base64.RawURLEncoding.DecodeString(sig)
	if err != nil {
		if raw, err = base64.StdEncoding.DecodeString(sig); err != nil {
			return false
		}
	}
	kp, err := nkeys.FromPublicKey(pub)
	if err != nil {
		return false
	}
	return kp.Verify(nonce, raw) == nil
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
