package syncer

import (
	"strings"
	"testing"
	"time"

	"github.com/hubsync/hubsync/hub"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/diff"
	"k8s.io/apimachinery/pkg/util/sets"
	clientcmdv1 "k8s.io/client-go/tools/clientcmd/api/v1"
	clusterv1 "open-cluster-management.io/api/cluster/v1"
	clusterv1beta2 "open-cluster-management.io/api/cluster/v1beta2"
	cpv1alpha1 "sigs.k8s.io/cluster-inventory-api/apis/v1alpha1"
)

const testManager = "open-cluster-management"

var (
	// Fixed times without monotonic readings, so that DeepEqual is exact.
	t0 = metav1.NewTime(time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC))
	t1 = metav1.NewTime(time.Date(2024, 6, 1, 12, 0, 0, 0, time.UTC))
)

// --- fixtures ---------------------------------------------------------------

func testCluster(name string, lbls map[string]string) *clusterv1.ManagedCluster {
	return &clusterv1.ManagedCluster{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: lbls}}
}

func deleting[T interface{ SetDeletionTimestamp(*metav1.Time) }](obj T) T {
	now := metav1.NewTime(time.Date(2024, 2, 2, 0, 0, 0, 0, time.UTC))
	obj.SetDeletionTimestamp(&now)
	return obj
}

func exclusiveSet(name string) *clusterv1beta2.ManagedClusterSet {
	return &clusterv1beta2.ManagedClusterSet{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: clusterv1beta2.ManagedClusterSetSpec{
			ClusterSelector: clusterv1beta2.ManagedClusterSelector{SelectorType: clusterv1beta2.ExclusiveClusterSetLabel},
		},
	}
}

func selectorSet(name string, sel *metav1.LabelSelector) *clusterv1beta2.ManagedClusterSet {
	return &clusterv1beta2.ManagedClusterSet{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: clusterv1beta2.ManagedClusterSetSpec{
			ClusterSelector: clusterv1beta2.ManagedClusterSelector{
				SelectorType:  clusterv1beta2.LabelSelector,
				LabelSelector: sel,
			},
		},
	}
}

// invalidSet returns a label-selector set whose selector cannot be evaluated.
func invalidSet(name string) *clusterv1beta2.ManagedClusterSet {
	return selectorSet(name, &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
		{Key: "env", Operator: "Contains", Values: []string{"prod"}},
	}})
}

func bindingCond(status metav1.ConditionStatus) []metav1.Condition {
	return []metav1.Condition{{
		Type:               clusterv1beta2.ClusterSetBindingBoundType,
		Status:             status,
		Reason:             "Test",
		LastTransitionTime: t0,
	}}
}

// boundBinding returns a binding of set in namespace with Bound=True.
func boundBinding(namespace, set string) *clusterv1beta2.ManagedClusterSetBinding {
	return &clusterv1beta2.ManagedClusterSetBinding{
		ObjectMeta: metav1.ObjectMeta{Name: set, Namespace: namespace},
		Spec:       clusterv1beta2.ManagedClusterSetBindingSpec{ClusterSet: set},
		Status:     clusterv1beta2.ManagedClusterSetBindingStatus{Conditions: bindingCond(metav1.ConditionTrue)},
	}
}

func withBound(b *clusterv1beta2.ManagedClusterSetBinding, status metav1.ConditionStatus) *clusterv1beta2.ManagedClusterSetBinding {
	b.Status.Conditions = bindingCond(status)
	return b
}

func setLabel(set string) map[string]string {
	return map[string]string{hub.LabelClusterSet: set}
}

func sameStrings(a, b []string) bool {
	return sets.New(a...).Equal(sets.New(b...)) && len(a) == len(b)
}

// --- SetSelector ------------------------------------------------------------

func TestSetSelector(t *testing.T) {
	tests := []struct {
		name       string
		set        *clusterv1beta2.ManagedClusterSet
		matches    []labels.Set
		notMatches []labels.Set
		wantErr    string // substring; "" means no error
	}{
		{
			name: "empty selector type selects the exclusive clusterset label",
			set: &clusterv1beta2.ManagedClusterSet{
				ObjectMeta: metav1.ObjectMeta{Name: "prod"},
			},
			matches: []labels.Set{
				{"cluster.open-cluster-management.io/clusterset": "prod"},
				{"cluster.open-cluster-management.io/clusterset": "prod", "env": "x"},
			},
			notMatches: []labels.Set{
				{},
				{"cluster.open-cluster-management.io/clusterset": "dev"},
				{"cluster.open-cluster-management.io/clusterset": ""},
				{"env": "prod"},
			},
		},
		{
			name: "ExclusiveClusterSetLabel selects the clusterset label",
			set:  exclusiveSet("prod"),
			matches: []labels.Set{
				{"cluster.open-cluster-management.io/clusterset": "prod"},
			},
			notMatches: []labels.Set{
				{},
				{"cluster.open-cluster-management.io/clusterset": "prod2"},
				{"multicluster.x-k8s.io/clusterset": "prod"},
			},
		},
		{
			name:    "LabelSelector {} selects every cluster",
			set:     selectorSet("all", &metav1.LabelSelector{}),
			matches: []labels.Set{{}, {"env": "prod"}, {"cluster.open-cluster-management.io/clusterset": "other"}},
		},
		{
			name:       "LabelSelector nil selects nothing",
			set:        selectorSet("none", nil),
			notMatches: []labels.Set{{}, {"env": "prod"}, {"cluster.open-cluster-management.io/clusterset": "none"}},
		},
		{
			name:       "LabelSelector matchLabels",
			set:        selectorSet("s", &metav1.LabelSelector{MatchLabels: map[string]string{"env": "prod", "tier": "1"}}),
			matches:    []labels.Set{{"env": "prod", "tier": "1"}, {"env": "prod", "tier": "1", "x": "y"}},
			notMatches: []labels.Set{{}, {"env": "prod"}, {"env": "dev", "tier": "1"}},
		},
		{
			name: "LabelSelector matchExpressions",
			set: selectorSet("s", &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
				{Key: "region", Operator: metav1.LabelSelectorOpIn, Values: []string{"us", "eu"}},
				{Key: "gpu", Operator: metav1.LabelSelectorOpExists},
				{Key: "quarantine", Operator: metav1.LabelSelectorOpDoesNotExist},
				{Key: "env", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"dev"}},
			}}),
			matches: []labels.Set{
				{"region": "us", "gpu": ""},
				{"region": "eu", "gpu": "a100", "env": "prod"},
			},
			notMatches: []labels.Set{
				{},
				{"region": "asia", "gpu": ""},
				{"region": "us"},
				{"region": "us", "gpu": "", "quarantine": "yes"},
				{"region": "us", "gpu": "", "env": "dev"},
			},
		},
		{
			name: "matchLabels and matchExpressions are ANDed",
			set: selectorSet("s", &metav1.LabelSelector{
				MatchLabels:      map[string]string{"env": "prod"},
				MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "region", Operator: metav1.LabelSelectorOpIn, Values: []string{"us"}}},
			}),
			matches:    []labels.Set{{"env": "prod", "region": "us"}},
			notMatches: []labels.Set{{"env": "prod"}, {"region": "us"}},
		},
		{
			name:    "invalid operator is an error",
			set:     invalidSet("broken"),
			wantErr: `cluster set "broken": invalid label selector`,
		},
		{
			name: "In without values is an error",
			set: selectorSet("novalues", &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
				{Key: "env", Operator: metav1.LabelSelectorOpIn},
			}}),
			wantErr: `cluster set "novalues": invalid label selector`,
		},
		{
			name: "invalid label key is an error",
			set:  selectorSet("badkey", &metav1.LabelSelector{MatchLabels: map[string]string{"bad key!": "x"}}),
			// The key is rejected by the selector parser.
			wantErr: `cluster set "badkey": invalid label selector`,
		},
		{
			name: "unknown selector type is an error",
			set: &clusterv1beta2.ManagedClusterSet{
				ObjectMeta: metav1.ObjectMeta{Name: "weird"},
				Spec: clusterv1beta2.ManagedClusterSetSpec{
					ClusterSelector: clusterv1beta2.ManagedClusterSelector{SelectorType: "Placement"},
				},
			},
			wantErr: `cluster set "weird": unknown selector type "Placement"`,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sel, err := SetSelector(tc.set)
			if tc.wantErr != "" {
				if err == nil {
					t.Fatalf("SetSelector() = %v, nil; want error containing %q", sel, tc.wantErr)
				}
				if !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("SetSelector() error = %q; want it to contain %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("SetSelector() unexpected error: %v", err)
			}
			for _, l := range tc.matches {
				if !sel.Matches(l) {
					t.Errorf("selector %q does not match %v; want match", sel, l)
				}
			}
			for _, l := range tc.notMatches {
				if sel.Matches(l) {
					t.Errorf("selector %q matches %v; want no match", sel, l)
				}
			}
		})
	}
}

