package main

import (
	"bytes"
	"fmt"
	"time"
)

// benchMemory measures edged's RSS idle, under a sustained load with many
// keys, and during a burst of large payloads, each in a fresh process
// (exactly-once pipeline reading the external Mosquitto).
func benchMemory(dir string, mq *mosquitto) error {
	if err := memorySustained(dir, mq); err != nil {
		return err
	}
	if err := memoryBig(dir, mq); err != nil {
		return err
	}
	note("memory", "Every figure is a fresh edged running the exactly-once pipeline (1 s tumbling count+avg per sensor, checkpoints every 1 s, write-ahead MQTT sink) against the external Mosquitto; idle is 3 s after the job runs, without traffic. The 1,000,000-message bursts are in the external scenario's peak RSS rows.")
	return nil
}

func startMemEdged(dir string, mq *mosquitto, name, root string) (*edged, *results, func(), error) {
	spec := pipelineSpec{name: name, broker: mq.url(), topic: root + "/+", window: "1s", lateness: lateness.String(),
		sinkTopic: root + "-out/{id}", checkpoint: "exactly_once"}
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

func memorySustained(dir string, mq *mosquitto) error {
	n, keys, rate := *loadN, *loadKeys, *loadRate
	root := "mem/load"
	e, res, stop, err := startMemEdged(dir, mq, "mem-load", root)
	if err != nil {
		return err
	}
	defer stop()
	time.Sleep(3 * time.Second)
	idle, err := rssKB(e.pid())
	if err != nil {
		return err
	}
	addFigure(figure{Scenario: "memory", Figure: "RSS idle", Value: float64(idle) / 1024, Unit: "MB", Target: "≤ 25 MB", Met: ptr(float64(idle)/1024 <= 25),
		What: "edged with the exactly-once pipeline reading Mosquitto, no traffic"})

	// Event time follows the publishing rate, as from real sensors.
	ts := func(i int) int64 { return epochMS + int64(float64(i)*1000/rate) }
	const win = int64(1000)
	l, err := newLoad(mq.addr, "bench-mem", encodeReadings(n, 4, 1, reading(root, "k", keys, 5, ts)), 1)
	if err != nil {
		return err
	}
	defer l.close()
	rss := sampleRSS(e.pid())
	defer rss.close()
	deadline := time.Now().Add(*timeout)
	logf("memory: %d readings of %d keys at %.0f/s", n, keys, rate)
	logAt := e.logSize()
	base, err := e.ingested()
	if err != nil {
		return err
	}
	start := time.Now()
	if err := l.run(*inflight, rate, deadline); err != nil {
		return fmt.Errorf("%w\n%s", err, e.logTail())
	}
	pubDur := time.Since(start)
	peakPub := rss.peakKB()
	if _, err := trackReads(e, base, int64(n), closed, *settle, deadline); err != nil {
		return err
	}
	lastEnd := windowEnd(ts(n-1), win)
	tailTS := lastEnd + lateness.Milliseconds() + win
	tail, err := newLoad(mq.addr, "bench-mem-tail", encodeReadings(keys, 1, 1, reading(root, "k", keys, 5, func(int) int64 { return tailTS })), 1)
	if err != nil {
		return err
	}
	defer tail.close()
	if err := tail.run(*inflight, 0, deadline); err != nil {
		return err
	}
	doneAt, err := waitSum(res, lastEnd, int64(n), e, resultSettle(), deadline)
	if err != nil {
		return err
	}
	counted := res.sumBefore(lastEnd)
	peakAll := rss.peakKB()
	e.heapNote("memory", "Sustained load", logAt)
	st := res.stats()
	readRate := float64(n) / doneAt.Sub(start).Seconds()
	addFigure(figure{Scenario: "memory", Figure: "peak RSS under sustained load", Value: float64(peakAll) / 1024, Unit: "MB",
		Baseline: ptr(float64(idle) / 1024), BaselineOf: "same process idle", Target: "≤ 80 MB", Met: ptr(float64(peakAll)/1024 <= 80),
		What: fmt.Sprintf("%s readings of %s sensors offered at %s/s (QoS 1, 4 connections) for %s, event time following; peak from the first publish until all %s results were in (%s, i.e. %s readings/s consumed); peak while publishing: %.1f MB; loss %d",
			commas(int64(n)), commas(int64(keys)), commas(int64(rate)), round(pubDur), commas(st.msgs), round(doneAt.Sub(start)), commas(int64(readRate)), float64(peakPub)/1024, int64(n)-counted)})
	return nil
}

func memoryBig(dir string, mq *mosquitto) error {
	n, size := *bigN, *bigSize
	root := "mem/big"
	e, res, stop, err := startMemEdged(dir, mq, "mem-big", root)
	if err != nil {
		return err
	}
	defer stop()
	time.Sleep(3 * time.Second)
	idle, err := rssKB(e.pid())
	if err != nil {
		return err
	}
	const keys = 10
	const win = int64(1000)
	ts := func(i int) int64 { return epochMS + int64(i)*10 }
	pad := bytes.Repeat([]byte("x"), size)
	msg := func(i int) (string, []byte) {
		s := fmt.Sprintf("b%02d", i%keys)
		p := fmt.Appendf(nil, `{"sensor":%q,"t":%d.5,"ts":%d,"pad":"`, s, 20+i%15, ts(i))
		p = append(p, pad[:max(0, size-len(p)-2)]...)
		return root + "/" + s, append(p, `"}`...)
	}
	l, err := newLoad(mq.addr, "bench-big", encodeReadings(n, 4, 1, msg), 1)
	if err != nil {
		return err
	}
	defer l.close()
	rss := sampleRSS(e.pid())
	defer rss.close()
	deadline := time.Now().Add(*timeout)
	logf("memory: %d messages of %d bytes", n, size)
	logAt := e.logSize()
	base, err := e.ingested()
	if err != nil {
		return err
	}
	start := time.Now()
	if err := l.run(16, 0, deadline); err != nil {
		return fmt.Errorf("%w\n%s", err, e.logTail())
	}
	pubDur := time.Since(start)
	if _, err := trackReads(e, base, int64(n), closed, *settle, deadline); err != nil {
		return err
	}
	lastEnd := windowEnd(ts(n-1), win)
	tailTS := lastEnd + lateness.Milliseconds() + win
	tail, err := newLoad(mq.addr, "bench-big-tail", encodeReadings(keys, 1, 1, func(i int) (string, []byte) {
		s := fmt.Sprintf("b%02d", i%keys)
		return root + "/" + s, fmt.Appendf(nil, `{"sensor":%q,"t":1,"ts":%d}`, s, tailTS)
	}), 1)
	if err != nil {
		return err
	}
	defer tail.close()
	if err := tail.run(16, 0, deadline); err != nil {
		return err
	}
	if _, err := waitSum(res, lastEnd, int64(n), e, resultSettle(), deadline); err != nil {
		return err
	}
	counted := res.sumBefore(lastEnd)
	peak := rss.peakKB()
	e.heapNote("memory", "Large payloads", logAt)
	addFigure(figure{Scenario: "memory", Figure: "peak RSS, large payloads", Value: float64(peak) / 1024, Unit: "MB",
		Baseline: ptr(float64(idle) / 1024), BaselineOf: "same process idle", Target: "≤ 80 MB, not a multiple of the payload", Met: ptr(float64(peak)/1024 <= 80),
		What: fmt.Sprintf("burst of %d messages of %s (QoS 1, 4 connections, 16 in flight each, published in %s); loss %d", n, fmtBytes(size), round(pubDur), int64(n)-counted)})
	return nil
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
