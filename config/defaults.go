package config

import (
	"path/filepath"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hubsync/hubsync/stream"
)

// Every default of hubsync is written in this file, once: those of the
// configuration file, which SetDefaults fills, and the tunables the file
// does not expose, which the daemon hands to the packages as they are. No
// package below config holds a default of its own: each takes its options
// filled and rejects a missing one, so a default cannot differ between the
// documentation, the configuration and the code that runs.
// testdata/defaults.yaml is the fully defaulted empty configuration.

// Defaults of the top-level sections.
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
	DefaultLeaseDuration  = 15 * time.Second
	DefaultRenewDeadline  = 10 * time.Second
	DefaultRetryPeriod    = 2 * time.Second

	DefaultProviderCAKey     = "tls.crt"
	DefaultCredentialWorkers = 16
	DefaultCoalesce          = 100 * time.Millisecond

	DefaultForeignHoldOff    = 30 * time.Second
	DefaultForeignMaxHoldOff = 10 * time.Minute

	// MaxWorkers bounds workers.topology and credentials.workers.
	MaxWorkers = 1024
)

// Defaults of the bus.
const (
	DefaultSubjectPrefix    = "hubsync"
	DefaultStreamName       = "HUBSYNC_EVENTS"
	DefaultStreamMaxAge     = 7 * 24 * time.Hour
	DefaultStreamDuplicates = 2 * time.Minute
	DefaultStreamReplicas   = 1
	MaxStreamReplicas       = 5
	DefaultKVBucket         = "hubsync-access"
	DefaultEmbeddedListen   = "127.0.0.1:4222"
	DefaultEmbeddedDataDir  = "/var/lib/hubsync/nats"
	DefaultBatchWindow      = 10 * time.Millisecond
	DefaultBusYieldMax      = time.Minute
	MaxBatchWindow          = time.Second
	MaxBusYieldMax          = 10 * time.Minute
	// DefaultBusRetryMax caps the bus's backoff after a failed publish
	// (the other consumers' cap is DefaultConsumerRetryMax); the file does
	// not expose it.
	DefaultBusRetryMax = 5 * time.Second
)

// Defaults of every consumer of the change stream (the bus, the sinks,
// the tunnel pool): ConsumerOptions fills them.
const (
	// DefaultQueueSize is sinks[].queueSize, bus.bufferSize and the tunnel
	// pool's queue.
	DefaultQueueSize         = 10000
	DefaultMaxBatch          = 256
	DefaultConsumerRetryBase = 100 * time.Millisecond
	DefaultConsumerRetryMax  = 30 * time.Second
	DefaultYieldMax          = time.Minute
)

// Defaults of the sinks.
const (
	DefaultExecCommand     = "hubsync"
	DefaultWebhookTimeout  = 10 * time.Second
	DefaultSpoolMaxBytes   = 64 << 20
	DefaultSpoolRoot       = "/var/lib/hubsync/sinks"
	DefaultWebhookSecrets  = "secrets"
	DefaultArgoCDNamespace = "argocd"

	// DefaultArgoCDExecPlugin is argocd.execPlugin: hubsync's own creds.
	DefaultArgoCDExecPlugin = ExecPluginHubsync

	// DefaultWebhookFailingAfter is webhook.failingAfter: long enough
	// for a receiver's restart or rolling update (the backoff tries nine
	// to eleven times in it), short enough that an outage shows within a
	// minute, well before the spool (64 MiB by default) fills.
	DefaultWebhookFailingAfter = time.Minute

	// DefaultWebhookConcurrency is webhook.concurrency: the requests in
	// flight to one endpoint. Sixteen keep pace with a 4000-profile initial
	// sync (about 4200 events, 300 a second on the bench machine) to a
	// receiver 50 ms away: its last event lands within a second of the
	// profiles, where eight lag 14 s behind and one at a time 3.5 minutes
	// (make bench BENCH_FLAGS=--webhook-only). Sixteen requests at once are
	// a light load for any HTTP server.
	DefaultWebhookConcurrency = 16
	// MaxWebhookConcurrency bounds webhook.concurrency.
	MaxWebhookConcurrency = 256

	// The webhook's delivery policy, which the file does not expose: the
	// backoff between attempts at one event, the cap on a Retry-After, and
	// how long signing secrets and the bearer token are used before they
	// are read again.
	DefaultWebhookRetryBase     = 200 * time.Millisecond
	DefaultWebhookRetryMax      = 30 * time.Second
	DefaultWebhookRetryAfterMax = 5 * time.Minute
	DefaultWebhookSecretTTL     = 5 * time.Second
)

