package syncer

import (
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

// step is one thing that happens to one object in TestForeignWriters:
// time passes, hubsync writes it, the other writer's version is seen, it
// is deleted, or the contested objects are read.
type step struct {
	after  time.Duration
	op     string // wrote, observe, forget, read
	rv     string
	intent uint64
	// observe: what the verdict must say.
	counted, hold bool
	recheck       time.Duration
	holdOff       time.Duration // of the report; 0 for none
	// read: how many objects are contested.
	contested int
}

func wrote(rv string, intent uint64) step { return step{op: "wrote", rv: rv, intent: intent} }

// seen is a foreign write hubsync sees when about to write intent.
func seen(after time.Duration, rv string, intent uint64) step {
	return step{op: "observe", after: after, rv: rv, intent: intent}
}

func (s step) counts() step                     { s.counted = true; return s }
func (s step) holds(recheck time.Duration) step { s.hold, s.recheck = true, recheck; return s }
func (s step) reports(holdOff time.Duration) step {
	s.holdOff = holdOff
	return s
}

func read(after time.Duration, contested int) step {
	return step{op: "read", after: after, contested: contested}
}

// contestFor is a contest made at the start of a case: three foreign
// writes of an object hubsync wrote, 5 s apart, ending at 10 s with the
// first hold-off (30 s).
func contestFor() []step {
	return []step{
		wrote("1", 7),
		seen(0, "2", 7).counts(),
		wrote("3", 7),
		seen(5*time.Second, "4", 7).counts(),
		wrote("5", 7),
		seen(5*time.Second, "6", 7).counts().holds(30 * time.Second).reports(30 * time.Second),
	}
}

// TestForeignWriters drives the detector through sequences of hubsync's
// writes and what the cache shows when hubsync is about to write again,
// on a fake clock: hubsync's own echoes and new intents are never foreign;
// one or two foreign writes are restored at once; three within a minute
// start a hold-off that doubles while the other writer goes on and clears
// after a quiet hold-off.
func TestForeignWriters(t *testing.T) {
	const s = time.Second
	tests := []struct {
		name  string
		steps []step
	}{
		{name: "the cache at hubsync's own write, a new intent", steps: []step{wrote("1", 7), seen(0, "1", 8)}},
		{name: "a new intent after someone else's write", steps: []step{wrote("1", 7), seen(0, "2", 8), seen(0, "3", 9)}},
		{name: "an object hubsync has not written since it started", steps: []step{seen(0, "2", 7), seen(s, "3", 7)}},
		{name: "one foreign write is restored at once", steps: []step{wrote("1", 7), seen(0, "2", 7).counts(), read(0, 0)}},
		{name: "one foreign write is counted once", steps: []step{wrote("1", 7), seen(0, "2", 7).counts(), seen(s, "2", 7)}},
		{name: "two foreign writes are restored at once", steps: []step{
			wrote("1", 7), seen(0, "2", 7).counts(), wrote("3", 7), seen(s, "4", 7).counts(), read(0, 0),
		}},
		{name: "three foreign writes within a minute", steps: append(contestFor(), read(0, 1))},
		{name: "three foreign writes more than a minute apart", steps: []step{
			wrote("1", 7), seen(0, "2", 7).counts(), wrote("3", 7), seen(30*s, "4", 7).counts(), wrote("5", 7), seen(31*s, "6", 7).counts(), read(0, 0),
		}},
		{name: "held until the hold-off ends, re-checked once", steps: append(contestFor(),
			seen(s, "7", 7).counts().holds(0),
			seen(s, "7", 7).holds(0),
			seen(28*s, "7", 7), // the hold-off has ended: written again
		)},
		{name: "a new intent is held too", steps: append(contestFor(), seen(s, "6", 8).holds(0))},
		{name: "the hold-off doubles up to its cap", steps: append(contestFor(),
			wrote("7", 7), seen(30*s, "8", 7).counts().holds(60*s).reports(60*s),
			wrote("9", 7), seen(60*s, "10", 7).counts().holds(120*s).reports(120*s),
			wrote("11", 7), seen(120*s, "12", 7).counts().holds(240*s).reports(240*s),
			wrote("13", 7), seen(240*s, "14", 7).counts().holds(300*s).reports(300*s),
			wrote("15", 7), seen(300*s, "16", 7).counts().holds(300*s).reports(300*s),
		)},
		{name: "cleared after a quiet hold-off", steps: append(contestFor(),
			wrote("7", 7), // at the end of the hold-off
			read(30*s, 1),
			read(29*s, 1),
			read(s, 0),
			seen(0, "8", 7).counts(), // a new foreign write starts again from one
			wrote("9", 7), seen(s, "10", 7).counts(), wrote("11", 7), seen(s, "12", 7).counts().holds(30*s).reports(30*s),
		)},
		{name: "a foreign write during the hold-off does not delay clearing", steps: append(contestFor(),
			seen(5*s, "7", 7).counts().holds(0),
			wrote("8", 7),
			read(55*s, 0),
		)},
		{name: "a foreign write after the hold-off keeps it contested", steps: append(contestFor(),
			wrote("7", 7),
			seen(40*s, "8", 7).counts().holds(60*s).reports(60*s),
			read(60*s, 1),
			read(60*s, 0),
		)},
		{name: "deleting forgets hubsync's write", steps: []step{wrote("1", 7), {op: "forget"}, seen(0, "2", 7)}},
		{name: "deleting ends a contest", steps: append(contestFor(), read(0, 1), step{op: "forget"}, read(0, 0))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := clocktesting.NewFakePassiveClock(time.Unix(1000, 0))
			f := newForeignWriters(clk, ForeignOptions{HoldOff: 30 * time.Second, MaxHoldOff: 5 * time.Minute})
			for i, st := range tt.steps {
				clk.SetTime(clk.Now().Add(st.after))
				switch st.op {
				case "wrote":
					f.wrote(KindProfile, "team-a", "c1", st.rv, st.intent)
				case "forget":
					f.forget(KindProfile, "team-a", "c1")
				case "read":
					f.settle()
					if got := len(f.contested()); got != st.contested {
						t.Fatalf("step %d: %d contested, want %d", i, got, st.contested)
					}
				case "observe":
					v := f.observe(KindProfile, "team-a", "c1", st.rv, st.intent)
					holdOff := time.Duration(0)
					if v.report != nil {
						holdOff = v.report.HoldOff
					}
					if v.counted != st.counted || v.hold != st.hold || v.recheck != st.recheck || holdOff != st.holdOff {
						t.Fatalf("step %d: verdict counted=%v hold=%v recheck=%v report hold-off=%v; want %v %v %v %v",
							i, v.counted, v.hold, v.recheck, holdOff, st.counted, st.hold, st.recheck, st.holdOff)
					}
				}
			}
		})
	}
}

