package syncer

import (
	"strings"
	"testing"

	"github.com/hubsync/hubsync/hub"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	cpv1alpha1 "sigs.k8s.io/cluster-inventory-api/apis/v1alpha1"
)

func TestPlanProfiles(t *testing.T) {
	ours := func(ns string) *cpv1alpha1.ClusterProfile {
		return &cpv1alpha1.ClusterProfile{ObjectMeta: metav1.ObjectMeta{
			Name: "c", Namespace: ns, Labels: map[string]string{hub.LabelClusterManager: testManager},
		}}
	}
	foreign := func(ns string) *cpv1alpha1.ClusterProfile {
		return &cpv1alpha1.ClusterProfile{ObjectMeta: metav1.ObjectMeta{
			Name: "c", Namespace: ns, Labels: map[string]string{hub.LabelClusterManager: "someone-else"},
		}}
	}
	unlabelled := func(ns string) *cpv1alpha1.ClusterProfile {
		return &cpv1alpha1.ClusterProfile{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: ns}}
	}
	membership := func(desired, held []string) Membership {
		return Membership{Desired: sets.New(desired...), Held: sets.New(held...)}
	}
	all := func(string) bool { return true }
	except := func(bad ...string) func(string) bool {
		return func(ns string) bool { return !sets.New(bad...).Has(ns) }
	}
	nss := func(ps []*cpv1alpha1.ClusterProfile) string {
		out := make([]string, len(ps))
		for i, p := range ps {
			out[i] = p.Namespace
		}
		return strings.Join(out, ",")
	}
	for _, tc := range []struct {
		name                                string
		m                                   Membership
		existing                            []*cpv1alpha1.ClusterProfile
		writable                            func(string) bool
		create, update, delete, conflicting string
	}{
		{name: "nothing anywhere", m: membership(nil, nil), writable: all},
		{name: "create where missing, sorted", m: membership([]string{"b", "a"}, nil), writable: all, create: "a,b"},
		{name: "keep existing ours", m: membership([]string{"a", "b"}, nil), existing: []*cpv1alpha1.ClusterProfile{ours("a")},
			writable: all, create: "b", update: "a"},
		{name: "delete ours without a reason", m: membership([]string{"a"}, nil),
			existing: []*cpv1alpha1.ClusterProfile{ours("a"), ours("z"), ours("m")}, writable: all, update: "a", delete: "m,z"},
		{name: "deleted cluster removes all ours", m: membership(nil, nil),
			existing: []*cpv1alpha1.ClusterProfile{ours("a"), ours("b")}, writable: all, delete: "a,b"},
		{name: "foreign profile with the wanted name is a conflict", m: membership([]string{"a", "b"}, nil),
			existing: []*cpv1alpha1.ClusterProfile{foreign("a")}, writable: all, create: "b", conflicting: "a"},
		{name: "profile without manager label is foreign", m: membership([]string{"a"}, nil),
			existing: []*cpv1alpha1.ClusterProfile{unlabelled("a")}, writable: all, conflicting: "a"},
		{name: "foreign profile not wanted is left alone", m: membership(nil, nil),
			existing: []*cpv1alpha1.ClusterProfile{foreign("a"), unlabelled("b")}, writable: all},
		{name: "held namespace keeps ours and creates nothing", m: membership(nil, []string{"h", "i"}),
			existing: []*cpv1alpha1.ClusterProfile{ours("h")}, writable: all},
		{name: "terminating namespace is left alone", m: membership([]string{"a", "t"}, nil),
			existing: []*cpv1alpha1.ClusterProfile{ours("gone")}, writable: except("t", "gone"), create: "a"},
		{name: "terminating namespace with a foreign profile is no conflict", m: membership([]string{"t"}, nil),
			existing: []*cpv1alpha1.ClusterProfile{foreign("t")}, writable: except("t")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			plan := PlanProfiles(tc.m, tc.existing, testManager, tc.writable)
			if got := strings.Join(plan.Create, ","); got != tc.create {
				t.Errorf("create = %q, want %q", got, tc.create)
			}
			if got := nss(plan.Update); got != tc.update {
				t.Errorf("update = %q, want %q", got, tc.update)
			}
			if got := nss(plan.Delete); got != tc.delete {
				t.Errorf("delete = %q, want %q", got, tc.delete)
			}
			if got := nss(plan.Conflicts); got != tc.conflicting {
				t.Errorf("conflicts = %q, want %q", got, tc.conflicting)
			}
		})
	}
}
