package webhook

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hubsync/hubsync/sinks"
)

// Files of the spool directory besides the segments.
const (
	cursorFile = "cursor.json"
	toldFile   = "told.json"
	lockFile   = "lock"
	segSuffix  = ".seg"
	// segDigits is the width of a segment's sequence number in its name, so
	// that names sort like numbers.
	segDigits = 20
)

// entry is one spooled event: what the sender needs to post it and to
// account for it. Body is the CloudEvent exactly as it is sent and signed.
type entry struct {
	ID        string          `json:"id"`
	Type      string          `json:"type"`
	Namespace string          `json:"namespace"`
	Cluster   string          `json:"cluster"`
	Spooled   int64           `json:"spooled"` // unix nanoseconds
	Body      json.RawMessage `json:"body"`
}

// segment is one spool file: the events of one Deliver or Resync.
type segment struct {
	seq   uint64
	size  int64
	count int
	next  int // events of it already delivered or dropped
}

// cursor is how far the head segment has been delivered.
type cursor struct {
	Segment uint64 `json:"segment"`
	Next    int    `json:"next"`
}

// spool is the sink's on-disk queue. Deliver and Resync write segments
// (one caller at a time); the sender reads and removes them.
type spool struct {
	dir string
	max int64
	log *slog.Logger
	// changed is called under mu with the spool's size after every change,
	// for the gauges.
	changed func(bytes int64, events int)

	mu      sync.Mutex
	segs    []*segment
	bytes   int64
	events  int
	nextSeq uint64
	// overflow is set while events are being dropped because the spool
	// was full (or a segment was lost): the endpoint must be resynced.
	overflow bool

	// cursor is the sender's progress, saved at most every cursorEvery
	// (and when a segment is done, and on Close): a crash repeats at most
	// the events since, with their ids, instead of one file write per
	// event.
	cursor      cursor
	cursorDirty bool
	cursorSaved time.Time

	// finished are delivered segments still on disk: they go once what
	// the endpoint was told has been saved after them (see
	// sink.saveToldIfDue).
	finished []uint64

	// Owned by the sender: the head segment's events, read once.
	headSeq uint64
	head    []entry
}

// openSpool opens or creates the spool in dir and calls replay with every
// event it still holds, oldest first. Segments left unreadable (which
// atomic writes should make impossible) are removed and set overflow, so
// the endpoint is resynced instead of silently missing them.
func openSpool(dir string, maxBytes int64, log *slog.Logger, replay func(entry)) (*spool, error) {
	s := &spool{dir: dir, max: maxBytes, log: log, changed: func(int64, int) {}}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read spool %s: %w", dir, err)
	}
	cur, err := s.readCursor()
	if err != nil {
		// Without the cursor the head segment is sent again from its
		// start: duplicates with the same ids, which receivers drop.
		log.Warn("cannot read the webhook spool's cursor; resending its first segment from the start", "err", err)
		cur = cursor{}
	}
	var seqs []uint64
	for _, e := range ents {
		name := e.Name()
		if strings.HasPrefix(name, ".") && strings.Contains(name, ".tmp-") {
			// A write interrupted by a crash: never part of the spool.
			if err := os.Remove(filepath.Join(dir, name)); err != nil {
				return nil, fmt.Errorf("remove leftover %s: %w", name, err)
			}
			continue
		}
		if seq, ok := parseSegName(name); ok {
			seqs = append(seqs, seq)
		}
	}
	slices.Sort(seqs)
	s.nextSeq = cur.Segment + 1
	for _, seq := range seqs {
		s.nextSeq = max(s.nextSeq, seq+1)
		path := s.segPath(seq)
		entries, size, err := readSegment(path)
		if seq < cur.Segment {
			// Delivered in full, but kept until what the endpoint was told
			// was saved after it: replay it into the told records.
			if err == nil {
				for _, e := range entries {
					replay(e)
				}
			}
			s.finished = append(s.finished, seq)
			continue
		}
		if err != nil {
			log.Error("unreadable webhook spool segment; removing it, and resyncing the endpoint once the spool has drained",
				"file", path, "err", err)
			if err := os.Remove(path); err != nil {
				return nil, fmt.Errorf("remove unreadable segment: %w", err)
			}
			s.overflow = true
			continue
		}
		next := 0
		if seq == cur.Segment {
			next = min(cur.Next, len(entries))
		}
		for _, e := range entries {
			replay(e)
		}
		if next == len(entries) {
			if err := os.Remove(path); err != nil {
				return nil, fmt.Errorf("remove delivered segment: %w", err)
			}
			continue
		}
		s.segs = append(s.segs, &segment{seq: seq, size: size, count: len(entries), next: next})
		s.bytes += size
		s.events += len(entries) - next
	}
	return s, nil
}

