package webhook

import (
	"bufio"
	"bytes"
	"cmp"
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
	// line is the size of the entry's line in its segment, while the
	// entry is kept in memory.
	line int64
}

// segment is one spool file: the events of one or more Deliver or Resync
// calls, appended in order.
type segment struct {
	seq   uint64
	size  int64
	count int
	// next is the segment's first event not delivered yet, while it is the
	// head: every event before it is delivered or dropped.
	next int
	// acked are the events past next already delivered: the sender has
	// several in flight, and an event of one (namespace, cluster) may be
	// taken before an earlier one of another. next moves over them once
	// the events before them are delivered too.
	acked map[int]struct{}
	// entries are the segment's events while they are kept in memory
	// (see memMax); nil: read them from the file.
	entries []entry
	// open is set while the segment is the tail that batches are appended
	// to: it is not done when the sender has sent what it holds so far.
	open bool
	// sent is the bytes of the events sent from a segment kept in memory:
	// they no longer count against the spool's bound, although they stay
	// on disk until the segment is closed (at most rollBytes).
	sent int64
	// marks say when each of the segment's events was spooled, for the age
	// of the oldest one not delivered yet, even when the events are only
	// on disk.
	marks []mark
}

// mark is where a run of a segment's events spooled at the same time ends
// (all events of one write are): the index one past its last event.
type mark struct {
	end     int
	spooled int64 // unix nanoseconds
}

// addMark records that the events up to end were spooled at spooled.
func addMark(ms []mark, end int, spooled int64) []mark {
	if n := len(ms); n > 0 && ms[n-1].spooled == spooled {
		ms[n-1].end = end
		return ms
	}
	return append(ms, mark{end: end, spooled: spooled})
}

// marksOf returns the marks of a segment's events.
func marksOf(entries []entry) []mark {
	var ms []mark
	for i, e := range entries {
		ms = addMark(ms, i+1, e.Spooled)
	}
	return ms
}

// defaultMemMax bounds the bytes of segments whose events are also kept
// in memory, so the sender posts them without reading them back; beyond
// it (a long outage of the endpoint) they are read from their files.
const defaultMemMax = 8 << 20

// defaultRollBytes is the size past which the tail segment takes no more
// appends and the next batch starts a new one. Creating a file costs far
// more than appending to an open one, so the spool does it once per
// megabyte of events, not once per batch.
const defaultRollBytes = 1 << 20

// cursor is how far the spool has been delivered: every event before
// Next of Segment, and the events of Acked, each a segment and an index,
// delivered out of order beyond it.
type cursor struct {
	Segment uint64      `json:"segment"`
	Next    int         `json:"next"`
	Acked   [][2]uint64 `json:"acked,omitempty"`
}

// pos is where an event is in the spool: its segment and its index there.
type pos struct {
	seg uint64
	idx int
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

	// wmu is held from write to publish, so the sender never closes the
	// tail while a batch is being appended to it (closeIdleTail).
	wmu sync.Mutex

	mu      sync.Mutex
	segs    []*segment
	bytes   int64
	events  int
	nextSeq uint64
	// overflow is set while events are being dropped because the spool
	// was full (or a segment was lost): the endpoint must be resynced.
	overflow bool

	// cursor is the sender's progress, saved at most every cursorEvery
	// (and on Close): a crash repeats at most the events since, with their
	// ids, instead of one file write per event. Its Segment and Next say
	// where the spool starts once every segment has drained; while one is
	// left, the head segment says it (see cursorNow).
	cursor      cursor
	cursorDirty bool
	cursorSaved time.Time
	// cursorF is the cursor file, kept open; only the sender (and Close,
	// after it) writes it. cursorLen is the size written last: a shorter
	// cursor is padded to it, so no end of a longer one is left behind.
	cursorF   *os.File
	cursorLen int
	// ahead counts the events delivered beyond the head's next (the
	// segments' acked); the sender bounds it with those it has taken.
	ahead int
	// scan is where the sender takes the next event from (see take).
	scan pos

	// finished are delivered segments still on disk: they go once what
	// the endpoint was told has been saved after them (see
	// sink.saveToldIfDue).
	finished []uint64

	// memBytes is the size of the segments whose entries are in memory,
	// at most memMax; rollBytes bounds the tail (see the defaults).
	memBytes, memMax, rollBytes int64
	// tailSeg is the open tail segment, tail its file, open for appending;
	// both nil when there is none. Only the writer (Deliver and Resync,
	// one at a time) opens, appends to and closes the tail; tailSeg is
	// read and cleared under mu.
	tailSeg *segment
	tail    *os.File

	// Owned by the sender: the events of the segment being taken from,
	// read once from its file.
	scanSeq     uint64
	scanEntries []entry
}

