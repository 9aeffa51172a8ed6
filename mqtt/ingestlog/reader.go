package ingestlog

import (
	"context"
	"fmt"
	"hash/crc32"
	"os"
	"sort"
)

const (
	// readBufferSize is how much of a segment a Reader reads at once.
	readBufferSize = 64 << 10
	// maxInterned bounds the topic strings a Reader shares between records.
	maxInterned = 4096
)

// Reader reads durable records in offset order, from its own file handle.
// A Reader is not safe for concurrent use: one goroutine (the source's
// task) owns it. Many Readers may read one Log.
type Reader struct {
	l      *Log
	next   uint64   // offset of the next record TryNext returns
	seg    *segment // segment being read; may already be deleted
	f      *os.File // read handle of seg; nil once the Reader is closed
	pos    int64    // byte position of record next in seg
	limit  int64    // durable bytes of seg, as last seen
	buf    []byte   // bytes of seg from bufPos
	bufPos int64
	topics map[string]string // interned topics
	err    error             // sticky
}

// Reader returns a Reader positioned at offset from, which must be at
// least the first offset still on disk (else ErrTruncated) and at most the
// next offset (else ErrOutOfRange). A Reader sees only durable records; a
// Reader from an offset that is written but not durable yet first makes
// the records before it durable (WaitDurable), since only then are they
// all on disk to be skipped.
func (l *Log) Reader(from uint64) (*Reader, error) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil, ErrClosed
	}
	if from > l.durable && from < l.next {
		if err := l.waitDurable(context.Background(), from-1); err != nil {
			l.mu.Unlock()
			return nil, err
		}
		if l.closed {
			l.mu.Unlock()
			return nil, ErrClosed
		}
	}
	if first := l.segs[0].base; from < first {
		l.mu.Unlock()
		return nil, fmt.Errorf("%w: reader from offset %d, first offset is %d", ErrTruncated, from, first)
	}
	if from > l.next {
		next := l.next
		l.mu.Unlock()
		return nil, fmt.Errorf("%w: reader from offset %d, next offset is %d", ErrOutOfRange, from, next)
	}
	seg := l.segs[l.segmentFor(from)]
	entry, durable := seg.lookup(from), seg.durableSize
	end := int64(-1) // from's position, if it is the end of the log
	if from == l.next {
		end = seg.size
	}
	// Opened under mu so that Truncate cannot delete it first.
	f, err := os.Open(seg.path)
	l.mu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("ingestlog: %w", err)
	}
	pos := end
	if pos < 0 {
		// The records before from are durable, so on disk.
		if pos, err = skipTo(f, seg.path, entry.pos, entry.off, from, durable); err != nil {
			f.Close()
			return nil, err
		}
	}
	return &Reader{
		l:      l,
		next:   from,
		seg:    seg,
		f:      f,
		pos:    pos,
		limit:  durable,
		bufPos: pos,
		topics: make(map[string]string),
	}, nil
}

// Offset returns the offset of the next record the Reader returns: the
// position a checkpoint stores.
func (r *Reader) Offset() uint64 { return r.next }

// TryNext returns the next durable record and true, or false without
// blocking when the Reader has caught up. It returns ErrTruncated once
// Truncate deleted the Reader's position, ErrClosed once the Reader or
// the Log is closed, ErrFailed when caught up on a failed Log, and a
// *CorruptError for a damaged record; errors are sticky. The record owns
// its payload.
func (r *Reader) TryNext() (Record, bool, error) {
	if r.err != nil {
		return Record{}, false, r.err
	}
	if r.f == nil || r.l.isClosed.Load() {
		return Record{}, false, ErrClosed
	}
	if first := r.l.first.Load(); r.next < first {
		r.err = fmt.Errorf("%w: reader at offset %d, first offset is %d", ErrTruncated, r.next, first)
		return Record{}, false, r.err
	}
	if r.pos >= r.limit {
		ok, err := r.refresh()
		if err != nil {
			r.err = err
			return Record{}, false, err
		}
		if !ok {
			return Record{}, false, nil
		}
	}
	rec, err := r.read()
	if err != nil {
		r.err = err
		return Record{}, false, err
	}
	return rec, true, nil
}

// Ready returns a channel that is closed when TryNext has something to
// return: a record, or an error. It may be closed spuriously; call TryNext
// and, if it returns false, Ready again.
func (r *Reader) Ready() <-chan struct{} {
	l := r.l
	l.mu.Lock()
	defer l.mu.Unlock()
	if r.err != nil || r.f == nil || l.closed || l.failed != nil || l.durable > r.next || r.next < l.segs[0].base {
		return l.ready
	}
	return l.advanced
}

