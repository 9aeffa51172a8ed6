package codec

import (
	"encoding/binary"
	"math"
	"reflect"
	"unsafe"
)

// opKind says how a scalar plan encodes its value; opPlan means the plan's
// funcs do.
type opKind uint8

// The scalar ops, one per reflect.Kind they encode.
const (
	opPlan opKind = iota
	opBool
	opInt
	opInt8
	opInt16
	opInt32
	opInt64
	opUint
	opUint8
	opUint16
	opUint32
	opUint64
	opUintptr
	opFloat32
	opFloat64
	opComplex64
	opComplex128
	opString
)

// scalarOp returns the op of kind k and the size of its shortest
// encoding, or false if values of kind k are not scalars.
func scalarOp(k reflect.Kind) (opKind, int, bool) {
	switch k {
	case reflect.Bool:
		return opBool, 1, true
	case reflect.Int:
		return opInt, 1, true
	case reflect.Int8:
		return opInt8, 1, true
	case reflect.Int16:
		return opInt16, 1, true
	case reflect.Int32:
		return opInt32, 1, true
	case reflect.Int64:
		return opInt64, 1, true
	case reflect.Uint:
		return opUint, 1, true
	case reflect.Uint8:
		return opUint8, 1, true
	case reflect.Uint16:
		return opUint16, 1, true
	case reflect.Uint32:
		return opUint32, 1, true
	case reflect.Uint64:
		return opUint64, 1, true
	case reflect.Uintptr:
		return opUintptr, 1, true
	case reflect.Float32:
		return opFloat32, 4, true
	case reflect.Float64:
		return opFloat64, 8, true
	case reflect.Complex64:
		return opComplex64, 8, true
	case reflect.Complex128:
		return opComplex128, 16, true
	case reflect.String:
		return opString, 1, true
	}
	return opPlan, 0, false
}

// appendScalar appends the encoding of the scalar of kind op at p.
func appendScalar(op opKind, dst []byte, p unsafe.Pointer) []byte {
	switch op {
	case opBool:
		return appendBool(dst, *(*bool)(p))
	case opInt:
		return binary.AppendVarint(dst, int64(*(*int)(p)))
	case opInt8:
		return binary.AppendVarint(dst, int64(*(*int8)(p)))
	case opInt16:
		return binary.AppendVarint(dst, int64(*(*int16)(p)))
	case opInt32:
		return binary.AppendVarint(dst, int64(*(*int32)(p)))
	case opInt64:
		return binary.AppendVarint(dst, *(*int64)(p))
	case opUint:
		return binary.AppendUvarint(dst, uint64(*(*uint)(p)))
	case opUint8:
		return binary.AppendUvarint(dst, uint64(*(*uint8)(p)))
	case opUint16:
		return binary.AppendUvarint(dst, uint64(*(*uint16)(p)))
	case opUint32:
		return binary.AppendUvarint(dst, uint64(*(*uint32)(p)))
	case opUint64:
		return binary.AppendUvarint(dst, *(*uint64)(p))
	case opUintptr:
		return binary.AppendUvarint(dst, uint64(*(*uintptr)(p)))
	case opFloat32:
		return appendFloat32(dst, *(*float32)(p))
	case opFloat64:
		return appendFloat64(dst, *(*float64)(p))
	case opComplex64:
		c := *(*complex64)(p)
		return appendFloat32(appendFloat32(dst, real(c)), imag(c))
	case opComplex128:
		c := *(*complex128)(p)
		return appendFloat64(appendFloat64(dst, real(c)), imag(c))
	case opString:
		s := *(*string)(p)
		dst = binary.AppendUvarint(dst, uint64(len(s)))
		return append(dst, s...)
	}
	panic("codec: appendScalar of non-scalar op") // unreachable: plans are built by compile
}

// decodeScalar decodes the scalar of kind op from the front of src into p.
func decodeScalar(op opKind, src []byte, p unsafe.Pointer) (int, error) {
	switch op {
	case opBool:
		b, n, err := readBool(src)
		*(*bool)(p) = b
		return n, err
	case opInt, opInt8, opInt16, opInt32, opInt64:
		return decodeSigned(op, src, p)
	case opUint, opUint8, opUint16, opUint32, opUint64, opUintptr:
		return decodeUnsigned(op, src, p)
	case opFloat32:
		f, n, err := readFloat32(src)
		*(*float32)(p) = f
		return n, err
	case opFloat64:
		f, n, err := readFloat64(src)
		*(*float64)(p) = f
		return n, err
	case opComplex64:
		if len(src) < 8 {
			return 0, errShortFixed
		}
		re, _, _ := readFloat32(src)
		im, _, _ := readFloat32(src[4:])
		*(*complex64)(p) = complex(re, im)
		return 8, nil
	case opComplex128:
		if len(src) < 16 {
			return 0, errShortFixed
		}
		re, _, _ := readFloat64(src)
		im, _, _ := readFloat64(src[8:])
		*(*complex128)(p) = complex(re, im)
		return 16, nil
	case opString:
		s, n, err := readString(src)
		*(*string)(p) = s
		return n, err
	}
	panic("codec: decodeScalar of non-scalar op") // unreachable: plans are built by compile
}

// decodeSigned decodes a zig-zag varint into the signed integer of kind op
// at p, rejecting values that do not fit.
func decodeSigned(op opKind, src []byte, p unsafe.Pointer) (int, error) {
	v, n, err := readVarint(src)
	if err != nil {
		return 0, err
	}
	switch op {
	case opInt:
		if int64(int(v)) != v {
			return 0, errRange
		}
		*(*int)(p) = int(v)
	case opInt8:
		if v < math.MinInt8 || v > math.MaxInt8 {
			return 0, errRange
		}
		*(*int8)(p) = int8(v)
	case opInt16:
		if v < math.MinInt16 || v > math.MaxInt16 {
			return 0, errRange
		}
		*(*int16)(p) = int16(v)
	case opInt32:
		if v < math.MinInt32 || v > math.MaxInt32 {
			return 0, errRange
		}
		*(*int32)(p) = int32(v)
	default:
		*(*int64)(p) = v
	}
	return n, nil
}

// decodeUnsigned decodes a uvarint into the unsigned integer of kind op at
// p, rejecting values that do not fit.
func decodeUnsigned(op opKind, src []byte, p unsafe.Pointer) (int, error) {
	v, n, err := readUvarint(src)
	if err != nil {
		return 0, err
	}
	switch op {
	case opUint:
		if uint64(uint(v)) != v {
			return 0, errRange
		}
		*(*uint)(p) = uint(v)
	case opUint8:
		if v > math.MaxUint8 {
			return 0, errRange
		}
		*(*uint8)(p) = uint8(v)
	case opUint16:
		if v > math.MaxUint16 {
			return 0, errRange
		}
		*(*uint16)(p) = uint16(v)
	case opUint32:
		if v > math.MaxUint32 {
			return 0, errRange
		}
		*(*uint32)(p) = uint32(v)
	case opUintptr:
		if uint64(uintptr(v)) != v {
			return 0, errRange
		}
		*(*uintptr)(p) = uintptr(v)
	default:
		*(*uint64)(p) = v
	}
	return n, nil
}
