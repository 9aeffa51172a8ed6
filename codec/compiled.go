package codec

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"unsafe"
)

// compiled is the codec of a type without a hand-written codec: it runs the
// plan compiled for the type once by Compile.
type compiled[T any] struct {
	pl *plan
}

// Append appends the encoding of v to dst.
func (c compiled[T]) Append(dst []byte, v T) ([]byte, error) {
	out, err := c.pl.append(dst, noescape(unsafe.Pointer(&v)), 0)
	runtime.KeepAlive(&v) // v, and what it points to, stay live while the plan reads them
	if err != nil {
		return dst, err
	}
	return out, nil
}

// appendAll appends the encodings of vs, one after the other; a struct of
// scalars' with appendFlat (its strings with e's numbering when e is not
// nil), another struct's with encStruct called directly, not through the
// plan's func value.
func (c compiled[T]) appendAll(dst []byte, vs []T, e *DictEncoder) ([]byte, error) {
	pl := c.pl
	if pl.flat != nil && e != nil {
		return appendFlatDict(dst, pl.flat, unsafe.Pointer(unsafe.SliceData(vs)), len(vs), pl.size, e), nil
	}
	if pl.flat != nil {
		for i := range vs {
			dst = appendFlat(dst, pl.flat, unsafe.Pointer(&vs[i]))
		}
		return dst, nil
	}
	strct := pl.op == opPlan && pl.isStrct
	for i := range vs {
		var err error
		if strct {
			dst, err = pl.encStruct(dst, unsafe.Pointer(&vs[i]), 0)
		} else {
			dst, err = pl.append(dst, unsafe.Pointer(&vs[i]), 0)
		}
		if err != nil {
			return dst, fmt.Errorf("batch value %d: %w", i, err)
		}
	}
	return dst, nil
}

// Decode decodes one value from the front of src.
func (c compiled[T]) Decode(src []byte) (T, int, error) {
	var v T
	n, err := c.pl.decode(src, noescape(unsafe.Pointer(&v)), 0)
	if err != nil {
		var zero T
		return zero, 0, err
	}
	return v, n, nil
}

// noescape hides p from escape analysis. The plan functions are called
// through func values, so without it the compiler would move every value
// passed to Append, and the value Decode fills, to the heap: one
// allocation per record. That is safe because nothing a plan does keeps p
// or a pointer derived from it after it returns: plans read and write
// through p, copy values out before handing them to a method that might
// keep its receiver, and never store p in a heap object. The runtime and
// strings.Builder use the same trick; this form of it passes go vet.
func noescape(p unsafe.Pointer) unsafe.Pointer {
	x := uintptr(p)
	return *(*unsafe.Pointer)(unsafe.Pointer(&x))
}

// encFunc appends the encoding of the value at p to dst. depth counts the
// pointers, slices and maps above the value.
type encFunc func(dst []byte, p unsafe.Pointer, depth int) ([]byte, error)

// decFunc decodes from the front of src into the value at p, writing every
// byte of it that the encoding covers, and returns the bytes consumed.
type decFunc func(src []byte, p unsafe.Pointer, depth int) (int, error)

// plan is the compiled codec of one type. Scalar plans have an op and no
// funcs; the others have op opPlan and funcs. A plan is immutable once
// compiled.
type plan struct {
	op     opKind
	enc    encFunc
	dec    decFunc
	fields []field // a struct's fields, nested structs flattened
	// flat is set when the plan is a struct whose fields are all
	// scalars: their ops and offsets, for appendFlat and a Decoder.
	flat []flatField
	// flatWhole is set when flat's fields are all of the struct's bytes.
	flatWhole bool
	// size is the size in memory of a value of the type.
	size    uintptr
	isStrct bool
	minSize int // bytes in the shortest encoding of any value
}

// field is one encoded field of a struct, at offset off from its start.
type field struct {
	name string
	off  uintptr
	pl   *plan
}

// append appends the encoding of the value at p.
func (pl *plan) append(dst []byte, p unsafe.Pointer, depth int) ([]byte, error) {
	if pl.op != opPlan {
		return appendScalar(pl.op, dst, p), nil
	}
	return pl.enc(dst, p, depth)
}

// decode decodes the front of src into the value at p.
func (pl *plan) decode(src []byte, p unsafe.Pointer, depth int) (int, error) {
	if pl.op != opPlan {
		return decodeScalar(pl.op, src, p)
	}
	return pl.dec(src, p, depth)
}

