package multicluster_test

import (
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/tools/cache"
	cpv1alpha1 "sigs.k8s.io/cluster-inventory-api/apis/v1alpha1"
	cpinformers "sigs.k8s.io/cluster-inventory-api/client/informers/externalversions"
	"sigs.k8s.io/cluster-inventory-api/pkg/access"

	"github.com/hubsync/hubsync/test/fleet"
	"github.com/hubsync/hubsync/test/multicluster/inventory"
)

// write is one change of a profile seen on the hub. Only hubsync writes
// the consumer namespace's profiles, so each is a hubsync write.
type write struct {
	profile string // "<namespace>/<name>"
	rv      uint64
	at      time.Time
	kind    string // "create", "update" or "delete"
	change  inventory.Change
	before  *cpv1alpha1.ClusterProfile
	after   *cpv1alpha1.ClusterProfile
}

// codePath names the hubsync code that makes a write of this shape.
func (w write) codePath() string {
	switch w.kind {
	case "create":
		return "syncer/topology.go (*Syncer).create: Create of NewProfile (syncer/desired.go)"
	case "delete":
		return "syncer/topology.go (*Syncer).delete"
	}
	status, meta := false, false
	for _, f := range w.change.Fields {
		switch {
		case strings.HasPrefix(f, "status."):
			status = true
		case f != "metadata.managedFields" && f != "metadata.resourceVersion only":
			meta = true
		}
	}
	var parts []string
	if meta {
		parts = append(parts, "syncer/topology.go (*Syncer).update: ReconcileMeta (syncer/desired.go), then Update")
	}
	if status {
		from := "(*Syncer).update: DesiredStatus (syncer/desired.go)"
		if len(w.before.Status.Conditions) == 0 && len(w.before.Status.AccessProviders) == 0 {
			from = "(*Syncer).create, right after the Create"
		}
		parts = append(parts, "syncer/topology.go "+from+", then writeStatus (syncer/status_write.go)")
	}
	if len(parts) == 0 {
		return "unknown: neither metadata nor status changed"
	}
	return strings.Join(parts, " + ")
}

// history records every write to the profiles of one namespace.
type history struct {
	access *access.Config
	mu     sync.Mutex
	writes []write
}

// startHistory watches the profiles of namespace until the test ends.
func startHistory(t *testing.T, h *fleet.Hub, conf *access.Config, namespace string) *history {
	t.Helper()
	hist := &history{access: conf}
	factory := cpinformers.NewSharedInformerFactoryWithOptions(h.Profiles, 0, cpinformers.WithNamespace(namespace))
	inf := factory.Apis().V1alpha1().ClusterProfiles().Informer()
	_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if p, ok := obj.(*cpv1alpha1.ClusterProfile); ok {
				hist.add(write{kind: "create", after: p})
			}
		},
		UpdateFunc: func(oldObj, newObj any) {
			b, okB := oldObj.(*cpv1alpha1.ClusterProfile)
			a, okA := newObj.(*cpv1alpha1.ClusterProfile)
			if okB && okA && b.ResourceVersion != a.ResourceVersion {
				hist.add(write{kind: "update", before: b, after: a})
			}
		},
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if p, ok := obj.(*cpv1alpha1.ClusterProfile); ok {
				hist.add(write{kind: "delete", before: p, after: p})
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	factory.Start(stop)
	t.Cleanup(func() { close(stop); factory.Shutdown() })
	if !cache.WaitForCacheSync(t.Context().Done(), inf.HasSynced) {
		t.Fatal("profile history: cache not synced")
	}
	return hist
}

func (h *history) add(w write) {
	w.at = time.Now()
	w.profile = w.after.Namespace + "/" + w.after.Name
	w.rv = rv(w.after.ResourceVersion)
	if w.kind == "update" {
		w.change = inventory.ClassifyUpdate(h.access, w.before, w.after)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.writes = append(h.writes, w)
}

// all returns the writes seen so far, in the order of their versions.
func (h *history) all() []write {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := append([]write(nil), h.writes...)
	sort.SliceStable(out, func(i, j int) bool { return out[i].rv < out[j].rv })
	return out
}

// between returns the writes of a profile with from < version <= to.
func (h *history) between(profile string, from, to uint64) []write {
	var out []write
	for _, w := range h.all() {
		if w.profile == profile && w.rv > from && w.rv <= to {
			out = append(out, w)
		}
	}
	return out
}

// firstWith returns the first update of a profile after which property
// name has value, and whether there is one yet.
func (h *history) firstWith(profile, name, value string) (write, bool) {
	for _, w := range h.all() {
		if w.profile == profile && w.kind == "update" && property(w.after, name) == value && property(w.before, name) != value {
			return w, true
		}
	}
	return write{}, false
}

func property(p *cpv1alpha1.ClusterProfile, name string) string {
	for _, pr := range p.Status.Properties {
		if pr.Name == name {
			return pr.Value
		}
	}
	return ""
}

// rv parses a resourceVersion; etcd-backed servers use integers, and
// anything else reads as 0 (before every write).
func rv(s string) uint64 {
	n, _ := strconv.ParseUint(s, 10, 64)
	return n
}
