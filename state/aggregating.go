package state

import (
	"fmt"
)

// Aggregating is keyed state holding one accumulator per key (and
// namespace) into which inputs are added; Get returns its result.
type Aggregating[IN, OUT any] interface {
	// Get returns the result of the current key's accumulator and whether
	// it has one.
	Get() (OUT, bool)
	// Add folds in into the current key's accumulator, created first if
	// the key has none.
	Add(in IN)
	// Clear removes the current key's accumulator.
	Clear()
}

// NewAggregating returns a handle on the Aggregating state d.Name of
// backend b, scoped to the key in kc. Errors are those of NewValue;
// d.Create, d.Add and d.Result are required.
func NewAggregating[K comparable, IN, ACC, OUT any](b Backend, kc *KeyContext[K], d AggregatingDescriptor[IN, ACC, OUT]) (Aggregating[IN, OUT], error) {
	return newAggregating[K, voidNamespace](b, kc, d)
}

// NewNamespacedAggregating is NewAggregating for state scoped to a
// namespace as well. MergeNamespaces needs d.Merge.
func NewNamespacedAggregating[K, N comparable, IN, ACC, OUT any](b Backend, kc *KeyContext[K], d AggregatingDescriptor[IN, ACC, OUT]) (NamespacedAggregating[N, IN, OUT], error) {
	return newAggregating[K, N](b, kc, d)
}

func newAggregating[K, N comparable, IN, ACC, OUT any](b Backend, kc *KeyContext[K], d AggregatingDescriptor[IN, ACC, OUT]) (NamespacedAggregating[N, IN, OUT], error) {
	if err := checkKeyed(b, kc, d.Name, d.TTL); err != nil {
		return nil, err
	}
	if d.Create == nil || d.Add == nil || d.Result == nil {
		return nil, fmt.Errorf("%w: aggregating state %q needs Create, Add and Result", ErrDescriptor, d.Name)
	}
	s := newKeyedSpec[K, N](d.Name, kindAggregating, d.TTL, typeName[ACC]())
	vc := defaultCodec(d.Codec, &s.codecs.err)
	s.codecs.value = vc
	switch b := b.(type) {
	case *MemoryBackend:
		t, err := memTableFor[K, N, ACC](b, s, newValueEntry(vc), nil)
		if err != nil {
			return nil, err
		}
		return &memAggregating[K, N, IN, ACC, OUT]{memHandle: newMemHandle(b, kc, t, d.TTL), d: d}, nil
	case *BoltBackend:
		t, err := boltTableFor(b, s, nil, boltCheck[K, N](b, &s, noSuffix, checkOne(vc)))
		if err != nil {
			return nil, err
		}
		h := &boltAggregating[K, N, IN, ACC, OUT]{boltHandle: newBoltHandle[K, N](b, kc, t, d.TTL), d: d}
		h.dec, h.enc = decoder(&h.boltHandle, vc), encoder(&h.boltHandle, vc)
		return h, nil
	}
	return nil, unsupportedBackend(b)
}

// memAggregating is Aggregating state on the memory backend.
type memAggregating[K, N comparable, IN, ACC, OUT any] struct {
	memHandle[K, N, ACC]
	d AggregatingDescriptor[IN, ACC, OUT]
}

func (s *memAggregating[K, N, IN, ACC, OUT]) Get() (OUT, bool) {
	e := s.read()
	if e == nil {
		var zero OUT
		return zero, false
	}
	return s.d.Result(e.v), true
}

func (s *memAggregating[K, N, IN, ACC, OUT]) Add(in IN) {
	e, fresh := s.write()
	epoch := s.t.epoch
	acc := e.v
	if fresh {
		acc = s.d.Create()
	}
	s.set(e, epoch, s.d.Add(in, acc))
}

func (s *memAggregating[K, N, IN, ACC, OUT]) MergeNamespaces(target N, sources ...N) {
	if s.d.Merge == nil {
		panic(fmt.Sprintf("state: MergeNamespaces on aggregating state %q, whose descriptor has no Merge", s.d.Name))
	}
	s.mergeNamespaces(target, sources, s.d.Merge)
}