// openSpool opens or creates the spool in dir and calls replay with every
// event it still holds, oldest first. Segments left unreadable (which
// atomic writes should make impossible) are removed and set overflow, so
// the endpoint is resynced instead of silently missing them. Events the
// cursor says were delivered out of order are not sent again.
func openSpool(dir string, maxBytes int64, log *slog.Logger, replay func(entry)) (*spool, error) {
	s := &spool{dir: dir, max: maxBytes, log: log, changed: func(int64, int) {}, memMax: defaultMemMax, rollBytes: defaultRollBytes}
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
	for _, a := range cur.Acked {
		// A segment the cursor names is never made again, even if it is
		// gone: its events would count as delivered.
		s.nextSeq = max(s.nextSeq, a[0]+1)
	}
	s.cursor = cursor{Segment: cur.Segment, Next: cur.Next}
	for _, seq := range seqs {
		s.nextSeq = max(s.nextSeq, seq+1)
		if err := s.loadSegment(seq, cur, replay); err != nil {
			return nil, err
		}
	}
	s.advance()
	return s, nil
}

// loadSegment adds segment seq, found on disk, to the spool being opened
// with cursor cur, and replays its events.
func (s *spool) loadSegment(seq uint64, cur cursor, replay func(entry)) error {
	path := s.segPath(seq)
	entries, size, torn, err := readSegment(path)
	if torn && seq >= cur.Segment {
		s.log.Error("webhook spool segment cut short by a crash of the machine; its last events are lost, so the endpoint is resynced once the spool has drained",
			"file", path)
		s.overflow = true
	}
	if seq < cur.Segment {
		// Delivered in full, but kept until what the endpoint was told
		// was saved after it: replay it into the told records.
		if err == nil {
			for _, e := range entries {
				replay(e)
			}
		}
		s.finished = append(s.finished, seq)
		return nil
	}
	if err != nil {
		s.log.Error("unreadable webhook spool segment; removing it, and resyncing the endpoint once the spool has drained",
			"file", path, "err", err)
		if err := os.Remove(path); err != nil {
			return fmt.Errorf("remove unreadable segment: %w", err)
		}
		s.overflow = true
		return nil
	}
	for _, e := range entries {
		replay(e)
	}
	seg := &segment{seq: seq, size: size, count: len(entries), marks: marksOf(entries)}
	if seq == cur.Segment {
		seg.next = min(cur.Next, len(entries))
	}
	for _, a := range cur.Acked {
		if idx := int(a[1]); a[0] == seq && idx >= seg.next && idx < seg.count {
			if seg.acked == nil {
				seg.acked = map[int]struct{}{}
			}
			seg.acked[idx] = struct{}{}
		}
	}
	if seg.next+len(seg.acked) == seg.count {
		if err := os.Remove(path); err != nil {
			return fmt.Errorf("remove delivered segment: %w", err)
		}
		return nil
	}
	s.segs = append(s.segs, seg)
	s.bytes += size
	s.events += seg.count - seg.next - len(seg.acked)
	s.ahead += len(seg.acked)
	return nil
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
func readSegment(path string) (out []entry, size int64, torn bool, err error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, 0, false, fmt.Errorf("read segment: %w", err)
	}
	// Appends are whole lines, so only a crash of the machine leaves a
	// last line without its newline: those events are lost (the caller
	// resyncs the endpoint), the rest of the segment is good.
	whole := data
	if i := bytes.LastIndexByte(data, '\n'); i+1 < len(data) {
		whole, torn = data[:i+1], true
	}
	sc := bufio.NewScanner(bytes.NewReader(whole))
	sc.Buffer(nil, len(whole)+1)
	for line := 1; sc.Scan(); line++ {
		if len(bytes.TrimSpace(sc.Bytes())) == 0 {
			continue
		}
		var e entry
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return nil, 0, false, fmt.Errorf("segment %s line %d: %w", filepath.Base(path), line, err)
		}
		if e.ID == "" || len(e.Body) == 0 {
			return nil, 0, false, fmt.Errorf("segment %s line %d: event without id or body", filepath.Base(path), line)
		}
		out = append(out, e)
	}
	if err := sc.Err(); err != nil {
		return nil, 0, false, fmt.Errorf("segment %s: %w", filepath.Base(path), err)
	}
	return out, int64(len(data)), torn, nil
}