// encStruct appends the fields of the struct at p in order.
func (pl *plan) encStruct(dst []byte, p unsafe.Pointer, depth int) ([]byte, error) {
	fields := pl.fields // a local: the calls below would make pl.fields reload
	for i := range fields {
		f := &fields[i]
		if f.pl.op != opPlan {
			dst = appendScalar(f.pl.op, dst, unsafe.Add(p, f.off))
			continue
		}
		var err error
		dst, err = f.pl.enc(dst, unsafe.Add(p, f.off), depth)
		if err != nil {
			return dst, wrapField(f.name, err)
		}
	}
	return dst, nil
}

// flatField is one field of a struct of scalars: its op and its offset.
type flatField struct {
	op  opKind
	off uintptr
}

// flatFields returns the fields of the struct plan pl if they are all
// scalars, and nil otherwise.
func flatFields(pl *plan) []flatField {
	if !pl.isStrct || len(pl.fields) == 0 {
		return nil
	}
	fs := make([]flatField, len(pl.fields))
	for i, f := range pl.fields {
		if f.pl.op == opPlan {
			return nil
		}
		fs[i] = flatField{op: f.pl.op, off: f.off}
	}
	return fs
}

// appendFlat appends the struct of scalars at p, whose fields are fs, as
// encStruct does: a string, an int64 and a float64 encoded inline,
// anything else by appendScalar. Scalars cannot fail to encode.
func appendFlat(dst []byte, fs []flatField, p unsafe.Pointer) []byte {
	for _, f := range fs {
		q := unsafe.Add(p, f.off)
		switch f.op {
		case opString:
			s := *(*string)(q)
			if len(s) < 0x80 {
				dst = append(dst, byte(len(s)))
			} else {
				dst = binary.AppendUvarint(dst, uint64(len(s)))
			}
			dst = append(dst, s...)
		case opInt64:
			dst = binary.AppendVarint(dst, *(*int64)(q))
		case opFloat64:
			dst = binary.LittleEndian.AppendUint64(dst, *(*uint64)(q))
		default:
			dst = appendScalar(f.op, dst, q)
		}
	}
	return dst
}

// appendFlatDict appends the n structs of scalars of the given size laid
// end to end from first, whose fields are fs, as appendFlat does but for two
// things (AppendBatchDict). A string is written with e's numbering, a
// number e's address table knows inline. After the first value, an int64
// is written as its difference from the value before's: timestamps and
// counters of one batch mostly differ by little, and a short varint is
// read and written faster than a long one.
func appendFlatDict(dst []byte, fs []flatField, first unsafe.Pointer, n int, size uintptr, e *DictEncoder) []byte {
	var prev unsafe.Pointer
	for i := range n {
		p := unsafe.Add(first, uintptr(i)*size) // never past the last: checkptr
		for _, f := range fs {
			q := unsafe.Add(p, f.off)
			switch f.op {
			case opString:
				s := *(*string)(q)
				if e.ptrs != nil && len(s) > 0 && len(s) <= dictMaxLen {
					if id, ok := e.known(s); ok {
						dst = appendTag(dst, uint64(id)<<1|1)
						continue
					}
				}
				dst = e.AppendString(dst, s)
			case opInt64:
				v := *(*int64)(q)
				if prev != nil {
					v -= *(*int64)(unsafe.Add(prev, f.off)) // wraps: the decoder's sum wraps back
				}
				dst = binary.AppendVarint(dst, v)
			case opFloat64:
				dst = binary.LittleEndian.AppendUint64(dst, *(*uint64)(q))
			default:
				dst = appendScalar(f.op, dst, q)
			}
		}
		prev = p
	}
	return dst
}

// decStruct decodes the fields of the struct at p in order.
func (pl *plan) decStruct(src []byte, p unsafe.Pointer, depth int) (int, error) {
	fields := pl.fields // as in encStruct
	off := 0
	for i := range fields {
		f := &fields[i]
		var n int
		var err error
		if f.pl.op != opPlan {
			n, err = decodeScalar(f.pl.op, src[off:], unsafe.Add(p, f.off))
		} else {
			n, err = f.pl.dec(src[off:], unsafe.Add(p, f.off), depth)
		}
		if err != nil {
			return 0, err
		}
		off += n
	}
	return off, nil
}