// --- IsBound ----------------------------------------------------------------

func TestIsBound(t *testing.T) {
	tests := []struct {
		name string
		b    *clusterv1beta2.ManagedClusterSetBinding
		want bool
	}{
		{name: "Bound True", b: boundBinding("ns1", "prod"), want: true},
		{name: "Bound False", b: withBound(boundBinding("ns1", "prod"), metav1.ConditionFalse), want: false},
		{name: "Bound Unknown", b: withBound(boundBinding("ns1", "prod"), metav1.ConditionUnknown), want: false},
		{
			name: "Bound condition missing",
			b: func() *clusterv1beta2.ManagedClusterSetBinding {
				b := boundBinding("ns1", "prod")
				b.Status.Conditions = nil
				return b
			}(),
			want: false,
		},
		{
			name: "only another condition type is True",
			b: func() *clusterv1beta2.ManagedClusterSetBinding {
				b := boundBinding("ns1", "prod")
				b.Status.Conditions[0].Type = "Ready"
				return b
			}(),
			want: false,
		},
		{
			name: "name differs from spec.clusterSet",
			b: func() *clusterv1beta2.ManagedClusterSetBinding {
				b := boundBinding("ns1", "prod")
				b.Name = "other"
				return b
			}(),
			want: false,
		},
		{name: "being deleted", b: deleting(boundBinding("ns1", "prod")), want: false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := IsBound(tc.b); got != tc.want {
				t.Errorf("IsBound() = %v, want %v", got, tc.want)
			}
		})
	}
}

// --- DesiredNamespaces ------------------------------------------------------

