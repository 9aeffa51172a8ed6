package stream_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/edgedio/edged/actors"
	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/snapshot"
	"github.com/edgedio/edged/stream"
	"github.com/edgedio/edged/watermark"
)

func ints(n int64) func() operators.Source[int64] {
	return func() operators.Source[int64] {
		return operators.NewGenerator(operators.GeneratorConfig{Count: n}, func(i int64) int64 { return i })
	}
}

func discard() operators.Sink[int64] { return operators.NewSinkFunc(func(int64) error { return nil }) }

// openPanics is an operator whose Open panics.
type openPanics struct {
	operators.Base
}

func (openPanics) Open(*operators.Context) error { panic("user bug in Open") }
func (openPanics) Collect(int64)                 {}

// keyedNoop is a keyed function that does nothing.
type keyedNoop struct {
	operators.KeyedProcessBase[int64, int64]
}

func (keyedNoop) ProcessElement(int64, *operators.KeyedContext[int64, int64]) error { return nil }

// A user factory that panics or returns nil, or an Open that panics, is
// called while the job's tasks are built: the job fails with a TaskError
// naming the operator, as a panic while it runs does, and the program
// goes on. With checkpoints, where Plan also builds one source to ask it
// whether it can replay, the same holds.
func TestFailingFactoryFailsTheJob(t *testing.T) {
	cases := []struct {
		name      string
		build     func(env *stream.Environment)
		operator  string
		panicked  bool
		errSubstr string
	}{
		{"newSource panics", func(env *stream.Environment) {
			stream.FromSource(env, "src", func() operators.Source[int64] { panic("user bug in newSource") }).To("sink", discard)
		}, "src", true, "user bug in newSource"},
		{"newSource returns nil", func(env *stream.Environment) {
			stream.FromSource(env, "src", func() operators.Source[int64] { return nil }).To("sink", discard)
		}, "src", false, "the source factory returned nil"},
		{"newSink panics", func(env *stream.Environment) {
			stream.FromSource(env, "src", ints(10)).To("sink", func() operators.Sink[int64] { panic("user bug in newSink") })
		}, "sink", true, "user bug in newSink"},
		{"newSink returns nil", func(env *stream.Environment) {
			stream.FromSource(env, "src", ints(10)).To("sink", func() operators.Sink[int64] { return nil })
		}, "sink", false, "the factory returned nil"},
		{"newOp returns nil", func(env *stream.Environment) {
			stream.Transform(stream.FromSource(env, "src", ints(10)), "op",
				func(operators.Collector[int64]) operators.OneInput[int64] { return nil }).To("sink", discard)
		}, "op", false, "the factory returned nil"},
		{"Open panics", func(env *stream.Environment) {
			stream.Transform(stream.FromSource(env, "src", ints(10)), "op",
				func(operators.Collector[int64]) operators.OneInput[int64] { return openPanics{} }).To("sink", discard)
		}, "op", true, "user bug in Open"},
		{"KeyedProcess factory panics", func(env *stream.Environment) {
			k := stream.KeyBy(stream.FromSource(env, "src", ints(10)), func(i int64) int64 { return i % 3 })
			stream.KeyedProcess(k, "kp", func() operators.KeyedProcessFunction[int64, int64, int64] {
				panic("user bug in the factory")
			}).UID("kp").To("sink", discard)
		}, "kp", true, "user bug in the factory"},
		{"KeyedProcess factory returns nil", func(env *stream.Environment) {
			k := stream.KeyBy(stream.FromSource(env, "src", ints(10)), func(i int64) int64 { return i % 3 })
			stream.KeyedProcess(k, "kp", func() operators.KeyedProcessFunction[int64, int64, int64] { return nil }).
				UID("kp").To("sink", discard)
		}, "kp", false, "the function factory returned nil"},
		{"Process factory returns nil", func(env *stream.Environment) {
			stream.Process(stream.FromSource(env, "src", ints(10)), "p", func() operators.ProcessFunction[int64, int64] { return nil }).
				To("sink", discard)
		}, "p", false, "the function factory returned nil"},
	}
	for _, c := range cases {
		withAndWithoutCheckpoints(t, c.name, func(t *testing.T, opts ...stream.Option) {
			env := stream.NewEnvironment("factory", opts...)
			c.build(env)
			if _, err := env.Plan(); err != nil {
				t.Fatalf("Plan: %v", err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			err := env.Execute(ctx)
			var te *actors.TaskError
			if !errors.As(err, &te) {
				t.Fatalf("Execute returned %v (%T), want a *actors.TaskError", err, err)
			}
			if te.Operator != c.operator || te.UID != c.operator || te.Subtask != 0 || te.Panic != c.panicked {
				t.Fatalf("TaskError operator %q uid %q subtask %d panic %v, want operator and uid %q, subtask 0, panic %v: %v",
					te.Operator, te.UID, te.Subtask, te.Panic, c.operator, c.panicked, err)
			}
			if !strings.Contains(err.Error(), c.errSubstr) {
				t.Fatalf("error %q does not say %q", err, c.errSubstr)
			}
			if c.panicked && len(te.Stack) == 0 {
				t.Fatal("a panic's TaskError has no stack")
			}
		})
	}
}

// withAndWithoutCheckpoints runs f as the subtest name without
// checkpoints, and as name/checkpoints with exactly-once ones.
func withAndWithoutCheckpoints(t *testing.T, name string, f func(t *testing.T, opts ...stream.Option)) {
	t.Run(name, func(t *testing.T) { f(t) })
	t.Run(name+"/checkpoints", func(t *testing.T) {
		f(t, stream.WithCheckpointing(checkpointConfig(t, snapshot.ExactlyOnce)))
	})
}

// A nil user function given to the stream API is refused by Plan and by
// Execute with an error naming the operator, before anything runs.
func TestNilFunctionIsRefusedByPlan(t *testing.T) {
	src := func(env *stream.Environment) *stream.Stream[int64] { return stream.FromSource(env, "src", ints(10)) }
	keyed := func(env *stream.Environment) *stream.KeyedStream[int64, int64] {
		return stream.KeyBy(src(env), func(i int64) int64 { return i % 3 })
	}
	win := func(env *stream.Environment) *stream.WindowedStream[int64, int64] {
		return stream.Window(keyed(env), operators.TumblingEventTimeWindows(time.Second))
	}
	cases := []struct {
		name  string
		build func(env *stream.Environment)
		want  string
	}{
		{"FromSource", func(env *stream.Environment) {
			stream.FromSource[int64](env, "src", nil).To("sink", discard)
		}, `operator "src": newSource is nil`},
		{"To", func(env *stream.Environment) { src(env).To("sink", nil) }, `operator "sink": newSink is nil`},
		{"ForEach", func(env *stream.Environment) { src(env).ForEach("each", nil) }, `operator "each": the ForEach function is nil`},
		{"Transform", func(env *stream.Environment) {
			stream.Transform[int64, int64](src(env), "op", nil).To("sink", discard)
		}, `operator "op": newOp is nil`},
		{"Map", func(env *stream.Environment) {
			stream.Map[int64, int64](src(env), "map", nil).To("sink", discard)
		}, `operator "map": the map function is nil`},
		{"FlatMap", func(env *stream.Environment) {
			stream.FlatMap[int64, int64](src(env), "fm", nil).To("sink", discard)
		}, `operator "fm": the flat-map function is nil`},
		{"Filter", func(env *stream.Environment) { src(env).Filter("f", nil).To("sink", discard) }, `operator "f": the filter function is nil`},
		{"KeyBy", func(env *stream.Environment) {
			stream.KeyBy[int64, int64](src(env), nil).Reduce("r", func(a, b int64) (int64, error) { return a + b, nil }).UID("r").To("sink", discard)
		}, "KeyBy: the key function is nil"},
		{"Reduce", func(env *stream.Environment) {
			keyed(env).Reduce("r", nil).UID("r").To("sink", discard)
		}, `operator "r": the reduce function is nil`},
		{"Aggregate", func(env *stream.Environment) {
			stream.Aggregate[int64, int64, int64, int64](keyed(env), "agg", nil).UID("agg").To("sink", discard)
		}, `operator "agg": the aggregate function is nil`},
		{"Process", func(env *stream.Environment) {
			stream.Process[int64, int64](src(env), "p", nil).To("sink", discard)
		}, `operator "p": the function factory is nil`},
		{"KeyedProcess", func(env *stream.Environment) {
			stream.KeyedProcess[int64, int64, int64](keyed(env), "kp", nil).UID("kp").To("sink", discard)
		}, `operator "kp": the function factory is nil`},
		{"ConnectBroadcast", func(env *stream.Environment) {
			stream.ConnectBroadcast[int64, int64, int64, int64](keyed(env), stream.FromSource(env, "rules", ints(1)), "cb", nil).
				UID("cb").To("sink", discard)
		}, `operator "cb": the function factory is nil`},
		{"Window.Reduce", func(env *stream.Environment) {
			win(env).Reduce("w", nil).UID("w")
		}, `operator "w": the reduce function is nil`},
		{"WindowAggregate", func(env *stream.Environment) {
			stream.WindowAggregate[int64, int64, int64, int64](win(env), "w", nil).UID("w")
		}, `operator "w": the aggregate function is nil`},
		{"WindowProcess", func(env *stream.Environment) {
			stream.WindowProcess[int64, int64, int64](win(env), "w", nil).UID("w").To("sink", discard)
		}, `operator "w": the window function is nil`},
	}
	for _, c := range cases {
		withAndWithoutCheckpoints(t, c.name, func(t *testing.T, opts ...stream.Option) {
			env := stream.NewEnvironment("nil", opts...)
			c.build(env)
			_, err := env.Plan()
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Plan: %v, want an error saying %q", err, c.want)
			}
			if err := env.Execute(context.Background()); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Execute: %v, want an error saying %q", err, c.want)
			}
		})
	}
	// The same job with every function given plans.
	env := stream.NewEnvironment("ok")
	stream.KeyedProcess(stream.KeyBy(stream.FromSource(env, "src", ints(10)), func(i int64) int64 { return i % 3 }), "kp",
		func() operators.KeyedProcessFunction[int64, int64, int64] { return keyedNoop{} }).UID("kp").To("sink", discard)
	if err := env.Execute(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// A negative allowed lateness, or one that is not a whole number of
// milliseconds (1.5ms was kept as 1ms without a word), is refused like
// the other bad window settings; zero and a positive one are accepted.
func TestNegativeAllowedLatenessIsRefused(t *testing.T) {
	for _, d := range []time.Duration{-5 * time.Second, -time.Millisecond, 0, time.Second, 1500 * time.Microsecond, time.Nanosecond} {
		env := stream.NewEnvironment("lateness")
		k := stream.KeyBy(stream.FromSource(env, "src", ints(10)), func(i int64) int64 { return i % 3 })
		stream.Window(k, operators.TumblingEventTimeWindows(10*time.Second)).AllowedLateness(d).
			Reduce("w", func(a, b int64) (int64, error) { return a + b, nil }).UID("w").
			ForEach("out", func(operators.WindowResult[int64, int64]) error { return nil })
		_, err := env.Plan()
		if d < 0 || d%time.Millisecond != 0 {
			want := "window.allowed_lateness (" + d.String() + ") must not be negative"
			if d > 0 {
				want = "window.allowed_lateness (" + d.String() + ") must be a whole number of milliseconds"
			}
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("lateness %v: Plan: %v, want %q", d, err, want)
			}
			if err := env.Execute(context.Background()); err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("lateness %v: Execute: %v, want %q", d, err, want)
			}
		} else if err != nil {
			t.Fatalf("lateness %v: %v", d, err)
		}
	}
}

