package syncer

import (
	"bytes"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"
	cpv1alpha1 "sigs.k8s.io/cluster-inventory-api/apis/v1alpha1"

	"github.com/hubsync/hubsync/hub"
)

// The per-namespace metrics of what consumers hold. Only namespaces that
// hold a profile of hubsync's or a copy have series, so a namespace that
// no longer does drops out.
var (
	consumerProfilesDesc = prometheus.NewDesc("hubsync_consumer_profiles",
		"ClusterProfiles hubsync manages in each consumer namespace.", []string{"consumer_namespace"}, nil)
	consumerCopiesDesc = prometheus.NewDesc("hubsync_consumer_credential_copies",
		"Credential copies in each consumer namespace.", []string{"consumer_namespace"}, nil)
	consumerStaleDesc = prometheus.NewDesc("hubsync_consumer_credential_copies_stale",
		"Credential copies whose token is not their source's current token, in each consumer namespace.", []string{"consumer_namespace"}, nil)
	consumerOldestDesc = prometheus.NewDesc("hubsync_consumer_credential_copy_oldest_timestamp_seconds",
		"Unix time at which the namespace's oldest credential copy was last brought in step with its source: "+
			"its hubsync.io/synced-at annotation, else its creation; time() minus it is that copy's age.", []string{"consumer_namespace"}, nil)
)

// CopyState is what the consumer metrics know of one credential copy.
type CopyState struct {
	// Pair is the copy's "<cluster>/<msa>" source key.
	Pair string
	// SyncedAt is when the copy was last brought in step with its source:
	// its hub.AnnotationSyncedAt stamp, which hubsync writes with the
	// copy's data; for a copy without one (made by the upstream syncer or
	// an earlier hubsync), its creation, the last time its data is known
	// to have been written.
	SyncedAt time.Time
	// Stale: the source has a token and the copy holds another.
	Stale bool
}

// CopyStateOf computes a copy's state; source is the hub token Secret its
// pair's ManagedServiceAccount reports, nil when there is none (then the
// copy cannot be behind anything).
func CopyStateOf(pair string, sec, source *corev1.Secret) CopyState {
	st := CopyState{Pair: pair, SyncedAt: sec.CreationTimestamp.Time}
	if t, err := time.Parse(time.RFC3339, sec.Annotations[hub.AnnotationSyncedAt]); err == nil {
		st.SyncedAt = t
	}
	if source != nil {
		if token := source.Data[hub.TokenKey]; len(bytes.TrimSpace(token)) > 0 {
			st.Stale = !bytes.Equal(sec.Data[hub.TokenKey], token)
		}
	}
	return st
}

// consumerStats keeps, per consumer namespace, hubsync's profiles and the
// credential copies there, updated as the informers deliver changes, so
// that a scrape reads small maps instead of the caches. It is a collector
// of the hubsync_consumer_* metrics, which it reports only while active
// says the syncer runs with synced caches (a standby's syncer never runs).
type consumerStats struct {
	manager string
	active  func() bool
	// credentials: copies are on, so every namespace with a profile has
	// copy series, 0 when it holds none.
	credentials bool

	mu       sync.Mutex
	profiles map[string]map[string]bool      // namespace -> profile names
	copies   map[string]map[string]CopyState // namespace -> copy name -> state
}

func newConsumerStats(manager string, active func() bool, credentials bool) *consumerStats {
	return &consumerStats{
		manager: manager, active: active, credentials: credentials,
		profiles: map[string]map[string]bool{},
		copies:   map[string]map[string]CopyState{},
	}
}

// profileHandler follows the profiles of hubsync's cluster manager.
func (c *consumerStats) profileHandler() cache.ResourceEventHandlerFuncs {
	set := func(obj any, present bool) {
		p, ok := eventObject[*cpv1alpha1.ClusterProfile](obj)
		if !ok {
			return
		}
		present = present && hub.IsOwned(p, c.manager)
		c.mu.Lock()
		defer c.mu.Unlock()
		setIn(c.profiles, p.Namespace, p.Name, true, present)
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { set(obj, true) },
		UpdateFunc: func(_, obj any) { set(obj, true) },
		DeleteFunc: func(obj any) { set(obj, false) },
	}
}

// setCopy records a copy's state, or forgets the copy (present false).
func (c *consumerStats) setCopy(namespace, name string, st CopyState, present bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	setIn(c.copies, namespace, name, st, present)
}

// setIn sets or deletes m[ns][name], dropping a namespace left empty.
func setIn[V any](m map[string]map[string]V, ns, name string, v V, present bool) {
	if present {
		if m[ns] == nil {
			m[ns] = map[string]V{}
		}
		m[ns][name] = v
		return
	}
	delete(m[ns], name)
	if len(m[ns]) == 0 {
		delete(m, ns)
	}
}

func (c *consumerStats) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{consumerProfilesDesc, consumerCopiesDesc, consumerStaleDesc, consumerOldestDesc} {
		ch <- d
	}
}

func (c *consumerStats) Collect(ch chan<- prometheus.Metric) {
	if !c.active() {
		return
	}
	for _, s := range c.Summaries() {
		ch <- prometheus.MustNewConstMetric(consumerProfilesDesc, prometheus.GaugeValue, float64(s.Profiles), s.Namespace)
		if !c.credentials && s.Copies == 0 {
			continue
		}
		ch <- prometheus.MustNewConstMetric(consumerCopiesDesc, prometheus.GaugeValue, float64(s.Copies), s.Namespace)
		ch <- prometheus.MustNewConstMetric(consumerStaleDesc, prometheus.GaugeValue, float64(s.Stale), s.Namespace)
		if s.Copies > 0 {
			ch <- prometheus.MustNewConstMetric(consumerOldestDesc, prometheus.GaugeValue, float64(s.Oldest.UnixNano())/1e9, s.Namespace)
		}
	}
}

// ConsumerSummary is what one consumer namespace holds.
type ConsumerSummary struct {
	Namespace        string
	Profiles, Copies int
	Stale            int
	// Oldest is the earliest SyncedAt of the namespace's copies.
	Oldest time.Time
}

// Summaries sums up every namespace that holds a profile of hubsync's or
// a copy, in no particular order.
func (c *consumerStats) Summaries() []ConsumerSummary {
	c.mu.Lock()
	defer c.mu.Unlock()
	byNS := map[string]*ConsumerSummary{}
	get := func(ns string) *ConsumerSummary {
		if byNS[ns] == nil {
			byNS[ns] = &ConsumerSummary{Namespace: ns}
		}
		return byNS[ns]
	}
	for ns, names := range c.profiles {
		get(ns).Profiles = len(names)
	}
	for ns, copies := range c.copies {
		s := get(ns)
		s.Copies = len(copies)
		for _, st := range copies {
			if st.Stale {
				s.Stale++
			}
			if s.Oldest.IsZero() || st.SyncedAt.Before(s.Oldest) {
				s.Oldest = st.SyncedAt
			}
		}
	}
	out := make([]ConsumerSummary, 0, len(byNS))
	for _, s := range byNS {
		out = append(out, *s)
	}
	return out
}
