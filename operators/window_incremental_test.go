package operators_test

import (
	"bytes"
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/edgedio/edged/keygroup"
	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/operators/operatorstest"
	"github.com/edgedio/edged/state"
	"github.com/edgedio/edged/watermark"
)

// concatAgg lists the values of a window in order: slices in time order,
// the records of a slice in arrival order. Its Merge is associative but
// not commutative, so a result that combines slices out of order, or
// misses or repeats one, differs.
type concatAgg struct{}

func (concatAgg) CreateAccumulator() string { return "" }
func (concatAgg) Add(e ev, a string) string { return a + strconv.FormatInt(e.V, 10) + "," }
func (concatAgg) Result(a string) string    { return a }
func (concatAgg) Merge(a, b string) string  { return a + b }

// listAgg lists the values of a window like concatAgg, in a slice behind
// a pointer that Add and Merge change in place: a result that shares an
// accumulator it should have copied changes under a later merge.
type listAgg struct{}

func (listAgg) CreateAccumulator() *[]int64 { return new([]int64) }
func (listAgg) Add(e ev, a *[]int64) *[]int64 {
	*a = append(*a, e.V)
	return a
}
func (listAgg) Result(a *[]int64) string { return fmt.Sprint(*a) }
func (listAgg) Merge(a, b *[]int64) *[]int64 {
	*a = append(*a, *b...)
	return a
}

// maxLast is a reduce: the record of the larger value, the later one on
// ties (associative, not commutative).
func maxLast(a, b ev) (ev, error) {
	if b.V >= a.V {
		return b, nil
	}
	return a, nil
}

func keyedGroups(maxP int) func(ev) int { return operators.KeyGroupFunc(evKey, maxP) }

func fmtVal[R any](r operators.WindowResult[string, R]) string { return fmt.Sprintf("%+v", r) }

// incHarness drives a window operator made by build, as p subtasks over
// maxP key groups.
type incHarness[R comparable] struct {
	hs    []*operatorstest.Harness[ev, operators.WindowResult[string, R]]
	group func(ev) int
	maxP  int
	late  int // late records of the subtasks dropped by a restore
}

// keyedSnap is the keyed snapshot of one subtask.
type keyedSnap struct {
	data    []byte
	offsets state.KeyGroupOffsets
}

// newIncHarness opens p subtasks of build, restored from snaps (the
// snapshots of len(snaps) old subtasks) unless snaps is nil, with their
// processing-time clocks at now.
func newIncHarness[R comparable](t *testing.T, build func(operators.Collector[operators.WindowResult[string, R]]) operators.OneInput[ev], p, maxP int, snaps []keyedSnap, now time.Time) *incHarness[R] {
	t.Helper()
	return newIncHarnessOn(t, build, p, maxP, snaps, now, func(r keygroup.Range, h *operatorstest.Harness[ev, operators.WindowResult[string, R]]) state.Backend {
		return state.NewMemoryBackend(r, h.Clock)
	})
}

// newIncHarnessOn is newIncHarness with the state backends that backend
// makes for the subtasks.
func newIncHarnessOn[R comparable](t *testing.T, build func(operators.Collector[operators.WindowResult[string, R]]) operators.OneInput[ev], p, maxP int, snaps []keyedSnap, now time.Time,
	backend func(keygroup.Range, *operatorstest.Harness[ev, operators.WindowResult[string, R]]) state.Backend) *incHarness[R] {
	t.Helper()
	ih := &incHarness[R]{group: keyedGroups(maxP), maxP: maxP}
	var sources [][]int
	if snaps != nil {
		sources = state.KeyedRestoreSources(maxP, len(snaps), p)
	}
	for i := range p {
		h := operatorstest.New(build, operatorstest.Keyed(maxP), operatorstest.SideOutput[ev](lateTag), operatorstest.StartAt(now))
		r := keygroup.RangeFor(i, p, maxP)
		h.Ctx.Subtask, h.Ctx.Parallelism, h.Ctx.KeyGroups = i, p, r
		h.Ctx.State = backend(r, h)
		if snaps != nil {
			for _, j := range sources[i] {
				if err := state.Restore(h.Ctx.State, bytes.NewReader(snaps[j].data), snaps[j].offsets, r); err != nil {
					t.Fatalf("restore subtask %d of %d from old subtask %d: %v", i, p, j, err)
				}
			}
		}
		if err := h.Open(); err != nil {
			t.Fatalf("open subtask %d: %v", i, err)
		}
		ih.hs = append(ih.hs, h)
	}
	return ih
}

