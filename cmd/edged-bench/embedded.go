package main

import (
	"fmt"
	"time"
)

// benchEmbedded measures durable QoS 1 ingestion through edged's embedded
// broker (a PUBACK only once the message is in the ingest log). Each round
// runs, one after the other, the same publishers against Mosquitto (in
// memory), then against a fresh edged's embedded broker twice: on topics
// no pipeline reads (mochi and edged's hooks, nothing appended: the
// broker's own ceiling in that process) and durably into the pipeline's
// ingest log; odd rounds run the no-log load first, even rounds last.
func benchEmbedded(dir string, mq *mosquitto) error {
	cs, err := parseInts(*embConns)
	if err != nil {
		return fmt.Errorf("-embedded-conns: %w", err)
	}
	if *embRounds < 1 {
		return fmt.Errorf("-embedded-rounds (%d) must be at least 1", *embRounds)
	}
	for _, c := range cs {
		for rnd := 1; rnd <= *embRounds; rnd++ {
			if err := embeddedRound(dir, mq, c, rnd); err != nil {
				return err
			}
		}
	}
	note("embedded", "Pipeline as in the external scenario, exactly-once (checkpoints every 1 s, write-ahead MQTT sink to the embedded broker), durable ingestion: the broker sends the PUBACK once the message is in the ingest log. Messages/s: first publish until the last PUBACK, over all connections. \"No log\": the same publishers to the same edged's broker on topics no pipeline reads (%s/…), so nothing is appended: mochi with edged's hooks, the broker itself in that process; odd rounds run it before the durable load, even rounds after every result is in.", noLogRoot("e/emb-N"))
	return nil
}

// noLogRoot is the topic root of the no-log load of the pipeline reading
// root+"/+": a sibling of root, which that filter does not match.
func noLogRoot(root string) string { return root + "-nolog" }