// appended is what write put on disk: a new segment, or more events at
// the end of the tail segment. publish hands it to the sender.
type appended struct {
	seg     *segment
	isNew   bool
	size    int64
	count   int
	spooled int64   // when its events were spooled, unix nanoseconds
	entries []entry // nil unless kept in memory
}

// write appends entries to the tail segment, or starts a new segment,
// unless the spool is full: then nothing is written, dropped is true, and
// first says whether this starts an overflow episode. Once an episode
// started, every write is dropped until the spool has drained, except a
// resync's, which stands for everything dropped before it. A resync into
// an empty spool is written even if it alone exceeds the bound: refusing
// it would only ask for the same resync again. Nothing written is sent
// before publish.
//
// Writes are appends of whole JSON lines, not synced: a restart of hubsync
// loses nothing, and a crash of the machine at worst tears the last line of
// the tail, which openSpool drops (see the package doc).
//
// A write that returns an appended must be followed by publish.
func (s *spool) write(entries []entry, resync bool) (app *appended, dropped, first bool, err error) {
	s.wmu.Lock()
	defer func() {
		if app == nil {
			s.wmu.Unlock()
		}
	}()
	data, err := encodeEntries(entries)
	if err != nil {
		return nil, false, false, err
	}
	size := int64(len(data))

	s.mu.Lock()
	fits := s.bytes+size <= s.max
	if (s.overflow && !resync) || (!fits && !(resync && len(s.segs) == 0)) {
		first = !s.overflow
		s.overflow = true
		s.mu.Unlock()
		return nil, true, first, nil
	}
	inMem := s.memBytes+size <= s.memMax
	tail, tailFile := s.tailSeg, s.tail
	appendable := tail != nil && tailFile != nil && inMem && tail.size+size <= s.rollBytes
	var seq uint64
	if !appendable {
		seq = s.nextSeq
		s.nextSeq++
	}
	s.mu.Unlock()
	if !fits {
		s.log.Warn("a resync of the webhook endpoint exceeds the spool's maxBytes; spooling it anyway, but raise maxBytes",
			"maxBytes", s.max, "resyncBytes", size)
	}
	app = &appended{size: size, count: len(entries), spooled: entries[0].Spooled}
	if inMem {
		app.entries = entries
	}
	if appendable {
		if _, err := tailFile.Write(data); err != nil {
			// Part of the batch may be on disk: the segment takes no more,
			// and the batch comes again (its events may then be sent twice
			// after a restart, with their ids).
			s.closeTail()
			return nil, false, false, fmt.Errorf("append to spool segment: %w", err)
		}
		app.seg = tail
		return app, false, false, nil
	}
	s.closeTail()
	if err := s.createSegment(seq, data, inMem); err != nil {
		return nil, false, false, err
	}
	app.seg, app.isNew = &segment{seq: seq}, true
	return app, false, false, nil
}

// encodeEntries encodes entries as the lines of a segment, recording each
// entry's line size.
func encodeEntries(entries []entry) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	// The body must stay byte for byte what events.Encode made.
	enc.SetEscapeHTML(false)
	for i, e := range entries {
		before := buf.Len()
		if err := enc.Encode(e); err != nil {
			return nil, fmt.Errorf("encode spool entry %s: %w", e.ID, err)
		}
		entries[i].line = int64(buf.Len() - before)
	}
	return buf.Bytes(), nil
}

