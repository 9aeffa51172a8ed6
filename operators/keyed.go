package operators

import (
	"github.com/edgedio/edged/codec"
	"github.com/edgedio/edged/keygroup"
	"github.com/edgedio/edged/state"
)

// KeyHasher returns a stable hash function for keys of type K: the same key
// hashes alike in every process and on every machine. Strings and integers
// are hashed directly; other types through their codec. The returned
// function keeps a scratch buffer and must be used by one goroutine.
func KeyHasher[K comparable]() func(K) uint64 {
	var zero K
	switch any(zero).(type) {
	case string:
		return func(k K) uint64 { return keygroup.HashString(any(k).(string)) }
	case int:
		return func(k K) uint64 { return keygroup.HashUint64(uint64(any(k).(int))) }
	case int64:
		return func(k K) uint64 { return keygroup.HashUint64(uint64(any(k).(int64))) }
	case int32:
		return func(k K) uint64 { return keygroup.HashUint64(uint64(any(k).(int32))) }
	case uint64:
		return func(k K) uint64 { return keygroup.HashUint64(any(k).(uint64)) }
	case uint32:
		return func(k K) uint64 { return keygroup.HashUint64(uint64(any(k).(uint32))) }
	case float64:
		return func(k K) uint64 { return keygroup.HashFloat64(any(k).(float64)) }
	}
	c := codec.For[K]()
	var buf []byte
	return func(k K) uint64 {
		var err error
		buf, err = c.Append(buf[:0], k)
		if err != nil {
			Fail(err)
		}
		return keygroup.HashBytes(buf)
	}
}

// KeyGroupFunc returns the function giving a record's key group: the key
// selector, then the stable key hash, mod maxParallelism.
func KeyGroupFunc[T any, K comparable](key func(T) K, maxParallelism int) func(T) int {
	h := KeyHasher[K]()
	return func(v T) int { return keygroup.Of(h(key(v)), maxParallelism) }
}

// AggregateFunction folds records into an accumulator and turns it into a
// result, like Flink's AggregateFunction.
type AggregateFunction[T, A, R any] interface {
	// CreateAccumulator returns the accumulator of a key seen first.
	CreateAccumulator() A
	// Add folds v into acc and returns the new accumulator.
	Add(v T, acc A) A
	// Result returns the result of acc.
	Result(acc A) R
}

// KeyedAggregate keeps one accumulator per key in keyed Value state and
// emits the updated result for every record (a rolling aggregate).
type KeyedAggregate[T any, K comparable, A, R any] struct {
	Base
	key   func(T) K
	hash  func(K) uint64
	agg   AggregateFunction[T, A, R]
	out   Collector[R]
	name  string
	maxP  int
	kc    state.KeyContext[K]
	value state.Value[A]
}

// NewKeyedAggregate returns a rolling keyed aggregate whose accumulators live
// in the Value state named stateName.
func NewKeyedAggregate[T any, K comparable, A, R any](key func(T) K, agg AggregateFunction[T, A, R], stateName string, out Collector[R]) *KeyedAggregate[T, K, A, R] {
	return &KeyedAggregate[T, K, A, R]{key: key, hash: KeyHasher[K](), agg: agg, out: out, name: stateName}
}

// Open registers the accumulator state.
func (o *KeyedAggregate[T, K, A, R]) Open(ctx *Context) error {
	if ctx.State == nil {
		return ErrNotKeyed
	}
	v, err := state.NewValue[K, A](ctx.State, &o.kc, state.ValueDescriptor[A]{Name: o.name})
	if err != nil {
		return err
	}
	o.value, o.maxP = v, ctx.MaxParallelism
	return nil
}

// Collect folds v into its key's accumulator and emits the result.
func (o *KeyedAggregate[T, K, A, R]) Collect(v T) {
	k := o.key(v)
	o.kc.Set(k, keygroup.Of(o.hash(k), o.maxP))
	acc, ok := o.value.Get()
	if !ok {
		acc = o.agg.CreateAccumulator()
	}
	acc = o.agg.Add(v, acc)
	o.value.Update(acc)
	o.out.Collect(o.agg.Result(acc))
}

// reduceAgg is the AggregateFunction of a reduce: the accumulator is the
// running value itself.
type reduceAgg[T any] struct {
	fn func(acc, v T) (T, error)
}

// reduceAcc is the running value of a reduce; its fields are exported so
// that its codec can encode it.
type reduceAcc[T any] struct {
	V   T
	Set bool
}

func (r reduceAgg[T]) CreateAccumulator() reduceAcc[T] { return reduceAcc[T]{} }

func (r reduceAgg[T]) Add(v T, acc reduceAcc[T]) reduceAcc[T] {
	if !acc.Set {
		return reduceAcc[T]{V: v, Set: true}
	}
	out, err := r.fn(acc.V, v)
	if err != nil {
		Fail(err)
	}
	return reduceAcc[T]{V: out, Set: true}
}

func (r reduceAgg[T]) Result(acc reduceAcc[T]) T { return acc.V }

// NewKeyedReduce returns a rolling keyed reduce: for every record it emits
// fn(previous result of its key, record), or the record itself for a key
// seen first.
func NewKeyedReduce[T any, K comparable](key func(T) K, fn func(acc, v T) (T, error), stateName string, out Collector[T]) *KeyedAggregate[T, K, reduceAcc[T], T] {
	return NewKeyedAggregate[T, K, reduceAcc[T], T](key, reduceAgg[T]{fn: fn}, stateName, out)
}

// ReduceFunction returns the AggregateFunction (with Merge) of a reduce:
// the accumulator is the running value; an error from fn fails the task.
func ReduceFunction[T any](fn func(a, b T) (T, error)) AggregateFunction[T, reduceAcc[T], T] {
	return reduceAgg[T]{fn: fn}
}

// Merge combines two partial reductions.
func (r reduceAgg[T]) Merge(a, b reduceAcc[T]) reduceAcc[T] {
	if !b.Set {
		return a
	}
	return r.Add(b.V, a)
}
