package stream_test

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgedio/edged/actors"
	"github.com/edgedio/edged/keygroup"
	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/stream"
	"github.com/edgedio/edged/watermark"
)

// rollingJob builds generator -> key-by sensor -> rolling count+sum -> sink.
func rollingJob(count int64, keys, parallelism int, sink *lastPerKey[countSum], opts ...stream.Option) *stream.Environment {
	env := stream.NewEnvironment("rolling", append([]stream.Option{stream.WithParallelism(parallelism)}, opts...)...)
	readings := stream.FromSource(env, "generator", generator(count, keys))
	agg := stream.Aggregate(stream.KeyBy(readings, bySensor), "count-sum", countSumAgg{}).UID("count-sum")
	agg.ForEach("sink", sink.add)
	return env
}

// A parallelism-2 job over 1,000,000 generated records computes exactly the
// per-key counts and sums of a plain loop over the same records.
func TestKeyedRollingAggregateIsExact(t *testing.T) {
	const n, keys = 1_000_000, 1000
	want := expected(n, keys)
	sink := newLastPerKey(func(c countSum) string { return c.ID }, false)
	if err := execute(t, rollingJob(n, keys, 2, sink)); err != nil {
		t.Fatal(err)
	}
	if len(sink.last) != keys {
		t.Fatalf("got %d keys, want %d", len(sink.last), keys)
	}
	var total int64
	for k, w := range want {
		if got := sink.last[k]; got != w {
			t.Fatalf("key %s: got %+v, want %+v", k, got, w)
		}
		total += sink.last[k].Count
	}
	if total != n {
		t.Fatalf("total count %d, want %d", total, n)
	}
}

// Sending key-by edges through encode/decode changes nothing.
func TestSerializedKeyByGivesSameResult(t *testing.T) {
	const n, keys = 200_000, 500
	plain := newLastPerKey(func(c countSum) string { return c.ID }, true)
	wired := newLastPerKey(func(c countSum) string { return c.ID }, true)
	if err := execute(t, rollingJob(n, keys, 2, plain)); err != nil {
		t.Fatal(err)
	}
	env := rollingJob(n, keys, 2, wired, stream.WithSerializedKeyBy(true))
	if err := execute(t, env); err != nil {
		t.Fatal(err)
	}
	compareSequences(t, plain.seq, wired.seq)
	var batches int64
	for _, c := range env.Stats().Channels {
		batches += c.Batches
	}
	if batches == 0 {
		t.Fatal("no batches crossed a channel")
	}
}

// The same input run twice gives identical output: every key's sequence of
// rolling results is the same. (Each key's records come from one source
// subtask here, as keys % parallelism == 0, so its input order is fixed.)
func TestSameInputSameOutput(t *testing.T) {
	const n, keys = 100_000, 100
	a := newLastPerKey(func(c countSum) string { return c.ID }, true)
	b := newLastPerKey(func(c countSum) string { return c.ID }, true)
	if err := execute(t, rollingJob(n, keys, 2, a)); err != nil {
		t.Fatal(err)
	}
	if err := execute(t, rollingJob(n, keys, 2, b, stream.WithBatchSize(7))); err != nil {
		t.Fatal(err)
	}
	compareSequences(t, a.seq, b.seq)
}

func compareSequences(t *testing.T, a, b map[string][]countSum) {
	t.Helper()
	if len(a) != len(b) || len(a) == 0 {
		t.Fatalf("key counts differ or are zero: %d vs %d", len(a), len(b))
	}
	for k, sa := range a {
		sb := b[k]
		if len(sa) != len(sb) {
			t.Fatalf("key %s: %d results vs %d", k, len(sa), len(sb))
		}
		for i := range sa {
			if sa[i] != sb[i] {
				t.Fatalf("key %s result %d: %+v vs %+v", k, i, sa[i], sb[i])
			}
		}
	}
}

// tagged is a record that says which subtask produced it.
type tagged struct {
	I    int64
	From int
}

// tagSource emits its subtask's share of [0, n) tagged with its subtask.
type tagSource struct {
	operators.Base
	n, next, step int64
	sub           int
}

func (s *tagSource) Open(ctx *operators.Context) error {
	s.sub, s.next, s.step = ctx.Subtask, int64(ctx.Subtask), int64(ctx.Parallelism)
	return nil
}

func (s *tagSource) Poll(out operators.Collector[tagged], max int) (operators.Status, error) {
	for k := 0; k < max && s.next < s.n; k++ {
		out.Collect(tagged{I: s.next, From: s.sub})
		s.next += s.step
	}
	if s.next >= s.n {
		return operators.EndOfInput, nil
	}
	return operators.MoreAvailable, nil
}