// A max parallelism out of [1,32768], 0 included, is refused by Plan and
// Execute of a keyed job; the bounds themselves run.
func TestMaxParallelismOutOfRangeIsRefused(t *testing.T) {
	for _, n := range []int{0, -3, 32769, 40000, 1, 32768} {
		env := stream.NewEnvironment("maxpar", stream.WithMaxParallelism(n))
		if got := env.MaxParallelism(); got != n {
			t.Fatalf("MaxParallelism() = %d after WithMaxParallelism(%d)", got, n)
		}
		k := stream.KeyBy(stream.FromSource(env, "src", ints(100)), func(i int64) int64 { return i % 7 })
		k.Reduce("r", func(a, b int64) (int64, error) { return a + b, nil }).UID("r").To("sink", discard)
		_, planErr := env.Plan()
		err := env.Execute(context.Background())
		if n >= 1 && n <= 32768 {
			if planErr != nil || err != nil {
				t.Fatalf("max parallelism %d: Plan %v, Execute %v", n, planErr, err)
			}
			continue
		}
		for _, e := range []error{planErr, err} {
			if e == nil || !strings.Contains(e.Error(), "out of range [1,32768]") {
				t.Fatalf("max parallelism %d: %v, want out of range [1,32768]", n, e)
			}
			var te *actors.TaskError
			if errors.As(e, &te) {
				t.Fatalf("max parallelism %d: a task failed: %v", n, e)
			}
		}
	}
}

