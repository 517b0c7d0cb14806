package config

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Kueue MultiKueue: the kueue sink's settings, the kubeconfig sink's
// consumer: kueue, and the rules Kueue applies to the kubeconfigs it reads
// (Kueue v0.19, validateKubeconfig: CONTRACTS.md §9).

// SinkKueue is the type of the sink that keeps Kueue's MultiKueueClusters.
const SinkKueue = "kueue"

// Sources of the MultiKueueClusters a kueue sink writes.
const (
	// KueueSourceSecret: each MultiKueueCluster reads a kubeconfig Secret
	// that hubsync writes in Kueue's namespace (token inline). Works with
	// every Kueue that serves kueue.x-k8s.io/v1beta2.
	KueueSourceSecret = "secret"
	// KueueSourceClusterProfile: each MultiKueueCluster names its
	// ClusterProfile (clusterProfileRef), and Kueue builds the client from
	// its own multiKueue.clusterProfile.accessProviders configuration.
	// Needs Kueue's MultiKueueClusterProfile feature gate.
	KueueSourceClusterProfile = "clusterProfile"
)

// KueueSources are the values of kueue.source.
var KueueSources = []string{KueueSourceSecret, KueueSourceClusterProfile}

// ConsumerKueue is kubeconfig.consumer for files Kueue's MultiKueue reads
// (locationType: Path): token auth by default, exec refused.
const ConsumerKueue = "kueue"

// KubeconfigConsumers are the values of kubeconfig.consumer besides none.
var KubeconfigConsumers = []string{ConsumerKueue}

// Defaults and fixed values of Kueue.
const (
	// DefaultKueueNamespace is where Kueue runs by default: its
	// ClusterProfiles, kubeconfig Secrets and configuration live there.
	DefaultKueueNamespace = "kueue-system"
	// KueueKubeconfigDir is the only directory Kueue reads Path
	// kubeconfigs from when its MultiKueueKubeConfigPathValidation gate is
	// on (the default from Kueue v0.20).
	KueueKubeconfigDir = "/etc/multikueue/kubeconfigs"
	// KueueMaxClusters is the most clusters a MultiKueueConfig may list
	// (its CRD's maxItems).
	KueueMaxClusters = 20
)

// KueueSink keeps one MultiKueueCluster per ClusterProfile of Kueue's
// namespace, and optionally a MultiKueueConfig listing them.
type KueueSink struct {
	// Namespace is Kueue's namespace: its ClusterProfiles become
	// MultiKueueClusters and the kubeconfig Secrets go there. Default
	// kueue-system.
	Namespace string `json:"namespace,omitempty"`
	// Source is secret (default) or clusterProfile.
	Source string `json:"source,omitempty"`
	// AccessProvider names the profile's access provider whose server and
	// CA the kubeconfigs use. Source secret only, required there.
	AccessProvider string `json:"accessProvider,omitempty"`
	// ManagedServiceAccount whose synced credential (the copy in Kueue's
	// namespace) the kubeconfigs hold. Source secret only, required there.
	ManagedServiceAccount string `json:"managedServiceAccount,omitempty"`
	// MultiKueueConfig, if set, names a MultiKueueConfig whose
	// spec.clusters the sink keeps equal to the MultiKueueClusters it
	// keeps (created if missing, deleted when none is left).
	MultiKueueConfig string `json:"multiKueueConfig,omitempty"`
	// Labels are added to every object the sink writes.
	Labels map[string]string `json:"labels,omitempty"`
}

// setDefaults fills the kueue section's defaults.
func (k *KueueSink) setDefaults() {
	setStr(&k.Namespace, DefaultKueueNamespace)
	setStr(&k.Source, KueueSourceSecret)
}

// validateKueueSink checks a kueue sink; kueue holds the name of the
// kueue sink validated before it, if any.
func (c *Config) validateKueueSink(path *field.Path, s Sink, kueue *string) field.ErrorList {
	var errs field.ErrorList
	p := path.Child("kueue")
	k := s.Kueue
	// MultiKueueClusters are cluster-scoped and named after the profile:
	// two kueue sinks would write the same objects.
	if *kueue != "" {
		errs = append(errs, field.Duplicate(p, "sink "+*kueue+" is already a kueue sink; MultiKueueClusters are cluster-scoped, so one sink keeps them all"))
	}
	*kueue = s.Name
	for _, msg := range validation.IsDNS1123Label(k.Namespace) {
		errs = append(errs, field.Invalid(p.Child("namespace"), k.Namespace, msg))
	}
	for i, ns := range s.Filter.Namespaces {
		if ns != k.Namespace {
			errs = append(errs, field.Invalid(path.Child("filter", "namespaces").Index(i), ns,
				"a kueue sink sees the ClusterProfiles of Kueue's namespace ("+k.Namespace+") only; leave filter.namespaces out"))
		}
	}
	if k.MultiKueueConfig != "" {
		for _, msg := range validation.IsDNS1123Subdomain(k.MultiKueueConfig) {
			errs = append(errs, field.Invalid(p.Child("multiKueueConfig"), k.MultiKueueConfig, msg))
		}
	}
	errs = append(errs, validateLabels(p.Child("labels"), k.Labels)...)
	switch k.Source {
	case KueueSourceSecret:
		// The Secret holds the token itself: Kueue refuses exec plugins.
		errs = append(errs, c.validateAccess(p, k.AccessProvider, k.ManagedServiceAccount, AuthToken, ExecAuth{})...)
	case KueueSourceClusterProfile:
		why := "source clusterProfile: Kueue builds the client from the profile with its own multiKueue.clusterProfile.accessProviders; only source secret uses it"
		if k.AccessProvider != "" {
			errs = append(errs, field.Forbidden(p.Child("accessProvider"), why))
		}
		if k.ManagedServiceAccount != "" {
			errs = append(errs, field.Forbidden(p.Child("managedServiceAccount"), why))
		}
	default:
		errs = append(errs, field.NotSupported(p.Child("source"), k.Source, KueueSources))
	}
	return errs
}

