package operators

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
)

func generatorIndex(i int64) int64 { return i }

func TestGeneratorUnionOverSubtasks(t *testing.T) {
	for _, count := range []int64{1, 2, 10, 1000, 1001} {
		for _, p := range []int{1, 2, 3} {
			for _, limit := range []int{1, 7, 64} {
				t.Run(fmt.Sprintf("count=%d/p=%d/limit=%d", count, p, limit), func(t *testing.T) {
					var all []int64
					for s := range p {
						g := NewGenerator(GeneratorConfig{Count: count}, generatorIndex)
						got, err := runSource(t, Source[int64](g), subtaskContext(s, p), limit)
						if err != nil {
							t.Fatalf("subtask %d: %v", s, err)
						}
						for k, i := range got {
							if i%int64(p) != int64(s) {
								t.Fatalf("subtask %d emitted index %d", s, i)
							}
							if k > 0 && i <= got[k-1] {
								t.Fatalf("subtask %d: index %d after %d", s, i, got[k-1])
							}
						}
						if g.Position() < count {
							t.Errorf("subtask %d: Position() = %d at end, want >= %d", s, g.Position(), count)
						}
						all = append(all, got...)
					}
					slices.Sort(all)
					if int64(len(all)) != count {
						t.Fatalf("%d records over all subtasks, want %d", len(all), count)
					}
					for k, i := range all {
						if i != int64(k) {
							t.Fatalf("sorted union[%d] = %d", k, i)
						}
					}
				})
			}
		}
	}
}

func TestGeneratorUnbounded(t *testing.T) {
	g := NewGenerator(GeneratorConfig{}, generatorIndex)
	if err := g.Open(subtaskContext(1, 4)); err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	var got []int64
	out := CollectorFunc[int64](func(v int64) { got = append(got, v) })
	for range 3 {
		st, err := g.Poll(out, 5)
		if err != nil || st != MoreAvailable {
			t.Fatalf("Poll = %v, %v; want MoreAvailable", st, err)
		}
	}
	want := []int64{1, 5, 9, 13, 17, 21, 25, 29, 33, 37, 41, 45, 49, 53, 57}
	if !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	if !availableNow(g.Available()) {
		t.Error("Available() of an unlimited generator is not ready")
	}
}

// pollGenerator polls g once with limit and returns the number of records and
// the status.
func pollGenerator(t *testing.T, g *Generator[int64], limit int) (int, Status) {
	t.Helper()
	n := 0
	st, err := g.Poll(CollectorFunc[int64](func(int64) { n++ }), limit)
	if err != nil {
		t.Fatalf("Poll: %v", err)
	}
	return n, st
}

// pollGeneratorDue polls g until it reports NothingAvailable or EndOfInput and
// returns the number of records.
func pollGeneratorDue(t *testing.T, g *Generator[int64], limit int) (int, Status) {
	t.Helper()
	total := 0
	for {
		n, st := pollGenerator(t, g, limit)
		total += n
		if st != MoreAvailable {
			return total, st
		}
	}
}

func TestGeneratorRate(t *testing.T) {
	tests := []struct {
		rate    float64
		p       int
		count   int64
		advance time.Duration
		want    int // records due after advance, the one due at Open included
	}{
		{rate: 10, p: 1, advance: time.Second, want: 11},
		{rate: 10, p: 1, advance: 999 * time.Millisecond, want: 10},
		{rate: 10, p: 2, advance: time.Second, want: 6},
		{rate: 3, p: 1, advance: time.Second, want: 4},
		{rate: 1000, p: 3, advance: 250 * time.Millisecond, want: 84},
		{rate: 0.5, p: 1, advance: 10 * time.Second, want: 6},
		{rate: 1e6, p: 1, advance: time.Millisecond, want: 1001},
		{rate: 10, p: 1, count: 5, advance: 10 * time.Second, want: 5},
	}
	for _, tt := range tests {
		name := fmt.Sprintf("rate=%v/p=%d/count=%d/advance=%v", tt.rate, tt.p, tt.count, tt.advance)
		t.Run(name, func(t *testing.T) {
			ctx := subtaskContext(0, tt.p)
			fake := ctx.Clock.(*clockwork.FakeClock)
			g := NewGenerator(GeneratorConfig{Rate: tt.rate, Count: tt.count}, generatorIndex)
			if err := g.Open(ctx); err != nil {
				t.Fatal(err)
			}
			defer g.Close()

			if n, st := pollGeneratorDue(t, g, 16); n != 1 || st != NothingAvailable {
				t.Fatalf("at Open: %d records, %v; want 1, NothingAvailable", n, st)
			}
			fake.Advance(tt.advance)
			n, st := pollGeneratorDue(t, g, 16)
			if got := 1 + n; got != tt.want {
				t.Errorf("after %v: %d records, want %d", tt.advance, got, tt.want)
			}
			wantSt := NothingAvailable
			if tt.count > 0 && int64(tt.want) == tt.count {
				wantSt = EndOfInput
			}
			if st != wantSt {
				t.Errorf("status %v, want %v", st, wantSt)
			}
		})
	}
}

