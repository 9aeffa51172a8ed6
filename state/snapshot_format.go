package state

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"

	"github.com/edgedio/edged/keygroup"
)

// The keyed snapshot stream, as KeyedSnapshot.WriteTo writes it and
// Restore reads it. Integers are big-endian unless said to be uvarints;
// a string is a uvarint length and its bytes.
//
//	header  "EDGS" | version u16 (1) | first key group u16 | end key group
//	        u16 | reserved u16 (0) | catalogue length u32 | catalogue |
//	        CRC32C of all of the header before it u32
//	catalogue  uvarint number of states, then per state, in increasing
//	        order of name: name string | kind u8 | flags u8 (bit 0: TTL) |
//	        types string | codecs string
//	section body length u32 | key group u16 | body | CRC32C of the
//	        length, the key group and the body u32
//	body    uvarint number of states, then per state: uvarint index in
//	        the catalogue | uvarint number of records | uvarint length of
//	        the records | records
//	record  uvarint key length | key | uvarint value length | value
//
// The header describes every state once; then comes one section per key
// group that has entries or timers, in increasing order of key group. A
// restore reads the header and the sections of its key groups only. A
// record's key is the stream key encoded by the state's key codec then
// the namespace encoded by its namespace codec (for Map state, then the
// user key by the user key codec); its value is, for state with a TTL, the
// expiry time as 8 bytes of Unix nanoseconds, then the value by the value
// codec (a List: its elements end to end; a Map: the user value of the
// record's element). A timer queue is stored as the state named
// "_timers/<queue name>" of kind Timers, whose records are keyed by the
// timer's key and namespace and hold its timestamp in 8 bytes, in firing
// order. This is also how BoltBackend stores entries, behind the two
// bytes of the key group: a bolt snapshot copies bytes.
const (
	snapshotMagic   = "EDGS"
	snapshotVersion = 1
	// headerLen is the fixed part of the header, before the catalogue;
	// headerTailLen is its checksum.
	headerLen     = 16
	headerTailLen = 4
	// sectionHeadLen is the length and key group fields of a section;
	// sectionTailLen its checksum.
	sectionHeadLen = 6
	sectionTailLen = 4
	// maxSectionLen bounds a section and the catalogue, so that a corrupt
	// length or extent cannot make Restore allocate without limit.
	maxSectionLen = 1 << 30
)

// castagnoli is the CRC32C table; it is never written after creation.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// timerPrefix starts the names under which timer queues are snapshot.
const timerPrefix = "_timers/"

// stateMeta is what a snapshot records about a state besides its entries.
type stateMeta struct {
	name   string
	kind   kind
	ttl    bool
	types  string
	codecs string
}

// metaOf returns the snapshot metadata of s.
func metaOf(s *spec) stateMeta {
	return stateMeta{name: s.name, kind: s.kind, ttl: s.ttl.TTL > 0, types: s.types, codecs: s.codecNames()}
}

// rawRecords is a run of encoded records.
type rawRecords struct {
	count int
	data  []byte
}

// recordWriter collects the records of one state in one key group. key and
// val are scratch buffers for whoever builds a record.
type recordWriter struct {
	rawRecords
	key, val []byte
}

// add appends a record.
func (w *recordWriter) add(key, val []byte) {
	w.data = binary.AppendUvarint(w.data, uint64(len(key)))
	w.data = append(w.data, key...)
	w.data = binary.AppendUvarint(w.data, uint64(len(val)))
	w.data = append(w.data, val...)
	w.count++
}

func (w *recordWriter) reset() {
	w.data = w.data[:0]
	w.count = 0
}

