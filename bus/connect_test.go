package bus

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/stream"
	"github.com/hubsync/hubsync/stream/streamtest"
	"github.com/hubsync/hubsync/test/fleet"
)

// pki is a throwaway CA with a server and a client certificate, written
// as PEM files.
type pki struct {
	caFile, certFile, keyFile string // the client's
	server                    *tls.Config
	serverCert, serverKey     string // the server's, as files
}

func newPKI(t *testing.T) pki {
	t.Helper()
	dir := t.TempDir()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "hubsync test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	issue := func(serial int64, name string, usage x509.ExtKeyUsage) (certPEM, keyPEM []byte) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
			IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kder, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
	}
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	srvCert, srvKey := issue(2, "nats", x509.ExtKeyUsageServerAuth)
	cliCert, cliKey := issue(3, "hubsync", x509.ExtKeyUsageClientAuth)
	pair, err := tls.X509KeyPair(srvCert, srvKey)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return pki{
		caFile:     write("ca.pem", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})),
		certFile:   write("client.pem", cliCert),
		keyFile:    write("client-key.pem", cliKey),
		serverCert: write("server.pem", srvCert),
		serverKey:  write("server-key.pem", srvKey),
		server: &tls.Config{
			Certificates: []tls.Certificate{pair}, ClientCAs: pool,
			ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12,
		},
	}
}

// jwtAuth is an operator-mode setup: an operator, an account with
// JetStream, and a user whose credentials file hubsync is given.
type jwtAuth struct {
	operator     *jwt.OperatorClaims
	resolver     *server.MemAccResolver
	system       string // the system account, which JetStream needs
	credsFile    string
	userSeed     string
	otherAccount string // credentials of a user of an account the server does not know
}

func newJWTAuth(t *testing.T) jwtAuth {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	opKP, err := nkeys.CreateOperator()
	must(err)
	opPub, _ := opKP.PublicKey()
	op := jwt.NewOperatorClaims(opPub)
	opJWT, err := op.Encode(opKP)
	must(err)
	op, err = jwt.DecodeOperatorClaims(opJWT)
	must(err)

	account := func(withJetStream bool) (nkeys.KeyPair, string, string) {
		kp, err := nkeys.CreateAccount()
		must(err)
		pub, _ := kp.PublicKey()
		ac := jwt.NewAccountClaims(pub)
		if withJetStream {
			ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
		}
		acJWT, err := ac.Encode(opKP)
		must(err)
		return kp, pub, acJWT
	}
	user := func(accKP nkeys.KeyPair) (creds []byte, seed string) {
		kp, err := nkeys.CreateUser()
		must(err)
		pub, _ := kp.PublicKey()
		userJWT, err := jwt.NewUserClaims(pub).Encode(accKP)
		must(err)
		s, _ := kp.Seed()
		creds, err = jwt.FormatUserConfig(userJWT, s)
		must(err)
		return creds, string(s)
	}
	accKP, accPub, accJWT := account(true)
	resolver := &server.MemAccResolver{}
	must(resolver.Store(accPub, accJWT))
	_, sysPub, sysJWT := account(false)
	must(resolver.Store(sysPub, sysJWT))
	creds, seed := user(accKP)
	otherKP, _, _ := account(true) // never stored: the server rejects its users
	otherCreds, _ := user(otherKP)
	dir := t.TempDir()
	credsFile := filepath.Join(dir, "hubsync.creds")
	must(os.WriteFile(credsFile, creds, 0o600))
	other := filepath.Join(dir, "unknown.creds")
	must(os.WriteFile(other, otherCreds, 0o600))
	return jwtAuth{operator: op, resolver: resolver, system: sysPub, credsFile: credsFile, userSeed: seed, otherAccount: other}
}

