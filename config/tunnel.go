package config

import (
	"fmt"
	"net"
	"strings"
	"text/template"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Tunnel transports.
const (
	TunnelKonnectivity = "konnectivity"
	TunnelDirect       = "direct"
)

// TunnelTransports are the values of tunnel.transport.
var TunnelTransports = []string{TunnelKonnectivity, TunnelDirect}

// Tunnel configures the warm tunnel pool: one long-lived connection per
// managed cluster hubsync serves (a cluster with a ClusterProfile in any
// consumer namespace, or matching ClusterSelector). Off by default.
// Changes take effect at the next start.
type Tunnel struct {
	// Enabled turns the pool on.
	Enabled bool `json:"enabled,omitempty"`
	// Transport is konnectivity (default: through the hub's
	// proxy-server, as OCM cluster-proxy deploys it) or direct (the
	// cluster's own API server URL and CA from its ManagedCluster).
	Transport string `json:"transport,omitempty"`
	// Konnectivity says how to reach the proxy-server.
	Konnectivity Konnectivity `json:"konnectivity"`
	// ManagedServiceAccount names the ManagedServiceAccount whose token
	// (the hub Secret <cluster>/<name>) authenticates probes and the
	// pool's requests; empty (or its Secret missing): probes are HTTP/2
	// PINGs, since kube-apiserver closes an HTTP/2 connection after an
	// anonymous request. The gateway impersonates hub users
	// with it, so while the tunnel is on it is never copied to consumers
	// (whatever its labels) and no sink may name it.
	ManagedServiceAccount string `json:"managedServiceAccount,omitempty"`
	// ClusterSelector adds clusters that have no profile; nil adds none.
	ClusterSelector *metav1.LabelSelector `json:"clusterSelector,omitempty"`
	// ServerName overrides the name verified in the API server's
	// certificate (default kubernetes.default.svc through konnectivity,
	// the URL's host when direct).
	ServerName string `json:"serverName,omitempty"`
	// ProbePath is fetched with GET to probe each entry. Default /version.
	ProbePath string `json:"probePath,omitempty"`
	// ProbeInterval between probes of a ready entry (±20% jitter).
	// Default 10s.
	ProbeInterval metav1.Duration `json:"probeInterval,omitempty"`
	// ProbeTimeout bounds one probe. Default 5s.
	ProbeTimeout metav1.Duration `json:"probeTimeout,omitempty"`
	// DialTimeout bounds one dial with its TLS handshake. Default 10s.
	DialTimeout metav1.Duration `json:"dialTimeout,omitempty"`
	// Backoff bounds the exponential backoff between failed dials of one
	// entry. Defaults 1s and 30s.
	Backoff Retry `json:"backoff"`
	// MaxConcurrentDials bounds the dials in progress across the pool.
	// Default 32.
	MaxConcurrentDials int `json:"maxConcurrentDials,omitempty"`
	// MaxConcurrentUpgradeDials bounds the dials of upgraded
	// connections (exec, attach, port-forward through the gateway) in
	// progress, apart from maxConcurrentDials, so that a flood of
	// upgrades never keeps a failing cluster from reconnecting. Default 16.
	MaxConcurrentUpgradeDials int `json:"maxConcurrentUpgradeDials,omitempty"`
	// MaxConnectionsPerCluster bounds each cluster's connections: one,
	// plus overflow connections while every stream of the others is busy
	// (long watches). Default 4.
	MaxConnectionsPerCluster int `json:"maxConnectionsPerCluster,omitempty"`
	// Warm says when an entry is dialed: "all" (default) keeps every
	// served cluster warm on every replica; "onDemand" dials a cluster
	// at its first request and closes its entry after IdleTimeout without
	// one, so a replica's memory follows the clusters in use rather than
	// the fleet (for fleets of many thousands).
	Warm string `json:"warm,omitempty"`
	// IdleTimeout is how long an entry dialed on demand lives without a
	// request. Default 10m; only with warm: onDemand.
	IdleTimeout metav1.Duration `json:"idleTimeout,omitempty"`
	// WarmupTimeout bounds how long a starting replica waits for its
	// entries to leave "connecting" (ready or failing) before it reports
	// ready for gateway traffic anyway, so that a few unreachable
	// clusters never keep it unready. Default 30s.
	WarmupTimeout metav1.Duration `json:"warmupTimeout,omitempty"`
}

// Tunnel warm modes.
const (
	WarmAll      = "all"
	WarmOnDemand = "onDemand"
)

// WarmModes are the values of tunnel.warm.
var WarmModes = []string{WarmAll, WarmOnDemand}

// Konnectivity is the hub's konnectivity proxy-server, in gRPC mode with
// mutual TLS.
type Konnectivity struct {
	// Address is the proxy-server's client address, host:port (port 8090
	// in cluster-proxy's deployment).
	Address string `json:"address,omitempty"`
	// CAFile verifies the proxy-server; CertFile and KeyFile are
	// hubsync's client certificate. Read again at a dial a second or more
	// after the last read: new connections use rotated files.
	CAFile   string `json:"caFile,omitempty"`
	CertFile string `json:"certFile,omitempty"`
	KeyFile  string `json:"keyFile,omitempty"`
	// ServerName is the name in the proxy-server's certificate; default
	// the host of Address.
	ServerName string `json:"serverName,omitempty"`
	// DialAddress is the template of the address each cluster is dialed
	// at through the tunnel: default cluster-proxy's "{{.ClusterName}}:443"
	// (agents register host=<cluster>). Fields: .ClusterName, .ServerHost
	// (host:port of the ManagedCluster's API server URL) and
	// .ServerHostname.
	DialAddress string `json:"dialAddress,omitempty"`
	// Connections is how many gRPC connections each replica keeps to the
	// proxy-server address: every cluster's tunnel is a stream on one of
	// them (default 4, at most 64). Behind a Service that spreads
	// connections over several proxy-servers, more connections reach
	// more of them; a dial that finds no agent on the ones reached tries
	// new connections.
	Connections int `json:"connections,omitempty"`
	// SingleUse gives each cluster's tunnel a gRPC connection of its own
	// instead (konnectivity-client's single-use tunnel: a TCP connection
	// and TLS handshake per cluster). hubsync also turns to it by itself
	// when the proxy-server refuses several tunnels on one connection.
	SingleUse bool `json:"singleUse,omitempty"`
}

// MaxProxyConnections bounds tunnel.konnectivity.connections.
const MaxProxyConnections = 64

// ImpersonatingMSA is the name of the ManagedServiceAccount whose token
// the tunnel pool and the gateway use on every managed cluster, "" while
// the tunnel is off. The gateway impersonates hub users with it, so it may
// act as anyone there: it is never copied to a consumer nor named by a
// sink.
func (c *Config) ImpersonatingMSA() string {
	if !c.Tunnel.Enabled {
		return ""
	}
	return c.Tunnel.ManagedServiceAccount
}

func (c *Config) validateTunnel() field.ErrorList {
	var errs field.ErrorList
	t := c.Tunnel
	p := field.NewPath("tunnel")
	errs = append(errs, positive(p, named{"probeInterval", t.ProbeInterval}, named{"probeTimeout", t.ProbeTimeout},
		named{"dialTimeout", t.DialTimeout}, named{"backoff.baseDelay", t.Backoff.BaseDelay})...)
	if t.Backoff.MaxDelay.Duration < t.Backoff.BaseDelay.Duration {
		errs = append(errs, field.Invalid(p.Child("backoff", "maxDelay"), t.Backoff.MaxDelay.Duration.String(), "must be at least tunnel.backoff.baseDelay"))
	}
	if t.ProbeTimeout.Duration > t.ProbeInterval.Duration && t.ProbeInterval.Duration > 0 {
		errs = append(errs, field.Invalid(p.Child("probeTimeout"), t.ProbeTimeout.Duration.String(), "must not exceed tunnel.probeInterval"))
	}
	errs = append(errs, between(p.Child("maxConcurrentDials"), t.MaxConcurrentDials, 1, MaxTunnelDials)...)
	errs = append(errs, between(p.Child("maxConcurrentUpgradeDials"), t.MaxConcurrentUpgradeDials, 1, MaxTunnelDials)...)
	errs = append(errs, between(p.Child("maxConnectionsPerCluster"), t.MaxConnectionsPerCluster, 1, MaxTunnelConnsPerCluster)...)
	errs = append(errs, oneOf(p.Child("warm"), t.Warm, WarmModes...)...)
	errs = append(errs, positive(p, named{"idleTimeout", t.IdleTimeout}, named{"warmupTimeout", t.WarmupTimeout})...)
	if !strings.HasPrefix(t.ProbePath, "/") {
		errs = append(errs, field.Invalid(p.Child("probePath"), t.ProbePath, "must start with /"))
	}
	if t.ManagedServiceAccount != "" {
		for _, msg := range validation.IsDNS1123Subdomain(t.ManagedServiceAccount) {
			errs = append(errs, field.Invalid(p.Child("managedServiceAccount"), t.ManagedServiceAccount, msg))
		}
	}
	if t.ClusterSelector != nil {
		if _, err := metav1.LabelSelectorAsSelector(t.ClusterSelector); err != nil {
			errs = append(errs, field.Invalid(p.Child("clusterSelector"), t.ClusterSelector, err.Error()))
		}
	}
	k := p.Child("konnectivity")
	switch t.Transport {
	case TunnelDirect:
	case TunnelKonnectivity:
		if !t.Enabled {
			break
		}
		if t.Konnectivity.Address == "" {
			errs = append(errs, field.Required(k.Child("address"), "the proxy-server's client address (host:port) is required with transport konnectivity"))
		} else if _, _, err := net.SplitHostPort(t.Konnectivity.Address); err != nil {
			errs = append(errs, field.Invalid(k.Child("address"), t.Konnectivity.Address, err.Error()))
		}
		// The proxy-server requires mutual TLS: each missing file is
		// named at its own key.
		for _, f := range []struct{ key, value string }{
			{"caFile", t.Konnectivity.CAFile}, {"certFile", t.Konnectivity.CertFile}, {"keyFile", t.Konnectivity.KeyFile},
		} {
			if f.value == "" {
				errs = append(errs, field.Required(k.Child(f.key), "the proxy-server requires mutual TLS: set caFile, certFile and keyFile"))
			}
		}
	default:
		errs = append(errs, field.NotSupported(p.Child("transport"), t.Transport, TunnelTransports))
	}
	if n := t.Konnectivity.Connections; n < 1 || n > MaxProxyConnections {
		errs = append(errs, field.Invalid(k.Child("connections"), n, fmt.Sprintf("must be 1 to %d", MaxProxyConnections)))
	}
	if err := checkDialAddress(t.Konnectivity.DialAddress); err != nil {
		errs = append(errs, field.Invalid(k.Child("dialAddress"), t.Konnectivity.DialAddress, err.Error()))
	}
	return errs
}

// checkDialAddress renders a dial address template for a sample cluster
// and checks that it makes host:port.
func checkDialAddress(tmpl string) error {
	tp, err := template.New("dialAddress").Option("missingkey=error").Parse(tmpl)
	if err != nil {
		return err
	}
	var b strings.Builder
	sample := struct{ ClusterName, ServerHost, ServerHostname string }{"cluster1", "api.cluster1.example:6443", "api.cluster1.example"}
	if err := tp.Execute(&b, sample); err != nil {
		return fmt.Errorf("%w (fields: .ClusterName, .ServerHost, .ServerHostname)", err)
	}
	if host, port, err := net.SplitHostPort(b.String()); err != nil || host == "" || port == "" {
		return fmt.Errorf("renders %q for cluster1, not host:port", b.String())
	}
	return nil
}
