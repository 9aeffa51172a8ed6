package state

import (
	"iter"
	"slices"
)

// List is keyed state holding a list of values per key (and namespace). An
// empty list and no list are the same: Get returns nil for both.
type List[V any] interface {
	// Get returns a copy of the current key's list, nil when it has none;
	// the caller may keep and change it. All iterates without copying.
	Get() []V
	// All iterates over the current key's list as it is when the
	// iteration starts; writes during the iteration do not change what it
	// yields.
	All() iter.Seq[V]
	// Add appends v to the current key's list.
	Add(v V)
	// AddAll appends vs to the current key's list.
	AddAll(vs []V)
	// Update replaces the current key's list by a copy of vs; an empty vs
	// clears it.
	Update(vs []V)
	// Clear removes the current key's list.
	Clear()
}

// NewList returns a handle on the List state d.Name of backend b, scoped to
// the key in kc. Errors are those of NewValue.
func NewList[K comparable, V any](b Backend, kc *KeyContext[K], d ListDescriptor[V]) (List[V], error) {
	return newList[K, voidNamespace](b, kc, d)
}

// NewNamespacedList is NewList for state scoped to a namespace as well.
func NewNamespacedList[K, N comparable, V any](b Backend, kc *KeyContext[K], d ListDescriptor[V]) (NamespacedList[N, V], error) {
	return newList[K, N](b, kc, d)
}

func newList[K, N comparable, V any](b Backend, kc *KeyContext[K], d ListDescriptor[V]) (NamespacedList[N, V], error) {
	if err := checkKeyed(b, kc, d.Name, d.TTL); err != nil {
		return nil, err
	}
	s := newKeyedSpec[K, N](d.Name, kindList, d.TTL, typeName[V]())
	vc := defaultCodec(d.Codec, &s.codecs.err)
	s.codecs.value = vc
	switch b := b.(type) {
	case *MemoryBackend:
		t, err := memTableFor[K, N, []V](b, s, newListEntry(vc), nil)
		if err != nil {
			return nil, err
		}
		return &memList[K, N, V]{newMemHandle(b, kc, t, d.TTL)}, nil
	case *BoltBackend:
		t, err := boltTableFor(b, s, nil, boltCheck[K, N](b, &s, noSuffix, func(p []byte) error {
			_, err := decodeList(vc, p)
			return err
		}))
		if err != nil {
			return nil, err
		}
		h := &boltList[K, N, V]{boltHandle: newBoltHandle[K, N](b, kc, t, d.TTL), c: vc}
		h.enc = encoder(&h.boltHandle, vc)
		return h, nil
	}
	return nil, unsupportedBackend(b)
}

// memList is List state on the memory backend. The stored slice is never
// handed out, so appending to it in place is safe.
type memList[K, N comparable, V any] struct {
	memHandle[K, N, []V]
}

func (s *memList[K, N, V]) Get() []V {
	e := s.read()
	if e == nil {
		return nil
	}
	return slices.Clone(e.v)
}

func (s *memList[K, N, V]) All() iter.Seq[V] {
	return func(yield func(V) bool) {
		e := s.read()
		if e == nil {
			return
		}
		vs := e.v[:len(e.v):len(e.v)]
		for _, v := range vs {
			if !yield(v) {
				return
			}
		}
	}
}

func (s *memList[K, N, V]) Add(v V) {
	e, _ := s.write()
	e.v = append(e.v, v)
}

func (s *memList[K, N, V]) AddAll(vs []V) {
	if len(vs) == 0 {
		return
	}
	e, _ := s.write()
	e.v = append(e.v, vs...)
}

func (s *memList[K, N, V]) Update(vs []V) {
	if len(vs) == 0 {
		s.Clear()
		return
	}
	e, _ := s.write()
	e.v = slices.Clone(vs)
}

func (s *memList[K, N, V]) MergeNamespaces(target N, sources ...N) {
	s.mergeNamespaces(target, sources, func(acc, v []V) []V { return append(acc, v...) })
}
