package config

import (
	"net"
	"net/netip"
	"net/url"
	"strings"
	"time"

	"golang.org/x/net/http/httpguts"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Gateway configures the access gateway: an HTTPS server where people and
// apps reach a managed cluster's API at <url>/<cluster>/<kubernetes path>
// through the cluster's warm tunnel. Hub identities are impersonated on
// the managed cluster as cluster:hub:<user> with the tunnel's
// ManagedServiceAccount (tunnel.managedServiceAccount), which must be
// granted impersonation there. Off by default; needs the tunnel pool.
// Changes take effect at the next start.
type Gateway struct {
	// Enabled turns the gateway on.
	Enabled bool `json:"enabled,omitempty"`
	// Listen is the address served. Default ":8443".
	Listen string `json:"listen,omitempty"`
	// URL is the gateway's address as clients reach it (for example
	// https://hubsync-gateway.hubsync.svc:8443), written into access
	// provider entries of type gateway and into `hubsync kubeconfig`.
	URL string `json:"url,omitempty"`
	// TLS is the serving certificate.
	TLS GatewayTLS `json:"tls"`
	// PassThrough says what happens to a token the hub does not
	// recognise: "jwt" (default) lets a managed cluster's own token (a
	// ServiceAccount or ManagedServiceAccount token of that cluster)
	// through to that cluster, to act as itself there, once its
	// signature verifies against the cluster's service-account keys
	// (read from the cluster's /openid/v1/jwks through the tunnel); "none"
	// refuses it. Hub tokens and tokens no key verifies are always
	// refused, by the gateway itself: they never reach a cluster.
	PassThrough string `json:"passThrough,omitempty"`
	// HubIssuers are the issuers of the hub's other JWTs (its OIDC
	// providers and JWT authenticators), whose keys the hub does not
	// publish: a token naming one is answered as a hub token. The hub's
	// service-account tokens are recognised by its signing keys.
	HubIssuers []string `json:"hubIssuers,omitempty"`
	// ForwardGroups, when set, lists the only hub groups impersonated on
	// managed clusters (as cluster:hub:<group>); others are dropped. With
	// it a managed cluster can grant impersonation of exactly those groups
	// by name, since RBAC cannot grant a name prefix. Empty: every group.
	ForwardGroups []string `json:"forwardGroups,omitempty"`
	// ReviewCacheTTL bounds how long a positive TokenReview is trusted:
	// at most, and by default, 10s. Failed reviews are never cached.
	ReviewCacheTTL metav1.Duration `json:"reviewCacheTTL,omitempty"`
	// ReviewCacheSize bounds how many tokens each of the gateway's
	// memories (reviews, verifications, refusals, client addresses)
	// keeps. Default 10000.
	ReviewCacheSize int `json:"reviewCacheSize,omitempty"`
	// MaxInFlightReviews bounds the hub TokenReviews waiting for an
	// answer; a request that needs one beyond it gets 503. Default 32.
	MaxInFlightReviews int `json:"maxInFlightReviews,omitempty"`
	// RefusalCacheTTL is how long a refused token is answered from
	// memory, without asking the hub or the cluster again. Default 10s,
	// at most 1m.
	RefusalCacheTTL metav1.Duration `json:"refusalCacheTTL,omitempty"`
	// RefusalsPerSecond and RefusalBurst are each client address's token
	// bucket of refused requests (every 4xx but 429, and 503): an address
	// that has spent it gets 429 for every request whose token the
	// gateway has not accepted lately for that cluster, before any
	// TokenReview is spent on it. The address is the TCP peer's (an IPv6
	// /64), or the one a trusted front proxy names (ClientAddress).
	// Defaults 5 and 50.
	RefusalsPerSecond float64 `json:"refusalsPerSecond,omitempty"`
	RefusalBurst      int     `json:"refusalBurst,omitempty"`
	// ClientAddress, for a gateway behind a load balancer or proxy that
	// hides client addresses (SNAT), names where the proxy puts them.
	ClientAddress GatewayClientAddress `json:"clientAddress,omitzero"`
	// HubQPS and HubBurst bound the gateway's own hub client (its
	// TokenReviews and key fetches), apart from the syncer's, so that
	// neither can starve the other on the client side. Defaults 50 and
	// 100; -1 lifts the limit (API Priority and Fairness then paces it:
	// deploy/flowcontrol.yaml gives the gateway a priority level of its
	// own).
	HubQPS   float32 `json:"hubQPS,omitempty"`
	HubBurst int     `json:"hubBurst,omitempty"`
	// MaxHeaderBytes bounds a request's headers. Default 64 KiB.
	MaxHeaderBytes int `json:"maxHeaderBytes,omitempty"`
	// ReadHeaderTimeout bounds reading a request's headers. Default 10s.
	ReadHeaderTimeout metav1.Duration `json:"readHeaderTimeout,omitempty"`
	// BodyTimeout bounds reading a request's body. Default 1m.
	BodyTimeout metav1.Duration `json:"bodyTimeout,omitempty"`
	// IdleTimeout closes idle keep-alive connections. Default 2m.
	IdleTimeout metav1.Duration `json:"idleTimeout,omitempty"`
	// TunnelWait bounds how long a request for a cluster whose tunnel is
	// still being dialed waits for it before the gateway answers 503.
	// Default 10s.
	TunnelWait metav1.Duration `json:"tunnelWait,omitempty"`
	// Drain says how the gateway stops (SIGTERM, a rolling update).
	Drain GatewayDrain `json:"drain"`
}

// DelayOrZero is the drain delay (0 when unset).
func (d GatewayDrain) DelayOrZero() time.Duration {
	if d.Delay == nil {
		return 0
	}
	return d.Delay.Duration
}

// GatewayDrain is the gateway's graceful stop. On SIGTERM the replica
// fails readiness at once and keeps serving for Delay, so that load
// balancers and Service endpoints stop sending it new connections; then
// it stops accepting, ends watches and upgraded streams (exec, attach,
// port-forward) cleanly so that clients re-establish them on another
// replica, and lets other requests in flight finish for up to Timeout.
// The Pod's terminationGracePeriodSeconds must exceed Delay + Timeout.
type GatewayDrain struct {
	// Delay is how long the replica keeps serving after it fails
	// readiness. Default 5s; 0 stops at once (outside Kubernetes).
	Delay *metav1.Duration `json:"delay,omitempty"`
	// Timeout bounds how long requests in flight may finish. Default 20s.
	Timeout metav1.Duration `json:"timeout,omitempty"`
}

// GatewayTLS is the gateway's serving certificate: PEM files (reloaded
// when they change) or a kubernetes.io/tls Secret on the hub (followed
// through a watch).
type GatewayTLS struct {
	// CertFile and KeyFile are the certificate and its key, PEM files
	// reloaded when they change.
	CertFile string `json:"certFile,omitempty"`
	KeyFile  string `json:"keyFile,omitempty"`
	// CAFile is the bundle clients verify the gateway with, for access
	// provider entries and generated kubeconfigs; with Secret, its ca.crt
	// key is used when CAFile is empty.
	CAFile string `json:"caFile,omitempty"`
	// Secret names a kubernetes.io/tls Secret on the hub holding the
	// certificate and key, followed through a watch; exclusive with
	// CertFile and KeyFile.
	Secret *ObjectRefName `json:"secret,omitempty"`
}

// ObjectRefName names one namespaced object.
type ObjectRefName struct {
	// Namespace and Name name the object.
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
}

// Gateway pass-through modes, and the access provider type that points at
// the gateway.
const (
	PassThroughJWT  = "jwt"
	PassThroughNone = "none"

	ProviderGateway = "gateway"
)

// PassThroughModes are the values of gateway.passThrough.
var PassThroughModes = []string{PassThroughJWT, PassThroughNone}

// GatewayCA says where a provider entry of type gateway takes the
// gateway's CA from: a file, a Secret key, or neither (the system's roots).
func (g Gateway) GatewayCA() (file string, secret *SecretKeyRef) {
	switch {
	case g.TLS.CAFile != "":
		return g.TLS.CAFile, nil
	case g.TLS.Secret != nil:
		return "", &SecretKeyRef{Namespace: g.TLS.Secret.Namespace, Name: g.TLS.Secret.Name, Key: "ca.crt"}
	}
	return "", nil
}

func (c *Config) validateGateway() field.ErrorList {
	var errs field.ErrorList
	g := c.Gateway
	for i, ap := range c.AccessProviders {
		if ap.Type == ProviderGateway && (!g.Enabled || g.URL == "") {
			errs = append(errs, field.Invalid(field.NewPath("accessProviders").Index(i).Child("type"), ap.Type,
				"a gateway provider needs gateway.enabled and gateway.url"))
		}
	}
	if !g.Enabled {
		return errs
	}
	if !c.Tunnel.Enabled {
		errs = append(errs, field.Required(field.NewPath("tunnel", "enabled"), "the gateway sends every request through the tunnel pool"))
	}
	if c.Tunnel.ManagedServiceAccount == "" {
		errs = append(errs, field.Required(field.NewPath("tunnel", "managedServiceAccount"),
			"the gateway impersonates hub identities with the tunnel's ManagedServiceAccount"))
	}
	p := field.NewPath("gateway")
	errs = append(errs, validateGatewayServing(p, g)...)
	errs = append(errs, validateGatewayTrust(p, g)...)
	errs = append(errs, validateGatewayLimits(p, g)...)
	return errs
}

// validateGatewayServing checks where and how the gateway serves.
func validateGatewayServing(p *field.Path, g Gateway) field.ErrorList {
	var errs field.ErrorList
	if _, _, err := net.SplitHostPort(g.Listen); err != nil {
		errs = append(errs, field.Invalid(p.Child("listen"), g.Listen, err.Error()))
	}
	if g.URL != "" {
		if u, err := url.Parse(g.URL); err != nil || u.Scheme != "https" || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
			errs = append(errs, field.Invalid(p.Child("url"), g.URL, "must be an https:// URL with a host (and an optional path prefix)"))
		}
	}
	t := g.TLS
	tp := p.Child("tls")
	switch {
	case t.Secret != nil && (t.CertFile != "" || t.KeyFile != ""):
		errs = append(errs, field.Forbidden(tp, "secret and certFile/keyFile are mutually exclusive"))
	case t.Secret != nil:
		errs = append(errs, objectRef(tp.Child("secret"), t.Secret.Namespace, t.Secret.Name)...)
	case t.CertFile == "" || t.KeyFile == "":
		errs = append(errs, field.Required(tp, "a serving certificate: certFile and keyFile, or secret"))
	}
	errs = append(errs, between(p.Child("maxHeaderBytes"), g.MaxHeaderBytes, 4096, 1<<20)...)
	errs = append(errs, positive(p, named{"readHeaderTimeout", g.ReadHeaderTimeout}, named{"bodyTimeout", g.BodyTimeout},
		named{"idleTimeout", g.IdleTimeout}, named{"tunnelWait", g.TunnelWait}, named{"drain.timeout", g.Drain.Timeout})...)
	if d := g.Drain.DelayOrZero(); d < 0 || d > 5*time.Minute {
		errs = append(errs, field.Invalid(p.Child("drain", "delay"), d.String(), "must be between 0 and 5m"))
	}
	return errs
}

