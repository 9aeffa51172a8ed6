package main

import (
	"fmt"
	"strings"
	"time"
)

// subjectRun is what one subscriber did with one load.
type subjectRun struct {
	subject   string
	read      int64         // messages read (bare) or logged (edged)
	readDur   time.Duration // first to last read
	cpu       time.Duration // CPU time of the reading process meanwhile
	peakKB    int64
	idleKB    int64
	pubDur    time.Duration // first publish to the last written (QoS 0) or PUBACKed (QoS 1)
	counted   int64         // readings counted in the results (edged)
	dead      int64         // records sent to the dead-letter output meanwhile (edged): late readings
	dups      int64         // result messages for a window already seen
	dupIDs    int64         // result messages with a msg_id already seen
	resultMsg int64
	e2e       time.Duration // first publish until the results are all in (edged)
	brokerCPU time.Duration // Mosquitto's CPU time meanwhile
	fsyncs    int64         // fsyncs of edged's ingest log meanwhile
	lastRead  time.Duration // first publish to the last message read
}

// loss is what of n published readings neither a window result counted
// nor the dead-letter output received.
func (r subjectRun) loss(n int) int64 { return int64(n) - r.counted - r.dead }

// deadNote says how many readings went to the dead-letter output.
func (r subjectRun) deadNote() string {
	if r.dead == 0 {
		return "0 dead letters"
	}
	return fmt.Sprintf("%s readings went to the dead-letter output: later than the watermark allows (-lateness), which a publishing connection that fell behind the others produces", commas(r.dead))
}

// fsyncNote says how many fsyncs edged's ingest log took meanwhile.
func (r subjectRun) fsyncNote() string {
	if r.subject == "bare" || r.fsyncs == 0 {
		return ""
	}
	return fmt.Sprintf("; %s ingest-log fsyncs, %.0f messages each", commas(r.fsyncs), float64(r.read)/float64(r.fsyncs))
}

func (r subjectRun) rate() float64 {
	if r.readDur <= 0 {
		return 0
	}
	return float64(r.read-1) / r.readDur.Seconds()
}

func (r subjectRun) cpuPerMsg() float64 {
	if r.read == 0 {
		return 0
	}
	return float64(r.cpu.Microseconds()) / float64(r.read)
}

var subjectNames = map[string]string{
	"bare": "bare paho subscriber",
	"alo":  "edged at-least-once",
	"eo":   "edged exactly-once",
}

func benchExternal(dir string, mq *mosquitto) error {
	qoss, err := parseInts(*pubQoS)
	if err != nil {
		return fmt.Errorf("-pub-qos: %w", err)
	}
	n := *nMsgs
	rate := int64(*eventRate)
	ts := func(i int) int64 { return epochMS + int64(i)*1000/rate }
	for _, q := range qoss {
		if q != 0 && q != 1 {
			return fmt.Errorf("-pub-qos: %d is not 0 or 1", q)
		}
		runs := map[string]subjectRun{}
		for _, subj := range strings.Split(*subjects, ",") {
			subj = strings.TrimSpace(subj)
			root := fmt.Sprintf("x/q%d-%s", q, subj)
			msg := reading(root, "m", *sensors, 4, ts)
			_, sample := msg(1)
			logf("external: QoS %d publishers → %s: encoding %d readings (%d B payload, e.g. %s) on %d connections", q, subj, n, len(sample), sample, *conns)
			pkts := encodeReadings(n, *conns, byte(q), msg)
			var r subjectRun
			switch subj {
			case "bare":
				r, err = runBare(mq, root, pkts, byte(q), int64(n))
			case "alo", "eo":
				r, err = runEdgedExternal(dir, mq, subj, root, pkts, byte(q), n, ts)
			default:
				return fmt.Errorf("-subjects: unknown subject %q", subj)
			}
			if err != nil {
				return fmt.Errorf("QoS %d, %s: %w", q, subj, err)
			}
			runs[subj] = r
			reportExternal(q, n, len(sample), r, runs)
		}
	}
	note("external", "Load: %d JSON readings of %d sensors per subscriber, %d event-time readings per second (so each 1 s window holds %d readings per sensor), published by %d raw MQTT connections from pre-encoded packets (QoS 1: %d in flight per connection; rate cap: %s); each subscriber reads its own topic tree, one after the other against the same Mosquitto. Pipeline: key by sensor, 1 s tumbling count + avg, results published over MQTT (QoS 1); max_out_of_orderness %v.",
		n, *sensors, *eventRate, *eventRate / *sensors, *conns, *inflight, rateCap(), *lateness)
	note("external", "Messages/s: first to last message read (edged: logged in its ingest log, polled every 20 ms). CPU: utime+stime of the reading process (the bare subscriber runs in its own process) from the first publish until all was read (edged: until all results were in), over the messages read. Loss: readings published minus readings counted in the window results (bare: minus messages received); duplicates: result messages for a (sensor, window) already received.")
	return nil
}

