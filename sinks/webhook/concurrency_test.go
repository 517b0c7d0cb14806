package webhook

import (
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hubsync/hubsync/events"
	"github.com/hubsync/hubsync/stream"
	"github.com/hubsync/hubsync/stream/streamtest"
)

// inFlight follows the requests a receiver is serving: how many at once,
// overall and per (namespace, cluster).
type inFlight struct {
	mu     sync.Mutex
	now    int
	max    int
	perKey map[stream.Key]int
	// overlaps are the keys that had two requests in flight at once.
	overlaps []stream.Key
}

// keyOf returns the (namespace, cluster) of a request's event.
func keyOf(t testing.TB, r *http.Request) stream.Key {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		t.Error(err)
	}
	ev, err := events.Decode(body)
	if err != nil {
		t.Error(err)
	}
	return stream.Key{Namespace: ev.Data.Namespace, Cluster: ev.Data.Cluster}
}

// enter records a request arriving and returns the function to call when
// it is answered.
func (f *inFlight) enter(t testing.TB, r *http.Request) func() {
	k := keyOf(t, r)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.perKey == nil {
		f.perKey = map[stream.Key]int{}
	}
	f.now++
	f.max = max(f.max, f.now)
	f.perKey[k]++
	if f.perKey[k] > 1 {
		f.overlaps = append(f.overlaps, k)
	}
	return func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.now--
		f.perKey[k]--
	}
}

func (f *inFlight) current() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

func (f *inFlight) most() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.max
}

func (f *inFlight) overlapping() []stream.Key {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.overlaps)
}

// keyBatches returns rounds batches, each with one change of every one of
// keys clusters; the first batch also holds a second change of the first
// cluster, so one batch has two events of a key.
func keyBatches(keys, rounds int) [][]stream.Change {
	var out [][]stream.Change
	for r := range rounds {
		var b []stream.Change
		for k := range keys {
			b = append(b, streamtest.Profile(stream.ProfileUpdated, "ns", fmt.Sprintf("c%02d", k), strconv.Itoa(100*r+1)))
			if r == 0 && k == 0 {
				b = append(b, streamtest.Profile(stream.ProfileUpdated, "ns", "c00", "2"))
			}
		}
		out = append(out, b)
	}
	return out
}

// With a receiver that answers after a random delay, events of different
// clusters go side by side, up to the sink's concurrency, while each
// cluster gets its events one at a time and in the order they were
// spooled.
func TestOrderPerKeyUnderConcurrency(t *testing.T) {
	const concurrency = 4
	var fl inFlight
	rc, e := newAnsweringEnv(t, http.StatusOK)
	rc.setHandle(func(_ int, r *http.Request) (int, http.Header) {
		leave := fl.enter(t, r)
		defer leave()
		// The receiver is far away, and some answers take much longer.
		time.Sleep(time.Duration(rand.IntN(4000)) * time.Microsecond)
		return http.StatusNoContent, nil
	})
	e.cfg.Webhook.Concurrency = concurrency
	s := e.start()
	batches := keyBatches(12, 8)
	deliverAll(t, s, batches...)
	want := perKeyOf(batches...)
	waitFor(t, "every event", func() bool { return len(rc.delivered()) >= 12*8+1 })
	waitFor(t, "an empty spool", func() bool { _, n := s.spool.size(); return n == 0 })
	if got := perKey(t, rc.all()); !maps.EqualFunc(got, want, slices.Equal) {
		t.Errorf("requests per key, in order:\n%v\nwant each event once, in spool order:\n%v", got, want)
	}
	if o := fl.overlapping(); len(o) > 0 {
		t.Errorf("two requests of one key in flight at once: %v", o)
	}
	if m := fl.most(); m < 2 || m > concurrency {
		t.Errorf("at most %d requests in flight at once; want more than one, at most %d", m, concurrency)
	}
}

// The sink never has more requests in flight than its concurrency, and
// keeps that many in flight while it has events of that many keys.
func TestConcurrencyBound(t *testing.T) {
	const concurrency, keys = 3, 30
	var fl inFlight
	gate := make(chan struct{}, keys)
	rc, e := newAnsweringEnv(t, http.StatusOK)
	rc.setHandle(func(_ int, r *http.Request) (int, http.Header) {
		leave := fl.enter(t, r)
		defer leave()
		select {
		case <-gate:
		case <-r.Context().Done(): // the sink gave up on it
		}
		return http.StatusOK, nil
	})
	e.cfg.Webhook.Concurrency = concurrency
	s := e.start()
	t.Cleanup(func() { close(gate) }) // a failed test lets the receiver go
	deliverAll(t, s, keyBatches(keys, 1)...)
	waitFor(t, "requests in flight up to the bound", func() bool { return fl.current() == concurrency })
	// Let the requests go one by one: each answer makes room for one more.
	for i := 1; i <= keys+1-concurrency; i++ {
		gate <- struct{}{}
		waitFor(t, "the next request", func() bool {
			return len(rc.all()) == i && fl.current() == concurrency
		})
	}
	for range concurrency {
		gate <- struct{}{}
	}
	waitFor(t, "every event", func() bool { return len(rc.delivered()) == keys+1 })
	if m := fl.most(); m != concurrency {
		t.Errorf("%d requests in flight at once, want at most %d", m, concurrency)
	}
}

