package ingestlog

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/edgedio/edged/internal/fsutil"
)

// Log is a durable, append-only log of MQTT messages in a directory of
// segment files. Append, Truncate, Reader and Stats are safe for
// concurrent use; each Reader belongs to one goroutine.
type Log struct {
	dir      string
	opts     Options
	logger   *slog.Logger
	lockFile *os.File      // holds the directory's flock until Close
	id       string        // the log's identity (ID); "" when unknown
	maxFrame int64         // largest frame Append accepts
	ready    chan struct{} // closed at Open: "look now"
	bufs     sync.Pool     // *[]byte frame buffers for Append

	first    atomic.Uint64 // base of the oldest segment; written under mu, read by Readers without it
	isClosed atomic.Bool   // set by Close; read by Readers without mu
	durableA atomic.Uint64 // mirrors durable, for DurableOffset

	truncMu sync.Mutex // serialises Truncate, so no segment it reads is deleted under it

	cpMu         sync.Mutex // guards checkpointed and writes of its file
	checkpointed uint64     // the offset SetCheckpointed last recorded

	mu         sync.Mutex // guards every field below and the mutable fields of each segment
	segs       []*segment // ascending base, contiguous; the last is active
	next       uint64     // offset the next record gets
	durable    uint64     // records below it are fsynced and visible to Readers
	marked     uint64     // the last commit mark written: recovery can prove the records below it were acknowledged
	released   uint64     // Truncate released the records below it
	unreleased int64      // bytes of the records at or after released: what MaxBytes bounds
	diskBytes  int64      // bytes of the segment files
	syncing    bool       // an Append is the group commit leader (or Close owns the files)
	lastSync   time.Time  // when the leader's last fsync started
	// pend holds the frames of the records after those written to the
	// active segment's file, in offset order: they have their offsets
	// but are not on disk yet. The group commit leader writes them with
	// one write before its fsync (see lead). They start at byte pendPos
	// of the active segment, whose size counts them.
	pend    []byte
	pendPos int64
	spare   []byte // a written pend kept for reuse, or nil
	// unwritten holds the batches a group commit could not write for
	// want of space (see noSpace), in offset order, each with its byte
	// position in the active segment: the next group commit writes them
	// again, before pend. They have their offsets and no Append returned
	// for them, so writing the same bytes at the same place once there
	// is room loses and repeats nothing.
	unwritten []chunk
	// noSpace is the error of the last write that failed for want of
	// space (ENOSPC, EDQUOT), while records wait in unwritten or pend
	// for a write that succeeds; nil otherwise. It does not fail the
	// log: the records wait (back-pressure), and the group commit tries
	// again every noSpaceRetry.
	noSpace      error
	noSpaceSince time.Time
	noSpaceRetry time.Duration
	// syncFile fsyncs a segment file: (*os.File).Sync; tests replace it
	// to see what is on disk when an fsync starts.
	syncFile func(*os.File) error
	// writeFile writes to a segment file: (*os.File).WriteAt; tests
	// replace it to make writes fail.
	writeFile func(f *os.File, b []byte, pos int64) (int, error)
	advanced  chan struct{}
	space     chan struct{}
	waiting   int   // Appends blocked for space now
	shed      bool  // a full log refuses appends at once (ShedWhenFull)
	shedding  bool  // the log shed its last append: the next one stored says so
	closed    bool  // Close was called
	failed    error // sticky write or fsync failure, wrapping ErrFailed
	stats     Stats // counters; offsets and sizes are filled in by Stats
}

// NoSpaceRetry is how long a group commit whose write found no space on
// the device (ENOSPC, EDQUOT) waits before it tries again. Meanwhile the
// records wait in memory and their Appends with them: back-pressure, as
// for a full log.
const NoSpaceRetry = 100 * time.Millisecond

// chunk is a batch of frames and its byte position in the active
// segment.
type chunk struct {
	b   []byte
	pos int64
}

// Open opens the log in dir, creating dir and the first segment if needed,
// and recovers it: every segment is read and every record checked. In the
// last segment, the first damaged record and everything after it (zeros,
// garbage, partial or whole records, in any order: what a power loss
// leaves of writes that were never fsynced) are a torn tail, cut off and
// logged with the number of bytes dropped, unless a later record's commit
// mark proves the damaged one was acknowledged (see the package doc).
// Damage to acknowledged records, or anywhere in an earlier segment, is an
// error wrapping ErrCorrupt (a *CorruptError naming the segment and
// offset), ErrBadMagic, ErrVersion or ErrChecksum. The directory is locked
// against a second Log until Close. logger may be nil.
func Open(dir string, opts Options, logger *slog.Logger) (*Log, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("ingestlog: %w", err)
	}
	lockFile, err := lockDir(dir)
	if err != nil {
		return nil, err
	}
	l := &Log{
		dir:          dir,
		opts:         opts,
		logger:       logger,
		lockFile:     lockFile,
		id:           loadID(dir, logger),
		maxFrame:     opts.SegmentBytes - headerSize,
		ready:        make(chan struct{}),
		advanced:     make(chan struct{}),
		space:        make(chan struct{}),
		syncFile:     (*os.File).Sync,
		writeFile:    (*os.File).WriteAt,
		noSpaceRetry: NoSpaceRetry,
	}
	if opts.MaxBytes > 0 && opts.MaxBytes < l.maxFrame {
		l.maxFrame = opts.MaxBytes
	}
	close(l.ready)
	err = l.recover()
	if err == nil {
		err = l.checkCheckpointed()
	}
	if err != nil {
		for _, s := range l.segs {
			if s.f != nil {
				s.f.Close()
			}
		}
		lockFile.Close()
		return nil, err
	}
	return l, nil
}

