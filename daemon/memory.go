package daemon

import (
	"log/slog"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"time"

	"github.com/edgedio/edged/internal/pagetrim"
	"github.com/edgedio/edged/pipeline"
)

// liveMetric is the runtime metric of the heap's live bytes, as marked by
// the last garbage collection.
const liveMetric = "/gc/heap/live:bytes"

// memoryPoll is how often the memory governor reads the live heap.
const memoryPoll = 250 * time.Millisecond

// allocsMetric is the runtime metric of the bytes allocated on the heap
// since the process started.
const allocsMetric = "/gc/heap/allocs:bytes"

// minReleaseBytes is how much an idle node must have allocated since it
// last returned memory to the operating system before it does again: an
// idle node with (almost) no garbage runs no collection for nothing.
const minReleaseBytes = 256 << 10

// limitFor is the soft memory limit the runtime gets for the configured
// limit and the live heap: the configured limit, raised to 1.25 × live
// when the live data outgrow 80 % of it. Below that floor the collector
// would run back to back (up to half the CPU) without freeing anything;
// with it, live data above the limit cost a collection each time the heap
// grows by a quarter of them, as GOGC=25 would. A limit of 0 or less is
// no limit (math.MaxInt64 is what the runtime takes for none).
func limitFor(limit, live int64) int64 {
	if limit <= 0 {
		return noLimit
	}
	return max(limit, live+live/4)
}

// noLimit is the runtime's "no memory limit".
const noLimit = int64(^uint64(0) >> 1)

// memoryGovernor applies node.memory's garbage collector settings to the
// process while a node runs, keeps the soft limit above the live data
// (limitFor) and returns an idle node's free memory to the operating
// system (idleCheck). The settings are process-wide; restore puts back
// the ones it found.
type memoryGovernor struct {
	log       *slog.Logger
	limit     int64 // configured; noLimit when off
	setLimit  bool  // false when GOMEMLIMIT is set: the environment wins
	prevLimit int64
	prevGC    int
	setGC     bool
	raised    bool // the limit is raised above the configured one

	// idle is node.memory.idle_release (0: off); readAllocs returns the
	// bytes allocated since the process started, release returns the
	// free heap to the operating system (debug.FreeOSMemory) and trim
	// unmaps the executable's pages (trimExecutable); tests replace them.
	idle       time.Duration
	readAllocs func() uint64
	release    func()
	trim       func(when string)
	lastAllocs uint64 // at the previous idle check
	released   uint64 // allocations at the last release
	busy       bool   // the node was not idle at the previous check

	stop chan struct{}
	wg   sync.WaitGroup
}

// applyMemory applies m (defaults filled in) unless the environment
// (getenv: GOMEMLIMIT, GOGC) sets the same, unmaps the executable's pages
// the package initialisers and the configuration touched (with
// idle_release), starts the governor and returns the function that stops
// it and restores the previous settings.
func applyMemory(m pipeline.MemoryConfig, log *slog.Logger, getenv func(string) string) (restore func()) {
	m = m.WithDefaults()
	g := &memoryGovernor{log: log, limit: int64(m.Limit), stop: make(chan struct{}),
		readAllocs: readAllocs, release: debug.FreeOSMemory, busy: true}
	g.trim = func(when string) { trimExecutable(log, when) }
	if m.Limit == pipeline.ByteSizeOff {
		g.limit = noLimit
	}
	if m.IdleRelease != pipeline.IntervalOff {
		g.idle = time.Duration(m.IdleRelease)
	}
	g.setLimit = getenv("GOMEMLIMIT") == ""
	g.setGC = getenv("GOGC") == ""
	if g.setGC {
		g.prevGC = debug.SetGCPercent(m.GCPercent)
	}
	follow := false // the soft limit follows the live heap
	if g.setLimit {
		g.prevLimit = debug.SetMemoryLimit(g.limit)
		follow = g.limit != noLimit
	}
	if g.idle > 0 {
		// What the package initialisers and the configuration touched.
		g.trim("start")
	}
	if follow || g.idle > 0 {
		g.lastAllocs = g.readAllocs()
		g.released = g.lastAllocs
		g.wg.Go(func() { g.tick(follow) })
	}
	log.Info("memory settings", "limit", limitString(g.setLimit, m.Limit, "GOMEMLIMIT", getenv),
		"gc_percent", gcString(g.setGC, m.GCPercent, getenv), "batch_size", m.BatchSize, "credits", m.Credits,
		"mqtt_pending_bytes", m.MQTTPendingBytes.String(), "broker_session_bytes", m.BrokerSessionBytes.String(),
		"broker_retained_bytes", m.BrokerRetainedBytes.String(), "broker_connections", m.BrokerConnections,
		"broker_client_subscriptions", m.BrokerClientSubscriptions,
		"idle_release", m.IdleRelease.String())
	return func() {
		close(g.stop)
		g.wg.Wait()
		if g.setLimit {
			debug.SetMemoryLimit(g.prevLimit)
		}
		if g.setGC {
			debug.SetGCPercent(g.prevGC)
		}
	}
}

func limitString(set bool, v pipeline.ByteSize, env string, getenv func(string) string) string {
	if !set {
		return env + "=" + getenv(env)
	}
	return v.String()
}

func gcString(set bool, v int, getenv func(string) string) any {
	if !set {
		return "GOGC=" + getenv("GOGC")
	}
	return v
}

// readAllocs returns the bytes allocated on the heap since the process
// started.
func readAllocs() uint64 {
	s := []metrics.Sample{{Name: allocsMetric}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s[0].Value.Uint64()
}

// tick runs the governor until stop: the soft limit follows the live heap
// every memoryPoll when follow is set, and the idle check runs every
// node.memory.idle_release when set.
func (g *memoryGovernor) tick(follow bool) {
	var poll, idle <-chan time.Time
	if follow {
		t := time.NewTicker(memoryPoll)
		defer t.Stop()
		poll = t.C
	}
	if g.idle > 0 {
		t := time.NewTicker(g.idle)
		defer t.Stop()
		idle = t.C
	}
	g.run(poll, idle)
}

// run moves the soft limit by limitFor at each tick of poll, and returns
// an idle node's free memory to the operating system at each tick of
// idle (idleCheck), until stop.
func (g *memoryGovernor) run(poll, idle <-chan time.Time) {
	sample := []metrics.Sample{{Name: liveMetric}}
	cur := g.limit
	for {
		select {
		case <-g.stop:
			return
		case <-idle:
			g.idleCheck()
			continue
		case <-poll:
		}
		metrics.Read(sample)
		if sample[0].Value.Kind() != metrics.KindUint64 {
			poll = nil
			continue
		}
		live := int64(sample[0].Value.Uint64())
		want := limitFor(g.limit, live)
		if want == cur {
			continue
		}
		debug.SetMemoryLimit(want)
		cur = want
		switch {
		case want > g.limit && !g.raised:
			g.raised = true
			g.log.Warn("live data near node.memory.limit: the soft limit follows them (raise node.memory.limit to the state's size)",
				"limit", pipeline.ByteSize(g.limit).String(), "live_bytes", live, "effective_limit_bytes", want)
		case want == g.limit && g.raised:
			g.raised = false
			g.log.Info("live data back under node.memory.limit", "limit", pipeline.ByteSize(g.limit).String(), "live_bytes", live)
		}
	}
}

// idleCheck returns the heap's free memory to the operating system when
// the node allocated less than pipeline.IdleAllocBytes since the previous
// check (it is idle) and at least minReleaseBytes since it last did (there
// is garbage to free). When the node has just become idle (the first
// check after start-up or after load) it also unmaps the executable's
// pages: what the idle node uses maps back on first touch, the code and
// tables only start-up or the load used stay in the page cache.
func (g *memoryGovernor) idleCheck() {
	allocs := g.readAllocs()
	period := allocs - g.lastAllocs
	g.lastAllocs = allocs
	if period >= pipeline.IdleAllocBytes {
		g.busy = true
		return
	}
	if g.busy {
		g.busy = false
		g.trim("idle")
	}
	if allocs-g.released < minReleaseBytes {
		return
	}
	since := allocs - g.released
	g.release()
	g.released = g.readAllocs()
	g.lastAllocs = g.released
	g.log.Debug("idle: returned free memory to the operating system", "allocated_since_last_bytes", since)
}

// trimExecutable unmaps the executable's resident pages from the process
// (pagetrim.Executable) and logs what it did at debug level.
func trimExecutable(log *slog.Logger, when string) {
	n, err := pagetrim.Executable()
	if err != nil {
		log.Debug("could not unmap the executable's pages", "when", when, "err", err)
		return
	}
	log.Debug("unmapped the executable's pages", "when", when, "resident_bytes", n)
}
