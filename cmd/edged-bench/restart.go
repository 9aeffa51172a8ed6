package main

import (
	"fmt"
	"time"
)

// benchRestart kills edged with SIGKILL holding restartKeys keys of
// window state and measures, from exec of the new process, when the job
// runs, when the first result arrives and when all have.
func benchRestart(dir string, mq *mosquitto) error {
	keys := *restartKeys
	const hour = int64(3_600_000)
	root := "rst"
	// One reading per sensor, 1 ms apart, all in the first hour window.
	ts := func(i int) int64 { return epochMS + int64(i)%hour }
	msg := reading(root, "r", keys, 6, ts)
	spec := pipelineSpec{name: "restart", broker: mq.url(), topic: root + "/+", window: "1h", lateness: "1s",
		sinkTopic: root + "-out/{id}", checkpoint: "exactly_once"}
	sinkHow := "one message per result, a topic per sensor"
	if *restartBatch > 1 {
		// Batching pays off with a topic the keys share.
		spec.sinkTopic, spec.batch = root+"-out/all", *restartBatch
		sinkHow = fmt.Sprintf("results in JSON arrays of up to %d on one topic (batch: %d)", *restartBatch, *restartBatch)
	}
	e, err := newEdged(dir, spec)
	if err != nil {
		return err
	}
	if err := e.start(); err != nil {
		return err
	}
	defer e.stop()
	if _, err := e.waitRunning(*timeout); err != nil {
		return err
	}
	l, err := newLoad(mq.addr, "bench-rst", encodeReadings(keys, 4, 1, msg), 1)
	if err != nil {
		return err
	}
	defer l.close()
	deadline := time.Now().Add(*timeout)
	start := time.Now()
	if err := l.run(*inflight, 0, deadline); err != nil {
		return err
	}
	pubEnd := time.Now()
	logf("restart: published %d readings in %v; waiting for the checkpoint size to settle", keys, pubEnd.Sub(start))

	// Two consecutive completed checkpoints triggered after the last
	// PUBACK with the same size: the state then holds every key.
	var chk checkpointInfo
	for {
		cps, err := e.checkpoints()
		if err == nil {
			var after []checkpointInfo
			for _, c := range cps {
				if c.Status == "completed" && c.TriggerTime.After(pubEnd) {
					after = append(after, c)
				}
			}
			if k := len(after); k >= 2 && after[k-1].SizeBytes == after[k-2].SizeBytes && after[k-1].SizeBytes > 0 {
				chk = after[k-1]
				break
			}
		}
		if !e.alive() {
			return fmt.Errorf("edged exited: %v\n%s", e.waitErr, e.logTail())
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no settled checkpoint by the deadline (%v)\n%s", err, e.logTail())
		}
		time.Sleep(50 * time.Millisecond)
	}
	rssBefore, _ := rssKB(e.pid())
	note("restart", "Checkpoint %d before the kill: %s bytes, %.1f ms, alignment %.2f ms; VmRSS before the kill %.1f MB.",
		chk.ID, commas(chk.SizeBytes), chk.DurationMS, chk.AlignmentMS, float64(rssBefore)/1024)

	res := newResults()
	sub, err := subscribeResults(mq.url(), "bench-res-restart", root+"-out/+", res)
	if err != nil {
		return err
	}
	defer sub.Disconnect(100)
	if err := e.kill(); err != nil {
		return err
	}
	logf("restart: SIGKILLed edged, restarting")
	if err := e.start(); err != nil {
		return err
	}
	restart := e.started
	running, err := e.waitRunning(*timeout)
	if err != nil {
		return err
	}
	// A reading in the next hour moves the watermark past the window of
	// the restored keys: it fires, and its results show the restored state.
	next, err := newLoad(mq.addr, "bench-rst-next", encodeReadings(1, 1, 1, reading(root, "r", keys, 6, func(int) int64 { return epochMS + hour + 2000 })), 1)
	if err != nil {
		return err
	}
	defer next.close()
	if err := next.run(1, 0, deadline); err != nil {
		return fmt.Errorf("publish after restart: %w", err)
	}
	acked := time.Since(restart)
	var firstChk, firstRes, allRes time.Duration
	// edged's CPU time (user and system) since exec at the first and at
	// the last result: steadier than wall time on a loaded machine.
	var cpuFirst, cpuAll time.Duration
	deadline = time.Now().Add(*timeout)
	for allRes == 0 {
		if firstChk == 0 {
			if cps, err := e.checkpoints(); err == nil {
				for _, c := range cps {
					if c.Status == "completed" && c.Kind == "checkpoint" && c.TriggerTime.After(restart) {
						firstChk = time.Since(restart)
						break
					}
				}
			}
		}
		st := res.stats()
		if st.msgs > 0 && firstRes == 0 {
			firstRes = st.first.Sub(restart)
			cpuFirst, _ = cpuTime(e.pid())
		}
		if res.sumBefore(epochMS+hour) >= int64(keys) {
			allRes = res.stats().last.Sub(restart)
			cpuAll, _ = cpuTime(e.pid())
		}
		if !e.alive() {
			return fmt.Errorf("edged exited: %v\n%s", e.waitErr, e.logTail())
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("after restart: %d results summing to %d of %d by the deadline\n%s", st.msgs, res.sumBefore(epochMS+hour), keys, e.logTail())
		}
		time.Sleep(2 * time.Millisecond)
	}
	if cps, err := e.checkpoints(); err == nil {
		for _, c := range cps {
			if c.TriggerTime.After(restart) && c.TriggerTime.Before(restart.Add(allRes)) {
				note("restart", "Checkpoint %d after the restart (%s): triggered %s after exec, took %.1f ms (alignment %.1f ms), %s bytes.",
					c.ID, c.Status, round(c.TriggerTime.Sub(restart)), c.DurationMS, c.AlignmentMS, commas(c.SizeBytes))
			}
		}
	}
	// The floor of the publishing phase: the same number of results, of
	// the same size and shape, on the same number of topics, published
	// at QoS 1 with edged's sink window (1024 in flight) by a raw
	// pre-encoded publisher through the same Mosquitto to the same kind
	// of consumer. edged cannot deliver them faster than this.
	floor, err := resultFloor(mq, keys, deadline)
	if err != nil {
		return fmt.Errorf("result floor: %w", err)
	}
	what := fmt.Sprintf("%s keys in a 1 h tumbling window, checkpoint of %.1f MB; SIGKILL, restart; from exec of the new process; %s", commas(int64(keys)), float64(chk.SizeBytes)/1e6, sinkHow)
	note("restart", "Result messages received after the restart: %s, holding %s results (%s repeated msg_ids).",
		commas(res.stats().msgs), commas(res.stats().elems), commas(res.stats().dupIDs))
	addFigure(figure{Scenario: "restart", Figure: "job running", Value: running.Seconds(), Unit: "s", Target: "well under 1 s", What: what})
	addFigure(figure{Scenario: "restart", Figure: "first result", Value: firstRes.Seconds(), Unit: "s",
		What: "of the window closed by a reading published after the restart (PUBACKed " + round(acked) + " after exec)"})
	addFigure(figure{Scenario: "restart", Figure: "all results", Value: allRes.Seconds(), Unit: "s", Target: "≤ 2 s", Met: ptr(allRes <= 2*time.Second),
		What: fmt.Sprintf("all %s window results received", commas(int64(keys)))})
	addFigure(figure{Scenario: "restart", Figure: "publishing phase", Value: (allRes - firstRes).Seconds(), Unit: "s",
		Baseline: ptr(floor.Seconds()), BaselineOf: "raw publisher, same results through the same broker to the same consumer",
		What: fmt.Sprintf("first to last of the %s results; baseline: %s results of the same size published at QoS 1, 1024 in flight, by a raw pre-encoded publisher, first publish to last received", commas(int64(keys)), commas(int64(keys)))})
	addFigure(figure{Scenario: "restart", Figure: "edged CPU until the first result", Value: cpuFirst.Seconds(), Unit: "s",
		What: "user+system CPU time of the new process from exec until the first result arrived (read within ~2 ms of it)"})
	addFigure(figure{Scenario: "restart", Figure: "edged CPU until all results", Value: cpuAll.Seconds(), Unit: "s",
		What: "user+system CPU time of the new process from exec until the last result arrived"})
	if firstChk > 0 {
		note("restart", "First checkpoint completed after the restart: %s after exec.", round(firstChk))
	}
	return nil
}