// appendHeader appends the stream header of a snapshot of key groups r
// holding the states cat.
func appendHeader(dst []byte, r keygroup.Range, cat []stateMeta) []byte {
	start := len(dst)
	dst = append(dst, snapshotMagic...)
	dst = binary.BigEndian.AppendUint16(dst, snapshotVersion)
	dst = binary.BigEndian.AppendUint16(dst, uint16(r.Start))
	dst = binary.BigEndian.AppendUint16(dst, uint16(r.End))
	dst = binary.BigEndian.AppendUint16(dst, 0)
	lenAt := len(dst)
	dst = append(dst, 0, 0, 0, 0)
	dst = binary.AppendUvarint(dst, uint64(len(cat)))
	for i := range cat {
		m := &cat[i]
		dst = appendString(dst, m.name)
		var flags byte
		if m.ttl {
			flags |= 1
		}
		dst = append(dst, byte(m.kind), flags)
		dst = appendString(dst, m.types)
		dst = appendString(dst, m.codecs)
	}
	binary.BigEndian.PutUint32(dst[lenAt:], uint32(len(dst)-lenAt-4))
	return binary.BigEndian.AppendUint32(dst, crc32.Checksum(dst[start:], castagnoli))
}

// header is what a stream's header says.
type header struct {
	groups keygroup.Range
	// cat is the catalogue of states.
	cat []stateMeta
	// len is the header's length: the offset of the first section.
	len int64
}

// readHeader reads and checks the header of the stream r.
func readHeader(r io.ReaderAt) (*header, error) {
	fixed := make([]byte, headerLen)
	if err := readFull(r, fixed, 0); err != nil {
		return nil, err
	}
	if string(fixed[:4]) != snapshotMagic {
		return nil, fmt.Errorf("%w: bad magic %q", ErrCorruptSnapshot, fixed[:4])
	}
	n := int64(binary.BigEndian.Uint32(fixed[12:]))
	if n > maxSectionLen {
		return nil, fmt.Errorf("%w: catalogue of %d bytes", ErrCorruptSnapshot, n)
	}
	b, err := readRun(r, fixed, headerLen, n+headerTailLen)
	if err != nil {
		return nil, err
	}
	body := b[:len(b)-headerTailLen]
	if crc32.Checksum(body, castagnoli) != binary.BigEndian.Uint32(b[len(body):]) {
		return nil, fmt.Errorf("%w: header checksum mismatch", ErrCorruptSnapshot)
	}
	if v := binary.BigEndian.Uint16(b[4:]); v != snapshotVersion {
		return nil, fmt.Errorf("%w: version %d, this build reads %d", ErrSnapshotVersion, v, snapshotVersion)
	}
	h := &header{
		groups: keygroup.Range{Start: int(binary.BigEndian.Uint16(b[6:])), End: int(binary.BigEndian.Uint16(b[8:]))},
		len:    int64(len(b)),
	}
	if h.groups.End < h.groups.Start {
		return nil, fmt.Errorf("%w: key groups %v", ErrCorruptSnapshot, h.groups)
	}
	p := parser{b: body[headerLen:]}
	count := p.count()
	names := make(map[string]bool, count)
	for i := 0; i < count && p.err == nil; i++ {
		var m stateMeta
		m.name = string(p.bytes())
		m.kind = kind(p.byte())
		flags := p.byte()
		m.ttl = flags&1 != 0
		m.types = string(p.bytes())
		m.codecs = string(p.bytes())
		if p.err == nil && (m.name == "" || names[m.name] || flags > 1 || !m.kind.keyed()) {
			p.err = fmt.Errorf("state %q of kind %d, flags %#x", m.name, m.kind, flags)
		}
		names[m.name] = true
		h.cat = append(h.cat, m)
	}
	if p.err == nil && len(p.b) != 0 {
		p.err = fmt.Errorf("%d bytes after the catalogue", len(p.b))
	}
	if p.err != nil {
		return nil, fmt.Errorf("%w: catalogue: %v", ErrCorruptSnapshot, p.err)
	}
	return h, nil
}

// sectionWriter builds one section.
type sectionWriter struct {
	buf     []byte
	nstates int
	states  []byte
}

func (s *sectionWriter) reset() {
	s.nstates = 0
	s.states = s.states[:0]
}

