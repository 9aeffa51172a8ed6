package codec

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"unsafe"
)

// Dictionary coding of a stream of batches. A channel carries the same
// short strings again and again (sensor ids, keys, names): its sender
// numbers each the first time it sends it, and sends the number after
// that; its receiver numbers the strings in the order they came, so both
// ends hold the same numbering without ever sending it. It applies to the
// batches of a type whose strings the Decoder reads inline (a struct of
// scalars, or a string with the built-in codec; see AppendBatchDict);
// batches of any other type are those AppendBatch writes.
//
// In a dictionary-coded batch a string is one uvarint tag: odd, the
// string numbered tag>>1; even, tag>>1 bytes of string that follow. A
// string sent inline of 1 to dictMaxLen bytes is numbered next, while
// fewer than dictEntries are numbered; both ends apply that rule, so that
// a sender may send a numbered string inline again (it is then numbered
// twice) and neither end needs to tell the other.
//
// The numbering is the stream's, so the batches must be decoded in the
// order they were encoded, each once, every one of them: a batch lost,
// repeated or decoded by another receiver gives other strings or an error
// (ErrCorrupt for a number not given yet). A batch encoded and then not
// sent is taken back with DictEncoder.Rollback.
const (
	// dictEntries bounds the strings one stream numbers: up to 4096
	// strings of at most dictMaxLen bytes kept by each end, in tables of
	// about 250 KiB at most at either end.
	dictEntries = 4096
	dictMaxLen  = internMaxLen
	// dictMaxPtrs bounds the encoder's table of string addresses, and
	// dictWays is the slots a string's address may take in it.
	dictMaxPtrs = 2 * dictEntries
	dictWays    = 4
	// dictProbe and dictSkip pace the look-ups by content once every
	// number is given (DictEncoder.lookUp).
	dictProbe = 1024
	dictSkip  = 64 * dictProbe
)

// DictEncoder is the sending end's numbering of one stream of batches. Its
// zero value is an empty numbering. Not safe for concurrent use.
type DictEncoder struct {
	// n is the count of strings numbered.
	n int
	// ids numbers the strings by content.
	ids map[string]uint32
	// ptrs is a dictWays-way set-associative table of the strings last sent,
	// by the address of their bytes: a record that shares its string
	// with one sent before (a key from a fixed set, a decoded field the
	// decoder interned) is looked up without hashing its bytes. A slot
	// holds a pointer to the string's bytes, so they stay alive and their
	// address cannot be another string's while the slot holds it.
	ptrs []dictPtr
	// shift is 64 minus the bits of an index of ptrs.
	shift uint8
	// Once every number is given, a stream of strings that are not
	// numbered (ids that never repeat) would pay a look-up by content
	// for each to no avail: looked counts the look-ups of the current
	// round of dictProbe, missed those that found nothing, and skip the
	// strings still sent without a look-up after a round that mostly
	// missed.
	looked, missed, skip int
}

// dictPtr is a slot of DictEncoder.ptrs: a string by the address and
// length of its bytes (the pointer keeps them alive), and its number. An
// empty slot has a nil p.
type dictPtr struct {
	p  unsafe.Pointer
	n  uint32
	id uint32
}

// Len returns the count of strings numbered: a mark for Rollback.
func (e *DictEncoder) Len() int { return e.n }

// Rollback forgets the strings numbered since Len returned mark: the
// batches that numbered them were not sent.
func (e *DictEncoder) Rollback(mark int) {
	if mark < 0 || mark >= e.n {
		return
	}
	for s, id := range e.ids {
		if int(id) >= mark {
			delete(e.ids, s)
		}
	}
	for i := range e.ptrs {
		if int(e.ptrs[i].id) >= mark {
			e.ptrs[i] = dictPtr{}
		}
	}
	e.n = mark
}

// ptrSet returns the slots of s's address in e.ptrs, which is not empty.
func (e *DictEncoder) ptrSet(s string) *[dictWays]dictPtr {
	// Fibonacci hashing: the top bits of the product.
	h := uint64(uintptr(unsafe.Pointer(unsafe.StringData(s)))) * 0x9e3779b97f4a7c15
	i := int(h>>e.shift) &^ (dictWays - 1)
	return (*[dictWays]dictPtr)(e.ptrs[i : i+dictWays])
}