func TestGeneratorRateLimitAndAvailable(t *testing.T) {
	ctx := subtaskContext(0, 1)
	fake := ctx.Clock.(*clockwork.FakeClock)
	g := NewGenerator(GeneratorConfig{Rate: 10}, generatorIndex)
	if err := g.Open(ctx); err != nil {
		t.Fatal(err)
	}
	defer g.Close()

	if n, st := pollGenerator(t, g, 100); n != 1 || st != NothingAvailable {
		t.Fatalf("first Poll: %d, %v; want 1, NothingAvailable", n, st)
	}
	ch := g.Available()
	if availableNow(ch) {
		t.Fatal("Available() ready before the next record is due")
	}
	if again := g.Available(); again != ch {
		t.Error("second Available() armed another timer")
	}
	fake.Advance(99 * time.Millisecond)
	if n, st := pollGenerator(t, g, 100); n != 0 || st != NothingAvailable {
		t.Fatalf("at 99ms: %d, %v; want 0, NothingAvailable", n, st)
	}
	if availableNow(ch) {
		t.Fatal("Available() ready at 99ms, next record is due at 100ms")
	}
	fake.Advance(time.Millisecond)
	waitAvailable(t, ch)
	if n, st := pollGenerator(t, g, 100); n != 1 || st != NothingAvailable {
		t.Fatalf("at 100ms: %d, %v; want 1, NothingAvailable", n, st)
	}

	// Behind schedule, Poll respects limit and says there is more.
	fake.Advance(time.Second)
	if n, st := pollGenerator(t, g, 4); n != 4 || st != MoreAvailable {
		t.Fatalf("at 1.1s: %d, %v; want 4, MoreAvailable", n, st)
	}
	if !availableNow(g.Available()) {
		t.Error("Available() not ready while records are due")
	}
	if n, st := pollGenerator(t, g, 100); n != 6 || st != NothingAvailable {
		t.Fatalf("at 1.1s: %d, %v; want 6, NothingAvailable", n, st)
	}
	if got := g.Position(); got != 12 {
		t.Errorf("Position() = %d, want 12", got)
	}

	// Close releases a pending wait.
	pending := g.Available()
	bctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if err := fake.BlockUntilContext(bctx, 1); err != nil {
		t.Fatalf("no timer armed: %v", err)
	}
	g.Close()
	if !availableNow(pending) {
		t.Error("Close left the Available channel open")
	}
}

func TestGeneratorSetPosition(t *testing.T) {
	const count = 100
	first := NewGenerator(GeneratorConfig{Count: count}, generatorIndex)
	if err := first.Open(subtaskContext(1, 2)); err != nil {
		t.Fatal(err)
	}
	var got []int64
	out := CollectorFunc[int64](func(v int64) { got = append(got, v) })
	if _, err := first.Poll(out, 10); err != nil {
		t.Fatal(err)
	}
	first.Close()
	pos := first.Position()
	if pos != 21 {
		t.Fatalf("Position() = %d after 10 records of subtask 1 of 2, want 21", pos)
	}

	for _, set := range []int64{pos, pos - 1} { // pos-1 is subtask 0's; rounds up
		restored := NewGenerator(GeneratorConfig{Count: count}, generatorIndex)
		restored.SetPosition(set)
		rest, err := runSource(t, Source[int64](restored), subtaskContext(1, 2), 7)
		if err != nil {
			t.Fatal(err)
		}
		all := append(slices.Clone(got), rest...)
		var want []int64
		for i := int64(1); i < count; i += 2 {
			want = append(want, i)
		}
		if !slices.Equal(all, want) {
			t.Errorf("SetPosition(%d): records %v, want %v", set, all, want)
		}
	}

	// After Open, SetPosition rewinds.
	g := NewGenerator(GeneratorConfig{Count: 6}, generatorIndex)
	if err := g.Open(subtaskContext(0, 1)); err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if _, err := pollToEnd(t, Source[int64](g), 4); err != nil {
		t.Fatal(err)
	}
	g.SetPosition(3)
	again, err := pollToEnd(t, Source[int64](g), 4)
	if err != nil {
		t.Fatal(err)
	}
	if want := []int64{3, 4, 5}; !slices.Equal(again, want) {
		t.Errorf("after SetPosition(3): %v, want %v", again, want)
	}
}

