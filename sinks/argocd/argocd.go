// Package argocd is the Argo CD sink: it keeps one Argo CD cluster Secret
// per ClusterProfile of one consumer namespace, in Argo CD's namespace on
// the hub, so Argo CD can deploy to every cluster the namespace may use.
//
// A Secret reaches its cluster through the profile's access provider named
// in the configuration, and authenticates with the credential copy of the
// configured ManagedServiceAccount: by running `hubsync creds` (exec mode,
// the default: the Secret never changes when the token rotates) or with
// the token itself (token mode: rewritten on every rotation). In exec mode
// the cluster is named in the plugin's arguments, or, with
// provideClusterInfo (Argo CD 3.5 and later), handed to the plugin by Argo
// CD, which lets the Secret run managed-serviceaccount's cp-creds too.
//
// Argo CD knows clusters by server URL, so the sink never writes two
// Secrets with one server: of several clusters with one server the first
// by name gets it, and a server that already belongs to a cluster Secret
// hubsync does not own is left to it. Both are reported (log lines and the
// hubsync_argocd_conflicts gauge), not retried as errors. A cluster the
// argoproj-labs ClusterProfile integration already gives Argo CD (a Secret
// of the same profile or server) is left to it, and reported apart
// (hubsync_argocd_clusters_skipped): see integration.go. The sink never
// changes or deletes a Secret that lacks its ownership labels.
//
// May import sinks, config, stream and hub; never syncer or bus.
package argocd

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/hubcache"
	"github.com/hubsync/hubsync/sinks"
	"github.com/hubsync/hubsync/stream"
)

// Sink keeps the Argo CD cluster Secrets of one consumer namespace.
type Sink struct {
	name      string
	cfg       config.ArgoCDSink
	kube      kubernetes.Interface
	cache     *hubcache.Cache
	log       *slog.Logger
	conflicts conflictGauge

	// mu guards what follows. The stream calls Deliver and Resync from one
	// goroutine, but Close may come from another.
	mu sync.Mutex
	// clusters is what the stream said about each cluster of the consumer
	// namespace: the state every decision is computed from, so that
	// Deliver and Resync decide alike.
	clusters sinks.Clusters
	// conflicted holds the clusters currently reported, with the reason,
	// so each conflict is logged once rather than on every delivery.
	conflicted map[string]string
	// skipped holds the clusters left to the ClusterProfile integration,
	// for the same reason, and skips counts them.
	skipped map[string]skip
	skips   *skipGauge
	// retry holds the clusters of a delivery that failed. The state took
	// the changes already, so a retried batch no longer shows which other
	// clusters competed for a server it freed; they are decided again on
	// the next delivery.
	retry sinks.RetrySet
	// obs is what the last list of Argo CD's namespace showed, kept up to
	// date with the sink's own writes, so that a burst of deliveries costs
	// one list every obsMaxAge instead of two per batch (each returning
	// every cluster Secret). Errors and resyncs list afresh.
	obs    sinks.Observed[*observed]
	now    func() time.Time
	closed bool

	// watch follows the ClusterProfile integration's Secrets once the sink
	// is attached to a worker; it has a lock of its own, so that Close can
	// stop it while a delivery holds mu.
	watch integrationWatch
}

var _ sinks.Sink = (*Sink)(nil)