// createSegment writes a new segment seq holding data. If its events are
// kept in memory it becomes the tail, which later batches are appended
// to; a segment whose events are not in memory is never appended to, so
// the sender's copy read from its file stays whole.
func (s *spool) createSegment(seq uint64, data []byte, tail bool) error {
	path := s.segPath(seq)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("create spool segment: %w", err)
	}
	if _, err := f.Write(data); err != nil {
		_ = f.Close()
		_ = os.Remove(path)
		return fmt.Errorf("write spool segment: %w", err)
	}
	if tail {
		s.mu.Lock()
		s.tail = f
		s.mu.Unlock()
		return nil
	}
	if err := f.Close(); err != nil {
		_ = os.Remove(path)
		return fmt.Errorf("write spool segment: %w", err)
	}
	return nil
}

// closeTail ends appends to the tail segment: it is done once sent.
func (s *spool) closeTail() {
	s.mu.Lock()
	if s.tailSeg != nil {
		s.tailSeg.open = false
		s.tailSeg = nil
		s.advance()
	}
	f := s.tail
	s.tail = nil
	s.mu.Unlock()
	if f != nil {
		if err := f.Close(); err != nil {
			s.log.Warn("cannot close a webhook spool segment", "err", err)
		}
	}
}

// hasTail reports whether a tail segment is open.
func (s *spool) hasTail() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tailSeg != nil
}

// closeIdleTail closes the tail segment if everything in it has been sent
// and no batch is being appended, so that it can be removed. The sender
// calls it once the spool has been idle a while: closing the tail as soon
// as it is drained would cost a new file for nearly every batch.
func (s *spool) closeIdleTail() {
	if !s.wmu.TryLock() {
		return
	}
	defer s.wmu.Unlock()
	s.mu.Lock()
	drained := s.tailSeg != nil && s.tailSeg.next >= s.tailSeg.count
	s.mu.Unlock()
	if drained {
		s.closeTail()
	}
}

// publish hands what write put on disk to the sender. A resync's batch
// ends an overflow episode.
func (s *spool) publish(app *appended, resync bool) {
	defer s.wmu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	seg := app.seg
	switch {
	case app.isNew:
		seg.size, seg.count = app.size, app.count
		seg.marks = addMark(nil, seg.count, app.spooled)
		if app.entries != nil {
			seg.entries, seg.open = app.entries, true
			s.memBytes += app.size
			s.tailSeg = seg
		}
		s.segs = append(s.segs, seg)
	case seg != s.tailSeg:
		// Dropped meanwhile with everything spooled (410 Gone).
		return
	default:
		seg.size += app.size
		seg.count += app.count
		seg.marks = addMark(seg.marks, seg.count, app.spooled)
		seg.entries = append(seg.entries, app.entries...)
		s.memBytes += app.size
	}
	s.bytes += app.size
	s.events += app.count
	if resync {
		s.overflow = false
	}
	s.changed(s.bytes, s.events)
}

// take returns the next event to send: the first one after those taken
// before that is not delivered yet, in spool order. ok is false when there
// is none for now. Only the sender calls it; it hands each event out once
// (until the spool is opened again).
func (s *spool) take() (e entry, at pos, ok bool, err error) {
	for {
		s.mu.Lock()
		seg := s.segmentFrom(s.scan.seg)
		if seg == nil {
			s.mu.Unlock()
			return entry{}, pos{}, false, nil
		}
		idx := 0
		if seg.seq == s.scan.seg {
			idx = s.scan.idx
		}
		idx = max(idx, seg.next)
		for _, done := seg.acked[idx]; done && idx < seg.count; _, done = seg.acked[idx] {
			idx++
		}
		if idx >= seg.count {
			// Taken in full: the open tail waits for more, any other
			// segment gives way to the next.
			open := seg.open
			s.scan = pos{seg.seq, idx}
			if !open {
				s.scan = pos{seg.seq + 1, 0}
			}
			s.mu.Unlock()
			if open {
				return entry{}, pos{}, false, nil
			}
			continue
		}
		seq, count, mem := seg.seq, seg.count, seg.entries
		s.mu.Unlock()
		if mem == nil {
			if mem, err = s.readScan(seq, count); err != nil {
				return entry{}, pos{seg: seq}, false, err
			}
		}
		s.mu.Lock()
		s.scan = pos{seq, idx + 1}
		s.mu.Unlock()
		return mem[idx], pos{seq, idx}, true, nil
	}
}

