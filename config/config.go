// Package config holds hubsync's configuration file schema, its defaults and
// its validation.
package config

import (
	"bytes"
	"fmt"
	"net"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"text/template"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// APIVersion and Kind identify the configuration file format.
const (
	APIVersion = "hubsync.io/v1alpha1"
	Kind       = "Config"
)

// Config is the whole configuration file. Every field has a working default,
// so an empty file (or none) is a valid configuration.
type Config struct {
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
}

// BusTLS holds TLS files for an external NATS.
type BusTLS struct {
	CAFile   string `json:"caFile,omitempty"`
	CertFile string `json:"certFile,omitempty"`
	KeyFile  string `json:"keyFile,omitempty"`
}

// BusStream configures the JetStream stream.
type BusStream struct {
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
	// Listen is host:port for consumers. Without AuthTokenFile a consumer
	// needs no credential, so a non-loopback address is refused without
	// TLS and client authentication. On loopback anything in the pod (or
	// reaching it with kubectl port-forward) may read the events.
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
}

// BusEmbeddedTLS holds the embedded server's TLS files.
type BusEmbeddedTLS struct {
	CertFile     string `json:"certFile,omitempty"`
	KeyFile      string `json:"keyFile,omitempty"`
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
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Key       string `json:"key,omitempty"`
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
	BaseDelay metav1.Duration `json:"baseDelay,omitempty"`
	MaxDelay  metav1.Duration `json:"maxDelay,omitempty"`
}

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
	Enabled       bool            `json:"enabled,omitempty"`
	Namespace     string          `json:"namespace,omitempty"`
	Name          string          `json:"name,omitempty"`
	LeaseDuration metav1.Duration `json:"leaseDuration,omitempty"`
	RenewDeadline metav1.Duration `json:"renewDeadline,omitempty"`
	RetryPeriod   metav1.Duration `json:"retryPeriod,omitempty"`
}

// Default values.
const (
	DefaultClusterManager = "open-cluster-management"
	DefaultQPS            = -1 // no client-side limit: the API server's Priority and Fairness paces hubsync
	DefaultBurst          = 400
	DefaultTimeout        = 30 * time.Second
	DefaultTopologyWorker = 16
	DefaultResyncPeriod   = 10 * time.Minute
	DefaultRetryBase      = 100 * time.Millisecond
	DefaultRetryMax       = 5 * time.Minute
	DefaultLogLevel       = "info"
	DefaultLogFormat      = "text"
	DefaultServerAddress  = ":8080"
	ServerOff             = "disabled"
	DefaultLeaseNamespace = "open-cluster-management-hub"
	DefaultLeaseName      = "hubsync"

	DefaultCredentialWorkers = 16
	DefaultCoalesce          = 100 * time.Millisecond
	// DefaultBatchWindow and MaxBatchWindow bound bus.batchWindow.
	DefaultBatchWindow = 10 * time.Millisecond
	MaxBatchWindow     = time.Second
	// DefaultBusYieldMax and MaxBusYieldMax bound bus.yieldMax.
	DefaultBusYieldMax = time.Minute
	MaxBusYieldMax     = 10 * time.Minute
)

// Default returns a configuration with every default filled in.
func Default() *Config {
	c := &Config{}
	c.SetDefaults()
	return c
}

