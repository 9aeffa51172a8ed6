package stream

import (
	"errors"
	"fmt"
	"reflect"

	"github.com/edgedio/edged/actors"
	"github.com/edgedio/edged/internal/nan"
	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/state"
)

// KeyedStream is a stream partitioned by a key: every record of one key
// goes to the same subtask, and keyed state is scoped to the key.
type KeyedStream[T any, K comparable] struct {
	s   *Stream[T]
	key func(T) K
}

// KeyBy partitions s by key. Keys hash to key groups (the job's max
// parallelism), and each subtask owns a contiguous range of key groups.
func KeyBy[T any, K comparable](s *Stream[T], key func(T) K) *KeyedStream[T, K] {
	s.must("KeyBy")
	if key == nil {
		s.env.addError(errors.New("stream: KeyBy: the key function is nil"))
	} else {
		key = selfEqualKey(key)
	}
	kg, err := keyGroupFunc(key, s.env.job.MaxParallelism)
	if err != nil {
		s.env.addError(err)
	} else if p := state.PointerIn(reflect.TypeFor[K]()); p != "" {
		s.env.addError(fmt.Errorf("stream: KeyBy: key type %v holds a pointer (%s): keyed state, timers and windows find a key again by ==, "+
			"which compares the pointer, not what it points to, so every record would start its state afresh; key by the value itself",
			reflect.TypeFor[K](), p))
	}
	ks := *s
	ks.ups = make([]upstream, len(s.ups))
	for i, u := range s.ups {
		ks.ups[i] = upstream{v: u.v, part: actors.KeyBy, keyGroup: kg, output: u.output}
	}
	return &KeyedStream[T, K]{s: &ks, key: key}
}

// Key returns the key selector.
func (k *KeyedStream[T, K]) Key() func(T) K { k.must("Key"); return k.key }

// Stream returns the keyed stream as a plain stream whose next operator
// receives records partitioned by key.
func (k *KeyedStream[T, K]) Stream() *Stream[T] { k.must("Stream"); return k.s }

// Reduce emits, for every record, fn applied to the key's previous result
// and the record (the record itself for a key seen first): a rolling
// reduce kept in keyed state. The operator needs a UID.
func (k *KeyedStream[T, K]) Reduce(name string, fn func(acc, v T) (T, error)) *Stream[T] {
	k.must(called("Reduce", name))
	if fn == nil {
		k.s.env.nilFunc(name, "the reduce function")
	}
	out := Transform(k.s, name, func(out operators.Collector[T]) operators.OneInput[T] {
		return operators.NewKeyedReduce(k.key, fn, "reduce", out)
	})
	out.env.keyedState(out.v, "reduce")
	return out
}

// Aggregate folds the records of each key with agg and emits the updated
// result for every record: a rolling aggregate kept in keyed state. The
// operator needs a UID.
func Aggregate[T any, K comparable, A, R any](k *KeyedStream[T, K], name string, agg operators.AggregateFunction[T, A, R]) *Stream[R] {
	k.must(called("Aggregate", name))
	if agg == nil {
		k.s.env.nilFunc(name, "the aggregate function")
	}
	out := Transform(k.s, name, func(out operators.Collector[R]) operators.OneInput[T] {
		return operators.NewKeyedAggregate(k.key, agg, "aggregate", out)
	})
	out.env.keyedState(out.v, "aggregate")
	return out
}

// selfEqualKey wraps key so that a key not equal to itself (a float NaN,
// or an array or struct holding one) fails the record with ErrNaNKey:
// keyed state, timers and windows find a key again by ==, so the records
// of such a key would each start afresh, and a window's would vanish
// without an error. It also turns every negative zero in a key into
// positive zero: -0 == +0, so they are one key, but their encodings
// differ, and the key's hash (its key group) and the bolt backend, which
// go by the encoding, would otherwise keep two states for it.
func selfEqualKey[T any, K comparable](key func(T) K) func(T) K {
	if !nan.Possible[K]() {
		return key // a key of this type always equals itself: no cost per record
	}
	zero := nan.ZeroCanonicalizer[K]()
	return func(v T) K {
		k := key(v)
		if k != k {
			operators.Fail(fmt.Errorf("%w: %v (%v)", ErrNaNKey, k, reflect.TypeFor[K]()))
		}
		if zero != nil {
			zero(&k)
		}
		return k
	}
}

// keyGroupFunc is operators.KeyGroupFunc, with a key type that has no
// codec (an interface, a channel, a func) as an error rather than a panic:
// keys are hashed by their encoding, the same on every node and across
// restores.
func keyGroupFunc[T any, K comparable](key func(T) K, maxParallelism int) (kg func(T) int, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("stream: KeyBy: key type %v cannot be a key: %v", reflect.TypeFor[K](), r)
		}
	}()
	return operators.KeyGroupFunc(key, maxParallelism), nil
}
