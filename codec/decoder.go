package codec

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"slices"
	"unsafe"
)

// Decoder decodes values of T with a codec, one stream of them after
// another, reusing what it can from one value to the next: a short string
// equal to one it decoded recently is returned again rather than allocated
// anew, and a struct of scalars and strings compiled by For is decoded in
// place, in one loop over its fields with the common encodings decoded
// inline, without a call through the Codec interface or a plan function
// per value. Decoded values are exactly those the codec's Decode returns,
// and decoding is as strict; a returned string may be shared with values
// decoded before (strings are immutable, so no value can tell).
//
// A Decoder keeps up to internSlots strings of at most internMaxLen bytes
// each, about 200 KiB at most, allocated on the first string it interns.
//
// Not safe for concurrent use: one goroutine (a receiving task) owns it.
type Decoder[T any] struct {
	c Codec[T]
	// pl is the plan of a compiled codec, nil for any other.
	pl *plan
	// flat is set when pl is a struct whose fields are all scalars: its
	// fields, in order.
	flat []flatField
	// whole is set when flat's fields are every byte of a T: decoding
	// them all overwrites a value, which need not be zeroed first.
	whole bool
	// str is set when T is string and c its built-in codec.
	str  bool
	strs *internTable
	// coder is set when *T is a DictCoder.
	coder bool
}

// NewDecoder returns a decoder of values encoded with c.
func NewDecoder[T any](c Codec[T]) *Decoder[T] {
	d := &Decoder[T]{c: c, coder: isDictCoder[T]()}
	switch cc := any(c).(type) {
	case compiled[T]:
		d.pl = cc.pl
		d.flat, d.whole = cc.pl.flat, cc.pl.flatWhole
	case StringCodec:
		d.str = true
	}
	return d
}

// Decode decodes one value from the front of src and returns it with the
// number of bytes consumed, as the codec's Decode does.
func (d *Decoder[T]) Decode(src []byte) (T, int, error) {
	var v T
	// noescape: as in compiled.Decode, v would otherwise move to the
	// heap, one allocation per value.
	n, err := d.decodeInto(src, (*T)(noescape(unsafe.Pointer(&v))))
	if err != nil {
		var zero T
		return zero, 0, err
	}
	return v, n, nil
}

// AppendN decodes n values laid end to end at the front of src, appending
// them to dst, and returns dst and the bytes consumed. On error it returns
// dst with its original length (the slots past it cleared) and the
// error, naming the value that failed.
func (d *Decoder[T]) AppendN(dst []T, src []byte, n int) ([]T, int, error) {
	return d.appendN(dst, src, n, nil)
}

// appendN is AppendN, or AppendNDict when dd is not nil.
func (d *Decoder[T]) appendN(dst []T, src []byte, n int, dd *DictDecoder) ([]T, int, error) {
	start := len(dst)
	if n < 0 || n > len(src) {
		// Every value takes at least one byte (AppendBatch's rule): a
		// larger count is corrupt, and must not size an allocation.
		return dst, 0, fmt.Errorf("%w: %d values in %d bytes", ErrShort, n, len(src))
	}
	dst = slices.Grow(dst, n)[:start+n] // grows ahead, as append does
	coder := dd != nil && d.coder
	flat := d.flat != nil && !coder
	if flat && dd != nil {
		return d.appendFlatDict(dst, src, start, dd)
	}
	off := 0
	var zero T
	str := d.str && dd != nil
	for i := start; i < start+n; i++ {
		dst[i] = zero
		var k int
		var err error
		switch {
		case coder:
			k, err = any(&dst[i]).(DictCoder).DecodeDict(src[off:], DictReader{strs: &d.strs, dd: dd})
		case flat:
			k, err = d.decFlat(src[off:], unsafe.Pointer(&dst[i]))
		case str:
			k, err = d.dictString(src[off:], (*string)(unsafe.Pointer(&dst[i])), dd)
		default:
			k, err = d.decodeInto(src[off:], &dst[i])
		}
		if err == nil && (k < 0 || k > len(src)-off) {
			err = fmt.Errorf("%w: codec consumed %d of %d bytes", ErrCorrupt, k, len(src)-off)
		}
		if err != nil {
			clear(dst[start : i+1])
			return dst[:start], 0, fmt.Errorf("value %d: %w", i-start, err)
		}
		off += k
	}
	return dst, off, nil
}

