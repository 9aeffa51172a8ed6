package stream_test

import (
	"context"
	"math"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/stream"
)

// countSum is a rolling per-sensor count and sum (in hundredths of a
// degree, so that sums are exact).
type countSum struct {
	ID    string
	Count int64
	Sum   int64
}

type countSumAgg struct{}

func (countSumAgg) CreateAccumulator() countSum { return countSum{} }

func (countSumAgg) Add(r operators.SensorReading, acc countSum) countSum {
	acc.ID = r.ID
	acc.Count++
	acc.Sum += centi(r.Temperature)
	return acc
}

func (countSumAgg) Result(acc countSum) countSum { return acc }

func centi(t float64) int64 { return int64(math.Round(t * 100)) }

func bySensor(r operators.SensorReading) string { return r.ID }

func generator(count int64, keys int) func() operators.Source[operators.SensorReading] {
	return func() operators.Source[operators.SensorReading] {
		return operators.SensorGenerator(operators.GeneratorConfig{Count: count, Keys: keys})
	}
}

// pacedGenerator is generator paced so that its count readings take at
// least d: injected failures, which wait for two completed checkpoints,
// then happen before the job ends however fast the machine; unpaced, a
// fast run could end first.
func pacedGenerator(count int64, keys int, d time.Duration) func() operators.Source[operators.SensorReading] {
	return func() operators.Source[operators.SensorReading] {
		return operators.SensorGenerator(operators.GeneratorConfig{Count: count, Keys: keys, Rate: float64(count) / d.Seconds()})
	}
}

// expected computes the per-sensor count and sum of the first count
// generated readings with a plain loop, independently of the engine.
func expected(count int64, keys int) map[string]countSum {
	g := operators.SensorGenerator(operators.GeneratorConfig{Count: count, Keys: keys})
	var all []operators.SensorReading
	col := operators.CollectorFunc[operators.SensorReading](func(r operators.SensorReading) { all = append(all, r) })
	ctx := &operators.Context{Parallelism: 1}
	if err := g.Open(ctx); err != nil {
		panic(err)
	}
	for {
		st, err := g.Poll(col, 4096)
		if err != nil {
			panic(err)
		}
		if st == operators.EndOfInput {
			break
		}
	}
	want := make(map[string]countSum)
	for _, r := range all {
		cs := want[r.ID]
		cs.ID = r.ID
		cs.Count++
		cs.Sum += centi(r.Temperature)
		want[r.ID] = cs
	}
	return want
}

// lastPerKey is a sink that keeps the latest value per key; safe for use by
// several subtasks.
type lastPerKey[T any] struct {
	mu   sync.Mutex
	key  func(T) string
	last map[string]T
	seq  map[string][]T
	keep bool
}

func newLastPerKey[T any](key func(T) string, keepSequence bool) *lastPerKey[T] {
	return &lastPerKey[T]{key: key, last: make(map[string]T), seq: make(map[string][]T), keep: keepSequence}
}

func (l *lastPerKey[T]) add(v T) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	k := l.key(v)
	l.last[k] = v
	if l.keep {
		l.seq[k] = append(l.seq[k], v)
	}
	return nil
}

func execute(t *testing.T, env *stream.Environment) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	return env.Execute(ctx)
}

func sortedInts(xs []int) []int {
	sort.Ints(xs)
	return xs
}