// New makes an Argo CD sink from its configuration. It is a sinks.Factory.
func New(cfg config.Sink, deps sinks.Deps) (sinks.Sink, error) {
	if cfg.ArgoCD == nil {
		return nil, fmt.Errorf("argocd sink %s: no argocd section", cfg.Name)
	}
	if deps.Kube == nil {
		return nil, fmt.Errorf("argocd sink %s: no hub client", cfg.Name)
	}
	a := *cfg.ArgoCD
	// config fills every default; a missing value here is a caller's bug.
	switch {
	case cfg.Name == "":
		return nil, errors.New("argocd sink: no name")
	case a.Namespace == "":
		return nil, fmt.Errorf("argocd sink %s: no namespace (config.SetDefaults fills it)", cfg.Name)
	case a.Auth == config.AuthExec && a.Exec.Command == "":
		return nil, fmt.Errorf("argocd sink %s: no exec command (config.SetDefaults fills it)", cfg.Name)
	case a.ConsumerNamespace == "":
		return nil, fmt.Errorf("argocd sink %s: no consumerNamespace", cfg.Name)
	case a.AccessProvider == "":
		return nil, fmt.Errorf("argocd sink %s: no accessProvider", cfg.Name)
	case a.ManagedServiceAccount == "":
		return nil, fmt.Errorf("argocd sink %s: no managedServiceAccount", cfg.Name)
	case a.Auth != config.AuthExec && a.Auth != config.AuthToken:
		return nil, fmt.Errorf("argocd sink %s: auth %q is neither %s nor %s", cfg.Name, a.Auth, config.AuthExec, config.AuthToken)
	case a.ExecPlugin != config.ExecPluginHubsync && a.ExecPlugin != config.ExecPluginCPCreds:
		return nil, fmt.Errorf("argocd sink %s: exec plugin %q is neither %s nor %s (config.SetDefaults fills it)",
			cfg.Name, a.ExecPlugin, config.ExecPluginHubsync, config.ExecPluginCPCreds)
	case a.ExecPlugin == config.ExecPluginCPCreds && !a.ProvideClusterInfo:
		return nil, fmt.Errorf("argocd sink %s: cp-creds learns the cluster only from provideClusterInfo", cfg.Name)
	}
	if a.Shard != "" {
		// Argo CD ignores a shard that is not a number, with a warning in
		// its own log only; say so where the operator looks.
		if n, err := strconv.Atoi(a.Shard); err != nil || n < 0 {
			return nil, fmt.Errorf("argocd sink %s: shard %q is not a non-negative integer", cfg.Name, a.Shard)
		}
	}
	// The slices and maps are the configuration's; the sink keeps copies
	// so a caller reusing them cannot change a running sink.
	a.Namespaces = slices.Clone(a.Namespaces)
	a.Labels = maps.Clone(a.Labels)
	a.Annotations = maps.Clone(a.Annotations)
	gauge, err := newConflictGauge(deps.Registerer, cfg.Name)
	if err != nil {
		return nil, fmt.Errorf("argocd sink %s: %w", cfg.Name, err)
	}
	skips, err := newSkipGauge(deps.Registerer, cfg.Name)
	if err != nil {
		return nil, fmt.Errorf("argocd sink %s: %w", cfg.Name, err)
	}
	log := deps.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Sink{
		now:        time.Now,
		name:       cfg.Name,
		cfg:        a,
		kube:       deps.Kube,
		cache:      deps.Cache,
		log:        log.With("sink", cfg.Name, "argocdNamespace", a.Namespace),
		conflicts:  gauge,
		skips:      skips,
		clusters:   sinks.Clusters{},
		conflicted: map[string]string{},
		skipped:    map[string]skip{},
		obs:        sinks.Observed[*observed]{MaxAge: obsMaxAge},
	}, nil
}

// Close stops the sink's watch and forgets its metric series. The Secrets
// stay: a sink taken out of the configuration leaves its output as it is.
func (s *Sink) Close() error {
	s.stopWatch()
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		s.closed = true
		s.conflicts.forget()
		s.skips.forget()
	}
	return nil
}

// Deliver applies changes. Changes of other namespaces are ignored. It
// returns the failures joined; delivering the same changes again is
// harmless.
func (s *Sink) Deliver(ctx context.Context, changes []stream.Change) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("argocd sink closed")
	}
	touched := s.retry.Begin()
	servers := map[string]bool{}
	for _, c := range changes {
		if c.Namespace != s.cfg.ConsumerNamespace || c.Cluster == "" {
			continue
		}
		// A change can free a server (the old one) and claim another (the
		// new one); the clusters competing for either are decided again.
		before := s.candidateServer(c.Cluster)
		if !s.apply(c) {
			continue
		}
		touched[c.Cluster] = true
		servers[before] = true
		servers[s.candidateServer(c.Cluster)] = true
	}
	if len(touched) == 0 {
		return nil
	}
	delete(servers, "")
	for cluster := range s.clusters {
		if servers[s.candidateServer(cluster)] {
			touched[cluster] = true
		}
	}
	obs, err := s.obs.Get(ctx, s.now, s.observe)
	if err == nil {
		err = s.reconcile(ctx, obs, slices.Sorted(maps.Keys(touched)))
	}
	s.retry.End(touched, err)
	if err != nil {
		s.obs.Forget()
		return err
	}
	for cluster := range touched {
		s.forgetIfGone(cluster)
	}
	return nil
}

// apply records c in the sink's state and reports whether it concerns the
// sink.
func (s *Sink) apply(c stream.Change) bool {
	switch s.clusters.Apply(c, s.cfg.ManagedServiceAccount) {
	case sinks.AppliedProfile:
		return true
	case sinks.AppliedCredential:
		// In exec mode the Secret names the credential and does not hold
		// it: a new or rotated token changes nothing, and costs no call.
		return s.tokenMode()
	}
	return false
}