func TestDesiredNamespaces(t *testing.T) {
	prodCluster := testCluster("c1", map[string]string{hub.LabelClusterSet: "prod", "env": "prod"})
	tests := []struct {
		name        string
		cluster     *clusterv1.ManagedCluster
		sets        []*clusterv1beta2.ManagedClusterSet
		bindings    []*clusterv1beta2.ManagedClusterSetBinding
		wantDesired []string
		wantHeld    []string
		wantInvalid []string
	}{
		{
			name:        "exclusive set member bound in one namespace",
			cluster:     prodCluster,
			sets:        []*clusterv1beta2.ManagedClusterSet{exclusiveSet("prod")},
			bindings:    []*clusterv1beta2.ManagedClusterSetBinding{boundBinding("ns1", "prod")},
			wantDesired: []string{"ns1"},
		},
		{
			name:    "exclusive set bound in several namespaces",
			cluster: prodCluster,
			sets:    []*clusterv1beta2.ManagedClusterSet{exclusiveSet("prod")},
			bindings: []*clusterv1beta2.ManagedClusterSetBinding{
				boundBinding("ns2", "prod"), boundBinding("ns1", "prod"), boundBinding("ns3", "prod"),
			},
			wantDesired: []string{"ns1", "ns2", "ns3"},
		},
		{
			name:     "exclusive set the cluster is not labelled with",
			cluster:  testCluster("c1", setLabel("dev")),
			sets:     []*clusterv1beta2.ManagedClusterSet{exclusiveSet("prod")},
			bindings: []*clusterv1beta2.ManagedClusterSetBinding{boundBinding("ns1", "prod")},
		},
		{
			name:     "cluster without labels",
			cluster:  testCluster("c1", nil),
			sets:     []*clusterv1beta2.ManagedClusterSet{exclusiveSet("prod"), selectorSet("envprod", &metav1.LabelSelector{MatchLabels: map[string]string{"env": "prod"}})},
			bindings: []*clusterv1beta2.ManagedClusterSetBinding{boundBinding("ns1", "prod"), boundBinding("ns2", "envprod")},
		},
		{
			name:        "label selector set matching",
			cluster:     prodCluster,
			sets:        []*clusterv1beta2.ManagedClusterSet{selectorSet("envprod", &metav1.LabelSelector{MatchLabels: map[string]string{"env": "prod"}})},
			bindings:    []*clusterv1beta2.ManagedClusterSetBinding{boundBinding("ns1", "envprod")},
			wantDesired: []string{"ns1"},
		},
		{
			name:     "label selector set not matching",
			cluster:  prodCluster,
			sets:     []*clusterv1beta2.ManagedClusterSet{selectorSet("envdev", &metav1.LabelSelector{MatchLabels: map[string]string{"env": "dev"}})},
			bindings: []*clusterv1beta2.ManagedClusterSetBinding{boundBinding("ns1", "envdev")},
		},
		{
			name:        "global set {} selects a cluster without labels",
			cluster:     testCluster("c1", nil),
			sets:        []*clusterv1beta2.ManagedClusterSet{selectorSet("global", &metav1.LabelSelector{})},
			bindings:    []*clusterv1beta2.ManagedClusterSetBinding{boundBinding("ns1", "global")},
			wantDesired: []string{"ns1"},
		},
		{
			name:     "nil label selector set selects nothing",
			cluster:  prodCluster,
			sets:     []*clusterv1beta2.ManagedClusterSet{selectorSet("none", nil)},
			bindings: []*clusterv1beta2.ManagedClusterSetBinding{boundBinding("ns1", "none")},
		},
		{
			name:    "cluster in two sets bound in the same namespace appears once",
			cluster: prodCluster,
			sets: []*clusterv1beta2.ManagedClusterSet{
				exclusiveSet("prod"),
				selectorSet("global", &metav1.LabelSelector{}),
			},
			bindings: []*clusterv1beta2.ManagedClusterSetBinding{
				boundBinding("ns1", "prod"),
				boundBinding("ns1", "global"),
				boundBinding("ns2", "global"),
			},
			wantDesired: []string{"ns1", "ns2"},
		},
		{
			name:    "unbound bindings are ignored",
			cluster: prodCluster,
			sets:    []*clusterv1beta2.ManagedClusterSet{exclusiveSet("prod")},
			bindings: []*clusterv1beta2.ManagedClusterSetBinding{
				withBound(boundBinding("ns-false", "prod"), metav1.ConditionFalse),
				func() *clusterv1beta2.ManagedClusterSetBinding {
					b := boundBinding("ns-nocond", "prod")
					b.Status.Conditions = nil
					return b
				}(),
				func() *clusterv1beta2.ManagedClusterSetBinding {
					b := boundBinding("ns-misnamed", "prod")
					b.Name = "not-prod"
					return b
				}(),
				deleting(boundBinding("ns-deleting", "prod")),
				boundBinding("ns-ok", "prod"),
			},
			wantDesired: []string{"ns-ok"},
		},
		{
			name:     "binding to a set that is not a candidate",
			cluster:  prodCluster,
			sets:     []*clusterv1beta2.ManagedClusterSet{exclusiveSet("prod")},
			bindings: []*clusterv1beta2.ManagedClusterSetBinding{boundBinding("ns1", "missing")},
		},
		{
			name:     "deleting cluster belongs nowhere",
			cluster:  deleting(testCluster("c1", setLabel("prod"))),
			sets:     []*clusterv1beta2.ManagedClusterSet{exclusiveSet("prod"), invalidSet("bad")},
			bindings: []*clusterv1beta2.ManagedClusterSetBinding{boundBinding("ns1", "prod"), boundBinding("ns2", "bad")},
		},
		{
			name:     "nil cluster belongs nowhere",
			cluster:  nil,
			sets:     []*clusterv1beta2.ManagedClusterSet{exclusiveSet("prod"), invalidSet("bad")},
			bindings: []*clusterv1beta2.ManagedClusterSetBinding{boundBinding("ns1", "prod"), boundBinding("ns2", "bad")},
		},
		{
			name:    "deleting set entitles nobody",
			cluster: prodCluster,
			sets: []*clusterv1beta2.ManagedClusterSet{
				deleting(exclusiveSet("prod")),
				selectorSet("envprod", &metav1.LabelSelector{MatchLabels: map[string]string{"env": "prod"}}),
			},
			bindings: []*clusterv1beta2.ManagedClusterSetBinding{
				boundBinding("ns1", "prod"),
				boundBinding("ns2", "envprod"),
			},
			wantDesired: []string{"ns2"},
		},
		{
			name:        "invalid set holds its bound namespaces",
			cluster:     prodCluster,
			sets:        []*clusterv1beta2.ManagedClusterSet{invalidSet("bad")},
			bindings:    []*clusterv1beta2.ManagedClusterSetBinding{boundBinding("ns1", "bad"), boundBinding("ns2", "bad")},
			wantHeld:    []string{"ns1", "ns2"},
			wantInvalid: []string{"bad"},
		},
		{
			name:    "unknown selector type is invalid too",
			cluster: prodCluster,
			sets: []*clusterv1beta2.ManagedClusterSet{{
				ObjectMeta: metav1.ObjectMeta{Name: "weird"},
				Spec: clusterv1beta2.ManagedClusterSetSpec{
					ClusterSelector: clusterv1beta2.ManagedClusterSelector{SelectorType: "Placement"},
				},
			}},
			bindings:    []*clusterv1beta2.ManagedClusterSetBinding{boundBinding("ns1", "weird")},
			wantHeld:    []string{"ns1"},
			wantInvalid: []string{"weird"},
		},
		{
			name:    "namespace desired through a valid set is not held by an invalid one",
			cluster: prodCluster,
			sets:    []*clusterv1beta2.ManagedClusterSet{exclusiveSet("prod"), invalidSet("bad")},
			bindings: []*clusterv1beta2.ManagedClusterSetBinding{
				boundBinding("ns1", "bad"),
				boundBinding("ns1", "prod"),
				boundBinding("ns2", "bad"),
			},
			wantDesired: []string{"ns1"},
			wantHeld:    []string{"ns2"},
			wantInvalid: []string{"bad"},
		},
		{
			name:    "namespace bound to a non-matching valid set and an invalid one is held",
			cluster: prodCluster,
			sets: []*clusterv1beta2.ManagedClusterSet{
				selectorSet("envdev", &metav1.LabelSelector{MatchLabels: map[string]string{"env": "dev"}}),
				invalidSet("bad"),
			},
			bindings:    []*clusterv1beta2.ManagedClusterSetBinding{boundBinding("ns1", "envdev"), boundBinding("ns1", "bad")},
			wantHeld:    []string{"ns1"},
			wantInvalid: []string{"bad"},
		},
		{
			name:        "unbound binding to an invalid set holds nothing",
			cluster:     prodCluster,
			sets:        []*clusterv1beta2.ManagedClusterSet{invalidSet("bad")},
			bindings:    []*clusterv1beta2.ManagedClusterSetBinding{withBound(boundBinding("ns1", "bad"), metav1.ConditionFalse)},
			wantInvalid: []string{"bad"},
		},
		{
			name:        "invalid sets are listed sorted even without bindings",
			cluster:     prodCluster,
			sets:        []*clusterv1beta2.ManagedClusterSet{invalidSet("zeta"), exclusiveSet("prod"), invalidSet("alpha")},
			wantInvalid: []string{"alpha", "zeta"},
		},
		{
			name:     "deleting invalid set is neither invalid nor holding",
			cluster:  prodCluster,
			sets:     []*clusterv1beta2.ManagedClusterSet{deleting(invalidSet("bad"))},
			bindings: []*clusterv1beta2.ManagedClusterSetBinding{boundBinding("ns1", "bad")},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := DesiredNamespaces(tc.cluster, tc.sets, tc.bindings)
			if got := sets.List(m.Desired); !sameStrings(got, tc.wantDesired) {
				t.Errorf("Desired = %v, want %v", got, tc.wantDesired)
			}
			if got := sets.List(m.Held); !sameStrings(got, tc.wantHeld) {
				t.Errorf("Held = %v, want %v", got, tc.wantHeld)
			}
			if len(m.InvalidSets) != len(tc.wantInvalid) {
				t.Fatalf("InvalidSets = %v, want %v", m.InvalidSets, tc.wantInvalid)
			}
			for i := range tc.wantInvalid {
				if m.InvalidSets[i] != tc.wantInvalid[i] {
					t.Errorf("InvalidSets = %v, want %v (sorted)", m.InvalidSets, tc.wantInvalid)
					break
				}
			}
			if inter := m.Desired.Intersection(m.Held); inter.Len() != 0 {
				t.Errorf("namespaces both Desired and Held: %v", sets.List(inter))
			}
		})
	}
}

