package state

// Value is keyed state holding one value per key.
type Value[V any] interface {
	// Get returns the current key's value and whether it has one.
	Get() (V, bool)
	// Update sets the current key's value.
	Update(v V)
	// Clear removes the current key's value.
	Clear()
}

// NewValue returns the Value state named name of backend b, scoped to the
// key in kc.
func NewValue[K comparable, V any](b Backend, kc *KeyContext[K], name string) (Value[V], error) {
	if b == nil {
		return nil, ErrNoBackend
	}
	t, err := memTableOf[K, V](b, name)
	if err != nil {
		return nil, err
	}
	return &memValue[K, V]{kc: kc, t: t}, nil
}

type memValue[K comparable, V any] struct {
	kc *KeyContext[K]
	t  *memTable[K, V]
}

func (s *memValue[K, V]) Get() (V, bool) {
	v, ok := s.t.group(s.kc.group)[s.kc.key]
	return v, ok
}

func (s *memValue[K, V]) Update(v V) { s.t.group(s.kc.group)[s.kc.key] = v }

func (s *memValue[K, V]) Clear() { delete(s.t.group(s.kc.group), s.kc.key) }