// Defaults of the tunnel pool.
const (
	DefaultTunnelProbePath = "/version"
	// DefaultTunnelDialAddress is cluster-proxy's: its agent on each
	// managed cluster registers host=<cluster>, and a Service named
	// <cluster> there points at the API server.
	DefaultTunnelDialAddress   = "{{.ClusterName}}:443"
	DefaultTunnelProbeInterval = 10 * time.Second
	DefaultTunnelProbeTimeout  = 5 * time.Second
	DefaultTunnelDialTimeout   = 10 * time.Second
	DefaultTunnelBackoffBase   = time.Second
	DefaultTunnelBackoffMax    = 30 * time.Second
	DefaultTunnelMaxDials      = 32
	DefaultTunnelUpgradeDials  = 16
	DefaultTunnelMaxConns      = 4
	// DefaultTunnelProxyConns is tunnel.konnectivity.connections.
	DefaultTunnelProxyConns = 4
	// MaxTunnelDials bounds maxConcurrentDials and maxConcurrentUpgradeDials;
	// MaxTunnelConnsPerCluster bounds maxConnectionsPerCluster.
	MaxTunnelDials             = 10000
	MaxTunnelConnsPerCluster   = 64
	DefaultTunnelIdleTimeout   = 10 * time.Minute
	DefaultTunnelWarmupTimeout = 30 * time.Second
	// DefaultTunnelRetireGrace (how long a replaced connection may finish
	// its requests) and DefaultTunnelExtraIdle (how long an overflow
	// connection may stay idle) are not in the file.
	DefaultTunnelRetireGrace = time.Minute
	DefaultTunnelExtraIdle   = time.Minute
)

// Defaults of the gateway.
const (
	DefaultGatewayListen             = ":8443"
	DefaultGatewayReviewCacheTTL     = 10 * time.Second
	DefaultGatewayReviewCacheSize    = 10000
	DefaultGatewayMaxInFlightReviews = 32
	DefaultGatewayRefusalCacheTTL    = 10 * time.Second
	DefaultGatewayRefusalsPerSecond  = 5
	DefaultGatewayRefusalBurst       = 50
	DefaultGatewayHubQPS             = 50
	DefaultGatewayHubBurst           = 100
	DefaultGatewayMaxHeaderBytes     = 64 << 10
	DefaultGatewayReadHeaderTimeout  = 10 * time.Second
	DefaultGatewayBodyTimeout        = time.Minute
	DefaultGatewayIdleTimeout        = 2 * time.Minute
	DefaultGatewayTunnelWait         = 10 * time.Second
	DefaultGatewayDrainDelay         = 5 * time.Second
	DefaultGatewayDrainTimeout       = 20 * time.Second
	// Not in the file: the Retry-After of a 503, and how often the key
	// sets that tell hub tokens from clusters' own are fetched again (on
	// a period, and at most this often for a key id the set lacks).
	DefaultGatewayRetryAfter    = 5 * time.Second
	DefaultGatewayKeyRefresh    = 10 * time.Minute
	DefaultGatewayKeyMinRefetch = 30 * time.Second
)

// Default returns a configuration with every default filled in.
func Default() *Config {
	c := &Config{}
	c.SetDefaults()
	return c
}

// ConsumerOptions returns the change-stream options of a consumer with
// every delivery default filled; the consumer sets its filter and what it
// does differently (the bus its own queue size, batching and backoff).
func ConsumerOptions(name, typ string) stream.Options {
	return stream.Options{
		Name: name, Type: typ,
		QueueSize: DefaultQueueSize, MaxBatch: DefaultMaxBatch,
		RetryBase: DefaultConsumerRetryBase, RetryMax: DefaultConsumerRetryMax,
		YieldMax: DefaultYieldMax,
	}
}