func (s *tagSource) Available() <-chan struct{} { return nil }

// subtaskSink records, per sink subtask, what it received.
type subtaskSink struct {
	mu  sync.Mutex
	got map[int][]tagged
}

type subtaskSinkInstance struct {
	operators.Base
	s   *subtaskSink
	sub int
}

func (k *subtaskSinkInstance) Open(ctx *operators.Context) error { k.sub = ctx.Subtask; return nil }

func (k *subtaskSinkInstance) Collect(v tagged) {
	k.s.mu.Lock()
	k.s.got[k.sub] = append(k.s.got[k.sub], v)
	k.s.mu.Unlock()
}

func partitionJob(n int64, srcP, sinkP int, connect func(*stream.Stream[tagged]) *stream.Stream[tagged]) (*stream.Environment, *subtaskSink) {
	env := stream.NewEnvironment("partition", stream.WithBatchSize(16))
	src := stream.FromSource(env, "src", func() operators.Source[tagged] { return &tagSource{n: n} }).SetParallelism(srcP)
	sink := &subtaskSink{got: make(map[int][]tagged)}
	connect(src).To("sink", func() operators.Sink[tagged] { return &subtaskSinkInstance{s: sink} }).SetParallelism(sinkP)
	return env, sink
}

func TestForwardPartitioner(t *testing.T) {
	env, sink := partitionJob(10_000, 3, 3, (*stream.Stream[tagged]).Forward)
	if err := execute(t, env); err != nil {
		t.Fatal(err)
	}
	total := 0
	for sub, vs := range sink.got {
		for _, v := range vs {
			if v.From != sub {
				t.Fatalf("record from subtask %d reached sink subtask %d", v.From, sub)
			}
			if v.I%3 != int64(sub) {
				t.Fatalf("record %d at subtask %d", v.I, sub)
			}
		}
		total += len(vs)
	}
	if total != 10_000 {
		t.Fatalf("got %d records, want 10000", total)
	}
}

func TestRebalancePartitioner(t *testing.T) {
	env, sink := partitionJob(9_000, 2, 3, (*stream.Stream[tagged]).Rebalance)
	if err := execute(t, env); err != nil {
		t.Fatal(err)
	}
	// Each source subtask deals its 4500 records round robin: 1500 to each
	// sink subtask from each source subtask.
	for sub := range 3 {
		per := map[int]int{}
		for _, v := range sink.got[sub] {
			per[v.From]++
		}
		if per[0] != 1500 || per[1] != 1500 {
			t.Fatalf("sink subtask %d got %v from the source subtasks, want 1500 each", sub, per)
		}
	}
}

func TestKeyByPartitioner(t *testing.T) {
	const maxP, p = 128, 3
	key := func(v tagged) string { return fmt.Sprintf("k%d", v.I%97) }
	env, sink := partitionJob(20_000, 2, p, func(s *stream.Stream[tagged]) *stream.Stream[tagged] {
		return stream.KeyBy(s, key).Stream()
	})
	if err := execute(t, env); err != nil {
		t.Fatal(err)
	}
	owner := map[string]int{}
	total := 0
	for sub, vs := range sink.got {
		for _, v := range vs {
			k := key(v)
			if o, seen := owner[k]; seen && o != sub {
				t.Fatalf("key %s at subtasks %d and %d", k, o, sub)
			}
			owner[k] = sub
			g := keygroup.Of(keygroup.HashString(k), maxP)
			if want := keygroup.Subtask(g, p, maxP); want != sub {
				t.Fatalf("key %s (group %d) at subtask %d, want %d", k, g, sub, want)
			}
		}
		total += len(vs)
	}
	if total != 20_000 || len(owner) != 97 {
		t.Fatalf("got %d records over %d keys", total, len(owner))
	}
}

func TestBroadcastPartitioner(t *testing.T) {
	env, sink := partitionJob(1_000, 2, 3, (*stream.Stream[tagged]).Broadcast)
	if err := execute(t, env); err != nil {
		t.Fatal(err)
	}
	for sub := range 3 {
		var is []int
		for _, v := range sink.got[sub] {
			is = append(is, int(v.I))
		}
		is = sortedInts(is)
		if len(is) != 1000 {
			t.Fatalf("sink subtask %d got %d records, want 1000", sub, len(is))
		}
		for i, x := range is {
			if x != i {
				t.Fatalf("sink subtask %d: record %d is %d", sub, i, x)
			}
		}
	}
}

