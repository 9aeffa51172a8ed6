package main

import (
	"bytes"
	"flag"
	"fmt"
	"strings"
	"time"
)

var (
	memConfig = flag.String("memory-config", "", "memory: node.memory of the measured runs, as a YAML flow mapping's content (empty: the defaults)")
	memPar    = flag.Int("memory-parallelism", 0, "memory: the pipeline's parallelism (0: the default, 1)")
	memLoads  = flag.String("memory-loads", "mem-load,mem-burst,mem-big", "memory: the loads to run, comma-separated: mem-load (sustained), mem-burst, mem-big (large payloads)")
	memBase   = flag.String("memory-base", "limit: off, credits: 16, batch_size: 512", "memory: node.memory of the same-run baseline (default: the settings of a node before node.memory: no soft limit, 16 credits, 512 records per batch); empty: no baseline runs")
)

// benchMemory measures edged's RSS idle, under a sustained load with many
// keys, during a burst of the external scenario's load and during a burst
// of large payloads, each in a fresh process (exactly-once pipeline
// reading the external Mosquitto), with -memory-config and, as the
// baseline in the same run, with -memory-base.
func benchMemory(dir string, mq *mosquitto) error {
	rate := *loadRate
	sustained := memLoad{name: "mem-load", root: "mem/load", n: *loadN, keys: *loadKeys, conns: 4, inflight: *inflight, rate: rate,
		// Event time follows the publishing rate, as from real sensors.
		ts: func(i int) int64 { return epochMS + int64(float64(i)*1000/rate) }}
	eventRate := int64(*eventRate)
	burst := memLoad{name: "mem-burst", root: "mem/burst", n: *nMsgs, keys: *sensors, conns: *conns, inflight: *inflight,
		ts: func(i int) int64 { return epochMS + int64(i)*1000/eventRate }}
	big := memLoad{name: "mem-big", root: "mem/big", n: *bigN, keys: 10, conns: 4, inflight: 16,
		ts: func(i int) int64 { return epochMS + int64(i)*10 }}
	pad := bytes.Repeat([]byte("x"), *bigSize)
	big.msg = func(i int) (string, []byte) {
		s := fmt.Sprintf("k%05d", i%big.keys)
		p := fmt.Appendf(nil, `{"sensor":%q,"t":%d.5,"ts":%d,"pad":"`, s, 20+i%15, big.ts(i))
		p = append(p, pad[:max(0, *bigSize-len(p)-2)]...)
		return big.root + "/" + s, append(p, `"}`...)
	}

	run := map[string]bool{}
	for _, name := range strings.Split(*memLoads, ",") {
		run[strings.TrimSpace(name)] = true
	}
	for _, l := range []memLoad{sustained, burst, big} {
		if !run[l.name] {
			continue
		}
		r, err := runMemLoad(dir, mq, l, *memConfig)
		if err != nil {
			return fmt.Errorf("%s: %w", l.name, err)
		}
		var base *memRun
		if *memBase != "" {
			b, err := runMemLoad(dir, mq, l, *memBase)
			if err != nil {
				return fmt.Errorf("%s, baseline: %w", l.name, err)
			}
			base = &b
		}
		reportMem(l, r, base)
	}
	cfg := *memConfig
	if cfg == "" {
		cfg = "the defaults"
	}
	par := "1"
	if *memPar > 0 {
		par = fmt.Sprint(*memPar)
	}
	note("memory", "Every figure is a fresh edged running the exactly-once pipeline (1 s tumbling count+avg per sensor, checkpoints every 1 s, write-ahead MQTT sink, parallelism "+par+") against the external Mosquitto, with node.memory %s; the baseline, in the same run, is a fresh edged with node.memory {%s}. Idle is the peak over the first 10 s after the job runs, without traffic (checkpoints every 1 s go on). CPU: utime+stime of edged from the first publish until all results were in, over the readings.", cfg, *memBase)
	return nil
}