// resultFloor publishes n results shaped like edged's window results
// (JSON with a msg_id, one topic per sensor) at QoS 1 with 1024 in flight
// from a raw pre-encoded publisher to a paho QoS 1 subscriber like the
// bench's, through mq, and returns the time from the first publish to the
// last result received.
func resultFloor(mq *mosquitto, n int, deadline time.Time) (time.Duration, error) {
	const root = "rst-floor"
	res := newResults()
	sub, err := subscribeResults(mq.url(), "bench-res-floor", root+"/+", res)
	if err != nil {
		return 0, err
	}
	defer sub.Disconnect(100)
	msg := func(i int) (string, []byte) {
		id := fmt.Sprintf("r%06d", i)
		return root + "/" + id, fmt.Appendf(nil, `{"id":%q,"window_start":%d,"window_end":%d,"count":1,"avg":%d.5,"msg_id":"%016x"}`,
			id, epochMS, epochMS+3_600_000, 20+i%15, uint64(i)*0x9e3779b97f4a7c15)
	}
	l, err := newLoad(mq.addr, "bench-rst-floor", encodeReadings(n, 1, 1, msg), 1)
	if err != nil {
		return 0, err
	}
	defer l.close()
	start := time.Now()
	if err := l.run(1024, 0, deadline); err != nil {
		return 0, err
	}
	for res.sumBefore(epochMS+1) < int64(n) {
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("%d of %d results by the deadline", res.sumBefore(epochMS+1), n)
		}
		time.Sleep(2 * time.Millisecond)
	}
	return res.stats().last.Sub(start), nil
}
