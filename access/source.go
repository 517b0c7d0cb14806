package access

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	cpv1alpha1 "sigs.k8s.io/cluster-inventory-api/apis/v1alpha1"
	cpclient "sigs.k8s.io/cluster-inventory-api/client/clientset/versioned"

	"github.com/hubsync/hubsync/hub"
)

// Options say which profiles and credential copies a Source serves.
type Options struct {
	// Namespace is the consumer namespace that holds the ClusterProfiles
	// and their credential copies. Required.
	Namespace string
	// ManagedServiceAccount names the ManagedServiceAccount whose token
	// the copies hold: the copy of cluster c is the Secret
	// "<c>-<ManagedServiceAccount>". Required.
	ManagedServiceAccount string
	// Provider is the access provider of each profile that configs
	// connect through (server, CA, TLS server name, proxy). Default
	// DefaultProvider.
	Provider string
	// Logger receives token switches and failed reads, never a token.
	// Default: discarded.
	Logger *slog.Logger
}

// Clients are the hub clients of a Source. Kube reads the credential
// copies: it needs get, list and watch on Secrets in the namespace.
// Profiles reads ClusterProfiles, for ConfigForName only; it may be nil.
type Clients struct {
	Kube     kubernetes.Interface
	Profiles cpclient.Interface
}

// Stats count what a Source's transports did about refused requests.
type Stats struct {
	// Refused is the number of responses 401 Unauthorized received from
	// clusters, retries included.
	Refused int64
	// Retried is the number of requests sent again with a newer token
	// after a 401.
	Retried int64
	// Rereads is the number of copies read from the hub after a 401,
	// because the token held was the one refused.
	Rereads int64
}

// Source hands out rest.Configs for the clusters of one namespace's
// ClusterProfiles, authenticated with the namespace's credential copies
// of one ManagedServiceAccount. One informer follows every copy in the
// namespace (Secrets labelled synced-from), however many clusters the
// configs reach.
type Source struct {
	clients  Clients
	opts     Options
	log      *slog.Logger
	informer cache.SharedIndexInformer
	started  atomic.Bool
	stats    counters
	// minReread is credential.minReread; now is the clock.
	minReread time.Duration
	now       func() time.Time

	mu    sync.Mutex
	creds map[string]*credential // by copy name
}

// defaultMinReread is the least time between two reads of a copy after
// 401s that found the token unchanged.
const defaultMinReread = time.Second

// New returns a Source whose hub clients are built from hubConfig.
func New(hubConfig *rest.Config, o Options) (*Source, error) {
	kube, err := kubernetes.NewForConfig(hubConfig)
	if err != nil {
		return nil, fmt.Errorf("access: hub client: %w", err)
	}
	profiles, err := cpclient.NewForConfig(hubConfig)
	if err != nil {
		return nil, fmt.Errorf("access: hub ClusterProfile client: %w", err)
	}
	return NewForClients(Clients{Kube: kube, Profiles: profiles}, o)
}

// NewForClients returns a Source that uses the given hub clients. The
// Source follows the copies only once Start runs; until then, and for
// copies the informer has not listed yet, a config reads its copy from the
// API server on its first request and after a 401.
func NewForClients(c Clients, o Options) (*Source, error) {
	if err := o.check(); err != nil {
		return nil, err
	}
	if c.Kube == nil {
		return nil, errors.New("access: Clients.Kube is required")
	}
	if o.Provider == "" {
		o.Provider = DefaultProvider
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Source{clients: c, opts: o, log: log, minReread: defaultMinReread, now: time.Now, creds: map[string]*credential{}}
	s.informer = coreinformers.NewFilteredSecretInformer(c.Kube, o.Namespace, 0, cache.Indexers{}, func(lo *metav1.ListOptions) {
		lo.LabelSelector = hub.LabelSyncedFrom
	})
	if err := s.informer.SetTransform(stripSecret); err != nil {
		return nil, fmt.Errorf("access: %w", err)
	}
	_, err := s.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    s.observe,
		UpdateFunc: func(_, obj any) { s.observe(obj) },
	})
	if err != nil {
		return nil, fmt.Errorf("access: %w", err)
	}
	return s, nil
}

// check reports every required option that is missing or invalid.
func (o Options) check() error {
	var errs []error
	if len(validation.IsDNS1123Label(o.Namespace)) > 0 {
		errs = append(errs, fmt.Errorf("access: Options.Namespace %q is not a namespace name", o.Namespace))
	}
	if strings.TrimSpace(o.ManagedServiceAccount) == "" {
		errs = append(errs, errors.New("access: Options.ManagedServiceAccount is required"))
	}
	return errors.Join(errs...)
}

