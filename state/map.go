package state

import (
	"fmt"
	"iter"

	"github.com/edgedio/edged/codec"
	"github.com/edgedio/edged/internal/nan"
)

// Map is keyed state holding a map from user keys to user values per key
// (and namespace). An empty map and no map are the same.
type Map[UK comparable, UV any] interface {
	// Get returns the value of uk in the current key's map.
	Get(uk UK) (UV, bool)
	// Put sets the value of uk in the current key's map.
	Put(uk UK, uv UV)
	// Remove removes uk from the current key's map.
	Remove(uk UK)
	// Contains reports whether the current key's map has uk.
	Contains(uk UK) bool
	// All iterates over the current key's map in no particular order.
	// Removing elements during the iteration is allowed; elements put
	// during it may or may not be yielded.
	All() iter.Seq2[UK, UV]
	// Len returns the number of elements of the current key's map.
	Len() int
	// Clear removes the current key's map.
	Clear()
}

// NewMap returns a handle on the Map state d.Name of backend b, scoped to
// the key in kc. Errors are those of NewValue.
func NewMap[K comparable, UK comparable, UV any](b Backend, kc *KeyContext[K], d MapDescriptor[UK, UV]) (Map[UK, UV], error) {
	return newMap[K, voidNamespace](b, kc, d)
}

// NewNamespacedMap is NewMap for state scoped to a namespace as well.
func NewNamespacedMap[K, N comparable, UK comparable, UV any](b Backend, kc *KeyContext[K], d MapDescriptor[UK, UV]) (NamespacedMap[N, UK, UV], error) {
	return newMap[K, N](b, kc, d)
}

func newMap[K, N comparable, UK comparable, UV any](b Backend, kc *KeyContext[K], d MapDescriptor[UK, UV]) (NamespacedMap[N, UK, UV], error) {
	if err := checkKeyed(b, kc, d.Name, d.TTL); err != nil {
		return nil, err
	}
	if err := checkKeyType[UK](d.Name, "user key"); err != nil {
		return nil, err
	}
	s := newKeyedSpec[K, N](d.Name, kindMap, d.TTL, fmt.Sprintf("%s -> %s", typeName[UK](), typeName[UV]()))
	ukc := defaultCodec(d.KeyCodec, &s.codecs.err)
	uvc := defaultCodec(d.ValueCodec, &s.codecs.err)
	s.codecs.userKey, s.codecs.value = ukc, uvc
	ttl := int64(d.TTL.TTL)
	switch b := b.(type) {
	case *BoltBackend:
		kd, _ := s.codecs.key.(codec.Codec[K])
		nd, _ := s.codecs.namespace.(codec.Codec[N])
		t, err := boltTableFor(b, s, mapPrefixLen(kd, nd), boltCheck[K, N](b, &s, checkOne(ukc), checkOne(uvc)))
		if err != nil {
			return nil, err
		}
		// Elements expire one by one: the entry itself never does.
		h := newBoltHandle[K, N](b, kc, t, TTLConfig{})
		return &boltMap[K, N, UK, UV]{boltHandle: h, kc: ukc, vc: uvc, ttl: ttl, updateOnRead: d.TTL.UpdateOnRead, nanKeys: nan.Possible[UK](), zero: nan.ZeroCanonicalizer[UK]()}, nil
	case *MemoryBackend:
		t, err := memTableFor(b, s, newMapEntry(ukc, uvc), func(t *memTable[K, N, map[UK]mapElem[UV]]) {
			if ttl > 0 {
				t.sweep = sweepMap[UK, UV]
			}
		})
		if err != nil {
			return nil, err
		}
		// Elements expire one by one: the entry itself never does.
		h := newMemHandle(b, kc, t, TTLConfig{})
		return &memMap[K, N, UK, UV]{memHandle: h, ttl: ttl, updateOnRead: d.TTL.UpdateOnRead, nanKeys: nan.Possible[UK](), zero: nan.ZeroCanonicalizer[UK]()}, nil
	}
	return nil, unsupportedBackend(b)
}