// known returns the number of s when the address table holds its bytes.
// The table must not be empty (nil before the first number).
func (e *DictEncoder) known(s string) (uint32, bool) {
	set, data := e.ptrSet(s), unsafe.Pointer(unsafe.StringData(s))
	for i := range set {
		if p := &set[i]; p.p == data && p.n == uint32(len(s)) {
			return p.id, true
		}
	}
	return 0, false
}

// remember puts s, numbered id, in the first slot of its set, the others
// moving one slot down and the last one's string out.
func (e *DictEncoder) remember(s string, id uint32) {
	set := e.ptrSet(s)
	copy(set[1:], set[:dictWays-1])
	set[0] = dictPtr{p: unsafe.Pointer(unsafe.StringData(s)), n: uint32(len(s)), id: id}
}

// AppendString appends s as a dictionary-coded string, numbering it if it
// is new: for a DictCoder's AppendDict.
func (e *DictEncoder) AppendString(dst []byte, s string) []byte {
	if len(s) == 0 || len(s) > dictMaxLen {
		return appendInline(dst, s)
	}
	if e.ptrs != nil {
		if id, ok := e.known(s); ok {
			return appendTag(dst, uint64(id)<<1|1)
		}
	}
	if e.n >= dictEntries && !e.lookUp() {
		return appendInline(dst, s)
	}
	id, ok := e.ids[s]
	if !ok {
		if e.n >= dictEntries {
			e.missed++
			return appendInline(dst, s)
		}
		id = uint32(e.n)
		e.n++
		if e.ids == nil {
			e.ids = make(map[string]uint32)
		}
		e.ids[s] = id
		e.growPtrs()
		e.remember(s, id)
		return appendInline(dst, s)
	}
	e.remember(s, id)
	return appendTag(dst, uint64(id)<<1|1)
}

// lookUp reports whether a string the address table missed is looked up
// by content, once every number is given: in rounds of dictProbe
// look-ups, and after a round in which fewer than one in eight found a
// number, not for the next dictSkip strings.
func (e *DictEncoder) lookUp() bool {
	if e.skip > 0 {
		e.skip--
		return false
	}
	if e.looked == dictProbe {
		if e.missed > dictProbe-dictProbe/8 {
			e.skip = dictSkip
		}
		e.looked, e.missed = 0, 0
		if e.skip > 0 {
			return false
		}
	}
	e.looked++
	return true
}

// growPtrs keeps e.ptrs at least four times the strings numbered, up to
// dictMaxPtrs slots, so that few strings sent often share a set; a new
// table starts empty (misses look the strings up by content and fill it
// again).
func (e *DictEncoder) growPtrs() {
	switch {
	case e.ptrs == nil:
		e.ptrs = make([]dictPtr, 64)
	case 4*e.n > len(e.ptrs) && len(e.ptrs) < dictMaxPtrs:
		e.ptrs = make([]dictPtr, 2*len(e.ptrs))
	default:
		return
	}
	e.shift = uint8(64 - bits.TrailingZeros(uint(len(e.ptrs))))
}

// appendInline appends s's bytes after an even tag.
func appendInline(dst []byte, s string) []byte {
	dst = appendTag(dst, uint64(len(s))<<1)
	return append(dst, s...)
}

func appendTag(dst []byte, tag uint64) []byte {
	switch {
	case tag < 0x80:
		return append(dst, byte(tag))
	case tag < 0x4000:
		return append(dst, byte(tag)|0x80, byte(tag>>7))
	}
	return binary.AppendUvarint(dst, tag)
}

// DictDecoder is the receiving end's numbering of one stream of batches.
// Its zero value is an empty numbering. Not safe for concurrent use.
type DictDecoder struct {
	strs []string
}