// checkCheckpointed reads the offset SetCheckpointed recorded and fails
// with ErrRecordsGone when the recovered log ends before it.
func (l *Log) checkCheckpointed() error {
	off, damaged, err := readCheckpointed(l.dir)
	if err != nil {
		return err
	}
	if damaged {
		l.logger.Warn("ingest log: the checkpointed offset's file is damaged; not checked against the log's end this time",
			"dir", l.dir, "file", checkpointedFile)
	}
	if off > l.next {
		return fmt.Errorf("%w: %s: a completed checkpoint read the log up to offset %d, but it ends at offset %d: %d acknowledged records are gone (its last segment was cut or damaged); to go on without them, move the pipeline's checkpoints away (the log is then read from its first record) and remove %s",
			ErrRecordsGone, l.dir, off, l.next, off-l.next, filepath.Join(l.dir, checkpointedFile))
	}
	l.checkpointed = off
	return nil
}

// recover loads the segments of l.dir.
func (l *Log) recover() error {
	entries, err := os.ReadDir(l.dir)
	if err != nil {
		return fmt.Errorf("ingestlog: %w", err)
	}
	var bases []uint64
	for _, e := range entries {
		if base, ok := parseSegmentName(e.Name()); ok && e.Type().IsRegular() {
			bases = append(bases, base)
		}
	}
	sort.Slice(bases, func(i, j int) bool { return bases[i] < bases[j] })

	var newBase uint64 // base of the segment to create if none is left
	for i, base := range bases {
		last := i == len(bases)-1
		path := filepath.Join(l.dir, segmentName(base))
		seg, records, err := l.recoverSegment(path, base, last)
		if err != nil {
			return err
		}
		if seg == nil { // the last segment's creation was cut short
			newBase = base
			break
		}
		if len(l.segs) > 0 && base != l.next {
			return &CorruptError{Segment: path, Offset: l.next, Err: fmt.Errorf(
				"%w: segment starts at offset %d, the previous one ends at %d", ErrGap, base, l.next)}
		}
		l.segs = append(l.segs, seg)
		l.next = base + records
		l.unreleased += seg.size - headerSize
		l.diskBytes += seg.size
	}

	if len(l.segs) == 0 {
		seg, err := createSegment(l.dir, newBase)
		if err != nil {
			return err
		}
		l.segs = append(l.segs, seg)
		l.next = newBase
		l.diskBytes += seg.size
	}
	active := l.segs[len(l.segs)-1]
	if active.f == nil {
		f, err := os.OpenFile(active.path, os.O_RDWR, 0)
		if err != nil {
			return fmt.Errorf("ingestlog: %w", err)
		}
		active.f = f
	}
	active.sealed = false
	l.pendPos = active.size
	// A crashed process may have left written but unsynced records in the
	// page cache; recovery counts them, so make them durable first.
	if err := active.f.Sync(); err != nil {
		return fmt.Errorf("ingestlog: fsync %s: %w", active.path, err)
	}
	if err := syncDir(l.dir); err != nil {
		return err
	}
	l.setDurable(l.next)
	l.released = l.segs[0].base
	l.first.Store(l.segs[0].base)
	l.logger.Info("ingest log opened", "dir", l.dir, "segments", len(l.segs),
		"first_offset", l.segs[0].base, "next_offset", l.next, "bytes", l.diskBytes)
	return nil
}

// recoverSegment scans one segment and cuts its torn tail. It returns nil
// (and removes the file) for a last segment whose header never made it to
// disk. The last segment is returned open for writing, with its number of
// records.
func (l *Log) recoverSegment(path string, base uint64, last bool) (*segment, uint64, error) {
	flag := os.O_RDONLY
	if last {
		flag = os.O_RDWR
	}
	f, err := os.OpenFile(path, flag, 0)
	if err != nil {
		return nil, 0, fmt.Errorf("ingestlog: %w", err)
	}
	keep := false
	defer func() {
		if !keep {
			f.Close()
		}
	}()
	fi, err := f.Stat()
	if err != nil {
		return nil, 0, fmt.Errorf("ingestlog: %w", err)
	}
	res, err := scanSegment(f, fi.Size(), path, base, last)
	if err != nil {
		return nil, 0, err
	}
	if res.tornHeader {
		f.Close()
		keep = true // closed
		if err := os.Remove(path); err != nil {
			return nil, 0, fmt.Errorf("ingestlog: remove torn segment: %w", err)
		}
		l.stats.TornBytes += fi.Size()
		l.logger.Warn("ingest log: removed a segment whose header was never written",
			"segment", path, "offset", base, "bytes_dropped", fi.Size())
		return nil, 0, nil
	}
	if res.torn != nil {
		dropped := fi.Size() - res.size
		if err := f.Truncate(res.size); err != nil {
			return nil, 0, fmt.Errorf("ingestlog: cut torn tail of %s: %w", path, err)
		}
		if err := f.Sync(); err != nil {
			return nil, 0, fmt.Errorf("ingestlog: fsync %s: %w", path, err)
		}
		l.stats.TornBytes += dropped
		l.logger.Warn("ingest log: dropped torn tail", "segment", path,
			"offset", base+res.records, "byte", res.size, "bytes_dropped", dropped, "reason", res.torn.Error())
	}
	seg := &segment{base: base, path: path, size: res.size, durableSize: res.size, index: res.index, sealed: !last}
	if last {
		seg.f = f
		keep = true
	}
	return seg, res.records, nil
}

