package ingestlog

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
)

const (
	// segMagic starts every segment file.
	segMagic = "EDGDILOG"
	// segVersion is the segment format this build writes and reads.
	segVersion = 1
	// headerSize is the size of the segment header: magic, version,
	// reserved, base offset, CRC32C.
	headerSize = 24
	// segSuffix ends segment file names.
	segSuffix = ".seg"
	// segNameLen is the length of a segment file name: 20 digits and
	// ".seg".
	segNameLen = 20 + len(segSuffix)
	// indexInterval is the spacing, in bytes, of the sparse in-memory
	// index: locating an offset reads at most this much of a segment.
	indexInterval = 32 << 10
	// scanBufferSize is the read buffer of recovery and seeks.
	scanBufferSize = 256 << 10
)

// indexEntry says that the record at offset off starts at byte pos.
type indexEntry struct {
	off uint64
	pos int64
}

// segment is one file of the log. base and path never change; the other
// fields are guarded by Log.mu.
type segment struct {
	base uint64
	path string

	size        int64        // bytes written: header and whole records
	durableSize int64        // bytes known to be fsynced; readers stop here
	index       []indexEntry // sparse, ascending; index[0] is (base, headerSize)
	f           *os.File     // write handle; nil once sealed and synced
	sealed      bool         // a later segment exists; size is final
}

// segmentName is the file name of the segment starting at base.
func segmentName(base uint64) string {
	return fmt.Sprintf("%020d%s", base, segSuffix)
}

// parseSegmentName returns the base offset a segment file name encodes,
// or false for a name that is not one.
func parseSegmentName(name string) (uint64, bool) {
	if len(name) != segNameLen || !strings.HasSuffix(name, segSuffix) {
		return 0, false
	}
	digits := name[:20]
	for i := range len(digits) {
		if digits[i] < '0' || digits[i] > '9' {
			return 0, false
		}
	}
	base, err := strconv.ParseUint(digits, 10, 64)
	if err != nil {
		return 0, false
	}
	return base, true
}

// encodeHeader returns the header of a segment starting at base.
func encodeHeader(base uint64) []byte {
	b := make([]byte, headerSize)
	copy(b, segMagic)
	binary.LittleEndian.PutUint16(b[8:], segVersion)
	binary.LittleEndian.PutUint64(b[12:], base)
	binary.LittleEndian.PutUint32(b[20:], crc32.Checksum(b[:20], castagnoli))
	return b
}

// decodeHeader checks a segment header and returns its base offset. It
// never panics.
func decodeHeader(b []byte) (uint64, error) {
	if len(b) < headerSize || string(b[:8]) != segMagic {
		return 0, ErrBadMagic
	}
	if v := binary.LittleEndian.Uint16(b[8:]); v != segVersion {
		return 0, fmt.Errorf("%w: version %d (this build reads %d)", ErrVersion, v, segVersion)
	}
	if crc32.Checksum(b[:20], castagnoli) != binary.LittleEndian.Uint32(b[20:]) {
		return 0, fmt.Errorf("%w: segment header", ErrChecksum)
	}
	if r := binary.LittleEndian.Uint16(b[10:]); r != 0 {
		return 0, fmt.Errorf("%w: reserved header field %#x", ErrCorrupt, r)
	}
	return binary.LittleEndian.Uint64(b[12:]), nil
}

// addIndex records the record at off starting at pos if it is at least
// indexInterval past the previous entry.
func (s *segment) addIndex(off uint64, pos int64) {
	if n := len(s.index); n == 0 || pos-s.index[n-1].pos >= indexInterval {
		s.index = append(s.index, indexEntry{off: off, pos: pos})
	}
}

// lookup returns the last index entry at or before off.
func (s *segment) lookup(off uint64) indexEntry {
	i := sort.Search(len(s.index), func(i int) bool { return s.index[i].off > off })
	if i == 0 {
		return indexEntry{off: s.base, pos: headerSize}
	}
	return s.index[i-1]
}

// scanResult is what recovery learned about one segment.
type scanResult struct {
	records    uint64       // whole valid records
	size       int64        // bytes of header and valid records
	index      []indexEntry // sparse index of the valid records
	tornHeader bool         // last segment whose header never made it to disk
	torn       error        // why the tail after size was dropped; nil if none
}