// SetDefaults fills every unset field with its default.
func (c *Config) SetDefaults() {
	setStr := func(p *string, v string) {
		if *p == "" {
			*p = v
		}
	}
	setDur := func(p *metav1.Duration, v time.Duration) {
		if p.Duration == 0 {
			p.Duration = v
		}
	}
	setStr(&c.APIVersion, APIVersion)
	setStr(&c.Kind, Kind)
	setStr(&c.ClusterManager, DefaultClusterManager)
	if c.Hub.QPS == 0 {
		c.Hub.QPS = DefaultQPS
	}
	if c.Hub.Burst == 0 {
		c.Hub.Burst = DefaultBurst
	}
	setDur(&c.Hub.Timeout, DefaultTimeout)
	if c.Workers.Topology == 0 {
		c.Workers.Topology = DefaultTopologyWorker
	}
	setDur(&c.ResyncPeriod, DefaultResyncPeriod)
	setDur(&c.Retry.BaseDelay, DefaultRetryBase)
	setDur(&c.Retry.MaxDelay, DefaultRetryMax)
	setStr(&c.Logging.Level, DefaultLogLevel)
	setStr(&c.Logging.Format, DefaultLogFormat)
	setStr(&c.Server.Address, DefaultServerAddress)
	setStr(&c.LeaderElection.Namespace, DefaultLeaseNamespace)
	setStr(&c.LeaderElection.Name, DefaultLeaseName)
	setDur(&c.LeaderElection.LeaseDuration, 15*time.Second)
	setDur(&c.LeaderElection.RenewDeadline, 10*time.Second)
	setDur(&c.LeaderElection.RetryPeriod, 2*time.Second)
	for i := range c.AccessProviders {
		p := &c.AccessProviders[i]
		setStr(&p.Type, ProviderServer)
		if p.CASecret != nil {
			setStr(&p.CASecret.Key, "tls.crt")
		}
	}
	b := &c.Bus
	setStr(&b.SubjectPrefix, "hubsync")
	setStr(&b.Stream.Name, "HUBSYNC_EVENTS")
	setDur(&b.Stream.MaxAge, 7*24*time.Hour)
	setDur(&b.Stream.DuplicateWindow, 2*time.Minute)
	if b.Stream.Replicas == 0 {
		b.Stream.Replicas = 1
	}
	setStr(&b.KVBucket, "hubsync-access")
	if b.BufferSize == 0 {
		b.BufferSize = 10000
	}
	if b.BatchWindow == nil {
		b.BatchWindow = &metav1.Duration{Duration: DefaultBatchWindow}
	}
	if b.YieldMax == nil {
		b.YieldMax = &metav1.Duration{Duration: DefaultBusYieldMax}
	}
	setStr(&b.Embedded.Listen, "127.0.0.1:4222")
	setStr(&b.Embedded.DataDir, "/var/lib/hubsync/nats")
	if c.Credentials.Workers == 0 {
		c.Credentials.Workers = DefaultCredentialWorkers
	}
	if c.Credentials.Coalesce.Duration == 0 {
		c.Credentials.Coalesce.Duration = DefaultCoalesce
	}
	c.setSinkDefaults()
	c.setTunnelDefaults()
	c.setGatewayDefaults()
}

// Load reads, defaults and validates a configuration file. The error lists
// every problem found, each with its field path.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	return Parse(data)
}

// Parse decodes a configuration document strictly (unknown keys are
// errors), fills in defaults and validates it.
func Parse(data []byte) (*Config, error) {
	c := &Config{}
	var unknown field.ErrorList
	if len(bytes.TrimSpace(data)) > 0 {
		js, err := yaml.YAMLToJSONStrict(data)
		if err != nil {
			return nil, fmt.Errorf("parse config: %w", err)
		}
		// Strict decoding reports every unknown or duplicated key, not just
		// the first, while still decoding the rest for validation.
		strict, err := sigsjson.UnmarshalStrict(js, c, sigsjson.DisallowUnknownFields)
		if err != nil {
			return nil, fmt.Errorf("parse config: %w", err)
		}
		for _, e := range strict {
			unknown = append(unknown, strictError(e))
		}
	}
	// Defaults replace only zero values, so an explicit negative number is
	// still there for Validate to report.
	c.SetDefaults()
	errs := append(unknown, c.validate()...)
	if len(errs) > 0 {
		return nil, errs.ToAggregate()
	}
	return c, nil
}