// segmentFrom returns the first segment numbered seq or later; s.mu is
// held.
func (s *spool) segmentFrom(seq uint64) *segment {
	for _, seg := range s.segs {
		if seg.seq >= seq {
			return seg
		}
	}
	return nil
}

// readScan returns the events of segment seq, which are not kept in
// memory, reading its file once.
func (s *spool) readScan(seq uint64, count int) ([]entry, error) {
	if s.scanEntries != nil && s.scanSeq == seq {
		return s.scanEntries, nil
	}
	entries, _, _, err := readSegment(s.segPath(seq))
	if err != nil {
		return nil, err
	}
	if len(entries) != count {
		return nil, fmt.Errorf("segment %d holds %d events, %d were written", seq, len(entries), count)
	}
	s.scanEntries, s.scanSeq = entries, seq
	return entries, nil
}

// ack removes the event at: it was delivered, or dropped. Events may be
// acknowledged in any order: one acknowledged before an earlier one stays
// on disk, and is recorded in the cursor as delivered, until every event
// before it is acknowledged too, so an earlier event is never lost with a
// later one. Only the sender calls it. An error (the cursor or the
// segment's removal did not reach the disk) means the event may be sent
// again after a restart, with the same id.
func (s *spool) ack(at pos) error {
	s.mu.Lock()
	seg := s.segmentFrom(at.seg)
	if seg == nil || seg.seq != at.seg || at.idx < seg.next || at.idx >= seg.count {
		// Dropped meanwhile (410 Gone), or acknowledged already.
		s.mu.Unlock()
		return nil
	}
	if _, done := seg.acked[at.idx]; done {
		s.mu.Unlock()
		return nil
	}
	if seg.entries != nil {
		n := seg.entries[at.idx].line
		seg.sent += n
		s.bytes -= n
	}
	if seg.acked == nil {
		seg.acked = map[int]struct{}{}
	}
	seg.acked[at.idx] = struct{}{}
	s.ahead++
	s.events--
	s.cursorDirty = true
	s.advance()
	s.changed(s.bytes, s.events)
	s.mu.Unlock()
	// Not forced when a segment is done: with small batches that was a
	// file write every few events. A cursor behind only repeats events,
	// with their ids.
	return s.saveCursor(false)
}

// aheadCount returns how many events were delivered beyond the first one
// not delivered yet.
func (s *spool) aheadCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ahead
}

// advance moves the head segment's next over the events delivered out of
// order, and moves the head segment to finished once it is delivered in
// full and no longer the tail; s.mu is held.
func (s *spool) advance() {
	for len(s.segs) > 0 {
		seg := s.segs[0]
		for _, done := seg.acked[seg.next]; done; _, done = seg.acked[seg.next] {
			delete(seg.acked, seg.next)
			seg.next++
			s.ahead--
		}
		if seg.open || seg.next < seg.count {
			return
		}
		s.segs = s.segs[1:]
		s.bytes -= seg.size - seg.sent
		s.forget(seg)
		s.finished = append(s.finished, seg.seq)
		// Every segment below the next one is delivered.
		s.cursor = cursor{Segment: seg.seq + 1}
		s.cursorDirty = true
	}
}

