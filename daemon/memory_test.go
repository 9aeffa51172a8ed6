package daemon

import (
	"log/slog"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strings"
	"testing"
	"time"

	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/pipeline"
)

func TestLimitFor(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct{ limit, live, want int64 }{
		{64 * mib, 0, 64 * mib},
		{64 * mib, 40 * mib, 64 * mib},
		{64 * mib, 51 * mib, 64 * mib},    // 1.25 × 51 MiB < 64 MiB
		{64 * mib, 60 * mib, 75 * mib},    // live above 80 % of the limit
		{64 * mib, 400 * mib, 500 * mib},  // state far above the limit
		{0, 400 * mib, noLimit},           // no limit
		{-1, 0, noLimit},                  // off
		{16 * mib, 16 * mib, 20 * mib},    // live at the limit
		{noLimit, 100 * mib, noLimit},     // off, as the runtime's value
		{128 * mib, 102 * mib, 128 * mib}, // 127.5 MiB
		{128 * mib, 104 * mib, 130 * mib}, // 130 MiB
		{1 << 62, 1 << 62, 1<<62 + 1<<60}, // no overflow
	} {
		if got := limitFor(tc.limit, tc.live); got != tc.want {
			t.Errorf("limitFor(%d, %d) = %d, want %d", tc.limit, tc.live, got, tc.want)
		}
	}
}

// applyMemory sets the runtime's limit and GC percentage from node.memory
// and puts back what it found; GOMEMLIMIT and GOGC in the environment win.
func TestApplyMemory(t *testing.T) {
	prevLimit, prevGC := debug.SetMemoryLimit(-1), debug.SetGCPercent(-1)
	debug.SetGCPercent(prevGC)
	log := slog.New(slog.DiscardHandler)
	noEnv := func(string) string { return "" }

	restore := applyMemory(pipeline.MemoryConfig{Limit: 200 << 20, GCPercent: 60}, log, noEnv)
	gotLimit, gotGC := debug.SetMemoryLimit(-1), debug.SetGCPercent(-1)
	debug.SetGCPercent(gotGC)
	restore()
	if gotLimit != 200<<20 || gotGC != 60 {
		t.Errorf("while running: limit %d, gc %d; want %d, 60", gotLimit, gotGC, 200<<20)
	}
	if l, g := debug.SetMemoryLimit(-1), debug.SetGCPercent(-1); l != prevLimit || g != prevGC {
		t.Errorf("after restore: limit %d, gc %d; want %d, %d", l, g, prevLimit, prevGC)
	}
	debug.SetGCPercent(prevGC)

	// Defaults; an environment that sets both keeps its values.
	restore = applyMemory(pipeline.MemoryConfig{}, log, noEnv)
	gotLimit = debug.SetMemoryLimit(-1)
	restore()
	if gotLimit != pipeline.DefaultMemoryLimit {
		t.Errorf("default limit %d, want %d", gotLimit, pipeline.DefaultMemoryLimit)
	}
	env := func(k string) string { return map[string]string{"GOMEMLIMIT": "1GiB", "GOGC": "300"}[k] }
	restore = applyMemory(pipeline.MemoryConfig{Limit: 32 << 20, GCPercent: 20}, log, env)
	gotLimit, gotGC = debug.SetMemoryLimit(-1), debug.SetGCPercent(-1)
	debug.SetGCPercent(gotGC)
	restore()
	if gotLimit != prevLimit || gotGC != prevGC {
		t.Errorf("with GOMEMLIMIT and GOGC set: limit %d, gc %d; want them untouched (%d, %d)", gotLimit, gotGC, prevLimit, prevGC)
	}
	restore = applyMemory(pipeline.MemoryConfig{Limit: pipeline.ByteSizeOff}, log, noEnv)
	gotLimit = debug.SetMemoryLimit(-1)
	restore()
	if gotLimit != noLimit {
		t.Errorf("limit off: %d, want %d", gotLimit, noLimit)
	}
}

