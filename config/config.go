// Package config holds hubsync's configuration file schema, its defaults and
// its validation.
//
// Owns: the schema, every default (defaults.go, defined once: the packages
// that receive options never fill them again), pure validation with field
// paths (validate.go) and the file checks made at load (files.go). May
// import stream and hub only.
package config

import (
	"fmt"
	"net"
	"net/url"
	"strings"
	"text/template"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// APIVersion and Kind identify the configuration file format.
const (
	APIVersion = "hubsync.io/v1alpha1"
	Kind       = "Config"
)

// Config is the whole configuration file. Every field has a working default,
// so an empty file (or none) is a valid configuration.
type Config struct {
	// APIVersion and Kind identify the file's format, hubsync.io/v1alpha1
	// Config (the defaults).
	APIVersion string `json:"apiVersion,omitempty"`
	Kind       string `json:"kind,omitempty"`

	// Hub says how to reach the hub's API server.
	Hub Hub `json:"hub"`
	// ClusterManager is the name written to every ClusterProfile's
	// x-k8s.io/cluster-manager label and spec.clusterManager.name. Profiles
	// carrying another value are never touched.
	ClusterManager string `json:"clusterManager,omitempty"`
	// Workers sets how many keys each reconciler works on at once.
	Workers Workers `json:"workers"`
	// ResyncPeriod is how often every informer replays its cache so that the
	// reconcilers re-check everything; events do the real work, this repairs
	// anything missed.
	ResyncPeriod metav1.Duration `json:"resyncPeriod,omitempty"`
	// Retry bounds the per-key exponential backoff after a failed sync.
	Retry Retry `json:"retry"`
	// Logging sets the log level and format.
	Logging Logging `json:"logging"`
	// Server is the HTTP endpoint for /metrics, /healthz and /readyz.
	Server Server `json:"server"`
	// LeaderElection lets several replicas run with one active.
	LeaderElection LeaderElection `json:"leaderElection"`
	// AccessProviders are written into every profile's
	// status.accessProviders; entries under other names are left alone.
	AccessProviders []AccessProvider `json:"accessProviders,omitempty"`
	// Credentials configures the copies of ManagedServiceAccount tokens
	// into consumer namespaces.
	Credentials Credentials `json:"credentials"`
	// Bus configures the NATS event bus, which is the sink named "nats".
	Bus Bus `json:"bus"`
	// Sinks are the other targets every change is delivered to. They can
	// be added, changed and removed while hubsync runs (see Reloadable).
	Sinks []Sink `json:"sinks,omitempty"`
	// Tunnel configures the warm per-cluster tunnel pool.
	Tunnel Tunnel `json:"tunnel"`
	// Gateway configures the access gateway, served over the tunnel pool.
	Gateway Gateway `json:"gateway"`
	// ForeignWriters sets how long hubsync leaves alone an object that
	// another controller keeps writing too.
	ForeignWriters ForeignWriters `json:"foreignWriters"`
}

// Bus configures where cluster-access events go: an external NATS, or,
// when URLs is empty, an embedded nats-server with JetStream.
type Bus struct {
	// Enabled turns events on. Default true.
	Enabled *bool `json:"enabled,omitempty"`
	// URLs of an external NATS cluster (nats:// or tls://); empty starts the
	// embedded server.
	URLs []string `json:"urls,omitempty"`
	// CredsFile is a NATS user credentials file (JWT + NKey seed).
	CredsFile string `json:"credsFile,omitempty"`
	// NKeySeedFile is a file holding an NKey user seed.
	NKeySeedFile string `json:"nkeySeedFile,omitempty"`
	// TLS to the external NATS.
	TLS BusTLS `json:"tls"`
	// RequireTLS refuses any connection to the external NATS that is not
	// TLS: nats:// URLs must be upgraded by the server, ws:// is refused.
	RequireTLS bool `json:"requireTLS,omitempty"`
	// SubjectPrefix starts every subject: <prefix>.<namespace>.<cluster>.<kind>.
	SubjectPrefix string `json:"subjectPrefix,omitempty"`
	// Stream is the JetStream stream that keeps events for replay.
	Stream BusStream `json:"stream"`
	// KVBucket is the JetStream key-value bucket of current access records.
	KVBucket string `json:"kvBucket,omitempty"`
	// BufferSize bounds the events waiting while NATS is unreachable;
	// beyond it events are dropped (counted) and the current state is
	// republished on reconnect.
	BufferSize int `json:"bufferSize,omitempty"`
	// BatchWindow is how long the publisher waits, while changes come
	// less than a window apart, for more to join the first; a batch is
	// published pipelined and acknowledged together, which costs far less
	// CPU than one round trip per change. A change after a quiet spell is
	// published at once. It bounds the latency it adds. 0 publishes each
	// change at once. Default 10ms.
	BatchWindow *metav1.Duration `json:"batchWindow,omitempty"`
	// YieldMax holds events while the syncer converges a burst (its initial
	// sync, a fleet-wide change: eight or more keys waiting), for at most
	// this long, so that the hub's profiles and copies are written first
	// and their events follow at once, in large batches. At most half of
	// BufferSize changes are held: beyond, they are published as they come,
	// so a large burst is never dropped. A single change is never held. 0
	// publishes every change as it happens. Default 1m.
	YieldMax *metav1.Duration `json:"yieldMax,omitempty"`
	// Embedded configures the in-process server used when URLs is empty.
	Embedded BusEmbedded `json:"embedded"`
	// Consumers are the applications that read the bus with credentials
	// of their own. Each reads, in a NATS account of its own, copies of
	// the events and records of its namespaces that the server keeps; it
	// cannot publish, change or erase anything, nor see another
	// application's consumers or deliveries. Adding, changing or removing
	// one takes effect on the embedded server without a restart.
	Consumers []BusConsumer `json:"consumers,omitempty"`
}

// BusConsumer is an application that reads the bus with credentials of its
// own.
type BusConsumer struct {
	// Name of the application: 1 to 63 lowercase letters, digits and '-';
	// its NATS account is HUBSYNC_CONSUMER_<name>. "local" is the
	// embedded server's consumer without credentials.
	Name string `json:"name"`
	// NKeys are the public NKeys (U...) of the application's users: each
	// signs in with the matching seed (nats.go's nats.NkeyOptionFromSeed,
	// the nats CLI's --nkey, hubsync events --nkey). hubsync nkey makes a
	// pair.
	NKeys []string `json:"nkeys"`
	// Namespaces are those whose events and records the application
	// reads; empty: every namespace.
	Namespaces []string `json:"namespaces,omitempty"`
}

// LocalConsumer names the embedded server's consumer without credentials:
// any client on its loopback listener (or with bus.embedded.authTokenFile's
// token).
const LocalConsumer = "local"

// BusTLS holds TLS files for an external NATS.
type BusTLS struct {
	// CAFile verifies the NATS servers; CertFile and KeyFile are hubsync's
	// client certificate.
	CAFile   string `json:"caFile,omitempty"`
	CertFile string `json:"certFile,omitempty"`
	KeyFile  string `json:"keyFile,omitempty"`
}

// BusStream configures the JetStream stream.
type BusStream struct {
	// Name of the stream (file storage).
	Name string `json:"name,omitempty"`
	// MaxAge is how long events are kept for replay.
	MaxAge metav1.Duration `json:"maxAge,omitempty"`
	// MaxBytes bounds the stream's size; 0 means unlimited.
	MaxBytes int64 `json:"maxBytes,omitempty"`
	// DuplicateWindow is how long JetStream remembers event ids to drop a
	// re-published change.
	DuplicateWindow metav1.Duration `json:"duplicateWindow,omitempty"`
	// Replicas for a clustered external NATS.
	Replicas int `json:"replicas,omitempty"`
}

// BusEmbedded configures the embedded nats-server. hubsync itself talks
// to it in-process, as the only client that may write: it publishes the
// events and owns the stream and the KV bucket. The listener is for
// consumers, which may only read: subscribe to the events, replay them
// and read or watch the bucket through consumers of their own.
type BusEmbedded struct {
	// Listen is host:port for consumers. A non-loopback address needs TLS.
	// Applications sign in with their NKeys (bus.consumers); a client
	// without one is the local consumer, let in with the token
	// (AuthTokenFile) if one is set, else only over loopback (the pod
	// itself, kubectl port-forward) or with a client certificate that
	// ClientCAFile verifies.
	Listen string `json:"listen,omitempty"`
	// DataDir holds JetStream's files.
	DataDir string `json:"dataDir,omitempty"`
	// TLS serves consumers over TLS; ClientCAFile also requires a client
	// certificate signed by that CA (authentication).
	TLS BusEmbeddedTLS `json:"tls"`
	// AuthTokenFile holds a token every consumer must present (as a NATS
	// token: nats://<token>@host:port, or hubsync events --token-file). It
	// grants reading only; it is read at start.
	AuthTokenFile string `json:"authTokenFile,omitempty"`
	// Cluster joins the embedded servers of several hubsync replicas into
	// one JetStream cluster, so that the stream and the bucket (at
	// bus.stream.replicas) outlive the loss of a replica, whichever one
	// leads. Empty: a single node.
	Cluster BusCluster `json:"cluster"`
}

// BusCluster configures the routes between the embedded servers of
// hubsync's replicas: NATS's own clustering (routes, JetStream's Raft).
type BusCluster struct {
	// Name of the cluster, the same on every node. Setting it turns
	// clustering on.
	Name string `json:"name,omitempty"`
	// Listen is host:port for the other nodes' routes.
	Listen string `json:"listen,omitempty"`
	// Routes are the nodes' route URLs (nats://host:port), this node's own
	// among them or not; each node finds the rest through them.
	Routes []string `json:"routes,omitempty"`
	// ServerName names this node, unique in the cluster and the same
	// across its restarts: JetStream's peers know each other by it.
	// Default: the host name, which is a StatefulSet pod's name.
	ServerName string `json:"serverName,omitempty"`
	// TLS between the nodes, required: mutual, every node's certificate
	// signed by CAFile. Routes carry every event and record.
	TLS BusClusterTLS `json:"tls"`
}

// BusClusterTLS holds the files of the routes' mutual TLS.
type BusClusterTLS struct {
	// CertFile and KeyFile are this node's certificate and key, for both
	// ends of a route: it names the host of every route URL it answers on.
	CertFile string `json:"certFile,omitempty"`
	KeyFile  string `json:"keyFile,omitempty"`
	// CAFile signed every node's certificate.
	CAFile string `json:"caFile,omitempty"`
}

// Clustered reports whether the embedded server joins a cluster.
func (e BusEmbedded) Clustered() bool { return e.Cluster.Name != "" }

// BusEmbeddedTLS holds the embedded server's TLS files.
type BusEmbeddedTLS struct {
	// CertFile and KeyFile are the server's certificate and key.
	CertFile string `json:"certFile,omitempty"`
	KeyFile  string `json:"keyFile,omitempty"`
	// ClientCAFile, if set, requires each consumer to present a client
	// certificate signed by it.
	ClientCAFile string `json:"clientCAFile,omitempty"`
}

// ClientAuth reports whether consumers of the embedded server must
// authenticate (client certificate or token). Authenticated or not, a
// consumer may only read.
func (e BusEmbedded) ClientAuth() bool {
	return e.TLS.ClientCAFile != "" || e.AuthTokenFile != ""
}

// IsLoopback reports whether a host:port listens on loopback only.
func IsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// BusEnabled reports whether events are on.
func (c *Config) BusEnabled() bool { return c.Bus.Enabled == nil || *c.Bus.Enabled }

// Access provider types.
const (
	// ProviderServer: a server URL rendered from a template with the
	// cluster's name, and a CA from a Secret key or a file (for example
	// cluster-proxy's user server).
	ProviderServer = "server"
	// ProviderDirect: the managed cluster's own API server, from the
	// ManagedCluster's spec.managedClusterClientConfigs URL and CA bundle.
	ProviderDirect = "direct"
)

// ProviderTypes are the values of accessProviders[].type.
var ProviderTypes = []string{ProviderServer, ProviderDirect, ProviderGateway}

// AccessProvider tells consumers how to reach a cluster.
type AccessProvider struct {
	// Name of the status.accessProviders entry; consumers match it against
	// their provider file ("open-cluster-management" for cp-creds).
	Name string `json:"name"`
	// Type is "server" (the default), "direct", or "gateway" (hubsync's
	// own access gateway: gateway.url/<cluster> with the gateway's CA;
	// server and CA are filled in from the gateway section).
	Type string `json:"type,omitempty"`
	// Server is a Go text/template rendered with {{.ClusterName}}, e.g.
	// https://cluster-proxy-addon-user.open-cluster-management-addon:9092/{{.ClusterName}}.
	Server string `json:"server,omitempty"`
	// CASecret names a Secret key holding the server's CA bundle (PEM);
	// hubsync watches that one Secret and follows its rotation.
	CASecret *SecretKeyRef `json:"caSecret,omitempty"`
	// CAFile is a PEM file holding the server's CA bundle, re-read when it
	// changes.
	CAFile string `json:"caFile,omitempty"`
	// ClusterNameExtension adds the client.authentication.k8s.io/exec
	// extension {clusterName: <cluster>} that exec plugins such as
	// `hubsync creds` and cp-creds read. Default true.
	ClusterNameExtension *bool `json:"clusterNameExtension,omitempty"`
}

// SecretKeyRef names one key of one Secret.
type SecretKeyRef struct {
	// Namespace and Name name the Secret on the hub.
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// Key is the key of the Secret's data; each reference has its own
	// default.
	Key string `json:"key,omitempty"`
}

// Credentials configures credential copies.
type Credentials struct {
	// Enabled turns the copying of ManagedServiceAccount tokens on. Default true.
	Enabled *bool `json:"enabled,omitempty"`
	// Workers is the number of (cluster, ManagedServiceAccount) pairs
	// reconciled at once.
	Workers int `json:"workers,omitempty"`
	// Coalesce is the burst window of hub token Secret changes: a change
	// after a quiet spell is written at once; changes that follow it closer
	// than Coalesce are written together once they stop (at most 10×
	// Coalesce after the burst began), so a burst of rotations costs at
	// most two writes per copy.
	Coalesce metav1.Duration `json:"coalesce,omitempty"`
}

// CredentialsEnabled reports whether credential copies are on.
func (c *Config) CredentialsEnabled() bool {
	return c.Credentials.Enabled == nil || *c.Credentials.Enabled
}

// WantsClusterNameExtension reports whether the provider carries the exec
// extension with the cluster's name.
func (p AccessProvider) WantsClusterNameExtension() bool {
	return p.ClusterNameExtension == nil || *p.ClusterNameExtension
}

// Hub is the hub connection.
type Hub struct {
	// Kubeconfig is a kubeconfig file; empty means in-cluster configuration
	// (the --kubeconfig flag overrides it).
	Kubeconfig string `json:"kubeconfig,omitempty"`
	// Context selects a kubeconfig context; empty means the current one.
	Context string `json:"context,omitempty"`
	// QPS and Burst bound the client's request rate. The default, -1, sets
	// no client-side limit: the API server's Priority and Fairness paces
	// hubsync (client-go waits out a 429's Retry-After and retries), so a
	// fresh install runs at the server's pace. A positive value caps it.
	QPS   float32 `json:"qps,omitempty"`
	Burst int     `json:"burst,omitempty"`
	// Timeout bounds each write hubsync sends to the hub (watches are
	// long-lived and not bounded by it).
	Timeout metav1.Duration `json:"timeout,omitempty"`
}

// Workers holds worker counts per reconciler.
type Workers struct {
	// Topology workers each reconcile one cluster's profiles across all
	// consumer namespaces.
	Topology int `json:"topology,omitempty"`
}

// Retry is the per-key backoff after a failed sync.
type Retry struct {
	// BaseDelay is the delay after a first failure; each further failure
	// doubles it, up to MaxDelay.
	BaseDelay metav1.Duration `json:"baseDelay,omitempty"`
	// MaxDelay caps the delay.
	MaxDelay metav1.Duration `json:"maxDelay,omitempty"`
}

// LogLevels and LogFormats are the values of logging.level and
// logging.format.
var (
	LogLevels  = []string{"debug", "info", "warn", "error"}
	LogFormats = []string{"text", "json"}
)

// Logging configures the structured logger.
type Logging struct {
	// Level is one of debug, info, warn, error.
	Level string `json:"level,omitempty"`
	// Format is text or json.
	Format string `json:"format,omitempty"`
}

// Server is the metrics and health endpoint.
type Server struct {
	// Address is host:port for /metrics, /healthz and /readyz; "disabled"
	// turns the endpoint off.
	Address string `json:"address,omitempty"`
	// Pprof serves Go's runtime profiles under /debug/pprof/ on the same
	// endpoint. Off by default: profiles reveal internals and cost CPU
	// while they are taken.
	Pprof bool `json:"pprof,omitempty"`
}

// LeaderElection configures a client-go Lease lock.
type LeaderElection struct {
	// Enabled runs hubsync under a Lease: one replica is active, the
	// others wait to take over.
	Enabled bool `json:"enabled,omitempty"`
	// Namespace and Name name the Lease.
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name,omitempty"`
	// LeaseDuration is how long a Lease not renewed stays held before
	// another replica may take it; it must exceed RenewDeadline.
	LeaseDuration metav1.Duration `json:"leaseDuration,omitempty"`
	// RenewDeadline is how long the active replica tries to renew the
	// Lease before it stops leading; it must exceed RetryPeriod × 1.2.
	RenewDeadline metav1.Duration `json:"renewDeadline,omitempty"`
	// RetryPeriod is the interval between attempts to take or renew the
	// Lease.
	RetryPeriod metav1.Duration `json:"retryPeriod,omitempty"`
}

// Warnings lists settings that are valid but probably unsafe. They never
// contain credentials.
func (c *Config) Warnings() []string {
	out := append(c.gatewayWarnings(), c.kueueWarnings()...)
	if !c.BusEnabled() {
		return out
	}
	for i, u := range c.Bus.URLs {
		p, err := url.Parse(u)
		if err != nil || p.User == nil || c.Bus.RequireTLS {
			continue
		}
		if p.Scheme == "nats" || p.Scheme == "ws" {
			out = append(out, fmt.Sprintf("bus.urls[%d] (%s) carries credentials over %s://, which is not encrypted unless the server insists on TLS; "+
				"use tls:// or wss://, or set bus.requireTLS", i, RedactURL(u), p.Scheme))
		}
	}
	return out
}

// RedactURL hides a URL's user information (user, password or token).
func RedactURL(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return "<unparseable URL>"
	}
	if p.User != nil {
		p.User = url.User("REDACTED")
	}
	return p.String()
}

// RenderServer renders a server URL template for one cluster and checks
// that the result is an absolute https or http URL.
func RenderServer(tmpl, cluster string) (string, error) {
	t, err := template.New("server").Option("missingkey=error").Parse(tmpl)
	if err != nil {
		return "", fmt.Errorf("template: %w", err)
	}
	var b strings.Builder
	if err := t.Execute(&b, struct{ ClusterName string }{cluster}); err != nil {
		return "", fmt.Errorf("template: %w", err)
	}
	u, err := url.Parse(b.String())
	if err != nil {
		return "", fmt.Errorf("rendered URL %q: %w", b.String(), err)
	}
	if (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		return "", fmt.Errorf("rendered URL %q is not an absolute http(s) URL", b.String())
	}
	return b.String(), nil
}
