package state

import (
	"errors"
	"fmt"
	"iter"
	"maps"
	"slices"
)

// OperatorStore holds the operator state of one subtask: state that is not
// scoped to a key but belongs to the subtask as a whole (a source's offsets,
// a sink's pending transactions, the rules of a broadcast stream). What
// differs between the kinds is how a restore with another parallelism
// hands the state out (see RedistributeList, RedistributeUnion and
// RedistributeBroadcast):
//   - ListState: the lists of all old subtasks are concatenated and split
//     evenly among the new ones;
//   - UnionListState: every new subtask gets the whole concatenation;
//   - BroadcastState: a map that is the same in every subtask; every new
//     subtask gets a copy.
//
// Not safe for concurrent use: the subtask that owns it uses it, and every
// handle made from it, from its own goroutine.
type OperatorStore struct {
	states map[string]operatorState
	// pending holds restored states not registered since, by name.
	pending map[string]*opRaw
	// needCodecs refuses a state without codecs when it is registered
	// (RequireCodecs).
	needCodecs bool
}

// RequireCodecs makes s refuse, when it is registered, a state whose
// value (or broadcast key) type has no codec. The runtime calls it for a
// job that takes snapshots (it has a checkpoint directory): such a state
// could not be in a single one, and the job would otherwise run until its
// first snapshot fails. Without it s keeps values without encoding them.
func (s *OperatorStore) RequireCodecs() { s.needCodecs = true }

// operatorState is one registered state of an OperatorStore.
type operatorState interface {
	spec() *spec
	// raw encodes the state for a snapshot.
	raw() (*opRaw, error)
	// load decodes a restored state into the state, which is new.
	load(r *opRaw) error
}

// NewOperatorStore returns an empty operator state store.
func NewOperatorStore() *OperatorStore {
	return &OperatorStore{states: make(map[string]operatorState)}
}

// OperatorList is operator state holding a list of values.
type OperatorList[V any] interface {
	// Get returns a copy of the list, nil when it is empty.
	Get() []V
	// Add appends v to the list.
	Add(v V)
	// Update replaces the list by a copy of vs.
	Update(vs []V)
	// Clear empties the list.
	Clear()
}

// ReadOnlyBroadcast is a read-only view of broadcast state: what the keyed
// side of the broadcast-state pattern sees, where only the broadcast side
// may write (writes from the keyed side would make subtasks differ).
type ReadOnlyBroadcast[K comparable, V any] interface {
	// Get returns the value of k.
	Get(k K) (V, bool)
	// All iterates over the map in no particular order.
	All() iter.Seq2[K, V]
	// Len returns the number of entries.
	Len() int
}

// Broadcast is operator state holding a map that every subtask holds the
// same: the broadcast side of an operator updates it with every broadcast
// record, identically in every subtask.
type Broadcast[K comparable, V any] interface {
	ReadOnlyBroadcast[K, V]
	// Put sets the value of k.
	Put(k K, v V)
	// Remove removes k.
	Remove(k K)
	// Clear empties the map.
	Clear()
}

// ListState returns the list state name of s, redistributed on restore by
// RedistributeList. Handles made with the same name share the list. It
// fails with ErrStateType if the name is taken by state of another kind or
// type, and ErrDescriptor for an empty name.
func ListState[V any](s *OperatorStore, name string) (OperatorList[V], error) {
	return operatorStateFor(s, operatorSpec[V](name, kindOperatorList, typeName[V]()), func() *opList[V] { return new(opList[V]) })
}

// UnionListState returns the union list state name of s, redistributed on
// restore by RedistributeUnion. Errors are those of ListState.
func UnionListState[V any](s *OperatorStore, name string) (OperatorList[V], error) {
	return operatorStateFor(s, operatorSpec[V](name, kindUnionList, typeName[V]()), func() *opList[V] { return new(opList[V]) })
}

// BroadcastState returns the broadcast state name of s, redistributed on
// restore by RedistributeBroadcast. Errors are those of ListState.
func BroadcastState[K comparable, V any](s *OperatorStore, name string) (Broadcast[K, V], error) {
	// A map by == on a pointer key: a restore decodes new pointers, which
	// no lookup finds again.
	if err := checkKeyType[K](name, "key"); err != nil {
		return nil, err
	}
	sp := operatorSpec[V](name, kindBroadcast, fmt.Sprintf("%s -> %s", typeName[K](), typeName[V]()))
	sp.codecs.key = defaultCodec[K](nil, &sp.codecs.err)
	return operatorStateFor(s, sp, func() *opBroadcast[K, V] { return &opBroadcast[K, V]{m: make(map[K]V)} })
}