// createSegment creates, fsyncs and links the segment file starting at
// base, open for writing.
func createSegment(dir string, base uint64) (*segment, error) {
	path := filepath.Join(dir, segmentName(base))
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return nil, fmt.Errorf("ingestlog: create segment: %w", err)
	}
	fail := func(err error) (*segment, error) {
		f.Close()
		os.Remove(path)
		return nil, fmt.Errorf("ingestlog: create segment %s: %w", path, err)
	}
	if _, err := f.Write(encodeHeader(base)); err != nil {
		return fail(err)
	}
	if err := f.Sync(); err != nil {
		return fail(err)
	}
	if err := syncDir(dir); err != nil {
		return fail(err)
	}
	return &segment{
		base:        base,
		path:        path,
		size:        headerSize,
		durableSize: headerSize,
		index:       []indexEntry{{off: base, pos: headerSize}},
		f:           f,
	}, nil
}

// Append stores m and returns its offset once it is durable: written and
// fsynced, together with every Append that arrived while the previous
// fsync ran or within Options.SyncInterval of it (group commit). Offsets
// are dense and increase in the order Appends write; a record is durable
// only once every record before it is.
//
// When the records not yet released by Truncate would exceed
// Options.MaxBytes, Append blocks until Truncate releases space, the Log
// is closed (ErrClosed) or ctx is done (ctx.Err(), wrapped); nothing is
// stored then. ctx does not interrupt the fsync wait: once the record is
// written, Append returns when it is durable or the log fails (ErrFailed),
// or, while writes find no space on the device, when ctx is done (an
// error wrapping ErrNoSpace; the record stays held, see
// WaitDurableContext).
// Appends that block are counted in Stats.
//
// Append copies m; the caller may reuse m.Payload when it returns.
func (l *Log) Append(ctx context.Context, m Message) (uint64, error) {
	if err := m.validate(); err != nil {
		return 0, err
	}
	size := frameSize(&m)
	if size > l.maxFrame {
		return 0, l.tooLarge(&m, size)
	}
	bp := l.getBuf(size + maxMarkSize)
	*bp = appendFrame((*bp)[:0], &m)
	l.mu.Lock()
	off, err := l.write(ctx, bp)
	if err == nil {
		err = l.waitDurable(ctx, off)
	}
	l.mu.Unlock()
	l.putBuf(bp)
	if err != nil {
		return 0, err
	}
	return off, nil
}

// AppendNoWait stores m like Append and returns its offset without
// waiting for the fsync: the record is durable, and visible to Readers,
// once WaitDurable(off) returns or DurableOffset passes off. A caller
// that acknowledges m must do so only then. The record is kept in memory
// with the others appended since the last group commit, in offset order,
// and the next group commit, which any WaitDurable or Append leads,
// writes them all with one write and makes them durable with one fsync
// (see Options.SyncInterval); more than pendFlushBytes of them, or a
// record that large, are written at once, still without an fsync. A
// caller that stops caring (its device disconnected) should still call
// WaitDurable, or the record waits for the next one. It blocks for space
// and fails like Append; it blocks for a group commit in progress only
// when the record starts a new segment.
func (l *Log) AppendNoWait(ctx context.Context, m Message) (uint64, error) {
	if err := m.validate(); err != nil {
		return 0, err
	}
	size := frameSize(&m)
	if size > l.maxFrame {
		return 0, l.tooLarge(&m, size)
	}
	bp := l.getBuf(size + maxMarkSize)
	*bp = appendFrame((*bp)[:0], &m)
	l.mu.Lock()
	off, err := l.write(ctx, bp)
	l.mu.Unlock()
	l.putBuf(bp)
	if err != nil {
		return 0, err
	}
	return off, nil
}

// tooLarge is the error of an append of m, size bytes framed, that can
// never fit.
func (l *Log) tooLarge(m *Message, size int64) error {
	return fmt.Errorf("%w: message on topic %q with a payload of %d bytes is %d bytes framed; a record holds at most %d (segment_bytes %d, max_bytes %d): it can never be appended",
		ErrTooLarge, m.Topic, len(m.Payload), size, l.maxFrame, l.opts.SegmentBytes, l.opts.MaxBytes)
}

// Dir returns the log's directory.
func (l *Log) Dir() string { return l.dir }

// MaxMessageBytes returns Options.MaxMessageBytes of the log's options:
// the most topic and payload bytes of a message it can always append.
func (l *Log) MaxMessageBytes() int64 { return l.opts.MaxMessageBytes() }