// SetDefaults fills every unset field with its default. Defaults replace
// only zero values, so an explicit negative number is still there for
// Validate to report.
func (c *Config) SetDefaults() {
	setStr(&c.APIVersion, APIVersion)
	setStr(&c.Kind, Kind)
	setStr(&c.ClusterManager, DefaultClusterManager)
	setNum(&c.Hub.QPS, DefaultQPS)
	setNum(&c.Hub.Burst, DefaultBurst)
	setDur(&c.Hub.Timeout, DefaultTimeout)
	setNum(&c.Workers.Topology, DefaultTopologyWorker)
	setDur(&c.ResyncPeriod, DefaultResyncPeriod)
	setDur(&c.Retry.BaseDelay, DefaultRetryBase)
	setDur(&c.Retry.MaxDelay, DefaultRetryMax)
	setStr(&c.Logging.Level, DefaultLogLevel)
	setStr(&c.Logging.Format, DefaultLogFormat)
	setStr(&c.Server.Address, DefaultServerAddress)
	c.LeaderElection.setDefaults()
	for i := range c.AccessProviders {
		p := &c.AccessProviders[i]
		setStr(&p.Type, ProviderServer)
		if p.CASecret != nil {
			setStr(&p.CASecret.Key, DefaultProviderCAKey)
		}
	}
	c.Bus.setDefaults()
	setNum(&c.Credentials.Workers, DefaultCredentialWorkers)
	setDur(&c.Credentials.Coalesce, DefaultCoalesce)
	for i := range c.Sinks {
		c.Sinks[i].SetDefaults()
	}
	c.Tunnel.setDefaults()
	c.Gateway.setDefaults()
	setDur(&c.ForeignWriters.HoldOff, DefaultForeignHoldOff)
	setDur(&c.ForeignWriters.MaxHoldOff, DefaultForeignMaxHoldOff)
	c.completeGatewayProviders()
}

func (l *LeaderElection) setDefaults() {
	setStr(&l.Namespace, DefaultLeaseNamespace)
	setStr(&l.Name, DefaultLeaseName)
	setDur(&l.LeaseDuration, DefaultLeaseDuration)
	setDur(&l.RenewDeadline, DefaultRenewDeadline)
	setDur(&l.RetryPeriod, DefaultRetryPeriod)
}

func (b *Bus) setDefaults() {
	setStr(&b.SubjectPrefix, DefaultSubjectPrefix)
	setStr(&b.Stream.Name, DefaultStreamName)
	setDur(&b.Stream.MaxAge, DefaultStreamMaxAge)
	setDur(&b.Stream.DuplicateWindow, DefaultStreamDuplicates)
	setNum(&b.Stream.Replicas, DefaultStreamReplicas)
	setStr(&b.KVBucket, DefaultKVBucket)
	setNum(&b.BufferSize, DefaultQueueSize)
	// nil, not zero, is unset: 0 turns batching and holding off.
	if b.BatchWindow == nil {
		b.BatchWindow = &metav1.Duration{Duration: DefaultBatchWindow}
	}
	if b.YieldMax == nil {
		b.YieldMax = &metav1.Duration{Duration: DefaultBusYieldMax}
	}
	setStr(&b.Embedded.Listen, DefaultEmbeddedListen)
	setStr(&b.Embedded.DataDir, DefaultEmbeddedDataDir)
}

// SetDefaults fills the sink's unset fields with their defaults (Config.SetDefaults
// calls it for every sink).
func (s *Sink) SetDefaults() {
	setNum(&s.QueueSize, DefaultQueueSize)
	execDefaults := func(auth *string, e *ExecAuth) {
		setStr(auth, AuthExec)
		setStr(&e.Command, DefaultExecCommand)
	}
	if k := s.Kubeconfig; k != nil {
		if k.Consumer == ConsumerKueue {
			// Kueue refuses exec plugins: its files hold the token.
			setStr(&k.Auth, AuthToken)
		}
		execDefaults(&k.Auth, &k.Exec)
	}
	if k := s.Kueue; k != nil {
		k.setDefaults()
	}
	if a := s.ArgoCD; a != nil {
		execDefaults(&a.Auth, &a.Exec)
		setStr(&a.Namespace, DefaultArgoCDNamespace)
		setStr(&a.ExecPlugin, DefaultArgoCDExecPlugin)
	}
	if w := s.Webhook; w != nil {
		setDur(&w.Timeout, DefaultWebhookTimeout)
		setDur(&w.FailingAfter, DefaultWebhookFailingAfter)
		setNum(&w.Concurrency, DefaultWebhookConcurrency)
		setNum(&w.Spool.MaxBytes, DefaultSpoolMaxBytes)
		// Without a name the sink is invalid anyway: Validate says so.
		if s.Name != "" {
			setStr(&w.Spool.Directory, filepath.Join(DefaultSpoolRoot, s.Name))
		}
		if w.SecretRef != nil {
			setStr(&w.SecretRef.Key, DefaultWebhookSecrets)
		}
	}
}