func (c *Config) validateRaw() field.ErrorList {
	var errs field.ErrorList
	neg := func(p *field.Path, v float64) {
		if v < 0 {
			errs = append(errs, field.Invalid(p, v, "must not be negative"))
		}
	}
	negDur := func(p *field.Path, d metav1.Duration) {
		if d.Duration < 0 {
			errs = append(errs, field.Invalid(p, d.Duration.String(), "must not be negative"))
		}
	}
	if c.Hub.QPS < 0 && c.Hub.QPS != -1 {
		errs = append(errs, field.Invalid(field.NewPath("hub", "qps"), c.Hub.QPS, "must be positive, or -1 for no client-side limit"))
	}
	neg(field.NewPath("hub", "burst"), float64(c.Hub.Burst))
	negDur(field.NewPath("hub", "timeout"), c.Hub.Timeout)
	neg(field.NewPath("workers", "topology"), float64(c.Workers.Topology))
	negDur(field.NewPath("resyncPeriod"), c.ResyncPeriod)
	negDur(field.NewPath("retry", "baseDelay"), c.Retry.BaseDelay)
	negDur(field.NewPath("retry", "maxDelay"), c.Retry.MaxDelay)
	le := field.NewPath("leaderElection")
	negDur(le.Child("leaseDuration"), c.LeaderElection.LeaseDuration)
	negDur(le.Child("renewDeadline"), c.LeaderElection.RenewDeadline)
	negDur(le.Child("retryPeriod"), c.LeaderElection.RetryPeriod)
	neg(field.NewPath("credentials", "workers"), float64(c.Credentials.Workers))
	negDur(field.NewPath("credentials", "coalesce"), c.Credentials.Coalesce)
	return errs
}

// Validate checks a defaulted configuration and returns every problem at
// once as a field.ErrorList aggregate, or nil.
func (c *Config) Validate() error {
	return c.validate().ToAggregate()
}

func (c *Config) validate() field.ErrorList {
	errs := c.validateRaw()
	if c.APIVersion != APIVersion {
		errs = append(errs, field.NotSupported(field.NewPath("apiVersion"), c.APIVersion, []string{APIVersion}))
	}
	if c.Kind != Kind {
		errs = append(errs, field.NotSupported(field.NewPath("kind"), c.Kind, []string{Kind}))
	}
	for _, msg := range validation.IsValidLabelValue(c.ClusterManager) {
		errs = append(errs, field.Invalid(field.NewPath("clusterManager"), c.ClusterManager, msg))
	}
	if float64(c.Hub.Burst) < float64(c.Hub.QPS) {
		errs = append(errs, field.Invalid(field.NewPath("hub", "burst"), c.Hub.Burst, "must be at least hub.qps"))
	}
	if c.Workers.Topology > 1024 {
		errs = append(errs, field.Invalid(field.NewPath("workers", "topology"), c.Workers.Topology, "must be at most 1024"))
	}
	if c.ResyncPeriod.Duration < time.Minute {
		errs = append(errs, field.Invalid(field.NewPath("resyncPeriod"), c.ResyncPeriod.Duration.String(), "must be at least 1m"))
	}
	if c.Retry.MaxDelay.Duration < c.Retry.BaseDelay.Duration {
		errs = append(errs, field.Invalid(field.NewPath("retry", "maxDelay"), c.Retry.MaxDelay.Duration.String(), "must be at least retry.baseDelay"))
	}
	switch c.Logging.Level {
	case "debug", "info", "warn", "error":
	default:
		errs = append(errs, field.NotSupported(field.NewPath("logging", "level"), c.Logging.Level, []string{"debug", "info", "warn", "error"}))
	}
	switch c.Logging.Format {
	case "text", "json":
	default:
		errs = append(errs, field.NotSupported(field.NewPath("logging", "format"), c.Logging.Format, []string{"text", "json"}))
	}
	if c.Server.Address != ServerOff {
		if err := validateHostPort(c.Server.Address); err != nil {
			errs = append(errs, field.Invalid(field.NewPath("server", "address"), c.Server.Address, err.Error()))
		}
	}
	if c.Hub.Kubeconfig != "" {
		if _, err := os.Stat(c.Hub.Kubeconfig); err != nil {
			errs = append(errs, field.Invalid(field.NewPath("hub", "kubeconfig"), c.Hub.Kubeconfig, fmt.Sprintf("cannot read: %v", err)))
		}
	}
	le := field.NewPath("leaderElection")
	if c.LeaderElection.Enabled {
		for _, msg := range validation.IsDNS1123Label(c.LeaderElection.Namespace) {
			errs = append(errs, field.Invalid(le.Child("namespace"), c.LeaderElection.Namespace, msg))
		}
		for _, msg := range validation.IsDNS1123Subdomain(c.LeaderElection.Name) {
			errs = append(errs, field.Invalid(le.Child("name"), c.LeaderElection.Name, msg))
		}
		l := c.LeaderElection
		if l.LeaseDuration.Duration <= l.RenewDeadline.Duration {
			errs = append(errs, field.Invalid(le.Child("leaseDuration"), l.LeaseDuration.Duration.String(), "must be greater than leaderElection.renewDeadline"))
		}
		if l.RenewDeadline.Duration <= l.RetryPeriod.Duration {
			errs = append(errs, field.Invalid(le.Child("renewDeadline"), l.RenewDeadline.Duration.String(), "must be greater than leaderElection.retryPeriod"))
		}
	}
	errs = append(errs, c.validateAccessProviders()...)
	errs = append(errs, c.validateBus()...)
	errs = append(errs, c.validateTunnel()...)
	errs = append(errs, c.validateGateway()...)
	errs = append(errs, c.validateSinks()...)
	if c.Credentials.Workers > 1024 {
		errs = append(errs, field.Invalid(field.NewPath("credentials", "workers"), c.Credentials.Workers, "must be at most 1024"))
	}
	if c.Credentials.Coalesce.Duration > 10*time.Second {
		errs = append(errs, field.Invalid(field.NewPath("credentials", "coalesce"), c.Credentials.Coalesce.Duration.String(), "must be at most 10s"))
	}
	return errs
}

