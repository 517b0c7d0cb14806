package tunnel

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"sync"
	"text/template"
	"time"

	"github.com/hubsync/hubsync/hub"
	"github.com/hubsync/hubsync/hubcache"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	clusterlisters "open-cluster-management.io/api/client/cluster/listers/cluster/v1"
	clusterv1 "open-cluster-management.io/api/cluster/v1"
	cpv1alpha1 "sigs.k8s.io/cluster-inventory-api/apis/v1alpha1"
)

// DefaultKonnectivityServerName is the name verified in the API server's
// certificate when it is reached through konnectivity: every kube-apiserver
// serves it for in-cluster clients.
const DefaultKonnectivityServerName = "kubernetes.default.svc"

// AddressData are the fields a dial address template can use.
type AddressData struct {
	// ClusterName is the ManagedCluster's name.
	ClusterName string
	// ServerHost is host:port of the cluster's first
	// spec.managedClusterClientConfigs URL (port 443 when it has none).
	ServerHost string
	// ServerHostname is that URL's host without the port.
	ServerHostname string
}

// ParseDialAddress parses a dial address template.
func ParseDialAddress(tmpl string) (*template.Template, error) {
	t, err := template.New("dialAddress").Option("missingkey=error").Parse(tmpl)
	if err != nil {
		return nil, fmt.Errorf("dial address template: %w", err)
	}
	return t, nil
}

// SourceOptions say how the pool's targets are derived from the hub.
type SourceOptions struct {
	// Transport is TransportKonnectivity or TransportDirect.
	Transport string
	// DialAddress is the template of the address dialed through
	// konnectivity (config.DefaultTunnelDialAddress is cluster-proxy's);
	// required with konnectivity.
	DialAddress string
	// ServerName overrides the name verified in the API server's
	// certificate (default: DefaultKonnectivityServerName through
	// konnectivity, the URL's host when direct).
	ServerName string
	// ManagedServiceAccount names the ManagedServiceAccount whose hub
	// token Secret (<cluster>/<name>) authenticates probes and requests;
	// empty: probes go without a token.
	ManagedServiceAccount string
	// Selector adds clusters with no profile to the pool; nil adds none.
	Selector labels.Selector
	// ClusterManager is the x-k8s.io/cluster-manager label value of the
	// ClusterProfiles whose clusters the pool serves; required.
	ClusterManager string
	// ResyncPeriod of the informers.
	ResyncPeriod time.Duration
}

// Source keeps the pool in step with the hub: which consumer namespaces
// have a ClusterProfile for each cluster (read on every replica, leader or
// not, so that every replica serves the same clusters), and the targets
// from ManagedClusters and the ManagedServiceAccount's token Secrets.
type Source struct {
	pool     *Pool
	opts     SourceOptions
	tmpl     *template.Template
	log      *slog.Logger
	clusters clusterlisters.ManagedClusterLister
	secrets  corelisters.SecretLister
	synced   []cache.InformerSynced
	// holds are the source's informers in the hub cache, released (with
	// the source's handlers) when Run's context ends.
	holds hubcache.Holds
	// syncing serialises sync: the ManagedCluster and Secret informers
	// call it from goroutines of their own, and a read of the listers
	// applied after a later one would leave a cluster out of the pool, or
	// in it without its token, until the next resync.
	syncing sync.Mutex
}