func (ih *incHarness[R]) process(e ev) {
	g := ih.group(e)
	for _, h := range ih.hs {
		if h.Ctx.KeyGroups.Contains(g) {
			h.Process(e, e.TS)
			return
		}
	}
	panic(fmt.Sprintf("no subtask owns key group %d", g))
}

func (ih *incHarness[R]) watermark(wm int64) error {
	for _, h := range ih.hs {
		if err := h.Watermark(wm); err != nil {
			return err
		}
	}
	return nil
}

func (ih *incHarness[R]) advanceProcessingTime(d time.Duration) error {
	for _, h := range ih.hs {
		if err := h.AdvanceProcessingTime(d); err != nil {
			return err
		}
	}
	return nil
}

// drain returns what the subtasks emitted since the last call, sorted.
func (ih *incHarness[R]) drain() []operatorstest.Record[operators.WindowResult[string, R]] {
	var out []operatorstest.Record[operators.WindowResult[string, R]]
	for _, h := range ih.hs {
		out = append(out, h.Drain()...)
	}
	slices.SortStableFunc(out, func(a, b operatorstest.Record[operators.WindowResult[string, R]]) int {
		return cmp.Or(cmp.Compare(a.Timestamp, b.Timestamp), cmp.Compare(a.Value.Key, b.Value.Key),
			cmp.Compare(a.Value.Window.Start, b.Value.Window.Start), cmp.Compare(fmtVal(a.Value), fmtVal(b.Value)))
	})
	return out
}

func (ih *incHarness[R]) ops() []operators.OneInput[ev] {
	var out []operators.OneInput[ev]
	for _, h := range ih.hs {
		out = append(out, h.Op)
	}
	return out
}

func (ih *incHarness[R]) lateRecords() int {
	n := ih.late
	for _, h := range ih.hs {
		n += len(h.Side[lateTag])
	}
	return n
}

func (ih *incHarness[R]) snapshot(t *testing.T) []keyedSnap {
	t.Helper()
	var out []keyedSnap
	for _, h := range ih.hs {
		s, err := state.Snapshot(h.Ctx.State)
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		if _, err := s.WriteTo(&buf); err != nil {
			t.Fatal(err)
		}
		out = append(out, keyedSnap{data: buf.Bytes(), offsets: s.Offsets()})
	}
	return out
}

func (ih *incHarness[R]) close(t *testing.T) {
	t.Helper()
	for _, h := range ih.hs {
		if err := h.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}
}

// stateLeft returns the entries of the window states of all subtasks.
func (ih *incHarness[R]) stateLeft() int {
	n := 0
	for _, h := range ih.hs {
		for _, name := range stateNames {
			n += h.StateLen(name)
		}
	}
	return n
}

// incConfig is one random window configuration of the comparison.
type incConfig struct {
	size, slide, offset, lateness int64
	tumbling, eventTime           bool
	keys                          int
}

func (c incConfig) assigner() operators.WindowAssigner {
	var a operators.WindowAssigner
	switch {
	case c.tumbling && c.eventTime:
		a = operators.TumblingEventTimeWindows(ms(c.size))
	case c.tumbling:
		a = operators.TumblingProcessingTimeWindows(ms(c.size))
	case c.eventTime:
		a = operators.SlidingEventTimeWindows(ms(c.size), ms(c.slide))
	default:
		a = operators.SlidingProcessingTimeWindows(ms(c.size), ms(c.slide))
	}
	return a.WithOffset(ms(c.offset))
}

func randomIncConfig(rng *rand.Rand, eventTime bool) incConfig {
	c := incConfig{eventTime: eventTime, keys: 1 + rng.IntN(5)}
	c.size = 1 + rng.Int64N(40)
	switch rng.IntN(6) {
	case 0:
		c.tumbling, c.slide = true, c.size
	case 1: // a slide that divides the size
		divs := []int64{}
		for d := int64(1); d <= c.size; d++ {
			if c.size%d == 0 {
				divs = append(divs, d)
			}
		}
		c.slide = divs[rng.IntN(len(divs))]
	default: // any slide, mostly one that does not divide the size
		c.slide = 1 + rng.Int64N(c.size)
	}
	c.offset = rng.Int64N(c.slide)
	if eventTime && rng.IntN(2) == 0 {
		c.lateness = rng.Int64N(3 * c.size)
	}
	return c
}

