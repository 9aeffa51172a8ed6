package codec

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"reflect"
	"slices"
	"unsafe"
)

// mapEntry locates one encoded entry in a scratch buffer: the key is
// buf[k:v] and the value buf[v:end].
type mapEntry struct {
	k, v, end int
}

// fillMap compiles the map type t: a uvarint of the length plus one (0 for
// nil), then the entries, key then value, sorted by the bytes of the
// encoded keys. Decoding rejects keys out of that order, so a map has one
// encoding and duplicate keys cannot be smuggled in.
func (c *compiler) fillMap(pl *plan, t reflect.Type) error {
	kt, vt := t.Key(), t.Elem()
	key, err := c.compile(kt)
	if err != nil {
		return fmt.Errorf("map key: %w", err)
	}
	val, err := c.compile(vt)
	if err != nil {
		return fmt.Errorf("map value: %w", err)
	}
	pl.minSize = 1
	pl.enc = func(dst []byte, p unsafe.Pointer, depth int) ([]byte, error) {
		m := *(*unsafe.Pointer)(p)
		if m == nil {
			return append(dst, 0), nil
		}
		if depth >= maxDepth {
			return dst, errEncodeDepth
		}
		// m is a copy of the map pointer, so the reflect.Value below does not
		// refer to the (possibly stack) memory at p.
		mv := reflect.NewAt(t, unsafe.Pointer(&m)).Elem()
		return appendMap(key, val, dst, mv, depth+1)
	}
	pl.dec = func(src []byte, p unsafe.Pointer, depth int) (int, error) {
		u, n, err := readUvarint(src)
		if err != nil {
			return 0, err
		}
		if u == 0 {
			*(*unsafe.Pointer)(p) = nil
			return n, nil
		}
		if depth >= maxDepth {
			return 0, errDepth
		}
		count := u - 1
		if min := key.minSize + val.minSize; min == 0 && count > 1 ||
			min > 0 && count > uint64((len(src)-n)/min) {
			return 0, errShortElems
		}
		mv := reflect.MakeMapWithSize(t, int(count))
		k, err := decodeMap(key, val, src[n:], mv, int(count), depth+1)
		if err != nil {
			return 0, err
		}
		*(*unsafe.Pointer)(p) = mv.UnsafePointer()
		return n + k, nil
	}
	return nil
}

// appendMap appends the length and sorted entries of the map mv.
func appendMap(key, val *plan, dst []byte, mv reflect.Value, depth int) ([]byte, error) {
	n := mv.Len()
	dst = binary.AppendUvarint(dst, uint64(n)+1)
	if n == 0 {
		return dst, nil
	}
	kv := reflect.New(mv.Type().Key()).Elem()
	vv := reflect.New(mv.Type().Elem()).Elem()
	kp, vp := kv.Addr().UnsafePointer(), vv.Addr().UnsafePointer()
	var buf []byte
	entries := make([]mapEntry, 0, n)
	for it := mv.MapRange(); it.Next(); {
		kv.SetIterKey(it)
		vv.SetIterValue(it)
		var e mapEntry
		var err error
		e.k = len(buf)
		if buf, err = key.append(buf, kp, depth); err != nil {
			return dst, fmt.Errorf("map key: %w", err)
		}
		e.v = len(buf)
		if buf, err = val.append(buf, vp, depth); err != nil {
			return dst, fmt.Errorf("map value: %w", err)
		}
		e.end = len(buf)
		entries = append(entries, e)
	}
	slices.SortFunc(entries, func(a, b mapEntry) int {
		return bytes.Compare(buf[a.k:a.v], buf[b.k:b.v])
	})
	for i, e := range entries {
		if i > 0 && bytes.Equal(buf[entries[i-1].k:entries[i-1].v], buf[e.k:e.v]) {
			return dst, fmt.Errorf("%w: two keys of %v encode alike (NaN keys?)", ErrUnsupported, mv.Type())
		}
		dst = append(dst, buf[e.k:e.end]...)
	}
	return dst, nil
}

// decodeMap decodes count entries from src into the empty map mv.
func decodeMap(key, val *plan, src []byte, mv reflect.Value, count, depth int) (int, error) {
	// One key and one value are decoded into and copied into the map per
	// entry; decoders overwrite all of their target, so nothing of one entry
	// leaks into the next.
	kv := reflect.New(mv.Type().Key()).Elem()
	vv := reflect.New(mv.Type().Elem()).Elem()
	kp, vp := kv.Addr().UnsafePointer(), vv.Addr().UnsafePointer()
	off := 0
	var prev []byte
	for i := range count {
		k, err := key.decode(src[off:], kp, depth)
		if err != nil {
			return 0, err
		}
		kb := src[off : off+k]
		if i > 0 && bytes.Compare(prev, kb) >= 0 {
			return 0, errMapOrder
		}
		prev = kb
		off += k
		v, err := val.decode(src[off:], vp, depth)
		if err != nil {
			return 0, err
		}
		off += v
		mv.SetMapIndex(kv, vv)
		if mv.Len() != i+1 {
			return 0, errMapOrder // distinct encodings of one key, as +0 and -0
		}
	}
	return off, nil
}