func reportMem(l memLoad, r memRun, base *memRun) {
	mb := func(kb int64) float64 { return float64(kb) / 1024 }
	var bPeak, bIdle, bCPU *float64
	baseOf := ""
	if base != nil {
		bPeak, bIdle, bCPU = ptr(mb(base.peakAll)), ptr(mb(base.idle)), ptr(base.cpuPerReading(l.n))
		baseOf = "{" + *memBase + "}"
	}
	if l.name == "mem-load" {
		addFigure(figure{Scenario: "memory", Figure: "RSS idle", Value: mb(r.idle), Unit: "MB", Baseline: bIdle, BaselineOf: baseOf,
			Target: "≤ 25 MB", Met: ptr(mb(r.idle) <= 25), What: fmt.Sprintf("edged with the exactly-once pipeline reading Mosquitto, no traffic: peak over the first %s after the job runs", idleFor)})
	}
	var name, what string
	switch l.name {
	case "mem-load":
		name = "peak RSS under sustained load"
		what = fmt.Sprintf("%s readings of %s sensors offered at %s/s (QoS 1, %d connections) for %s, event time following",
			commas(int64(l.n)), commas(int64(l.keys)), commas(int64(l.rate)), l.conns, round(r.pubDur))
	case "mem-burst":
		name = fmt.Sprintf("peak RSS, %s-message burst", commas(int64(l.n)))
		what = fmt.Sprintf("%s readings of %s sensors published as fast as %d QoS 1 connections go (%d in flight each; published in %s)",
			commas(int64(l.n)), commas(int64(l.keys)), l.conns, l.inflight, round(r.pubDur))
	default:
		name = "peak RSS, large payloads"
		what = fmt.Sprintf("burst of %d messages of %s to %d sensors (QoS 1, %d connections, %d in flight each, published in %s)",
			l.n, fmtBytes(*bigSize), l.keys, l.conns, l.inflight, round(r.pubDur))
	}
	target := "≤ 80 MB"
	if l.name == "mem-big" {
		target = "≤ 80 MB, not a multiple of the payload"
	}
	what += fmt.Sprintf("; peak from the first publish until all %s results were in (%s, i.e. %s readings/s consumed); peak while publishing %.1f MB; idle peak before %.1f MB; loss %d",
		commas(r.results), round(r.consumed), commas(int64(float64(l.n)/r.consumed.Seconds())), mb(r.peakPub), mb(r.idle), r.loss)
	if base != nil {
		what += fmt.Sprintf(" (baseline: loss %d, consumed in %s)", base.loss, round(base.consumed))
	}
	addFigure(figure{Scenario: "memory", Figure: name, Value: mb(r.peakAll), Unit: "MB", Baseline: bPeak, BaselineOf: baseOf,
		Target: target, Met: ptr(mb(r.peakAll) <= 80), What: what})
	addFigure(figure{Scenario: "memory", Figure: "CPU per reading, " + l.name, Value: r.cpuPerReading(l.n), Unit: "µs/msg", Baseline: bCPU, BaselineOf: baseOf,
		What: fmt.Sprintf("edged's CPU %s over %s readings (the garbage collector's extra work under the soft limit)", round(r.cpu), commas(int64(l.n)))})
}

func startMemEdged(dir string, mq *mosquitto, name, root, memory string) (*edged, *results, func(), error) {
	spec := pipelineSpec{name: name, broker: mq.url(), topic: root + "/+", window: "1s", lateness: lateness.String(),
		sinkTopic: root + "-out/{id}", checkpoint: "exactly_once", memory: memory, parallelism: *memPar}
	e, err := newEdged(dir, spec)
	if err != nil {
		return nil, nil, nil, err
	}
	res := newResults()
	sub, err := subscribeResults(mq.url(), "bench-res-"+name, root+"-out/+", res)
	if err != nil {
		return nil, nil, nil, err
	}
	if err := e.start(); err != nil {
		sub.Disconnect(100)
		return nil, nil, nil, err
	}
	stop := func() {
		e.stop()
		sub.Disconnect(100)
	}
	if _, err := e.waitRunning(*timeout); err != nil {
		stop()
		return nil, nil, nil, err
	}
	return e, res, stop, nil
}

