// Package hubcache is a process's one cache of the hub: every informer
// hubsync runs, one per resource and selector, shared by every room that
// reads it. The syncer, the tunnel source, the gateway's certificate and
// the Argo CD sink each hold the informers they read and release them when
// they stop; an informer runs while anyone holds it, so a kind that two
// rooms read (ManagedClusters, ClusterProfiles, the ManagedServiceAccount
// token Secrets) is listed and watched once.
//
// Each informer's cache keeps what the rooms read: no managedFields (often
// most of an object), of a ManagedCluster what TrimCluster keeps, and of a
// Secret only the data keys its selector names.
//
// Owns: the informers and the goroutines that run them. It knows the hub's
// resources, not the rooms: each room adds its own indexes and handlers.
// May import hub only.
package hubcache

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	clusterclient "open-cluster-management.io/api/client/cluster/clientset/versioned"
	clusterinformersv1 "open-cluster-management.io/api/client/cluster/informers/externalversions/cluster/v1"
	clusterinformersv1beta2 "open-cluster-management.io/api/client/cluster/informers/externalversions/cluster/v1beta2"
	clusterv1 "open-cluster-management.io/api/cluster/v1"
	msaclient "open-cluster-management.io/managed-serviceaccount/pkg/generated/clientset/versioned"
	msainformers "open-cluster-management.io/managed-serviceaccount/pkg/generated/informers/externalversions/authentication/v1beta1"
	cpclient "sigs.k8s.io/cluster-inventory-api/client/clientset/versioned"
	cpinformers "sigs.k8s.io/cluster-inventory-api/client/informers/externalversions/apis/v1alpha1"

	"github.com/hubsync/hubsync/hub"
)

// Clients are the hub clients the informers list and watch with. MSA may
// be nil when nothing reads ManagedServiceAccounts.
type Clients struct {
	Kube     kubernetes.Interface
	Cluster  clusterclient.Interface
	Profiles cpclient.Interface
	MSA      msaclient.Interface
}

// Cache holds the informers. Start runs them; Stop stops them.
type Cache struct {
	clients Clients
	resync  time.Duration
	running *prometheus.GaugeVec

	mu      sync.Mutex
	ctx     context.Context // set by Start; nil before it and after Stop
	cancel  context.CancelFunc
	entries map[string]*entry
	wg      sync.WaitGroup
}

// entry is one informer and the count of its holders.
type entry struct {
	key      string
	resource string
	inf      cache.SharedIndexInformer
	holders  int
	stop     context.CancelFunc // set once it runs
	done     chan struct{}
}

// New makes an empty cache. reg, if not nil, gets
// hubsync_hub_informers: the informers running, by resource.
func New(c Clients, resync time.Duration, reg prometheus.Registerer) (*Cache, error) {
	hc := &Cache{clients: c, resync: resync, entries: map[string]*entry{},
		running: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "hubsync_hub_informers",
			Help: "Informers this process runs on the hub (each one list and one watch), by resource: one per resource and selector, whichever parts read it.",
		}, []string{"resource"})}
	if reg != nil {
		if err := reg.Register(hc.running); err != nil {
			return nil, fmt.Errorf("hub cache metrics: %w", err)
		}
	}
	return hc, nil
}

// Start runs every informer held now, and each one taken later as it is
// taken, until Stop (or ctx's end).
func (c *Cache) Start(ctx context.Context) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ctx != nil {
		return
	}
	c.ctx, c.cancel = context.WithCancel(ctx)
	for _, e := range c.entries {
		c.run(e)
	}
}

// Stop stops every informer and waits for them. Informers taken after it
// do not run.
func (c *Cache) Stop() {
	c.mu.Lock()
	cancel := c.cancel
	c.ctx, c.cancel = nil, nil
	c.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	c.wg.Wait()
}

// run starts e's informer; the caller holds c.mu and c.ctx is set.
func (c *Cache) run(e *entry) {
	if e.stop != nil {
		return
	}
	ctx, stop := context.WithCancel(c.ctx)
	e.stop = stop
	c.running.WithLabelValues(e.resource).Inc()
	c.wg.Go(func() {
		defer close(e.done)
		defer c.running.WithLabelValues(e.resource).Dec()
		e.inf.RunWithContext(ctx)
	})
}

// take returns the informer under key, made by make if nobody holds one,
// with one more holder, started if the cache runs.
func (c *Cache) take(key, resource string, newInformer func() cache.SharedIndexInformer, transform cache.TransformFunc) (*Informer, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[key]
	if !ok {
		inf := newInformer()
		if err := inf.SetTransform(transform); err != nil {
			return nil, fmt.Errorf("hub cache %s: %w", key, err)
		}
		e = &entry{key: key, resource: resource, inf: inf, done: make(chan struct{})}
		c.entries[key] = e
	}
	e.holders++
	if c.ctx != nil {
		c.run(e)
	}
	return &Informer{c: c, e: e}, nil
}

