package codec

import (
	"fmt"
	"reflect"
	"sync"
)

// Codec encodes and decodes values of type T. Implementations are stateless
// and safe for concurrent use by any number of goroutines; neither method
// blocks.
type Codec[T any] interface {
	// Append appends the encoding of v to dst and returns the extended
	// slice. On error it returns dst with its original length.
	Append(dst []byte, v T) ([]byte, error)
	// Decode decodes one value from the front of src and returns it with
	// the number of bytes consumed. It never panics on bad input; it
	// returns an error wrapping ErrCorrupt (or ErrShort for truncated
	// input). The value never aliases src.
	Decode(src []byte) (T, int, error)
}

// For returns the default codec for T. It is Compile without the error: it
// panics, naming T and the reason, if T cannot be encoded (it has a channel,
// func, interface or unsafe pointer in it, or an unexported field not tagged
// `codec:"-"`). Call it once, when a job is built, and keep the codec.
//
// The choice, in order:
//   - bool, int, int8..int64, uint, uint8..uint64, uintptr, float32,
//     float64, string and []byte get the hand-written codecs of this package
//     (Bool, Int, Int64, Uint64, Float64, String, Bytes and their kin);
//   - time.Time is encoded as its Unix time in nanoseconds (see Compile);
//   - a type whose value implements encoding.BinaryAppender or
//     encoding.BinaryMarshaler, or whose pointer does, and whose pointer
//     implements encoding.BinaryUnmarshaler, is encoded by those methods,
//     length-prefixed, as by Binary;
//   - anything else gets a codec compiled once per type (see Compile).
func For[T any]() Codec[T] {
	c, err := Compile[T]()
	if err != nil {
		panic(fmt.Sprintf("codec.For[%v]: %v", reflect.TypeFor[T](), err))
	}
	return c
}

// Compile returns the default codec for T, as For does, or an error wrapping
// ErrUnsupported if T cannot be encoded.
//
// Types other than the built-in ones are compiled with reflect, once per
// type; per record the codec walks precomputed field offsets and calls no
// reflect function for scalars, strings and nested structs of them. The
// encoding of a compiled type is:
//   - integers as varints (zig-zag for signed), float32 and float64 as 4 and
//     8 little-endian bytes of their IEEE 754 bits, complex numbers as two
//     floats, bool as one byte 0 or 1, strings as a uvarint length and the
//     bytes;
//   - structs as their exported fields in declaration order, with nested
//     structs inline; fields tagged `codec:"-"` and blank (_) fields are
//     skipped; any other unexported field is an error;
//   - arrays as their elements; slices and maps as a uvarint of their
//     length plus one (0 is nil) and the elements, map entries sorted by the
//     bytes of their encoded keys so that equal maps encode identically;
//   - pointers as a byte 0 (nil) or 1 followed by the pointee; pointer
//     identity and sharing are not kept, and a cyclic value is an error;
//   - time.Time as a zig-zag varint of UnixNano, decoded in UTC; the zero
//     time is kept; location and monotonic reading are dropped; times
//     outside the years 1678 to 2262 are an encoding error;
//   - binary marshalers (see For) as a uvarint length and their bytes.
//
// Decoding is strict: every value has one encoding, and a decoded value
// re-encodes to exactly the bytes it was decoded from (binary marshalers
// aside, whose formats are their own).
func Compile[T any]() (Codec[T], error) {
	if c, ok := builtin[T](); ok {
		return c, nil
	}
	t := reflect.TypeFor[T]()
	pl, err := cachedPlan(t)
	if err != nil {
		return nil, fmt.Errorf("compile %v: %w", t, err)
	}
	return compiled[T]{pl: pl}, nil
}

// planResult is a compiled plan or the reason a type has none.
type planResult struct {
	pl  *plan
	err error
}

// plans caches compiled plans by reflect.Type. Plans are immutable once
// stored, so sharing them between goroutines and jobs is safe; the cache
// only saves compiling a type twice.
var plans sync.Map // reflect.Type -> planResult

// cachedPlan returns the plan for t, compiling it on first use.
func cachedPlan(t reflect.Type) (*plan, error) {
	if r, ok := plans.Load(t); ok {
		r := r.(planResult)
		return r.pl, r.err
	}
	pl, err := newCompiler().compile(t)
	r, _ := plans.LoadOrStore(t, planResult{pl: pl, err: err})
	res := r.(planResult)
	return res.pl, res.err
}