// Forward edges of equal parallelism are chained into one task with no
// channel between them; a key-by edge splits the chain.
func TestChaining(t *testing.T) {
	env := stream.NewEnvironment("chain", stream.WithParallelism(2))
	src := stream.FromSource(env, "src", generator(10_000, 10))
	m := stream.Map(src, "map", func(r operators.SensorReading) (operators.SensorReading, error) { return r, nil })
	f := m.Filter("filter", func(operators.SensorReading) bool { return true })
	var mu sync.Mutex
	n := 0
	f.ForEach("sink", func(operators.SensorReading) error { mu.Lock(); n++; mu.Unlock(); return nil })
	plan, err := env.Plan()
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.Chains) != 1 || plan.Chains[0].Name() != "src -> map -> filter -> sink" || plan.Tasks() != 2 {
		t.Fatalf("plan: %d chains, first %q, %d tasks", len(plan.Chains), plan.Chains[0].Name(), plan.Tasks())
	}
	if err := execute(t, env); err != nil {
		t.Fatal(err)
	}
	st := env.Stats()
	if len(st.Channels) != 0 {
		t.Fatalf("chained job has %d channels", len(st.Channels))
	}
	for _, ts := range st.Tasks {
		if ts.BatchesIn != 0 || ts.BatchesOut != 0 {
			t.Fatalf("chained task passed batches: %+v", ts)
		}
	}
	if n != 10_000 {
		t.Fatalf("sink got %d records", n)
	}

	// A key-by, a change of parallelism and DisableChaining each split.
	env = stream.NewEnvironment("split", stream.WithParallelism(2))
	src = stream.FromSource(env, "src", generator(100, 10))
	m = stream.Map(src, "map", func(r operators.SensorReading) (operators.SensorReading, error) { return r, nil })
	k := stream.KeyBy(m, bySensor).Reduce("reduce", func(a, b operators.SensorReading) (operators.SensorReading, error) { return b, nil }).UID("reduce")
	f = k.Filter("filter", func(operators.SensorReading) bool { return true }).SetParallelism(1)
	f.ForEach("sink", func(operators.SensorReading) error { return nil }).SetParallelism(1)
	f2 := stream.Map(k, "unchained", func(r operators.SensorReading) (operators.SensorReading, error) { return r, nil }).DisableChaining()
	f2.ForEach("sink2", func(operators.SensorReading) error { return nil })
	plan, err = env.Plan()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, c := range plan.Chains {
		names = append(names, c.Name())
	}
	want := []string{"src -> map", "reduce", "filter -> sink", "unchained", "sink2"}
	if strings.Join(names, "|") != strings.Join(want, "|") {
		t.Fatalf("chains %q, want %q", names, want)
	}
}

func TestUnion(t *testing.T) {
	env := stream.NewEnvironment("union")
	a := stream.FromSource(env, "a", generator(1000, 10))
	b := stream.FromSource(env, "b", generator(500, 10)).SetParallelism(2)
	sink := operators.NewCollectSink[operators.SensorReading]()
	a.Union(b).To("collect", sink.Subtask)
	if err := execute(t, env); err != nil {
		t.Fatal(err)
	}
	if sink.Len() != 1500 {
		t.Fatalf("union delivered %d records, want 1500", sink.Len())
	}
}

// A panic in a user function fails the job with an error naming the
// operator and the subtask, and the job stops cleanly (goleak checks).
func TestPanicFailsJob(t *testing.T) {
	env := stream.NewEnvironment("boom", stream.WithParallelism(2))
	src := stream.FromSource(env, "src", generator(0, 10)) // unbounded
	keyed := stream.KeyBy(src, bySensor).Stream()
	m := stream.Map(keyed, "explode", func(r operators.SensorReading) (operators.SensorReading, error) {
		if r.ID == "sensor_7" && r.Timestamp > operators.DefaultGeneratorStart+50 {
			panic("sensor 7 exploded")
		}
		return r, nil
	})
	m.ForEach("sink", func(operators.SensorReading) error { return nil })
	err := execute(t, env)
	var te *actors.TaskError
	if !errors.As(err, &te) {
		t.Fatalf("got %v, want a *actors.TaskError", err)
	}
	owner := keygroup.Subtask(keygroup.Of(keygroup.HashString("sensor_7"), 128), 2, 128)
	if te.Operator != "explode" || te.Subtask != owner || !te.Panic || !strings.Contains(err.Error(), "sensor 7 exploded") {
		t.Fatalf("error %q (operator %q subtask %d panic %v), want explode subtask %d", err, te.Operator, te.Subtask, te.Panic, owner)
	}
	if len(te.Stack) == 0 {
		t.Fatal("panic without stack")
	}
}

