package main

import (
	"flag"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

var (
	clusterN     = flag.Int("cluster-n", 180_000, "cluster: readings of the sustained load, over all nodes (a share to each node's embedded broker)")
	clusterRate  = flag.Float64("cluster-rate", 6_000, "cluster: readings per second of the sustained load over all nodes (event time follows)")
	clusterKeys  = flag.Int("cluster-keys", 1_000, "cluster: distinct sensors, keyed across the nodes")
	clusterConns = flag.Int("cluster-conns", 4, "cluster: QoS 1 publishing connections per node")
)

// clusterNodes are the node ids of the cluster scenario; "a", the lowest,
// runs the job master.
var clusterNodes = []string{"a", "b", "c"}

// benchCluster measures the RSS of each node of a three-node cluster on
// 127.0.0.1 (gossip, the exactly-once pipeline at parallelism 3, each
// node's devices publishing to its own embedded broker), idle and under a
// sustained load, against one edged running the same pipeline with the
// whole load, in the same run.
func benchCluster(dir string) error {
	base, err := runClusterLoad(dir, "cl-single", []string{""})
	if err != nil {
		return fmt.Errorf("single node: %w", err)
	}
	r, err := runClusterLoad(dir, "cl-three", clusterNodes)
	if err != nil {
		return fmt.Errorf("three nodes: %w", err)
	}
	mb := func(kb int64) float64 { return float64(kb) / 1024 }
	b := base.nodes[0]
	for i, id := range clusterNodes {
		n := r.nodes[i]
		role := "worker"
		if i == 0 {
			role = "job master"
		}
		subj := fmt.Sprintf("node %s (%s)", id, role)
		addFigure(figure{Scenario: "cluster", Figure: "RSS idle", Subject: subj, Value: mb(n.idle), Unit: "MB",
			Baseline: ptr(mb(b.idle)), BaselineOf: "one edged, same pipeline",
			What: fmt.Sprintf("no traffic: peak over the first %s after every node hosts its tasks (checkpoints every 1 s go on)", idleFor)})
		addFigure(figure{Scenario: "cluster", Figure: "peak RSS under sustained load", Subject: subj, Value: mb(n.peak), Unit: "MB",
			Baseline: ptr(mb(b.peak)), BaselineOf: "one edged with the whole load", Target: "≤ 80 MB", Met: ptr(mb(n.peak) <= 80),
			What: fmt.Sprintf("a third of %s readings (%s sensors) offered at %s/s over the cluster, QoS 1, %d connections per node; from the first publish until every result was in (%s)",
				commas(int64(*clusterN)), commas(int64(*clusterKeys)), commas(int64(*clusterRate)), *clusterConns, round(r.consumed))})
	}
	var cpu time.Duration
	for _, n := range r.nodes {
		cpu += n.cpu
	}
	perReading := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(*clusterN) }
	addFigure(figure{Scenario: "cluster", Figure: "CPU per reading", Subject: "the three nodes together", Value: perReading(cpu), Unit: "µs/msg",
		Baseline: ptr(perReading(b.cpu)), BaselineOf: "one edged",
		What: fmt.Sprintf("utime+stime of the three processes (%s) from the first publish until every result was in, over the readings; the cluster's share of the keyed records crosses nodes", round(cpu))})
	for _, x := range []struct {
		name string
		run  clusterRun
	}{{"three nodes", r}, {"one edged", base}} {
		addFigure(figure{Scenario: "cluster", Figure: "loss", Subject: x.name, Value: float64(x.run.loss), Unit: "readings", Target: "0", Met: ptr(x.run.loss == 0),
			What: fmt.Sprintf("published minus counted in the window results (%d result messages for a window already seen, %d under a msg_id already seen)", x.run.dups, x.run.dupIDs)})
	}
	note("cluster", "Every node runs the exactly-once pipeline (1 s tumbling count+avg per sensor, keyed by sensor, parallelism 3, checkpoints every 1 s, write-ahead MQTT sink to the node's embedded broker) with gossip membership (device profile); reading i goes to node i mod 3, so each node ingests its own devices' readings and the keyed records cross nodes to the window subtask owning their key group. The baseline, in the same run, is one edged with the same pipeline (parallelism 3, no cluster block) taking the whole load on its embedded broker. All processes share the machine's CPUs.")
	return nil
}

