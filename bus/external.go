package bus

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/hubsync/hubsync/config"
)

// An external NATS holds the same accounts as the embedded server
// (layout.go): the operator writes them in the servers' configuration,
// with the users AccountsConfig prints. hubsync signs in to the writer
// account with bus.nkeySeedFile, and to each consumer account, to make
// and watch its copies, as that account's provisioning user, whose NKey
// is derived from the same seed (ProvisionerKey): one secret for
// hubsync, a separate identity in every account, and nothing else to
// distribute. Adding an application is a line in bus.consumers (hubsync
// reloads it) and the accounts block printed again (nats-server reloads
// it on SIGHUP); until the server has the account, its copies are
// reported failing and retried.

// provisionerKeyInfo separates the derived keys from any other use of
// hubsync's seed.
const provisionerKeyInfo = "hubsync bus provisioner v1\x00"

// ProvisionerKey is the NKey of consumer's provisioning user on an
// external NATS, derived from hubsync's own NKey seed (the content of
// bus.nkeySeedFile) with HMAC-SHA256: the same seed always gives the
// same key; a provisioning key reveals neither hubsync's seed nor
// another account's key.
func ProvisionerKey(seed []byte, consumer string) (nkeys.KeyPair, error) {
	kp, err := nkeys.ParseDecoratedNKey(bytes.TrimSpace(seed))
	if err != nil {
		return nil, errors.New("not an NKey seed")
	}
	s, err := kp.Seed()
	if err != nil {
		return nil, errors.New("not an NKey seed")
	}
	prefix, raw, err := nkeys.DecodeSeed(s)
	if err != nil || prefix != nkeys.PrefixByteUser {
		return nil, errors.New("not a user NKey seed (SU...)")
	}
	mac := hmac.New(sha256.New, raw)
	mac.Write([]byte(provisionerKeyInfo + consumer))
	return nkeys.FromRawSeed(nkeys.PrefixByteUser, mac.Sum(nil))
}

// externalSeed checks that cfg can keep consumer accounts on an external
// NATS and reads hubsync's seed.
func externalSeed(cfg config.Bus) ([]byte, error) {
	if len(cfg.URLs) == 0 {
		return nil, errors.New("bus.urls is empty: the embedded server makes its accounts itself")
	}
	if cfg.NKeySeedFile == "" {
		return nil, errors.New("bus.nkeySeedFile is empty: hubsync signs in to an external NATS's accounts with NKeys derived from its own")
	}
	seed, err := os.ReadFile(cfg.NKeySeedFile)
	if err != nil {
		return nil, fmt.Errorf("bus.nkeySeedFile: %w", err)
	}
	return seed, nil
}

// ExternalUsers are the users of cfg's accounts on an external NATS:
// hubsync's (bus.nkeySeedFile's public key), each application's NKeys of
// bus.consumers, and each account's provisioning user (ProvisionerKey).
func ExternalUsers(cfg config.Bus) (Users, error) {
	seed, err := externalSeed(cfg)
	if err != nil {
		return Users{}, err
	}
	kp, err := nkeys.ParseDecoratedNKey(seed)
	if err != nil {
		return Users{}, fmt.Errorf("bus.nkeySeedFile %s: not an NKey seed", cfg.NKeySeedFile)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		return Users{}, err
	}
	users := Users{Writer: User{NKey: pub}, Consumers: map[string][]User{}, Provisioners: map[string]User{}}
	for _, c := range cfg.Consumers {
		pk, err := ProvisionerKey(seed, c.Name)
		if err != nil {
			return Users{}, fmt.Errorf("bus.nkeySeedFile %s: %w", cfg.NKeySeedFile, err)
		}
		pub, err := pk.PublicKey()
		if err != nil {
			return Users{}, err
		}
		users.Provisioners[c.Name] = User{NKey: pub}
		for _, k := range c.NKeys {
			users.Consumers[c.Name] = append(users.Consumers[c.Name], User{NKey: k})
		}
	}
	return users, nil
}

// AccountsConfig is the accounts block of an external NATS for cfg, in
// nats-server's configuration syntax (include it from the servers'
// configuration): the writer account with hubsync's user, and every
// application's account with its users and provisioning user.
func AccountsConfig(cfg config.Bus) ([]byte, error) {
	users, err := ExternalUsers(cfg)
	if err != nil {
		return nil, err
	}
	conf, err := layoutOf(cfg).Config(users)
	if err != nil {
		return nil, err
	}
	// Config is one JSON object, {"accounts": {...}}; an included file
	// holds the key and its value, without the outer braces.
	var v map[string]json.RawMessage
	if err := json.Unmarshal(conf, &v); err != nil {
		return nil, err
	}
	var out bytes.Buffer
	out.WriteString("# hubsync's bus accounts (hubsync bus-accounts); regenerate after changing bus.consumers.\naccounts: ")
	if err := json.Indent(&out, v["accounts"], "", "  "); err != nil {
		return nil, err
	}
	out.WriteString("\n")
	return out.Bytes(), nil
}