// appendFlatDict is appendN for a struct of scalars and a numbering
// (AppendNDict): the values dst[start:] decoded from src in one loop over
// them and their fields, as decFlat decodes each but for two things. A
// string is decoded with dd's numbering, a number of one or two bytes
// (the common case) inline; an int64 after the first value is the
// difference from the value before's, as appendFlatDict wrote it.
func (d *Decoder[T]) appendFlatDict(dst []T, src []byte, start int, dd *DictDecoder) ([]T, int, error) {
	fs, strs := d.flat, dd.strs
	off := 0
	var prev unsafe.Pointer
	for i := start; i < len(dst); i++ {
		if !d.whole {
			var zero T
			dst[i] = zero
		}
		p := unsafe.Pointer(&dst[i])
		var err error
		for _, f := range fs {
			q := unsafe.Add(p, f.off)
			switch f.op {
			case opString:
				// A number of one or two bytes, read inline.
				if tag, k := shortTag(src[off:]); tag&1 == 1 && tag>>1 < uint64(len(strs)) {
					*(*string)(q) = strs[tag>>1]
					off += k
					continue
				}
				var k int
				if k, err = readDictString(&d.strs, dd, src[off:], (*string)(q)); err == nil {
					strs = dd.strs // it may have numbered one more
					off += k
				}
			case opInt64:
				var base int64
				if prev != nil {
					base = *(*int64)(unsafe.Add(prev, f.off))
				}
				if v, ok := oneByteVarint(src[off:]); ok {
					*(*int64)(q) = base + v
					off++
					continue
				}
				var v int64
				var k int
				if v, k, err = readVarint(src[off:]); err == nil {
					*(*int64)(q) = base + v
					off += k
				}
			case opFloat64:
				if len(src)-off < 8 {
					err = errShortFixed
					break
				}
				*(*uint64)(q) = binary.LittleEndian.Uint64(src[off:])
				off += 8
			default:
				var k int
				if k, err = decodeScalar(f.op, src[off:], q); err == nil {
					off += k
				}
			}
			if err != nil {
				break
			}
		}
		if err != nil {
			clear(dst[start : i+1])
			return dst[:start], 0, fmt.Errorf("value %d: %w", i-start, err)
		}
		prev = p
	}
	return dst, off, nil
}

// decodeInto decodes one value into *v, which is zero.
func (d *Decoder[T]) decodeInto(src []byte, v *T) (int, error) {
	switch {
	case d.flat != nil:
		return d.decFlat(src, unsafe.Pointer(v))
	case d.pl != nil:
		return d.pl.decode(src, unsafe.Pointer(v), 0)
	case d.str:
		return d.internInto(src, (*string)(unsafe.Pointer(v)))
	}
	var err error
	var n int
	*v, n, err = d.c.Decode(src)
	return n, err
}

// decFlat decodes the struct of scalars at p, field by field, as the
// plan's decStruct does: the same values, bytes consumed and errors. A
// string is interned; a one-byte varint and a float64 are decoded inline,
// anything else by decodeScalar.
func (d *Decoder[T]) decFlat(src []byte, p unsafe.Pointer) (int, error) {
	off := 0
	for _, f := range d.flat {
		q := unsafe.Add(p, f.off)
		rest := src[off:]
		var n int
		var err error
		switch f.op {
		case opString:
			n, err = d.internInto(rest, (*string)(q))
		case opInt64:
			if v, ok := oneByteVarint(rest); ok {
				*(*int64)(q) = v
				off++
				continue
			}
			var v int64
			if v, n, err = readVarint(rest); err == nil {
				*(*int64)(q) = v
			}
		case opFloat64:
			if len(rest) < 8 {
				return 0, errShortFixed
			}
			*(*uint64)(q) = binary.LittleEndian.Uint64(rest)
			off += 8
			continue
		default:
			n, err = decodeScalar(f.op, rest, q)
		}
		if err != nil {
			return 0, err
		}
		off += n
	}
	return off, nil
}