// release drops one holder of e; the last one stops e's informer and waits
// for it.
func (c *Cache) release(e *entry) {
	c.mu.Lock()
	e.holders--
	last := e.holders == 0
	if last {
		delete(c.entries, e.key)
	}
	stop := e.stop
	c.mu.Unlock()
	if last && stop != nil {
		stop()
		<-e.done
	}
}

// Informer is one holder's hold on a shared informer. Release removes the
// handlers added through it, and stops the informer if no one else holds
// it.
type Informer struct {
	c *Cache
	e *entry

	mu       sync.Mutex
	regs     []cache.ResourceEventHandlerRegistration
	released bool
}

// Informer is the shared informer, for its indexer and to add indexes.
// Add handlers through AddEventHandler, so that Release removes them.
func (i *Informer) Informer() cache.SharedIndexInformer { return i.e.inf }

// AddEventHandler adds h and returns its HasSynced: true once h has been
// handed every object of the informer's first list (or, on an informer
// that runs already, every object it holds).
func (i *Informer) AddEventHandler(h cache.ResourceEventHandler) (cache.InformerSynced, error) {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.released {
		return nil, fmt.Errorf("hub cache %s: released", i.e.key)
	}
	reg, err := i.e.inf.AddEventHandler(h)
	if err != nil {
		return nil, fmt.Errorf("hub cache %s: %w", i.e.key, err)
	}
	i.regs = append(i.regs, reg)
	return reg.HasSynced, nil
}

// Release removes this holder's handlers and gives up its hold. It may be
// called more than once.
func (i *Informer) Release() {
	i.mu.Lock()
	if i.released {
		i.mu.Unlock()
		return
	}
	i.released = true
	regs := i.regs
	i.regs = nil
	i.mu.Unlock()
	for _, r := range regs {
		_ = i.e.inf.RemoveEventHandler(r)
	}
	i.c.release(i.e)
}

// Holds is a set of holds, released together.
type Holds []*Informer

// Release releases every hold.
func (h Holds) Release() {
	for _, i := range h {
		i.Release()
	}
}

// namespaced is the index every lister's namespace lookups use.
var namespaced = cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc}

// ManagedClusters holds the ManagedCluster informer.
func (c *Cache) ManagedClusters() (*Informer, error) {
	return c.take("managedclusters", "managedclusters", func() cache.SharedIndexInformer {
		return clusterinformersv1.NewFilteredManagedClusterInformer(c.clients.Cluster, c.resync, namespaced, nil)
	}, TrimCluster)
}

// ManagedClusterSets holds the ManagedClusterSet informer.
func (c *Cache) ManagedClusterSets() (*Informer, error) {
	return c.take("managedclustersets", "managedclustersets", func() cache.SharedIndexInformer {
		return clusterinformersv1beta2.NewFilteredManagedClusterSetInformer(c.clients.Cluster, c.resync, namespaced, nil)
	}, StripManagedFields)
}

// ManagedClusterSetBindings holds the ManagedClusterSetBinding informer.
func (c *Cache) ManagedClusterSetBindings() (*Informer, error) {
	return c.take("managedclustersetbindings", "managedclustersetbindings", func() cache.SharedIndexInformer {
		return clusterinformersv1beta2.NewFilteredManagedClusterSetBindingInformer(c.clients.Cluster, metav1.NamespaceAll, c.resync, namespaced, nil)
	}, StripManagedFields)
}

// ClusterProfiles holds the informer of every ClusterProfile (hubsync's
// and other managers': the syncer must see the ones in its way).
func (c *Cache) ClusterProfiles() (*Informer, error) {
	return c.take("clusterprofiles", "clusterprofiles", func() cache.SharedIndexInformer {
		return cpinformers.NewFilteredClusterProfileInformer(c.clients.Profiles, metav1.NamespaceAll, c.resync, namespaced, nil)
	}, StripManagedFields)
}

// Namespaces holds the Namespace informer.
func (c *Cache) Namespaces() (*Informer, error) {
	return c.take("namespaces", "namespaces", func() cache.SharedIndexInformer {
		return coreinformers.NewFilteredNamespaceInformer(c.clients.Kube, c.resync, cache.Indexers{}, nil)
	}, StripManagedFields)
}