// NewSource takes the informers the source reads from hc, the process's
// hub cache: ManagedClusters, ClusterProfiles and the token Secrets, the
// same ones the syncer reads on the leader. Run waits for them; the
// caller starts hc.
func NewSource(hc *hubcache.Cache, opts SourceOptions, pool *Pool, log *slog.Logger) (*Source, error) {
	switch opts.Transport {
	case TransportKonnectivity, TransportDirect:
	default:
		return nil, fmt.Errorf("tunnel transport %q: want %s or %s", opts.Transport, TransportKonnectivity, TransportDirect)
	}
	if opts.Transport == TransportKonnectivity && opts.DialAddress == "" {
		return nil, errors.New("tunnel source: no dial address for konnectivity (the configuration's tunnel section fills it)")
	}
	if opts.ClusterManager == "" {
		return nil, errors.New("tunnel source: no cluster manager to select profiles by (the configuration fills it)")
	}
	tmpl, err := ParseDialAddress(opts.DialAddress)
	if err != nil {
		return nil, err
	}
	s := &Source{pool: pool, opts: opts, tmpl: tmpl, log: log}
	steps := []func(*hubcache.Cache) error{s.watchClusters, s.watchProfiles}
	if opts.ManagedServiceAccount != "" {
		steps = append(steps, s.watchTokens)
	}
	for _, step := range steps {
		if err := step(hc); err != nil {
			s.holds.Release()
			return nil, err
		}
	}
	return s, nil
}

// follow adds a handler that syncs the cluster key names (none for "")
// on every change of inf's objects.
func (s *Source) follow(inf *hubcache.Informer, key func(any) string) error {
	synced, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { s.sync(key(obj)) },
		UpdateFunc: func(_, obj any) { s.sync(key(obj)) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			s.sync(key(obj))
		},
	})
	if err != nil {
		return err
	}
	// The handler's own HasSynced: true once it has been handed every
	// object of the first list, not merely once the cache holds them,
	// so that the pool starts knowing every cluster.
	s.synced = append(s.synced, synced)
	return nil
}

// watchClusters follows the ManagedClusters.
func (s *Source) watchClusters(hc *hubcache.Cache) error {
	inf, err := hc.ManagedClusters()
	if err != nil {
		return err
	}
	s.holds = append(s.holds, inf)
	s.clusters = clusterlisters.NewManagedClusterLister(inf.Informer().GetIndexer())
	return s.follow(inf, func(obj any) string {
		if mc, ok := obj.(*clusterv1.ManagedCluster); ok {
			return mc.Name
		}
		return ""
	})
}

// watchTokens follows the ManagedServiceAccount's token Secrets: one per
// cluster, in the cluster's namespace on the hub, among the token Secrets
// the hub cache holds for every ManagedServiceAccount.
func (s *Source) watchTokens(hc *hubcache.Cache) error {
	inf, err := hc.Secrets(hubcache.TokenSecrets())
	if err != nil {
		return err
	}
	s.holds = append(s.holds, inf)
	s.secrets = corelisters.NewSecretLister(inf.Informer().GetIndexer())
	return s.follow(inf, func(obj any) string {
		if sec, ok := obj.(*corev1.Secret); ok && sec.Name == s.opts.ManagedServiceAccount {
			return sec.Namespace
		}
		return ""
	})
}

// watchProfiles follows the ClusterProfiles hubsync manages: a profile of
// its cluster manager named after a cluster, in any namespace, puts the
// cluster in the pool.
func (s *Source) watchProfiles(hc *hubcache.Cache) error {
	inf, err := hc.ClusterProfiles()
	if err != nil {
		return err
	}
	s.holds = append(s.holds, inf)
	profile := func(obj any, present bool) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj, present = d.Obj, false
		}
		if p, ok := obj.(*cpv1alpha1.ClusterProfile); ok {
			s.pool.SetProfile(p.Namespace, p.Name, present && p.DeletionTimestamp == nil && hub.IsOwned(p, s.opts.ClusterManager))
		}
	}
	synced, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { profile(obj, true) },
		UpdateFunc: func(_, obj any) { profile(obj, true) },
		DeleteFunc: func(obj any) { profile(obj, false) },
	})
	if err != nil {
		return err
	}
	s.synced = append(s.synced, synced)
	return nil
}

// Run waits until each handler has been handed every object of the first
// list (the hub cache runs the informers); when ctx ends, the source's
// handlers are removed and its holds released.
func (s *Source) Run(ctx context.Context) error {
	context.AfterFunc(ctx, s.holds.Release)
	if !cache.WaitForCacheSync(ctx.Done(), s.synced...) {
		return errors.New("tunnel pool: informer caches did not sync")
	}
	return nil
}