// internInto decodes a length-prefixed string into *s, interning it in
// d.strs, which it allocates on the first string it interns.
func (d *Decoder[T]) internInto(src []byte, s *string) (int, error) {
	l, k := uint64(0), 1
	if len(src) > 0 && src[0] < 0x80 {
		l = uint64(src[0])
	} else {
		var err error
		if l, k, err = readUvarint(src); err != nil {
			return 0, err
		}
	}
	return internBytes(&d.strs, src, k, l, s)
}

// internBytes decodes the l bytes after the first k of src into *s,
// interned in *strs (allocated on the first string it interns) when they
// are 1 to internMaxLen bytes, and returns the bytes consumed, k+l.
func internBytes(strs **internTable, src []byte, k int, l uint64, s *string) (int, error) {
	if l > uint64(len(src)-k) {
		return 0, errShortBytes
	}
	n := k + int(l)
	b := src[k:n]
	switch {
	case len(b) == 0:
		*s = ""
	case len(b) > internMaxLen:
		*s = string(b)
	default:
		if *strs == nil {
			*strs = newInternTable()
		}
		*s = (*strs).get(b)
	}
	return n, nil
}

func newInternTable() *internTable { return &internTable{seed: rand.Uint64()} }

// internSlots is the number of strings an internTable keeps, and
// internMaxLen the longest it keeps: keys, ids and names, not payloads.
const (
	internSlots  = 4096
	internWays   = 4
	internMaxLen = 32
)

// internTable holds recently decoded strings, four-way set associative:
// a string's hash picks a set of four slots, and a tag of the hash's
// other bits in each slot spares comparing the strings that cannot match.
// A set's tags and strings share its cache lines. A miss replaces the
// slots of a set in turn.
type internTable struct {
	seed uint64
	next uint32 // the slot, within its set, the next miss replaces
	sets [internSlots / internWays]internSet
}

type internSet struct {
	tags [internWays]uint32
	strs [internWays]string
}

// get returns a string of the bytes b: one held, or a new one, then held.
func (t *internTable) get(b []byte) string {
	h := hashShort(t.seed, b)
	set := &t.sets[int(h)&(len(t.sets)-1)]
	tag := uint32(h>>32) | 1 // never 0, an empty slot's tag
	for i := range set.tags {
		if set.tags[i] == tag && set.strs[i] == string(b) {
			return set.strs[i]
		}
	}
	s := string(b)
	i := t.next % internWays
	t.next++
	set.tags[i], set.strs[i] = tag, s
	return s
}

// hashShort hashes b, of 1 to internMaxLen bytes, with seed: a few
// overlapping word loads mixed by 128-bit multiplication, as wyhash does
// for short inputs, inline instead of through the runtime's hash of any
// length. Every byte of b reaches the result.
func hashShort(seed uint64, b []byte) uint64 {
	const (
		m1 = 0xa0761d6478bd642f
		m2 = 0xe7037ed1a0b428db
		m3 = 0x8ebc6af09c88c6e3
	)
	n := len(b)
	var x, y uint64
	switch {
	case n >= 17:
		seed = mix(binary.LittleEndian.Uint64(b)^m2, binary.LittleEndian.Uint64(b[8:])^seed)
		x = binary.LittleEndian.Uint64(b[n-16:])
		y = binary.LittleEndian.Uint64(b[n-8:])
	case n >= 8:
		x = binary.LittleEndian.Uint64(b)
		y = binary.LittleEndian.Uint64(b[n-8:])
	case n >= 4:
		x = uint64(binary.LittleEndian.Uint32(b))
		y = uint64(binary.LittleEndian.Uint32(b[n-4:]))
	default:
		x = uint64(b[0])<<16 | uint64(b[n>>1])<<8 | uint64(b[n-1])
	}
	return mix(m3^uint64(n), mix(x^m2, y^seed^m1))
}

// mix folds the 128-bit product of x and y into 64 bits.
func mix(x, y uint64) uint64 {
	hi, lo := bits.Mul64(x, y)
	return hi ^ lo
}
