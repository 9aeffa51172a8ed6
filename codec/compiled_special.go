package codec

import (
	"encoding"
	"encoding/binary"
	"fmt"
	"math"
	"reflect"
	"time"
	"unsafe"
)

// The Unix seconds of the times whose UnixNano fits in an int64, rounded
// inward to whole seconds.
const (
	minTimeSec = -9223372036
	maxTimeSec = 9223372035
)

// zeroTimeNanos stands for the zero time.Time, whose UnixNano is undefined.
const zeroTimeNanos = math.MinInt64

// encTime appends the time.Time at p as a zig-zag varint of its UnixNano.
func encTime(dst []byte, p unsafe.Pointer, _ int) ([]byte, error) {
	t := (*time.Time)(p)
	if t.IsZero() {
		return binary.AppendVarint(dst, zeroTimeNanos), nil
	}
	if s := t.Unix(); s < minTimeSec || s > maxTimeSec {
		return dst, fmt.Errorf("%w: time %v is outside the int64 nanosecond range", ErrUnsupported, *t)
	}
	return binary.AppendVarint(dst, t.UnixNano()), nil
}

// decTime decodes a time written by encTime, in UTC.
func decTime(src []byte, p unsafe.Pointer, _ int) (int, error) {
	v, n, err := readVarint(src)
	if err != nil {
		return 0, err
	}
	t := (*time.Time)(p)
	switch {
	case v == zeroTimeNanos:
		*t = time.Time{}
	case v < minTimeSec*1e9 || v > maxTimeSec*1e9+999_999_999:
		return 0, errRange
	default:
		*t = time.Unix(0, v).UTC()
	}
	return n, nil
}

// The interfaces that make a type a binary marshaler.
var (
	appenderType    = reflect.TypeFor[encoding.BinaryAppender]()
	marshalerType   = reflect.TypeFor[encoding.BinaryMarshaler]()
	unmarshalerType = reflect.TypeFor[encoding.BinaryUnmarshaler]()
)

// marshalPlan encodes a type through its binary marshaling methods.
type marshalPlan struct {
	t reflect.Type
	// valueRecv is set when the value type has the encoding method, so
	// calling it through a pointer copies the value first.
	valueRecv bool
	// appender is set when the method is AppendBinary, not MarshalBinary.
	appender bool
}

// marshalerOf returns the marshal plan of t if *t implements
// encoding.BinaryUnmarshaler and t or *t implements
// encoding.BinaryAppender or encoding.BinaryMarshaler.
func marshalerOf(t reflect.Type) (*marshalPlan, bool) {
	pt := reflect.PointerTo(t)
	if t.Kind() == reflect.Interface || !pt.Implements(unmarshalerType) {
		return nil, false
	}
	m := &marshalPlan{t: t}
	switch {
	case t.Implements(appenderType):
		m.valueRecv, m.appender = true, true
	case t.Implements(marshalerType):
		m.valueRecv = true
	case pt.Implements(appenderType):
		m.appender = true
	case pt.Implements(marshalerType):
	default:
		return nil, false
	}
	return m, true
}

// receiver returns the value at p as a pointer to call the encoding method
// on. A method with a pointer receiver gets a heap copy: it could keep its
// receiver, and p may point into a stack.
func (m *marshalPlan) receiver(p unsafe.Pointer) any {
	if m.valueRecv {
		return reflect.NewAt(m.t, p).Interface()
	}
	h := reflect.New(m.t)
	h.Elem().Set(reflect.NewAt(m.t, p).Elem())
	return h.Interface()
}

// enc appends the value at p, length-prefixed.
func (m *marshalPlan) enc(dst []byte, p unsafe.Pointer, _ int) ([]byte, error) {
	return appendMarshaled(dst, m.receiver(p), m.appender)
}

// dec decodes a length-prefixed value into p through UnmarshalBinary.
func (m *marshalPlan) dec(src []byte, p unsafe.Pointer, _ int) (int, error) {
	b, n, err := readPrefixed(src)
	if err != nil {
		return 0, err
	}
	h := reflect.New(m.t)
	if err := h.Interface().(encoding.BinaryUnmarshaler).UnmarshalBinary(b); err != nil {
		return 0, fmt.Errorf("%w: %v: %w", ErrCorrupt, m.t, err)
	}
	reflect.NewAt(m.t, p).Elem().Set(h.Elem())
	return n, nil
}

// appendMarshaled appends the binary encoding of recv, length-prefixed,
// calling AppendBinary if appender is set and MarshalBinary otherwise.
func appendMarshaled(dst []byte, recv any, appender bool) ([]byte, error) {
	if appender {
		start := len(dst)
		out, err := recv.(encoding.BinaryAppender).AppendBinary(append(dst, 0))
		if err != nil {
			return dst, err
		}
		return prefixFrom(out, start), nil
	}
	b, err := recv.(encoding.BinaryMarshaler).MarshalBinary()
	if err != nil {
		return dst, err
	}
	return appendPrefixed(dst, b), nil
}
