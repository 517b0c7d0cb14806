// Package fleet creates simulated OCM fleets on a hub API server for tests,
// the demo and benchmarks: ManagedClusters with status as a registration
// agent would write it, cluster sets, and bindings marked Bound as OCM's
// binding controller would.
package fleet

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	clusterclient "open-cluster-management.io/api/client/cluster/clientset/versioned"
	clusterv1 "open-cluster-management.io/api/cluster/v1"
	clusterv1beta2 "open-cluster-management.io/api/cluster/v1beta2"
	msaclient "open-cluster-management.io/managed-serviceaccount/pkg/generated/clientset/versioned"
	cpv1alpha1 "sigs.k8s.io/cluster-inventory-api/apis/v1alpha1"
	cpclient "sigs.k8s.io/cluster-inventory-api/client/clientset/versioned"

	"github.com/hubsync/hubsync/hubcache"
)

// Hub holds clients for a hub API server.
type Hub struct {
	Kube     kubernetes.Interface
	Cluster  clusterclient.Interface
	Profiles cpclient.Interface
	MSA      msaclient.Interface

	mu     sync.Mutex
	tokens []string // every token PutToken wrote or a test noted, for leak checks
}

// Cache makes a hub cache over the hub's clients, stopped when the test
// ends; the caller starts it.
func (h *Hub) Cache(t testing.TB) *hubcache.Cache {
	t.Helper()
	hc, err := hubcache.New(hubcache.Clients{Kube: h.Kube, Cluster: h.Cluster, Profiles: h.Profiles, MSA: h.MSA}, time.Hour, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(hc.Stop)
	return hc
}

// Tokens returns every token PutToken has written through this Hub, so a
// test can check that none of them leaks into logs, Events or events.
func (h *Hub) Tokens() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.tokens)
}

// NoteToken adds a token a test writes some other way than PutToken to
// those Tokens returns.
func (h *Hub) NoteToken(token string) {
	if token == "" {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if !slices.Contains(h.tokens, token) {
		h.tokens = append(h.tokens, token)
	}
}

// NewHub builds clients with a request rate high enough for fleet set-up,
// unless cfg sets one.
func NewHub(cfg *rest.Config) (*Hub, error) {
	cfg = rest.CopyConfig(cfg)
	if cfg.QPS == 0 {
		cfg.QPS, cfg.Burst = 2000, 4000
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kube client: %w", err)
	}
	cc, err := clusterclient.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("cluster client: %w", err)
	}
	pc, err := cpclient.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("profile client: %w", err)
	}
	mc, err := msaclient.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("managed service account client: %w", err)
	}
	return &Hub{Kube: kube, Cluster: cc, Profiles: pc, MSA: mc}, nil
}

// Namespace creates a namespace if it does not exist.
func (h *Hub) Namespace(ctx context.Context, name string) error {
	_, err := h.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create namespace %s: %w", name, err)
	}
	return nil
}

// ClusterSpec describes a simulated managed cluster.
type ClusterSpec struct {
	Name       string
	Labels     map[string]string
	Version    string
	Claims     map[string]string
	Available  metav1.ConditionStatus // "" means True
	Finalizers []string
	// ClientConfigs are the API server URLs and CA bundles the
	// registration agent reports (spec.managedClusterClientConfigs).
	ClientConfigs []clusterv1.ClientConfig
}

// ExclusiveSetLabels returns the labels that put a cluster in an
// ExclusiveClusterSetLabel set, merged with extra.
func ExclusiveSetLabels(set string, extra map[string]string) map[string]string {
	l := map[string]string{clusterv1beta2.ClusterSetLabel: set}
	for k, v := range extra {
		l[k] = v
	}
	return l
}

// CreateCluster creates a ManagedCluster and writes its status as the
// registration agent would: version, claims, Joined and Available.
func (h *Hub) CreateCluster(ctx context.Context, spec ClusterSpec) (*clusterv1.ManagedCluster, error) {
	c := &clusterv1.ManagedCluster{
		ObjectMeta: metav1.ObjectMeta{Name: spec.Name, Labels: spec.Labels, Finalizers: spec.Finalizers},
		Spec:       clusterv1.ManagedClusterSpec{HubAcceptsClient: true, ManagedClusterClientConfigs: spec.ClientConfigs},
	}
	created, err := h.Cluster.ClusterV1().ManagedClusters().Create(ctx, c, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("create cluster %s: %w", spec.Name, err)
	}
	created.Status = Status(spec)
	updated, err := h.Cluster.ClusterV1().ManagedClusters().UpdateStatus(ctx, created, metav1.UpdateOptions{})
	if err != nil {
		return nil, fmt.Errorf("write status of cluster %s: %w", spec.Name, err)
	}
	return updated, nil
}