// embeddedRound runs round rnd of the embedded scenario with c connections.
func embeddedRound(dir string, mq *mosquitto, c, rnd int) error {
	n := *embN
	rate := int64(*eventRate)
	ts := func(i int) int64 { return epochMS + int64(i)*1000/rate }
	const win = int64(1000)
	suffix, name := "", fmt.Sprintf("%d QoS 1 connections", c)
	if *embRounds > 1 {
		suffix, name = fmt.Sprintf("-r%d", rnd), fmt.Sprintf("%d QoS 1 connections, round %d", c, rnd)
	}
	// Baseline: the same publishers to Mosquitto, which keeps messages in
	// memory and has no subscriber for them here.
	root := fmt.Sprintf("e/mosq-%d%s", c, suffix)
	l, err := newLoad(mq.addr, "bench-emb-base", encodeReadings(n, c, 1, reading(root, "m", *sensors, 4, ts)), 1)
	if err != nil {
		return err
	}
	start := time.Now()
	err = l.run(*embInflight, 0, time.Now().Add(*timeout))
	baseDur := time.Since(start)
	l.close()
	if err != nil {
		return fmt.Errorf("mosquitto baseline: %w", err)
	}
	baseRate := float64(n) / baseDur.Seconds()
	logf("embedded: mosquitto took %d QoS 1 publishes on %d connections in %v", n, c, baseDur)

	addr, err := freeAddr()
	if err != nil {
		return err
	}
	root = fmt.Sprintf("e/emb-%d%s", c, suffix)
	spec := pipelineSpec{name: fmt.Sprintf("emb-%d%s", c, suffix), embedded: addr, topic: root + "/+",
		window: "1s", lateness: lateness.String(), sinkTopic: root + "-out/{id}", checkpoint: "exactly_once"}
	e, err := newEdged(dir, spec)
	if err != nil {
		return err
	}
	if err := e.start(); err != nil {
		return err
	}
	// Even rounds run the no-log load after the durable one: neither
	// always gets the freshly started process.
	r, err := runEmbedded(e, addr, root, spec.name, c, n, ts, win, rnd%2 == 0)
	e.stop()
	if err != nil {
		return fmt.Errorf("%d connections: %w", c, err)
	}
	target := map[int]float64{4: 30_000, 16: 60_000}[c]
	var met, noLogMet *bool
	targetS := ""
	if target > 0 {
		met, noLogMet = ptr(r.rate() >= target), ptr(r.noLogRate() >= target)
		targetS = "≥ " + commas(int64(target)) + " msg/s"
	}
	what := fmt.Sprintf("%s readings, %d in flight per connection; first publish to last PUBACK", commas(int64(n)), *embInflight)
	addFigure(figure{Scenario: "embedded", Figure: "messages/s", Subject: name, Value: r.rate(), Unit: "msg/s",
		Baseline: &baseRate, BaselineOf: "same publishers to Mosquitto (in memory)", Target: targetS, Met: met,
		What: what + " (a PUBACK once in the ingest log)"})
	addFigure(figure{Scenario: "embedded", Figure: "messages/s against no log", Subject: name, Value: r.rate(), Unit: "msg/s",
		Baseline: ptr(r.noLogRate()), BaselineOf: "same publishers to the same edged's broker, topics no pipeline reads (no log)",
		What: what + " (a PUBACK once in the ingest log)"})
	addFigure(figure{Scenario: "embedded", Figure: "messages/s, no log", Subject: name, Value: r.noLogRate(), Unit: "msg/s",
		Baseline: &baseRate, BaselineOf: "same publishers to Mosquitto (in memory)", Target: targetS, Met: noLogMet,
		What: what + " to the same edged's broker on topics no pipeline reads: mochi and edged's hooks, nothing appended"})
	addFigure(figure{Scenario: "embedded", Figure: "longest PUBACK wait", Subject: name, Value: float64(r.ackGap.Microseconds()) / 1000, Unit: "ms",
		What: fmt.Sprintf("longest time between two PUBACKs on one publishing connection; %d of its publishes were outstanding when it began (%d in flight at most)", r.ackGapOut, *embInflight)})
	addFigure(figure{Scenario: "embedded", Figure: "CPU per message", Subject: name, Value: r.cpuPerMsg(), Unit: "µs/msg",
		Baseline: ptr(r.noLogCPUPerMsg()), BaselineOf: "same edged, no log (broker only)",
		What: fmt.Sprintf("edged's CPU %s (broker, ingest log, pipeline, results) over %s messages", round(r.cpu), commas(r.read))})
	addFigure(figure{Scenario: "embedded", Figure: "peak RSS", Subject: name, Value: float64(r.peakKB) / 1024, Unit: "MB",
		Baseline: ptr(float64(r.idleKB) / 1024), BaselineOf: "same process idle", Target: "≤ 80 MB", Met: ptr(float64(r.peakKB)/1024 <= 80),
		What: "while publishing and until all results are in"})
	addFigure(figure{Scenario: "embedded", Figure: "loss", Subject: name, Value: float64(r.loss(n)), Unit: "readings",
		Target: "0", Met: ptr(r.loss(n) == 0),
		What: fmt.Sprintf("published minus counted in the window results minus dead letters (%d result messages for a window already seen; %s)", r.dups, r.deadNote())})
	return nil
}

// embeddedRun is a durable run of the embedded scenario and the no-log
// run before it in the same process.
type embeddedRun struct {
	subjectRun
	noLogN int64
	// ackGap is the longest wait between two PUBACKs on one connection,
	// ackGapOut the publishes it had outstanding when the wait began.
	ackGap    time.Duration
	ackGapOut int64
	noLogDur  time.Duration // first publish to last PUBACK
	noLogCPU  time.Duration // edged's CPU meanwhile
}

func (r embeddedRun) noLogRate() float64 {
	if r.noLogDur <= 0 {
		return 0
	}
	return float64(r.noLogN) / r.noLogDur.Seconds()
}

func (r embeddedRun) noLogCPUPerMsg() float64 {
	if r.noLogN == 0 {
		return 0
	}
	return float64(r.noLogCPU.Microseconds()) / float64(r.noLogN)
}

// runNoLog publishes n readings on c connections to the embedded broker
// at addr on topics under noLogRoot(root), which the pipeline does not
// read, and returns how long until the last PUBACK and edged's CPU
// meanwhile. It fails if the ingest log grew: then the run measured the
// log after all.
func runNoLog(e *edged, addr, root string, c, n int, ts func(int) int64, deadline time.Time) (time.Duration, time.Duration, error) {
	l, err := newLoad(addr, "bench-emb-nolog", encodeReadings(n, c, 1, reading(noLogRoot(root), "m", *sensors, 4, ts)), 1)
	if err != nil {
		return 0, 0, err
	}
	defer l.close()
	off0, err := e.ingested()
	if err != nil {
		return 0, 0, err
	}
	cpu0, err := cpuTime(e.pid())
	if err != nil {
		return 0, 0, err
	}
	logf("embedded: publishing %d readings on %d connections to topics no pipeline reads", n, c)
	start := time.Now()
	if err := l.run(*embInflight, 0, deadline); err != nil {
		return 0, 0, fmt.Errorf("no-log load: %w\n%s", err, e.logTail())
	}
	dur := time.Since(start)
	cpu1, err := cpuTime(e.pid())
	if err != nil {
		return 0, 0, err
	}
	off1, err := e.ingested()
	if err != nil {
		return 0, 0, err
	}
	if off1 != off0 {
		return 0, 0, fmt.Errorf("no-log load: the ingest log took %d records of topics under %s", off1-off0, noLogRoot(root))
	}
	logf("embedded: no log: %d connections: %d PUBACKed in %v", c, n, dur)
	return dur, cpu1 - cpu0, nil
}

