package bus

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/hubsync/hubsync/config"
)

// dataDirHint says what to do about a data directory hubsync cannot use,
// which is what a first run outside a pod meets (the default is under
// /var/lib).
const dataDirHint = "; set bus.embedded.dataDir to a directory this user may write (outside a pod, for example one under your home directory)"

// startEmbedded runs an in-process nats-server with JetStream on
// bus.embedded.dataDir, with the accounts of bus's layout, listening on
// bus.embedded.listen for consumers (port 0 picks a free port), and
// returns it with the URL a local client can use. auth decides who its
// clients are, what they may do and in which account.
func startEmbedded(bus config.Bus, auth *embeddedAuth, log *slog.Logger) (*server.Server, string, error) {
	cfg := bus.Embedded
	if cfg.DataDir == "" {
		return nil, "", errors.New("embedded NATS needs bus.embedded.dataDir")
	}
	// nats-server only logs a data directory it cannot use, and then never
	// becomes ready: check it first for a clear, immediate error.
	if err := os.MkdirAll(cfg.DataDir, 0o750); err != nil {
		return nil, "", fmt.Errorf("embedded NATS data directory (bus.embedded.dataDir): %w%s", err, dataDirHint)
	}
	probe, err := os.CreateTemp(cfg.DataDir, ".hubsync-probe-*")
	if err != nil {
		return nil, "", fmt.Errorf("embedded NATS data directory (bus.embedded.dataDir) is not writable: %w%s", err, dataDirHint)
	}
	_ = probe.Close()
	_ = os.Remove(probe.Name())
	opts, scheme, err := serverOptions(bus, auth)
	if err != nil {
		return nil, "", err
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, "", fmt.Errorf("embedded NATS: %w", err)
	}
	auth.setServer(srv)
	logger := &serverLog{log: log.With("component", "nats-server")}
	// The server formats its debug lines only when they will be kept.
	srv.SetLoggerV2(logger, logger.log.Enabled(context.Background(), slog.LevelDebug), false, false)
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		return nil, "", fmt.Errorf("embedded NATS on %s not ready after 10s%s", cfg.Listen, logger.fatalSuffix())
	}
	if !srv.JetStreamEnabled() {
		srv.Shutdown()
		return nil, "", fmt.Errorf("embedded NATS: JetStream did not start on %s%s", cfg.DataDir, logger.fatalSuffix())
	}
	l := layoutOf(bus)
	for _, c := range l.Consumers {
		if err := l.Register(srv, c); err != nil {
			srv.Shutdown()
			return nil, "", fmt.Errorf("embedded NATS: %w", err)
		}
	}
	addr, ok := srv.Addr().(*net.TCPAddr)
	if !ok {
		srv.Shutdown()
		return nil, "", fmt.Errorf("embedded NATS: unexpected listener address %v", srv.Addr())
	}
	if addr.IP.IsUnspecified() {
		// Listening on every interface; a local consumer uses loopback.
		addr = &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: addr.Port}
	}
	return srv, scheme + "://" + addr.String(), nil
}

// serverOptions are the embedded server's options for bus, at start and
// on a reload: its listener (port 0 picks a free port) and TLS, the
// accounts of bus's layout, JetStream on bus.embedded.dataDir, and auth,
// which puts every client in its account; and the scheme of its URL. No
// monitoring, cluster, gateway or leaf listeners: a local bus only.
func serverOptions(bus config.Bus, auth *embeddedAuth) (*server.Options, string, error) {
	cfg := bus.Embedded
	host, portText, err := net.SplitHostPort(cfg.Listen)
	if err != nil {
		return nil, "", fmt.Errorf("embedded NATS listen address %q: %w", cfg.Listen, err)
	}
	port, err := strconv.Atoi(portText)
	if err != nil || port < 0 || port > 65535 {
		return nil, "", fmt.Errorf("embedded NATS listen address %q: bad port", cfg.Listen)
	}
	if port == 0 {
		// nats-server reads 0 as "the default port 4222"; -1 is "any free port".
		port = server.RANDOM_PORT
	}
	accounts, err := layoutOf(bus).ServerConfig()
	if err != nil {
		return nil, "", fmt.Errorf("embedded NATS accounts: %w", err)
	}
	opts := &server.Options{}
	if err := opts.ProcessConfigString(string(accounts)); err != nil {
		return nil, "", fmt.Errorf("embedded NATS accounts: %w", err)
	}
	opts.ServerName = "hubsync-embedded"
	opts.Host, opts.Port = host, port
	opts.JetStream, opts.StoreDir = true, cfg.DataDir
	opts.NoSigs = true
	opts.CustomClientAuthentication = auth
	// Consumers sign in with NKeys: the server must send a nonce to sign.
	opts.AlwaysEnableNonce = true
	scheme := "nats"
	if cfg.TLS.CertFile != "" {
		tc, err := server.GenTLSConfig(&server.TLSConfigOpts{
			CertFile: cfg.TLS.CertFile, KeyFile: cfg.TLS.KeyFile,
			CaFile: cfg.TLS.ClientCAFile, Verify: cfg.TLS.ClientCAFile != "",
		})
		if err != nil {
			return nil, "", fmt.Errorf("embedded NATS TLS: %w", err)
		}
		opts.TLSConfig, opts.TLS, opts.TLSVerify = tc, true, cfg.TLS.ClientCAFile != ""
		opts.TLSTimeout = 2
		scheme = "tls"
	}
	if err := clusterOptions(opts, cfg.Cluster); err != nil {
		return nil, "", err
	}
	return opts, scheme, nil
}