// scanSegment validates the segment file read from r, size bytes long,
// whose name says it starts at base. Anything that is not a valid record
// in a segment that is not the last one is a CorruptError. In the last
// segment (last), the first bad frame and everything after it are a torn
// tail, reported in the result, unless a valid record after it carries a
// commit mark beyond the bad record's offset: that record proves the bad
// one was fsynced (acknowledged) before the crash, so the damage is a
// CorruptError too. It never panics.
func scanSegment(r io.Reader, size int64, path string, base uint64, last bool) (scanResult, error) {
	br := bufio.NewReaderSize(r, scanBufferSize)
	var res scanResult
	var hdr [headerSize]byte
	if size < headerSize {
		if last {
			res.tornHeader = true
			return res, nil
		}
		return res, fmt.Errorf("%w: segment %s: header cut short (%d bytes)", ErrCorrupt, path, size)
	}
	if _, err := io.ReadFull(br, hdr[:]); err != nil {
		return res, fmt.Errorf("read segment %s: %w", path, err)
	}
	if last && allZero(hdr[:]) {
		zero, err := restZero(br)
		if err != nil {
			return res, fmt.Errorf("read segment %s: %w", path, err)
		}
		if zero {
			res.tornHeader = true
			return res, nil
		}
	}
	hb, err := decodeHeader(hdr[:])
	if err != nil {
		return res, fmt.Errorf("segment %s: %w", path, err)
	}
	if hb != base {
		return res, fmt.Errorf("%w: segment %s: header says it starts at offset %d", ErrCorrupt, path, hb)
	}

	pos := int64(headerSize)
	off := base
	res.index = []indexEntry{{off: base, pos: pos}}
	lastIndexed := pos
	var buf []byte // the bytes of the frame at pos read so far
	for pos < size {
		var cause error
		var frame int64
		buf, frame, cause, err = readFrame(br, size-pos, buf[:0])
		if err != nil {
			return res, fmt.Errorf("read segment %s: %w", path, err)
		}
		if cause == nil {
			p, _ := parseBody(buf[frameHeaderSize:]) // checked by readFrame
			if p.hasMark() && p.mark > off {
				cause = fmt.Errorf("%w: commit mark %d beyond the record's own offset", ErrRecordBody, p.mark)
			}
		}
		if cause != nil {
			if !last {
				return res, &CorruptError{Segment: path, Offset: off, Pos: pos, Err: cause}
			}
			rest, err := io.ReadAll(br)
			if err != nil {
				return res, fmt.Errorf("read segment %s: %w", path, err)
			}
			tail := append(buf, rest...)
			if at, mark, ok := findMark(tail, off); ok {
				return res, &CorruptError{Segment: path, Offset: off, Pos: pos, Err: fmt.Errorf(
					"%w (acknowledged: the record at byte %d was written after every record before offset %d was fsynced)",
					cause, pos+at, mark)}
			}
			if allZero(tail) {
				res.torn = fmt.Errorf("zero-filled tail (%d bytes)", len(tail))
			} else {
				res.torn = fmt.Errorf("unacknowledged tail of %d bytes: %w", len(tail), cause)
			}
			break
		}
		if pos-lastIndexed >= indexInterval {
			res.index = append(res.index, indexEntry{off: off, pos: pos})
			lastIndexed = pos
		}
		pos += frame
		off++
		res.records++
	}
	res.size = pos
	return res, nil
}

// readFrame reads one frame, remaining (> 0) bytes at most, appending
// what it reads to buf. It returns the frame's size, or why the bytes are
// not a valid frame (cause), or the read error. buf always holds every
// byte consumed from br.
func readFrame(br *bufio.Reader, remaining int64, buf []byte) (_ []byte, frame int64, cause, err error) {
	read := func(n int64) error {
		start := len(buf)
		buf = append(buf, make([]byte, n)...)
		_, err := io.ReadFull(br, buf[start:])
		return err
	}
	if remaining < frameHeaderSize {
		if err := read(remaining); err != nil {
			return buf, 0, nil, err
		}
		return buf, 0, fmt.Errorf("%w: %d bytes at the end of the segment", ErrRecordLength, remaining), nil
	}
	if err := read(frameHeaderSize); err != nil {
		return buf, 0, nil, err
	}
	n, sum, perr := parseFrameHeader(buf)
	if perr != nil {
		return buf, 0, perr, nil
	}
	frame = frameHeaderSize + n
	if frame > remaining {
		if err := read(remaining - frameHeaderSize); err != nil {
			return buf, 0, nil, err
		}
		return buf, 0, fmt.Errorf("%w: record of %d bytes with %d left in the segment", ErrRecordLength, frame, remaining), nil
	}
	if err := read(n); err != nil {
		return buf, 0, nil, err
	}
	raw := buf[frameHeaderSize:]
	if crc32.Checksum(raw, castagnoli) != sum {
		return buf, 0, ErrChecksum, nil
	}
	if _, perr := parseBody(raw); perr != nil {
		return buf, 0, perr, nil
	}
	return buf, frame, nil, nil
}