func reportExternal(q, n, size int, r subjectRun, runs map[string]subjectRun) {
	bare, haveBare := runs["bare"]
	name := fmt.Sprintf("QoS %d publishers, %s", q, subjectNames[r.subject])
	what := fmt.Sprintf("%s readings (%d B) of %d sensors", commas(int64(n)), size, *sensors)
	base := func(v float64) *float64 {
		if !haveBare || r.subject == "bare" {
			return nil
		}
		return &v
	}
	rateTarget, cpuTarget := "", ""
	var rateMet, cpuMet, lossMet *bool
	if r.subject == "eo" {
		rateTarget, cpuTarget = "≥ 0.9 × bare", "≤ 5 CPU-µs/msg"
		if haveBare {
			rateMet = ptr(r.rate() >= 0.9*bare.rate())
		}
		cpuMet = ptr(r.cpuPerMsg() <= 5)
	}
	if r.lastRead > 0 && r.pubDur >= r.lastRead*95/100 {
		note("external", "%s: the last message was read %s after the publishers finished (%s after the first publish): this rate is bounded by the load (publishers and Mosquitto), not only by the subscriber.", name, round(r.lastRead-r.pubDur), round(r.lastRead))
	}
	addFigure(figure{Scenario: "external", Figure: "messages/s", Subject: name, Value: r.rate(), Unit: "msg/s",
		Baseline: base(bare.rate()), BaselineOf: "bare", Target: rateTarget, Met: rateMet,
		What: what + fmt.Sprintf(", first to last read (%s read in %s; publishers done after %s)", commas(r.read), round(r.readDur), round(r.pubDur))})
	addFigure(figure{Scenario: "external", Figure: "CPU per message", Subject: name, Value: r.cpuPerMsg(), Unit: "µs/msg",
		Baseline: base(bare.cpuPerMsg()), BaselineOf: "bare", Target: cpuTarget, Met: cpuMet,
		What: fmt.Sprintf("process CPU %s over %s messages (Mosquitto meanwhile: %.2f CPU-µs/msg)%s", round(r.cpu), commas(r.read), float64(r.brokerCPU.Microseconds())/float64(max(r.read, 1)), r.fsyncNote())})
	peakTarget := ""
	var peakMet *bool
	if r.subject != "bare" {
		peakTarget = "≤ 80 MB"
		peakMet = ptr(float64(r.peakKB)/1024 <= 80)
	}
	addFigure(figure{Scenario: "external", Figure: "peak RSS", Subject: name, Value: float64(r.peakKB) / 1024, Unit: "MB",
		Baseline: base(float64(bare.peakKB) / 1024), BaselineOf: "bare", Target: peakTarget, Met: peakMet,
		What: fmt.Sprintf("during the %s-message burst (idle before: %.1f MB)", commas(int64(n)), float64(r.idleKB)/1024)})
	if r.subject == "bare" {
		addFigure(figure{Scenario: "external", Figure: "loss", Subject: name, Value: float64(int64(n) - r.read), Unit: "readings",
			What: "published minus received"})
		return
	}
	lossMet = ptr(r.loss(n) == 0)
	addFigure(figure{Scenario: "external", Figure: "loss", Subject: name, Value: float64(r.loss(n)), Unit: "readings",
		Target: "0", Met: lossMet,
		What: fmt.Sprintf("published minus counted in the window results minus dead letters (edged logged %s of the %s published; %s result messages, %d for a window already seen, %d with a msg_id already seen; %s)", commas(r.read), commas(int64(n)), commas(r.resultMsg), r.dups, r.dupIDs, r.deadNote())})
	addFigure(figure{Scenario: "external", Figure: "duplicates", Subject: name, Value: float64(r.dups), Unit: "results",
		What: "result messages for a (sensor, window) already received"})
	if r.e2e > 0 {
		addFigure(figure{Scenario: "external", Figure: "end-to-end messages/s", Subject: name, Value: float64(r.counted) / r.e2e.Seconds(), Unit: "msg/s",
			What: fmt.Sprintf("first publish until the results count every reading read (%s)", round(r.e2e))})
	}
}

