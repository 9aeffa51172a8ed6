package state

import (
	"bytes"
	"fmt"
	"iter"

	"github.com/edgedio/edged/codec"
)

// The handles of the bolt backend for Value, List, Reducing and
// Aggregating state: one bolt key per entry. Map state is in bolt_map.go.

// boltValue is Value state on the bolt backend.
type boltValue[K, N comparable, V any] struct {
	boltHandle[K, N]
	dec func([]byte) V
	enc func([]byte, V) []byte
}

func newBoltValue[K, N comparable, V any](b *BoltBackend, kc *KeyContext[K], t *boltTable, c codec.Codec[V], ttl TTLConfig) *boltValue[K, N, V] {
	s := &boltValue[K, N, V]{boltHandle: newBoltHandle[K, N](b, kc, t, ttl)}
	s.dec, s.enc = decoder(&s.boltHandle, c), encoder(&s.boltHandle, c)
	return s
}

func (s *boltValue[K, N, V]) Get() (V, bool) {
	s.begin()
	p, ok := s.read(s.key())
	if !ok {
		var zero V
		return zero, false
	}
	return s.dec(p), true
}

func (s *boltValue[K, N, V]) Update(v V) {
	s.begin()
	s.write(s.key(), s.enc(s.startValue(), v))
}

// boltList is List state on the bolt backend: the elements of a list are
// stored encoded end to end, so Add appends bytes.
type boltList[K, N comparable, V any] struct {
	boltHandle[K, N]
	c   codec.Codec[V]
	enc func([]byte, V) []byte
}

func (s *boltList[K, N, V]) Get() []V {
	s.begin()
	p, ok := s.read(s.key())
	if !ok {
		return nil
	}
	vs, err := decodeList(s.c, p)
	if err != nil {
		s.corrupt(err)
	}
	return vs
}

func (s *boltList[K, N, V]) All() iter.Seq[V] {
	return func(yield func(V) bool) {
		for _, v := range s.Get() {
			if !yield(v) {
				return
			}
		}
	}
}

func (s *boltList[K, N, V]) Add(v V) {
	s.begin()
	key := s.key()
	old, _ := s.readForWrite(key)
	s.write(key, s.enc(append(s.startValue(), old...), v))
}

func (s *boltList[K, N, V]) AddAll(vs []V) {
	if len(vs) == 0 {
		return
	}
	s.begin()
	key := s.key()
	old, _ := s.readForWrite(key)
	buf := append(s.startValue(), old...)
	for _, v := range vs {
		buf = s.enc(buf, v)
	}
	s.write(key, buf)
}

func (s *boltList[K, N, V]) Update(vs []V) {
	if len(vs) == 0 {
		s.Clear()
		return
	}
	s.begin()
	buf := s.startValue()
	for _, v := range vs {
		buf = s.enc(buf, v)
	}
	s.write(s.key(), buf)
}

// MergeNamespaces concatenates the encoded lists: no decoding.
func (s *boltList[K, N, V]) MergeNamespaces(target N, sources ...N) {
	boltMerge(&s.boltHandle, target, sources,
		bytes.Clone,
		func(dst, p []byte) []byte { return append(dst, p...) },
		func(acc, p []byte) []byte { return append(acc, p...) })
}

// boltReducing is Reducing state on the bolt backend: Value state's
// handle (its Get and codec), with Add in place of Update.
type boltReducing[K, N comparable, V any] struct {
	boltValue[K, N, V]
	reduce func(a, b V) V
}

func (s *boltReducing[K, N, V]) Add(v V) {
	s.begin()
	if p, ok := s.readForWrite(s.key()); ok {
		v = s.reduce(s.dec(p), v)
	}
	s.write(s.key(), s.enc(s.startValue(), v))
}

func (s *boltReducing[K, N, V]) MergeNamespaces(target N, sources ...N) {
	boltMerge(&s.boltHandle, target, sources, s.dec, s.enc, s.reduce)
}

// boltAggregating is Aggregating state on the bolt backend.
type boltAggregating[K, N comparable, IN, ACC, OUT any] struct {
	boltHandle[K, N]
	dec func([]byte) ACC
	enc func([]byte, ACC) []byte
	d   AggregatingDescriptor[IN, ACC, OUT]
}

func (s *boltAggregating[K, N, IN, ACC, OUT]) Get() (OUT, bool) {
	s.begin()
	p, ok := s.read(s.key())
	if !ok {
		var zero OUT
		return zero, false
	}
	return s.d.Result(s.dec(p)), true
}

func (s *boltAggregating[K, N, IN, ACC, OUT]) Add(in IN) {
	s.begin()
	var acc ACC
	if p, ok := s.readForWrite(s.key()); ok {
		acc = s.dec(p)
	} else {
		acc = s.d.Create()
	}
	acc = s.d.Add(in, acc)
	s.write(s.key(), s.enc(s.startValue(), acc))
}

func (s *boltAggregating[K, N, IN, ACC, OUT]) MergeNamespaces(target N, sources ...N) {
	if s.d.Merge == nil {
		panic(fmt.Sprintf("state: MergeNamespaces on aggregating state %q, whose descriptor has no Merge", s.d.Name))
	}
	boltMerge(&s.boltHandle, target, sources, s.dec, s.enc, s.d.Merge)
}
