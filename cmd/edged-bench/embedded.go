package main

import (
	"fmt"
	"time"
)

// benchEmbedded measures durable QoS 1 ingestion through edged's embedded
// broker (a PUBACK only once the message is in the ingest log), with the
// same publishers against Mosquitto (in memory) as the baseline.
func benchEmbedded(dir string, mq *mosquitto) error {
	cs, err := parseInts(*embConns)
	if err != nil {
		return fmt.Errorf("-embedded-conns: %w", err)
	}
	n := *embN
	rate := int64(*eventRate)
	ts := func(i int) int64 { return epochMS + int64(i)*1000/rate }
	const win = int64(1000)
	for _, c := range cs {
		// Baseline: the same publishers to Mosquitto, which keeps
		// messages in memory and has no subscriber for them here.
		root := fmt.Sprintf("e/mosq-%d", c)
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
		root = fmt.Sprintf("e/emb-%d", c)
		spec := pipelineSpec{name: fmt.Sprintf("emb-%d", c), embedded: addr, topic: root + "/+",
			window: "1s", lateness: lateness.String(), sinkTopic: root + "-out/{id}", checkpoint: "exactly_once"}
		e, err := newEdged(dir, spec)
		if err != nil {
			return err
		}
		if err := e.start(); err != nil {
			return err
		}
		r, err := runEmbedded(e, addr, root, spec.name, c, n, ts, win)
		e.stop()
		if err != nil {
			return fmt.Errorf("%d connections: %w", c, err)
		}
		name := fmt.Sprintf("%d QoS 1 connections", c)
		target := map[int]float64{4: 30_000, 16: 60_000}[c]
		var met *bool
		targetS := ""
		if target > 0 {
			met = ptr(r.rate() >= target)
			targetS = "≥ " + commas(int64(target)) + " msg/s"
		}
		addFigure(figure{Scenario: "embedded", Figure: "messages/s", Subject: name, Value: r.rate(), Unit: "msg/s",
			Baseline: &baseRate, BaselineOf: "same publishers to Mosquitto (in memory)", Target: targetS, Met: met,
			What: fmt.Sprintf("%s readings, %d in flight per connection; first publish to last PUBACK (a PUBACK once in the ingest log)", commas(int64(n)), *embInflight)})
		addFigure(figure{Scenario: "embedded", Figure: "CPU per message", Subject: name, Value: r.cpuPerMsg(), Unit: "µs/msg",
			What: fmt.Sprintf("edged's CPU %s (broker, ingest log, pipeline, results) over %s messages", round(r.cpu), commas(r.read))})
		addFigure(figure{Scenario: "embedded", Figure: "peak RSS", Subject: name, Value: float64(r.peakKB) / 1024, Unit: "MB",
			Baseline: ptr(float64(r.idleKB) / 1024), BaselineOf: "same process idle", Target: "≤ 80 MB", Met: ptr(float64(r.peakKB)/1024 <= 80),
			What: "while publishing and until all results are in"})
		addFigure(figure{Scenario: "embedded", Figure: "loss", Subject: name, Value: float64(int64(n) - r.counted), Unit: "readings",
			Target: "0", Met: ptr(int64(n) == r.counted),
			What: fmt.Sprintf("published minus counted in the window results (%d result messages for a window already seen)", r.dups)})
	}
	note("embedded", "Pipeline as in the external scenario, exactly-once (checkpoints every 1 s, write-ahead MQTT sink to the embedded broker), durable ingestion: the broker sends the PUBACK once the message is in the ingest log. Messages/s: first publish until the last PUBACK, over all connections.")
	return nil
}

func runEmbedded(e *edged, addr, root, name string, c, n int, ts func(int) int64, win int64) (subjectRun, error) {
	r := subjectRun{subject: name}
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
	base, err := e.ingested()
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
	deadline := time.Now().Add(*timeout)
	logf("embedded: publishing %d readings on %d connections", n, c)
	logAt := e.logSize()
	start := time.Now()
	if err := l.run(*embInflight, 0, deadline); err != nil {
		return r, fmt.Errorf("%w\n%s", err, e.logTail())
	}
	r.pubDur = time.Since(start)
	r.readDur = r.pubDur
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
	logf("embedded: %d connections: %d PUBACKed in %v; counted %d", c, n, r.pubDur, r.counted)
	return r, nil
}
