package state

// Value is keyed state holding one value per key (and namespace).
type Value[V any] interface {
	// Get returns the current key's value and whether it has one.
	Get() (V, bool)
	// Update sets the current key's value.
	Update(v V)
	// Clear removes the current key's value.
	Clear()
}

// NewValue returns a handle on the Value state d.Name of backend b, scoped
// to the key in kc. Handles made with the same name share the entries. It
// fails with ErrNoBackend if b is nil, ErrStateType if the name is taken
// by state of another kind, type or TTL, and ErrDescriptor for a bad
// descriptor.
func NewValue[K comparable, V any](b Backend, kc *KeyContext[K], d ValueDescriptor[V]) (Value[V], error) {
	return newValue[K, voidNamespace](b, kc, d)
}

// NewNamespacedValue is NewValue for state scoped to a namespace as well.
func NewNamespacedValue[K, N comparable, V any](b Backend, kc *KeyContext[K], d ValueDescriptor[V]) (NamespacedValue[N, V], error) {
	return newValue[K, N](b, kc, d)
}

func newValue[K, N comparable, V any](b Backend, kc *KeyContext[K], d ValueDescriptor[V]) (NamespacedValue[N, V], error) {
	if err := checkKeyed(b, kc, d.Name, d.TTL); err != nil {
		return nil, err
	}
	s := newKeyedSpec[K, N](d.Name, kindValue, d.TTL, typeName[V]())
	vc := defaultCodec(d.Codec, &s.codecs.err)
	s.codecs.value = vc
	switch b := b.(type) {
	case *MemoryBackend:
		t, err := memTableFor[K, N, V](b, s, newValueEntry(vc), nil)
		if err != nil {
			return nil, err
		}
		return &memValue[K, N, V]{newMemHandle(b, kc, t, d.TTL)}, nil
	case *BoltBackend:
		t, err := boltTableFor(b, s, nil, boltCheck[K, N](b, &s, noSuffix, checkOne(vc)))
		if err != nil {
			return nil, err
		}
		return newBoltValue[K, N](b, kc, t, vc, d.TTL), nil
	}
	return nil, unsupportedBackend(b)
}

// memValue is Value state on the memory backend.
type memValue[K, N comparable, V any] struct {
	memHandle[K, N, V]
}

func (s *memValue[K, N, V]) Get() (V, bool) {
	e := s.read()
	if e == nil {
		var zero V
		return zero, false
	}
	return e.v, true
}

func (s *memValue[K, N, V]) Update(v V) {
	e, _ := s.write()
	e.v = v
}