// incCounts says what a comparison run exercised.
type incCounts struct {
	fired, refired, late, restores, legacyRestores int
	// incremental and rebuilt count the results of the operator under test
	// taken from its incremental aggregate, and its rebuilds.
	incremental, rebuilt int64
}

// addFirings adds the incremental firings of ih's subtasks to c.
func (c *incCounts) addFirings(ops []operators.OneInput[ev]) {
	for _, op := range ops {
		i, r := operators.IncrementalFirings(op)
		c.incremental += i
		c.rebuilt += r
	}
}

// runIncremental feeds one random stream to the window operator that
// NewWindowAggregate builds and to the merge-all reference, and checks
// that every step emits the same results, with restores of the former from
// snapshots at random points, at a random new parallelism, and now and
// then from a snapshot of the reference (the state layout of the slices
// before incremental windows).
func runIncremental[A any, R comparable](t *testing.T, seed uint64, agg operators.AggregateFunction[ev, A, R], counts *incCounts) bool {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 0x1dc))
	cfg := randomIncConfig(rng, seed%4 != 0)
	a := cfg.assigner()
	lateness := ms(cfg.lateness)
	const maxP = 16
	build := func(out operators.Collector[operators.WindowResult[string, R]]) operators.OneInput[ev] {
		op, err := operators.NewWindowAggregate(windowName, evKey, a, lateness, lateTag, agg, out)
		if err != nil {
			t.Fatal(err)
		}
		return op
	}
	buildRef := func(out operators.Collector[operators.WindowResult[string, R]]) operators.OneInput[ev] {
		return operators.NewMergeAllWindowAggregate(windowName, evKey, a, lateness, lateTag, agg, out)
	}
	p := 1 + rng.IntN(3)
	// On processing time a record read in the millisecond of timers that
	// fired on its subtask goes to the next millisecond's windows, so the
	// reference runs at the same parallelism (the keys on the same
	// subtasks); on event time it runs at 1.
	refP := 1
	if !cfg.eventTime {
		refP = p
	}
	ref := newIncHarness(t, buildRef, refP, maxP, nil, operatorstest.DefaultStart)
	got := newIncHarness(t, build, p, maxP, nil, operatorstest.DefaultStart)
	defer func() { counts.addFirings(got.ops()); ref.close(t); got.close(t) }()
	keys := []string{"a", "b", "c", "d", "e"}[:cfg.keys]
	wm := int64(math.MinInt64)
	now := int64(0) // event time of the stream
	fail := func(step int, what string, args ...any) bool {
		t.Errorf("seed %d %+v (%s) step %d: %s", seed, cfg, a, step, fmt.Sprintf(what, args...))
		return false
	}
	const n = 300
	for i := 0; i <= n; i++ {
		var err error
		switch {
		case i == n: // the end of the input
			if cfg.eventTime {
				err = cmp.Or(ref.watermark(watermark.MaxWatermark), got.watermark(watermark.MaxWatermark))
			} else {
				err = cmp.Or(ref.advanceProcessingTime(time.Hour), got.advanceProcessingTime(time.Hour))
				for _, h := range append(ref.hs, got.hs...) {
					err = cmp.Or(err, h.Finish())
				}
			}
		case cfg.eventTime && i > 0 && rng.IntN(60) == 0:
			// Restore: from the operator's own snapshots, or from the
			// reference's.
			var snaps []keyedSnap
			if rng.IntN(3) == 0 {
				snaps = ref.snapshot(t)
				counts.legacyRestores++
			} else {
				snaps = got.snapshot(t)
			}
			counts.restores++
			late := got.lateRecords()
			counts.addFirings(got.ops())
			got.close(t)
			got = newIncHarness(t, build, 1+rng.IntN(3), maxP, snaps, operatorstest.DefaultStart)
			got.late = late
			if wm != math.MinInt64 {
				// The restored task watermark.
				err = got.watermark(wm)
			}
		case !cfg.eventTime && rng.IntN(3) == 0:
			d := ms(rng.Int64N(2 * cfg.slide))
			err = cmp.Or(ref.advanceProcessingTime(d), got.advanceProcessingTime(d))
		case cfg.eventTime && rng.IntN(4) == 0:
			if w := now - rng.Int64N(cfg.size/2+2); w > wm {
				wm = w
				err = cmp.Or(ref.watermark(wm), got.watermark(wm))
			}
		default:
			now += rng.Int64N(4)
			if rng.IntN(40) == 0 {
				now += cfg.size + rng.Int64N(2*cfg.size) // a gap
			}
			disorder := cfg.size/2 + 2
			if rng.IntN(8) == 0 {
				disorder = 2*cfg.size + cfg.lateness + 2 // a straggler
			}
			e := ev{Key: keys[rng.IntN(len(keys))], TS: now - rng.Int64N(disorder), V: rng.Int64N(100)}
			ref.process(e)
			got.process(e)
			want, have := ref.drain(), got.drain()
			counts.refired += len(want)
			if !slices.Equal(have, want) {
				return fail(i, "record %v emitted%v\nwant%v", e, have, want)
			}
			continue
		}
		if err != nil {
			return fail(i, "%v", err)
		}
		want, have := ref.drain(), got.drain()
		counts.fired += len(want)
		if !slices.Equal(have, want) {
			return fail(i, "emitted%v\nwant%v", have, want)
		}
		if l, w := got.lateRecords(), ref.lateRecords(); l != w {
			return fail(i, "%d late records, want %d", l, w)
		}
	}
	counts.late += ref.lateRecords()
	// On processing time, a record that comes in the last millisecond of
	// its window after the window fired stays in the state (as it does in
	// the reference): compare with the reference there.
	if n, w := got.stateLeft(), ref.stateLeft(); n != w || (cfg.eventTime && n != 0) {
		return fail(n, "%d state entries left at the end, the reference %d", n, w)
	}
	return true
}

