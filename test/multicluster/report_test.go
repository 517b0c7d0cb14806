package multicluster_test

import (
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/hubsync/hubsync/test/multicluster/inventory"
)

// Categories of rebuilds, by what caused them.
const (
	catAccess   = "access config changed (server/CA): expected"
	catProvider = "hubsync changed what the provider reads besides server/CA"
	catUpstream = "upstream's func-field comparison, on a hubsync write consumers read"
	catNoop     = "hubsync write that changed nothing a consumer reads: hubsync defect"
	catNoWrite  = "no profile write (a requeue or resync): upstream's comparison alone"
)

// rebuild is one rebuild and the writes between the version its cluster
// had been built from and the one it was rebuilt from.
type rebuild struct {
	d        inventory.Decision
	writes   []write
	category string
	phase    string
}

// categorize names what caused a rebuild.
func categorize(d inventory.Decision, writes []write) string {
	if len(writes) == 0 {
		return catNoWrite
	}
	most := inventory.Invisible
	for _, w := range writes {
		most = max(most, w.change.Class)
	}
	switch {
	case most == inventory.AccessConfig && d.AccessChanged:
		return catAccess
	case d.IgnoringFuncsDiffers:
		return catProvider
	case most >= inventory.ConsumerVisible:
		return catUpstream
	}
	return catNoop
}

// phaseOf names the phase a profile version was written in.
func (p *proof) phaseOf(profile string, version uint64) string {
	for _, ph := range p.phases {
		b := ph.barrier[profile]
		switch {
		case version < b:
			return ph.name
		case version == b:
			return ph.name + " (barrier)"
		}
	}
	return "after the last barrier"
}

func (p *proof) rebuilds() []rebuild {
	var out []rebuild
	for _, d := range p.c.provider.Decisions() {
		if !d.Rebuilt {
			continue
		}
		ws := p.hist.between(d.Cluster, rv(d.From), rv(d.ResourceVersion))
		r := rebuild{d: d, writes: ws, category: categorize(d, ws), phase: p.phaseOf(d.Cluster, rv(d.ResourceVersion))}
		out = append(out, r)
	}
	return out
}

// report prints the writes and rebuilds of every phase and asserts the
// bounds: no hubsync write that changes nothing a consumer reads, no
// rebuild caused by one, no write at all in a quiet phase, and a real
// access change rebuilds every cluster.
func (p *proof) report(t *testing.T) {
	t.Helper()
	rebuilds := p.rebuilds()
	st := p.c.provider.Stats()
	byCat := map[string]int{}
	for _, r := range rebuilds {
		byCat[r.category]++
	}
	t.Logf("engagements per cluster %v; rebuilds %d (decisions marked rebuilt: %d); reconciles of an engaged cluster whose config upstream's rule finds changed: %d, the rule ignoring funcs: %d",
		st.Engagements, st.Rebuilds, len(rebuilds), st.UpstreamWould, st.IgnoringFuncsWould)
	if st.Rebuilds != len(rebuilds) {
		t.Errorf("the rebuild counter says %d, the decisions %d", st.Rebuilds, len(rebuilds))
	}
	cats := make([]string, 0, len(byCat))
	for c := range byCat {
		cats = append(cats, c)
	}
	sort.Strings(cats)
	for _, c := range cats {
		t.Logf("  rebuilds: %d × %s", byCat[c], c)
	}
	p.reportPhases(t, rebuilds)
	runs, failures, _ := p.c.reconciler.counts()
	t.Logf("controller reconciles per cluster %v (every rebuild re-lists and re-reconciles every ConfigMap); failed updates per cluster %v", runs, failures)
	p.assertBounds(t, rebuilds)
}

// reportPhases prints, per phase, hubsync's writes and the rebuilds.
func (p *proof) reportPhases(t *testing.T, rebuilds []rebuild) {
	t.Helper()
	writes := map[string][]write{}
	for _, w := range p.hist.all() {
		if w.kind != "update" {
			continue
		}
		ph := p.phaseOf(w.profile, w.rv)
		writes[ph] = append(writes[ph], w)
	}
	rb := map[string][]rebuild{}
	for _, r := range rebuilds {
		rb[r.phase] = append(rb[r.phase], r)
	}
	var names []string
	for _, ph := range p.phases {
		names = append(names, ph.name, ph.name+" (barrier)")
	}
	names = append(names, "after the last barrier")
	for _, n := range names {
		if len(writes[n]) == 0 && len(rb[n]) == 0 {
			t.Logf("phase %-28s no profile write, no rebuild", n)
			continue
		}
		t.Logf("phase %-28s %d profile writes, %d rebuilds", n, len(writes[n]), len(rb[n]))
		for _, w := range writes[n] {
			t.Logf("    write %s@%d %s: %s", w.profile, w.rv, w.change.Class, strings.Join(w.change.Fields, ", "))
		}
		for _, r := range rb[n] {
			t.Logf("    rebuild %s %s→%s: %s", r.d.Cluster, r.d.From, r.d.ResourceVersion, r.category)
		}
	}
}

// assertBounds fails the test on hubsync defects, with the evidence.
func (p *proof) assertBounds(t *testing.T, rebuilds []rebuild) {
	t.Helper()
	for _, w := range p.hist.all() {
		if w.kind == "update" && w.change.Class == inventory.Invisible {
			t.Errorf("hubsync wrote profile %s (version %d, phase %s) changing nothing a consumer reads: %s; made by %s",
				w.profile, w.rv, p.phaseOf(w.profile, w.rv), strings.Join(w.change.Fields, ", "), w.codePath())
		}
	}
	for _, ph := range p.phases {
		if !ph.quiet {
			continue
		}
		for _, w := range p.hist.all() {
			if w.kind == "update" && p.phaseOf(w.profile, w.rv) == ph.name {
				t.Errorf("phase %s changes nothing a profile reflects, yet hubsync wrote %s (version %d): %s %s; made by %s",
					ph.name, w.profile, w.rv, w.change.Class, strings.Join(w.change.Fields, ", "), w.codePath())
			}
		}
	}
	access := map[string]int{}
	for _, r := range rebuilds {
		switch r.category {
		case catNoop, catProvider:
			t.Errorf("rebuild of %s (%s→%s, phase %s) caused by %s: %s", r.d.Cluster, r.d.From, r.d.ResourceVersion, r.phase, r.category, describe(r.writes))
		case catAccess:
			access[r.d.Cluster]++
		}
	}
	for _, name := range clusterNames {
		if access[clusterKey(name)] == 0 {
			t.Errorf("the CA change did not rebuild %s: the test cannot tell an expected rebuild", name)
		}
	}
}

func describe(ws []write) string {
	var parts []string
	for _, w := range ws {
		parts = append(parts, fmt.Sprintf("version %d %s [%s] by %s", w.rv, w.change.Class, strings.Join(w.change.Fields, ", "), w.codePath()))
	}
	return strings.Join(parts, "; ")
}