// runEmbedded runs the durable load, and the no-log load before it (after
// it, once every result is in, with noLogAfter).
func runEmbedded(e *edged, addr, root, name string, c, n int, ts func(int) int64, win int64, noLogAfter bool) (embeddedRun, error) {
	r := embeddedRun{subjectRun: subjectRun{subject: name}}
	if _, err := e.waitRunning(*timeout); err != nil {
		return r, err
	}
	res := newResults()
	sub, err := subscribeResults("tcp://"+addr, "bench-res-"+name, root+"-out/+", res)
	if err != nil {
		return r, err
	}
	defer sub.Disconnect(100)
	time.Sleep(time.Second)
	r.idleKB, _ = rssKB(e.pid())
	deadline := time.Now().Add(*timeout)
	if !noLogAfter {
		if r.noLogDur, r.noLogCPU, err = runNoLog(e, addr, root, c, n, ts, deadline); err != nil {
			return r, err
		}
		r.noLogN = int64(n)
	}
	base, err := e.ingested()
	if err != nil {
		return r, err
	}
	dead0, err := e.deadLetters()
	if err != nil {
		return r, err
	}
	l, err := newLoad(addr, "bench-emb", encodeReadings(n, c, 1, reading(root, "m", *sensors, 4, ts)), 1)
	if err != nil {
		return r, err
	}
	defer l.close()
	rss := sampleRSS(e.pid())
	defer rss.close()
	cpu0, err := cpuTime(e.pid())
	if err != nil {
		return r, err
	}
	logf("embedded: publishing %d readings on %d connections", n, c)
	logAt := e.logSize()
	start := time.Now()
	if err := l.run(*embInflight, 0, deadline); err != nil {
		return r, fmt.Errorf("%w\n%s", err, e.logTail())
	}
	r.pubDur = time.Since(start)
	r.readDur = r.pubDur
	r.ackGap, r.ackGapOut = l.maxAckGap()
	if off, err := e.ingested(); err == nil && off-base != int64(n) {
		logf("embedded: ingest log holds %d new records after %d PUBACKs", off-base, n)
	}
	lastEnd := windowEnd(ts(n-1), win)
	tailTS := lastEnd + lateness.Milliseconds() + win
	tail, err := newLoad(addr, "bench-emb-tail", encodeReadings(*sensors, 1, 1, reading(root, "m", *sensors, 4, func(int) int64 { return tailTS })), 1)
	if err != nil {
		return r, err
	}
	defer tail.close()
	if err := tail.run(*embInflight, 0, deadline); err != nil {
		return r, err
	}
	if _, err := waitSum(res, lastEnd, int64(n), e, resultSettle(), deadline); err != nil {
		return r, err
	}
	cpu1, err := cpuTime(e.pid())
	if err != nil {
		return r, err
	}
	r.read = int64(n)
	r.cpu, r.peakKB = cpu1-cpu0, rss.peakKB()
	e.heapNote("embedded", fmt.Sprintf("%d connections", c), logAt)
	r.counted = res.sumBefore(lastEnd)
	r.dups = res.stats().dups
	dead1, err := e.deadLetters()
	if err != nil {
		return r, err
	}
	r.dead = dead1 - dead0
	logf("embedded: %d connections: %d PUBACKed in %v; counted %d, %d dead letters; longest wait for a PUBACK on one connection %v (%d outstanding)", c, n, r.pubDur, r.counted, r.dead, r.ackGap, r.ackGapOut)
	if noLogAfter {
		if r.noLogDur, r.noLogCPU, err = runNoLog(e, addr, root, c, n, ts, deadline); err != nil {
			return r, err
		}
		r.noLogN = int64(n)
	}
	return r, nil
}