// Live data above the limit raise the runtime's soft limit to 1.25 × the
// live heap (the collector would otherwise run back to back), and it comes
// back to the configured limit once they are gone.
func TestMemoryLimitFollowsLiveData(t *testing.T) {
	prev := debug.SetMemoryLimit(-1)
	defer debug.SetMemoryLimit(prev)
	restore := applyMemory(pipeline.MemoryConfig{Limit: pipeline.MinMemoryLimit}, slog.New(slog.DiscardHandler), func(string) string { return "" })
	defer restore()

	live := make([][]byte, 48)
	for i := range live {
		live[i] = make([]byte, 1<<20)
		live[i][0] = 1
	}
	testutil.Eventually(t, 10*time.Second, "the soft limit raised above the live 48 MiB", func() bool {
		runtime.GC()
		return debug.SetMemoryLimit(-1) >= 48<<20*5/4
	})
	runtime.KeepAlive(live)
	live = nil
	testutil.Eventually(t, 10*time.Second, "the soft limit back at node.memory.limit", func() bool {
		runtime.GC()
		return debug.SetMemoryLimit(-1) == pipeline.MinMemoryLimit
	})
}

// An idle node (less than pipeline.IdleAllocBytes allocated per period)
// returns its free memory when it allocated at least minReleaseBytes
// since it last did, and unmaps the executable's pages when it has just
// become idle; a node under load does neither.
func TestIdleCheck(t *testing.T) {
	var allocs uint64 = 1 << 20
	releases, trims := 0, 0
	g := &memoryGovernor{log: slog.New(slog.DiscardHandler), idle: time.Second, busy: true,
		readAllocs: func() uint64 { return allocs }, release: func() { releases++ }, trim: func(string) { trims++ }}
	g.lastAllocs, g.released = allocs, allocs
	for i, step := range []struct {
		alloc           uint64
		releases, trims int // so far
	}{
		{100 << 10, 0, 1},       // idle after start-up, little garbage: nothing to return
		{200 << 10, 1, 1},       // idle, 300 KiB since the start
		{0, 1, 1},               // idle, nothing allocated since
		{10 << 20, 1, 1},        // under load
		{5 << 20, 1, 1},         // still under load
		{1 << 20, 2, 2},         // idle again, 16 MiB since the last return
		{minReleaseBytes, 3, 2}, // idle, just enough
	} {
		allocs += step.alloc
		g.idleCheck()
		if releases != step.releases || trims != step.trims {
			t.Fatalf("step %d (+%d bytes): %d releases, %d trims; want %d, %d", i, step.alloc, releases, trims, step.releases, step.trims)
		}
	}
}

// With node.memory.idle_release, a node that stops allocating returns the
// heap's free pages to the operating system.
func TestIdleReleaseReturnsMemory(t *testing.T) {
	var logs testutil.Buffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	released := func() uint64 {
		s := []metrics.Sample{{Name: "/memory/classes/heap/released:bytes"}}
		metrics.Read(s)
		return s[0].Value.Uint64()
	}
	restore := applyMemory(pipeline.MemoryConfig{IdleRelease: pipeline.Interval(20 * time.Millisecond)}, log, func(string) string { return "" })
	defer restore()
	garbage := make([][]byte, 0, 2048)
	for range 2048 {
		garbage = append(garbage, make([]byte, 4<<10))
	}
	before := released() // the 8 MiB of garbage-to-be are in use
	runtime.KeepAlive(garbage)
	garbage = nil
	testutil.Eventually(t, 10*time.Second, "free memory returned by the idle check", func() bool {
		return strings.Contains(logs.String(), "idle: returned free memory to the operating system") && released() > before
	})
	if l := logs.String(); !strings.Contains(l, `msg="unmapped the executable's pages" when=start`) ||
		!strings.Contains(l, `msg="unmapped the executable's pages" when=idle`) {
		t.Errorf("the executable's pages were not unmapped at the start and once idle:\n%s", l)
	}
}