// WaitDurable returns once the record at off is durable (fsynced), leading
// a group commit if none is running: every record written before the
// fsync starts shares it. It fails with ErrOutOfRange for an offset not
// yet written, with the log's sticky failure (ErrFailed), or with
// ErrClosed if the log was closed before the record became durable.
func (l *Log) WaitDurable(off uint64) error {
	return l.WaitDurableContext(context.Background(), off)
}

// WaitDurableContext is WaitDurable, but gives up when ctx is done while
// the log's writes find no space on the device (see ErrNoSpace), which
// can last. Giving up fails the log (ErrFailed, wrapping ErrNoSpace and
// ctx's error): the records held then never become durable, so none of
// them is in the log after a restart although its publisher got no
// acknowledgement. A broker or subscriber that stops passes its context,
// so that it does not wait for a full card.
func (l *Log) WaitDurableContext(ctx context.Context, off uint64) error {
	if l.durableA.Load() > off {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if off >= l.next {
		return fmt.Errorf("%w: wait for offset %d, next offset is %d", ErrOutOfRange, off, l.next)
	}
	if l.closed && l.durable <= off {
		if l.failed != nil {
			return l.failed
		}
		return ErrClosed
	}
	return l.waitDurable(ctx, off)
}

// DurableOffset returns one past the last durable record, without locking:
// a record at off is durable when DurableOffset() > off.
func (l *Log) DurableOffset() uint64 { return l.durableA.Load() }

func (l *Log) getBuf(size int64) *[]byte {
	if bp, ok := l.bufs.Get().(*[]byte); ok && int64(cap(*bp)) >= size {
		return bp
	}
	b := make([]byte, 0, max(size, 256))
	return &b
}

func (l *Log) putBuf(bp *[]byte) {
	if cap(*bp) <= 64<<10 {
		l.bufs.Put(bp)
	}
}

// markFor returns the commit mark the next record written to seg must
// carry, if any: the durable offset, when it moved since the last mark.
// The first record of a segment carries none (the segments before it are
// sealed and fsynced, so there is nothing in it to vouch for), which lets
// a record that exactly fills a segment fit. l.mu is held.
func (l *Log) markFor(seg *segment) (uint64, int64, bool) {
	if seg.size > headerSize && l.durable > l.marked {
		return l.durable, markSize(l.durable), true
	}
	return 0, 0, false
}

// pendFlushBytes bounds the frames a Log holds in memory between group
// commits: when they reach it, the Append that took them there writes
// them (without an fsync), and a frame at least this large is written by
// its own Append. It keeps memory bounded by this constant rather than by
// how far appenders run ahead of the fsyncs, while the records of a
// group commit of small messages still go out in one write.
const pendFlushBytes = 256 << 10

// maxSpareBytes is the largest written pend buffer kept for reuse.
const maxSpareBytes = 2 * pendFlushBytes

// write waits for space, then adds the frame in *bp at the end of the
// active segment (rolling to a new one first if it would not fit),
// adding a commit mark if one is due, and assigns its offset. The frame
// joins l.pend, to be written by the next group commit, unless l.pend
// then reaches pendFlushBytes: then write writes it. l.mu is held; write
// releases it while blocked for space, or for a group commit in progress
// before a roll.
func (l *Log) write(ctx context.Context, bp *[]byte) (uint64, error) {
	short := false
	for {
		off, err := l.writeOnce(ctx, bp)
		if err == nil {
			if short && len(l.unwritten) == 0 {
				l.spaceAgain()
			}
			return off, nil
		}
		if !errors.Is(err, ErrNoSpace) {
			return 0, err
		}
		// The append's own write found no space (a record written
		// alone, or one that starts a segment): it waits and tries
		// again, as the records held in memory do, rather than being
		// refused, which would end its publisher's connection and the
		// acknowledgements of what that publisher sent before.
		short = true
		l.stats.NoSpaceRetries++
		if ctx.Err() != nil {
			return 0, fmt.Errorf("ingestlog: append waiting for space on the device: %w (%w)", ctx.Err(), err)
		}
		l.mu.Unlock()
		t := time.NewTimer(l.noSpaceRetry)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
		l.mu.Lock()
	}
}

// writeOnce is one try of write: an error wrapping ErrNoSpace when the
// append's own write found no space, nothing stored then.
func (l *Log) writeOnce(ctx context.Context, bp *[]byte) (uint64, error) {
	size := int64(len(*bp))
	var blockedAt time.Time
	defer func() {
		if !blockedAt.IsZero() {
			l.stats.BlockedTime += time.Since(blockedAt)
			l.waiting--
		}
	}()
	for {
		seg := l.segs[len(l.segs)-1]
		_, extra, _ := l.markFor(seg)
		switch {
		case l.closed:
			return 0, ErrClosed
		case l.failed != nil:
			return 0, l.failed
		case l.noSpace != nil && l.held() >= pendFlushBytes:
			// Writes fail for want of space: the records held wait for a
			// group commit that can write them, and this one waits with
			// them rather than hold more in memory.
			if ctx.Err() != nil {
				return 0, fmt.Errorf("ingestlog: append waiting for space on the device: %w", ctx.Err())
			}
			if !l.syncing {
				l.lead()
				continue
			}
			l.waitLocked(ctx, l.advanced)
			continue
		// A record alone may exceed MaxBytes by its mark, so that a record
		// of MaxBytes always goes in eventually.
		case l.opts.MaxBytes == 0 || l.unreleased+size+extra <= l.opts.MaxBytes || l.unreleased == 0:
		case ctx.Err() != nil:
			return 0, fmt.Errorf("ingestlog: append waiting for space: %w", ctx.Err())
		case l.shed:
			l.stats.Shed++
			if !l.shedding {
				l.shedding = true
				l.logger.Warn("ingest log full and its pipeline does not run: new records are not stored (counted), so that its publishers are not held back",
					"dir", l.dir, "max_bytes", l.opts.MaxBytes, "unreleased_bytes", l.unreleased, "next_offset", l.next, "shed_total", l.stats.Shed)
			}
			return 0, ErrShed
		default:
			if blockedAt.IsZero() {
				blockedAt = time.Now()
				l.stats.Blocked++
				if l.waiting == 0 {
					// The log just filled up: say so once, not per Append.
					l.logger.Warn("ingest log full: appends wait until a completed checkpoint releases space (back-pressure to the publishers)",
						"dir", l.dir, "max_bytes", l.opts.MaxBytes, "unreleased_bytes", l.unreleased)
				}
				l.waiting++
			}
			l.waitLocked(ctx, l.space)
			continue
		}
		if seg.size+size+extra <= l.opts.SegmentBytes || seg.size == headerSize {
			break
		}
		if l.syncing {
			// The leader writes and fsyncs the active segment outside
			// l.mu: let it finish before sealing the segment (on a full
			// device it waits for space: ctx ends the wait).
			if ctx.Err() != nil {
				return 0, fmt.Errorf("ingestlog: append waiting for a group commit before a new segment: %w", ctx.Err())
			}
			l.waitLocked(ctx, l.advanced)
			continue
		}
		if err := l.roll(); err != nil {
			return 0, err
		}
		break
	}

	seg := l.segs[len(l.segs)-1]
	marked := l.marked
	if d, _, ok := l.markFor(seg); ok {
		*bp = addMark(*bp, d)
		size = int64(len(*bp))
		marked = d
	} else if seg.size == headerSize {
		marked = l.durable // everything before a fresh segment is durable
	}
	pos := seg.size
	if size >= pendFlushBytes {
		// Large: written from *bp, not copied into l.pend.
		if err := l.flushPend(seg); err != nil {
			return 0, err
		}
		if err := l.writeAt(seg, *bp, pos); err != nil {
			return 0, err
		}
		l.pendPos = pos + size
	} else {
		l.pend = append(l.pend, *bp...)
		if len(l.pend) >= pendFlushBytes && l.noSpace == nil {
			// A write that finds no space keeps the frames in l.pend,
			// this one included, for the group commit to write.
			if err := l.flushPend(seg); err != nil && !errors.Is(err, ErrNoSpace) {
				return 0, err
			}
		}
	}
	l.marked = marked
	off := l.next
	seg.addIndex(off, pos)
	seg.size += size
	l.next++
	l.unreleased += size
	l.diskBytes += size
	l.stats.Appends++
	l.stats.AppendedBytes += uint64(size)
	if l.shedding {
		l.shedding = false
		l.logger.Info("ingest log stores records again after shedding", "dir", l.dir, "offset", off, "shed_total", l.stats.Shed)
	}
	return off, nil
}

// waitLocked waits, with l.mu released, until ch is closed or ctx is
// done. l.mu is held.
func (l *Log) waitLocked(ctx context.Context, ch chan struct{}) {
	l.mu.Unlock()
	select {
	case <-ctx.Done():
	case <-ch:
	}
	l.mu.Lock()
}

// flushPend writes the batches a group commit could not write
// (l.unwritten), then l.pend, to seg, the active segment, without an
// fsync. When a write finds no space (ErrNoSpace) what was not written
// stays where it was, for the next try. l.mu is held.
func (l *Log) flushPend(seg *segment) error {
	for len(l.unwritten) > 0 {
		c := l.unwritten[0]
		if err := l.writeAt(seg, c.b, c.pos); err != nil {
			return err
		}
		l.unwritten = l.unwritten[1:]
	}
	if len(l.pend) == 0 {
		return nil
	}
	if err := l.writeAt(seg, l.pend, l.pendPos); err != nil {
		return err
	}
	l.pendPos += int64(len(l.pend))
	l.pend = l.pend[:0]
	return nil
}

// writeAt writes b at byte pos of seg. A write that fails for want of
// space returns an error wrapping ErrNoSpace and leaves the log as it
// was (see noSpace): what reached the file lies past every record an
// Append returned for, and writing b there again overwrites it. Any
// other failure fails the log: the records in b already have their
// offsets, and what reached the file is unknown, so only a reopen, which
// reads what is on disk, can go on. l.mu is held.
func (l *Log) writeAt(seg *segment, b []byte, pos int64) error {
	l.stats.Writes++
	if _, err := l.writeFile(seg.f, b, pos); err != nil {
		err = fmt.Errorf("append to %s: %w", seg.path, err)
		if isNoSpace(err) {
			return l.outOfSpace(err)
		}
		l.fail(err)
		return l.failed
	}
	return nil
}

// held returns the bytes of the records in memory that no write has
// reached the file with: l.unwritten and l.pend. l.mu is held.
func (l *Log) held() int {
	n := len(l.pend)
	for _, c := range l.unwritten {
		n += len(c.b)
	}
	return n
}

// isNoSpace reports whether err is a write's "no space left on device"
// or "disk quota exceeded".
func isNoSpace(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}

// outOfSpace records that a write found no space and returns err wrapped
// in ErrNoSpace. The first one of a spell is logged. l.mu is held.
func (l *Log) outOfSpace(err error) error {
	if l.noSpace == nil {
		l.noSpaceSince = time.Now()
		l.stats.NoSpace++
		l.logger.Error("ingest log: no space left on the device; appends wait and the write is tried again (back-pressure to the publishers)",
			"dir", l.dir, "retry", l.noSpaceRetry, "err", err)
	}
	l.noSpace = err
	return fmt.Errorf("%w: %w", ErrNoSpace, err)
}

// spaceAgain records that the records held back for want of space were
// written, and logs it. l.mu is held.
func (l *Log) spaceAgain() {
	if l.noSpace == nil {
		return
	}
	l.logger.Info("ingest log: writing again after running out of space",
		"dir", l.dir, "waited", time.Since(l.noSpaceSince).Round(time.Millisecond))
	l.noSpace = nil
}

// roll seals the active segment, writing the records it holds in memory
// and fsyncing it first so that only the last segment can ever have a
// torn tail, and starts a new one at l.next. If the new segment cannot be
// created the old one stays active. No group commit may be in progress.
// l.mu is held.
func (l *Log) roll() error {
	old := l.segs[len(l.segs)-1]
	if err := l.flushPend(old); err != nil {
		return err
	}
	if err := l.syncFile(old.f); err != nil {
		l.fail(fmt.Errorf("fsync %s: %w", old.path, err))
		return l.failed
	}
	l.stats.Fsyncs++
	old.durableSize = old.size
	if l.next > l.durable {
		l.setDurable(l.next)
		l.wake()
	}
	seg, err := createSegment(l.dir, l.next)
	if err != nil {
		if isNoSpace(err) {
			return l.outOfSpace(err) // the active segment stays; tried again
		}
		return err
	}
	l.stats.Fsyncs += 2 // the new file and the directory
	old.sealed = true
	l.closeSealed(old)
	l.segs = append(l.segs, seg)
	l.diskBytes += seg.size
	l.pendPos = seg.size
	return nil
}

// closeSealed closes the write handle of a sealed, fsynced segment.
func (l *Log) closeSealed(s *segment) {
	if err := s.f.Close(); err != nil {
		// Everything in it is fsynced; a close error loses nothing.
		l.logger.Warn("ingest log: closing a sealed segment", "segment", s.path, "err", err)
	}
	s.f = nil
}

// waitDurable returns once the record at off is durable, leading a group
// commit if no other Append is. l.mu is held; it is released while
// waiting.
//
// Done ctx ends the wait only while writes find no space (l.noSpace):
// the records may wait for a long time then, and whoever waits for them
// must be able to give up (a broker or subscriber that stops). Giving up
// fails the log, once no group commit is running: no record held then
// may become durable after its acknowledgement was given up on (its
// publisher, refused, sends it again), and Close cuts them off.
func (l *Log) waitDurable(ctx context.Context, off uint64) error {
	for {
		if l.durable > off {
			return nil
		}
		if l.failed != nil {
			return l.failed
		}
		if l.noSpace != nil && ctx.Err() != nil && !l.syncing {
			l.fail(fmt.Errorf("%w: a wait for record %d gave up: %w (%w)", ErrNoSpace, off, ctx.Err(), l.noSpace))
			return l.failed
		}
		if !l.syncing {
			l.lead()
			continue
		}
		ch := l.advanced
		l.mu.Unlock()
		<-ch
		l.mu.Lock()
	}
}

// lead runs one group commit: it waits out the rest of SyncInterval since
// the last fsync started, so that concurrent Appends join the batch, then
// takes the records held in memory (l.pend) and, outside l.mu, writes
// them with one write and fsyncs the active segment; then it advances
// durable to what was appended before it took them. Appends go on
// meanwhile into a fresh l.pend. l.mu is held.
func (l *Log) lead() {
	l.syncing = true
	if d := l.opts.SyncInterval; d > 0 && !l.lastSync.IsZero() {
		if wait := time.Until(l.lastSync.Add(d)); wait > 0 {
			l.mu.Unlock()
			t := time.NewTimer(wait)
			<-t.C
			l.mu.Lock()
		}
	}
	seg := l.segs[len(l.segs)-1]
	target, size := l.next, seg.size
	if target <= l.durable || l.failed != nil {
		l.syncing = false
		l.wake()
		return
	}
	chunks := l.unwritten
	l.unwritten = nil
	buf, pos := l.pend, l.pendPos
	l.pend, l.spare = l.spare[:0], nil
	l.pendPos = size
	l.lastSync = time.Now()
	l.stats.Fsyncs++
	l.stats.Writes += uint64(len(chunks))
	if len(buf) > 0 {
		l.stats.Writes++
	}
	l.mu.Unlock()
	var err error
	for _, c := range chunks {
		if _, werr := l.writeFile(seg.f, c.b, c.pos); werr != nil {
			err = fmt.Errorf("append to %s: %w", seg.path, werr)
			break
		}
	}
	if err == nil && len(buf) > 0 {
		if _, werr := l.writeFile(seg.f, buf, pos); werr != nil {
			err = fmt.Errorf("append to %s: %w", seg.path, werr)
		}
	}
	noSpace := err != nil && isNoSpace(err) // a write's, not the fsync's
	if err == nil {
		if serr := l.syncFile(seg.f); serr != nil {
			err = fmt.Errorf("fsync %s: %w", seg.path, serr)
		}
	}
	if noSpace {
		// Try again after a pause, not at once: the waiting Appends lead
		// the next try when this one returns.
		t := time.NewTimer(l.noSpaceRetry)
		<-t.C
	}
	l.mu.Lock()
	l.syncing = false
	if noSpace {
		// Keep every batch for the next try, in offset order: the
		// chunks, this batch, and what a write since found no space for.
		if len(buf) > 0 {
			chunks = append(chunks, chunk{b: buf, pos: pos})
		}
		l.unwritten = append(chunks, l.unwritten...)
		l.outOfSpace(err)
		if l.closed {
			l.fail(err)
		}
		l.wake()
		return
	}
	if cap(buf) <= maxSpareBytes && l.spare == nil {
		l.spare = buf[:0]
	}
	if err != nil {
		l.fail(err)
		return
	}
	if len(l.unwritten) == 0 {
		l.spaceAgain()
	}
	seg.durableSize = max(seg.durableSize, size)
	l.setDurable(max(l.durable, target))
	l.wake()
}

// setDurable advances durable to d. l.mu is held.
func (l *Log) setDurable(d uint64) {
	l.durable = d
	l.durableA.Store(d)
}

// wake tells Appends waiting for durability and Readers waiting for
// records that durable advanced (or the log failed or closed). l.mu is
// held.
func (l *Log) wake() {
	close(l.advanced)
	l.advanced = make(chan struct{})
}

// ShedWhenFull sets whether the log, when full, refuses an append at
// once with ErrShed (nothing stored) rather than block it until a
// Truncate releases space. A log whose reader does not run (its pipeline
// stopped, was cancelled or failed for good, while its publishers feed
// other logs too) sheds, so that its publishers are not held back; it
// still stores what fits. Appends blocked when shedding starts return
// ErrShed.
func (l *Log) ShedWhenFull(on bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.shed = on
	if on {
		l.wakeSpace()
	}
}

// wakeSpace tells blocked Appends that space was released (or the log
// failed or closed). l.mu is held.
func (l *Log) wakeSpace() {
	close(l.space)
	l.space = make(chan struct{})
}

// fail makes err the log's sticky failure. l.mu is held.
func (l *Log) fail(err error) {
	if l.failed != nil {
		return
	}
	l.failed = fmt.Errorf("%w: %w", ErrFailed, err)
	l.logger.Error("ingest log failed; appends refused until it is reopened", "dir", l.dir, "err", err)
	l.wake()
	l.wakeSpace()
}

// Close makes every written record durable, fails the Appends still
// waiting for space with ErrClosed, and closes the files and the
// directory lock. Readers of a closed Log return ErrClosed. Closing twice
// is a no-op.
func (l *Log) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	l.isClosed.Store(true)
	l.wakeSpace()
	for l.syncing {
		ch := l.advanced
		l.mu.Unlock()
		<-ch
		l.mu.Lock()
	}
	l.syncing = true // no leader from now on: Close owns the files
	var errs []error
	active := l.segs[len(l.segs)-1]
	if l.failed == nil && l.durable < l.next {
		if err := l.flushPend(active); err != nil {
			// Out of space too: the records still held are lost with
			// the process anyway, and their Appends must not wait on.
			l.fail(err)
			errs = append(errs, err)
		} else if err := l.syncFile(active.f); err != nil {
			l.fail(fmt.Errorf("fsync %s: %w", active.path, err))
			errs = append(errs, l.failed)
		} else {
			l.stats.Fsyncs++
			active.durableSize = active.size
			l.setDurable(l.next)
		}
	}
	if l.durable < l.next {
		errs = append(errs, l.cutNotDurable(active))
	}
	l.wake()
	for _, s := range l.segs {
		if s.f != nil {
			if err := s.f.Close(); err != nil {
				errs = append(errs, fmt.Errorf("ingestlog: close %s: %w", s.path, err))
			}
			s.f = nil
		}
	}
	if err := l.lockFile.Close(); err != nil {
		errs = append(errs, fmt.Errorf("ingestlog: unlock %s: %w", l.dir, err))
	}
	return errors.Join(errs...)
}