// clusterOptions joins the server to the cluster of c, when c names one:
// routes to the listed nodes over mutual TLS, JetStream clustered under
// the node's stable name. Peers are never told of each other's addresses
// (no advertising): every node dials the listed routes, whose host names
// the certificates name, never an IP address learned from another node.
func clusterOptions(opts *server.Options, c config.BusCluster) error {
	if c.Name == "" {
		return nil
	}
	host, portText, err := net.SplitHostPort(c.Listen)
	if err != nil {
		return fmt.Errorf("embedded NATS cluster listen address %q: %w", c.Listen, err)
	}
	port, err := strconv.Atoi(portText)
	if err != nil || port < 0 || port > 65535 {
		return fmt.Errorf("embedded NATS cluster listen address %q: bad port", c.Listen)
	}
	name := c.ServerName
	if name == "" {
		if name, err = os.Hostname(); err != nil {
			return fmt.Errorf("embedded NATS cluster: this node's name (bus.embedded.cluster.serverName, or the host name): %w", err)
		}
	}
	tc, err := server.GenTLSConfig(&server.TLSConfigOpts{
		CertFile: c.TLS.CertFile, KeyFile: c.TLS.KeyFile, CaFile: c.TLS.CAFile, Verify: true,
	})
	if err != nil {
		return fmt.Errorf("embedded NATS cluster TLS: %w", err)
	}
	opts.ServerName = name
	opts.Cluster.Name, opts.Cluster.Host, opts.Cluster.Port = c.Name, host, port
	opts.Cluster.NoAdvertise = true
	// As nats-server does for a configuration file's cluster TLS: both
	// sides verify, each node being the other's client.
	tc.ClientAuth = tls.RequireAndVerifyClientCert
	tc.RootCAs = tc.ClientCAs
	opts.Cluster.TLSConfig, opts.Cluster.TLSTimeout = tc, 2
	opts.Routes = server.RoutesFromStr(strings.Join(c.Routes, ","))
	return nil
}

// readToken reads a token file, trimmed; the error never holds the token.
func readToken(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("embedded NATS auth token file: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("embedded NATS auth token file %s is empty", path)
	}
	return tok, nil
}

// serverLog sends nats-server's logs to slog: routine lines at debug,
// warnings and errors at their level. It remembers the last fatal error,
// which would otherwise only be logged.
type serverLog struct {
	log   *slog.Logger
	mu    sync.Mutex
	fatal string
}

func (l *serverLog) Noticef(format string, v ...any) { l.debug(format, v...) }
func (l *serverLog) Debugf(format string, v ...any)  { l.debug(format, v...) }
func (l *serverLog) Tracef(format string, v ...any)  { l.debug(format, v...) }

func (l *serverLog) debug(format string, v ...any) {
	if l.log.Enabled(context.Background(), slog.LevelDebug) {
		l.log.Debug(fmt.Sprintf(format, v...))
	}
}
func (l *serverLog) Warnf(format string, v ...any) { l.log.Warn(fmt.Sprintf(format, v...)) }

// Errorf logs at error level, except the server's refusals of a client
// (a wrong credential, a consumer publishing): those are the client's
// errors, logged as warnings. The server never puts the password or
// token in them.
func (l *serverLog) Errorf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	for _, refusal := range []string{"authentication error", "Publish Violation", "Subscription Violation"} {
		if strings.Contains(msg, refusal) {
			l.log.Warn("refused a NATS client: " + msg)
			return
		}
	}
	l.log.Error(msg)
}

func (l *serverLog) Fatalf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	l.mu.Lock()
	l.fatal = msg
	l.mu.Unlock()
	l.log.Error(msg)
}

func (l *serverLog) fatalSuffix() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.fatal == "" {
		return ""
	}
	return ": " + l.fatal
}