// forgetIfGone drops a cluster the sink has nothing left about.
func (s *Sink) forgetIfGone(cluster string) {
	if s.clusters.ForgetIfGone(cluster) {
		s.setConflict(cluster, "")
		s.setSkip(cluster, nil)
	}
}

// Resync makes the Secrets match snapshot: it writes those missing or
// outdated and deletes the sink's own Secrets of clusters not in it.
func (s *Sink) Resync(ctx context.Context, snapshot []stream.Change) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("argocd sink closed")
	}
	s.clusters = sinks.Clusters{}
	for _, c := range snapshot {
		if c.Namespace != s.cfg.ConsumerNamespace || c.Cluster == "" {
			continue
		}
		s.apply(c)
	}
	for cluster := range s.conflicted {
		if s.clusters[cluster] == nil {
			s.setConflict(cluster, "")
		}
	}
	for cluster := range s.skipped {
		if s.clusters[cluster] == nil {
			s.setSkip(cluster, nil)
		}
	}
	s.obs.Forget()
	obs, err := s.obs.Get(ctx, s.now, s.observe)
	if err != nil {
		return err
	}
	clusters := slices.Collect(maps.Keys(s.clusters))
	// Secrets of clusters the sink no longer knows are reconciled as well:
	// with no state, they are deleted.
	for _, sec := range obs.ours {
		if cluster := string(sec.Data["name"]); cluster != "" && s.clusters[cluster] == nil {
			clusters = append(clusters, cluster)
		}
	}
	var errs []error
	want := map[string]bool{}
	for _, c := range clusters {
		want[SecretName(s.name, c)] = true
	}
	for _, sec := range obs.ours {
		// A Secret of the sink whose name no cluster maps to (its data
		// edited, or left from an older naming) is deleted too.
		if !want[sec.Name] {
			errs = append(errs, s.delete(ctx, sec))
		}
	}
	slices.Sort(clusters)
	errs = append(errs, s.reconcile(ctx, obs, slices.Compact(clusters)))
	if err := errors.Join(errs...); err != nil {
		return err
	}
	// A resync decided every cluster: nothing is left to retry.
	s.retry.Clear()
	return nil
}

// candidateServer returns the server cluster's Secret would have, or ""
// when the sink wants no Secret for it: no profile, no such access
// provider or server, or in token mode no credential copy.
func (s *Sink) candidateServer(cluster string) string {
	st := s.clusters[cluster]
	if st == nil || st.Profile == nil {
		return ""
	}
	if s.tokenMode() && !st.Credential {
		return ""
	}
	p, ok := st.Profile.Provider(s.cfg.AccessProvider)
	if !ok {
		return ""
	}
	return trimServer(p.Server)
}

// winners returns, per server, the cluster that gets it: the first by
// name of those that want it, leaving out the clusters the ClusterProfile
// integration covers (they get no Secret, so they take no server).
func (s *Sink) winners(obs *observed) map[string]string {
	w := map[string]string{}
	for cluster := range s.clusters {
		srv := s.candidateServer(cluster)
		if srv == "" || obs.integration.covering(s.cfg.ConsumerNamespace, cluster, srv) != nil {
			continue
		}
		if cur, ok := w[srv]; !ok || cluster < cur {
			w[srv] = cluster
		}
	}
	return w
}

// observed is the Argo CD namespace as one delivery found it.
type observed struct {
	// ours are the sink's Secrets by name.
	ours map[string]*corev1.Secret
	// foreign are the cluster Secrets the sink does not own, by server.
	foreign map[string][]*corev1.Secret
	// integration are those of them the ClusterProfile integration wrote.
	integration integrationSecrets
}

// obsMaxAge bounds how long a list of Argo CD's namespace is reused: a
// foreign cluster Secret created meanwhile is noticed within it.
const obsMaxAge = 30 * time.Second

// remember records a Secret the sink wrote in the observed state.
func (s *Sink) remember(sec *corev1.Secret) {
	if obs, ok := s.obs.Current(); ok && sec != nil {
		obs.ours[sec.Name] = sec
	}
}

// forget drops a Secret the sink deleted from the observed state.
func (s *Sink) forget(sec *corev1.Secret) {
	if obs, ok := s.obs.Current(); ok {
		delete(obs.ours, sec.Name)
	}
}