// Next returns the next record, waiting until one is durable or ctx is
// done.
func (r *Reader) Next(ctx context.Context) (Record, error) {
	for {
		rec, ok, err := r.TryNext()
		if err != nil {
			return Record{}, err
		}
		if ok {
			return rec, nil
		}
		select {
		case <-ctx.Done():
			return Record{}, ctx.Err()
		case <-r.Ready():
		}
	}
}

// Close releases the Reader's file handle. Closing twice is a no-op.
func (r *Reader) Close() error {
	if r.f == nil {
		return nil
	}
	err := r.f.Close()
	r.f = nil
	return err
}

// refresh learns how much of the segment is durable, moving to the next
// segment when this one is sealed and read to its end. It reports whether
// a record is available.
func (r *Reader) refresh() (bool, error) {
	l := r.l
	l.mu.Lock()
	r.limit = r.seg.durableSize
	if r.pos < r.limit {
		l.mu.Unlock()
		return true, nil
	}
	if !r.seg.sealed || r.seg.durableSize != r.seg.size {
		err := l.failed
		l.mu.Unlock()
		return false, err
	}
	i := sort.Search(len(l.segs), func(i int) bool { return l.segs[i].base >= r.next })
	if i == len(l.segs) || l.segs[i].base != r.next {
		first := l.segs[0].base
		l.mu.Unlock()
		if r.next < first {
			return false, fmt.Errorf("%w: reader at offset %d, first offset is %d", ErrTruncated, r.next, first)
		}
		return false, &CorruptError{Segment: r.seg.path, Offset: r.next, Pos: r.pos,
			Err: fmt.Errorf("%w: no segment starts where this one ends", ErrGap)}
	}
	seg := l.segs[i]
	f, err := os.Open(seg.path)
	limit := seg.durableSize
	l.mu.Unlock()
	if err != nil {
		return false, fmt.Errorf("ingestlog: %w", err)
	}
	r.f.Close() // read-only; nothing to lose
	r.seg, r.f, r.pos, r.limit = seg, f, headerSize, limit
	r.buf, r.bufPos = r.buf[:0], headerSize
	return r.pos < r.limit, nil
}

// read decodes the record at r.pos, which is below r.limit.
func (r *Reader) read() (Record, error) {
	corrupt := func(err error) error {
		return &CorruptError{Segment: r.seg.path, Offset: r.next, Pos: r.pos, Err: err}
	}
	hdr, err := r.bytes(frameHeaderSize)
	if err != nil {
		return Record{}, err
	}
	n, sum, err := parseFrameHeader(hdr)
	if err != nil {
		return Record{}, corrupt(err)
	}
	if r.pos+frameHeaderSize+n > r.limit {
		return Record{}, corrupt(fmt.Errorf("%w: record of %d bytes runs past byte %d", ErrRecordLength, frameHeaderSize+n, r.limit))
	}
	frame, err := r.bytes(frameHeaderSize + n)
	if err != nil {
		return Record{}, err
	}
	raw := frame[frameHeaderSize:]
	if crc32.Checksum(raw, castagnoli) != sum {
		return Record{}, corrupt(ErrChecksum)
	}
	p, err := parseBody(raw)
	if err != nil {
		return Record{}, corrupt(err)
	}
	rec := Record{Offset: r.next, Message: p.message(r.intern(p.topic))}
	r.pos += frameHeaderSize + n
	r.next++
	return rec, nil
}

// bytes returns n bytes of the segment from r.pos (r.pos+n <= r.limit),
// reading ahead up to readBufferSize.
func (r *Reader) bytes(n int64) ([]byte, error) {
	if r.pos >= r.bufPos && r.pos+n <= r.bufPos+int64(len(r.buf)) {
		start := r.pos - r.bufPos
		return r.buf[start : start+n], nil
	}
	if r.pos+n > r.limit {
		return nil, &CorruptError{Segment: r.seg.path, Offset: r.next, Pos: r.pos,
			Err: fmt.Errorf("%w: record header runs past byte %d", ErrRecordLength, r.limit)}
	}
	size := min(max(n, readBufferSize), r.limit-r.pos)
	if int64(cap(r.buf)) < size {
		r.buf = make([]byte, size)
	}
	r.buf = r.buf[:size]
	if _, err := r.f.ReadAt(r.buf, r.pos); err != nil {
		r.buf = r.buf[:0]
		return nil, fmt.Errorf("ingestlog: read %s at byte %d: %w", r.seg.path, r.pos, err)
	}
	r.bufPos = r.pos
	return r.buf[:n], nil
}

// intern returns topic as a string shared by the records with that topic.
func (r *Reader) intern(topic []byte) string {
	if s, ok := r.topics[string(topic)]; ok {
		return s
	}
	if len(r.topics) >= maxInterned {
		clear(r.topics)
	}
	s := string(topic)
	r.topics[s] = s
	return s
}