func TestGeneratorConfigValidate(t *testing.T) {
	cfg := GeneratorConfig{Count: -1, Rate: math.NaN(), Keys: -2}
	err := cfg.Validate()
	if err == nil {
		t.Fatal("Validate accepted an invalid config")
	}
	for _, key := range []string{"generator.count", "generator.rate", "generator.keys"} {
		if !strings.Contains(err.Error(), key) {
			t.Errorf("Validate() = %q, does not name %s", err, key)
		}
	}
	g := NewGenerator(cfg, generatorIndex)
	if err := g.Open(subtaskContext(0, 1)); err == nil {
		t.Error("Open accepted an invalid config")
	}
	if err := (GeneratorConfig{Rate: -1}).Validate(); err == nil {
		t.Error("Validate accepted a negative rate")
	}
	if err := (GeneratorConfig{}).Validate(); err != nil {
		t.Errorf("Validate(zero config) = %v", err)
	}
	if err := NewGenerator(GeneratorConfig{}, generatorIndex).Open(subtaskContext(2, 2)); err == nil {
		t.Error("Open accepted subtask 2 of 2")
	}
}

func TestSensorGenerator(t *testing.T) {
	cfg := GeneratorConfig{Count: 2500, Keys: 1000}
	got, err := runSource(t, Source[SensorReading](SensorGenerator(cfg)), subtaskContext(0, 1), 64)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2500 {
		t.Fatalf("%d readings, want 2500", len(got))
	}
	for i, r := range got {
		if want := fmt.Sprintf("sensor_%d", i%1000); r.ID != want {
			t.Fatalf("reading %d: ID %q, want %q", i, r.ID, want)
		}
		if want := DefaultGeneratorStart + int64(i/1000); r.Timestamp != want {
			t.Fatalf("reading %d: Timestamp %d, want %d", i, r.Timestamp, want)
		}
		if r.Temperature < 20 || r.Temperature >= 40 {
			t.Fatalf("reading %d: Temperature %v outside [20, 40)", i, r.Temperature)
		}
		if math.Round(r.Temperature*100)/100 != r.Temperature {
			t.Fatalf("reading %d: Temperature %v has more than two decimals", i, r.Temperature)
		}
		line := r.String()
		back, err := ParseSensorReading(line)
		if err != nil || back != r {
			t.Fatalf("reading %d: %q parses to %+v, %v", i, line, back, err)
		}
	}

	// Deterministic: the same config gives the same readings, here from
	// three subtasks.
	var again []SensorReading
	for s := range 3 {
		part, err := runSource(t, Source[SensorReading](SensorGenerator(cfg)), subtaskContext(s, 3), 50)
		if err != nil {
			t.Fatal(err)
		}
		again = append(again, part...)
	}
	slices.SortFunc(again, cmpReading)
	want := slices.Clone(got)
	slices.SortFunc(want, cmpReading)
	if !slices.Equal(again, want) {
		t.Error("three subtasks gave other readings than one")
	}

	// Defaults.
	d, err := runSource(t, Source[SensorReading](SensorGenerator(GeneratorConfig{Count: 1001})), subtaskContext(0, 1), 64)
	if err != nil {
		t.Fatal(err)
	}
	if last := d[1000]; last.ID != "sensor_0" || last.Timestamp != DefaultGeneratorStart+1 {
		t.Errorf("reading 1000 with defaults = %+v, want sensor_0 at %d", last, DefaultGeneratorStart+1)
	}
}

