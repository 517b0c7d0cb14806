package config

import (
	"fmt"
	"net"
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// LeaderElectionJitterFactor is client-go's leaderelection.JitterFactor:
// a renewDeadline of at most retryPeriod times it makes client-go refuse
// the lock (and RunOrDie panic). config does not link client-go, so the
// value is mirrored here and a test pins it to client-go's constant.
const LeaderElectionJitterFactor = 1.2

// Validate checks a defaulted configuration and returns every problem at
// once as a field.ErrorList aggregate, or nil. It reads the struct only,
// never a file: Parse checks the files a loaded configuration names.
func (c *Config) Validate() error {
	return c.validate().ToAggregate()
}

func (c *Config) validate() field.ErrorList {
	errs := c.validateRaw()
	errs = append(errs, c.validateGeneral()...)
	if c.LeaderElection.Enabled {
		errs = append(errs, validateLeaderElection(field.NewPath("leaderElection"), c.LeaderElection)...)
	}
	errs = append(errs, c.validateAccessProviders()...)
	errs = append(errs, c.validateBus()...)
	errs = append(errs, c.validateTunnel()...)
	errs = append(errs, c.validateGateway()...)
	errs = append(errs, c.validateSinks()...)
	errs = append(errs, c.ForeignWriters.validate(field.NewPath("foreignWriters"))...)
	return errs
}

// validateRaw reports negative numbers, which defaulting leaves in place.
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

// validateGeneral checks the small top-level sections.
func (c *Config) validateGeneral() field.ErrorList {
	var errs field.ErrorList
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
	errs = append(errs, atMost(field.NewPath("workers", "topology"), c.Workers.Topology, MaxWorkers)...)
	if c.ResyncPeriod.Duration < time.Minute {
		errs = append(errs, field.Invalid(field.NewPath("resyncPeriod"), c.ResyncPeriod.Duration.String(), "must be at least 1m"))
	}
	if c.Retry.MaxDelay.Duration < c.Retry.BaseDelay.Duration {
		errs = append(errs, field.Invalid(field.NewPath("retry", "maxDelay"), c.Retry.MaxDelay.Duration.String(), "must be at least retry.baseDelay"))
	}
	errs = append(errs, oneOf(field.NewPath("logging", "level"), c.Logging.Level, LogLevels...)...)
	errs = append(errs, oneOf(field.NewPath("logging", "format"), c.Logging.Format, LogFormats...)...)
	if c.Server.Address != ServerOff {
		errs = append(errs, hostPort(field.NewPath("server", "address"), c.Server.Address)...)
	}
	errs = append(errs, atMost(field.NewPath("credentials", "workers"), c.Credentials.Workers, MaxWorkers)...)
	if c.Credentials.Coalesce.Duration > 10*time.Second {
		errs = append(errs, field.Invalid(field.NewPath("credentials", "coalesce"), c.Credentials.Coalesce.Duration.String(), "must be at most 10s"))
	}
	return errs
}

// validateLeaderElection checks what client-go's leader election demands
// of a lock, which it would otherwise refuse only once hubsync runs
// (leaderelection.RunOrDie panics).
func validateLeaderElection(p *field.Path, l LeaderElection) field.ErrorList {
	var errs field.ErrorList
	errs = append(errs, objectRef(p, l.Namespace, l.Name)...)
	lease, renew, retry := l.LeaseDuration.Duration, l.RenewDeadline.Duration, l.RetryPeriod.Duration
	if lease <= renew {
		errs = append(errs, field.Invalid(p.Child("leaseDuration"), lease.String(), "must be greater than leaderElection.renewDeadline"))
	}
	// The same arithmetic as client-go's, so that the two agree on the
	// boundary.
	if jittered := time.Duration(LeaderElectionJitterFactor * float64(retry)); renew <= jittered {
		errs = append(errs, field.Invalid(p.Child("renewDeadline"), renew.String(), fmt.Sprintf(
			"must be greater than leaderElection.retryPeriod × %g (%s): a renewal is retried every retryPeriod with up to %g× jitter",
			LeaderElectionJitterFactor, jittered, LeaderElectionJitterFactor)))
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
			errs = append(errs, validateServerProvider(path, p)...)
		default:
			errs = append(errs, field.NotSupported(path.Child("type"), p.Type, ProviderTypes))
		}
	}
	return errs
}

// validateServerProvider checks a provider that names its server and CA.
func validateServerProvider(path *field.Path, p AccessProvider) field.ErrorList {
	var errs field.ErrorList
	if p.Server == "" {
		errs = append(errs, field.Required(path.Child("server"), "a URL template such as https://proxy:9092/{{.ClusterName}}"))
	} else if _, err := RenderServer(p.Server, "example-cluster"); err != nil {
		errs = append(errs, field.Invalid(path.Child("server"), p.Server, err.Error()))
	}
	if p.CASecret != nil && p.CAFile != "" {
		errs = append(errs, field.Forbidden(path, "caSecret and caFile are mutually exclusive"))
	}
	if s := p.CASecret; s != nil {
		errs = append(errs, objectRef(path.Child("caSecret"), s.Namespace, s.Name)...)
		for _, msg := range validation.IsConfigMapKey(s.Key) {
			errs = append(errs, field.Invalid(path.Child("caSecret", "key"), s.Key, msg))
		}
	}
	return errs
}

// The sub-validators below are shared by the sections.

// objectRef checks a namespaced object's namespace and name.
func objectRef(p *field.Path, namespace, name string) field.ErrorList {
	var errs field.ErrorList
	for _, msg := range validation.IsDNS1123Label(namespace) {
		errs = append(errs, field.Invalid(p.Child("namespace"), namespace, msg))
	}
	for _, msg := range validation.IsDNS1123Subdomain(name) {
		errs = append(errs, field.Invalid(p.Child("name"), name, msg))
	}
	return errs
}

// oneOf checks that v is one of the allowed values.
func oneOf(p *field.Path, v string, allowed ...string) field.ErrorList {
	for _, a := range allowed {
		if v == a {
			return nil
		}
	}
	return field.ErrorList{field.NotSupported(p, v, allowed)}
}

// atMost checks an upper bound.
func atMost(p *field.Path, v, most int) field.ErrorList {
	if v > most {
		return field.ErrorList{field.Invalid(p, v, fmt.Sprintf("must be at most %d", most))}
	}
	return nil
}

// between checks an inclusive range.
func between[T int | int64](p *field.Path, v, lo, hi T) field.ErrorList {
	if v < lo || v > hi {
		return field.ErrorList{field.Invalid(p, v, fmt.Sprintf("must be from %d to %d", lo, hi))}
	}
	return nil
}

// named is a duration with its field name, for positive.
type named struct {
	name string
	d    metav1.Duration
}

// positive checks that durations are above zero.
func positive(p *field.Path, ds ...named) field.ErrorList {
	var errs field.ErrorList
	for _, d := range ds {
		if d.d.Duration <= 0 {
			errs = append(errs, field.Invalid(p.Child(d.name), d.d.Duration.String(), "must be positive"))
		}
	}
	return errs
}

// together checks that two files of a pair (a certificate and its key)
// are set together or not at all.
func together(p *field.Path, a, b string) field.ErrorList {
	if (a == "") != (b == "") {
		return field.ErrorList{field.Required(p, "certFile and keyFile go together")}
	}
	return nil
}

// hostPort checks a listen address.
func hostPort(p *field.Path, addr string) field.ErrorList {
	if err := validateHostPort(addr); err != nil {
		return field.ErrorList{field.Invalid(p, addr, err.Error())}
	}
	return nil
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