func (t *Tunnel) setDefaults() {
	setStr(&t.Transport, TunnelKonnectivity)
	setStr(&t.ProbePath, DefaultTunnelProbePath)
	setStr(&t.Konnectivity.DialAddress, DefaultTunnelDialAddress)
	setNum(&t.Konnectivity.Connections, DefaultTunnelProxyConns)
	setDur(&t.ProbeInterval, DefaultTunnelProbeInterval)
	setDur(&t.ProbeTimeout, DefaultTunnelProbeTimeout)
	setDur(&t.DialTimeout, DefaultTunnelDialTimeout)
	setDur(&t.Backoff.BaseDelay, DefaultTunnelBackoffBase)
	setDur(&t.Backoff.MaxDelay, DefaultTunnelBackoffMax)
	setNum(&t.MaxConcurrentDials, DefaultTunnelMaxDials)
	setNum(&t.MaxConcurrentUpgradeDials, DefaultTunnelUpgradeDials)
	setNum(&t.MaxConnectionsPerCluster, DefaultTunnelMaxConns)
	setStr(&t.Warm, WarmAll)
	setDur(&t.IdleTimeout, DefaultTunnelIdleTimeout)
	setDur(&t.WarmupTimeout, DefaultTunnelWarmupTimeout)
}

func (g *Gateway) setDefaults() {
	setStr(&g.Listen, DefaultGatewayListen)
	setStr(&g.PassThrough, PassThroughJWT)
	setDur(&g.ReviewCacheTTL, DefaultGatewayReviewCacheTTL)
	setNum(&g.ReviewCacheSize, DefaultGatewayReviewCacheSize)
	setNum(&g.MaxInFlightReviews, DefaultGatewayMaxInFlightReviews)
	setDur(&g.RefusalCacheTTL, DefaultGatewayRefusalCacheTTL)
	setNum(&g.RefusalsPerSecond, DefaultGatewayRefusalsPerSecond)
	setNum(&g.RefusalBurst, DefaultGatewayRefusalBurst)
	setNum(&g.HubQPS, DefaultGatewayHubQPS)
	setNum(&g.HubBurst, DefaultGatewayHubBurst)
	setNum(&g.MaxHeaderBytes, DefaultGatewayMaxHeaderBytes)
	setDur(&g.ReadHeaderTimeout, DefaultGatewayReadHeaderTimeout)
	setDur(&g.BodyTimeout, DefaultGatewayBodyTimeout)
	setDur(&g.IdleTimeout, DefaultGatewayIdleTimeout)
	setDur(&g.TunnelWait, DefaultGatewayTunnelWait)
	if g.Drain.Delay == nil {
		g.Drain.Delay = &metav1.Duration{Duration: DefaultGatewayDrainDelay}
	}
	setDur(&g.Drain.Timeout, DefaultGatewayDrainTimeout)
}

// completeGatewayProviders points each access provider of type gateway at
// <gateway.url>/<cluster> with the gateway's CA; the syncer serves it as
// a server provider.
func (c *Config) completeGatewayProviders() {
	g := c.Gateway
	for i := range c.AccessProviders {
		p := &c.AccessProviders[i]
		if p.Type != ProviderGateway || g.URL == "" {
			continue
		}
		p.Server = strings.TrimRight(g.URL, "/") + "/{{.ClusterName}}"
		p.CAFile, p.CASecret = g.GatewayCA()
	}
}

func setStr(p *string, v string) {
	if *p == "" {
		*p = v
	}
}

func setDur(p *metav1.Duration, v time.Duration) {
	if p.Duration == 0 {
		p.Duration = v
	}
}

func setNum[T int | int64 | float32 | float64](p *T, v T) {
	if *p == 0 {
		*p = v
	}
}
