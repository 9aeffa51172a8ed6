package codec

import (
	"encoding/binary"
	"fmt"
	"math"
	"reflect"
	"unsafe"
)

// sliceHeader is the runtime layout of a slice.
type sliceHeader struct {
	data unsafe.Pointer
	len  int
	cap  int
}

// emptyBacking is where decoded empty, non-nil slices point.
var emptyBacking [0]byte

// fillArray compiles the array type t: its elements in order, no length.
// Arrays of a byte kind are copied as raw bytes.
func (c *compiler) fillArray(pl *plan, t reflect.Type) error {
	elem, err := c.compile(t.Elem())
	if err != nil {
		return fmt.Errorf("array element: %w", err)
	}
	n, size := t.Len(), t.Elem().Size()
	pl.minSize = n * elem.minSize
	if elem.op == opUint8 {
		pl.minSize = n
		pl.enc = func(dst []byte, p unsafe.Pointer, _ int) ([]byte, error) {
			return append(dst, unsafe.Slice((*byte)(p), n)...), nil
		}
		pl.dec = func(src []byte, p unsafe.Pointer, _ int) (int, error) {
			if len(src) < n {
				return 0, errShortFixed
			}
			copy(unsafe.Slice((*byte)(p), n), src)
			return n, nil
		}
		return nil
	}
	pl.enc = func(dst []byte, p unsafe.Pointer, depth int) ([]byte, error) {
		return appendElems(elem, dst, p, n, size, depth)
	}
	pl.dec = func(src []byte, p unsafe.Pointer, depth int) (int, error) {
		return decodeElems(elem, src, p, n, size, depth)
	}
	return nil
}

// appendElems appends the n elements of size size starting at p.
func appendElems(elem *plan, dst []byte, p unsafe.Pointer, n int, size uintptr, depth int) ([]byte, error) {
	if elem.minSize == 0 {
		return dst, nil // the elements carry no data
	}
	for i := range n {
		var err error
		dst, err = elem.append(dst, unsafe.Add(p, uintptr(i)*size), depth)
		if err != nil {
			return dst, err
		}
	}
	return dst, nil
}

// decodeElems decodes n elements of size size into memory starting at p.
func decodeElems(elem *plan, src []byte, p unsafe.Pointer, n int, size uintptr, depth int) (int, error) {
	if elem.minSize == 0 {
		return 0, nil
	}
	off := 0
	for i := range n {
		k, err := elem.decode(src[off:], unsafe.Add(p, uintptr(i)*size), depth)
		if err != nil {
			return 0, err
		}
		off += k
	}
	return off, nil
}

// fillSlice compiles the slice type t: a uvarint of the length plus one (0
// for nil), then the elements. Slices of a byte kind are copied as raw
// bytes.
func (c *compiler) fillSlice(pl *plan, t reflect.Type) error {
	elem, err := c.compile(t.Elem())
	if err != nil {
		return fmt.Errorf("slice element: %w", err)
	}
	size := t.Elem().Size()
	if elem.minSize == 0 && size > 0 {
		// A corrupt length could then claim gigabytes from a few bytes.
		return fmt.Errorf("%w: elements of %v take memory but encode to nothing", ErrUnsupported, t)
	}
	pl.minSize = 1
	pl.enc = func(dst []byte, p unsafe.Pointer, depth int) ([]byte, error) {
		h := (*sliceHeader)(p)
		if h.data == nil {
			return append(dst, 0), nil
		}
		if depth >= maxDepth {
			return dst, errEncodeDepth
		}
		dst = binary.AppendUvarint(dst, uint64(h.len)+1)
		if elem.op == opUint8 {
			return append(dst, unsafe.Slice((*byte)(h.data), h.len)...), nil
		}
		return appendElems(elem, dst, h.data, h.len, size, depth+1)
	}
	pl.dec = func(src []byte, p unsafe.Pointer, depth int) (int, error) {
		u, n, err := readUvarint(src)
		if err != nil {
			return 0, err
		}
		h := (*sliceHeader)(p)
		if u == 0 {
			*h = sliceHeader{}
			return n, nil
		}
		if depth >= maxDepth {
			return 0, errDepth
		}
		l, err := sliceLen(u-1, len(src)-n, elem.minSize)
		if err != nil {
			return 0, err
		}
		if l == 0 {
			*h = sliceHeader{data: unsafe.Pointer(&emptyBacking)}
			return n, nil
		}
		if elem.op == opUint8 {
			b := make([]byte, l)
			copy(b, src[n:])
			*h = sliceHeader{data: unsafe.Pointer(&b[0]), len: l, cap: l}
			return n + l, nil
		}
		// Grow allocates a zeroed, correctly typed backing array in place:
		// one allocation, where MakeSlice would take two.
		*h = sliceHeader{}
		sv := reflect.NewAt(t, p).Elem()
		sv.Grow(l)
		sv.SetLen(l)
		k, err := decodeElems(elem, src[n:], h.data, l, size, depth+1)
		if err != nil {
			*h = sliceHeader{}
			return 0, err
		}
		return n + k, nil
	}
	return nil
}

// sliceLen checks a decoded element count against the bytes left: each
// element takes at least min bytes. Zero-sized elements (min 0) take no
// memory either, so any count that fits an int is accepted.
func sliceLen(count uint64, left, min int) (int, error) {
	if min == 0 {
		if count > math.MaxInt32 {
			return 0, fmt.Errorf("%w: %d empty elements", ErrCorrupt, count)
		}
		return int(count), nil
	}
	if count > uint64(left/min) {
		return 0, errShortElems
	}
	return int(count), nil
}

// fillPointer compiles the pointer type t: a byte 0 for nil, or 1 and the
// pointee. Decoding allocates the pointee.
func (c *compiler) fillPointer(pl *plan, t reflect.Type) error {
	et := t.Elem()
	elem, err := c.compile(et)
	if err != nil {
		return fmt.Errorf("pointee: %w", err)
	}
	pl.minSize = 1
	pl.enc = func(dst []byte, p unsafe.Pointer, depth int) ([]byte, error) {
		ptr := *(*unsafe.Pointer)(p)
		if ptr == nil {
			return append(dst, 0), nil
		}
		if depth >= maxDepth {
			return dst, errEncodeDepth
		}
		return elem.append(append(dst, 1), ptr, depth+1)
	}
	pl.dec = func(src []byte, p unsafe.Pointer, depth int) (int, error) {
		if len(src) < 1 {
			return 0, errShortFixed
		}
		switch src[0] {
		case 0:
			*(*unsafe.Pointer)(p) = nil
			return 1, nil
		case 1:
		default:
			return 0, errPointerTag
		}
		if depth >= maxDepth {
			return 0, errDepth
		}
		ptr := reflect.New(et).UnsafePointer()
		n, err := elem.decode(src[1:], ptr, depth+1)
		if err != nil {
			return 0, err
		}
		*(*unsafe.Pointer)(p) = ptr
		return 1 + n, nil
	}
	return nil
}