// TestIncrementalWindowsMatchMergeAll compares tumbling and sliding window
// aggregates, on event time and processing time, with the reference that
// merges all slices of a window for every result, on random streams:
// random keys, out-of-order and late records, random sizes, slides (that
// divide the size or not), offsets and allowed lateness, with restores
// from snapshots at random parallelism, from the operator's own layout and
// from the reference's. The aggregates: a commutative count and sum, an
// order-sensitive concatenation, the same in a slice that Merge appends
// to in place, and a reduce (maximum, the later record
// on ties). Run with -window.seed=N to try another seed.
func TestIncrementalWindowsMatchMergeAll(t *testing.T) {
	seeds := []uint64{*windowSeed}
	if *windowSeed == 0 {
		seeds = nil
		for s := uint64(1); s <= 60; s++ {
			seeds = append(seeds, s)
		}
	}
	run := func(t *testing.T, one func(seed uint64, c *incCounts) bool) {
		var c incCounts
		for _, seed := range seeds {
			if !one(seed, &c) {
				return
			}
		}
		t.Logf("%+v", c)
		// The fixed seeds must exercise every path (one seed of
		// -window.seed need not).
		if *windowSeed == 0 && (c.fired == 0 || c.refired == 0 || c.late == 0 || c.restores == 0 || c.legacyRestores == 0 ||
			c.incremental <= c.rebuilt) {
			t.Fatalf("poor schedules: %+v", c)
		}
	}
	t.Run("count-sum", func(t *testing.T) {
		run(t, func(seed uint64, c *incCounts) bool {
			return runIncremental(t, seed, operators.AggregateFunction[ev, cs, cs](csAgg{}), c)
		})
	})
	t.Run("concat", func(t *testing.T) {
		run(t, func(seed uint64, c *incCounts) bool {
			return runIncremental(t, seed, operators.AggregateFunction[ev, string, string](concatAgg{}), c)
		})
	})
	t.Run("list", func(t *testing.T) {
		run(t, func(seed uint64, c *incCounts) bool {
			return runIncremental(t, seed, operators.AggregateFunction[ev, *[]int64, string](listAgg{}), c)
		})
	})
	t.Run("reduce-max", func(t *testing.T) {
		run(t, func(seed uint64, c *incCounts) bool {
			return runIncremental(t, seed, operators.ReduceFunction(maxLast), c)
		})
	})
}
