package syncer

import (
	"hash/maphash"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// FieldManager is the field manager of every write hubsync makes, so that
// an object's managedFields tell hubsync's fields from another writer's.
const FieldManager = "hubsync"

// Kinds of object hubsync writes, as hubsync_contested_objects and
// hubsync_foreign_writes_total label them.
const (
	KindProfile    = "profile"
	KindCredential = "credential"
)

// Kinds lists every kind, so that each has a series from the start.
func Kinds() []string { return []string{KindProfile, KindCredential} }

// An object is contested once another writer has undone hubsync's write
// foreignThreshold times within foreignWindow. A person's edits (say a
// label, then a condition) are restored at once, every time; a controller
// that keeps writing its own version undoes hubsync's restores within
// moments and is not fought beyond that.
const (
	foreignThreshold = 3
	foreignWindow    = time.Minute
)

// ForeignOptions tune how hubsync backs off from an object that another
// controller writes too (config.ForeignWriters supplies them).
type ForeignOptions struct {
	// HoldOff is how long hubsync leaves a contested object alone at
	// first. It doubles, up to MaxHoldOff, each time the other writer
	// undoes hubsync's write again after a hold-off.
	HoldOff, MaxHoldOff time.Duration
}

// Contested is an object that another controller writes too, as
// /readyz?verbose and the Events report it.
type Contested struct {
	Kind, Namespace, Name string
	// Writer is the other writer's field manager, "" until hubsync has
	// read the object's managedFields or when none but hubsync's own
	// owns the fields.
	Writer string
	// Controller is the controller behind Writer as far as hubsync knows
	// it ("cluster-proxy", "managed-serviceaccount", "OCM registration"),
	// else Writer, or "unknown".
	Controller string
	// Since is when the object became contested.
	Since time.Time
	// HoldOff is the current hold-off, which ends at Until.
	HoldOff time.Duration
	Until   time.Time
	// Writes counts the other writer's writes seen since Since.
	Writes int
}

// foreignWriters tells hubsync's own writes from another controller's.
// For each object hubsync writes it remembers the resourceVersion its
// last write produced and a print of what hubsync wanted the object to
// say. When hubsync must write an object again although what it wants is
// unchanged (the same print) and the object is no longer at hubsync's own
// resourceVersion, someone else changed what hubsync manages: a foreign
// write. A write costs a print (about a microsecond) and a map entry; only
// an object that becomes contested costs a request (its managedFields).
//
// Repeated foreign writes make the object contested: hubsync stops
// rewriting it for a hold-off instead of fighting the other writer write
// for write, and writes it again once the hold-off ends. The state clears
// after a further hold-off without a foreign write.
type foreignWriters struct {
	clock clock.PassiveClock
	opts  ForeignOptions
	seed  maphash.Seed

	mu      sync.Mutex
	written map[string]ownWrite // key -> hubsync's last write
	seen    map[string]*contest // key -> foreign writes seen recently
}

// ownWrite is hubsync's last write of an object.
type ownWrite struct {
	rv     string
	intent uint64
}

// contest is what is known of the foreign writes to one object.
type contest struct {
	Contested
	contested bool
	lastRV    string      // resourceVersion of the last foreign write counted
	recent    []time.Time // the last foreignThreshold foreign writes
	last      time.Time   // the last foreign write
	recheck   bool        // a re-check at Until is scheduled
}

// verdict is what observe tells the writer about one write it is about to
// make.
type verdict struct {
	// counted: the object's current state is a foreign write not seen
	// before.
	counted bool
	// hold: do not write the object now.
	hold bool
	// recheck, when positive, is when to look at the object again: the
	// end of the hold-off.
	recheck time.Duration
	// report, when set, starts a hold-off: report it once.
	report *Contested
}

func newForeignWriters(clk clock.PassiveClock, opts ForeignOptions) *foreignWriters {
	return &foreignWriters{
		clock: clk, opts: opts, seed: maphash.MakeSeed(),
		written: map[string]ownWrite{}, seen: map[string]*contest{},
	}
}

func foreignKey(kind, namespace, name string) string {
	return kind + "/" + namespace + "/" + name
}

// wrote records a write hubsync made: the resourceVersion the server gave
// it and intent, the print of what hubsync wanted.
func (f *foreignWriters) wrote(kind, namespace, name, rv string, intent uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.written[foreignKey(kind, namespace, name)] = ownWrite{rv: rv, intent: intent}
}

// forget drops an object that was deleted: there is nothing left to
// contest, and a new object of its name starts afresh.
func (f *foreignWriters) forget(kind, namespace, name string) {
	key := foreignKey(kind, namespace, name)
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.written, key)
	delete(f.seen, key)
}