// TestExternalNATSConnectionOptions runs the bus against servers that
// require TLS with a client certificate, an NKey, or a JWT credentials
// file: with the right configuration it publishes; with the wrong one it
// stays disconnected, says why in its log without any secret, and keeps
// the changes buffered.
func TestExternalNATSConnectionOptions(t *testing.T) {
	certs := newPKI(t)
	nkeyUser, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	nkeyPub, _ := nkeyUser.PublicKey()
	nkeySeed, _ := nkeyUser.Seed()
	dir := t.TempDir()
	seedFile := filepath.Join(dir, "user.nk")
	if err := os.WriteFile(seedFile, nkeySeed, 0o600); err != nil {
		t.Fatal(err)
	}
	otherUser, _ := nkeys.CreateUser()
	otherSeed, _ := otherUser.Seed()
	otherSeedFile := filepath.Join(dir, "other.nk")
	if err := os.WriteFile(otherSeedFile, otherSeed, 0o600); err != nil {
		t.Fatal(err)
	}
	auth := newJWTAuth(t)
	rotatedCreds := filepath.Join(dir, "rotated.creds")

	tests := []struct {
		name    string
		server  func(*server.Options)
		scheme  string
		bus     func(*config.Bus)
		works   bool
		reason  string   // a regexp the warning matches when it does not work
		fix     func()   // if set, makes it work: the bus must then catch up
		secrets []string // must never be logged
	}{
		{
			name:   "TLS with a client certificate",
			server: func(o *server.Options) { o.TLSConfig, o.TLSVerify, o.TLSTimeout = certs.server, true, 2 },
			scheme: "tls",
			bus: func(b *config.Bus) {
				b.TLS = config.BusTLS{CAFile: certs.caFile, CertFile: certs.certFile, KeyFile: certs.keyFile}
			},
			works: true,
		},
		{
			name:   "TLS without the client certificate the server requires",
			server: func(o *server.Options) { o.TLSConfig, o.TLSVerify, o.TLSTimeout = certs.server, true, 2 },
			scheme: "tls",
			bus:    func(b *config.Bus) { b.TLS = config.BusTLS{CAFile: certs.caFile} },
			// With TLS 1.3 the client may only see the server hang up.
			reason: "certificate required|broken pipe|connection reset by peer",
		},
		{
			name:   "TLS with a CA that did not sign the server",
			server: func(o *server.Options) { o.TLSConfig, o.TLSVerify, o.TLSTimeout = certs.server, true, 2 },
			scheme: "tls",
			bus: func(b *config.Bus) {
				other := newPKI(t)
				b.TLS = config.BusTLS{CAFile: other.caFile, CertFile: certs.certFile, KeyFile: certs.keyFile}
			},
			reason: "certificate signed by unknown authority",
		},
		{
			name:   "requireTLS over nats:// to a server that offers TLS",
			server: func(o *server.Options) { o.TLSConfig, o.TLSVerify, o.TLSTimeout = certs.server, true, 2 },
			scheme: "nats",
			bus: func(b *config.Bus) {
				b.RequireTLS = true
				b.TLS = config.BusTLS{CAFile: certs.caFile, CertFile: certs.certFile, KeyFile: certs.keyFile}
			},
			works: true,
		},
		{
			name:   "requireTLS to a server without TLS: nothing is sent in clear text",
			server: func(o *server.Options) { o.Username, o.Password = "hubsync", "pl41n-pw" },
			scheme: "nats",
			bus: func(b *config.Bus) {
				b.RequireTLS = true
				b.URLs[0] = strings.Replace(b.URLs[0], "nats://", "nats://hubsync:pl41n-pw@", 1)
			},
			reason:  "secure connection not available",
			secrets: []string{"pl41n-pw"},
		},
		{
			name:    "NKey",
			server:  func(o *server.Options) { o.Nkeys = []*server.NkeyUser{{Nkey: nkeyPub}} },
			scheme:  "nats",
			bus:     func(b *config.Bus) { b.NKeySeedFile = seedFile },
			works:   true,
			secrets: []string{string(nkeySeed)},
		},
		{
			name:    "NKey the server does not know",
			server:  func(o *server.Options) { o.Nkeys = []*server.NkeyUser{{Nkey: nkeyPub}} },
			scheme:  "nats",
			bus:     func(b *config.Bus) { b.NKeySeedFile = otherSeedFile },
			reason:  "Authorization Violation",
			secrets: []string{string(otherSeed)},
		},
		{
			name: "JWT credentials file",
			server: func(o *server.Options) {
				o.TrustedOperators, o.AccountResolver, o.SystemAccount = []*jwt.OperatorClaims{auth.operator}, auth.resolver, auth.system
			},
			scheme:  "nats",
			bus:     func(b *config.Bus) { b.CredsFile = auth.credsFile },
			works:   true,
			secrets: []string{auth.userSeed},
		},
		{
			name: "credentials of an account the server does not trust",
			server: func(o *server.Options) {
				o.TrustedOperators, o.AccountResolver, o.SystemAccount = []*jwt.OperatorClaims{auth.operator}, auth.resolver, auth.system
			},
			scheme: "nats",
			bus: func(b *config.Bus) {
				copyFile(t, auth.otherAccount, rotatedCreds)
				b.CredsFile = rotatedCreds
			},
			reason:  "Authorization Violation",
			fix:     func() { copyFile(t, auth.credsFile, rotatedCreds) }, // the file is read at every attempt
			secrets: []string{auth.userSeed},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := runServer(t, t.TempDir(), 0, tt.server)
			cfg := busConfig(t)
			cfg.URLs = []string{fmt.Sprintf("%s://%s", tt.scheme, s.Addr().String())}
			tt.bus(&cfg)
			logs := &fleet.LogBuffer{}
			log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
			bus, err := New(cfg, "hubsync/test", log, nil)
			if err != nil {
				t.Fatal(err)
			}
			bus.reconnectWait, bus.reconnectJitter = 50*time.Millisecond, 10*time.Millisecond
			f, err := stream.NewFanout(log, nil)
			if err != nil {
				t.Fatal(err)
			}
			opts := bus.ConsumerOptions()
			opts.RetryBase, opts.RetryMax = 10*time.Millisecond, 100*time.Millisecond
			if err := f.Add(opts, bus); err != nil {
				t.Fatal(err)
			}
			b := &testBus{Bus: bus, f: f}
			t.Cleanup(func() { _ = b.Close() })
			start(t, b, nil)
			for i := range 3 {
				b.Notify(streamtest.Profile(stream.ProfileCreated, "team-a", fmt.Sprintf("c%d", i), "1"))
			}
			if tt.works {
				flush(t, b)
				if got := s.JetStreamNumAccounts(); got < 1 {
					t.Errorf("no JetStream account in use")
				}
				if got := value(b.m.published.WithLabelValues(stream.ProfileCreated)); got != 3 {
					t.Errorf("published %v events, want 3", got)
				}
			} else {
				re := regexp.MustCompile(tt.reason)
				eventually(t, "a warning saying "+tt.reason, func() bool { return re.MatchString(logs.String()) })
				if value(b.m.connected) != 0 {
					t.Fatal("connected with the wrong credentials")
				}
				if got := b.depth(); got != 3 {
					t.Errorf("%d changes buffered, want 3", got)
				}
				if tt.fix != nil {
					tt.fix()
					flush(t, b)
					if got := value(b.m.published.WithLabelValues(stream.ProfileCreated)); got != 3 {
						t.Errorf("after the fix: published %v events, want 3", got)
					}
				}
			}
			for _, secret := range tt.secrets {
				if strings.Contains(logs.String(), secret) {
					t.Errorf("the log holds a secret:\n%s", logs.String())
				}
			}
			if t.Failed() {
				t.Logf("log:\n%s", logs.String())
			}
		})
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	data, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestEmbeddedTLSAndToken: an embedded server with TLS, client
// certificates and a token refuses consumers that lack any of them, while
// hubsync's own in-process connection publishes.
func TestEmbeddedTLSAndToken(t *testing.T) {
	certs := newPKI(t)
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("t0ken-4-consumers\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := busConfig(t)
	cfg.Embedded.TLS = config.BusEmbeddedTLS{CertFile: certs.serverCert, KeyFile: certs.serverKey, ClientCAFile: certs.caFile}
	cfg.Embedded.AuthTokenFile = tokenFile
	b, _ := newBus(t, cfg)
	start(t, b, nil)
	b.Notify(streamtest.Profile(stream.ProfileCreated, "team-a", "c1", "1"))
	flush(t, b)
	if got := value(b.m.published.WithLabelValues(stream.ProfileCreated)); got != 1 {
		t.Fatalf("published %v events in-process, want 1", got)
	}
	url := b.ClientURL()
	if !strings.HasPrefix(url, "tls://127.0.0.1:") {
		t.Fatalf("ClientURL = %s, want tls://127.0.0.1:port", url)
	}
	plain := "nats://" + strings.TrimPrefix(url, "tls://")
	tests := []struct {
		name  string
		url   string
		opts  []nats.Option
		works bool
	}{
		{name: "plain, no token", url: plain},
		{name: "plain, token", url: plain, opts: []nats.Option{nats.Token("t0ken-4-consumers")}},
		{name: "TLS without a client certificate", url: url, opts: []nats.Option{nats.RootCAs(certs.caFile), nats.Token("t0ken-4-consumers")}},
		{name: "mutual TLS without the token", url: url, opts: []nats.Option{nats.RootCAs(certs.caFile), nats.ClientCert(certs.certFile, certs.keyFile)}},
		{name: "mutual TLS, wrong token", url: url, opts: []nats.Option{nats.RootCAs(certs.caFile), nats.ClientCert(certs.certFile, certs.keyFile), nats.Token("guess")}},
		{name: "mutual TLS and the token", url: url, opts: []nats.Option{nats.RootCAs(certs.caFile), nats.ClientCert(certs.certFile, certs.keyFile), nats.Token("t0ken-4-consumers")}, works: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			nc, err := nats.Connect(tt.url, append(tt.opts, nats.Timeout(2*time.Second))...)
			if !tt.works {
				if err == nil {
					nc.Close()
					t.Fatal("connected")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			js, err := jetstream.New(nc)
			if err != nil {
				t.Fatal(err)
			}
			// The local consumer's copy has the event once the server has
			// sourced it.
			eventually(t, "the event in the consumer's copy", func() bool {
				return len((&client{js: js}).messages(t, cfg.Stream.Name)) == 1
			})
		})
	}
}

// hostAddress is an address of this machine that is not loopback, or ""
// when it has none.
func hostAddress(t *testing.T) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() && !n.IP.IsLinkLocalUnicast() {
			return n.IP.String()
		}
	}
	return ""
}

// TestAnonymousClientsOffThisHostAreRefused: an embedded server listening
// on every address with TLS, without a token or client CA (the chart's
// default), lets a client without credentials in only over loopback (the
// pod itself, kubectl port-forward); from another address a client signs
// in with a consumer's NKey or is refused.
func TestAnonymousClientsOffThisHostAreRefused(t *testing.T) {
	host := hostAddress(t)
	if host == "" {
		t.Skip("this machine has no address but loopback")
	}
	certs := newPKI(t)
	key := newConsumerKey(t)
	port := freePorts(t, 1)[0]
	cfg := busConfig(t)
	cfg.Embedded.Listen = fmt.Sprintf("0.0.0.0:%d", port)
	cfg.Embedded.TLS = config.BusEmbeddedTLS{CertFile: certs.serverCert, KeyFile: certs.serverKey}
	cfg.Consumers = []config.BusConsumer{{Name: "app", NKeys: []string{key.pub}}}
	b, _ := newBus(t, cfg)
	start(t, b, nil)
	// The certificate names 127.0.0.1 only: what is tested here is who
	// may sign in, not the server's name.
	anyName := nats.Secure(&tls.Config{InsecureSkipVerify: true}) //nolint:gosec // the test checks authentication, not the certificate's names
	tests := []struct {
		name  string
		host  string
		opts  []nats.Option
		works bool
	}{
		{name: "loopback, no credentials", host: "127.0.0.1", works: true},
		{name: "another address, no credentials", host: host},
		{name: "another address, a made-up token", host: host, opts: []nats.Option{nats.Token("guess")}},
		{name: "another address, a user and password", host: host, opts: []nats.Option{nats.UserInfo("hubsync", "guess")}},
		{name: "another address, the consumer's NKey", host: host, opts: []nats.Option{nats.Nkey(key.pub, key.kp.Sign)}, works: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			url := fmt.Sprintf("tls://%s:%d", tt.host, port)
			nc, err := nats.Connect(url, append(tt.opts, anyName, nats.NoReconnect(), nats.Timeout(2*time.Second))...)
			if !tt.works {
				if err == nil {
					nc.Close()
					t.Fatal("connected")
				}
				if !strings.Contains(err.Error(), "Authorization Violation") {
					t.Fatalf("refused, but not for its credentials: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			if err := nc.Flush(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestEmbeddedDataDirUnusable: a data directory hubsync cannot make (the
// default under /var/lib, run outside a pod) is refused at once, naming
// the key and what to do, instead of a server that never becomes ready.
func TestEmbeddedDataDirUnusable(t *testing.T) {
	file := filepath.Join(t.TempDir(), "a-file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := busConfig(t)
	cfg.Embedded.DataDir = filepath.Join(file, "nats")
	_, _, err := startEmbedded(cfg, nil, slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), "bus.embedded.dataDir") || !strings.Contains(err.Error(), "set bus.embedded.dataDir to a directory this user may write") {
		t.Fatalf("startEmbedded: %v; want the key and the fix", err)
	}
}