func (s *spool) segPath(seq uint64) string {
	return filepath.Join(s.dir, fmt.Sprintf("%0*d%s", segDigits, seq, segSuffix))
}

func parseSegName(name string) (uint64, bool) {
	num, ok := strings.CutSuffix(name, segSuffix)
	if !ok || len(num) != segDigits {
		return 0, false
	}
	seq, err := strconv.ParseUint(num, 10, 64)
	return seq, err == nil
}

func (s *spool) readCursor() (cursor, error) {
	data, err := os.ReadFile(filepath.Join(s.dir, cursorFile))
	if errors.Is(err, os.ErrNotExist) {
		return cursor{}, nil
	}
	if err != nil {
		return cursor{}, fmt.Errorf("read cursor: %w", err)
	}
	var c cursor
	if err := json.Unmarshal(data, &c); err != nil {
		return cursor{}, fmt.Errorf("decode cursor: %w", err)
	}
	return c, nil
}

// readSegment returns a segment's events and its size.
func readSegment(path string) ([]entry, int64, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, 0, fmt.Errorf("read segment: %w", err)
	}
	var out []entry
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, len(data)+1)
	for line := 1; sc.Scan(); line++ {
		if len(bytes.TrimSpace(sc.Bytes())) == 0 {
			continue
		}
		var e entry
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return nil, 0, fmt.Errorf("segment %s line %d: %w", filepath.Base(path), line, err)
		}
		if e.ID == "" || len(e.Body) == 0 {
			return nil, 0, fmt.Errorf("segment %s line %d: event without id or body", filepath.Base(path), line)
		}
		out = append(out, e)
	}
	if err := sc.Err(); err != nil {
		return nil, 0, fmt.Errorf("segment %s: %w", filepath.Base(path), err)
	}
	if len(out) == 0 {
		return nil, 0, fmt.Errorf("segment %s is empty", filepath.Base(path))
	}
	return out, int64(len(data)), nil
}

// write puts entries into a new segment file, synced, unless the spool is
// full: then nothing is written, dropped is true, and first says whether
// this starts an overflow episode. Once an episode started, every write is
// dropped until the spool has drained, except a resync's, which stands for
// everything dropped before it. A resync into an empty spool is written
// even if it alone exceeds the bound: refusing it would only ask for the
// same resync again. The segment is not sent before publish.
func (s *spool) write(entries []entry, resync bool) (seg *segment, dropped, first bool, err error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	// The body must stay byte for byte what bus.Encode made.
	enc.SetEscapeHTML(false)
	for _, e := range entries {
		if err := enc.Encode(e); err != nil {
			return nil, false, false, fmt.Errorf("encode spool entry %s: %w", e.ID, err)
		}
	}
	size := int64(buf.Len())

	s.mu.Lock()
	fits := s.bytes+size <= s.max
	if (s.overflow && !resync) || (!fits && !(resync && len(s.segs) == 0)) {
		first = !s.overflow
		s.overflow = true
		s.mu.Unlock()
		return nil, true, first, nil
	}
	seq := s.nextSeq
	s.nextSeq++
	s.mu.Unlock()
	if !fits {
		s.log.Warn("a resync of the webhook endpoint exceeds the spool's maxBytes; spooling it anyway, but raise maxBytes",
			"maxBytes", s.max, "resyncBytes", size)
	}

	if err := sinks.WriteFileDurable(s.segPath(seq), buf.Bytes()); err != nil {
		return nil, false, false, fmt.Errorf("write spool segment: %w", err)
	}
	return &segment{seq: seq, size: size, count: len(entries)}, false, false, nil
}

// publish hands a written segment to the sender. A resync's segment ends
// an overflow episode.
func (s *spool) publish(seg *segment, resync bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.segs = append(s.segs, seg)
	s.bytes += seg.size
	s.events += seg.count
	if resync {
		s.overflow = false
	}
	s.changed(s.bytes, s.events)
}

// discard removes a segment written but not published.
func (s *spool) discard(seg *segment) error {
	if err := os.Remove(s.segPath(seg.seq)); err != nil {
		return fmt.Errorf("remove unpublished segment: %w", err)
	}
	return nil
}

// syncDir makes the renames and removals in the directory durable.
func (s *spool) syncDir() error {
	d, err := os.Open(s.dir)
	if err != nil {
		return fmt.Errorf("open spool directory: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync spool directory %s: %w", s.dir, err)
	}
	return nil
}