// observe is called when hubsync is about to write an object that the
// cache shows at rv, wanting it to say what intent sums up. It counts a
// foreign write, starts or extends a hold-off, and says whether to write.
func (f *foreignWriters) observe(kind, namespace, name, rv string, intent uint64) verdict {
	now := f.clock.Now()
	key := foreignKey(kind, namespace, name)
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.seen[key]
	if c != nil && f.settled(c, now) {
		delete(f.seen, key)
		c = nil
	}
	var v verdict
	own, known := f.written[key]
	if known && own.rv != rv && own.intent == intent && (c == nil || c.lastRV != rv) {
		if c == nil {
			c = &contest{Contested: Contested{Kind: kind, Namespace: namespace, Name: name}}
			f.seen[key] = c
		}
		v.counted = true
		v.report = f.count(c, rv, now)
	}
	if c == nil || !c.contested || !now.Before(c.Until) {
		return v
	}
	v.hold = true
	if !c.recheck {
		c.recheck = true
		v.recheck = c.Until.Sub(now)
	}
	return v
}

// count records a foreign write at rv and returns the state to report
// when it starts a hold-off: the object's first, or, after a hold-off
// ended and hubsync wrote again, the next one, twice as long.
func (f *foreignWriters) count(c *contest, rv string, now time.Time) *Contested {
	c.lastRV, c.last = rv, now
	c.recent = append(c.recent, now)
	if len(c.recent) > foreignThreshold {
		c.recent = c.recent[len(c.recent)-foreignThreshold:]
	}
	c.Writes++
	switch {
	case !c.contested:
		if len(c.recent) < foreignThreshold || now.Sub(c.recent[0]) > foreignWindow {
			return nil
		}
		c.contested, c.Since, c.HoldOff, c.Writes = true, now, f.opts.HoldOff, len(c.recent)
	case now.Before(c.Until):
		// Within the hold-off: counted, nothing changes.
		return nil
	default:
		c.HoldOff = min(2*c.HoldOff, f.opts.MaxHoldOff)
	}
	c.Until, c.recheck = now.Add(c.HoldOff), false
	out := c.Contested
	return &out
}

// settled reports whether an entry is done with: a contested object
// without a foreign write for a whole hold-off after its hold-off ended,
// or an uncontested one whose foreign write is older than the window.
func (f *foreignWriters) settled(c *contest, now time.Time) bool {
	if !c.contested {
		return now.Sub(c.last) > foreignWindow
	}
	return c.last.Before(c.Until) && !now.Before(c.Until.Add(c.HoldOff))
}

// named records the writer hubsync found in the object's managedFields.
func (f *foreignWriters) named(kind, namespace, name, writer, controller string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if c, ok := f.seen[foreignKey(kind, namespace, name)]; ok {
		c.Writer, c.Controller = writer, controller
	}
}

// settle drops the entries that are done with and returns the contested
// objects that were cleared.
func (f *foreignWriters) settle() []Contested {
	now := f.clock.Now()
	f.mu.Lock()
	defer f.mu.Unlock()
	var cleared []Contested
	for key, c := range f.seen {
		if !f.settled(c, now) {
			continue
		}
		if c.contested {
			cleared = append(cleared, c.Contested)
		}
		delete(f.seen, key)
	}
	return cleared
}

// contested returns the objects contested now, sorted by kind, namespace
// and name; call settle first.
func (f *foreignWriters) contested() []Contested {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []Contested
	for _, c := range f.seen {
		if c.contested {
			out = append(out, c.Contested)
		}
	}
	slices.SortFunc(out, func(a, b Contested) int {
		return strings.Compare(foreignKey(a.Kind, a.Namespace, a.Name), foreignKey(b.Kind, b.Namespace, b.Name))
	})
	return out
}