// Status is the ManagedCluster status a registration agent reports for spec.
func Status(spec ClusterSpec) clusterv1.ManagedClusterStatus {
	avail := spec.Available
	if avail == "" {
		avail = metav1.ConditionTrue
	}
	version := spec.Version
	if version == "" {
		version = "v1.35.4"
	}
	names := make([]string, 0, len(spec.Claims))
	for k := range spec.Claims {
		names = append(names, k)
	}
	sort.Strings(names)
	claims := make([]clusterv1.ManagedClusterClaim, 0, len(names))
	for _, k := range names {
		claims = append(claims, clusterv1.ManagedClusterClaim{Name: k, Value: spec.Claims[k]})
	}
	now := metav1.NewTime(time.Now().Truncate(time.Second))
	return clusterv1.ManagedClusterStatus{
		Version:       clusterv1.ManagedClusterVersion{Kubernetes: version},
		ClusterClaims: claims,
		Conditions: []metav1.Condition{
			{Type: clusterv1.ManagedClusterConditionJoined, Status: metav1.ConditionTrue, Reason: "ManagedClusterJoined", Message: "Managed cluster joined", LastTransitionTime: now},
			availableCondition(avail, now),
		},
	}
}

func availableCondition(status metav1.ConditionStatus, at metav1.Time) metav1.Condition {
	c := metav1.Condition{Type: clusterv1.ManagedClusterConditionAvailable, Status: status, LastTransitionTime: at}
	switch status {
	case metav1.ConditionTrue:
		c.Reason, c.Message = "ManagedClusterAvailable", "Managed cluster is available"
	case metav1.ConditionFalse:
		c.Reason, c.Message = "ManagedClusterLeaseUpdateStopped", "Registration agent stopped updating its lease."
	default:
		c.Reason, c.Message = "ManagedClusterUnknown", "Managed cluster status is unknown"
	}
	return c
}

// SetAvailable flips a cluster's Available condition.
func (h *Hub) SetAvailable(ctx context.Context, name string, status metav1.ConditionStatus) error {
	return h.UpdateClusterStatus(ctx, name, func(st *clusterv1.ManagedClusterStatus) {
		meta.SetStatusCondition(&st.Conditions, availableCondition(status, metav1.Now()))
	})
}

// UpdateClusterStatus applies mutate to a cluster's status, retrying on
// conflicts.
func (h *Hub) UpdateClusterStatus(ctx context.Context, name string, mutate func(*clusterv1.ManagedClusterStatus)) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		c, err := h.Cluster.ClusterV1().ManagedClusters().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		mutate(&c.Status)
		_, err = h.Cluster.ClusterV1().ManagedClusters().UpdateStatus(ctx, c, metav1.UpdateOptions{})
		return err
	})
}

// UpdateCluster applies mutate to a cluster, retrying on conflicts.
func (h *Hub) UpdateCluster(ctx context.Context, name string, mutate func(*clusterv1.ManagedCluster)) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		c, err := h.Cluster.ClusterV1().ManagedClusters().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		mutate(c)
		_, err = h.Cluster.ClusterV1().ManagedClusters().Update(ctx, c, metav1.UpdateOptions{})
		return err
	})
}

// Relabel sets (or, with value "", removes) one label of a cluster.
func (h *Hub) Relabel(ctx context.Context, name, key, value string) error {
	return h.UpdateCluster(ctx, name, func(c *clusterv1.ManagedCluster) {
		if value == "" {
			delete(c.Labels, key)
			return
		}
		if c.Labels == nil {
			c.Labels = map[string]string{}
		}
		c.Labels[key] = value
	})
}

// DeleteCluster deletes a cluster.
func (h *Hub) DeleteCluster(ctx context.Context, name string) error {
	if err := h.Cluster.ClusterV1().ManagedClusters().Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		return fmt.Errorf("delete cluster %s: %w", name, err)
	}
	return nil
}

// CreateExclusiveSet creates a set that selects clusters by the clusterset
// label.
func (h *Hub) CreateExclusiveSet(ctx context.Context, name string) error {
	return h.createSet(ctx, name, clusterv1beta2.ManagedClusterSelector{SelectorType: clusterv1beta2.ExclusiveClusterSetLabel})
}