// TestForeignWritersKeepObjectsApart: a contested object holds only
// itself, not another object of the same name and namespace of another
// kind, nor another namespace's.
func TestForeignWritersKeepObjectsApart(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(time.Unix(1000, 0))
	f := newForeignWriters(clk, ForeignOptions{HoldOff: 30 * time.Second, MaxHoldOff: 5 * time.Minute})
	for _, o := range [][3]string{{KindProfile, "a", "c1"}, {KindCredential, "a", "c1"}, {KindProfile, "b", "c1"}} {
		f.wrote(o[0], o[1], o[2], "1", 7)
	}
	f.observe(KindProfile, "a", "c1", "2", 7)
	f.wrote(KindProfile, "a", "c1", "3", 7)
	f.observe(KindProfile, "a", "c1", "4", 7)
	f.wrote(KindProfile, "a", "c1", "5", 7)
	if v := f.observe(KindProfile, "a", "c1", "6", 7); !v.hold {
		t.Fatalf("the contested profile is not held: %+v", v)
	}
	for _, o := range [][3]string{{KindCredential, "a", "c1"}, {KindProfile, "b", "c1"}} {
		if v := f.observe(o[0], o[1], o[2], "1", 8); v.hold || v.counted {
			t.Errorf("%v: verdict %+v, want a plain write", o, v)
		}
	}
	got := f.contested()
	if len(got) != 1 || got[0].Kind != KindProfile || got[0].Namespace != "a" || got[0].Writes != 3 {
		t.Errorf("contested = %+v", got)
	}
}