// mapElem is a user value and when it expires (0: never).
type mapElem[UV any] struct {
	v   UV
	exp int64
}

// sweepMap removes the expired elements of *m.
func sweepMap[UK comparable, UV any](m *map[UK]mapElem[UV], now int64) (removed int, empty bool) {
	for k, el := range *m {
		if now >= el.exp {
			delete(*m, k)
			removed++
		}
	}
	return removed, len(*m) == 0
}

// memMap is Map state on the memory backend.
type memMap[K, N comparable, UK comparable, UV any] struct {
	memHandle[K, N, map[UK]mapElem[UV]]
	ttl          int64 // per element, nanoseconds; 0: no TTL
	updateOnRead bool
	nanKeys      bool      // UK can be unequal to itself: Put checks (checkUserKey)
	zero         func(*UK) // makes -0 in a user key +0 (nil: UK holds no float)
}

// dropIfEmpty removes the current entry once its map is empty.
func (s *memMap[K, N, UK, UV]) dropIfEmpty() {
	if e := s.lookup(); e != nil && len(e.v) == 0 {
		s.Clear()
	}
}

func (s *memMap[K, N, UK, UV]) Get(uk UK) (UV, bool) {
	var zero UV
	e := s.read()
	if e == nil {
		return zero, false
	}
	el, ok := e.v[uk]
	if !ok {
		return zero, false
	}
	if s.ttl != 0 {
		now := s.now()
		if now >= el.exp {
			delete(e.v, uk)
			s.dropIfEmpty()
			return zero, false
		}
		if s.updateOnRead {
			el.exp = expiry(now, s.ttl)
			e.v[uk] = el
		}
	}
	return el.v, true
}

// checkUserKey panics with ErrNaNUserKey (which fails the task) for a
// user key not equal to itself.
func checkUserKey[UK comparable](name string, uk UK) {
	if uk != uk {
		panic(fmt.Errorf("%w: state %q: %v", ErrNaNUserKey, name, uk))
	}
}

func (s *memMap[K, N, UK, UV]) Put(uk UK, uv UV) {
	if s.nanKeys {
		checkUserKey(s.t.sp.name, uk)
	}
	if s.zero != nil {
		// -0 == +0 finds the element either way; assigning replaces
		// the map's key, so All and snapshots give +0, the key the bolt
		// backend keeps.
		s.zero(&uk)
	}
	e, _ := s.write()
	if e.v == nil {
		e.v = make(map[UK]mapElem[UV])
	}
	el := mapElem[UV]{v: uv}
	if s.ttl != 0 {
		el.exp = expiry(s.now(), s.ttl)
	}
	e.v[uk] = el
}

func (s *memMap[K, N, UK, UV]) Remove(uk UK) {
	e := s.read()
	if e == nil {
		return
	}
	delete(e.v, uk)
	s.dropIfEmpty()
}

func (s *memMap[K, N, UK, UV]) Contains(uk UK) bool {
	_, ok := s.Get(uk)
	return ok
}

func (s *memMap[K, N, UK, UV]) All() iter.Seq2[UK, UV] {
	return func(yield func(UK, UV) bool) {
		e := s.read()
		if e == nil {
			return
		}
		// The entry may move while yield runs; the map it holds does not.
		m := e.v
		defer s.dropIfEmpty()
		var now int64
		if s.ttl != 0 {
			now = s.now()
		}
		for k, el := range m {
			if s.ttl != 0 {
				if now >= el.exp {
					delete(m, k)
					continue
				}
				if s.updateOnRead {
					el.exp = expiry(now, s.ttl)
					m[k] = el
				}
			}
			if !yield(k, el.v) {
				return
			}
		}
	}
}

func (s *memMap[K, N, UK, UV]) Len() int {
	e := s.read()
	if e == nil {
		return 0
	}
	if s.ttl == 0 {
		return len(e.v)
	}
	if _, empty := sweepMap(&e.v, s.now()); empty {
		s.Clear()
		return 0
	}
	return len(e.v)
}