func cmpReading(a, b SensorReading) int {
	if c := cmp.Compare(a.Timestamp, b.Timestamp); c != 0 {
		return c
	}
	return strings.Compare(a.ID, b.ID)
}

func TestSensorGeneratorPollAllocatesNothing(t *testing.T) {
	g := SensorGenerator(GeneratorConfig{})
	if err := g.Open(subtaskContext(0, 1)); err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	var sum float64
	out := CollectorFunc[SensorReading](func(r SensorReading) { sum += r.Temperature })
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := g.Poll(out, 256); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("Poll allocates %v times per call, want 0", allocs)
	}
}

func TestGeneratorConfigValidateJoins(t *testing.T) {
	err := GeneratorConfig{Count: -1, Keys: -1}.Validate()
	var joined interface{ Unwrap() []error }
	if !errors.As(err, &joined) || len(joined.Unwrap()) != 2 {
		t.Errorf("Validate() = %v, want 2 joined errors", err)
	}
}

func BenchmarkSensorGenerator(b *testing.B) {
	for _, limit := range []int{1, 1024} {
		b.Run(fmt.Sprintf("limit=%d", limit), func(b *testing.B) {
			g := SensorGenerator(GeneratorConfig{})
			if err := g.Open(subtaskContext(0, 1)); err != nil {
				b.Fatal(err)
			}
			defer g.Close()
			var sum float64
			out := CollectorFunc[SensorReading](func(r SensorReading) { sum += r.Temperature })
			b.ReportAllocs()
			for b.Loop() {
				g.Poll(out, limit)
			}
			b.ReportMetric(float64(b.N*limit)/b.Elapsed().Seconds(), "records/s")
		})
	}
}

// A generator snapshotted at parallelism 1 restores at any parallelism:
// its position is a global index, every new subtask gets it (the runtime
// gives all old raw states to each new subtask at another parallelism)
// and goes on from it, so the records before and after are exactly
// [0, Count). From a larger parallelism the restore fails.
func TestGeneratorRestoresFromParallelismOne(t *testing.T) {
	const count = 100
	first := NewGenerator(GeneratorConfig{Count: count}, generatorIndex)
	if err := first.Open(subtaskContext(0, 1)); err != nil {
		t.Fatal(err)
	}
	var all []int64
	out := CollectorFunc[int64](func(v int64) { all = append(all, v) })
	if _, err := first.Poll(out, 37); err != nil {
		t.Fatal(err)
	}
	snap, err := first.SnapshotState(1)
	if err != nil {
		t.Fatal(err)
	}
	first.Close()
	for _, p := range []int{2, 3} {
		got := slices.Clone(all)
		for s := range p {
			g := NewGenerator(GeneratorConfig{Count: count}, generatorIndex)
			if err := g.Open(subtaskContext(s, p)); err != nil {
				t.Fatal(err)
			}
			if err := g.RestoreState([][]byte{snap}, 1); err != nil {
				t.Fatalf("p=%d subtask %d: %v", p, s, err)
			}
			rest, err := pollToEnd(t, Source[int64](g), 7)
			g.Close()
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, rest...)
		}
		slices.Sort(got)
		if len(got) != count {
			t.Fatalf("p=%d: %d records, want %d", p, len(got), count)
		}
		for k, i := range got {
			if i != int64(k) {
				t.Fatalf("p=%d: sorted records[%d] = %d", p, k, i)
			}
		}
	}
	g := NewGenerator(GeneratorConfig{Count: count}, generatorIndex)
	if err := g.Open(subtaskContext(0, 3)); err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if err := g.RestoreState([][]byte{snap, snap}, 2); !errors.Is(err, ErrRescaleSource) {
		t.Fatalf("restore from parallelism 2 at 3: %v, want ErrRescaleSource", err)
	}
}

// A generator given no record function fails Open with an error that says
// so. Before, its first Poll failed the task with a nil pointer
// dereference.
func TestGeneratorNilRecordFunctionFailsOpen(t *testing.T) {
	g := NewGenerator[int64](GeneratorConfig{Count: 5}, nil)
	err := g.Open(&Context{Parallelism: 1})
	if err == nil || !strings.Contains(err.Error(), "record function is nil") {
		t.Fatalf("Open: %v, want the nil record function named", err)
	}
}
