package kueue

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/hub"
	"github.com/hubsync/hubsync/sinks"
)

// TestPlanReconcile: what one reconcile writes, deletes and reports, from
// the wanted profiles and what it observed.
func TestPlanReconcile(t *testing.T) {
	ours := func(name string) *unstructured.Unstructured {
		return desiredMKC(sinkName, config.KueueSink{Source: config.KueueSourceSecret}, name)
	}
	secret := func(profile string) *corev1.Secret {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: hub.KubeconfigSecretName(profile), Labels: ownLabels(sinkName, nil, profile)}}
	}
	observe := func(mkcs []*unstructured.Unstructured, secrets ...*corev1.Secret) *observed {
		o := &observed{mkcs: map[string]*unstructured.Unstructured{}, secrets: map[string]*corev1.Secret{}}
		for _, m := range mkcs {
			o.mkcs[m.GetName()] = m
		}
		for _, s := range secrets {
			o.secrets[s.Name] = s
		}
		return o
	}
	tests := []struct {
		name     string
		profiles []string
		wanted   []string
		secrets  bool
		obs      *observed
		prune    bool
		// want: written, MultiKueueClusters and Secrets deleted, conflicts, settled.
		write, delMKC, delSecret, conflicts, settled []string
	}{
		{name: "new profile", profiles: []string{"a"}, wanted: []string{"a"}, secrets: true, obs: observe(nil),
			write: []string{"a"}},
		{name: "profile gone", profiles: []string{"a"}, secrets: true, obs: observe([]*unstructured.Unstructured{ours("a")}, secret("a")),
			delMKC: []string{"a"}, delSecret: []string{hub.KubeconfigSecretName("a")}, settled: []string{"a"}},
		{name: "someone else's MultiKueueCluster", profiles: []string{"a"}, wanted: []string{"a"}, secrets: true,
			obs: observe([]*unstructured.Unstructured{foreignMKC("a", nil)}), conflicts: []string{"a"}},
		{name: "someone else's, profile gone", profiles: []string{"a"}, secrets: true,
			obs: observe([]*unstructured.Unstructured{foreignMKC("a", nil)}), settled: []string{"a"}},
		{name: "another sink's", profiles: []string{"a"}, wanted: []string{"a"}, secrets: true,
			obs: observe([]*unstructured.Unstructured{foreignMKC("a", ownLabels("other", nil, "a"))}), conflicts: []string{"a"}},
		{name: "source clusterProfile drops Secrets", profiles: []string{"a"}, wanted: []string{"a"},
			obs: observe([]*unstructured.Unstructured{ours("a")}, secret("a")), write: []string{"a"}, delSecret: []string{hub.KubeconfigSecretName("a")}},
		{name: "delivery leaves untouched profiles alone", profiles: []string{"a"}, wanted: []string{"a"}, secrets: true,
			obs: observe([]*unstructured.Unstructured{ours("a"), ours("b")}, secret("a"), secret("b")), write: []string{"a"}},
		{name: "resync prunes what no profile wants", profiles: []string{"a"}, wanted: []string{"a"}, secrets: true, prune: true,
			obs:   observe([]*unstructured.Unstructured{ours("a"), ours("b"), foreignMKC("c", nil)}, secret("a"), secret("b"), secret("renamed")),
			write: []string{"a"}, delMKC: []string{"b"}, delSecret: []string{hub.KubeconfigSecretName("b"), hub.KubeconfigSecretName("renamed")}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			wanted := func(p string) bool { return slices.Contains(tc.wanted, p) }
			p := planReconcile(sinkName, tc.profiles, wanted, tc.secrets, tc.obs, tc.prune)
			for _, c := range []struct {
				what      string
				got, want []string
			}{
				{"write", p.write, tc.write},
				{"MultiKueueClusters deleted", sortedKeys(p.deleteMKCs), tc.delMKC},
				{"Secrets deleted", sortedKeys(p.deleteSecrets), tc.delSecret},
				{"conflicts", sortedKeys(p.conflicts), tc.conflicts},
				{"settled", p.settled, tc.settled},
			} {
				if !slices.Equal(c.got, c.want) {
					t.Errorf("%s = %v, want %v", c.what, c.got, c.want)
				}
			}
		})
	}
}

// TestConfigClusters: listed clusters keep their order (Kueue's
// preference), new ones follow by name, gone ones leave, and Kueue's
// limit holds.
func TestConfigClusters(t *testing.T) {
	var many []string
	for _, c := range "abcdefghijklmnopqrstuvwxyz" {
		many = append(many, string(c))
	}
	tests := []struct {
		name                  string
		current, ours         []string
		wantClusters, leftOut []string
	}{
		{name: "new", ours: []string{"b", "a"}, wantClusters: []string{"a", "b"}},
		{name: "order kept, new last", current: []string{"c", "a"}, ours: []string{"a", "b", "c"}, wantClusters: []string{"c", "a", "b"}},
		{name: "gone and foreign names leave", current: []string{"x", "c", "a"}, ours: []string{"a"}, wantClusters: []string{"a"}},
		{name: "none", current: []string{"a"}},
		{name: "over the limit", ours: many, wantClusters: many[:20], leftOut: many[20:]},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, left := configClusters(tc.current, tc.ours)
			if !slices.Equal(got, tc.wantClusters) || !slices.Equal(left, tc.leftOut) {
				t.Errorf("configClusters = %v, %v; want %v, %v", got, left, tc.wantClusters, tc.leftOut)
			}
		})
	}
}

// TestNew: New refuses what config.SetDefaults and Validate would have
// caught.
func TestNew(t *testing.T) {
	e := newEnv(t, nil)
	good := func() config.Sink {
		s := config.Sink{Name: "k", Type: config.SinkKueue, Kueue: &config.KueueSink{AccessProvider: provider, ManagedServiceAccount: msa}}
		s.SetDefaults()
		return s
	}
	tests := []struct {
		name   string
		mutate func(*config.Sink)
		noDyn  bool
		ok     bool
	}{
		{name: "defaults", mutate: func(*config.Sink) {}, ok: true},
		{name: "clusterProfile", mutate: func(c *config.Sink) {
			*c.Kueue = config.KueueSink{Namespace: "k", Source: config.KueueSourceClusterProfile}
		}, ok: true},
		{name: "no section", mutate: func(c *config.Sink) { c.Kueue = nil }},
		{name: "no dynamic client", mutate: func(*config.Sink) {}, noDyn: true},
		{name: "no name", mutate: func(c *config.Sink) { c.Name = "" }},
		{name: "no namespace", mutate: func(c *config.Sink) { c.Kueue.Namespace = "" }},
		{name: "unknown source", mutate: func(c *config.Sink) { c.Kueue.Source = "path" }},
		{name: "secret without provider", mutate: func(c *config.Sink) { c.Kueue.AccessProvider = "" }},
		{name: "secret without msa", mutate: func(c *config.Sink) { c.Kueue.ManagedServiceAccount = "" }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := good()
			tc.mutate(&c)
			deps := sinks.Deps{Kube: e.kube, Dynamic: e.dyn}
			if tc.noDyn {
				deps.Dynamic = nil
			}
			s, err := New(c, deps)
			if (err == nil) != tc.ok {
				t.Fatalf("New: %v, want ok %v", err, tc.ok)
			}
			if s != nil {
				_ = s.Close()
			}
		})
	}
}