// validateGatewayTrust checks which tokens the gateway accepts and how
// long it trusts what it learnt of them.
func validateGatewayTrust(p *field.Path, g Gateway) field.ErrorList {
	errs := oneOf(p.Child("passThrough"), g.PassThrough, PassThroughModes...)
	for i, iss := range g.HubIssuers {
		if iss == "" {
			errs = append(errs, field.Invalid(p.Child("hubIssuers").Index(i), iss, "must not be empty"))
		}
	}
	if d := g.ReviewCacheTTL.Duration; d <= 0 || d > 10*time.Second {
		errs = append(errs, field.Invalid(p.Child("reviewCacheTTL"), d.String(), "must be positive and at most 10s: a revoked hub token must stop working quickly"))
	}
	if d := g.RefusalCacheTTL.Duration; d <= 0 || d > time.Minute {
		errs = append(errs, field.Invalid(p.Child("refusalCacheTTL"), d.String(), "must be positive and at most 1m"))
	}
	return errs
}

// GatewayClientAddress tells the gateway which client a request is from
// when a front proxy hides it.
type GatewayClientAddress struct {
	// Header is the header a trusted proxy names the client in:
	// X-Forwarded-For (the rightmost address not itself a trusted proxy)
	// or a header holding one address (X-Real-IP). Empty: the TCP peer.
	Header string `json:"header,omitempty"`
	// TrustedProxies are the networks (CIDR) whose connections may name
	// the client in Header; a connection from anywhere else is keyed by
	// its own address, whatever it sends. Required with Header.
	TrustedProxies []string `json:"trustedProxies,omitempty"`
}