// CreateLabelSelectorSet creates a set that selects clusters by sel.
func (h *Hub) CreateLabelSelectorSet(ctx context.Context, name string, sel *metav1.LabelSelector) error {
	return h.createSet(ctx, name, clusterv1beta2.ManagedClusterSelector{SelectorType: clusterv1beta2.LabelSelector, LabelSelector: sel})
}

func (h *Hub) createSet(ctx context.Context, name string, sel clusterv1beta2.ManagedClusterSelector) error {
	set := &clusterv1beta2.ManagedClusterSet{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       clusterv1beta2.ManagedClusterSetSpec{ClusterSelector: sel},
	}
	if _, err := h.Cluster.ClusterV1beta2().ManagedClusterSets().Create(ctx, set, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create cluster set %s: %w", name, err)
	}
	return nil
}

// UpdateSet applies mutate to a set, retrying on conflicts.
func (h *Hub) UpdateSet(ctx context.Context, name string, mutate func(*clusterv1beta2.ManagedClusterSet)) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		s, err := h.Cluster.ClusterV1beta2().ManagedClusterSets().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		mutate(s)
		_, err = h.Cluster.ClusterV1beta2().ManagedClusterSets().Update(ctx, s, metav1.UpdateOptions{})
		return err
	})
}

// DeleteSet deletes a set.
func (h *Hub) DeleteSet(ctx context.Context, name string) error {
	if err := h.Cluster.ClusterV1beta2().ManagedClusterSets().Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		return fmt.Errorf("delete cluster set %s: %w", name, err)
	}
	return nil
}

// Bind creates a binding of set in namespace and, when bound is true, marks
// it Bound as OCM's binding controller does once the set exists.
func (h *Hub) Bind(ctx context.Context, namespace, set string, bound bool) error {
	b := &clusterv1beta2.ManagedClusterSetBinding{
		ObjectMeta: metav1.ObjectMeta{Name: set, Namespace: namespace},
		Spec:       clusterv1beta2.ManagedClusterSetBindingSpec{ClusterSet: set},
	}
	if _, err := h.Cluster.ClusterV1beta2().ManagedClusterSetBindings(namespace).Create(ctx, b, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create binding %s/%s: %w", namespace, set, err)
	}
	if !bound {
		return nil
	}
	return h.SetBound(ctx, namespace, set, true)
}

// SetBound sets a binding's Bound condition.
func (h *Hub) SetBound(ctx context.Context, namespace, set string, bound bool) error {
	status, reason := metav1.ConditionTrue, "ClusterSetBound"
	if !bound {
		status, reason = metav1.ConditionFalse, "ClusterSetNotFound"
	}
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		b, err := h.Cluster.ClusterV1beta2().ManagedClusterSetBindings(namespace).Get(ctx, set, metav1.GetOptions{})
		if err != nil {
			return err
		}
		meta.SetStatusCondition(&b.Status.Conditions, metav1.Condition{
			Type: clusterv1beta2.ClusterSetBindingBoundType, Status: status, Reason: reason,
		})
		_, err = h.Cluster.ClusterV1beta2().ManagedClusterSetBindings(namespace).UpdateStatus(ctx, b, metav1.UpdateOptions{})
		return err
	})
}

// Unbind deletes a binding.
func (h *Hub) Unbind(ctx context.Context, namespace, set string) error {
	if err := h.Cluster.ClusterV1beta2().ManagedClusterSetBindings(namespace).Delete(ctx, set, metav1.DeleteOptions{}); err != nil {
		return fmt.Errorf("delete binding %s/%s: %w", namespace, set, err)
	}
	return nil
}

// ProfilesIn returns the ClusterProfiles in a namespace by name.
func (h *Hub) ProfilesIn(ctx context.Context, namespace string) (map[string]*cpv1alpha1.ClusterProfile, error) {
	list, err := h.Profiles.ApisV1alpha1().ClusterProfiles(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list profiles in %s: %w", namespace, err)
	}
	out := make(map[string]*cpv1alpha1.ClusterProfile, len(list.Items))
	for i := range list.Items {
		out[list.Items[i].Name] = &list.Items[i]
	}
	return out, nil
}

// ProfileNames returns the sorted names of the profiles in a namespace.
func (h *Hub) ProfileNames(ctx context.Context, namespace string) ([]string, error) {
	ps, err := h.ProfilesIn(ctx, namespace)
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(ps))
	for n := range ps {
		names = append(names, n)
	}
	sort.Strings(names)
	return names, nil
}
