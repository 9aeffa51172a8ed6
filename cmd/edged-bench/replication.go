package main

import (
	"flag"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
)

var (
	replKeys   = flag.Int("replication-keys", 100_000, "replication: distinct sensors (keys of window state over the cluster)")
	replChecks = flag.Int("replication-checkpoints", 8, "replication: completed checkpoints measured per run, once the state holds every key")
	replRounds = flag.Int("replication-rounds", 2, "replication: runs of each cluster (cluster.replicas 1 and 2, alternating)")
)

// replicationRun is what runReplication measured of one cluster.
type replicationRun struct {
	durations []float64 // ms, of the completed checkpoints measured
	size      int64     // bytes of the latest of them
	cpu       time.Duration
}

// benchReplication measures the checkpoint duration of a running
// three-node cluster (gossip, the exactly-once pipeline at parallelism 3)
// holding replicationKeys keys of window state, with cluster.replicas 1
// and 2 (each node's state files copied to one peer or to both before its
// acknowledgement counts), alternating in the same run, and one edged
// holding the same state (no cluster, nothing copied) as a reference.
func benchReplication(dir string) error {
	runs := map[string][]replicationRun{}
	var order []string
	add := func(label string, r replicationRun) {
		if _, ok := runs[label]; !ok {
			order = append(order, label)
		}
		runs[label] = append(runs[label], r)
	}
	single, err := runReplication(dir, "rp-single", []string{""}, 0)
	if err != nil {
		return fmt.Errorf("single node: %w", err)
	}
	add("one edged", single)
	for round := range *replRounds {
		rs := []int{1, 2}
		if round%2 == 1 {
			rs = []int{2, 1}
		}
		for _, r := range rs {
			run, err := runReplication(dir, fmt.Sprintf("rp-r%d-%d", r, round), clusterNodes, r)
			if err != nil {
				return fmt.Errorf("three nodes, replicas %d: %w", r, err)
			}
			add(fmt.Sprintf("replicas %d", r), run)
		}
	}
	median := func(rs []replicationRun) (float64, int64, int) {
		var all []float64
		var size int64
		for _, r := range rs {
			all = append(all, r.durations...)
			size = max(size, r.size)
		}
		slices.Sort(all)
		if len(all) == 0 {
			return 0, size, 0
		}
		return all[len(all)/2], size, len(all)
	}
	one, _, _ := median(runs["replicas 1"])
	cpuPer := func(rs []replicationRun) float64 {
		var cpu time.Duration
		n := 0
		for _, r := range rs {
			cpu, n = cpu+r.cpu, n+len(r.durations)
		}
		if n == 0 {
			return 0
		}
		return float64(cpu.Milliseconds()) / float64(n)
	}
	for _, label := range order {
		m, size, n := median(runs[label])
		f := figure{Scenario: "replication", Figure: "checkpoint duration", Subject: label, Value: m, Unit: "ms",
			What: fmt.Sprintf("median of %d completed checkpoints (every 1 s) of the master's GET /jobs/sensors/checkpoints once the state holds %s keys (%s bytes of state per checkpoint), no traffic",
				n, commas(int64(*replKeys)), commas(size))}
		g := figure{Scenario: "replication", Figure: "CPU per checkpoint", Subject: label, Value: cpuPer(runs[label]), Unit: "ms",
			What: "utime+stime of every node while the checkpoints were measured, over their number (no traffic: the checkpoints and each node's idle work, gossip and timers, are all the nodes do)"}
		if label == "replicas 2" {
			f.Baseline, f.BaselineOf = ptr(one), "replicas 1, same run"
			g.Baseline, g.BaselineOf = ptr(cpuPer(runs["replicas 1"])), "replicas 1, same run"
		}
		addFigure(f)
		addFigure(g)
	}
	var lines []string
	for _, label := range order {
		for i, r := range runs[label] {
			var ds []string
			for _, d := range r.durations {
				ds = append(ds, fmt.Sprintf("%.0f", d))
			}
			lines = append(lines, fmt.Sprintf("%s run %d: %s ms", label, i+1, strings.Join(ds, ", ")))
		}
	}
	note("replication", "Checkpoint durations by run: %s.", strings.Join(lines, "; "))
	note("replication", "Every node runs the exactly-once pipeline (a 1 h tumbling count+avg per sensor, keyed by sensor, parallelism 3, checkpoints every 1 s, default state backend) with gossip membership; reading i of one per sensor goes to node i mod 3 and every reading falls in the first window, so the window state holds every key and no window fires. A checkpoint's duration is from its trigger on the job master until every task's acknowledgement: with cluster.replicas R a node acknowledges only once each state file it wrote is on R peers (checksummed, written, fsynced). \"one edged\" holds the same state in one process: no barrier crosses a node and nothing is copied.")
	return nil
}

