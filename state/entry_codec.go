package state

import (
	"encoding/binary"
	"fmt"
	"maps"
	"reflect"

	"github.com/edgedio/edged/codec"
)

// entryCodec turns what a memory table stores per key and namespace (a
// value, a list, a map or an accumulator) into snapshot records and back.
// Each kind of state has its own.
type entryCodec[T any] interface {
	// byCopy reports whether a copy of a T, made by freeze, shares no
	// memory that the table or the operator may still write, so that a
	// snapshot may copy entries now and encode them later.
	byCopy() bool
	// freeze replaces *v by such a copy.
	freeze(v *T)
	// appendRecords adds the records of the entry (key, exp, *v) to w;
	// key is the encoded stream key and namespace, exp the entry's expiry
	// (written when ttl is set).
	appendRecords(w *recordWriter, key []byte, exp int64, ttl bool, v *T) error
	// decodeRecord folds a record into the entry *v: suffix is what
	// follows the key and namespace in the record's key, exp the record's
	// expiry (0 without TTL) and payload the value after it. fresh says
	// that *v was just created.
	decodeRecord(v *T, fresh bool, suffix []byte, exp int64, payload []byte) error
}

// refFree reports whether values of t hold no pointers, slices, maps,
// channels, functions or interfaces: copying such a value copies all of
// it. (Strings are immutable, so they count as free.)
func refFree(t reflect.Type) bool {
	switch t.Kind() {
	case reflect.Array:
		return t.Len() == 0 || refFree(t.Elem())
	case reflect.Struct:
		for i := range t.NumField() {
			if !refFree(t.Field(i).Type) {
				return false
			}
		}
		return true
	case reflect.Pointer, reflect.Slice, reflect.Map, reflect.Chan, reflect.Func, reflect.Interface, reflect.UnsafePointer:
		return false
	}
	return true
}

// appendExp appends the 8-byte expiry of a TTL record.
func appendExp(dst []byte, exp int64, ttl bool) []byte {
	if !ttl {
		return dst
	}
	return binary.BigEndian.AppendUint64(dst, uint64(exp))
}

// decodeAll decodes exactly one value from b.
func decodeAll[T any](c codec.Codec[T], b []byte) (T, error) {
	v, n, err := c.Decode(b)
	if err == nil && n != len(b) {
		err = fmt.Errorf("%d bytes after the value", len(b)-n)
	}
	if err != nil {
		var zero T
		return zero, fmt.Errorf("%w: %w", ErrCorruptSnapshot, err)
	}
	return v, nil
}

// decodeList decodes the elements laid end to end in b.
func decodeList[V any](c codec.Codec[V], b []byte) ([]V, error) {
	var vs []V
	for len(b) > 0 {
		v, n, err := c.Decode(b)
		if err != nil {
			return nil, fmt.Errorf("%w: list element %d: %w", ErrCorruptSnapshot, len(vs), err)
		}
		if n <= 0 {
			return nil, fmt.Errorf("%w: list element %d of no bytes", ErrCorruptSnapshot, len(vs))
		}
		vs = append(vs, v)
		b = b[n:]
	}
	return vs, nil
}

// errDuplicate is the error of a record for an entry that had one already.
var errDuplicate = fmt.Errorf("%w: two records for one key and namespace", ErrCorruptSnapshot)

// valueEntry is the entry codec of Value, Reducing and Aggregating state.
type valueEntry[V any] struct {
	c    codec.Codec[V]
	flat bool
}

func newValueEntry[V any](c codec.Codec[V]) valueEntry[V] {
	return valueEntry[V]{c: c, flat: refFree(reflect.TypeFor[V]())}
}

func (e valueEntry[V]) byCopy() bool { return e.flat }

func (e valueEntry[V]) freeze(*V) {}

func (e valueEntry[V]) appendRecords(w *recordWriter, key []byte, exp int64, ttl bool, v *V) error {
	val, err := e.c.Append(appendExp(w.val[:0], exp, ttl), *v)
	if err != nil {
		return err
	}
	w.val = val
	w.add(key, val)
	return nil
}

func (e valueEntry[V]) decodeRecord(v *V, fresh bool, suffix []byte, _ int64, payload []byte) error {
	if !fresh || len(suffix) != 0 {
		return errDuplicate
	}
	x, err := decodeAll(e.c, payload)
	*v = x
	return err
}

// listEntry is the entry codec of List state. A list never changes in
// place below its length (Add appends, Update replaces), so a copy of the
// slice header is a snapshot of it.
type listEntry[V any] struct {
	c    codec.Codec[V]
	flat bool
}

func newListEntry[V any](c codec.Codec[V]) listEntry[V] {
	return listEntry[V]{c: c, flat: refFree(reflect.TypeFor[V]())}
}

func (e listEntry[V]) byCopy() bool { return e.flat }

func (e listEntry[V]) freeze(v *[]V) { *v = (*v)[:len(*v):len(*v)] }

func (e listEntry[V]) appendRecords(w *recordWriter, key []byte, exp int64, ttl bool, v *[]V) error {
	val := appendExp(w.val[:0], exp, ttl)
	for _, x := range *v {
		var err error
		if val, err = e.c.Append(val, x); err != nil {
			return err
		}
	}
	w.val = val
	w.add(key, val)
	return nil
}

func (e listEntry[V]) decodeRecord(v *[]V, fresh bool, suffix []byte, _ int64, payload []byte) error {
	if !fresh || len(suffix) != 0 {
		return errDuplicate
	}
	vs, err := decodeList(e.c, payload)
	*v = vs
	return err
}

// mapEntry is the entry codec of Map state: one record per element.
type mapEntry[UK comparable, UV any] struct {
	kc   codec.Codec[UK]
	vc   codec.Codec[UV]
	flat bool
}

func newMapEntry[UK comparable, UV any](kc codec.Codec[UK], vc codec.Codec[UV]) mapEntry[UK, UV] {
	return mapEntry[UK, UV]{kc: kc, vc: vc, flat: refFree(reflect.TypeFor[UK]()) && refFree(reflect.TypeFor[UV]())}
}

func (e mapEntry[UK, UV]) byCopy() bool { return e.flat }

func (e mapEntry[UK, UV]) freeze(v *map[UK]mapElem[UV]) { *v = maps.Clone(*v) }

func (e mapEntry[UK, UV]) appendRecords(w *recordWriter, key []byte, _ int64, ttl bool, v *map[UK]mapElem[UV]) error {
	for uk, el := range *v {
		k, err := e.kc.Append(append(w.key[:0], key...), uk)
		if err != nil {
			return err
		}
		w.key = k
		val, err := e.vc.Append(appendExp(w.val[:0], el.exp, ttl), el.v)
		if err != nil {
			return err
		}
		w.val = val
		w.add(k, val)
	}
	return nil
}

func (e mapEntry[UK, UV]) decodeRecord(v *map[UK]mapElem[UV], _ bool, suffix []byte, exp int64, payload []byte) error {
	uk, err := decodeAll(e.kc, suffix)
	if err != nil {
		return fmt.Errorf("map key: %w", err)
	}
	uv, err := decodeAll(e.vc, payload)
	if err != nil {
		return fmt.Errorf("map value: %w", err)
	}
	if *v == nil {
		*v = make(map[UK]mapElem[UV])
	}
	if _, dup := (*v)[uk]; dup {
		return errDuplicate
	}
	(*v)[uk] = mapElem[UV]{v: uv, exp: exp}
	return nil
}