// An error returned by a chained map fails the job naming that map, not the
// operators around it.
func TestErrorNamesChainedOperator(t *testing.T) {
	env := stream.NewEnvironment("err")
	src := stream.FromSource(env, "src", generator(1000, 10))
	m1 := stream.Map(src, "first", func(r operators.SensorReading) (operators.SensorReading, error) { return r, nil })
	m2 := stream.Map(m1, "second", func(r operators.SensorReading) (int, error) {
		if r.ID == "sensor_3" {
			return 0, errors.New("bad reading")
		}
		return 1, nil
	})
	f := m2.Filter("third", func(int) bool { return true })
	f.ForEach("sink", func(int) error { return nil })
	err := execute(t, env)
	var te *actors.TaskError
	if !errors.As(err, &te) || te.Operator != "second" || te.Panic || !strings.Contains(err.Error(), "bad reading") {
		t.Fatalf("got %v", err)
	}
}

// A panic in a key function fails the job naming the key-by edge it runs
// for, not only the operator before it: the function runs in the sending
// task, as it routes the record.
func TestKeyFunctionPanicNamesTheKeyByEdge(t *testing.T) {
	env := stream.NewEnvironment("keyboom", stream.WithParallelism(2))
	src := stream.FromSource(env, "src", generator(1000, 10))
	m := stream.Map(src, "tag", func(r operators.SensorReading) (operators.SensorReading, error) { return r, nil })
	keyed := stream.KeyBy(m, func(r operators.SensorReading) string {
		if r.ID == "sensor_7" {
			panic("no key for sensor 7")
		}
		return r.ID
	})
	keyed.Stream().ForEach("count", func(operators.SensorReading) error { return nil })
	err := execute(t, env)
	var te *actors.TaskError
	if !errors.As(err, &te) {
		t.Fatalf("got %v, want a *actors.TaskError", err)
	}
	if te.Operator != "tag" || !te.Panic || len(te.Stack) == 0 ||
		!strings.Contains(err.Error(), `key function of the key-by edge "tag" -> "count"`) ||
		!strings.Contains(err.Error(), "no key for sensor 7") {
		t.Fatalf("error %q (operator %q panic %v, %d bytes of stack), want the key-by edge \"tag\" -> \"count\" named", err, te.Operator, te.Panic, len(te.Stack))
	}
}

func TestStatefulOperatorNeedsUID(t *testing.T) {
	env := stream.NewEnvironment("nouid")
	src := stream.FromSource(env, "src", generator(10, 2))
	stream.KeyBy(src, bySensor).Reduce("reduce", func(a, b operators.SensorReading) (operators.SensorReading, error) { return b, nil }).
		ForEach("sink", func(operators.SensorReading) error { return nil })
	err := execute(t, env)
	if err == nil || !strings.Contains(err.Error(), `"reduce" keeps state`) {
		t.Fatalf("got %v", err)
	}
}

func TestInvalidGraphErrors(t *testing.T) {
	env := stream.NewEnvironment("bad", stream.WithMaxParallelism(4))
	src := stream.FromSource(env, "src", generator(10, 2)).SetParallelism(8)
	src.Forward().ForEach("sink", func(operators.SensorReading) error { return nil }).SetParallelism(2)
	err := execute(t, env)
	if err == nil || !errors.Is(err, actors.ErrInvalidJob) ||
		!strings.Contains(err.Error(), "parallelism 8 exceeds max parallelism 4") ||
		!strings.Contains(err.Error(), "forward needs equal parallelism") {
		t.Fatalf("got %v", err)
	}
}

// floatKeyed is a record keyed by a float, for the NaN key test.
type floatKeyed struct {
	Key float64
	TS  int64
}