// observe lists the sink's Secrets and every other cluster Secret of the
// Argo CD namespace.
func (s *Sink) observe(ctx context.Context) (*observed, error) {
	secrets := s.kube.CoreV1().Secrets(s.cfg.Namespace)
	ours, err := secrets.List(ctx, metav1.ListOptions{LabelSelector: labels.SelectorFromSet(labels.Set{
		LabelManagedBy: ManagedBy,
		LabelSink:      s.name,
	}).String()})
	if err != nil {
		return nil, fmt.Errorf("list the Secrets of sink %s in %s: %w", s.name, s.cfg.Namespace, err)
	}
	all, err := secrets.List(ctx, metav1.ListOptions{LabelSelector: labels.SelectorFromSet(labels.Set{
		LabelSecretType: SecretTypeCluster,
	}).String()})
	if err != nil {
		return nil, fmt.Errorf("list the Argo CD cluster Secrets in %s: %w", s.cfg.Namespace, err)
	}
	obs := &observed{ours: map[string]*corev1.Secret{}, foreign: map[string][]*corev1.Secret{}, integration: newIntegrationSecrets()}
	for i := range ours.Items {
		if sec := &ours.Items[i]; owned(sec, s.name) {
			obs.ours[sec.Name] = sec
		}
	}
	for i := range all.Items {
		sec := &all.Items[i]
		if owned(sec, s.name) {
			continue
		}
		srv := trimServer(string(sec.Data["server"]))
		obs.foreign[srv] = append(obs.foreign[srv], sec)
		if isIntegrationSecret(sec) {
			obs.integration.add(sec)
		}
	}
	return obs, nil
}

// decision is what the sink does about one cluster.
type decision struct {
	cluster string
	// server is the Secret's server; "" means the cluster gets no Secret.
	server string
	// cur is the sink's Secret of the cluster, if there is one.
	cur *corev1.Secret
	// conflict says why the cluster gets no Secret, or, with a server,
	// which foreign Secret duplicates the one the sink keeps.
	conflict string
	// skip, when set, says that the ClusterProfile integration's Secret
	// gives Argo CD the cluster already, so the sink keeps none.
	skip *skip
}

// decide computes what the sink does about cluster, given the Argo CD
// namespace and the winners of each server among the sink's clusters.
func (s *Sink) decide(obs *observed, winners map[string]string, cluster string) decision {
	d := decision{cluster: cluster, cur: obs.ours[SecretName(s.name, cluster)]}
	srv := s.candidateServer(cluster)
	if srv == "" {
		return d
	}
	// The integration's Secret wins over the sink's whichever is older;
	// other foreign Secrets only when they are.
	if d.skip = obs.integration.covering(s.cfg.ConsumerNamespace, cluster, srv); d.skip != nil {
		return d
	}
	switch f := oldestForeign(obs.foreign[srv]); {
	case winners[srv] != cluster:
		d.conflict = fmt.Sprintf("cluster %s has the same server %s and comes first by name", winners[srv], srv)
	case f != nil && (d.cur == nil || !olderThan(d.cur, f)):
		d.conflict = fmt.Sprintf("Secret %s, which hubsync does not own, already has the server %s", f.Name, srv)
	case f != nil:
		// The sink's Secret came first: it keeps the server, and the
		// newcomer is reported for its owner to remove.
		d.server = srv
		d.conflict = fmt.Sprintf("Secret %s, which hubsync does not own, was created later with the same server %s", f.Name, srv)
	default:
		d.server = srv
	}
	return d
}