// sync recomputes one cluster's target from the listers and applies it,
// one cluster at a time.
func (s *Source) sync(cluster string) {
	if cluster == "" {
		return
	}
	s.syncing.Lock()
	defer s.syncing.Unlock()
	mc, err := s.clusters.Get(cluster)
	if err != nil || mc.DeletionTimestamp != nil {
		if err != nil && !apierrors.IsNotFound(err) {
			s.log.Warn("tunnel pool: reading ManagedCluster", "cluster", cluster, "err", err)
		}
		s.pool.SetSelected(cluster, false)
		s.pool.SetTarget(cluster, nil)
		return
	}
	var sec *corev1.Secret
	if s.secrets != nil {
		sec, _ = s.secrets.Secrets(cluster).Get(s.opts.ManagedServiceAccount)
	}
	t := s.target(mc, sec)
	t.UID = mc.UID
	s.pool.SetTarget(cluster, &t)
	s.pool.SetSelected(cluster, s.opts.Selector != nil && s.opts.Selector.Matches(labels.Set(mc.Labels)))
}

// target derives where and how to reach the cluster.
func (s *Source) target(mc *clusterv1.ManagedCluster, sec *corev1.Secret) Target {
	// Only the exclusive set the label names is the cluster's group: sets
	// that select clusters by label may overlap.
	t := Target{ClusterSet: mc.Labels[hub.LabelClusterSet]}
	var u *url.URL
	var caBundle []byte
	for _, c := range mc.Spec.ManagedClusterClientConfigs {
		if c.URL == "" {
			continue
		}
		parsed, err := url.Parse(c.URL)
		if err != nil || parsed.Host == "" {
			t.Err = fmt.Errorf("ManagedCluster's API server URL %q is not a URL", c.URL)
			return t
		}
		u, caBundle = parsed, c.CABundle
		break
	}
	var msaCA []byte
	if sec != nil {
		if tok := bytes.TrimSpace(sec.Data[hub.TokenKey]); len(tok) > 0 {
			t.withToken(string(tok))
			t.TokenFingerprint = hub.TokenFingerprint(tok)
		}
		msaCA = sec.Data[hub.CAKey]
	}
	data := AddressData{ClusterName: mc.Name}
	if u != nil {
		data.ServerHostname = u.Hostname()
		port := u.Port()
		if port == "" {
			port = "443"
		}
		data.ServerHost = net.JoinHostPort(data.ServerHostname, port)
	}
	switch s.opts.Transport {
	case TransportDirect:
		if u == nil {
			t.Err = errors.New("direct transport: the ManagedCluster has no spec.managedClusterClientConfigs URL")
			return t
		}
		t.Address, t.ServerName = data.ServerHost, data.ServerHostname
		// The registration agent reports the CA of the URL it reports.
		t.CA = firstNonEmpty(caBundle, msaCA)
	default:
		var b strings.Builder
		if err := s.tmpl.Execute(&b, data); err != nil {
			t.Err = fmt.Errorf("dial address template: %w", err)
			return t
		}
		addr := b.String()
		if host, port, err := net.SplitHostPort(addr); err != nil || host == "" || port == "" {
			t.Err = fmt.Errorf("dial address %q is not host:port (does the ManagedCluster have a spec.managedClusterClientConfigs URL?)", addr)
			return t
		}
		t.Address, t.ServerName = addr, DefaultKonnectivityServerName
		// Through konnectivity the agent reaches the in-cluster API
		// server, whose CA the ManagedServiceAccount's Secret carries.
		t.CA = firstNonEmpty(msaCA, caBundle)
	}
	if s.opts.ServerName != "" {
		t.ServerName = s.opts.ServerName
	}
	return t
}

func firstNonEmpty(a, b []byte) []byte {
	if len(a) > 0 {
		return a
	}
	return b
}
