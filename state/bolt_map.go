package state

import (
	"encoding/binary"
	"fmt"
	"iter"

	"github.com/edgedio/edged/codec"
)

// boltMap is Map state on the bolt backend: one bolt key per element, the
// entry key followed by the encoded user key, so a map is a contiguous key
// range and Get of one element reads one bolt key. With a TTL, each
// element's value starts with its expiry time.
type boltMap[K, N comparable, UK comparable, UV any] struct {
	boltHandle[K, N]
	kc           codec.Codec[UK]
	vc           codec.Codec[UV]
	ttl          int64 // per element, nanoseconds; 0: no TTL
	updateOnRead bool
	nanKeys      bool      // UK can be unequal to itself: Put checks (checkUserKey)
	zero         func(*UK) // makes -0 in a user key +0 (nil: UK holds no float)
	uk           []byte    // scratch: the encoded user key
	full         []byte    // scratch: entry key and user key
}

// mapPrefixLen returns the function that finds the entry key (key group,
// key, namespace) at the front of a Map element's bolt key.
func mapPrefixLen[K, N comparable](kd codec.Codec[K], nd codec.Codec[N]) func([]byte) (int, error) {
	return func(k []byte) (int, error) {
		if len(k) < 2 {
			return 0, fmt.Errorf("%w: key of %d bytes", codec.ErrShort, len(k))
		}
		_, n1, err := kd.Decode(k[2:])
		if err != nil {
			return 0, err
		}
		_, n2, err := nd.Decode(k[2+n1:])
		if err != nil {
			return 0, err
		}
		return 2 + n1 + n2, nil
	}
}

// elemKey encodes uk and returns it with the entry key.
func (s *boltMap[K, N, UK, UV]) elemKey(uk UK) (prefix, ukb, full []byte) {
	prefix = s.key()
	if s.zero != nil {
		s.zero(&uk) // -0 == +0: one element, as on the memory backend
	}
	ukb, err := s.kc.Append(s.uk[:0], uk)
	if err != nil {
		panic(fmt.Errorf("state %q: encoding map key %v: %w", s.t.sp.name, uk, err))
	}
	s.uk = ukb
	s.full = append(append(s.full[:0], prefix...), ukb...)
	return prefix, ukb, s.full
}

// live returns the payload of an element's stored value, and whether it
// is live at now.
func (s *boltMap[K, N, UK, UV]) live(raw []byte, now int64) ([]byte, bool) {
	if s.ttl == 0 {
		return raw, true
	}
	exp, p := s.split(raw)
	return p, now < exp
}

// elemValue builds the stored value of an element.
func (s *boltMap[K, N, UK, UV]) elemValue(payload []byte, now int64) []byte {
	v := s.val[:0]
	if s.ttl != 0 {
		v = binary.BigEndian.AppendUint64(v, uint64(expiry(now, s.ttl)))
	}
	s.val = append(v, payload...)
	return s.val
}

func (s *boltMap[K, N, UK, UV]) Get(uk UK) (UV, bool) {
	s.begin()
	var zero UV
	prefix, ukb, full := s.elemKey(uk)
	raw, ok := s.t.getElem(prefix, ukb, full)
	if !ok {
		return zero, false
	}
	var now int64
	if s.ttl != 0 {
		now = s.now()
	}
	p, live := s.live(raw, now)
	if !live {
		s.t.delElem(prefix, ukb)
		return zero, false
	}
	v, err := decodeAll(s.vc, p)
	if err != nil {
		s.corrupt(err)
	}
	if s.ttl != 0 && s.updateOnRead {
		s.t.putElem(prefix, ukb, s.elemValue(p, now))
	}
	return v, true
}

func (s *boltMap[K, N, UK, UV]) Put(uk UK, uv UV) {
	if s.nanKeys {
		checkUserKey(s.t.sp.name, uk)
	}
	s.begin()
	prefix, ukb, _ := s.elemKey(uk)
	var now int64
	if s.ttl != 0 {
		now = s.now()
	}
	v := s.val[:0]
	if s.ttl != 0 {
		v = binary.BigEndian.AppendUint64(v, uint64(expiry(now, s.ttl)))
	}
	v, err := s.vc.Append(v, uv)
	if err != nil {
		panic(fmt.Errorf("state %q: encoding map value of %v: %w", s.t.sp.name, uk, err))
	}
	s.val = v
	s.t.putElem(prefix, ukb, v)
}

func (s *boltMap[K, N, UK, UV]) Remove(uk UK) {
	s.begin()
	prefix, ukb, _ := s.elemKey(uk)
	s.t.delElem(prefix, ukb)
}

func (s *boltMap[K, N, UK, UV]) Contains(uk UK) bool {
	_, ok := s.Get(uk)
	return ok
}

// pair is a decoded element.
type pair[UK, UV any] struct {
	k UK
	v UV
}

// elements decodes the live elements of the current entry, removing the
// expired ones and, if read is set, renewing the live ones if the TTL says
// so (reading them, as All does; Len does not).
func (s *boltMap[K, N, UK, UV]) elements(read bool) []pair[UK, UV] {
	s.begin()
	prefix := s.key()
	var now int64
	if s.ttl != 0 {
		now = s.now()
	}
	var out []pair[UK, UV]
	var expired, renew [][]byte
	s.t.forEachElem(prefix, func(ukb, raw []byte) {
		p, live := s.live(raw, now)
		if !live {
			expired = append(expired, append([]byte(nil), ukb...))
			return
		}
		k, err := decodeAll(s.kc, ukb)
		if err != nil {
			s.corrupt(err)
		}
		v, err := decodeAll(s.vc, p)
		if err != nil {
			s.corrupt(err)
		}
		out = append(out, pair[UK, UV]{k, v})
		if read && s.ttl != 0 && s.updateOnRead {
			renew = append(renew, append([]byte(nil), ukb...), append([]byte(nil), p...))
		}
	})
	for _, ukb := range expired {
		s.t.delElem(prefix, ukb)
	}
	for i := 0; i < len(renew); i += 2 {
		s.t.putElem(prefix, renew[i], s.elemValue(renew[i+1], now))
	}
	return out
}

// All yields the elements as they were when the iteration started
// (decoded first: writes during the iteration may commit the buffer).
func (s *boltMap[K, N, UK, UV]) All() iter.Seq2[UK, UV] {
	return func(yield func(UK, UV) bool) {
		for _, e := range s.elements(true) {
			if !yield(e.k, e.v) {
				return
			}
		}
	}
}

func (s *boltMap[K, N, UK, UV]) Len() int {
	if s.ttl == 0 {
		s.begin()
		n := 0
		s.t.forEachElem(s.key(), func(_, _ []byte) { n++ })
		return n
	}
	return len(s.elements(false))
}