// Two side-output tags with the same id and different types on one
// operator are refused by Plan with an error naming the id and both
// types; the same tag taken twice is fine.
func TestSideOutputTagWithTwoTypesIsRefused(t *testing.T) {
	env := stream.NewEnvironment("tags")
	m := stream.Map(stream.FromSource(env, "src", ints(10)), "m", func(i int64) (int64, error) { return i, nil })
	stream.SideOutput(m, operators.NewOutputTag[int64]("errors")).To("a", discard)
	stream.SideOutput(m, operators.NewOutputTag[int64]("errors")).To("b", discard)
	if _, err := env.Plan(); err != nil {
		t.Fatalf("the same tag twice: %v", err)
	}
	stream.SideOutput(m, operators.NewOutputTag[string]("errors")).
		To("c", func() operators.Sink[string] { return operators.NewSinkFunc(func(string) error { return nil }) })
	want := `operator "m": side output "errors" is used with two types, int64 and string`
	if _, err := env.Plan(); err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("Plan: %v, want %q", err, want)
	}
	if err := env.Execute(context.Background()); err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("Execute: %v, want %q", err, want)
	}
}

// A key type that has no encoding (an interface) is refused by Plan and
// Execute, naming the type, instead of panicking in KeyBy.
func TestKeyByInterfaceKeyIsRefused(t *testing.T) {
	env := stream.NewEnvironment("anykey")
	stream.KeyBy(stream.FromSource(env, "src", ints(10)), func(i int64) any { return i }).Stream().To("out", discard)
	want := "KeyBy: key type interface {} cannot be a key"
	if _, err := env.Plan(); err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("Plan: %v, want %q", err, want)
	}
	if err := env.Execute(context.Background()); err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("Execute: %v, want %q", err, want)
	}
}