// validateKubeconfigConsumer checks kubeconfig.consumer.
func validateKubeconfigConsumer(p *field.Path, k *KubeconfigSink) field.ErrorList {
	switch k.Consumer {
	case "":
		return nil
	case ConsumerKueue:
		if k.Auth == AuthExec {
			return field.ErrorList{field.Invalid(p.Child("auth"), k.Auth,
				"consumer kueue: Kueue refuses kubeconfigs that run an exec plugin (the MultiKueueCluster stays inactive, reason InsecureKubeConfig); "+
					"use auth: token (the default for this consumer), or a kueue sink")}
		}
		return nil
	default:
		return field.ErrorList{field.NotSupported(p.Child("consumer"), k.Consumer, KubeconfigConsumers)}
	}
}

// kueueWarnings are the Kueue-related settings that are legal but will
// not work as their author probably means.
func (c *Config) kueueWarnings() []string {
	var out []string
	for i, s := range c.Sinks {
		p := fmt.Sprintf("sinks[%d] (%s)", i, s.Name)
		switch {
		case s.Kueue != nil && s.Kueue.Source == KueueSourceSecret:
			out = append(out, c.kueueServerWarnings(p+".kueue", s.Kueue.AccessProvider)...)
		case s.Kubeconfig != nil && s.Kubeconfig.Consumer == ConsumerKueue:
			k := s.Kubeconfig
			if !underDir(k.Directory, KueueKubeconfigDir) {
				out = append(out, fmt.Sprintf("%s.kubeconfig.directory %s is not under %s/: Kueue reads Path kubeconfigs only from there "+
					"when its MultiKueueKubeConfigPathValidation feature gate is on (the default from Kueue v0.20); "+
					"mount the directory there in Kueue's pod, or use a kueue sink (Secrets)", p, k.Directory, KueueKubeconfigDir))
			}
			out = append(out, c.kueueServerWarnings(p+".kubeconfig", k.AccessProvider)...)
		case s.Kubeconfig != nil && s.Kubeconfig.Auth == AuthExec && looksForKueue(s):
			out = append(out, fmt.Sprintf("%s writes kubeconfigs with auth exec and looks meant for Kueue's MultiKueue, "+
				"which refuses every kubeconfig that runs an exec plugin (InsecureKubeConfig); set kubeconfig.consumer: kueue "+
				"(token auth), or use a sink of type kueue", p))
		}
	}
	return out
}

// kueueServerWarnings warns when the server of the named access provider
// has a host Kueue refuses: every kubeconfig with it would be refused.
// Providers whose server comes from each cluster (direct) are checked per
// cluster by the sinks.
func (c *Config) kueueServerWarnings(p, provider string) []string {
	for _, a := range c.AccessProviders {
		if a.Name != provider || a.Server == "" {
			continue
		}
		server, err := RenderServer(a.Server, "example-cluster")
		if err != nil {
			return nil // validation reports the template
		}
		if err := CheckKueueServer(server); err != nil {
			return []string{fmt.Sprintf("%s: access provider %s: %v, which Kueue refuses (InsecureKubeConfig): "+
				"this sink would write no kubeconfig", p, provider, err)}
		}
	}
	return nil
}

// looksForKueue reports whether a kubeconfig sink's name, directory or
// namespace filter mentions Kueue.
func looksForKueue(s Sink) bool {
	mentions := func(v string) bool { return strings.Contains(strings.ToLower(v), "kueue") }
	if mentions(s.Name) || mentions(s.Kubeconfig.Directory) {
		return true
	}
	return slices.Contains(s.Filter.Namespaces, DefaultKueueNamespace)
}

// underDir reports whether path is dir or below it.
func underDir(path, dir string) bool {
	rel, err := filepath.Rel(dir, filepath.Clean(path))
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../")
}

// CheckKueueServer applies Kueue's rule for a kubeconfig's server: an
// absolute URL whose host (without its port, case ignored) is an IP
// address or a DNS-1123 subdomain. Kueue marks a MultiKueueCluster whose
// kubeconfig breaks it inactive ("untrusted server endpoint").
func CheckKueueServer(server string) error {
	if server == "" {
		return errors.New("no server")
	}
	u, err := url.Parse(server)
	if err != nil || u.Host == "" {
		return fmt.Errorf("server %q is not an absolute URL", server)
	}
	host := u.Host
	if h, _, err := net.SplitHostPort(u.Host); err == nil {
		host = h
	}
	if net.ParseIP(host) != nil {
		return nil
	}
	if msgs := validation.IsDNS1123Subdomain(strings.ToLower(host)); len(msgs) > 0 {
		return fmt.Errorf("server host %q is neither an IP address nor a DNS-1123 name", host)
	}
	return nil
}