// findMark looks in tail, the bytes of a last segment from a bad frame to
// its end, for a valid record carrying a commit mark beyond off, the bad
// frame's offset: proof that the bad frame had been fsynced. Frames after
// damage need not start where the damage ends, so it tries every byte
// position, skipping over each valid frame it finds. A position's body
// must parse (an exact fit of its fields, which random bytes almost never
// are) before its checksum is computed, so garbage costs linear time. It
// returns the record's position in tail and its mark.
func findMark(tail []byte, off uint64) (int64, uint64, bool) {
	for i := 1; i+frameHeaderSize+minBodySize <= len(tail); {
		b := tail[i:]
		n := int64(binary.LittleEndian.Uint32(b))
		if n < minBodySize || n > int64(len(b)-frameHeaderSize) {
			i++
			continue
		}
		sum := binary.LittleEndian.Uint32(b[4:])
		raw := b[frameHeaderSize : frameHeaderSize+n]
		if !markedShape(raw) || crc32.Checksum(raw, castagnoli) != sum {
			i++
			continue
		}
		p, err := parseBody(raw)
		if err != nil {
			i++
			continue
		}
		if p.hasMark() && p.mark > off {
			return int64(i), p.mark, true
		}
		i += frameHeaderSize + int(n)
	}
	return 0, 0, false
}

// markedShape reports, without allocating, whether b has the shape of a
// body parseBody accepts (known flags, minimal varints, fields that fill
// it exactly).
func markedShape(b []byte) bool {
	if len(b) < minBodySize || b[0]&^flagsKnown != 0 || b[0]&flagQoS == 3 || b[0]&(flagNote|flagPacketID) == flagNote {
		return false
	}
	flags := b[0]
	b = b[1:]
	t, n := binary.Varint(b)
	if n <= 0 || n != varintLen(t) {
		return false
	}
	b = b[n:]
	if flags&flagPacketID != 0 {
		id, n := binary.Uvarint(b)
		if n <= 0 || n != uvarintLen(id) || id == 0 || id > 65535 {
			return false
		}
		b = b[n:]
	}
	for _, max := range []uint64{maxTopicBytes, MaxPayloadBytes} {
		l, n := binary.Uvarint(b)
		if n <= 0 || n != uvarintLen(l) || l > max || l > uint64(len(b)-n) {
			return false
		}
		b = b[uint64(n)+l:]
	}
	if flags&flagMark != 0 {
		d, n := binary.Uvarint(b)
		if n <= 0 || n != uvarintLen(d) {
			return false
		}
		b = b[n:]
	}
	return len(b) == 0
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// restZero reads r to its end and reports whether every byte was zero.
func restZero(r io.Reader) (bool, error) {
	var buf [4096]byte
	zero := true
	for {
		n, err := r.Read(buf[:])
		if !allZero(buf[:n]) {
			zero = false
		}
		if err == io.EOF {
			return zero, nil
		}
		if err != nil {
			return false, err
		}
	}
}

// skipTo reads the frames of f from pos, the position of offset off, up to
// offset target and returns target's position. limit is the number of
// bytes of f that hold whole records.
func skipTo(f *os.File, path string, pos int64, off, target uint64, limit int64) (int64, error) {
	br := bufio.NewReaderSize(io.NewSectionReader(f, pos, limit-pos), scanBufferSize)
	var fh [frameHeaderSize]byte
	for ; off < target; off++ {
		if _, err := io.ReadFull(br, fh[:]); err != nil {
			return 0, fmt.Errorf("seek to offset %d in %s: %w", target, path, err)
		}
		n, _, err := parseFrameHeader(fh[:])
		if err != nil {
			return 0, &CorruptError{Segment: path, Offset: off, Pos: pos, Err: err}
		}
		if _, err := br.Discard(int(n)); err != nil {
			return 0, fmt.Errorf("seek to offset %d in %s: %w", target, path, err)
		}
		pos += frameHeaderSize + n
	}
	return pos, nil
}