func (c *Config) validateAccessProviders() field.ErrorList {
	var errs field.ErrorList
	names := map[string]bool{}
	for i, p := range c.AccessProviders {
		path := field.NewPath("accessProviders").Index(i)
		switch {
		case p.Name == "":
			errs = append(errs, field.Required(path.Child("name"), "a provider needs a name"))
		case names[p.Name]:
			errs = append(errs, field.Duplicate(path.Child("name"), p.Name))
		}
		names[p.Name] = true
		switch p.Type {
		case ProviderDirect:
			if p.Server != "" || p.CASecret != nil || p.CAFile != "" {
				errs = append(errs, field.Forbidden(path, "a direct provider takes server and CA from the ManagedCluster; server, caSecret and caFile are not allowed"))
			}
		case ProviderServer, ProviderGateway:
			if p.Type == ProviderGateway && p.Server == "" {
				break // validateGateway says why
			}
			if p.Server == "" {
				errs = append(errs, field.Required(path.Child("server"), "a URL template such as https://proxy:9092/{{.ClusterName}}"))
			} else if _, err := RenderServer(p.Server, "example-cluster"); err != nil {
				errs = append(errs, field.Invalid(path.Child("server"), p.Server, err.Error()))
			}
			if p.CASecret != nil && p.CAFile != "" {
				errs = append(errs, field.Forbidden(path, "caSecret and caFile are mutually exclusive"))
			}
			if s := p.CASecret; s != nil {
				for _, msg := range validation.IsDNS1123Label(s.Namespace) {
					errs = append(errs, field.Invalid(path.Child("caSecret", "namespace"), s.Namespace, msg))
				}
				for _, msg := range validation.IsDNS1123Subdomain(s.Name) {
					errs = append(errs, field.Invalid(path.Child("caSecret", "name"), s.Name, msg))
				}
				for _, msg := range validation.IsConfigMapKey(s.Key) {
					errs = append(errs, field.Invalid(path.Child("caSecret", "key"), s.Key, msg))
				}
			}
			if p.CAFile != "" {
				if _, err := os.ReadFile(p.CAFile); err != nil {
					errs = append(errs, field.Invalid(path.Child("caFile"), p.CAFile, fmt.Sprintf("cannot read: %v", err)))
				}
			}
		default:
			errs = append(errs, field.NotSupported(path.Child("type"), p.Type, []string{ProviderServer, ProviderDirect, ProviderGateway}))
		}
	}
	return errs
}

