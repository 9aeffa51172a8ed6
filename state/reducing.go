package state

import "fmt"

// Reducing is keyed state holding one value per key (and namespace) into
// which added values are folded with the descriptor's Reduce.
type Reducing[V any] interface {
	// Get returns the current key's value and whether it has one.
	Get() (V, bool)
	// Add stores v if the current key has no value, else Reduce(value, v).
	Add(v V)
	// Clear removes the current key's value.
	Clear()
}

// NewReducing returns a handle on the Reducing state d.Name of backend b,
// scoped to the key in kc. Errors are those of NewValue; d.Reduce is
// required.
func NewReducing[K comparable, V any](b Backend, kc *KeyContext[K], d ReducingDescriptor[V]) (Reducing[V], error) {
	return newReducing[K, voidNamespace](b, kc, d)
}

// NewNamespacedReducing is NewReducing for state scoped to a namespace as
// well.
func NewNamespacedReducing[K, N comparable, V any](b Backend, kc *KeyContext[K], d ReducingDescriptor[V]) (NamespacedReducing[N, V], error) {
	return newReducing[K, N](b, kc, d)
}

func newReducing[K, N comparable, V any](b Backend, kc *KeyContext[K], d ReducingDescriptor[V]) (NamespacedReducing[N, V], error) {
	if err := checkKeyed(b, kc, d.Name, d.TTL); err != nil {
		return nil, err
	}
	if d.Reduce == nil {
		return nil, fmt.Errorf("%w: reducing state %q has no Reduce", ErrDescriptor, d.Name)
	}
	s := newKeyedSpec[K, N](d.Name, kindReducing, d.TTL, typeName[V]())
	vc := defaultCodec(d.Codec, &s.codecs.err)
	s.codecs.value = vc
	switch b := b.(type) {
	case *MemoryBackend:
		t, err := memTableFor[K, N, V](b, s, newValueEntry(vc), nil)
		if err != nil {
			return nil, err
		}
		return &memReducing[K, N, V]{memValue: memValue[K, N, V]{newMemHandle(b, kc, t, d.TTL)}, reduce: d.Reduce}, nil
	case *BoltBackend:
		t, err := boltTableFor(b, s, nil, boltCheck[K, N](b, &s, noSuffix, checkOne(vc)))
		if err != nil {
			return nil, err
		}
		h := &boltReducing[K, N, V]{boltValue: boltValue[K, N, V]{boltHandle: newBoltHandle[K, N](b, kc, t, d.TTL)}, reduce: d.Reduce}
		h.dec, h.enc = decoder(&h.boltHandle, vc), encoder(&h.boltHandle, vc)
		return h, nil
	}
	return nil, unsupportedBackend(b)
}

// memReducing is Reducing state on the memory backend: Value state's
// handle (its Get), with Add in place of Update.
type memReducing[K, N comparable, V any] struct {
	memValue[K, N, V]
	reduce func(a, b V) V
}

func (s *memReducing[K, N, V]) Add(v V) {
	e, fresh := s.write()
	if fresh {
		e.v = v
		return
	}
	epoch := s.t.epoch
	s.set(e, epoch, s.reduce(e.v, v))
}

func (s *memReducing[K, N, V]) MergeNamespaces(target N, sources ...N) {
	s.mergeNamespaces(target, sources, s.reduce)
}
