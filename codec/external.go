package codec

import (
	"bytes"
	"encoding"
	"encoding/gob"
	"encoding/json"
	"fmt"
	"reflect"
	"runtime"
	"unsafe"

	"github.com/fxamacker/cbor/v2"
)

// Binary returns a codec that encodes T through its own methods: AppendBinary
// (encoding.BinaryAppender) if T or *T has it, else MarshalBinary
// (encoding.BinaryMarshaler), and UnmarshalBinary on *T. Each encoding is
// length-prefixed with a uvarint; For picks the same encoding for such
// types. Methods on the value type are best: a method with a pointer
// receiver is called on a heap copy, costing an allocation per record.
// Decoding always allocates the *T it calls UnmarshalBinary on.
//
// Binary panics if neither T nor *T has AppendBinary or MarshalBinary.
func Binary[T any, PT interface {
	*T
	encoding.BinaryUnmarshaler
}]() Codec[T] {
	m, ok := marshalerOf(reflect.TypeFor[T]())
	if !ok {
		panic(fmt.Sprintf("codec.Binary[%v]: neither it nor its pointer has AppendBinary or MarshalBinary",
			reflect.TypeFor[T]()))
	}
	return binaryCodec[T, PT]{valueRecv: m.valueRecv, appender: m.appender}
}

// binaryCodec is the codec Binary returns.
type binaryCodec[T any, PT interface {
	*T
	encoding.BinaryUnmarshaler
}] struct {
	valueRecv, appender bool
}

// Append appends the length-prefixed binary encoding of v.
func (c binaryCodec[T, PT]) Append(dst []byte, v T) ([]byte, error) {
	var recv any
	if c.valueRecv {
		// The method is called through the compiler's pointer wrapper,
		// which copies *p to call the value method and keeps nothing.
		recv = PT(noescape(unsafe.Pointer(&v)))
	} else {
		p := new(T)
		*p = v
		recv = p
	}
	out, err := appendMarshaled(dst, recv, c.appender)
	runtime.KeepAlive(&v)
	return out, err
}

// Decode decodes a length-prefixed value with UnmarshalBinary.
func (binaryCodec[T, PT]) Decode(src []byte) (T, int, error) {
	var zero T
	b, n, err := readPrefixed(src)
	if err != nil {
		return zero, 0, err
	}
	p := PT(new(T))
	if err := p.UnmarshalBinary(b); err != nil {
		return zero, 0, fmt.Errorf("%w: %v: %w", ErrCorrupt, reflect.TypeFor[T](), err)
	}
	return *p, n, nil
}

// CBOR returns a codec that encodes T as CBOR (RFC 8949) with
// github.com/fxamacker/cbor/v2 in its deterministic core mode, each value
// length-prefixed with a uvarint. It suits values that other systems must
// read; within edged, For is faster.
func CBOR[T any]() Codec[T] {
	em, err := cbor.CoreDetEncOptions().EncMode()
	if err != nil {
		panic(fmt.Sprintf("codec.CBOR: %v", err)) // unreachable: the options are constant
	}
	dm, err := cbor.DecOptions{}.DecMode()
	if err != nil {
		panic(fmt.Sprintf("codec.CBOR: %v", err)) // unreachable: the options are constant
	}
	return cborCodec[T]{em: em, dm: dm}
}

// cborCodec is the codec CBOR returns. EncMode and DecMode are safe for
// concurrent use.
type cborCodec[T any] struct {
	em cbor.EncMode
	dm cbor.DecMode
}

// Append appends the length-prefixed CBOR of v.
func (c cborCodec[T]) Append(dst []byte, v T) ([]byte, error) {
	b, err := c.em.Marshal(v)
	if err != nil {
		return dst, fmt.Errorf("%w: cbor: %w", ErrUnsupported, err)
	}
	return appendPrefixed(dst, b), nil
}

// Decode decodes a length-prefixed CBOR value.
func (c cborCodec[T]) Decode(src []byte) (T, int, error) {
	var v T
	b, n, err := readPrefixed(src)
	if err != nil {
		return v, 0, err
	}
	if err := c.dm.Unmarshal(b, &v); err != nil {
		var zero T
		return zero, 0, fmt.Errorf("%w: cbor: %w", ErrCorrupt, err)
	}
	return v, n, nil
}

// Gob returns a codec that encodes each value with a fresh encoding/gob
// encoder, length-prefixed. Gob sends the type description with every
// value, so this is slow and large: it exists to compare against, not to
// use on a record path.
func Gob[T any]() Codec[T] { return gobCodec[T]{} }

// gobCodec is the codec Gob returns.
type gobCodec[T any] struct{}

// Append appends the length-prefixed gob stream of v.
func (gobCodec[T]) Append(dst []byte, v T) ([]byte, error) {
	var buf bytes.Buffer
	if err := gob.NewEncoder(&buf).Encode(&v); err != nil {
		return dst, fmt.Errorf("%w: gob: %w", ErrUnsupported, err)
	}
	return appendPrefixed(dst, buf.Bytes()), nil
}

// Decode decodes a length-prefixed gob stream.
func (gobCodec[T]) Decode(src []byte) (T, int, error) {
	var v T
	b, n, err := readPrefixed(src)
	if err != nil {
		return v, 0, err
	}
	if err := gob.NewDecoder(bytes.NewReader(b)).Decode(&v); err != nil {
		var zero T
		return zero, 0, fmt.Errorf("%w: gob: %w", ErrCorrupt, err)
	}
	return v, n, nil
}

// JSON returns a codec that encodes T with encoding/json, length-prefixed.
// It is several times slower than For and its output larger; use it to
// compare and to debug, when a human must read the bytes. Values round-trip
// only as far as encoding/json keeps them (no NaN, no unexported fields).
func JSON[T any]() Codec[T] { return jsonCodec[T]{} }

// jsonCodec is the codec JSON returns.
type jsonCodec[T any] struct{}

// Append appends the length-prefixed JSON of v.
func (jsonCodec[T]) Append(dst []byte, v T) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return dst, fmt.Errorf("%w: json: %w", ErrUnsupported, err)
	}
	return appendPrefixed(dst, b), nil
}

// Decode decodes a length-prefixed JSON value.
func (jsonCodec[T]) Decode(src []byte) (T, int, error) {
	var v T
	b, n, err := readPrefixed(src)
	if err != nil {
		return v, 0, err
	}
	if err := json.Unmarshal(b, &v); err != nil {
		var zero T
		return zero, 0, fmt.Errorf("%w: json: %w", ErrCorrupt, err)
	}
	return v, n, nil
}