// --- ProfileLabels / NewProfile / ReconcileMeta ------------------------------

func TestProfileLabels(t *testing.T) {
	long := strings.Repeat("abcdefghi.", 25) + "xyz"
	tests := []struct {
		name    string
		cluster *clusterv1.ManagedCluster
		want    map[string]string
	}{
		{
			name:    "cluster in a set",
			cluster: testCluster("c1", map[string]string{hub.LabelClusterSet: "prod", "env": "prod"}),
			want: map[string]string{
				"x-k8s.io/cluster-manager":                testManager,
				"open-cluster-management.io/cluster-name": "c1",
				"multicluster.x-k8s.io/clusterset":        "prod",
			},
		},
		{
			name:    "cluster without a set label",
			cluster: testCluster("c1", nil),
			want: map[string]string{
				"x-k8s.io/cluster-manager":                testManager,
				"open-cluster-management.io/cluster-name": "c1",
				"multicluster.x-k8s.io/clusterset":        "",
			},
		},
		{
			name:    "long cluster name is shortened in the label",
			cluster: testCluster(long, setLabel("prod")),
			want: map[string]string{
				"x-k8s.io/cluster-manager":                testManager,
				"open-cluster-management.io/cluster-name": hub.ClusterNameLabelValue(long),
				"multicluster.x-k8s.io/clusterset":        "prod",
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := ProfileLabels(testManager, tc.cluster)
			if !equality.Semantic.DeepEqual(got, tc.want) {
				t.Errorf("ProfileLabels() = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestNewProfile(t *testing.T) {
	long := strings.Repeat("abcdefghi.", 25) + "xyz"
	tests := []struct {
		name    string
		cluster *clusterv1.ManagedCluster
	}{
		{
			name: "full cluster",
			cluster: &clusterv1.ManagedCluster{
				ObjectMeta: metav1.ObjectMeta{Name: "c1", Labels: map[string]string{hub.LabelClusterSet: "prod", "env": "prod"}},
				Status: clusterv1.ManagedClusterStatus{
					Version:       clusterv1.ManagedClusterVersion{Kubernetes: "v1.30.1"},
					ClusterClaims: []clusterv1.ManagedClusterClaim{{Name: "b", Value: "2"}, {Name: "a", Value: "1"}},
					Conditions: []metav1.Condition{
						{Type: clusterv1.ManagedClusterConditionAvailable, Status: metav1.ConditionTrue, Reason: "ManagedClusterAvailable", Message: "ok", LastTransitionTime: t0},
						{Type: clusterv1.ManagedClusterConditionJoined, Status: metav1.ConditionTrue, Reason: "ManagedClusterJoined", Message: "joined", LastTransitionTime: t0},
					},
				},
			},
		},
		{name: "bare cluster", cluster: testCluster("bare", nil)},
		{name: "long name", cluster: testCluster(long, setLabel("prod"))},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := tc.cluster.DeepCopy()
			p := NewProfile(testManager, "consumer-ns", tc.cluster, nil)
			if p.Name != tc.cluster.Name || p.Namespace != "consumer-ns" {
				t.Errorf("profile key = %s/%s, want consumer-ns/%s", p.Namespace, p.Name, tc.cluster.Name)
			}
			wantLabels := map[string]string{
				hub.LabelClusterManager: testManager,
				hub.LabelClusterName:    hub.ClusterNameLabelValue(tc.cluster.Name),
				hub.LabelProfileSet:     tc.cluster.Labels[hub.LabelClusterSet],
			}
			if !equality.Semantic.DeepEqual(p.Labels, wantLabels) || len(p.Labels) != 3 {
				t.Errorf("labels = %v, want exactly %v", p.Labels, wantLabels)
			}
			wantSpec := cpv1alpha1.ClusterProfileSpec{
				DisplayName:    tc.cluster.Name,
				ClusterManager: cpv1alpha1.ClusterManager{Name: testManager},
			}
			if p.Spec != wantSpec {
				t.Errorf("spec = %+v, want %+v", p.Spec, wantSpec)
			}
			wantStatus := DesiredStatus(cpv1alpha1.ClusterProfileStatus{}, tc.cluster, nil)
			if !equality.Semantic.DeepEqual(p.Status, wantStatus) {
				t.Errorf("status differs from DesiredStatus:\n%s", diff.Diff(wantStatus, p.Status))
			}
			if !equality.Semantic.DeepEqual(before, tc.cluster) {
				t.Error("NewProfile modified the cluster")
			}
		})
	}
}

func TestReconcileMeta(t *testing.T) {
	cluster := testCluster("c1", map[string]string{hub.LabelClusterSet: "prod"})
	good := func() *cpv1alpha1.ClusterProfile { return NewProfile(testManager, "ns1", cluster, nil) }
	tests := []struct {
		name        string
		cluster     *clusterv1.ManagedCluster // defaults to cluster
		profile     *cpv1alpha1.ClusterProfile
		wantChanged bool
		wantLabels  map[string]string
	}{
		{
			name:       "nothing differs",
			profile:    good(),
			wantLabels: ProfileLabels(testManager, cluster),
		},
		{
			name: "foreign labels alone are no change",
			profile: func() *cpv1alpha1.ClusterProfile {
				p := good()
				p.Labels["team"] = "a"
				return p
			}(),
			wantLabels: map[string]string{
				hub.LabelClusterManager: testManager, hub.LabelClusterName: "c1", hub.LabelProfileSet: "prod", "team": "a",
			},
		},
		{
			name: "wrong clusterset label restored, foreign label kept",
			profile: func() *cpv1alpha1.ClusterProfile {
				p := good()
				p.Labels[hub.LabelProfileSet] = "wrong"
				p.Labels["team"] = "a"
				return p
			}(),
			wantChanged: true,
			wantLabels: map[string]string{
				hub.LabelClusterManager: testManager, hub.LabelClusterName: "c1", hub.LabelProfileSet: "prod", "team": "a",
			},
		},
		{
			name: "missing cluster-name label restored",
			profile: func() *cpv1alpha1.ClusterProfile {
				p := good()
				delete(p.Labels, hub.LabelClusterName)
				return p
			}(),
			wantChanged: true,
			wantLabels:  ProfileLabels(testManager, cluster),
		},
		{
			name: "nil labels restored",
			profile: func() *cpv1alpha1.ClusterProfile {
				p := good()
				p.Labels = nil
				return p
			}(),
			wantChanged: true,
			wantLabels:  ProfileLabels(testManager, cluster),
		},
		{
			name:       "cluster without a set: fresh profile unchanged",
			cluster:    testCluster("c1", nil),
			profile:    NewProfile(testManager, "ns1", testCluster("c1", nil), nil),
			wantLabels: map[string]string{hub.LabelClusterManager: testManager, hub.LabelClusterName: "c1", hub.LabelProfileSet: ""},
		},
		{
			name:        "cluster moved to another set",
			cluster:     testCluster("c1", setLabel("dev")),
			profile:     good(),
			wantChanged: true,
			wantLabels:  map[string]string{hub.LabelClusterManager: testManager, hub.LabelClusterName: "c1", hub.LabelProfileSet: "dev"},
		},
		{
			name: "label of another manager overwritten",
			profile: func() *cpv1alpha1.ClusterProfile {
				p := good()
				p.Labels[hub.LabelClusterManager] = "karmada"
				return p
			}(),
			wantChanged: true,
			wantLabels:  ProfileLabels(testManager, cluster),
		},
		{
			name: "displayName restored",
			profile: func() *cpv1alpha1.ClusterProfile {
				p := good()
				p.Spec.DisplayName = "renamed"
				return p
			}(),
			wantChanged: true,
			wantLabels:  ProfileLabels(testManager, cluster),
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cluster := cluster
			if tc.cluster != nil {
				cluster = tc.cluster
			}
			before := tc.profile.DeepCopy()
			got, changed := ReconcileMeta(tc.profile, testManager, cluster)
			if changed != tc.wantChanged {
				t.Errorf("changed = %v, want %v", changed, tc.wantChanged)
			}
			if !tc.wantChanged && got != tc.profile {
				t.Error("unchanged profile: want the same pointer back")
			}
			if tc.wantChanged && got == tc.profile {
				t.Error("changed profile: want a copy, got the input pointer")
			}
			if !equality.Semantic.DeepEqual(got.Labels, tc.wantLabels) {
				t.Errorf("labels = %v, want %v", got.Labels, tc.wantLabels)
			}
			if got.Spec.DisplayName != cluster.Name {
				t.Errorf("displayName = %q, want %q", got.Spec.DisplayName, cluster.Name)
			}
			if !equality.Semantic.DeepEqual(got.Status, before.Status) || got.Spec.ClusterManager != before.Spec.ClusterManager {
				t.Error("ReconcileMeta changed status or spec.clusterManager")
			}
			if !equality.Semantic.DeepEqual(before, tc.profile) {
				t.Error("ReconcileMeta modified its input")
			}
			if _, again := ReconcileMeta(got, testManager, cluster); again {
				t.Error("ReconcileMeta is not idempotent: second pass reports a change")
			}
		})
	}
}

// --- DesiredStatus ----------------------------------------------------------

func TestDesiredStatus(t *testing.T) {
	avail := func(status metav1.ConditionStatus, reason, msg string, at metav1.Time) metav1.Condition {
		return metav1.Condition{Type: clusterv1.ManagedClusterConditionAvailable, Status: status, Reason: reason, Message: msg, LastTransitionTime: at}
	}
	joined := func(status metav1.ConditionStatus, reason, msg string, at metav1.Time) metav1.Condition {
		return metav1.Condition{Type: clusterv1.ManagedClusterConditionJoined, Status: status, Reason: reason, Message: msg, LastTransitionTime: at}
	}
	healthy := func(status metav1.ConditionStatus, reason, msg string, at metav1.Time) metav1.Condition {
		return metav1.Condition{Type: ConditionControlPlaneHealthy, Status: status, Reason: reason, Message: msg, LastTransitionTime: at}
	}
	joinedP := func(status metav1.ConditionStatus, reason, msg string, at metav1.Time) metav1.Condition {
		return metav1.Condition{Type: ConditionJoined, Status: status, Reason: reason, Message: msg, LastTransitionTime: at}
	}
	mkCluster := func(version string, claims []clusterv1.ManagedClusterClaim, conds ...metav1.Condition) *clusterv1.ManagedCluster {
		c := testCluster("c1", nil)
		c.Status.Version.Kubernetes = version
		c.Status.ClusterClaims = claims
		c.Status.Conditions = conds
		return c
	}
	foreign := metav1.Condition{Type: "example.com/Reachable", Status: metav1.ConditionTrue, Reason: "Probe", Message: "pong", LastTransitionTime: t0}
	access := []cpv1alpha1.AccessProvider{{Name: "open-cluster-management", Cluster: clientcmdv1.Cluster{Server: "https://c1.example.com"}}}
	creds := []cpv1alpha1.CredentialProvider{{Name: "secretreader", Cluster: clientcmdv1.Cluster{Server: "https://c1.example.com:6443"}}}

	tests := []struct {
		name    string
		cur     cpv1alpha1.ClusterProfileStatus
		cluster *clusterv1.ManagedCluster
		want    cpv1alpha1.ClusterProfileStatus
		// check runs extra assertions; used where want cannot be exact.
		check func(t *testing.T, got cpv1alpha1.ClusterProfileStatus)
	}{
		{
			name: "fresh status mirrors everything",
			cluster: mkCluster("v1.30.1",
				[]clusterv1.ManagedClusterClaim{{Name: "platform.open-cluster-management.io", Value: "AWS"}, {Name: "id.k8s.io", Value: "abc"}},
				avail(metav1.ConditionTrue, "ManagedClusterAvailable", "cluster is available", t0),
				joined(metav1.ConditionTrue, "ManagedClusterJoined", "cluster has joined", t1),
			),
			want: cpv1alpha1.ClusterProfileStatus{
				Version: cpv1alpha1.ClusterVersion{Kubernetes: "v1.30.1"},
				Properties: []cpv1alpha1.Property{
					{Name: "id.k8s.io", Value: "abc"},
					{Name: "platform.open-cluster-management.io", Value: "AWS"},
				},
				Conditions: []metav1.Condition{
					healthy(metav1.ConditionTrue, "ManagedClusterAvailable", "cluster is available", t0),
					joinedP(metav1.ConditionTrue, "ManagedClusterJoined", "cluster has joined", t1),
				},
			},
		},
		{
			name:    "cluster without version or conditions gives an empty status",
			cluster: mkCluster("", nil),
			want:    cpv1alpha1.ClusterProfileStatus{},
		},
		{
			name: "Available False and Unknown statuses are mirrored",
			cluster: mkCluster("v1.29.0", nil,
				avail(metav1.ConditionUnknown, "ManagedClusterLeaseUpdateStopped", "lease not updated", t1),
				joined(metav1.ConditionFalse, "NotJoined", "not yet", t1),
			),
			want: cpv1alpha1.ClusterProfileStatus{
				Version: cpv1alpha1.ClusterVersion{Kubernetes: "v1.29.0"},
				Conditions: []metav1.Condition{
					healthy(metav1.ConditionUnknown, "ManagedClusterLeaseUpdateStopped", "lease not updated", t1),
					joinedP(metav1.ConditionFalse, "NotJoined", "not yet", t1),
				},
			},
		},
		{
			name: "lastTransitionTime kept when status unchanged; reason and message follow",
			cur: cpv1alpha1.ClusterProfileStatus{Conditions: []metav1.Condition{
				healthy(metav1.ConditionTrue, "OldReason", "old message", t0),
			}},
			cluster: mkCluster("v1.30.1", nil, avail(metav1.ConditionTrue, "ManagedClusterAvailable", "new message", t1)),
			want: cpv1alpha1.ClusterProfileStatus{
				Version:    cpv1alpha1.ClusterVersion{Kubernetes: "v1.30.1"},
				Conditions: []metav1.Condition{healthy(metav1.ConditionTrue, "ManagedClusterAvailable", "new message", t0)},
			},
		},
		{
			name: "lastTransitionTime moves when status changes",
			cur: cpv1alpha1.ClusterProfileStatus{Conditions: []metav1.Condition{
				healthy(metav1.ConditionTrue, "ManagedClusterAvailable", "ok", t0),
				joinedP(metav1.ConditionTrue, "ManagedClusterJoined", "joined", t0),
			}},
			cluster: mkCluster("v1.30.1", nil,
				avail(metav1.ConditionFalse, "ManagedClusterLeaseUpdateStopped", "gone", t1),
				joined(metav1.ConditionTrue, "ManagedClusterJoined", "joined", t1),
			),
			want: cpv1alpha1.ClusterProfileStatus{
				Version: cpv1alpha1.ClusterVersion{Kubernetes: "v1.30.1"},
				Conditions: []metav1.Condition{
					healthy(metav1.ConditionFalse, "ManagedClusterLeaseUpdateStopped", "gone", t1),
					joinedP(metav1.ConditionTrue, "ManagedClusterJoined", "joined", t0),
				},
			},
		},
		{
			name:    "zero source lastTransitionTime becomes a real time",
			cluster: mkCluster("", nil, avail(metav1.ConditionTrue, "ManagedClusterAvailable", "ok", metav1.Time{})),
			check: func(t *testing.T, got cpv1alpha1.ClusterProfileStatus) {
				if len(got.Conditions) != 1 || got.Conditions[0].Type != ConditionControlPlaneHealthy {
					t.Fatalf("conditions = %+v, want one %s", got.Conditions, ConditionControlPlaneHealthy)
				}
				if got.Conditions[0].LastTransitionTime.IsZero() {
					t.Error("lastTransitionTime is zero; the CRD requires a time")
				}
			},
		},
		{
			name: "foreign conditions, access and credential providers kept",
			cur: cpv1alpha1.ClusterProfileStatus{
				Conditions:          []metav1.Condition{foreign, healthy(metav1.ConditionTrue, "ManagedClusterAvailable", "ok", t0)},
				AccessProviders:     access,
				CredentialProviders: creds,
			},
			cluster: mkCluster("v1.30.1", nil,
				avail(metav1.ConditionTrue, "ManagedClusterAvailable", "ok", t1),
				joined(metav1.ConditionTrue, "ManagedClusterJoined", "joined", t1),
			),
			want: cpv1alpha1.ClusterProfileStatus{
				Version: cpv1alpha1.ClusterVersion{Kubernetes: "v1.30.1"},
				Conditions: []metav1.Condition{
					foreign,
					healthy(metav1.ConditionTrue, "ManagedClusterAvailable", "ok", t0),
					joinedP(metav1.ConditionTrue, "ManagedClusterJoined", "joined", t1),
				},
				AccessProviders:     access,
				CredentialProviders: creds,
			},
		},
		{
			name: "mirrored conditions are kept when the cluster loses its conditions",
			cur: cpv1alpha1.ClusterProfileStatus{Conditions: []metav1.Condition{
				healthy(metav1.ConditionTrue, "ManagedClusterAvailable", "ok", t0),
			}},
			cluster: mkCluster("v1.30.1", nil),
			want: cpv1alpha1.ClusterProfileStatus{
				Version:    cpv1alpha1.ClusterVersion{Kubernetes: "v1.30.1"},
				Conditions: []metav1.Condition{healthy(metav1.ConditionTrue, "ManagedClusterAvailable", "ok", t0)},
			},
		},
		{
			name: "empty reason becomes Unknown",
			cluster: mkCluster("v1.30.1", nil,
				avail(metav1.ConditionTrue, "", "old agent", t0),
				joined(metav1.ConditionTrue, "", "", t0),
			),
			want: cpv1alpha1.ClusterProfileStatus{
				Version: cpv1alpha1.ClusterVersion{Kubernetes: "v1.30.1"},
				Conditions: []metav1.Condition{
					healthy(metav1.ConditionTrue, "Unknown", "old agent", t0),
					joinedP(metav1.ConditionTrue, "Unknown", "", t0),
				},
			},
		},
		{
			name: "version and properties replaced, stale ones dropped",
			cur: cpv1alpha1.ClusterProfileStatus{
				Version:    cpv1alpha1.ClusterVersion{Kubernetes: "v1.28.0"},
				Properties: []cpv1alpha1.Property{{Name: "stale", Value: "x"}, {Name: "a", Value: "old"}},
			},
			cluster: mkCluster("v1.30.1", []clusterv1.ManagedClusterClaim{{Name: "a", Value: "new"}}),
			want: cpv1alpha1.ClusterProfileStatus{
				Version:    cpv1alpha1.ClusterVersion{Kubernetes: "v1.30.1"},
				Properties: []cpv1alpha1.Property{{Name: "a", Value: "new"}},
				Conditions: []metav1.Condition{},
			},
		},
		{
			name:    "version cleared when the cluster reports none",
			cur:     cpv1alpha1.ClusterProfileStatus{Version: cpv1alpha1.ClusterVersion{Kubernetes: "v1.28.0"}},
			cluster: mkCluster("", nil),
			want:    cpv1alpha1.ClusterProfileStatus{},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := tc.cur.DeepCopy()
			got := DesiredStatus(tc.cur, tc.cluster, nil)
			if tc.check != nil {
				tc.check(t, got)
			} else if !equality.Semantic.DeepEqual(got, tc.want) {
				t.Errorf("DesiredStatus() mismatch (-want +got):\n%s", diff.Diff(tc.want, got))
			}
			if !equality.Semantic.DeepEqual(*before, tc.cur) {
				t.Errorf("DesiredStatus modified its input:\n%s", diff.Diff(*before, tc.cur))
			}
			// Applying the result again is a fixed point.
			if again := DesiredStatus(got, tc.cluster, nil); !equality.Semantic.DeepEqual(again, got) {
				t.Errorf("DesiredStatus is not idempotent:\n%s", diff.Diff(got, again))
			}
		})
	}
}

// --- Properties / SkippedClaims ---------------------------------------------

func TestProperties(t *testing.T) {
	claim := func(n, v string) clusterv1.ManagedClusterClaim {
		return clusterv1.ManagedClusterClaim{Name: n, Value: v}
	}
	prop := func(n, v string) cpv1alpha1.Property { return cpv1alpha1.Property{Name: n, Value: v} }
	tests := []struct {
		name        string
		claims      []clusterv1.ManagedClusterClaim
		want        []cpv1alpha1.Property
		wantSkipped int
	}{
		{name: "nil claims", claims: nil, want: []cpv1alpha1.Property{}},
		{
			name:   "sorted by name",
			claims: []clusterv1.ManagedClusterClaim{claim("zeta", "1"), claim("alpha", "2"), claim("mid.example.com", "3")},
			want:   []cpv1alpha1.Property{prop("alpha", "2"), prop("mid.example.com", "3"), prop("zeta", "1")},
		},
		{
			name:        "empty name skipped",
			claims:      []clusterv1.ManagedClusterClaim{claim("", "v"), claim("a", "1")},
			want:        []cpv1alpha1.Property{prop("a", "1")},
			wantSkipped: 1,
		},
		{
			name:        "empty value skipped",
			claims:      []clusterv1.ManagedClusterClaim{claim("a", ""), claim("b", "1")},
			want:        []cpv1alpha1.Property{prop("b", "1")},
			wantSkipped: 1,
		},
		{
			name:   "value of exactly 1024 characters kept",
			claims: []clusterv1.ManagedClusterClaim{claim("a", strings.Repeat("v", 1024))},
			want:   []cpv1alpha1.Property{prop("a", strings.Repeat("v", 1024))},
		},
		{
			name:        "value over 1024 characters skipped",
			claims:      []clusterv1.ManagedClusterClaim{claim("a", strings.Repeat("v", 1025)), claim("b", "1")},
			want:        []cpv1alpha1.Property{prop("b", "1")},
			wantSkipped: 1,
		},
		{
			name:   "name of exactly 253 characters kept",
			claims: []clusterv1.ManagedClusterClaim{claim(strings.Repeat("n", 253), "1")},
			want:   []cpv1alpha1.Property{prop(strings.Repeat("n", 253), "1")},
		},
		{
			name:        "name over 253 characters skipped",
			claims:      []clusterv1.ManagedClusterClaim{claim(strings.Repeat("n", 254), "1"), claim("b", "2")},
			want:        []cpv1alpha1.Property{prop("b", "2")},
			wantSkipped: 1,
		},
		{
			name:        "duplicates skipped, first wins",
			claims:      []clusterv1.ManagedClusterClaim{claim("a", "first"), claim("b", "1"), claim("a", "second"), claim("a", "third")},
			want:        []cpv1alpha1.Property{prop("a", "first"), prop("b", "1")},
			wantSkipped: 2,
		},
		{
			name:        "everything skipped",
			claims:      []clusterv1.ManagedClusterClaim{claim("", ""), claim("x", "")},
			want:        []cpv1alpha1.Property{},
			wantSkipped: 2,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := Properties(tc.claims)
			if got == nil {
				t.Error("Properties() = nil, want a non-nil slice")
			}
			if len(got) != len(tc.want) {
				t.Fatalf("Properties() = %v, want %v", got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Errorf("Properties()[%d] = %+v, want %+v", i, got[i], tc.want[i])
				}
			}
			if n := SkippedClaims(tc.claims); n != tc.wantSkipped {
				t.Errorf("SkippedClaims() = %d, want %d", n, tc.wantSkipped)
			}
		})
	}
}