// cutNotDurable cuts the active segment's file back to what is durable
// when records could not be made durable (a failed write or fsync, or no
// space): no Append returned for them, so their publishers were refused
// and send them again, and a reopen must not find the whole records a
// short write left of them, which it would keep as written before the
// first damage. Only the active segment can hold records that are not
// durable (roll fsyncs a segment before it starts the next). l.mu is held.
func (l *Log) cutNotDurable(active *segment) error {
	if err := os.Truncate(active.path, active.durableSize); err != nil {
		return fmt.Errorf("ingestlog: cut the records that were never made durable from %s: %w", active.path, err)
	}
	if err := l.syncFile(active.f); err != nil {
		return fmt.Errorf("ingestlog: fsync %s: %w", active.path, err)
	}
	l.logger.Warn("ingest log: cut the records that were never made durable (their appends failed)",
		"segment", active.path, "offset", l.durable, "records", l.next-l.durable, "byte", active.durableSize)
	return nil
}

// Truncate releases the records before offset before and deletes the
// segment files all of whose records are before it (and durable); the
// active segment is never deleted. The source calls it when a checkpoint
// that stored before as its position has completed, and once after
// recovery with the restored position, since a reopened Log counts every
// record on disk against MaxBytes. Released space unblocks Appends at
// once; a file goes at the first Truncate after its last record is
// released and a later segment has started. Truncate to an offset at or
// before an earlier one releases nothing more (but deletes what became
// deletable since); beyond the next offset it returns ErrOutOfRange.
// Readers positioned before the new first offset get ErrTruncated.
func (l *Log) Truncate(before uint64) error {
	l.truncMu.Lock()
	defer l.truncMu.Unlock()

	l.mu.Lock()
	if err := l.usable(); err != nil {
		l.mu.Unlock()
		return err
	}
	if before > l.next {
		next := l.next
		l.mu.Unlock()
		return fmt.Errorf("%w: truncate before %d, next offset is %d", ErrOutOfRange, before, next)
	}
	if before > l.durable && before < l.next {
		// Skipping to before reads the records ahead of it from the file:
		// make them durable, so they are there.
		if err := l.waitDurable(context.Background(), before-1); err != nil {
			l.mu.Unlock()
			return err
		}
		if err := l.usable(); err != nil {
			l.mu.Unlock()
			return err
		}
	}
	if before <= l.released {
		// Nothing more to release, but a segment may have been sealed since.
		deleted := l.detachReleased()
		l.mu.Unlock()
		return l.remove(deleted)
	}
	i := l.segmentFor(before)
	seg := l.segs[i]
	pos := int64(-1)
	switch {
	case before == seg.base:
		pos = headerSize
	case i == len(l.segs)-1 && before == l.next:
		pos = seg.size
	}
	entry, limit := seg.lookup(before), seg.durableSize
	l.mu.Unlock()

	if pos < 0 {
		// truncMu keeps the file from being deleted; it only grows.
		var err error
		if pos, err = seekFile(seg.path, entry, before, limit); err != nil {
			return err
		}
	}

	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return ErrClosed
	}
	// Only Truncate removes segments, so seg is still l.segs[i].
	unreleased := seg.size - pos
	for _, s := range l.segs[i+1:] {
		unreleased += s.size - headerSize
	}
	l.unreleased = unreleased
	l.released = before
	l.wakeSpace()
	deleted := l.detachReleased()
	l.mu.Unlock()
	return l.remove(deleted)
}