// A 429 with Retry-After holds every cluster's events, not only the one
// refused: no request goes before it passes, and the first one after it
// goes alone.
func TestRetryAfterPausesEveryKey(t *testing.T) {
	const concurrency, keys = 4, 20
	var fl inFlight
	release := make(chan struct{})
	rc, e := newAnsweringEnv(t, http.StatusOK)
	rc.setHandle(func(n int, r *http.Request) (int, http.Header) {
		leave := fl.enter(t, r)
		defer leave()
		if n < concurrency {
			select {
			case <-release:
			case <-r.Context().Done(): // the sink gave up on it
			}
			return http.StatusTooManyRequests, http.Header{"Retry-After": {"1"}}
		}
		return http.StatusOK, nil
	})
	e.cfg.Webhook.Concurrency = concurrency
	s := e.start()
	letGo := releaseOnce(t, release)
	deliverAll(t, s, keyBatches(keys, 1)...)
	waitFor(t, "a request of each of four keys in flight", func() bool { return fl.current() == concurrency })
	// The endpoint throttles every request it holds; hubsync reads the
	// answers after this instant.
	throttled := time.Now()
	letGo()
	waitFor(t, "every event", func() bool { return len(rc.delivered()) == keys+1 })
	all := rc.all()
	slices.SortFunc(all, func(a, b received) int { return a.at.Compare(b.at) })
	after := all[concurrency:]
	if first := after[0].at; first.Sub(throttled) < time.Second {
		t.Errorf("a request came %s after the endpoint answered 429 with Retry-After: 1", first.Sub(throttled))
	}
	// The first request after the pause is a probe: the next one waits
	// for its answer.
	if len(after) > 1 && after[1].at.Before(after[0].answered) {
		t.Errorf("a second request came before the probe after the pause was answered")
	}
	if o := fl.overlapping(); len(o) > 0 {
		t.Errorf("two requests of one key in flight at once: %v", o)
	}
}

// Acknowledgements come out of order across keys: the events delivered
// behind one that is held stay recorded as delivered, the held one is not
// lost, and a restart (clean, or from what a crash leaves on disk) sends
// exactly the events not delivered, each once. The events delivered ahead
// of the held one are bounded by the sink's window.
func TestOutOfOrderAcksSurviveRestart(t *testing.T) {
	const concurrency, others = 4, 100
	release := make(chan struct{})
	held := stream.Key{Namespace: "ns", Cluster: "held"}
	var arrived atomic.Int32
	rc, e := newAnsweringEnv(t, http.StatusOK)
	rc.setHandle(func(_ int, r *http.Request) (int, http.Header) {
		arrived.Add(1)
		if keyOf(t, r) == held {
			select {
			case <-release:
			case <-r.Context().Done(): // the sink gave up on it
			}
			return http.StatusInternalServerError, nil
		}
		return http.StatusOK, nil
	})
	e.cfg.Webhook.Concurrency = concurrency
	s := e.start()
	letGo := releaseOnce(t, release)
	first := []stream.Change{
		streamtest.Profile(stream.ProfileCreated, "ns", "held", "1"),
		streamtest.Profile(stream.ProfileUpdated, "ns", "held", "2"),
	}
	rest := keyBatches(others, 1)
	deliverAll(t, s, append([][]stream.Change{first}, rest...)...)
	// The window holds the held key's two events and the events delivered
	// beyond them.
	window := windowPerRequest * concurrency
	waitFor(t, "the window full of delivered events", func() bool {
		return len(rc.delivered()) == window-2 && s.spool.aheadCount() == window-2
	})
	if n := arrived.Load(); n != int32(window-1) {
		t.Errorf("%d requests while the first event is held, want %d: the window is %d events", n, window-1, window)
	}
	if err := s.spool.saveCursor(true); err != nil {
		t.Fatal(err)
	}
	// What a crash now leaves on disk: a copy of the spool directory.
	crashed := filepath.Join(e.dir, "crashed")
	if err := os.CopyFS(crashed, os.DirFS(e.spoolDir)); err != nil {
		t.Fatal(err)
	}
	before := ids(rc.delivered())
	letGo()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	want := slices.DeleteFunc(idsOf(append([][]stream.Change{first}, rest...)...), func(id string) bool {
		return slices.Contains(before, id)
	})
	for _, dir := range []string{e.spoolDir, crashed} {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			rc2, e2 := newAnsweringEnv(t, http.StatusOK)
			e2.cfg.Webhook.Concurrency = concurrency
			e2.cfg.Webhook.Spool.Directory = dir
			s2 := e2.start()
			waitFor(t, "the rest delivered", func() bool { _, n := s2.spool.size(); return n == 0 })
			got := ids(rc2.delivered())
			if !slices.Equal(slices.Sorted(slices.Values(got)), slices.Sorted(slices.Values(want))) {
				t.Errorf("after the restart, delivered %d events:\n%v\nwant exactly the %d not delivered before:\n%v", len(got), got, len(want), want)
			}
			if k := perKey(t, rc2.delivered())[held]; !slices.Equal(k, []string{events.ID(first[0]), events.ID(first[1])}) {
				t.Errorf("the held key got %v, want its two events in order", k)
			}
		})
	}
}

// idsOf returns the event ids of batches of changes, in order.
func idsOf(batches ...[]stream.Change) []string {
	var out []string
	for _, b := range batches {
		for _, c := range b {
			out = append(out, events.ID(c))
		}
	}
	return out
}

// releaseOnce returns a func that closes release the first time it is
// called; a test that fails before calling it lets the receiver go at
// cleanup.
func releaseOnce(t *testing.T, release chan struct{}) func() {
	var once sync.Once
	letGo := func() { once.Do(func() { close(release) }) }
	t.Cleanup(letGo)
	return letGo
}