// addState appends the records of the state of catalogue index i.
func (s *sectionWriter) addState(i int, recs *rawRecords) {
	b := binary.AppendUvarint(s.states, uint64(i))
	b = binary.AppendUvarint(b, uint64(recs.count))
	b = binary.AppendUvarint(b, uint64(len(recs.data)))
	s.states = append(b, recs.data...)
	s.nstates++
}

// finish returns the section of key group g; it is valid until the next
// reset.
func (s *sectionWriter) finish(g int) []byte {
	b := append(s.buf[:0], 0, 0, 0, 0)
	b = binary.BigEndian.AppendUint16(b, uint16(g))
	b = binary.AppendUvarint(b, uint64(s.nstates))
	b = append(b, s.states...)
	binary.BigEndian.PutUint32(b, uint32(len(b)-sectionHeadLen))
	b = binary.BigEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
	s.buf = b
	return b
}

// sectionState is one state as a section holds it.
type sectionState struct {
	meta    stateMeta
	records rawRecords
}

// parseSection checks the section sec, which should be of key group g,
// and returns its states, described by the catalogue cat. The records
// alias sec.
func parseSection(sec []byte, g int, cat []stateMeta) ([]sectionState, error) {
	if len(sec) < sectionHeadLen+sectionTailLen {
		return nil, fmt.Errorf("%w: key group %d: section of %d bytes", ErrCorruptSnapshot, g, len(sec))
	}
	body := sec[:len(sec)-sectionTailLen]
	if n := binary.BigEndian.Uint32(body); int64(n) != int64(len(body)-sectionHeadLen) {
		return nil, fmt.Errorf("%w: key group %d: section length %d, extent holds %d", ErrCorruptSnapshot, g, n, len(body)-sectionHeadLen)
	}
	if crc32.Checksum(body, castagnoli) != binary.BigEndian.Uint32(sec[len(body):]) {
		return nil, fmt.Errorf("%w: key group %d: section checksum mismatch", ErrCorruptSnapshot, g)
	}
	if got := int(binary.BigEndian.Uint16(body[4:])); got != g {
		return nil, fmt.Errorf("%w: section of key group %d where %d was expected", ErrCorruptSnapshot, got, g)
	}
	p := parser{b: body[sectionHeadLen:]}
	n := p.count()
	seen := make(map[uint64]bool, n)
	var states []sectionState
	for i := 0; i < n && p.err == nil; i++ {
		idx := p.uvarint()
		var s sectionState
		s.records.count = p.count()
		s.records.data = p.bytes()
		if p.err != nil {
			break
		}
		if idx >= uint64(len(cat)) || seen[idx] {
			p.err = fmt.Errorf("state index %d of %d", idx, len(cat))
			break
		}
		seen[idx] = true
		s.meta = cat[idx]
		if err := forEachRecord(s.records, func(_, _ []byte) error { return nil }); err != nil {
			return nil, fmt.Errorf("key group %d, state %q: %w", g, s.meta.name, err)
		}
		states = append(states, s)
	}
	if p.err == nil && len(p.b) != 0 {
		p.err = fmt.Errorf("%d bytes after the last state", len(p.b))
	}
	if p.err != nil {
		return nil, fmt.Errorf("%w: key group %d: %v", ErrCorruptSnapshot, g, p.err)
	}
	return states, nil
}

// keyed reports whether k is a kind a keyed snapshot holds.
func (k kind) keyed() bool {
	return k >= kindValue && k <= kindAggregating || k == kindTimers
}

// forEachRecord calls fn with the key and value of every record of r, in
// order, and stops at the first error. The slices alias r.data.
func forEachRecord(r rawRecords, fn func(key, val []byte) error) error {
	p := parser{b: r.data}
	for i := 0; i < r.count; i++ {
		k := p.bytes()
		v := p.bytes()
		if p.err != nil {
			return fmt.Errorf("%w: record %d of %d: %v", ErrCorruptSnapshot, i, r.count, p.err)
		}
		if err := fn(k, v); err != nil {
			return err
		}
	}
	if len(p.b) != 0 {
		return fmt.Errorf("%w: %d bytes after %d records", ErrCorruptSnapshot, len(p.b), r.count)
	}
	return nil
}