// validateClientAddress checks the trusted proxy's header and networks.
func validateClientAddress(p *field.Path, c GatewayClientAddress) field.ErrorList {
	var errs field.ErrorList
	switch {
	case c.Header == "" && len(c.TrustedProxies) > 0:
		errs = append(errs, field.Required(p.Child("header"), "the header the trusted proxies name the client in"))
	case c.Header != "" && len(c.TrustedProxies) == 0:
		errs = append(errs, field.Required(p.Child("trustedProxies"), "the networks (CIDR) of the proxies trusted to name the client"))
	case c.Header != "" && !httpguts.ValidHeaderFieldName(c.Header):
		errs = append(errs, field.Invalid(p.Child("header"), c.Header, "is not a header name"))
	case identityLike(c.Header):
		errs = append(errs, field.Invalid(p.Child("header"), c.Header, "is a header the API server or a proxy reads an identity from"))
	}
	for i, cidr := range c.TrustedProxies {
		if _, err := netip.ParsePrefix(cidr); err != nil {
			errs = append(errs, field.Invalid(p.Child("trustedProxies").Index(i), cidr, "is not a network in CIDR notation (10.0.0.0/8, fd00::/8)"))
		}
	}
	return errs
}

// identityLike reports a header an identity is read from.
func identityLike(h string) bool {
	l := strings.ToLower(h)
	return l == "authorization" || l == "proxy-authorization" || strings.HasPrefix(l, "impersonate-") ||
		strings.HasPrefix(l, "x-remote-") || strings.HasPrefix(l, "x-auth-request-") || strings.HasPrefix(l, "remote-") ||
		l == "x-forwarded-user" || l == "x-forwarded-groups" || l == "x-forwarded-email"
}

