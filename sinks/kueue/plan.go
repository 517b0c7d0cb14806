package kueue

import (
	"fmt"
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/hubsync/hubsync/hub"
)

// observed is Kueue's side of the hub as one reconcile found it.
type observed struct {
	// mkcs are every MultiKueueCluster by name, the sink's and others'.
	mkcs map[string]*unstructured.Unstructured
	// secrets are the sink's kubeconfig Secrets by name.
	secrets map[string]*corev1.Secret
	// config is the configured MultiKueueConfig; nil when it does not
	// exist or none is configured.
	config *unstructured.Unstructured
}

// plan is what one reconcile does, computed from the state and what it
// observed alone.
type plan struct {
	// write are the profiles whose objects are brought up to date: the
	// kubeconfig Secret (source secret), then the MultiKueueCluster.
	write []string
	// deleteMKCs and deleteSecrets are the sink's objects no profile
	// wants, by name.
	deleteMKCs    map[string]*unstructured.Unstructured
	deleteSecrets map[string]*corev1.Secret
	// conflicts are the wanted profiles whose MultiKueueCluster name is
	// taken by an object that is not the sink's, with the reason.
	conflicts map[string]string
	// settled are the profiles with nothing to report: not wanted.
	settled []string
}

// planReconcile decides about profiles: those wanted are written unless
// another's MultiKueueCluster has their name; the sink's objects of the
// others are deleted. With prune, the sink's objects that no wanted
// profile maps to are deleted as well, whatever their name. secrets says
// the source is secret, so wanted profiles keep their kubeconfig Secret;
// otherwise every Secret of the sink goes.
func planReconcile(sink string, profiles []string, wanted func(string) bool, secrets bool, obs *observed, prune bool) plan {
	p := plan{
		deleteMKCs:    map[string]*unstructured.Unstructured{},
		deleteSecrets: map[string]*corev1.Secret{},
		conflicts:     map[string]string{},
	}
	for _, profile := range profiles {
		cur := obs.mkcs[profile]
		sec := obs.secrets[hub.KubeconfigSecretName(profile)]
		want := wanted(profile)
		switch {
		case want && cur != nil && !owned(cur.GetLabels(), sink):
			p.conflicts[profile] = fmt.Sprintf("MultiKueueCluster %s exists and hubsync did not create it (it lacks the labels %s=%s, %s=%s); it is left alone",
				profile, hub.LabelManagedBy, hub.ManagedBy, hub.LabelSink, sink)
		case want:
			p.write = append(p.write, profile)
		default:
			p.settled = append(p.settled, profile)
			if cur != nil && owned(cur.GetLabels(), sink) {
				p.deleteMKCs[profile] = cur
			}
		}
		if sec != nil && (!want || !secrets) {
			p.deleteSecrets[sec.Name] = sec
		}
	}
	if !prune {
		return p
	}
	keepSecret := map[string]bool{}
	for _, profile := range profiles {
		if secrets && wanted(profile) {
			keepSecret[hub.KubeconfigSecretName(profile)] = true
		}
	}
	for name, m := range obs.mkcs {
		if owned(m.GetLabels(), sink) && !wanted(name) {
			p.deleteMKCs[name] = m
		}
	}
	for name, sec := range obs.secrets {
		if !keepSecret[name] {
			p.deleteSecrets[name] = sec
		}
	}
	return p
}

// oursAfter returns the names of the sink's MultiKueueClusters once p's
// deletions are done, sorted.
func oursAfter(sink string, obs *observed, p plan) []string {
	var out []string
	for name, m := range obs.mkcs {
		if _, gone := p.deleteMKCs[name]; !gone && owned(m.GetLabels(), sink) {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// sortedKeys returns m's keys in order.
func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }
