package daemon

import (
	"log/slog"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"time"

	"github.com/edgedio/edged/pipeline"
)

// liveMetric is the runtime metric of the heap's live bytes, as marked by
// the last garbage collection.
const liveMetric = "/gc/heap/live:bytes"

// memoryPoll is how often the memory governor reads the live heap.
const memoryPoll = 250 * time.Millisecond

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
// process while a node runs and keeps the soft limit above the live data
// (limitFor). The settings are process-wide; restore puts back the ones
// it found.
type memoryGovernor struct {
	log       *slog.Logger
	limit     int64 // configured; noLimit when off
	setLimit  bool  // false when GOMEMLIMIT is set: the environment wins
	prevLimit int64
	prevGC    int
	setGC     bool
	raised    bool // the limit is raised above the configured one

	stop chan struct{}
	wg   sync.WaitGroup
}

// applyMemory applies m (defaults filled in) unless the environment
// (getenv: GOMEMLIMIT, GOGC) sets the same, starts the governor and returns
// the function that stops it and restores the previous settings.
func applyMemory(m pipeline.MemoryConfig, log *slog.Logger, getenv func(string) string) (restore func()) {
	m = m.WithDefaults()
	g := &memoryGovernor{log: log, limit: int64(m.Limit), stop: make(chan struct{})}
	if m.Limit == pipeline.ByteSizeOff {
		g.limit = noLimit
	}
	g.setLimit = getenv("GOMEMLIMIT") == ""
	g.setGC = getenv("GOGC") == ""
	if g.setGC {
		g.prevGC = debug.SetGCPercent(m.GCPercent)
	}
	if g.setLimit {
		g.prevLimit = debug.SetMemoryLimit(g.limit)
		if g.limit != noLimit {
			g.wg.Go(g.run)
		}
	}
	log.Info("memory settings", "limit", limitString(g.setLimit, m.Limit, "GOMEMLIMIT", getenv),
		"gc_percent", gcString(g.setGC, m.GCPercent, getenv), "batch_size", m.BatchSize, "credits", m.Credits,
		"mqtt_pending_bytes", m.MQTTPendingBytes.String(), "broker_session_bytes", m.BrokerSessionBytes.String())
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

// run polls the live heap and moves the soft limit by limitFor.
func (g *memoryGovernor) run() {
	t := time.NewTicker(memoryPoll)
	defer t.Stop()
	sample := []metrics.Sample{{Name: liveMetric}}
	cur := g.limit
	for {
		select {
		case <-g.stop:
			return
		case <-t.C:
		}
		metrics.Read(sample)
		if sample[0].Value.Kind() != metrics.KindUint64 {
			return
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
