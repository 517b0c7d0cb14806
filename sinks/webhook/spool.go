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
	next  int // events of it already delivered or dropped
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
	// (and when a segment is done, and on Close): a crash repeats at most
	// the events since, with their ids, instead of one file write per
	// event.
	cursor      cursor
	cursorDirty bool
	cursorSaved time.Time
	// cursorF is the cursor file, kept open; only the sender (and Close,
	// after it) writes it.
	cursorF *os.File

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

	// Owned by the sender: the head segment's events, read once.
	headSeq uint64
	head    []entry
}

// openSpool opens or creates the spool in dir and calls replay with every
// event it still holds, oldest first. Segments left unreadable (which
// atomic writes should make impossible) are removed and set overflow, so
// the endpoint is resynced instead of silently missing them.
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
	for _, seq := range seqs {
		s.nextSeq = max(s.nextSeq, seq+1)
		path := s.segPath(seq)
		entries, size, torn, err := readSegment(path)
		if torn && seq >= cur.Segment {
			log.Error("webhook spool segment cut short by a crash of the machine; its last events are lost, so the endpoint is resynced once the spool has drained",
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
		s.segs = append(s.segs, &segment{seq: seq, size: size, count: len(entries), next: next, marks: marksOf(entries)})
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
		s.popDrained()
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

// peek returns the next event to send; ok is false when the spool is
// empty. Only the sender calls it.
func (s *spool) peek() (e entry, ok bool, err error) {
	s.mu.Lock()
	if len(s.segs) == 0 {
		s.mu.Unlock()
		return entry{}, false, nil
	}
	seg := s.segs[0]
	seq, next, count, mem := seg.seq, seg.next, seg.count, seg.entries
	s.mu.Unlock()
	if next >= count {
		// The open tail, sent as far as it goes.
		return entry{}, false, nil
	}
	if mem != nil {
		return mem[next], true, nil
	}
	if s.head == nil || s.headSeq != seq {
		entries, _, _, err := readSegment(s.segPath(seq))
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
	if seg.entries != nil {
		n := seg.entries[seg.next].line
		seg.sent += n
		s.bytes -= n
	}
	seg.next++
	s.events--
	s.cursor = cursor{Segment: seg.seq, Next: seg.next}
	s.cursorDirty = true
	s.popDrained()
	s.changed(s.bytes, s.events)
	s.mu.Unlock()
	// Not forced when a segment is done: with small batches that was a
	// file write every few events. A cursor behind only repeats events,
	// with their ids.
	return s.saveCursor(false)
}

// popDrained moves the head segment to finished once it is sent in full
// and no longer the tail; s.mu is held.
func (s *spool) popDrained() {
	for len(s.segs) > 0 {
		seg := s.segs[0]
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
	// Rewritten in place, padded to a fixed size so the file never holds
	// the end of a longer old cursor: one write to an open file rather
	// than a new file each time (creating a file is the costly part). A
	// write torn by a crash of the machine makes the cursor unreadable,
	// and the head segment is then sent again from its start.
	if len(data) < cursorSize-1 {
		data = append(data, bytes.Repeat([]byte{' '}, cursorSize-1-len(data))...)
	}
	data = append(data, '\n')
	if s.cursorF == nil {
		if s.cursorF, err = os.OpenFile(filepath.Join(s.dir, cursorFile), os.O_RDWR|os.O_CREATE, 0o600); err != nil {
			return fmt.Errorf("save cursor: %w", err)
		}
	}
	if _, err := s.cursorF.WriteAt(data, 0); err != nil {
		return fmt.Errorf("save cursor: %w", err)
	}
	return nil
}

// cursorSize is the size of the cursor file: more than its longest JSON.
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

// dropHead removes the head segment, which cannot be read, and sets
// overflow so that the endpoint is resynced. It returns the events lost.
func (s *spool) dropHead() (int, error) {
	s.mu.Lock()
	seg := s.segs[0]
	s.segs = s.segs[1:]
	s.bytes -= seg.size - seg.sent
	s.forget(seg)
	tail := s.detachTail(seg)
	lost := seg.count - seg.next
	s.events -= lost
	s.overflow = true
	s.changed(s.bytes, s.events)
	s.mu.Unlock()
	s.head = nil
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
	s.segs, s.bytes, s.events, s.memBytes = nil, 0, 0, 0
	s.changed(s.bytes, s.events)
	s.mu.Unlock()
	s.head = nil
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
