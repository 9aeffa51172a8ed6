package codec

import (
	"fmt"
	"hash/maphash"
	"slices"
	"unsafe"
)

// Decoder decodes values of T with a codec, one stream of them after
// another, reusing what it can from one value to the next: a short string
// equal to one it decoded recently is returned again rather than allocated
// anew, and a struct of scalars and strings compiled by For is decoded in
// place, in one loop, without a call through the Codec interface per
// value. Decoded values are exactly those the codec's Decode returns, and
// decoding is as strict; a returned string may be shared with values
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
	// flat is set when pl is a struct whose fields are all scalars: a
	// copy of pl whose string fields decode with intern.
	flat *plan
	// str is set when T is string and c its built-in codec.
	str bool
	// intern decodes a string, interning it in strs.
	intern decFunc
	strs   *internTable
}

// NewDecoder returns a decoder of values encoded with c.
func NewDecoder[T any](c Codec[T]) *Decoder[T] {
	d := &Decoder[T]{c: c}
	d.intern = internString(&d.strs)
	switch cc := any(c).(type) {
	case compiled[T]:
		d.pl = cc.pl
		if isFlat(cc.pl) {
			d.flat = withStrings(cc.pl, d.intern)
		}
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
	start := len(dst)
	if n < 0 || n > len(src) {
		// Every value takes at least one byte (AppendBatch's rule): a
		// larger count is corrupt, and must not size an allocation.
		return dst, 0, fmt.Errorf("%w: %d values in %d bytes", ErrShort, n, len(src))
	}
	dst = slices.Grow(dst, n)[:start+n] // grows ahead, as append does
	off := 0
	var zero T
	for i := start; i < start+n; i++ {
		dst[i] = zero
		k, err := d.decodeInto(src[off:], &dst[i])
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

// decodeInto decodes one value into *v, which is zero.
func (d *Decoder[T]) decodeInto(src []byte, v *T) (int, error) {
	switch {
	case d.flat != nil:
		return d.flat.decStruct(src, unsafe.Pointer(v), 0)
	case d.pl != nil:
		return d.pl.decode(src, unsafe.Pointer(v), 0)
	case d.str:
		return d.intern(src, unsafe.Pointer(v), 0)
	}
	var err error
	var n int
	*v, n, err = d.c.Decode(src)
	return n, err
}

// isFlat reports whether pl is a struct whose fields are all scalars.
func isFlat(pl *plan) bool {
	if !pl.isStrct {
		return false
	}
	for _, f := range pl.fields {
		if f.pl.op == opPlan {
			return false
		}
	}
	return true
}

// withStrings returns a copy of the struct plan pl whose string fields
// decode with dec. The copy only decodes: it has no enc.
func withStrings(pl *plan, dec decFunc) *plan {
	str := &plan{dec: dec, minSize: 1}
	cp := &plan{fields: slices.Clone(pl.fields), isStrct: true, minSize: pl.minSize}
	for i := range cp.fields {
		if cp.fields[i].pl.op == opString {
			cp.fields[i].pl = str
		}
	}
	cp.dec = cp.decStruct
	return cp
}

// internString returns a decFunc that decodes a length-prefixed string
// into the string at p, interning it in *strs, which it allocates on the
// first string it interns. It is a closure, not a method value, which
// would cost a call more per string.
func internString(strs **internTable) decFunc {
	return func(src []byte, p unsafe.Pointer, _ int) (int, error) {
		b, n, err := readPrefixed(src)
		if err != nil {
			return 0, err
		}
		s := (*string)(p)
		if len(b) == 0 {
			*s = ""
			return n, nil
		}
		if len(b) > internMaxLen {
			*s = string(b)
			return n, nil
		}
		if *strs == nil {
			*strs = &internTable{seed: maphash.MakeSeed()}
		}
		*s = (*strs).get(b)
		return n, nil
	}
}

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
	seed maphash.Seed
	next uint32 // the slot, within its set, the next miss replaces
	sets [internSlots / internWays]internSet
}

type internSet struct {
	tags [internWays]uint32
	strs [internWays]string
}

// get returns a string of the bytes b: one held, or a new one, then held.
func (t *internTable) get(b []byte) string {
	h := maphash.Bytes(t.seed, b)
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
