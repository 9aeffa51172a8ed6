package ingestlog

import (
	"bufio"
	"encoding/binary"
	"errors"
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
// whose name says it starts at base. In the last segment (last) a torn
// tail is reported in the result, not as an error: a partial record at the
// end, a record failing its checksum that ends the file, or a zero-filled
// remainder. Anything else that is not a valid record is a CorruptError.
// It never panics.
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
	var fh [frameHeaderSize]byte
	var buf []byte
	corrupt := func(cause error) error {
		return &CorruptError{Segment: path, Offset: off, Pos: pos, Err: cause}
	}
	for pos < size {
		remaining := size - pos
		if remaining < frameHeaderSize {
			if last {
				res.torn = fmt.Errorf("partial record header (%d bytes)", remaining)
				break
			}
			return res, corrupt(fmt.Errorf("%w: %d bytes at the end of the segment", ErrRecordLength, remaining))
		}
		if _, err := io.ReadFull(br, fh[:]); err != nil {
			return res, fmt.Errorf("read segment %s: %w", path, err)
		}
		n, sum, err := parseFrameHeader(fh[:])
		if err != nil {
			if last && allZero(fh[:]) {
				zero, zerr := restZero(br)
				if zerr != nil {
					return res, fmt.Errorf("read segment %s: %w", path, zerr)
				}
				if zero {
					res.torn = errors.New("zero-filled tail")
					break
				}
			}
			return res, corrupt(err)
		}
		frame := frameHeaderSize + n
		if frame > remaining {
			if last {
				res.torn = fmt.Errorf("partial record (%d of %d bytes)", remaining, frame)
				break
			}
			return res, corrupt(fmt.Errorf("%w: record of %d bytes with %d left in the segment", ErrRecordLength, frame, remaining))
		}
		if int64(cap(buf)) < n {
			buf = make([]byte, n)
		}
		buf = buf[:n]
		if _, err := io.ReadFull(br, buf); err != nil {
			return res, fmt.Errorf("read segment %s: %w", path, err)
		}
		if crc32.Checksum(buf, castagnoli) != sum {
			if last {
				atEnd := pos+frame == size
				if !atEnd {
					zero, zerr := restZero(br)
					if zerr != nil {
						return res, fmt.Errorf("read segment %s: %w", path, zerr)
					}
					atEnd = zero
				}
				if atEnd {
					res.torn = errors.New("last record fails its checksum")
					break
				}
			}
			return res, corrupt(ErrChecksum)
		}
		if _, err := parseBody(buf); err != nil {
			return res, corrupt(err)
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