// memLoad is a load the memory scenario offers a fresh edged: n messages
// msg(i) (default: JSON readings of keys sensors k00000... under root,
// event time ts(i)), published by conns QoS 1 connections with inflight
// publishes in flight each, at rate messages/s (0: as fast as they go).
type memLoad struct {
	name, root               string
	n, keys, conns, inflight int
	rate                     float64
	ts                       func(i int) int64
	msg                      func(i int) (string, []byte)
}

// idleFor is how long the memory scenario samples an idle edged.
const idleFor = 10 * time.Second

// memRun is what runMemLoad measured.
type memRun struct {
	idle, peakPub, peakAll int64 // kB
	pubDur, consumed       time.Duration
	cpu                    time.Duration // edged's, from the first publish until all results were in
	results, loss          int64
}

func (r memRun) cpuPerReading(n int) float64 {
	return float64(r.cpu.Microseconds()) / float64(max(n, 1))
}

// runMemLoad starts a fresh edged with node.memory {memory}, measures its
// RSS idle, offers it l and samples its RSS until every result is in.
func runMemLoad(dir string, mq *mosquitto, l memLoad, memory string) (memRun, error) {
	var r memRun
	// Each run has its own directory, topics and client ids.
	run := l.name
	if memory != "" && memory == *memBase {
		run += "-base"
	}
	root := l.root + "/" + run
	e, res, stop, err := startMemEdged(dir, mq, run, root, memory)
	if err != nil {
		return r, err
	}
	defer stop()
	// Idle: the peak over idleFor without traffic (checkpoints go on, and
	// their garbage grows the heap to the collector's goal over seconds).
	idle := sampleRSS(e.pid())
	time.Sleep(idleFor)
	r.idle = idle.peakKB()
	idle.close()
	msg := reading(root, "k", l.keys, 5, l.ts)
	if l.msg != nil {
		gen := l.msg
		msg = func(i int) (string, []byte) {
			topic, p := gen(i)
			return root + topic[len(l.root):], p
		}
	}
	const win = int64(1000)
	ld, err := newLoad(mq.addr, "bench-"+run, encodeReadings(l.n, l.conns, 1, msg), 1)
	if err != nil {
		return r, err
	}
	defer ld.close()
	rss := sampleRSS(e.pid())
	defer rss.close()
	deadline := time.Now().Add(*timeout)
	logf("memory: %s (node.memory {%s}): %d messages of %d keys at %.0f/s (0: as fast as they go)", run, memory, l.n, l.keys, l.rate)
	logAt := e.logSize()
	base, err := e.ingested()
	if err != nil {
		return r, err
	}
	cpu0, err := cpuTime(e.pid())
	if err != nil {
		return r, err
	}
	start := time.Now()
	if err := ld.run(l.inflight, l.rate, deadline); err != nil {
		return r, fmt.Errorf("%w\n%s", err, e.logTail())
	}
	r.pubDur = time.Since(start)
	r.peakPub = rss.peakKB()
	if _, err := trackReads(e, base, int64(l.n), closed, *settle, deadline); err != nil {
		return r, err
	}
	lastEnd := windowEnd(l.ts(l.n-1), win)
	tailTS := lastEnd + lateness.Milliseconds() + win
	tail, err := newLoad(mq.addr, "bench-"+run+"-tail", encodeReadings(l.keys, 1, 1, reading(root, "k", l.keys, 5, func(int) int64 { return tailTS })), 1)
	if err != nil {
		return r, err
	}
	defer tail.close()
	if err := tail.run(l.inflight, 0, deadline); err != nil {
		return r, err
	}
	doneAt, err := waitSum(res, lastEnd, int64(l.n), e, resultSettle(), deadline)
	if err != nil {
		return r, err
	}
	cpu1, err := cpuTime(e.pid())
	if err != nil {
		return r, err
	}
	r.cpu = cpu1 - cpu0
	r.loss = int64(l.n) - res.sumBefore(lastEnd)
	r.peakAll = rss.peakKB()
	r.results = res.stats().msgs
	r.consumed = doneAt.Sub(start)
	e.heapNote("memory", run, logAt)
	return r, nil
}

// closed is a closed channel: the publishing it stands for is over.
var closed = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

func fmtBytes(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}
