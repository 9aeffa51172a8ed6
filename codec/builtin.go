package codec

import "encoding/binary"

// Signed is the set of signed integer types IntCodec encodes.
type Signed interface {
	~int | ~int8 | ~int16 | ~int32 | ~int64
}

// Unsigned is the set of unsigned integer types UintCodec encodes.
type Unsigned interface {
	~uint | ~uint8 | ~uint16 | ~uint32 | ~uint64 | ~uintptr
}

// IntCodec encodes a signed integer as a zig-zag varint (1 byte for -64 to
// 63, at most 10). Decoding rejects values out of the range of T.
type IntCodec[T Signed] struct{}

// Append appends the zig-zag varint of v.
func (IntCodec[T]) Append(dst []byte, v T) ([]byte, error) {
	return binary.AppendVarint(dst, int64(v)), nil
}

// Decode decodes a zig-zag varint that fits in T.
func (IntCodec[T]) Decode(src []byte) (T, int, error) {
	v, n, err := readVarint(src)
	if err != nil {
		return 0, 0, err
	}
	if int64(T(v)) != v {
		return 0, 0, errRange
	}
	return T(v), n, nil
}

// UintCodec encodes an unsigned integer as a uvarint (1 byte below 128, at
// most 10). Decoding rejects values out of the range of T.
type UintCodec[T Unsigned] struct{}

// Append appends the uvarint of v.
func (UintCodec[T]) Append(dst []byte, v T) ([]byte, error) {
	return binary.AppendUvarint(dst, uint64(v)), nil
}

// Decode decodes a uvarint that fits in T.
func (UintCodec[T]) Decode(src []byte) (T, int, error) {
	v, n, err := readUvarint(src)
	if err != nil {
		return 0, 0, err
	}
	if uint64(T(v)) != v {
		return 0, 0, errRange
	}
	return T(v), n, nil
}

// Float64Codec encodes a float64 as the 8 little-endian bytes of its IEEE
// 754 bits; every bit pattern, NaN payloads included, round-trips.
type Float64Codec struct{}

// Append appends the 8 bytes of v.
func (Float64Codec) Append(dst []byte, v float64) ([]byte, error) {
	return appendFloat64(dst, v), nil
}

// Decode decodes 8 bytes.
func (Float64Codec) Decode(src []byte) (float64, int, error) {
	return readFloat64(src)
}

// Float32Codec encodes a float32 as the 4 little-endian bytes of its IEEE
// 754 bits.
type Float32Codec struct{}

// Append appends the 4 bytes of v.
func (Float32Codec) Append(dst []byte, v float32) ([]byte, error) {
	return appendFloat32(dst, v), nil
}

// Decode decodes 4 bytes.
func (Float32Codec) Decode(src []byte) (float32, int, error) {
	return readFloat32(src)
}

// BoolCodec encodes a bool as one byte, 0 or 1; decoding rejects any other
// byte.
type BoolCodec struct{}

// Append appends 0 or 1.
func (BoolCodec) Append(dst []byte, v bool) ([]byte, error) {
	return appendBool(dst, v), nil
}

// Decode decodes one byte, 0 or 1.
func (BoolCodec) Decode(src []byte) (bool, int, error) {
	return readBool(src)
}

// StringCodec encodes a string as a uvarint length followed by its bytes,
// which need not be valid UTF-8. Decoding allocates the string (nothing for
// an empty one).
type StringCodec struct{}

// Append appends the length and bytes of v.
func (StringCodec) Append(dst []byte, v string) ([]byte, error) {
	dst = binary.AppendUvarint(dst, uint64(len(v)))
	return append(dst, v...), nil
}

// Decode decodes a length-prefixed string.
func (StringCodec) Decode(src []byte) (string, int, error) {
	return readString(src)
}

// BytesCodec encodes a byte slice as a uvarint length followed by its
// bytes. Decoding copies the bytes out of src; a zero length decodes as a
// nil slice, so nil and empty are not told apart (compiled codecs, which
// encode slices inside structs, do tell them apart).
type BytesCodec struct{}

// Append appends the length and bytes of v.
func (BytesCodec) Append(dst []byte, v []byte) ([]byte, error) {
	return appendPrefixed(dst, v), nil
}

// Decode decodes a length-prefixed byte slice into a new slice.
func (BytesCodec) Decode(src []byte) ([]byte, int, error) {
	b, n, err := readPrefixed(src)
	if err != nil || len(b) == 0 {
		return nil, n, err
	}
	return append([]byte(nil), b...), n, nil
}

// The built-in codecs, usable directly or through For.
var (
	// String is the codec of string.
	String StringCodec
	// Int is the codec of int.
	Int IntCodec[int]
	// Int64 is the codec of int64.
	Int64 IntCodec[int64]
	// Uint64 is the codec of uint64.
	Uint64 UintCodec[uint64]
	// Float64 is the codec of float64.
	Float64 Float64Codec
	// Bool is the codec of bool.
	Bool BoolCodec
	// Bytes is the codec of []byte.
	Bytes BytesCodec
)

// builtin returns the hand-written codec for T if T is one of the
// predeclared scalar types, string or []byte (not a type defined from one).
func builtin[T any]() (Codec[T], bool) {
	var c any
	switch any((*T)(nil)).(type) {
	case *bool:
		c = Bool
	case *int:
		c = Int
	case *int8:
		c = IntCodec[int8]{}
	case *int16:
		c = IntCodec[int16]{}
	case *int32:
		c = IntCodec[int32]{}
	case *int64:
		c = Int64
	case *uint:
		c = UintCodec[uint]{}
	case *uint8:
		c = UintCodec[uint8]{}
	case *uint16:
		c = UintCodec[uint16]{}
	case *uint32:
		c = UintCodec[uint32]{}
	case *uint64:
		c = Uint64
	case *uintptr:
		c = UintCodec[uintptr]{}
	case *float32:
		c = Float32Codec{}
	case *float64:
		c = Float64
	case *string:
		c = String
	case *[]byte:
		c = Bytes
	default:
		return nil, false
	}
	return c.(Codec[T]), true
}