// reconcile brings the Secrets of clusters to what the state says. It
// deletes before it writes, so a server moving from one cluster to another
// never has two Secrets, even briefly.
func (s *Sink) reconcile(ctx context.Context, obs *observed, clusters []string) error {
	winners := s.winners(obs)
	var deletes, writes []decision
	for _, cluster := range clusters {
		d := s.decide(obs, winners, cluster)
		s.setSkip(cluster, d.skip)
		if d.server == "" {
			s.setConflict(cluster, d.conflict)
			if d.cur != nil {
				deletes = append(deletes, d)
			}
			continue
		}
		writes = append(writes, d)
	}
	var errs []error
	for _, d := range deletes {
		errs = append(errs, s.delete(ctx, d.cur))
	}
	for _, d := range writes {
		taken, err := s.write(ctx, d)
		if err == nil {
			s.setConflict(d.cluster, cmp.Or(taken, d.conflict))
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// oldestForeign returns the oldest of secrets, nil if there are none.
func oldestForeign(secrets []*corev1.Secret) *corev1.Secret {
	var oldest *corev1.Secret
	for _, sec := range secrets {
		if oldest == nil || olderThan(sec, oldest) {
			oldest = sec
		}
	}
	return oldest
}

// olderThan orders Secrets by creation, then name. When hubsync's Secret
// and a foreign one share a server, the older keeps it: a Secret that
// came later never displaces one Argo CD already uses, and two hubsync
// sinks that raced settle on the same one.
func olderThan(a, b *corev1.Secret) bool {
	if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
		return a.CreationTimestamp.Before(&b.CreationTimestamp)
	}
	return cmp.Less(a.Name, b.Name)
}

// write creates or updates the Secret of d.cluster unless it is up to
// date. It returns why it wrote nothing when the name is taken by a
// Secret the sink does not own.
func (s *Sink) write(ctx context.Context, d decision) (conflict string, err error) {
	st := s.clusters[d.cluster]
	p, _ := st.Profile.Provider(s.cfg.AccessProvider)
	in := clusterSecret{cluster: d.cluster, server: d.server, caData: p.CAData}
	if s.tokenMode() {
		tok, err := sinks.Token(ctx, s.kube, s.cfg.ConsumerNamespace, d.cluster, s.cfg.ManagedServiceAccount)
		switch {
		case errors.Is(err, sinks.ErrNoToken):
			// The copy went away after the change that announced it: no
			// usable Secret, and its removal will be delivered too.
			if d.cur != nil {
				return "", s.delete(ctx, d.cur)
			}
			return "", nil
		case err != nil:
			return "", fmt.Errorf("cluster %s: %w", d.cluster, err)
		}
		in.token = tok
	}
	want, err := s.render(in)
	if err != nil {
		return "", err
	}
	secrets := s.kube.CoreV1().Secrets(s.cfg.Namespace)
	cur := d.cur
	if cur == nil {
		created, err := secrets.Create(ctx, want, metav1.CreateOptions{FieldManager: ManagedBy})
		switch {
		case err == nil:
			s.remember(created)
			s.log.Info("created Argo CD cluster Secret", "cluster", d.cluster, "secret", want.Name, "server", d.server)
			return "", nil
		case !apierrors.IsAlreadyExists(err):
			return "", fmt.Errorf("create Secret %s/%s for cluster %s: %w", want.Namespace, want.Name, d.cluster, err)
		}
		// The name is taken by a Secret the list did not show as ours.
		cur, err = secrets.Get(ctx, want.Name, metav1.GetOptions{})
		if err != nil {
			return "", fmt.Errorf("get Secret %s/%s for cluster %s: %w", want.Namespace, want.Name, d.cluster, err)
		}
		if !owned(cur, s.name) {
			return fmt.Sprintf("Secret %s, which hubsync does not own, has the name hubsync would use", want.Name), nil
		}
	}
	if upToDate(cur, want) {
		return "", nil
	}
	out, err := secrets.Update(ctx, updated(cur, want), metav1.UpdateOptions{FieldManager: ManagedBy})
	if err != nil {
		return "", fmt.Errorf("update Secret %s/%s for cluster %s: %w", want.Namespace, want.Name, d.cluster, err)
	}
	s.remember(out)
	s.log.Info("updated Argo CD cluster Secret", "cluster", d.cluster, "secret", want.Name, "server", d.server)
	return "", nil
}

// delete deletes one of the sink's Secrets, provided it is still the
// object the sink saw.
func (s *Sink) delete(ctx context.Context, sec *corev1.Secret) error {
	err := s.kube.CoreV1().Secrets(sec.Namespace).Delete(ctx, sec.Name, metav1.DeleteOptions{
		Preconditions: &metav1.Preconditions{UID: &sec.UID},
	})
	switch {
	case apierrors.IsNotFound(err):
		s.forget(sec)
		return nil
	case err != nil:
		return fmt.Errorf("delete Secret %s/%s: %w", sec.Namespace, sec.Name, err)
	}
	s.forget(sec)
	s.log.Info("deleted Argo CD cluster Secret", "cluster", string(sec.Data["name"]), "secret", sec.Name)
	return nil
}

// setConflict records why cluster gets no Secret ("" for no conflict),
// logging a conflict when it starts or its reason changes.
func (s *Sink) setConflict(cluster, reason string) {
	old, had := s.conflicted[cluster]
	switch {
	case reason == "" && had:
		delete(s.conflicted, cluster)
		s.log.Info("Argo CD cluster conflict resolved", "cluster", cluster)
	case reason != "" && reason != old:
		s.conflicted[cluster] = reason
		s.log.Warn("Argo CD cluster conflict: Argo CD knows clusters by server, so two Secrets must not share one",
			"cluster", cluster, "reason", reason)
	}
	s.conflicts.set(len(s.conflicted))
}

func (s *Sink) tokenMode() bool { return s.cfg.Auth == config.AuthToken }

// credsArgs are the arguments of the exec plugin for cluster.
func (s *Sink) credsArgs(cluster string) []string {
	return sinks.CredsArgs(s.cfg.ManagedServiceAccount, cluster, s.cfg.ConsumerNamespace)
}