// runBare measures the bare paho subscriber in a process of its own.
func runBare(mq *mosquitto, root string, pkts []*packets, qos byte, n int64) (subjectRun, error) {
	r := subjectRun{subject: "bare"}
	b, err := startBareSub(mq.url(), root+"/+", "bench-bare-"+strings.ReplaceAll(root, "/", "-"))
	if err != nil {
		return r, err
	}
	defer b.stop()
	l, err := newLoad(mq.addr, "bench-pub-"+strings.ReplaceAll(root, "/", "-"), pkts, qos)
	if err != nil {
		return r, err
	}
	defer l.close()
	r.idleKB, _ = rssKB(b.pid())
	rss := sampleRSS(b.pid())
	defer rss.close()
	cpu0, err := cpuTime(b.pid())
	if err != nil {
		return r, err
	}
	mq0, _ := cpuTime(mq.cmd.Process.Pid)
	logf("external: publishing to the bare subscriber")
	pubDone := make(chan struct{})
	var pubErr error
	start := time.Now()
	go func() {
		pubErr = l.run(*inflight, *pubRate, time.Now().Add(*timeout))
		r.pubDur = time.Since(start)
		close(pubDone)
	}()
	rep := b.waitCount(n, pubDone, *settle, time.Now().Add(*timeout))
	cpu1, err := cpuTime(b.pid())
	if err != nil {
		return r, err
	}
	mq1, _ := cpuTime(mq.cmd.Process.Pid)
	r.brokerCPU = mq1 - mq0
	<-pubDone
	if pubErr != nil {
		return r, pubErr
	}
	r.read, r.cpu, r.peakKB = rep.Count, cpu1-cpu0, rss.peakKB()
	r.readDur = time.Duration(rep.LastNS - rep.FirstNS)
	r.lastRead = time.Duration(rep.LastNS - start.UnixNano())
	logf("external: bare subscriber read %d of %d in %v", r.read, n, r.readDur)
	return r, nil
}

