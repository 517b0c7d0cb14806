package config

import (
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/hubsync/hubsync/stream"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Sink types.
const (
	SinkKubeconfig = "kubeconfig"
	SinkArgoCD     = "argocd"
	SinkWebhook    = "webhook"
	// SinkNATS is the type of the sink that bus: configures; it cannot be
	// listed under sinks.
	SinkNATS = "nats"
)

// SinkTypes are the types a sinks entry may have.
var SinkTypes = []string{SinkKubeconfig, SinkArgoCD, SinkWebhook, SinkKueue}

// Auth modes of the sinks that write client configurations.
const (
	// AuthExec: the client runs `hubsync creds` to read the current
	// credential copy, so the written configuration never changes on
	// token rotation.
	AuthExec = "exec"
	// AuthToken: the token itself is written, and rewritten on rotation.
	AuthToken = "token"
)

// AuthModes are the values of the auth of the kubeconfig and argocd sinks.
var AuthModes = []string{AuthExec, AuthToken}

// MaxSinkNameLength bounds a sink's name, a DNS-1123 label.
const MaxSinkNameLength = 63

// Sink is one target outside NATS where cluster access must appear and
// stay fresh. Exactly the section named by Type is set.
type Sink struct {
	// Name is unique among sinks: a DNS-1123 label (it names metrics,
	// log lines and, for a webhook, its spool directory). "nats" is taken
	// by the bus.
	Name string `json:"name"`
	// Type is kubeconfig, argocd, webhook or kueue.
	Type string `json:"type"`
	// Filter selects what reaches the sink; empty selects everything.
	Filter SinkFilter `json:"filter"`
	// QueueSize bounds the changes waiting for this sink; beyond it
	// changes are dropped (counted) and the sink is resynced from the
	// current state once it catches up. Default 10000.
	QueueSize int `json:"queueSize,omitempty"`

	Kubeconfig *KubeconfigSink `json:"kubeconfig,omitempty"`
	ArgoCD     *ArgoCDSink     `json:"argocd,omitempty"`
	Webhook    *WebhookSink    `json:"webhook,omitempty"`
	Kueue      *KueueSink      `json:"kueue,omitempty"`
}

// SinkFilter selects changes by consumer namespace, by the managed
// cluster's labels and by event type. Each part left empty selects all.
type SinkFilter struct {
	// Namespaces are the consumer namespaces selected.
	Namespaces []string `json:"namespaces,omitempty"`
	// ClusterSelector selects on the managed cluster's labels.
	ClusterSelector *metav1.LabelSelector `json:"clusterSelector,omitempty"`
	// EventTypes are CloudEvents types (io.hubsync.profile.created, ...).
	// Only a webhook may narrow them: the other sinks keep a state
	// that needs every type.
	EventTypes []string `json:"eventTypes,omitempty"`
}

// ExecAuth is the exec credential plugin a written configuration runs.
type ExecAuth struct {
	// Command is the hubsync binary as the consumer sees it. Default
	// "hubsync" (looked up in the consumer's PATH).
	Command string `json:"command,omitempty"`
	// InstallHint is shown by clients when the command is missing.
	InstallHint string `json:"installHint,omitempty"`
}

// KubeconfigSink writes one kubeconfig file per (namespace, cluster).
type KubeconfigSink struct {
	// Directory receives the files (created 0700 if missing).
	Directory string `json:"directory"`
	// AccessProvider names the profile's status.accessProviders entry
	// whose server and CA the files use.
	AccessProvider string `json:"accessProvider"`
	// ManagedServiceAccount whose synced credential the files use.
	ManagedServiceAccount string `json:"managedServiceAccount"`
	// Auth is exec (default) or token.
	Auth string   `json:"auth,omitempty"`
	Exec ExecAuth `json:"exec"`
	// Consumer, if kueue, makes files Kueue's MultiKueue accepts: auth
	// defaults to token and exec is refused, and each file is checked
	// against Kueue's kubeconfig rules before it is written.
	Consumer string `json:"consumer,omitempty"`
}

// ArgoCDSink writes Argo CD cluster Secrets for the profiles of one
// consumer namespace.
type ArgoCDSink struct {
	// Namespace is Argo CD's namespace, where the Secrets go. Default argocd.
	Namespace string `json:"namespace,omitempty"`
	// ConsumerNamespace is the namespace whose profiles become clusters
	// (and where the credential copies are). Required.
	ConsumerNamespace string `json:"consumerNamespace"`
	// AccessProvider names the profile's access provider to use.
	AccessProvider string `json:"accessProvider"`
	// ManagedServiceAccount whose synced credential Argo CD uses.
	ManagedServiceAccount string `json:"managedServiceAccount"`
	// Auth is exec (default) or token. Token mode rewrites the Secret's
	// config on every rotation, which makes Argo CD drop and re-list its
	// cache of that cluster and requeue ApplicationSets.
	Auth string   `json:"auth,omitempty"`
	Exec ExecAuth `json:"exec"`
	// Project, Namespaces, ClusterResources and Shard become the Secret's
	// project, namespaces (comma-separated), clusterResources and shard.
	Project          string   `json:"project,omitempty"`
	Namespaces       []string `json:"namespaces,omitempty"`
	ClusterResources bool     `json:"clusterResources,omitempty"`
	Shard            string   `json:"shard,omitempty"`
	// Labels and Annotations are added to every Secret.
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
	// ProvideClusterInfo (Argo CD 3.5 or later, exec auth) makes each
	// Secret's exec config carry provideClusterInfo: true and config:
	// {clusterName: <cluster>}, which Argo CD hands the plugin in
	// KUBERNETES_EXEC_INFO, instead of naming the cluster in the plugin's
	// arguments. Argo CD 3.2 has neither field, so its plugin would learn
	// no cluster: leave it false there.
	ProvideClusterInfo bool `json:"provideClusterInfo,omitempty"`
	// ExecPlugin is what exec.command runs: hubsync (default; `hubsync
	// creds`) or cp-creds (managed-serviceaccount's plugin, which learns
	// the cluster from KUBERNETES_EXEC_INFO only, so it needs
	// provideClusterInfo).
	ExecPlugin string `json:"execPlugin,omitempty"`
}

// Exec plugins an Argo CD sink's Secrets may run.
const (
	ExecPluginHubsync = "hubsync"
	ExecPluginCPCreds = "cp-creds"
)

// ExecPlugins are the values of argocd.execPlugin.
var ExecPlugins = []string{ExecPluginHubsync, ExecPluginCPCreds}

// WebhookSink POSTs every event to an HTTPS endpoint, signed per the
// Standard Webhooks specification.
type WebhookSink struct {
	// URL is the endpoint: https, or http on a loopback address only.
	URL string `json:"url"`
	// SecretsFile holds the signing secrets, whsec_<base64>, one per line;
	// several let keys rotate without downtime. Re-read when it changes.
	SecretsFile string `json:"secretsFile,omitempty"`
	// SecretRef names a key of a hub Secret holding the same.
	SecretRef *SecretKeyRef `json:"secretRef,omitempty"`
	// BearerTokenFile, if set, is sent as Authorization: Bearer.
	BearerTokenFile string `json:"bearerTokenFile,omitempty"`
	// CAFile verifies the endpoint's certificate (default: system roots).
	CAFile string `json:"caFile,omitempty"`
	// Timeout of one attempt. Default 10s.
	Timeout metav1.Duration `json:"timeout,omitempty"`
	// FailingAfter is how long the endpoint may refuse events (any answer
	// but 2xx) or be out of reach before the sink is reported failing
	// (hubsync_sink_up 0, /readyz?verbose): shorter outages, such as a
	// receiver's rolling restart, are retried without alarm. Default 1m.
	FailingAfter metav1.Duration `json:"failingAfter,omitempty"`
	// Concurrency bounds the requests in flight to the endpoint. Events of
	// one (namespace, cluster) still go one at a time, in order; events of
	// different ones go side by side, so a receiver far away is not held to
	// one round trip per event. 1 sends every event in spool order. Default 16.
	Concurrency int `json:"concurrency,omitempty"`
	// Spool keeps undelivered events on disk across outages and restarts.
	Spool WebhookSpool `json:"spool"`
}

// WebhookSpool is a webhook's on-disk queue.
type WebhookSpool struct {
	// Directory; default /var/lib/hubsync/sinks/<name>.
	Directory string `json:"directory,omitempty"`
	// MaxBytes bounds it; when full, events are counted as dropped and the
	// endpoint is resynced once it is back. Default 64 MiB.
	MaxBytes int64 `json:"maxBytes,omitempty"`
}

// sinksSeen is what the sinks validated so far claimed, which no other
// sink may claim again.
type sinksSeen struct {
	names map[string]bool
	// dirs are kubeconfig directories, by the sink writing them.
	dirs map[string]string
	// argoServers are Argo CD namespace/consumer namespace/provider
	// triples, by the sink writing them.
	argoServers map[string]string
	// kueue points to the name of the kueue sink, once one was seen.
	kueue *string
}

func (c *Config) validateSinks() field.ErrorList {
	var errs field.ErrorList
	seen := sinksSeen{names: map[string]bool{}, dirs: map[string]string{}, argoServers: map[string]string{}, kueue: new(string)}
	for i, s := range c.Sinks {
		path := field.NewPath("sinks").Index(i)
		errs = append(errs, validateSinkName(path.Child("name"), s.Name, seen.names)...)
		if s.QueueSize < 0 {
			errs = append(errs, field.Invalid(path.Child("queueSize"), s.QueueSize, "must not be negative"))
		}
		errs = append(errs, validateFilter(path.Child("filter"), s.Filter, s.Type)...)
		errs = append(errs, c.validateSinkSection(path, s, seen)...)
	}
	return errs
}

// validateSinkName checks a sink's name and records it in names.
func validateSinkName(p *field.Path, name string, names map[string]bool) field.ErrorList {
	var errs field.ErrorList
	switch {
	case name == "":
		errs = append(errs, field.Required(p, "a sink needs a name"))
	case names[name]:
		errs = append(errs, field.Duplicate(p, name))
	case name == SinkNATS:
		errs = append(errs, field.Invalid(p, name, `"nats" is the event bus's sink (configured under bus)`))
	default:
		for _, msg := range validation.IsDNS1123Label(name) {
			errs = append(errs, field.Invalid(p, name, msg))
		}
	}
	names[name] = true
	return errs
}

// validateSinkSection checks that exactly the section of the sink's type
// is set, and that section.
func (c *Config) validateSinkSection(path *field.Path, s Sink, seen sinksSeen) field.ErrorList {
	var errs field.ErrorList
	set := map[string]bool{SinkKubeconfig: s.Kubeconfig != nil, SinkArgoCD: s.ArgoCD != nil, SinkWebhook: s.Webhook != nil, SinkKueue: s.Kueue != nil}
	for _, t := range SinkTypes {
		if set[t] && t != s.Type {
			errs = append(errs, field.Forbidden(path.Child(sectionName(t)), fmt.Sprintf("only the %q section of the sink's type may be set", s.Type)))
		}
	}
	switch {
	case s.Type == "":
		return append(errs, field.Required(path.Child("type"), strings.Join(SinkTypes, ", ")))
	case !slices.Contains(SinkTypes, s.Type):
		return append(errs, field.NotSupported(path.Child("type"), s.Type, SinkTypes))
	case !set[s.Type]:
		needs := map[string]string{
			SinkKubeconfig: "directory, accessProvider and managedServiceAccount",
			SinkArgoCD:     "consumerNamespace, accessProvider and managedServiceAccount",
			SinkWebhook:    "url and signing secrets",
			SinkKueue:      "accessProvider and managedServiceAccount (source secret), or source: clusterProfile",
		}
		return append(errs, field.Required(path.Child(sectionName(s.Type)), needs[s.Type]))
	}
	p := path.Child(sectionName(s.Type))
	switch s.Type {
	case SinkKubeconfig:
		errs = append(errs, c.validateKubeconfigSink(p, s.Name, s.Kubeconfig, seen.dirs)...)
	case SinkArgoCD:
		errs = append(errs, c.validateArgoCDSink(p, s.Name, s.ArgoCD, seen.argoServers)...)
	case SinkWebhook:
		errs = append(errs, validateWebhook(p, s.Webhook)...)
	case SinkKueue:
		errs = append(errs, c.validateKueueSink(path, s, seen.kueue)...)
	}
	return errs
}

// validateKubeconfigSink checks a kubeconfig sink; dirs holds the
// directories other sinks write, by sink name.
func (c *Config) validateKubeconfigSink(p *field.Path, name string, k *KubeconfigSink, dirs map[string]string) field.ErrorList {
	var errs field.ErrorList
	if k.Directory == "" {
		errs = append(errs, field.Required(p.Child("directory"), "where the kubeconfig files go"))
	} else if !filepath.IsAbs(k.Directory) {
		errs = append(errs, field.Invalid(p.Child("directory"), k.Directory, "must be an absolute path"))
	} else if other, ok := dirs[filepath.Clean(k.Directory)]; ok {
		errs = append(errs, field.Duplicate(p.Child("directory"), k.Directory+" (also sink "+other+")"))
	} else {
		dirs[filepath.Clean(k.Directory)] = name
	}
	errs = append(errs, validateKubeconfigConsumer(p, k)...)
	return append(errs, c.validateAccess(p, k.AccessProvider, k.ManagedServiceAccount, k.Auth, k.Exec)...)
}

// validateArgoCDSink checks an Argo CD sink; servers holds what other
// sinks write into Argo CD, by sink name.
func (c *Config) validateArgoCDSink(p *field.Path, name string, a *ArgoCDSink, servers map[string]string) field.ErrorList {
	var errs field.ErrorList
	for _, msg := range validation.IsDNS1123Label(a.Namespace) {
		errs = append(errs, field.Invalid(p.Child("namespace"), a.Namespace, msg))
	}
	if a.ConsumerNamespace == "" {
		errs = append(errs, field.Required(p.Child("consumerNamespace"), "the namespace whose ClusterProfiles become Argo CD clusters"))
	} else {
		for _, msg := range validation.IsDNS1123Label(a.ConsumerNamespace) {
			errs = append(errs, field.Invalid(p.Child("consumerNamespace"), a.ConsumerNamespace, msg))
		}
	}
	// Argo CD indexes clusters by server: two sinks writing the same
	// clusters of one namespace into one Argo CD would clash.
	key := a.Namespace + "/" + a.ConsumerNamespace + "/" + a.AccessProvider
	if other, ok := servers[key]; ok {
		errs = append(errs, field.Duplicate(p, fmt.Sprintf("sink %s already writes the %s clusters of %s into %s", other, a.AccessProvider, a.ConsumerNamespace, a.Namespace)))
	}
	servers[key] = name
	for _, ns := range a.Namespaces {
		for _, msg := range validation.IsDNS1123Label(ns) {
			errs = append(errs, field.Invalid(p.Child("namespaces"), ns, msg))
		}
	}
	errs = append(errs, validateLabels(p.Child("labels"), a.Labels)...)
	errs = append(errs, validateArgoCDExec(p, a)...)
	return append(errs, c.validateAccess(p, a.AccessProvider, a.ManagedServiceAccount, a.Auth, a.Exec)...)
}

// validateArgoCDExec checks an Argo CD sink's exec plugin and how it
// learns the cluster.
func validateArgoCDExec(p *field.Path, a *ArgoCDSink) field.ErrorList {
	var errs field.ErrorList
	switch a.ExecPlugin {
	case ExecPluginHubsync:
	case ExecPluginCPCreds:
		if !a.ProvideClusterInfo {
			errs = append(errs, field.Invalid(p.Child("execPlugin"), a.ExecPlugin,
				"cp-creds reads the cluster from KUBERNETES_EXEC_INFO only: set provideClusterInfo: true (Argo CD 3.5 or later)"))
		}
	default:
		errs = append(errs, field.NotSupported(p.Child("execPlugin"), a.ExecPlugin, ExecPlugins))
	}
	if a.ProvideClusterInfo && a.Auth != AuthExec {
		errs = append(errs, field.Forbidden(p.Child("provideClusterInfo"), "only with auth: exec (a token-mode Secret runs no plugin)"))
	}
	return errs
}

func sectionName(t string) string {
	if t == SinkArgoCD {
		return "argocd"
	}
	return t
}

func validateFilter(p *field.Path, f SinkFilter, typ string) field.ErrorList {
	var errs field.ErrorList
	for i, ns := range f.Namespaces {
		for _, msg := range validation.IsDNS1123Label(ns) {
			errs = append(errs, field.Invalid(p.Child("namespaces").Index(i), ns, msg))
		}
	}
	if f.ClusterSelector != nil {
		if _, err := metav1.LabelSelectorAsSelector(f.ClusterSelector); err != nil {
			errs = append(errs, field.Invalid(p.Child("clusterSelector"), f.ClusterSelector.String(), err.Error()))
		}
	}
	if len(f.EventTypes) > 0 && typ != SinkWebhook && typ != "" {
		errs = append(errs, field.Forbidden(p.Child("eventTypes"), "only a webhook sink may narrow event types: a "+typ+" sink keeps a state that needs all of them"))
	}
	for i, t := range f.EventTypes {
		if !slices.Contains(stream.Types, t) {
			errs = append(errs, field.NotSupported(p.Child("eventTypes").Index(i), t, stream.Types))
		}
	}
	return errs
}

func validateLabels(p *field.Path, labels map[string]string) field.ErrorList {
	var errs field.ErrorList
	for k, v := range labels {
		for _, msg := range validation.IsQualifiedName(k) {
			errs = append(errs, field.Invalid(p.Key(k), k, msg))
		}
		for _, msg := range validation.IsValidLabelValue(v) {
			errs = append(errs, field.Invalid(p.Key(k), v, msg))
		}
	}
	return errs
}

// validateAccess checks what a kubeconfig or Argo CD sink needs to reach a
// cluster: a configured access provider, an MSA other than the gateway's
// impersonating one, and an auth mode.
func (c *Config) validateAccess(p *field.Path, provider, msa, auth string, exec ExecAuth) field.ErrorList {
	var errs field.ErrorList
	if provider == "" {
		errs = append(errs, field.Required(p.Child("accessProvider"), "the name of an accessProviders entry"))
	} else if !slices.ContainsFunc(c.AccessProviders, func(a AccessProvider) bool { return a.Name == provider }) {
		errs = append(errs, field.Invalid(p.Child("accessProvider"), provider, "must name an entry of accessProviders"))
	}
	if msa == "" {
		errs = append(errs, field.Required(p.Child("managedServiceAccount"), "the ManagedServiceAccount whose synced credential clients use"))
	} else {
		for _, msg := range validation.IsDNS1123Subdomain(msa) {
			errs = append(errs, field.Invalid(p.Child("managedServiceAccount"), msa, msg))
		}
		if msa == c.ImpersonatingMSA() {
			// The syncer never copies it, so such a sink would have no
			// credential to hand out; refusing the file says why at once.
			errs = append(errs, field.Invalid(p.Child("managedServiceAccount"), msa,
				"is the gateway's impersonating credential (tunnel.managedServiceAccount); it may impersonate anyone on its clusters "+
					"and is never handed to consumers; use another ManagedServiceAccount"))
		}
	}
	switch auth {
	case AuthExec, AuthToken:
	default:
		errs = append(errs, field.NotSupported(p.Child("auth"), auth, AuthModes))
	}
	if auth == AuthExec && strings.TrimSpace(exec.Command) == "" {
		errs = append(errs, field.Required(p.Child("exec", "command"), "the hubsync binary as the consumer sees it"))
	}
	if !c.CredentialsEnabled() {
		errs = append(errs, field.Forbidden(p, "needs credential copies: credentials.enabled is false"))
	}
	return errs
}

func validateWebhook(p *field.Path, w *WebhookSink) field.ErrorList {
	var errs field.ErrorList
	if w.URL == "" {
		errs = append(errs, field.Required(p.Child("url"), "the endpoint events are POSTed to"))
	} else if u, err := url.Parse(w.URL); err != nil || u.Host == "" {
		errs = append(errs, field.Invalid(p.Child("url"), w.URL, "must be an absolute https URL"))
	} else if u.User != nil {
		errs = append(errs, field.Invalid(p.Child("url"), "(redacted)", "must not carry credentials; use bearerTokenFile"))
	} else if u.Scheme != "https" && !(u.Scheme == "http" && isLoopback(u.Hostname())) {
		errs = append(errs, field.Invalid(p.Child("url"), w.URL, "must be https (plain http only to a loopback address)"))
	}
	switch {
	case w.SecretsFile == "" && w.SecretRef == nil:
		errs = append(errs, field.Required(p.Child("secretsFile"), "signing secrets (whsec_...): secretsFile or secretRef"))
	case w.SecretsFile != "" && w.SecretRef != nil:
		errs = append(errs, field.Forbidden(p, "secretsFile and secretRef are mutually exclusive"))
	}
	if r := w.SecretRef; r != nil {
		errs = append(errs, objectRef(p.Child("secretRef"), r.Namespace, r.Name)...)
	}
	if w.Timeout.Duration < 0 || w.Timeout.Duration > 5*time.Minute {
		errs = append(errs, field.Invalid(p.Child("timeout"), w.Timeout.Duration.String(), "must be 0 to 5m"))
	}
	if w.FailingAfter.Duration < 0 || w.FailingAfter.Duration > 24*time.Hour {
		errs = append(errs, field.Invalid(p.Child("failingAfter"), w.FailingAfter.Duration.String(),
			fmt.Sprintf("must be at most 24h (unset: %s)", DefaultWebhookFailingAfter)))
	}
	errs = append(errs, between(p.Child("concurrency"), w.Concurrency, 1, MaxWebhookConcurrency)...)
	if w.Spool.MaxBytes < 1<<20 {
		errs = append(errs, field.Invalid(p.Child("spool", "maxBytes"), w.Spool.MaxBytes, "must be at least 1 MiB"))
	}
	if w.Spool.Directory != "" && !filepath.IsAbs(w.Spool.Directory) {
		errs = append(errs, field.Invalid(p.Child("spool", "directory"), w.Spool.Directory, "must be an absolute path"))
	}
	return errs
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