// --- writeTracker -----------------------------------------------------------

func TestWriteTracker(t *testing.T) {
	profile := func(ns, name, rv string, uid types.UID) *cpv1alpha1.ClusterProfile {
		return &cpv1alpha1.ClusterProfile{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, ResourceVersion: rv, UID: uid}}
	}
	type step struct {
		wrote   *cpv1alpha1.ClusterProfile // record a create/update
		deleted *cpv1alpha1.ClusterProfile // record a delete
		sleep   time.Duration
		key     string // otherwise: ask pending(key, cached)
		cached  *cpv1alpha1.ClusterProfile
		want    bool
	}
	tests := []struct {
		name  string
		ttl   time.Duration
		steps []step
	}{
		{
			name:  "unknown key is not pending",
			ttl:   time.Minute,
			steps: []step{{key: "ns1/c1", cached: nil, want: false}},
		},
		{
			name: "create pending until cache shows it",
			ttl:  time.Minute,
			steps: []step{
				{wrote: profile("ns1", "c1", "10", "u1")},
				{key: "ns1/c1", cached: nil, want: true},
				{key: "ns1/c1", cached: profile("ns1", "c1", "9", "u1"), want: true},
				{key: "ns1/c1", cached: profile("ns1", "c1", "10", "u1"), want: false},
				// Caught up: the entry is dropped, an older cache no longer blocks.
				{key: "ns1/c1", cached: profile("ns1", "c1", "9", "u1"), want: false},
			},
		},
		{
			name: "cache ahead of the write is not pending",
			ttl:  time.Minute,
			steps: []step{
				{wrote: profile("ns1", "c1", "10", "u1")},
				{key: "ns1/c1", cached: profile("ns1", "c1", "11", "u1"), want: false},
			},
		},
		{
			name: "keys are independent",
			ttl:  time.Minute,
			steps: []step{
				{wrote: profile("ns1", "c1", "10", "u1")},
				{key: "ns2/c1", cached: nil, want: false},
				{key: "ns1/c2", cached: nil, want: false},
				{key: "ns1/c1", cached: nil, want: true},
			},
		},
		{
			name: "non-integer written resourceVersion is not tracked",
			ttl:  time.Minute,
			steps: []step{
				{wrote: profile("ns1", "c1", "abc", "u1")},
				{key: "ns1/c1", cached: nil, want: false},
			},
		},
		{
			name: "non-integer cached resourceVersion releases the key",
			ttl:  time.Minute,
			steps: []step{
				{wrote: profile("ns1", "c1", "10", "u1")},
				{key: "ns1/c1", cached: profile("ns1", "c1", "xyz", "u1"), want: false},
				{key: "ns1/c1", cached: nil, want: false},
			},
		},
		{
			name: "delete pending while cache still has that UID",
			ttl:  time.Minute,
			steps: []step{
				{deleted: profile("ns1", "c1", "10", "u1")},
				{key: "ns1/c1", cached: profile("ns1", "c1", "10", "u1"), want: true},
				{key: "ns1/c1", cached: profile("ns1", "c1", "12", "u1"), want: true},
				{key: "ns1/c1", cached: nil, want: false},
				{key: "ns1/c1", cached: profile("ns1", "c1", "10", "u1"), want: false},
			},
		},
		{
			name: "delete followed by a recreate with another UID is not pending",
			ttl:  time.Minute,
			steps: []step{
				{deleted: profile("ns1", "c1", "10", "u1")},
				{key: "ns1/c1", cached: profile("ns1", "c1", "20", "u2"), want: false},
			},
		},
		{
			name: "a write after a delete replaces the delete",
			ttl:  time.Minute,
			steps: []step{
				{deleted: profile("ns1", "c1", "10", "u1")},
				{wrote: profile("ns1", "c1", "20", "u2")},
				{key: "ns1/c1", cached: profile("ns1", "c1", "10", "u1"), want: true},
				{key: "ns1/c1", cached: profile("ns1", "c1", "20", "u2"), want: false},
			},
		},
		{
			name: "write entry expires",
			ttl:  time.Millisecond,
			steps: []step{
				{wrote: profile("ns1", "c1", "10", "u1")},
				{sleep: 5 * time.Millisecond},
				{key: "ns1/c1", cached: nil, want: false},
			},
		},
		{
			name: "delete entry expires",
			ttl:  time.Millisecond,
			steps: []step{
				{deleted: profile("ns1", "c1", "10", "u1")},
				{sleep: 5 * time.Millisecond},
				{key: "ns1/c1", cached: profile("ns1", "c1", "10", "u1"), want: false},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := newWriteTracker(tc.ttl)
			for i, s := range tc.steps {
				switch {
				case s.wrote != nil:
					w.wrote(s.wrote)
				case s.deleted != nil:
					w.deletedObj(s.deleted)
				case s.sleep > 0:
					time.Sleep(s.sleep)
				default:
					if got := pendingFor(w, s.key, s.cached); got != s.want {
						t.Errorf("step %d: pending(%q, %v) = %v, want %v", i, s.key, s.cached != nil, got, s.want)
					}
				}
			}
		})
	}
}

// TestWriteTrackerEchoAfterSkip: hubsync's own write coming back is
// ignored, unless a reconcile skipped the object while the cache was
// behind that write: then the echo is the event that re-queues the work.
func TestWriteTrackerEchoAfterSkip(t *testing.T) {
	copyAt := func(rv string) *corev1.Secret {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c-msa", ResourceVersion: rv, UID: "u1"}}
	}
	w := newWriteTracker(time.Minute)
	w.wrote(copyAt("10"))
	if !w.isEcho(copyAt("10")) {
		t.Fatal("the write's own event is an echo")
	}
	// A reconcile (an MSA's status changed) runs before the cache has the
	// write, and skips the copy.
	if !pendingFor(w, "ns/c-msa", (*corev1.Secret)(nil)) {
		t.Fatal("the cache is behind the write")
	}
	if w.isEcho(copyAt("10")) {
		t.Fatal("the echo of a write a reconcile skipped for was ignored: the skipped change would wait for the next resync")
	}
	if pendingFor(w, "ns/c-msa", copyAt("10")) {
		t.Fatal("once the cache has the write, nothing is pending")
	}
}