// ManagedServiceAccounts holds the informer of the ManagedServiceAccounts
// that labelSelector selects, in every namespace.
func (c *Cache) ManagedServiceAccounts(labelSelector string) (*Informer, error) {
	if c.clients.MSA == nil {
		return nil, fmt.Errorf("hub cache: no ManagedServiceAccount client")
	}
	return c.take("managedserviceaccounts?labelSelector="+labelSelector, "managedserviceaccounts", func() cache.SharedIndexInformer {
		return msainformers.NewFilteredManagedServiceAccountInformer(c.clients.MSA, metav1.NamespaceAll, c.resync, namespaced,
			func(lo *metav1.ListOptions) { lo.LabelSelector = labelSelector })
	}, StripManagedFields)
}

// Secrets selects Secrets: never every Secret on the hub, only those a
// label or field selector (or both) picks, and of them only the data keys
// Keep names (nil keeps all).
type Secrets struct {
	Namespace     string // "" for every namespace
	LabelSelector string
	FieldSelector string
	Keep          []string
}

func (s Secrets) key() string {
	keep := "*"
	if s.Keep != nil {
		k := slices.Clone(s.Keep)
		slices.Sort(k)
		keep = strings.Join(k, ",")
	}
	return fmt.Sprintf("secrets/%s?labelSelector=%s&fieldSelector=%s&keep=%s", s.Namespace, s.LabelSelector, s.FieldSelector, keep)
}

// TokenSecrets selects the hub's ManagedServiceAccount token Secrets, by
// the agent's label, keeping the token and the CA: the credentials
// controller reads every one, the tunnel source its ManagedServiceAccount's.
func TokenSecrets() Secrets {
	return Secrets{
		LabelSelector: labels.SelectorFromSet(labels.Set{hub.LabelIsManagedServiceAccount: "true"}).String(),
		Keep:          []string{hub.TokenKey, hub.CAKey},
	}
}

// Secrets holds the informer of the Secrets s selects.
func (c *Cache) Secrets(s Secrets) (*Informer, error) {
	if s.LabelSelector == "" && s.FieldSelector == "" {
		return nil, fmt.Errorf("hub cache: a Secret informer needs a label or field selector")
	}
	return c.take(s.key(), "secrets", func() cache.SharedIndexInformer {
		return coreinformers.NewFilteredSecretInformer(c.clients.Kube, s.Namespace, c.resync, namespaced, func(lo *metav1.ListOptions) {
			lo.LabelSelector, lo.FieldSelector = s.LabelSelector, s.FieldSelector
		})
	}, func(obj any) (any, error) {
		sec, ok := obj.(*corev1.Secret)
		if !ok {
			return obj, nil
		}
		sec.ManagedFields = nil
		if s.Keep != nil {
			data := make(map[string][]byte, len(s.Keep))
			for _, k := range s.Keep {
				if v, ok := sec.Data[k]; ok {
					data[k] = v
				}
			}
			sec.Data, sec.StringData = data, nil
		}
		return sec, nil
	})
}

// StripManagedFields drops an object's managedFields: hubsync never reads
// them.
func StripManagedFields(obj any) (any, error) {
	if a, err := meta.Accessor(obj); err == nil {
		a.SetManagedFields(nil)
	}
	return obj, nil
}

// ClusterConditions are the ManagedCluster conditions the cache keeps:
// the ones the syncer mirrors into each profile's status.
var ClusterConditions = []string{clusterv1.ManagedClusterConditionAvailable, clusterv1.ManagedClusterConditionJoined}

// TrimCluster keeps of a ManagedCluster what the parts read (the syncer's
// profiles, the tunnel pool's targets; their tests hold it to that): its
// name, UID, resourceVersion, labels and deletion, its client configs, and
// its version, claims and ClusterConditions. Not its annotations,
// managedFields, owners or finalizers, taints, capacity, allocatable or
// other conditions.
func TrimCluster(obj any) (any, error) {
	mc, ok := obj.(*clusterv1.ManagedCluster)
	if !ok {
		return StripManagedFields(obj)
	}
	out := &clusterv1.ManagedCluster{
		TypeMeta: mc.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Name: mc.Name, UID: mc.UID, ResourceVersion: mc.ResourceVersion,
			Labels: mc.Labels, DeletionTimestamp: mc.DeletionTimestamp,
		},
		Spec: clusterv1.ManagedClusterSpec{ManagedClusterClientConfigs: mc.Spec.ManagedClusterClientConfigs},
		Status: clusterv1.ManagedClusterStatus{
			Version:       mc.Status.Version,
			ClusterClaims: mc.Status.ClusterClaims,
		},
	}
	for _, c := range mc.Status.Conditions {
		if slices.Contains(ClusterConditions, c.Type) {
			out.Status.Conditions = append(out.Status.Conditions, c)
		}
	}
	return out, nil
}