// validateGatewayLimits checks the bounds on the gateway's memory and on
// what it asks of the hub.
func validateGatewayLimits(p *field.Path, g Gateway) field.ErrorList {
	var errs field.ErrorList
	errs = append(errs, between(p.Child("reviewCacheSize"), g.ReviewCacheSize, 1, 1000000)...)
	errs = append(errs, between(p.Child("maxInFlightReviews"), g.MaxInFlightReviews, 1, 10000)...)
	if g.RefusalsPerSecond <= 0 {
		errs = append(errs, field.Invalid(p.Child("refusalsPerSecond"), g.RefusalsPerSecond, "must be positive"))
	}
	if g.RefusalBurst < 1 {
		errs = append(errs, field.Invalid(p.Child("refusalBurst"), g.RefusalBurst, "must be at least 1"))
	}
	errs = append(errs, validateClientAddress(p.Child("clientAddress"), g.ClientAddress)...)
	if g.HubQPS < 0 && g.HubQPS != -1 || g.HubQPS == 0 {
		errs = append(errs, field.Invalid(p.Child("hubQPS"), g.HubQPS, "must be positive, or -1 for no client-side limit"))
	}
	if g.HubBurst < 1 {
		errs = append(errs, field.Invalid(p.Child("hubBurst"), g.HubBurst, "must be at least 1"))
	}
	return errs
}

// gatewayWarnings are the gateway's legal but doubtful settings.
func (c *Config) gatewayWarnings() []string {
	g := c.Gateway
	if !g.Enabled || g.PassThrough != PassThroughJWT || len(g.HubIssuers) > 0 {
		return nil
	}
	return []string{"gateway.passThrough is jwt and gateway.hubIssuers is empty: the gateway tells a hub token from a " +
		"cluster's own by the hub's service-account keys, and cannot do so by signature for the hub's other JWT issuers " +
		"(OIDC providers, JWT authenticators); such tokens never pass through (only a token the target cluster's own keys sign " +
		"does), but list their issuers in gateway.hubIssuers so that they are answered as hub tokens. hubsync logs every issuer " +
		"the hub accepts that the gateway could not identify."}
}