// detachReleased takes the segments all of whose records are released and
// durable out of the log, except the active one, and returns them for
// remove. Readers opened from now on cannot open them. l.mu is held.
func (l *Log) detachReleased() []*segment {
	limit := min(l.released, l.durable)
	k := 0
	for k < len(l.segs)-1 && l.segs[k+1].base <= limit {
		k++
	}
	if k == 0 {
		return nil
	}
	deleted := make([]*segment, k)
	copy(deleted, l.segs[:k])
	l.segs = append(l.segs[:0], l.segs[k:]...)
	for _, s := range deleted {
		l.diskBytes -= s.size
	}
	l.first.Store(l.segs[0].base)
	return deleted
}

// remove deletes the files of detached segments, oldest first so that a
// crash in between leaves a contiguous log, and syncs the directory.
func (l *Log) remove(deleted []*segment) error {
	if len(deleted) == 0 {
		return nil
	}
	var errs []error
	for _, s := range deleted {
		if err := os.Remove(s.path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("ingestlog: %w", err))
		}
	}
	if err := syncDir(l.dir); err != nil {
		errs = append(errs, err)
	}
	l.logger.Debug("ingest log segments deleted", "dir", l.dir, "segments", len(deleted),
		"first_offset", l.first.Load())
	return errors.Join(errs...)
}

// usable returns ErrClosed or the sticky failure. l.mu is held.
func (l *Log) usable() error {
	if l.closed {
		return ErrClosed
	}
	return l.failed
}

// segmentFor returns the index of the segment holding offset off (the
// last one starting at or before it); off must be at least the first
// offset. l.mu is held.
func (l *Log) segmentFor(off uint64) int {
	i := sort.Search(len(l.segs), func(i int) bool { return l.segs[i].base > off })
	return max(i-1, 0)
}

// seekFile returns the byte position of offset target in the segment file
// at path, reading from index entry e. limit is the bytes written.
func seekFile(path string, e indexEntry, target uint64, limit int64) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("ingestlog: %w", err)
	}
	defer f.Close()
	return skipTo(f, path, e.pos, e.off, target, limit)
}

// syncDir fsyncs dir (fsutil.SyncDir), its errors marked as the log's.
func syncDir(dir string) error {
	if err := fsutil.SyncDir(dir); err != nil {
		return fmt.Errorf("ingestlog: %w", err)
	}
	return nil
}