// cursorNow is the cursor to save: the head segment's next and the events
// delivered beyond it; s.mu is held.
func (s *spool) cursorNow() cursor {
	if len(s.segs) == 0 {
		return cursor{Segment: s.cursor.Segment, Next: s.cursor.Next}
	}
	c := cursor{Segment: s.segs[0].seq, Next: s.segs[0].next}
	for _, seg := range s.segs {
		for idx := range seg.acked {
			c.Acked = append(c.Acked, [2]uint64{seg.seq, uint64(idx)})
		}
	}
	slices.SortFunc(c.Acked, func(a, b [2]uint64) int {
		if a[0] != b[0] {
			return cmp.Compare(a[0], b[0])
		}
		return cmp.Compare(a[1], b[1])
	})
	return c
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
	c := s.cursorNow()
	s.cursorDirty = false
	s.cursorSaved = time.Now()
	s.mu.Unlock()
	data, err := json.Marshal(c)
	if err != nil {
		return fmt.Errorf("encode cursor: %w", err)
	}
	if s.cursorF == nil {
		if s.cursorF, err = os.OpenFile(filepath.Join(s.dir, cursorFile), os.O_RDWR|os.O_CREATE, 0o600); err != nil {
			return fmt.Errorf("save cursor: %w", err)
		}
		if st, err := s.cursorF.Stat(); err == nil {
			s.cursorLen = int(st.Size())
		}
	}
	// Rewritten in place, padded with spaces to the size written before
	// (at least cursorSize) so the file never holds the end of a longer
	// old cursor: one write to an open file rather than a new file each
	// time (creating a file is the costly part). A write torn by a crash
	// of the machine makes the cursor unreadable, and the head segment is
	// then sent again from its start.
	size := max(len(data)+1, s.cursorLen, cursorSize)
	data = append(data, bytes.Repeat([]byte{' '}, size-1-len(data))...)
	data = append(data, '\n')
	if _, err := s.cursorF.WriteAt(data, 0); err != nil {
		return fmt.Errorf("save cursor: %w", err)
	}
	s.cursorLen = size
	return nil
}

// cursorSize is the least size of the cursor file: more than its longest
// JSON without events delivered out of order.
const cursorSize = 96

// detachTail makes seg, which is being dropped, no longer the tail, and
// returns the tail's file to close (outside mu) if it was; s.mu is held.
func (s *spool) detachTail(seg *segment) *os.File {
	if seg != s.tailSeg {
		return nil
	}
	seg.open = false
	f := s.tail
	s.tailSeg, s.tail = nil, nil
	return f
}

func closeFile(f *os.File) {
	if f != nil {
		_ = f.Close()
	}
}

// close ends appends to the tail and closes the cursor file; the spool
// stays on disk.
func (s *spool) close() {
	s.closeTail()
	if s.cursorF != nil {
		if err := s.cursorF.Close(); err != nil {
			s.log.Warn("cannot close the webhook spool's cursor file", "err", err)
		}
		s.cursorF = nil
	}
}

// forget drops a segment's events from memory; s.mu is held.
func (s *spool) forget(seg *segment) {
	if seg.entries != nil {
		s.memBytes -= seg.size
		seg.entries = nil
	}
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

// dropSegment removes segment seq, which cannot be read, and sets
// overflow so that the endpoint is resynced. It returns the events lost.
// None of its events was taken: take reads a segment whole.
func (s *spool) dropSegment(seq uint64) (int, error) {
	s.mu.Lock()
	i := slices.IndexFunc(s.segs, func(seg *segment) bool { return seg.seq == seq })
	if i < 0 {
		s.mu.Unlock()
		return 0, nil
	}
	seg := s.segs[i]
	s.segs = slices.Delete(s.segs, i, i+1)
	s.bytes -= seg.size - seg.sent
	s.forget(seg)
	tail := s.detachTail(seg)
	lost := seg.count - seg.next - len(seg.acked)
	s.events -= lost
	s.ahead -= len(seg.acked)
	s.overflow = true
	s.cursorDirty = true
	// The next segment may have been delivered in full already.
	s.advance()
	s.changed(s.bytes, s.events)
	s.mu.Unlock()
	s.scanEntries = nil
	closeFile(tail)
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
	var tail *os.File
	for _, seg := range segs {
		if f := s.detachTail(seg); f != nil {
			tail = f
		}
	}
	s.segs, s.bytes, s.events, s.memBytes, s.ahead = nil, 0, 0, 0, 0
	s.cursorDirty = true
	s.changed(s.bytes, s.events)
	s.mu.Unlock()
	s.scanEntries = nil
	closeFile(tail)
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
	if s.overflow && s.events == 0 {
		s.overflow = false
		return true
	}
	return false
}

// oldest returns when the oldest event not delivered yet was spooled;
// zero when there is none.
func (s *spool) oldest() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, seg := range s.segs {
		if seg.next >= seg.count {
			continue // the open tail, sent as far as it goes
		}
		for _, m := range seg.marks {
			if m.end > seg.next {
				return time.Unix(0, m.spooled)
			}
		}
	}
	return time.Time{}
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