// peek returns the next event to send; ok is false when the spool is
// empty. Only the sender calls it.
func (s *spool) peek() (e entry, ok bool, err error) {
	s.mu.Lock()
	if len(s.segs) == 0 {
		s.mu.Unlock()
		return entry{}, false, nil
	}
	seg := s.segs[0]
	seq, next, count := seg.seq, seg.next, seg.count
	s.mu.Unlock()
	if s.head == nil || s.headSeq != seq {
		entries, _, err := readSegment(s.segPath(seq))
		if err != nil {
			return entry{}, false, err
		}
		if len(entries) != count {
			return entry{}, false, fmt.Errorf("segment %d holds %d events, %d were written", seq, len(entries), count)
		}
		s.head, s.headSeq = entries, seq
	}
	return s.head[next], true, nil
}

// commit removes the event peek returned: it was delivered, or dropped.
// Only the sender calls it. An error (the cursor or the segment's removal
// did not reach the disk) means the event may be sent again after a
// restart, with the same id.
func (s *spool) commit() error {
	s.mu.Lock()
	seg := s.segs[0]
	seg.next++
	s.events--
	done := seg.next >= seg.count
	s.cursor = cursor{Segment: seg.seq, Next: seg.next}
	if done {
		s.segs = s.segs[1:]
		s.bytes -= seg.size
		s.finished = append(s.finished, seg.seq)
		// Every segment below the next one is delivered.
		s.cursor = cursor{Segment: seg.seq + 1}
	}
	s.cursorDirty = true
	s.changed(s.bytes, s.events)
	s.mu.Unlock()
	if done {
		s.head = nil
	}
	return s.saveCursor(done)
}

// cursorEvery bounds how often the cursor is saved while a segment is
// being sent.
const cursorEvery = 100 * time.Millisecond

// saveCursor writes the cursor if it changed and force is set or the last
// write is cursorEvery old. It is not synced: a cursor that does not
// survive a crash only makes events go again, with the same ids.
func (s *spool) saveCursor(force bool) error {
	s.mu.Lock()
	if !s.cursorDirty || (!force && time.Since(s.cursorSaved) < cursorEvery) {
		s.mu.Unlock()
		return nil
	}
	c := s.cursor
	s.cursorDirty = false
	s.cursorSaved = time.Now()
	s.mu.Unlock()
	data, err := json.Marshal(c)
	if err != nil {
		return fmt.Errorf("encode cursor: %w", err)
	}
	if err := sinks.WriteFileAtomic(filepath.Join(s.dir, cursorFile), data); err != nil {
		return fmt.Errorf("save cursor: %w", err)
	}
	return nil
}

// finishedSegments returns the delivered segments still on disk.
func (s *spool) finishedSegments() []uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.finished)
}

// removeFinished deletes delivered segments.
func (s *spool) removeFinished(seqs []uint64) error {
	var errs []error
	for _, seq := range seqs {
		if err := os.Remove(s.segPath(seq)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove delivered segment: %w", err))
		}
	}
	s.mu.Lock()
	s.finished = slices.DeleteFunc(s.finished, func(q uint64) bool { return slices.Contains(seqs, q) })
	s.mu.Unlock()
	return errors.Join(errs...)
}

// dropHead removes the head segment, which cannot be read, and sets
// overflow so that the endpoint is resynced. It returns the events lost.
func (s *spool) dropHead() (int, error) {
	s.mu.Lock()
	seg := s.segs[0]
	s.segs = s.segs[1:]
	s.bytes -= seg.size
	lost := seg.count - seg.next
	s.events -= lost
	s.overflow = true
	s.changed(s.bytes, s.events)
	s.mu.Unlock()
	s.head = nil
	if err := os.Remove(s.segPath(seg.seq)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return lost, fmt.Errorf("remove unreadable segment: %w", err)
	}
	return lost, nil
}

// dropAll empties the spool (the endpoint is gone). It returns the events
// dropped.
func (s *spool) dropAll() (int, error) {
	s.mu.Lock()
	segs := s.segs
	n := s.events
	s.segs, s.bytes, s.events = nil, 0, 0
	s.changed(s.bytes, s.events)
	s.mu.Unlock()
	s.head = nil
	var errs []error
	for _, seg := range segs {
		if err := os.Remove(s.segPath(seg.seq)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return n, fmt.Errorf("empty spool: %w", err)
	}
	return n, nil
}

// endOverflow reports whether an overflow episode just ended: the spool
// has drained since events were dropped. It clears the episode.
func (s *spool) endOverflow() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.overflow && len(s.segs) == 0 {
		s.overflow = false
		return true
	}
	return false
}

// size returns the spool's bytes and events.
func (s *spool) size() (int64, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.bytes, s.events
}

// resynced ends an overflow episode: a resync that spooled nothing (the
// current state is empty and nothing was told) stands for what was dropped.
func (s *spool) resynced() {
	s.mu.Lock()
	s.overflow = false
	s.mu.Unlock()
}