// ReadOnlyBroadcastState returns a read-only view of the broadcast state
// name of s, registering it if needed. The view cannot be converted back
// into a Broadcast.
func ReadOnlyBroadcastState[K comparable, V any](s *OperatorStore, name string) (ReadOnlyBroadcast[K, V], error) {
	b, err := BroadcastState[K, V](s, name)
	if err != nil {
		return nil, err
	}
	return readOnlyBroadcast[K, V]{b.(*opBroadcast[K, V])}, nil
}

// operatorSpec returns the spec of operator state holding values of V.
func operatorSpec[V any](name string, k kind, types string) spec {
	sp := spec{name: name, kind: k, sig: fmt.Sprintf("%s[%s]", k, types), types: types}
	sp.codecs.value = defaultCodec[V](nil, &sp.codecs.err)
	return sp
}

// operatorStateFor returns the state registered under sp.name, registering
// mk() when there is none.
func operatorStateFor[T operatorState](s *OperatorStore, sp spec, mk func() T) (T, error) {
	var zero T
	if s == nil {
		return zero, errors.New("state: nil OperatorStore")
	}
	if err := checkName(sp.name); err != nil {
		return zero, err
	}
	if s.needCodecs && sp.codecs.err != nil {
		return zero, fmt.Errorf("operator state %q: its snapshots need codecs: %w", sp.name, sp.codecs.err)
	}
	if old, ok := s.states[sp.name]; ok {
		t, ok := old.(T)
		if !ok || old.spec().sig != sp.sig {
			return zero, fmt.Errorf("%w: %q is a %s, not a %s", ErrStateType, sp.name, old.spec().sig, sp.sig)
		}
		return t, nil
	}
	t := mk()
	*t.spec() = sp
	if r := s.pending[sp.name]; r != nil {
		if err := checkRestored(&r.meta, &sp); err != nil {
			return zero, err
		}
		if sp.codecs.err != nil {
			return zero, fmt.Errorf("restore: operator state %q: %w", sp.name, sp.codecs.err)
		}
		if err := t.load(r); err != nil {
			return zero, fmt.Errorf("restore: operator state %q: %w", sp.name, err)
		}
		delete(s.pending, sp.name)
	}
	s.states[sp.name] = t
	return t, nil
}

// opList is ListState and UnionListState.
type opList[V any] struct {
	sp    spec
	items []V
}

func (l *opList[V]) spec() *spec { return &l.sp }

func (l *opList[V]) Get() []V { return slices.Clone(l.items) }

func (l *opList[V]) Add(v V) { l.items = append(l.items, v) }

func (l *opList[V]) Update(vs []V) { l.items = slices.Clone(vs) }

func (l *opList[V]) Clear() { l.items = nil }

// opBroadcast is BroadcastState.
type opBroadcast[K comparable, V any] struct {
	sp spec
	m  map[K]V
}

func (b *opBroadcast[K, V]) spec() *spec { return &b.sp }

func (b *opBroadcast[K, V]) Get(k K) (V, bool) {
	v, ok := b.m[k]
	return v, ok
}

func (b *opBroadcast[K, V]) All() iter.Seq2[K, V] { return maps.All(b.m) }

func (b *opBroadcast[K, V]) Len() int { return len(b.m) }

func (b *opBroadcast[K, V]) Put(k K, v V) { b.m[k] = v }

func (b *opBroadcast[K, V]) Remove(k K) { delete(b.m, k) }

func (b *opBroadcast[K, V]) Clear() { clear(b.m) }

// readOnlyBroadcast hides the writing methods of a broadcast state.
type readOnlyBroadcast[K comparable, V any] struct {
	b *opBroadcast[K, V]
}

func (r readOnlyBroadcast[K, V]) Get(k K) (V, bool) { return r.b.Get(k) }

func (r readOnlyBroadcast[K, V]) All() iter.Seq2[K, V] { return r.b.All() }

func (r readOnlyBroadcast[K, V]) Len() int { return r.b.Len() }