// clusterNodeRun is what runClusterLoad measured of one process.
type clusterNodeRun struct {
	idle, peak int64 // kB
	cpu        time.Duration
}

// clusterRun is what runClusterLoad measured.
type clusterRun struct {
	nodes              []clusterNodeRun
	consumed           time.Duration
	loss, dups, dupIDs int64
}

// runClusterLoad starts one edged per id (ids {""}: a single edged
// without a cluster block), samples their RSS idle, offers the sustained
// load (reading i to node i mod len(ids)) and samples their RSS until
// every result is in.
func runClusterLoad(dir, name string, ids []string) (clusterRun, error) {
	var r clusterRun
	c, err := startClusterNodes(dir, name, ids, clusterNodeSpec{window: "1s", lateness: lateness.String()})
	if err != nil {
		return r, err
	}
	defer c.stop()
	as, nodes, root := c.addrs, c.nodes, c.root
	res := newResults()
	for i, a := range as {
		sub, err := subscribeResults("tcp://"+a.broker, fmt.Sprintf("bench-res-%s-%d", name, i), root+"-out/+", res)
		if err != nil {
			return r, err
		}
		defer sub.Disconnect(100)
	}
	logf("cluster: %s: %d node(s) run the job; idle for %s", name, len(nodes), idleFor)
	samplers := make([]*rssSampler, len(nodes))
	for i, e := range nodes {
		samplers[i] = sampleRSS(e.pid())
	}
	time.Sleep(idleFor)
	r.nodes = make([]clusterNodeRun, len(nodes))
	for i, s := range samplers {
		r.nodes[i].idle = s.peakKB()
		s.reset()
	}
	defer func() {
		for _, s := range samplers {
			s.close()
		}
	}()

	n, k := *clusterN, len(nodes)
	rate := *clusterRate
	ts := func(i int) int64 { return epochMS + int64(float64(i)*1000/rate) }
	msg := reading(root, "s", *clusterKeys, 4, ts)
	const win = int64(1000)
	lastEnd := windowEnd(ts(n-1), win)
	tailTS := lastEnd + lateness.Milliseconds() + win
	cpu0 := make([]time.Duration, k)
	for i, e := range nodes {
		var err error
		if cpu0[i], err = cpuTime(e.pid()); err != nil {
			return r, err
		}
	}
	deadline := time.Now().Add(*timeout)
	logf("cluster: %s: %d readings of %d sensors at %.0f/s, reading i to node i mod %d", name, n, *clusterKeys, rate, k)
	start := time.Now()
	errs := make([]error, k)
	var wg sync.WaitGroup
	for i := range nodes {
		wg.Go(func() {
			// Node i's share: readings i, i+k, i+2k, ..., then a tail that
			// moves its split's watermark past the last window.
			share := (n - i + k - 1) / k
			ld, err := newLoad(as[i].broker, fmt.Sprintf("bench-%s-%d", name, i),
				encodeReadings(share, *clusterConns, 1, func(j int) (string, []byte) { return msg(j*k + i) }), 1)
			if err != nil {
				errs[i] = err
				return
			}
			defer ld.close()
			if errs[i] = ld.run(*embInflight, rate/float64(k), deadline); errs[i] != nil {
				return
			}
			tail, err := newLoad(as[i].broker, fmt.Sprintf("bench-%s-%d-tail", name, i),
				encodeReadings(*clusterKeys, 1, 1, reading(root, "s", *clusterKeys, 4, func(int) int64 { return tailTS })), 1)
			if err != nil {
				errs[i] = err
				return
			}
			defer tail.close()
			errs[i] = tail.run(*embInflight, 0, deadline)
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			return r, fmt.Errorf("publishing to node %d: %w\n%s", i, err, nodes[i].logTail())
		}
	}
	doneAt, err := waitSum(res, lastEnd, int64(n), nodes[0], resultSettle(), deadline)
	if err != nil {
		return r, err
	}
	r.consumed = doneAt.Sub(start)
	for i, e := range nodes {
		cpu1, err := cpuTime(e.pid())
		if err != nil {
			return r, err
		}
		r.nodes[i].cpu = cpu1 - cpu0[i]
		r.nodes[i].peak = samplers[i].peakKB()
	}
	st := res.stats()
	r.loss, r.dups, r.dupIDs = int64(n)-res.sumBefore(lastEnd), st.dups, st.dupIDs
	logf("cluster: %s: results in %v, loss %d", name, r.consumed, r.loss)
	return r, nil
}

// waitHosting polls a worker's GET /cluster/worker until it hosts the
// tasks of a deployment.
func waitHosting(e *edged, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		if !e.alive() {
			return fmt.Errorf("edged exited while starting: %v\n%s", e.waitErr, e.logTail())
		}
		var w struct {
			Jobs []struct {
				Tasks []struct{} `json:"tasks"`
			} `json:"jobs"`
		}
		if getJSON(e.client, "http://"+e.api+"/cluster/worker", &w) == nil && len(w.Jobs) == 1 && len(w.Jobs[0].Tasks) > 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("worker hosts no tasks after %v\n%s", limit, e.logTail())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// clusterAddrs are the listen addresses of one node of a bench cluster.
type clusterAddrs struct{ api, broker, transport, gossip string }

// clusterNodeSpec is what differs between the bench clusters' pipelines
// and cluster blocks.
type clusterNodeSpec struct {
	window, lateness string
	// replicas, when set, is cluster.replicas.
	replicas int
}

// benchClusterNodes are the edged processes of a bench cluster, node 0
// the job master's (or the single edged).
type benchClusterNodes struct {
	addrs []clusterAddrs
	nodes []*edged
	root  string // the topic root: readings to root/<sensor>
}

func (c *benchClusterNodes) stop() {
	for _, e := range c.nodes {
		e.stop()
	}
}

// startClusterNodes starts one edged per id (ids {""}: a single edged
// without a cluster block) running the exactly-once pipeline at
// parallelism 3 on its embedded broker, and waits until the job runs and
// every worker hosts its tasks. On error, the nodes started are stopped.
func startClusterNodes(dir, name string, ids []string, ns clusterNodeSpec) (c *benchClusterNodes, err error) {
	c = &benchClusterNodes{addrs: make([]clusterAddrs, len(ids)), root: "cl/" + name}
	defer func() {
		if err != nil {
			c.stop()
		}
	}()
	// freeAddr closes the port it found: two calls may return the same
	// one, so every address is checked against the others.
	used := map[string]bool{}
	for i := range c.addrs {
		for _, p := range []*string{&c.addrs[i].api, &c.addrs[i].broker, &c.addrs[i].transport, &c.addrs[i].gossip} {
			for *p == "" || used[*p] {
				if *p, err = freeAddr(); err != nil {
					return c, err
				}
			}
			used[*p] = true
		}
	}
	as := c.addrs
	for i, id := range ids {
		spec := pipelineSpec{name: "sensors", embedded: as[i].broker, topic: c.root + "/+", window: ns.window, lateness: ns.lateness,
			sinkTopic: c.root + "-out/{id}", checkpoint: "exactly_once", parallelism: 3}
		sub := name
		if id != "" {
			sub = name + "-" + id
			var b strings.Builder
			fmt.Fprintf(&b, "cluster:\n  node: %s\n  listen: %s\n  gossip: %s\n", id, as[i].transport, as[i].gossip)
			if ns.replicas > 0 {
				fmt.Fprintf(&b, "  replicas: %d\n", ns.replicas)
			}
			b.WriteString("  peers:\n")
			for j, peer := range ids {
				if j != i {
					fmt.Fprintf(&b, "    - {id: %s, address: %q, api: %q, gossip: %q}\n", peer, as[j].transport, as[j].api, as[j].gossip)
				}
			}
			spec.cluster = b.String()
		}
		spec.api = as[i].api
		e, err := newEdged(filepath.Join(dir, sub), spec)
		if err != nil {
			return c, err
		}
		c.nodes = append(c.nodes, e)
	}
	// The workers first, so that the master's first deployment finds them.
	for i := len(c.nodes) - 1; i >= 0; i-- {
		if err := c.nodes[i].start(); err != nil {
			return c, err
		}
	}
	if _, err := c.nodes[0].waitRunning(*timeout); err != nil {
		return c, err
	}
	for _, e := range c.nodes[1:] {
		if err := waitHosting(e, *timeout); err != nil {
			return c, err
		}
	}
	return c, nil
}
