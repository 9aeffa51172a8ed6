package stream_test

import (
	"fmt"
	"math"
	"sync/atomic"
	"testing"

	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/snapshot"
	"github.com/edgedio/edged/state"
	"github.com/edgedio/edged/stream"
)

// oddKey is a struct key of strings a byte-wise or Unicode-naive hash could
// confuse and int64 extremes.
type oddKey struct {
	Name string
	N    int64
}

var oddKeys = []oddKey{
	{"", 0}, {"日本語", math.MinInt64}, {"ß", math.MaxInt64}, {"a\x00b", -1}, {"🙂", 1},
	{"e\u0301", 0}, {"é", 0}, {" ", math.MinInt64 + 1}, {"k", 42}, {"K", 42},
}

type oddRecord struct {
	K oddKey
	V int64
}

type oddRule struct {
	Name   string
	Factor int64
}

// oddResult is what the broadcast function emits per keyed record: the
// key's running count and sum, and what it read of broadcast state.
type oddResult struct {
	K      oddKey
	Count  int64
	Sum    int64
	Factor int64
	Seen   int64
}

// oddBroadcast keeps a count and sum per key, and in broadcast state the
// rules by name and how many it has taken ("#seen").
type oddBroadcast struct {
	rules      state.Broadcast[string, int64]
	ro         state.ReadOnlyBroadcast[string, int64]
	count, sum state.Value[int64]
	taken      *atomic.Int64
}

func (f *oddBroadcast) Open(rt *operators.BroadcastRuntime[oddKey]) error {
	var err error
	if f.rules, err = state.BroadcastState[string, int64](rt.Store(), "rules"); err != nil {
		return err
	}
	if f.ro, err = state.ReadOnlyBroadcastState[string, int64](rt.Store(), "rules"); err != nil {
		return err
	}
	if f.count, err = state.NewValue(rt.Backend(), rt.Keys(), state.ValueDescriptor[int64]{Name: "count"}); err != nil {
		return err
	}
	f.sum, err = state.NewValue(rt.Backend(), rt.Keys(), state.ValueDescriptor[int64]{Name: "sum"})
	return err
}

func (f *oddBroadcast) ProcessElement(r oddRecord, ctx *operators.KeyedContext[oddKey, oddResult]) error {
	if ctx.CurrentKey() != r.K {
		return fmt.Errorf("current key %+v for a record of %+v", ctx.CurrentKey(), r.K)
	}
	c, _ := f.count.Get()
	s, _ := f.sum.Get()
	f.count.Update(c + 1)
	f.sum.Update(s + r.V)
	fac, _ := f.ro.Get("f")
	seen, _ := f.ro.Get("#seen")
	ctx.Emit(oddResult{K: r.K, Count: c + 1, Sum: s + r.V, Factor: fac, Seen: seen})
	return nil
}

func (f *oddBroadcast) ProcessBroadcastElement(r oddRule, _ *operators.BroadcastContext[oddResult]) error {
	f.rules.Put(r.Name, r.Factor)
	n, _ := f.rules.Get("#seen")
	f.rules.Put("#seen", n+1)
	f.taken.Add(1)
	return nil
}

func (f *oddBroadcast) OnTimer(int64, *operators.KeyedContext[oddKey, oddResult]) error { return nil }

// A broadcast-state job keyed by struct keys of odd strings and int64
// extremes, stopped with a savepoint and resumed at another parallelism:
// every new subtask has the broadcast state once (the rules are not taken
// again, their count is not doubled), and every key finds its count and
// sum again, so each key's results go on from where they stopped.
func TestBroadcastStateAndOddKeysAcrossRescale(t *testing.T) {
	var events []oddRecord
	for i := range 3000 {
		events = append(events, oddRecord{oddKeys[(i*7+i/3)%len(oddKeys)], int64(i%13 + 1)})
	}
	rules := []oddRule{{"f", 3}, {"x", 1}, {"f", 5}}
	half := 1700
	build := func(p int, gate chan struct{}, taken *atomic.Int64, sink *operators.CollectSink[oddResult], opts ...stream.Option) *stream.Environment {
		cfg := snapshot.DefaultConfig()
		cfg.Dir = t.TempDir()
		env := stream.NewEnvironment("odd-broadcast", append([]stream.Option{stream.WithParallelism(p), stream.WithCheckpointing(cfg)}, opts...)...)
		ev := stream.FromSource(env, "events", newUserGatedSlice(events, half, gate)).SetParallelism(1).UID("events")
		rs := stream.FromSource(env, "rules", newUserSlice(rules)).SetParallelism(1).UID("rules")
		out := stream.ConnectBroadcast(stream.KeyBy(ev, func(r oddRecord) oddKey { return r.K }), rs, "apply",
			func() operators.KeyedBroadcastProcessFunction[oddKey, oddRecord, oddRule, oddResult] {
				return &oddBroadcast{taken: taken}
			}).UID("apply")
		out.To("sink", func() operators.Sink[oddResult] { return sink.Subtask() }).UID("sink")
		return env
	}
	for _, ps := range [][2]int{{2, 3}, {3, 1}, {1, 4}, {4, 2}} {
		t.Run(fmt.Sprintf("%d->%d", ps[0], ps[1]), func(t *testing.T) {
			first := operators.NewCollectSink[oddResult]()
			var taken atomic.Int64
			job, err := build(ps[0], make(chan struct{}), &taken, first).ExecuteAsync(userCtx(t))
			if err != nil {
				t.Fatal(err)
			}
			testutil.Eventually(t, 0, "the rules in every subtask and the first events", func() bool {
				return taken.Load() == int64(ps[0]*len(rules)) && first.Len() == half
			})
			sp, err := job.StopWithSavepoint(userCtx(t), "")
			if err != nil {
				t.Fatalf("StopWithSavepoint: %v", err)
			}
			if err := job.Wait(); err != nil {
				t.Fatalf("Wait: %v", err)
			}
			second := operators.NewCollectSink[oddResult]()
			var taken2 atomic.Int64
			open := make(chan struct{})
			close(open)
			if err := build(ps[1], open, &taken2, second, stream.WithSavepoint(sp, false)).Execute(userCtx(t)); err != nil {
				t.Fatalf("Execute from %s: %v", sp, err)
			}
			if n := taken2.Load(); n != 0 {
				t.Errorf("the restored job took %d rules again", n)
			}
			last := map[oddKey]oddResult{}
			for _, r := range first.Values() {
				last[r.K] = r
			}
			for _, r := range second.Values() {
				if r.Factor != 5 || r.Seen != int64(len(rules)) {
					t.Fatalf("after the restore %+v read factor %d and %d rules, want 5 and %d", r.K, r.Factor, r.Seen, len(rules))
				}
				if l := last[r.K]; r.Count != l.Count+1 {
					t.Fatalf("key %+v: count %d after %d", r.K, r.Count, l.Count)
				}
				last[r.K] = r
			}
			want := map[oddKey][2]int64{}
			for _, e := range events {
				w := want[e.K]
				want[e.K] = [2]int64{w[0] + 1, w[1] + e.V}
			}
			for k, w := range want {
				if l := last[k]; l.Count != w[0] || l.Sum != w[1] {
					t.Errorf("key %+v ends at count %d sum %d, want %d %d", k, l.Count, l.Sum, w[0], w[1])
				}
			}
			if n := first.Len() + second.Len(); n != len(events) {
				t.Errorf("%d results, want %d", n, len(events))
			}
		})
	}
}