// Start follows the credential copies until ctx ends. It blocks, and
// returns nil once the informer has stopped; it satisfies
// controller-runtime's manager.Runnable, so mgr.Add(source) runs it.
func (s *Source) Start(ctx context.Context) error {
	if !s.started.CompareAndSwap(false, true) {
		return errors.New("access: Source.Start called twice")
	}
	s.informer.RunWithContext(ctx)
	return nil
}

// NeedLeaderElection is false: every replica of a controller-runtime
// manager needs fresh tokens, not only the leader.
func (s *Source) NeedLeaderElection() bool { return false }

// WaitForCacheSync waits until Start has listed the copies, and reports
// false if ctx ends first.
func (s *Source) WaitForCacheSync(ctx context.Context) bool {
	return cache.WaitForCacheSync(ctx.Done(), s.informer.HasSynced)
}

// Stats returns what the Source's transports did about refused requests
// so far.
func (s *Source) Stats() Stats {
	return Stats{Refused: s.stats.refused.Load(), Retried: s.stats.retried.Load(), Rereads: s.stats.rereads.Load()}
}

// ConfigForName reads the ClusterProfile name in the Source's namespace
// and returns ConfigFor it.
func (s *Source) ConfigForName(ctx context.Context, name string) (*rest.Config, error) {
	if s.clients.Profiles == nil {
		return nil, errors.New("access: ConfigForName needs Clients.Profiles")
	}
	p, err := s.clients.Profiles.ApisV1alpha1().ClusterProfiles(s.opts.Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("access: get cluster profile %s/%s: %w", s.opts.Namespace, name, err)
	}
	return s.ConfigFor(ctx, p)
}

// ConfigFor returns a new rest.Config for the cluster of profile p, which
// must be in the Source's namespace: the server, CA and TLS server name of
// its access provider, and a transport that sends the token of the
// cluster's credential copy as it is now. It reads the copy once, so that
// a missing copy is reported here rather than on the first request. The
// caller may change the config (QPS, user agent, ...); configs for one
// cluster share its token.
func (s *Source) ConfigFor(ctx context.Context, p *cpv1alpha1.ClusterProfile) (*rest.Config, error) {
	if p.Namespace != s.opts.Namespace {
		return nil, fmt.Errorf("access: cluster profile %s/%s is not in namespace %s", p.Namespace, p.Name, s.opts.Namespace)
	}
	cfg, err := providerConfig(p, s.opts.Provider)
	if err != nil {
		return nil, fmt.Errorf("access: %w", err)
	}
	cred := s.credentialFor(p.Name)
	if _, err := cred.current(ctx); err != nil {
		return nil, fmt.Errorf("access: cluster profile %s/%s: %w", p.Namespace, p.Name, err)
	}
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return &transport{cred: cred, next: rt, stats: &s.stats}
	}
	return cfg, nil
}

// Refresh reads the credential copy of cluster from the API server now,
// unless the token held already has fingerprint (hub.TokenFingerprint;
// "" always reads). It is the hook for hubsync's
// io.hubsync.credential.rotated event, whose data carries the new token's
// fingerprint. A cluster no config was handed out for is left alone.
func (s *Source) Refresh(ctx context.Context, cluster, fingerprint string) error {
	s.mu.Lock()
	cred := s.creds[hub.CopyName(cluster, s.opts.ManagedServiceAccount)]
	s.mu.Unlock()
	if cred == nil {
		return nil
	}
	if held := cred.held(); fingerprint != "" && held != "" && hub.TokenFingerprint([]byte(held)) == fingerprint {
		return nil
	}
	tok, err := cred.read(ctx)
	if err != nil {
		return fmt.Errorf("access: refresh: %w", err)
	}
	if cred.offer(tok) {
		s.log.Info("switched to the credential copy's new token (refresh)", "secret", cred.secret, "fingerprint", hub.TokenFingerprint([]byte(tok.token)))
	}
	return nil
}

// Namespace is the consumer namespace the Source serves.
func (s *Source) Namespace() string { return s.opts.Namespace }

// ManagedServiceAccount is the ManagedServiceAccount whose copies the
// Source reads.
func (s *Source) ManagedServiceAccount() string { return s.opts.ManagedServiceAccount }