// DictCoder is implemented, through a pointer, by a type that encodes
// itself on a channel with the channel's numbering of strings (a type
// with a binary marshaler of its own, whose strings the codec cannot
// see): AppendBatchDict calls AppendDict and AppendNDict calls
// DecodeDict instead of the type's codec. DecodeDict decodes into a zero
// value from the front of src, reading every string with r, and returns
// the bytes consumed; an error wraps ErrCorrupt or ErrShort.
type DictCoder interface {
	AppendDict(dst []byte, e *DictEncoder) []byte
	DecodeDict(src []byte, r DictReader) (int, error)
}

// isDictCoder reports whether *T implements DictCoder.
func isDictCoder[T any]() bool {
	_, ok := any((*T)(nil)).(DictCoder)
	return ok
}

// DictReader reads the strings a DictCoder's AppendDict wrote with
// DictEncoder.AppendString, with a Decoder's numbering of its channel.
type DictReader struct {
	strs **internTable
	dd   *DictDecoder
}

// String decodes the string at the front of src and returns it with the
// bytes consumed.
func (r DictReader) String(src []byte) (string, int, error) {
	var s string
	n, err := readDictString(r.strs, r.dd, src, &s)
	return s, n, err
}

// dictString decodes a dictionary-coded string into *s.
func (d *Decoder[T]) dictString(src []byte, s *string, dd *DictDecoder) (int, error) {
	return readDictString(&d.strs, dd, src, s)
}

// shortTag reads the tag at the front of src when it takes one byte, or
// two: the number of a string of a numbering past 63, or a string of 64
// bytes and more. It returns the tag and its bytes, 0 for a tag it does
// not read (longer, short of bytes, or a second byte of zero: a
// non-minimal encoding, which readUvarint refuses).
func shortTag(src []byte) (uint64, int) {
	switch {
	case len(src) > 0 && src[0] < 0x80:
		return uint64(src[0]), 1
	case len(src) > 1 && src[1] < 0x80 && src[1] != 0:
		return uint64(src[0]&0x7f) | uint64(src[1])<<7, 2
	}
	return 0, 0
}

// readDictString decodes a dictionary-coded string into *s, interning a
// string sent whole in *strs, which it allocates on the first one.
func readDictString(strs **internTable, dd *DictDecoder, src []byte, s *string) (int, error) {
	tag, k := shortTag(src)
	if k == 0 {
		var err error
		if tag, k, err = readUvarint(src); err != nil {
			return 0, err
		}
	}
	if tag&1 == 1 {
		id := tag >> 1
		if id >= uint64(len(dd.strs)) {
			return 0, fmt.Errorf("%w: string %d of a dictionary of %d", ErrCorrupt, id, len(dd.strs))
		}
		*s = dd.strs[id]
		return k, nil
	}
	l := tag >> 1
	n, err := internBytes(strs, src, k, l, s)
	if err == nil && l > 0 && l <= dictMaxLen && len(dd.strs) < dictEntries {
		dd.strs = append(dd.strs, *s)
	}
	return n, err
}

// AppendBatchDict appends vs as AppendBatch does, the strings of a struct
// of scalars (For's codec of a struct whose fields are all scalars and
// strings) or of a string (the built-in String codec) coded with e's
// numbering, which it extends; e must not be nil. The int64 fields of a
// struct of scalars are written, after the batch's first value, as their
// differences from the value before's (wrapping: any values round-trip).
// A type whose pointer
// is a DictCoder is appended by its AppendDict. For any other type it
// is AppendBatch, and e is unused. Decoder.AppendNDict decodes it. On
// error it returns dst with its original length (and e may have numbered
// strings of the values before the failing one: Rollback).
func AppendBatchDict[T any](c Codec[T], e *DictEncoder, dst []byte, vs []T) ([]byte, error) {
	return appendBatch(c, e, dst, vs)
}

// AppendNDict is AppendN for n values written by AppendBatchDict (after
// its count) with the numbering that dd holds, which it extends.
func (d *Decoder[T]) AppendNDict(dst []T, src []byte, n int, dd *DictDecoder) ([]T, int, error) {
	if dd == nil {
		dd = new(DictDecoder)
	}
	return d.appendN(dst, src, n, dd)
}