// runEdgedExternal measures edged reading the load from Mosquitto.
func runEdgedExternal(dir string, mq *mosquitto, subj, root string, pkts []*packets, qos byte, n int, ts func(int) int64) (subjectRun, error) {
	r := subjectRun{subject: subj}
	const win = int64(1000)
	spec := pipelineSpec{name: "ext-" + strings.ReplaceAll(root[2:], "/", "-"), broker: mq.url(), topic: root + "/+",
		window: "1s", lateness: lateness.String(), sinkTopic: root + "-out/{id}"}
	if subj == "eo" {
		spec.checkpoint = "exactly_once"
	}
	e, err := newEdged(dir, spec)
	if err != nil {
		return r, err
	}
	res := newResults()
	sub, err := subscribeResults(mq.url(), "bench-res-"+spec.name, root+"-out/+", res)
	if err != nil {
		return r, err
	}
	defer sub.Disconnect(100)
	if err := e.start(); err != nil {
		return r, err
	}
	defer e.stop()
	if _, err := e.waitRunning(*timeout); err != nil {
		return r, err
	}
	// A probe reading (QoS 1) shows the subscription is live before a QoS 0
	// load starts; its result is not counted.
	probe, err := newLoad(mq.addr, "bench-probe-"+spec.name, encodeReadings(1, 1, 1, func(int) (string, []byte) {
		return root + "/probe", fmt.Appendf(nil, `{"sensor":"probe","t":1,"ts":%d}`, epochMS)
	}), 1)
	if err != nil {
		return r, err
	}
	defer probe.close()
	deadline := time.Now().Add(*timeout)
	var base int64
	for {
		if err := probe.run(1, 0, deadline); err != nil {
			return r, err
		}
		time.Sleep(200 * time.Millisecond)
		if base, err = e.ingested(); err == nil && base > 0 {
			break
		}
		if time.Now().After(deadline) {
			return r, fmt.Errorf("edged logged no probe reading\n%s", e.logTail())
		}
	}
	time.Sleep(time.Second) // idle
	r.idleKB, _ = rssKB(e.pid())
	dead0, err := e.deadLetters()
	if err != nil {
		return r, err
	}

	l, err := newLoad(mq.addr, "bench-pub-"+spec.name, pkts, qos)
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
	mq0, _ := cpuTime(mq.cmd.Process.Pid)
	log0, err := e.ingestLog()
	if err != nil {
		return r, err
	}
	logf("external: publishing to %s", spec.name)
	logAt := e.logSize()
	pubDone := make(chan struct{})
	var pubErr error
	start := time.Now()
	go func() {
		pubErr = l.run(*inflight, *pubRate, deadline)
		r.pubDur = time.Since(start)
		close(pubDone)
	}()
	tr, err := trackReads(e, base, int64(n), pubDone, *settle, deadline)
	if err != nil {
		return r, err
	}
	<-pubDone
	if pubErr != nil {
		return r, pubErr
	}
	r.read, r.readDur = tr.count, tr.last.Sub(tr.first)
	r.lastRead = tr.last.Sub(start)
	logf("external: %s logged %d of %d in %v; closing the last window", spec.name, r.read, n, r.readDur)
	// A tail of one reading per sensor past the last window moves the
	// watermark on, so the last windows fire.
	lastEnd := windowEnd(ts(n-1), win)
	tailTS := lastEnd + lateness.Milliseconds() + win
	tail, err := newLoad(mq.addr, "bench-tail-"+spec.name, encodeReadings(*sensors, 1, 1, reading(root, "m", *sensors, 4, func(int) int64 { return tailTS })), 1)
	if err != nil {
		return r, err
	}
	defer tail.close()
	if err := tail.run(*inflight, 0, deadline); err != nil {
		return r, err
	}
	doneAt, err := waitSum(res, lastEnd, r.read, e, resultSettle(), deadline)
	if err != nil {
		return r, err
	}
	cpu1, err := cpuTime(e.pid())
	if err != nil {
		return r, err
	}
	mq1, _ := cpuTime(mq.cmd.Process.Pid)
	r.brokerCPU = mq1 - mq0
	r.cpu, r.peakKB = cpu1-cpu0, rss.peakKB()
	log1, err := e.ingestLog()
	if err != nil {
		return r, err
	}
	r.fsyncs = log1.Fsyncs - log0.Fsyncs
	e.heapNote("external", fmt.Sprintf("QoS %d publishers, %s", qos, subjectNames[subj]), logAt)
	r.counted = res.sumBefore(lastEnd)
	st := res.stats()
	r.dups, r.dupIDs, r.resultMsg = st.dups, st.dupIDs, st.msgs
	if r.counted >= r.read {
		r.e2e = doneAt.Sub(start)
	}
	dead1, err := e.deadLetters()
	if err != nil {
		return r, err
	}
	r.dead = dead1 - dead0
	logf("external: %s counted %d of %d; %d result messages, %d dead letters", spec.name, r.counted, n, st.msgs, r.dead)
	return r, nil
}

func rateCap() string {
	if *pubRate <= 0 {
		return "none"
	}
	return commas(int64(*pubRate)) + " msg/s"
}