var subjectToken = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

func (c *Config) validateBus() field.ErrorList {
	var errs field.ErrorList
	b := c.Bus
	path := field.NewPath("bus")
	for i, u := range b.URLs {
		p, err := url.Parse(u)
		switch {
		case err != nil:
			// url's errors quote the URL, credentials included.
			errs = append(errs, field.Invalid(path.Child("urls").Index(i), "<not shown>", "is not a URL"))
		case p.Host == "" || !slices.Contains([]string{"nats", "tls", "ws", "wss"}, p.Scheme):
			errs = append(errs, field.Invalid(path.Child("urls").Index(i), RedactURL(u), "must be nats://, tls://, ws:// or wss:// host:port"))
		}
	}
	readable := func(p *field.Path, file string) {
		if file == "" {
			return
		}
		if _, err := os.ReadFile(file); err != nil {
			errs = append(errs, field.Invalid(p, file, fmt.Sprintf("cannot read: %v", err)))
		}
	}
	readable(path.Child("credsFile"), b.CredsFile)
	readable(path.Child("nkeySeedFile"), b.NKeySeedFile)
	readable(path.Child("tls", "caFile"), b.TLS.CAFile)
	readable(path.Child("tls", "certFile"), b.TLS.CertFile)
	readable(path.Child("tls", "keyFile"), b.TLS.KeyFile)
	if b.CredsFile != "" && b.NKeySeedFile != "" {
		errs = append(errs, field.Forbidden(path, "credsFile and nkeySeedFile are mutually exclusive"))
	}
	if (b.TLS.CertFile == "") != (b.TLS.KeyFile == "") {
		errs = append(errs, field.Required(path.Child("tls"), "certFile and keyFile go together"))
	}
	if len(b.URLs) == 0 && (b.CredsFile != "" || b.NKeySeedFile != "" || b.TLS != (BusTLS{}) || b.RequireTLS) {
		errs = append(errs, field.Forbidden(path, "credsFile, nkeySeedFile, tls and requireTLS apply to an external NATS: set bus.urls"))
	}
	if b.RequireTLS {
		for i, u := range b.URLs {
			if p, err := url.Parse(u); err == nil && p.Scheme == "ws" {
				errs = append(errs, field.Invalid(path.Child("urls").Index(i), RedactURL(u), "requireTLS: ws:// cannot carry TLS; use wss://"))
			}
		}
	}
	for _, prefix := range strings.Split(b.SubjectPrefix, ".") {
		if !subjectToken.MatchString(prefix) {
			errs = append(errs, field.Invalid(path.Child("subjectPrefix"), b.SubjectPrefix, "must be dot-separated tokens of letters, digits, - and _"))
			break
		}
	}
	if !subjectToken.MatchString(b.Stream.Name) {
		errs = append(errs, field.Invalid(path.Child("stream", "name"), b.Stream.Name, "must be letters, digits, - and _"))
	}
	if !subjectToken.MatchString(b.KVBucket) {
		errs = append(errs, field.Invalid(path.Child("kvBucket"), b.KVBucket, "must be letters, digits, - and _"))
	}
	if b.Stream.MaxBytes < 0 {
		errs = append(errs, field.Invalid(path.Child("stream", "maxBytes"), b.Stream.MaxBytes, "must not be negative (0 is unlimited)"))
	}
	if b.Stream.Replicas < 1 || b.Stream.Replicas > 5 {
		errs = append(errs, field.Invalid(path.Child("stream", "replicas"), b.Stream.Replicas, "must be 1 to 5"))
	}
	if b.Stream.DuplicateWindow.Duration < 0 || b.Stream.MaxAge.Duration < 0 {
		errs = append(errs, field.Invalid(path.Child("stream"), "", "durations must not be negative"))
	}
	if b.BufferSize < 0 {
		errs = append(errs, field.Invalid(path.Child("bufferSize"), b.BufferSize, "must not be negative"))
	}
	if w := b.BatchWindow; w != nil && (w.Duration < 0 || w.Duration > MaxBatchWindow) {
		errs = append(errs, field.Invalid(path.Child("batchWindow"), w.Duration.String(), fmt.Sprintf("must be 0 to %s", MaxBatchWindow)))
	}
	if y := b.YieldMax; y != nil && (y.Duration < 0 || y.Duration > MaxBusYieldMax) {
		errs = append(errs, field.Invalid(path.Child("yieldMax"), y.Duration.String(), fmt.Sprintf("must be 0 (never hold events) to %s", MaxBusYieldMax)))
	}
	e := b.Embedded
	ep := path.Child("embedded")
	if len(b.URLs) == 0 {
		if err := validateHostPort(e.Listen); err != nil {
			errs = append(errs, field.Invalid(ep.Child("listen"), e.Listen, err.Error()))
		} else if !IsLoopback(e.Listen) && (e.TLS.CertFile == "" || !e.ClientAuth()) {
			errs = append(errs, field.Forbidden(ep.Child("listen"), fmt.Sprintf(
				"%q is not a loopback address: the embedded NATS server would serve every event to anyone who can reach it; "+
					"set bus.embedded.tls (certFile, keyFile) and client authentication (tls.clientCAFile or authTokenFile), or listen on 127.0.0.1", e.Listen)))
		}
		readable(ep.Child("tls", "certFile"), e.TLS.CertFile)
		readable(ep.Child("tls", "keyFile"), e.TLS.KeyFile)
		readable(ep.Child("tls", "clientCAFile"), e.TLS.ClientCAFile)
		readable(ep.Child("authTokenFile"), e.AuthTokenFile)
		if (e.TLS.CertFile == "") != (e.TLS.KeyFile == "") {
			errs = append(errs, field.Required(ep.Child("tls"), "certFile and keyFile go together"))
		}
		if e.TLS.ClientCAFile != "" && e.TLS.CertFile == "" {
			errs = append(errs, field.Required(ep.Child("tls", "certFile"), "clientCAFile needs the server's own certFile and keyFile"))
		}
		if e.AuthTokenFile != "" {
			if tok, err := os.ReadFile(e.AuthTokenFile); err == nil && len(strings.TrimSpace(string(tok))) == 0 {
				errs = append(errs, field.Invalid(ep.Child("authTokenFile"), e.AuthTokenFile, "is empty"))
			}
		}
	} else if e.TLS != (BusEmbeddedTLS{}) || e.AuthTokenFile != "" {
		errs = append(errs, field.Forbidden(ep, "tls and authTokenFile apply to the embedded server, which does not run when bus.urls is set"))
	}
	return errs
}

// Warnings lists settings that are valid but probably unsafe. They never
// contain credentials.
func (c *Config) Warnings() []string {
	out := c.gatewayWarnings()
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

// strictError turns a strict-decoding error such as
// `unknown field "hub.qsp"` into a field error with that path.
func strictError(err error) *field.Error {
	msg := err.Error()
	for _, prefix := range []string{"unknown field ", "duplicate field "} {
		if rest, ok := strings.CutPrefix(msg, prefix); ok {
			if path, uerr := strconv.Unquote(rest); uerr == nil {
				return field.Forbidden(field.NewPath(path), strings.TrimSpace(prefix))
			}
		}
	}
	return field.Invalid(field.NewPath(""), nil, msg)
}

func validateHostPort(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("port %q is not a number from 0 to 65535", port)
	}
	return nil
}