// With checkpoints (or a savepoint to start from), an operator that may
// keep state and shares its name with another must have a UID of its
// own: its uid would be derived from the name and the order of creation
// ("readings", "readings-2"), so a job that creates the two sources in the
// other order restored each one's position into the other and committed
// records twice or never (a probe: 602 of 5,000 lines repeated, 602
// lost, no error). Plan and Execute refuse it, naming the operator; the
// stateless built-ins (Map, FlatMap, Filter, ForEach) may share a name,
// and without checkpoints nothing is matched by uid.
func TestRepeatedNameWithoutUIDIsRefusedWithCheckpoints(t *testing.T) {
	src := func(env *stream.Environment, name string) *stream.Stream[int64] {
		return stream.FromSource(env, name, ints(10))
	}
	id := func(i int64) (int64, error) { return i, nil }
	sinks := func() operators.Sink[int64] {
		return operators.NewFileSink(t.TempDir(), func(i int64) string { return fmt.Sprint(i) })
	}
	cases := []struct {
		name    string
		build   func(env *stream.Environment)
		refused string // the operator name in the error, "" when the job runs
	}{
		{"two sources", func(env *stream.Environment) {
			src(env, "readings").Union(src(env, "readings")).To("out", discard)
		}, "readings"},
		{"two sinks", func(env *stream.Environment) {
			s := src(env, "src")
			s.To("files", sinks)
			s.To("files", sinks)
		}, "files"},
		{"two timestamp assigners", func(env *stream.Environment) {
			wm := watermark.ForMonotonous(func(i int64) int64 { return i })
			src(env, "a").AssignTimestampsAndWatermarks("ts", wm).Union(src(env, "b").AssignTimestampsAndWatermarks("ts", wm)).To("out", discard)
		}, "ts"},
		{"two transforms", func(env *stream.Environment) {
			op := func(out operators.Collector[int64]) operators.OneInput[int64] { return operators.NewMap(id, out) }
			s := src(env, "src")
			stream.Transform(s, "op", op).To("a", discard)
			stream.Transform(s, "op", op).To("b", discard)
		}, "op"},
		{"two sources with uids", func(env *stream.Environment) {
			src(env, "readings").UID("a").Union(src(env, "readings").UID("b")).To("out", discard)
		}, ""},
		{"stateless built-ins", func(env *stream.Environment) {
			s := src(env, "src")
			stream.Map(s, "m", id).Filter("f", func(int64) bool { return true }).ForEach("each", func(int64) error { return nil })
			stream.Map(s, "m", id).Filter("f", func(int64) bool { return true }).ForEach("each", func(int64) error { return nil })
			stream.FlatMap(s, "m", func(i int64, out operators.Collector[int64]) error { out.Collect(i); return nil }).To("out", discard)
		}, ""},
	}
	for _, c := range cases {
		withAndWithoutCheckpoints(t, c.name, func(t *testing.T, opts ...stream.Option) {
			env := stream.NewEnvironment("repeated", opts...)
			c.build(env)
			_, planErr := env.Plan()
			err := env.Execute(context.Background())
			if c.refused == "" || len(opts) == 0 {
				if planErr != nil || err != nil {
					t.Fatalf("Plan %v, Execute %v; want the job to run", planErr, err)
				}
				return
			}
			want := fmt.Sprintf(`operators are named %q; with checkpoints state is matched by uid`, c.refused)
			for _, e := range []error{planErr, err} {
				if e == nil || !strings.Contains(e.Error(), want) || !strings.Contains(e.Error(), "call UID(...) on it") {
					t.Fatalf("got %v, want an error saying %q", e, want)
				}
			}
		})
	}
}