// A record whose key is not equal to itself (a float NaN) fails its task
// with ErrNaNKey, naming the key, on a rolling aggregate and on a window
// alike. Before, keyed state never found such a key again: the rolling
// count of NaN started at 1 on every record, and the window results of
// NaN vanished, without an error.
func TestNaNKeyFailsTheJob(t *testing.T) {
	recs := []floatKeyed{{1, 1}, {math.NaN(), 2}, {1, 3}, {math.NaN(), 4}}
	source := func() operators.Source[floatKeyed] {
		return operators.NewGenerator(operators.GeneratorConfig{Count: int64(len(recs))}, func(i int64) floatKeyed { return recs[i] })
	}
	byKey := func(r floatKeyed) float64 { return r.Key }
	count := operators.ReduceFunction(func(a, b floatKeyed) (floatKeyed, error) { return floatKeyed{a.Key, a.TS + b.TS}, nil })
	for _, tc := range []struct {
		name  string
		build func(env *stream.Environment)
	}{
		{"rolling", func(env *stream.Environment) {
			k := stream.KeyBy(stream.FromSource(env, "src", source), byKey)
			stream.Aggregate(k, "sum", count).UID("sum").ForEach("out", func(floatKeyed) error { return nil })
		}},
		{"window", func(env *stream.Environment) {
			s := stream.FromSource(env, "src", source).AssignTimestampsAndWatermarks("ts",
				watermark.ForMonotonous(func(r floatKeyed) int64 { return r.TS }))
			w := stream.Window(stream.KeyBy(s, byKey), operators.TumblingEventTimeWindows(time.Second))
			stream.WindowAggregate(w, "sum", count).UID("sum").ForEach("out", func(operators.WindowResult[float64, floatKeyed]) error { return nil })
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := stream.NewEnvironment("nan-key", stream.WithParallelism(2))
			tc.build(env)
			err := execute(t, env)
			if !errors.Is(err, stream.ErrNaNKey) || !strings.Contains(err.Error(), "NaN (float64)") {
				t.Fatalf("job with NaN keys: %v, want ErrNaNKey naming the key", err)
			}
			if testing.Verbose() {
				t.Log(err)
			}
		})
	}
}

// zeroKeyed is a key holding a float among other fields.
type zeroKeyed struct {
	Name string
	X    float64
}

// -0 and +0 are one key (-0 == +0, as keyed state compares keys), on both
// backends and whatever the key type: a float key or a struct holding one.
// Before, the bolt backend kept two states for a float key (its encoding
// tells them apart), and the memory backend two for a struct key (the
// struct is hashed by its encoding, so -0 and +0 went to other key groups).
func TestNegativeZeroKeyIsTheKeyZero(t *testing.T) {
	negz := math.Copysign(0, -1)
	var recs []floatKeyed
	for i := range 10 {
		recs = append(recs, floatKeyed{0, int64(i)}, floatKeyed{negz, int64(i)})
	}
	source := func() operators.Source[floatKeyed] {
		return operators.NewGenerator(operators.GeneratorConfig{Count: int64(len(recs))}, func(i int64) floatKeyed { return recs[i] })
	}
	for _, tc := range []struct {
		name string
		bolt bool
		keyF func(r floatKeyed) zeroKeyed
	}{
		{"float/memory", false, nil},
		{"float/bolt", true, nil},
		{"struct/memory", false, func(r floatKeyed) zeroKeyed { return zeroKeyed{"a", r.Key} }},
		{"struct/bolt", true, func(r floatKeyed) zeroKeyed { return zeroKeyed{"a", r.Key} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := []stream.Option{stream.WithParallelism(2)}
			if tc.bolt {
				opts = append(opts, stream.WithBoltStateBackend(t.TempDir()))
			}
			env := stream.NewEnvironment("zero-key", opts...)
			src := stream.FromSource(env, "src", source).SetParallelism(1)
			sink := operators.NewCollectSink[int64]()
			var agg countFloatKeyed
			var out *stream.Stream[int64]
			if tc.keyF == nil {
				out = stream.Aggregate(stream.KeyBy(src, func(r floatKeyed) float64 { return r.Key }), "count", agg)
			} else {
				out = stream.Aggregate(stream.KeyBy(src, tc.keyF), "count", agg)
			}
			out.UID("count").To("sink", func() operators.Sink[int64] { return sink.Subtask() })
			if err := execute(t, env); err != nil {
				t.Fatal(err)
			}
			var most int64
			for _, n := range sink.Values() {
				most = max(most, n)
			}
			if most != int64(len(recs)) {
				t.Fatalf("the largest count is %d, want %d: -0 and +0 were counted as two keys", most, len(recs))
			}
		})
	}
}

// countFloatKeyed counts the records of a key.
type countFloatKeyed struct{}

func (countFloatKeyed) CreateAccumulator() int64        { return 0 }
func (countFloatKeyed) Add(_ floatKeyed, n int64) int64 { return n + 1 }
func (countFloatKeyed) Result(n int64) int64            { return n }