// dialExternal connects once to the external NATS of cfg as one of
// hubsync's users: its own with consumer nil, else the provisioning user
// of consumer's account. Close the connection when done.
func dialExternal(cfg config.Bus, name string, consumer *ConsumerAccess) (*nats.Conn, jetstream.JetStream, error) {
	sec := cfg
	var kp nkeys.KeyPair
	if consumer != nil {
		seed, err := externalSeed(cfg)
		if err != nil {
			return nil, nil, err
		}
		if kp, err = ProvisionerKey(seed, consumer.Name); err != nil {
			return nil, nil, fmt.Errorf("bus.nkeySeedFile %s: %w", cfg.NKeySeedFile, err)
		}
		sec.NKeySeedFile, sec.CredsFile = "", ""
	}
	opts, err := securityOptions(sec)
	if err != nil {
		return nil, nil, err
	}
	if kp != nil {
		pub, err := kp.PublicKey()
		if err != nil {
			return nil, nil, err
		}
		opts = append(opts, nats.Nkey(pub, kp.Sign))
	}
	o := nats.GetDefaultOptions()
	o.Servers, o.Name, o.Timeout, o.AllowReconnect = cfg.URLs, name, 5*time.Second, false
	if err := apply(&o, opts); err != nil {
		return nil, nil, err
	}
	nc, err := o.Connect()
	if err != nil {
		return nil, nil, fmt.Errorf("connect to %s: %w", RedactURLs(cfg.URLs), err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}

// userInfo is who the server says a connection is.
type userInfo struct {
	Account string `json:"account"`
}

// whoAmI asks the server which account nc is in.
func whoAmI(ctx context.Context, nc *nats.Conn) (string, error) {
	msg, err := nc.RequestWithContext(ctx, "$SYS.REQ.USER.INFO", nil)
	if err != nil {
		return "", fmt.Errorf("ask the server for the account: %w", err)
	}
	var resp struct {
		Data  userInfo `json:"data"`
		Error *struct {
			Description string `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return "", fmt.Errorf("the server's user info: %w", err)
	}
	if resp.Error != nil {
		return "", fmt.Errorf("the server's user info: %s", resp.Error.Description)
	}
	return resp.Data.Account, nil
}

// Finding is one thing VerifyExternal checked, and what it found wrong
// (Err nil: as the layout needs).
type Finding struct {
	What string
	Err  error
}

// VerifyExternal checks, with hubsync's own credentials, that the
// external NATS of cfg holds the layout AccountsConfig prints: hubsync's
// user is in an account with JetStream; each application's provisioning
// user signs in, in an account of its own (not hubsync's, not another
// application's), with JetStream limited to the two copies, and the
// writer account's consumer-create API answers through its imports. An
// application's own users cannot be checked without their seeds: use the
// printed configuration for them.
func VerifyExternal(ctx context.Context, cfg config.Bus) []Finding {
	var out []Finding
	nc, js, err := dialExternal(cfg, "hubsync-check", nil)
	if err != nil {
		return append(out, Finding{"hubsync's user signs in", err})
	}
	defer nc.Close()
	writer, err := whoAmI(ctx, nc)
	out = append(out, Finding{"hubsync's user signs in (account " + writer + ")", err})
	_, err = js.AccountInfo(ctx)
	out = append(out, Finding{"hubsync's account has JetStream", err})
	seen := map[string]string{writer: "hubsync"}
	l := layoutOf(cfg)
	for _, c := range l.Consumers {
		out = append(out, verifyConsumer(ctx, cfg, l, c, seen)...)
	}
	return out
}

func verifyConsumer(ctx context.Context, cfg config.Bus, l Layout, c ConsumerAccess, seen map[string]string) []Finding {
	what := "consumer " + c.Name + ": "
	nc, js, err := dialExternal(cfg, "hubsync-check", &c)
	if err != nil {
		return []Finding{{what + "its provisioning user signs in", fmt.Errorf("%w (is %s in the servers' configuration? hubsync bus-accounts prints it)", err, c.Account())}}
	}
	defer nc.Close()
	acc, err := whoAmI(ctx, nc)
	if err == nil && seen[acc] != "" {
		err = fmt.Errorf("it is in account %s, with %s: each application needs an account of its own", acc, seen[acc])
	}
	seen[acc] = c.Name
	out := []Finding{{what + "its provisioning user signs in, in an account of its own (" + acc + ")", err}}
	info, err := js.AccountInfo(ctx)
	if err == nil && (info.Limits.MaxStreams != consumerLimits.MaxStreams || info.Limits.MaxConsumers != consumerLimits.MaxConsumers) {
		err = fmt.Errorf("its JetStream limits are %d streams and %d consumers, want %d and %d", info.Limits.MaxStreams, info.Limits.MaxConsumers, consumerLimits.MaxStreams, consumerLimits.MaxConsumers)
	}
	out = append(out, Finding{what + "its account has JetStream for its two copies only", err})
	for _, s := range []string{l.Stream, l.kvStream()} {
		// An empty request creates nothing: the writer's API answers it
		// with an error, which proves the import reaches it.
		_, err := nc.RequestWithContext(ctx, importedAPI+".CONSUMER.CREATE."+s, nil)
		if errors.Is(err, nats.ErrNoResponders) {
			err = fmt.Errorf("nothing answers %s.CONSUMER.CREATE.%s: the account does not import the writer account's API "+
				"(nats-server sets up no imports for an account that a configuration reload added: restart the servers in turn)", importedAPI, s)
		}
		out = append(out, Finding{what + "its account reaches the consumer API of " + s, err})
	}
	return out
}

// FindingsErr joins the failed findings.
func FindingsErr(fs []Finding) error {
	var msgs []string
	for _, f := range fs {
		if f.Err != nil {
			msgs = append(msgs, f.What+": "+f.Err.Error())
		}
	}
	if len(msgs) == 0 {
		return nil
	}
	return errors.New(strings.Join(msgs, "; "))
}