// parser reads the fields of a section. The first error sticks, and every
// later read returns zero values.
type parser struct {
	b   []byte
	err error
}

var errTruncated = errors.New("truncated")

func (p *parser) uvarint() uint64 {
	if p.err != nil {
		return 0
	}
	v, n := binary.Uvarint(p.b)
	if n <= 0 {
		p.err = errTruncated
		return 0
	}
	p.b = p.b[n:]
	return v
}

// count reads a record count, which cannot exceed the bytes left (a record
// takes at least two).
func (p *parser) count() int {
	v := p.uvarint()
	if v > uint64(len(p.b)) {
		p.err = fmt.Errorf("count %d exceeds the %d bytes left", v, len(p.b))
		return 0
	}
	return int(v)
}

func (p *parser) byte() byte {
	if p.err != nil {
		return 0
	}
	if len(p.b) == 0 {
		p.err = errTruncated
		return 0
	}
	c := p.b[0]
	p.b = p.b[1:]
	return c
}

// bytes reads a length-prefixed run of bytes, aliasing the input.
func (p *parser) bytes() []byte {
	n := p.uvarint()
	if p.err != nil {
		return nil
	}
	if n > uint64(len(p.b)) {
		p.err = errTruncated
		return nil
	}
	b := p.b[:n:n]
	p.b = p.b[n:]
	return b
}

func appendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

func appendBytes(dst, b []byte) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(b)))
	return append(dst, b...)
}

// ReadKeyGroupOffsets scans the snapshot stream r of size bytes and
// returns where its sections lie, for a reader that lost the offsets
// Offsets returned. It checks the header and the section framing, not the
// checksums of the sections (Restore does).
func ReadKeyGroupOffsets(r io.ReaderAt, size int64) (KeyGroupOffsets, error) {
	h, err := readHeader(r)
	if err != nil {
		return nil, err
	}
	out := make(KeyGroupOffsets)
	var head [sectionHeadLen]byte
	prev := -1
	for off := h.len; off < size; {
		if err := readFull(r, head[:], off); err != nil {
			return nil, err
		}
		n := int64(binary.BigEndian.Uint32(head[:])) + sectionHeadLen + sectionTailLen
		g := int(binary.BigEndian.Uint16(head[4:]))
		if n > maxSectionLen || off+n > size || g <= prev || !h.groups.Contains(g) {
			return nil, fmt.Errorf("%w: section at offset %d: key group %d, %d bytes", ErrCorruptSnapshot, off, g, n)
		}
		out[g] = Extent{Offset: off, Length: n}
		off += n
		prev = g
	}
	return out, nil
}

// readChunk is how much readRun reads at a time.
const readChunk = 1 << 20

// readRun appends the n bytes at off to dst. It reads a chunk at a time,
// so that a corrupt length allocates no more than the stream holds.
func readRun(r io.ReaderAt, dst []byte, off, n int64) ([]byte, error) {
	for n > 0 {
		c := min(n, readChunk)
		start := len(dst)
		dst = append(dst, make([]byte, c)...)
		if err := readFull(r, dst[start:], off); err != nil {
			return nil, err
		}
		off += c
		n -= c
	}
	return dst, nil
}

// readFull reads len(b) bytes at off. A stream that ends too early is
// corrupt; other read errors are returned as they are, wrapped.
func readFull(r io.ReaderAt, b []byte, off int64) error {
	n, err := r.ReadAt(b, off)
	if n == len(b) {
		return nil
	}
	if err == nil || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%w: stream ends before %d bytes at offset %d", ErrCorruptSnapshot, len(b), off)
	}
	return fmt.Errorf("state: reading %d bytes of snapshot at offset %d: %w", len(b), off, err)
}