// runReplication starts the cluster of ids (ids {""}: one edged) with
// cluster.replicas replicas, gives it one reading of each of
// replicationKeys sensors, waits until the checkpoint size settles and
// returns the durations of the next replicationCheckpoints completed
// checkpoints.
func runReplication(dir, name string, ids []string, replicas int) (replicationRun, error) {
	var r replicationRun
	const hour = int64(3_600_000)
	c, err := startClusterNodes(dir, name, ids, clusterNodeSpec{window: "1h", lateness: "1s", replicas: replicas})
	if err != nil {
		return r, err
	}
	defer c.stop()
	master := c.nodes[0]
	keys, k := *replKeys, len(c.nodes)
	// One reading per sensor, 1 ms apart, all in the first hour window.
	msg := reading(c.root, "r", keys, 6, func(i int) int64 { return epochMS + int64(i)%hour })
	deadline := time.Now().Add(*timeout)
	logf("replication: %s: %d node(s), replicas %d; %d readings, reading i to node i mod %d", name, k, replicas, keys, k)
	errs := make([]error, k)
	var wg sync.WaitGroup
	for i := range c.nodes {
		wg.Go(func() {
			share := (keys - i + k - 1) / k
			ld, err := newLoad(c.addrs[i].broker, fmt.Sprintf("bench-%s-%d", name, i),
				encodeReadings(share, 2, 1, func(j int) (string, []byte) { return msg(j*k + i) }), 1)
			if err != nil {
				errs[i] = err
				return
			}
			defer ld.close()
			errs[i] = ld.run(*embInflight, 0, deadline)
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			return r, fmt.Errorf("publishing to node %d: %w\n%s", i, err, c.nodes[i].logTail())
		}
	}
	pubEnd := time.Now()
	// The state holds every key once two consecutive completed
	// checkpoints triggered after the last PUBACK have the same size;
	// the ones after those are measured.
	var settled uint64
	cpu0 := make([]time.Duration, k)
	for {
		cps, err := master.checkpoints()
		if err == nil {
			var after []checkpointInfo
			for _, cp := range cps {
				if cp.Status == "completed" && cp.Kind == "checkpoint" && cp.TriggerTime.After(pubEnd) {
					after = append(after, cp)
				}
			}
			if settled == 0 {
				if n := len(after); n >= 2 && after[n-1].SizeBytes == after[n-2].SizeBytes && after[n-1].SizeBytes > 0 {
					settled = after[n-1].ID
					for i, e := range c.nodes {
						if cpu0[i], err = cpuTime(e.pid()); err != nil {
							return r, err
						}
					}
				}
			} else {
				r.durations = r.durations[:0]
				for _, cp := range after {
					if cp.ID > settled {
						r.durations = append(r.durations, cp.DurationMS)
						r.size = cp.SizeBytes
					}
				}
				if len(r.durations) >= *replChecks {
					r.durations = r.durations[:*replChecks]
					break
				}
			}
		}
		for _, e := range c.nodes {
			if !e.alive() {
				return r, fmt.Errorf("edged exited: %v\n%s", e.waitErr, e.logTail())
			}
		}
		if time.Now().After(deadline) {
			return r, fmt.Errorf("%d checkpoints measured by the deadline (%v)\n%s", len(r.durations), err, master.logTail())
		}
		time.Sleep(50 * time.Millisecond)
	}
	for i, e := range c.nodes {
		cpu1, err := cpuTime(e.pid())
		if err != nil {
			return r, err
		}
		r.cpu += cpu1 - cpu0[i]
	}
	logf("replication: %s: checkpoints %v ms, %d bytes", name, r.durations, r.size)
	return r, nil
}