// A built-in restart strategy with values its YAML form refuses is an
// error of the plan, not a job that silently never restarts; valid ones
// and a strategy of the user's own plan.
func TestBadRestartStrategyIsRefused(t *testing.T) {
	cases := []struct {
		s    snapshot.RestartStrategy
		want string
	}{
		{&snapshot.FixedDelay{Attempts: -1, Delay: time.Second}, "restart.attempts (-1) must not be negative"},
		{&snapshot.FixedDelay{Attempts: 3, Delay: -time.Second}, "restart.delay (-1s) must not be negative"},
		{&snapshot.FailureRate{MaxFailures: 0, Interval: time.Minute}, "restart.max_failures (0) must be at least 1"},
		{&snapshot.FailureRate{MaxFailures: 3, Interval: time.Second, Delay: time.Second}, "restart.interval (1s) must exceed restart.delay (1s)"},
		{(*snapshot.FixedDelay)(nil), "nil *snapshot.FixedDelay"},
		{(*snapshot.FailureRate)(nil), "nil *snapshot.FailureRate"},
		{&snapshot.FixedDelay{Attempts: 0}, ""},
		{&snapshot.FailureRate{MaxFailures: 1, Interval: time.Minute, Delay: time.Second}, ""},
		{snapshot.NoRestart{}, ""},
	}
	for _, c := range cases {
		env := stream.NewEnvironment("restart", stream.WithRestartStrategy(c.s))
		stream.FromSource(env, "src", ints(10)).To("sink", discard)
		_, err := env.Plan()
		if c.want == "" {
			if err != nil {
				t.Errorf("%#v: %v", c.s, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), c.want) || !errors.Is(err, snapshot.ErrInvalidConfig) {
			t.Errorf("%#v: Plan: %v, want snapshot.ErrInvalidConfig saying %q", c.s, err, c.want)
		}
	}
}

// A nil stream given to Union or as ConnectBroadcast's broadcast input is
// refused by Plan and Execute with an error naming it. Before, both
// panicked with a nil pointer dereference inside the stream package while
// the job was built.
func TestNilStreamInUnionAndBroadcastIsRefused(t *testing.T) {
	for _, tc := range []struct {
		name  string
		build func(env *stream.Environment)
		want  string
	}{
		{"union", func(env *stream.Environment) {
			a := stream.FromSource(env, "a", ints(3))
			a.Union(nil).To("sink", discard)
		}, `stream: Union: stream 1 of the union is nil`},
		{"broadcast", func(env *stream.Environment) {
			k := stream.KeyBy(stream.FromSource(env, "a", ints(3)), func(v int64) int64 { return v })
			stream.ConnectBroadcast[int64, int64, int64, int64](k, nil, "rules", func() operators.KeyedBroadcastProcessFunction[int64, int64, int64, int64] {
				return nil
			}).UID("rules").To("sink", discard)
		}, `stream: operator "rules": the broadcast stream is nil`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			func() {
				defer func() {
					if r := recover(); r != nil {
						t.Fatalf("building the job panicked: %v", r)
					}
				}()
				env := stream.NewEnvironment("nil-stream")
				tc.build(env)
				_, err = env.Plan()
			}()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Plan: %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// An operator with an empty name, or given an empty UID, is refused with
// an error that says so. Before, both were reported as `operator "" has no
// uid` or `operator "src" has no uid`, which named neither mistake.
func TestEmptyNameAndEmptyUIDAreNamed(t *testing.T) {
	for _, tc := range []struct {
		name  string
		build func(env *stream.Environment)
		want  string
	}{
		{"empty name", func(env *stream.Environment) {
			stream.FromSource(env, "src", ints(3)).ForEach("", func(int64) error { return nil })
		}, `stream: operator 1 (after "src") has an empty name`},
		{"empty stream uid", func(env *stream.Environment) {
			stream.FromSource(env, "src", ints(3)).UID("").To("sink", discard)
		}, `stream: operator "src": UID("") is empty`},
		{"empty sink uid", func(env *stream.Environment) {
			stream.FromSource(env, "src", ints(3)).To("sink", discard).UID("")
		}, `stream: operator "sink": UID("") is empty`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := stream.NewEnvironment("empty-names")
			tc.build(env)
			_, err := env.Plan()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Plan: %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// A job without any sink is refused: its results would go nowhere, and a
// job whose author forgot To or ForEach ran to the end and returned nil
// with nothing written. A job with a sink on one branch only still runs.
func TestJobWithoutSinkIsRefused(t *testing.T) {
	env := stream.NewEnvironment("no-sink")
	stream.Map(stream.FromSource(env, "src", ints(3)), "double", func(v int64) (int64, error) { return 2 * v, nil })
	_, perr := env.Plan()
	eerr := env.Execute(context.Background())
	for _, err := range []error{perr, eerr} {
		if err == nil || !strings.Contains(err.Error(), `stream: job "no-sink" has no sink`) {
			t.Fatalf("Plan: %v; Execute: %v; want both to say the job has no sink", perr, eerr)
		}
	}

	env = stream.NewEnvironment("one-sink")
	src := stream.FromSource(env, "src", ints(3))
	stream.Map(src, "unused", func(v int64) (int64, error) { return v, nil })
	src.To("sink", discard)
	if err := env.Execute(context.Background()); err != nil {
		t.Fatalf("a job with a sink: %v", err)
	}
}

// oddsToTag sends odd records to tag and even ones to the main output.
type oddsToTag struct{ tag operators.OutputTag[int64] }

func (oddsToTag) Open(*operators.Context) error { return nil }

func (o oddsToTag) ProcessElement(v int64, ctx *operators.ProcessContext[int64]) error {
	if v%2 == 0 {
		ctx.Emit(v)
	} else {
		o.tag.Emit(ctx, v)
	}
	return nil
}

// A side-output tag with an empty id (a zero OutputTag, or
// NewOutputTag("")) is refused by Plan and Execute, in SideOutput and in
// SideOutputLateData, naming the operator. The empty id is the main
// output's: before, SideOutput of such a tag of the main output's type was
// the main output (a split into evens and odds gave [0 2 4] twice and
// lost the odd records without an error), and SideOutputLateData dropped
// the late records while the job read the tag.
func TestSideOutputTagWithEmptyIDIsRefused(t *testing.T) {
	for _, tag := range []operators.OutputTag[int64]{{}, operators.NewOutputTag[int64]("")} {
		env := stream.NewEnvironment("empty-tag")
		p := stream.Process(stream.FromSource(env, "src", ints(6)), "split",
			func() operators.ProcessFunction[int64, int64] { return oddsToTag{tag} })
		p.ForEach("evens", func(int64) error { return nil })
		stream.SideOutput(p, tag).ForEach("odds", func(int64) error { return nil })
		want := `stream: operator "split": SideOutput: the output tag has an empty id`
		if _, err := env.Plan(); err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("Plan: %v, want %q", err, want)
		}
		if err := env.Execute(context.Background()); err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("Execute: %v, want %q", err, want)
		}

		env = stream.NewEnvironment("empty-late-tag")
		timed := stream.FromSource(env, "src", ints(6)).AssignTimestampsAndWatermarks("ts", watermark.ForMonotonous(func(i int64) int64 { return i }))
		stream.Window(stream.KeyBy(timed, func(i int64) int64 { return i % 2 }), operators.TumblingEventTimeWindows(time.Second)).
			SideOutputLateData(tag).Reduce("w", func(a, b int64) (int64, error) { return a + b, nil }).UID("w").
			ForEach("out", func(operators.WindowResult[int64, int64]) error { return nil })
		want = `stream: operator "w": SideOutputLateData: the output tag has an empty id`
		if _, err := env.Plan(); err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("Plan: %v, want %q", err, want)
		}
	}
	// A named tag splits the stream.
	env := stream.NewEnvironment("tag")
	tag := operators.NewOutputTag[int64]("odd")
	p := stream.Process(stream.FromSource(env, "src", ints(6)), "split",
		func() operators.ProcessFunction[int64, int64] { return oddsToTag{tag} })
	evens, odds := operators.NewCollectSink[int64](), operators.NewCollectSink[int64]()
	p.To("evens", evens.Subtask)
	stream.SideOutput(p, tag).To("odds", odds.Subtask)
	if err := env.Execute(context.Background()); err != nil {
		t.Fatal(err)
	}
	if e, o := fmt.Sprint(evens.Values()), fmt.Sprint(odds.Values()); e != "[0 2 4]" || o != "[1 3 5]" {
		t.Fatalf("evens %s, odds %s", e, o)
	}
}

// A key type that holds a pointer is refused by Plan and Execute, naming
// the type and where the pointer is: keyed state, timers and windows find
// a key again by ==, which compares pointers, not what they point to.
// Before, a rolling count keyed by struct{ ID *string } counted 1 for
// every record (9 records of 3 ids gave 1, 1, 1), without an error. Keys
// without pointers run.
func TestKeyByPointerKeyIsRefused(t *testing.T) {
	type ptrKey struct{ ID *string }
	type nested struct {
		Room string
		At   [2]struct{ P *int64 }
	}
	count := func(a, b int64) (int64, error) { return a + b, nil }
	cases := []struct {
		name  string
		build func(env *stream.Environment)
		want  string
	}{
		{"pointer", func(env *stream.Environment) {
			stream.KeyBy(stream.FromSource(env, "src", ints(9)), func(i int64) *int64 { return &i }).
				Reduce("count", count).UID("count").To("out", discard)
		}, "stream: KeyBy: key type *int64 holds a pointer (the type itself)"},
		{"time", func(env *stream.Environment) {
			stream.KeyBy(stream.FromSource(env, "src", ints(9)), func(i int64) struct{ At time.Time } { return struct{ At time.Time }{time.Unix(i, 0)} }).
				Reduce("count", count).UID("count").To("out", discard)
		}, "holds a pointer (field At, a time.Time, whose location is a pointer: key by its UnixNano())"},
		{"struct field", func(env *stream.Environment) {
			stream.KeyBy(stream.FromSource(env, "src", ints(9)), func(i int64) ptrKey { s := fmt.Sprint(i % 3); return ptrKey{&s} }).
				Reduce("count", count).UID("count").To("out", discard)
		}, "holds a pointer (field ID)"},
		{"nested", func(env *stream.Environment) {
			stream.KeyBy(stream.FromSource(env, "src", ints(9)), func(i int64) nested { return nested{Room: "r"} }).
				Reduce("count", count).UID("count").To("out", discard)
		}, "holds a pointer (field At[0].P)"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			env := stream.NewEnvironment("ptr")
			c.build(env)
			if _, err := env.Plan(); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Plan: %v, want %q", err, c.want)
			}
			if err := env.Execute(context.Background()); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Execute: %v, want %q", err, c.want)
			}
		})
	}
	// The same count keyed by the value.
	env := stream.NewEnvironment("value")
	sink := operators.NewCollectSink[int64]()
	stream.KeyBy(stream.Map(stream.FromSource(env, "src", ints(9)), "one", func(int64) (int64, error) { return 1, nil }),
		func(int64) string { return "k" }).Reduce("count", count).UID("count").To("out", sink.Subtask)
	if err := env.Execute(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := sink.Values(); len(got) != 9 || got[8] != 9 {
		t.Fatalf("counts %v, want 1..9", got)
	}
}

// A side output has no operator of its own: SetParallelism, UID,
// StateSettings and SideOutput asked of one are refused with an error
// that names the side output and the operator that emits it, not as if
// the stream were a union.
func TestSideOutputStreamSettingsNameTheSideOutput(t *testing.T) {
	tag := operators.NewOutputTag[int64]("odd")
	for _, c := range []struct {
		call func(odds *stream.Stream[int64])
		want string
	}{
		{func(o *stream.Stream[int64]) { o.SetParallelism(3) }, `stream: SetParallelism on side output "odd" of operator "split"`},
		{func(o *stream.Stream[int64]) { o.Rebalance().SetParallelism(3) }, `stream: SetParallelism on side output "odd" of operator "split"`},
		{func(o *stream.Stream[int64]) { o.UID("odds") }, `stream: UID on side output "odd" of operator "split"`},
		{func(o *stream.Stream[int64]) { o.StateSettings("x") }, `stream: StateSettings on side output "odd" of operator "split"`},
		{func(o *stream.Stream[int64]) { o.DisableChaining() }, `stream: DisableChaining on side output "odd" of operator "split"`},
		{func(o *stream.Stream[int64]) { stream.SideOutput(o, tag) }, `stream: SideOutput("odd") of side output "odd" of operator "split"`},
	} {
		env := stream.NewEnvironment("side")
		p := stream.Process(stream.FromSource(env, "src", ints(6)), "split",
			func() operators.ProcessFunction[int64, int64] { return oddsToTag{tag} })
		p.ForEach("evens", func(int64) error { return nil })
		odds := stream.SideOutput(p, tag)
		c.call(odds)
		odds.ForEach("odds", func(int64) error { return nil })
		if _, err := env.Plan(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("Plan: %v, want %q", err, c.want)
		}
	}
}

// BatchBytes without a size function or with a limit below one byte, or
// on a union, is refused when the job is built, naming the operator.
func TestBatchBytesRefusedSettings(t *testing.T) {
	size := func(int64) int { return 8 }
	for _, c := range []struct {
		name, want string
		build      func(env *stream.Environment)
	}{
		{"zero limit", `BatchBytes on operator "src": want a size function and a limit of at least 1 byte, got limit 0`, func(env *stream.Environment) {
			stream.FromSource(env, "src", ints(10)).BatchBytes(size, 0).To("sink", discard)
		}},
		{"no size function", `BatchBytes on operator "src": want a size function`, func(env *stream.Environment) {
			stream.FromSource(env, "src", ints(10)).BatchBytes(nil, 1024).To("sink", discard)
		}},
		{"union", `BatchBytes on a union`, func(env *stream.Environment) {
			a, b := stream.FromSource(env, "a", ints(10)), stream.FromSource(env, "b", ints(10))
			a.Union(b).BatchBytes(size, 1024).To("sink", discard)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			env := stream.NewEnvironment("batch-bytes")
			c.build(env)
			if _, err := env.Graph(); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error containing %q", err, c.want)
			}
		})
	}
	env := stream.NewEnvironment("batch-bytes", stream.WithParallelism(2))
	stream.FromSource(env, "src", ints(1000)).SetParallelism(1).BatchBytes(size, 64).To("sink", discard)
	if err := env.Execute(context.Background()); err != nil {
		t.Fatalf("a job with BatchBytes: %v", err)
	}
}
