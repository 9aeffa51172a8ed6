package stream_test

import (
	"context"
	"github.com/edgedio/edged/cluster"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/edgedio/edged/actors"
	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/snapshot"
	"github.com/edgedio/edged/stream"
)

// cpuTime returns the process's user and system CPU time.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// placeByChain puts every subtask of the plan's chains on the node that
// node(chain index) names.
func placeByChain(b *testing.B, c *testCluster, env *stream.Environment, node func(chain int) int) {
	plan, err := env.Plan()
	if err != nil {
		b.Fatal(err)
	}
	c.Placement = make(map[actors.TaskKey]string)
	for i, ch := range plan.Chains {
		for sub := range ch.Head().Parallelism {
			c.Placement[actors.TaskKey{UID: ch.Head().UID, Subtask: sub}] = c.Nodes[node(i)].ID
		}
	}
}

// BenchmarkRemoteKeyByEdge moves records through one key-by edge at
// parallelism 2: in one process (plain, and serialized as
// WithSerializedKeyBy does, the same codec work a remote edge does), and
// with the senders on one node and the
// receivers on another over protoactor remote on loopback, in the same
// run. remote/local is the throughput ratio; cpu-ns/record is the
// process's CPU time per record; wire-bytes/record is the frame bytes
// sent between the nodes per record, and tcp-bytes/record what the nodes
// wrote on their connections (frames, acknowledgements and control
// messages with protoactor's and gRPC's framing: everything above TCP);
// records/batch is the mean batch crossing. EDGED_BENCH_TRANSPORT=memory
// runs the two nodes over the in-memory transport instead.
func BenchmarkRemoteKeyByEdge(b *testing.B) {
	c := remoteCluster(b, 2)
	if os.Getenv("EDGED_BENCH_TRANSPORT") == "memory" {
		c = memoryCluster(b, 2, 1, cluster.Faults{})
	}
	job := func(opts ...stream.Option) *stream.Environment {
		env := stream.NewEnvironment("edge", append([]stream.Option{stream.WithParallelism(2)}, opts...)...)
		src := stream.FromSource(env, "generator", generator(benchRecords, 1000)).UID("generator")
		stream.KeyBy(src, bySensor).Stream().ForEach("discard", func(operators.SensorReading) error { return nil }).UID("discard")
		return env
	}
	var local, ser, remote, localCPU, serCPU, remoteCPU time.Duration
	before, tcpBefore := c.sent(), c.wire()
	for b.Loop() {
		env := job()
		start, cpu := time.Now(), cpuTime(b)
		runBench(b, env)
		local += time.Since(start)
		localCPU += cpuTime(b) - cpu

		env = job(stream.WithSerializedKeyBy(true))
		start, cpu = time.Now(), cpuTime(b)
		runBench(b, env)
		ser += time.Since(start)
		serCPU += cpuTime(b) - cpu

		env = job(stream.WithCluster(c.Cluster))
		placeByChain(b, c, env, func(chain int) int { return chain })
		start, cpu = time.Now(), cpuTime(b)
		runBench(b, env)
		remote += time.Since(start)
		remoteCPU += cpuTime(b) - cpu
	}
	n := float64(b.N) * benchRecords
	b.ReportMetric(n/local.Seconds(), "local-records/s")
	b.ReportMetric(n/remote.Seconds(), "remote-records/s")
	b.ReportMetric(local.Seconds()/remote.Seconds(), "remote/local")
	b.ReportMetric(ser.Seconds()/remote.Seconds(), "remote/local-serialized")
	b.ReportMetric(float64(localCPU.Nanoseconds())/n, "local-cpu-ns/record")
	b.ReportMetric(float64(serCPU.Nanoseconds())/n, "local-serialized-cpu-ns/record")
	b.ReportMetric(float64(remoteCPU.Nanoseconds())/n, "remote-cpu-ns/record")
	sent := c.sent()
	b.ReportMetric(float64(sent.Bytes-before.Bytes)/n, "wire-bytes/record")
	b.ReportMetric(n/float64(sent.Batches-before.Batches), "records/batch")
	if c.trs != nil {
		b.ReportMetric(float64(c.wire().Bytes-tcpBefore.Bytes)/n, "tcp-bytes/record")
	}
}

// wire adds up what the nodes' remote transports wrote to their peers.
func (c *testCluster) wire() cluster.WireStats {
	var w cluster.WireStats
	for _, tr := range c.trs {
		s := tr.WireStats()
		w.Bytes += s.Bytes
		w.Writes += s.Writes
	}
	return w
}

// BenchmarkRemoteCheckpointDuration runs a keyed rolling count+sum (1000
// sensors, parallelism 2, rate-limited source) with exactly-once
// checkpoints every 100 ms until 20 completed: in one process, and with the
// aggregates on another node than the sources (protoactor remote on
// loopback), in the same run; it reports the mean checkpoint duration of
// each and their ratio.
func BenchmarkRemoteCheckpointDuration(b *testing.B) {
	c := remoteCluster(b, 2)
	run := func(opts ...stream.Option) []snapshot.Stats {
		cfg := snapshot.DefaultConfig()
		cfg.Dir = b.TempDir()
		cfg.Interval = 100 * time.Millisecond
		env := stream.NewEnvironment("ckpt", append([]stream.Option{stream.WithParallelism(2), stream.WithCheckpointing(cfg)}, opts...)...)
		src := stream.FromSource(env, "generator", func() operators.Source[operators.SensorReading] {
			return operators.SensorGenerator(operators.GeneratorConfig{Count: 1 << 40, Keys: 1000, Rate: 200_000})
		}).UID("generator")
		stream.Aggregate(stream.KeyBy(src, bySensor), "count-sum", countSumAgg{}).UID("count-sum").
			ForEach("discard", func(countSum) error { return nil }).UID("discard")
		if len(opts) > 0 {
			placeByChain(b, c, env, func(chain int) int { return chain % 2 })
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		job, err := env.ExecuteAsync(ctx)
		if err != nil {
			b.Fatal(err)
		}
		var h []snapshot.Stats
		testutil.Eventually(b, time.Minute, "20 checkpoints to complete", func() bool {
			h = job.History()
			n := 0
			for _, s := range h {
				if s.Status == snapshot.Completed {
					n++
				}
			}
			return n >= 20
		})
		cancel()
		_ = job.Wait()
		return h
	}
	mean := func(h []snapshot.Stats) (time.Duration, int) {
		var sum time.Duration
		n := 0
		for _, s := range h {
			if s.Status == snapshot.Completed {
				sum += s.Duration
				n++
			}
		}
		if n == 0 {
			b.Fatal("no checkpoint completed")
		}
		return sum / time.Duration(n), n
	}
	var one, two time.Duration
	for b.Loop() {
		m1, _ := mean(run())
		m2, _ := mean(run(stream.WithCluster(c.Cluster)))
		one += m1
		two += m2
	}
	b.ReportMetric(float64(one.Microseconds())/float64(b.N)/1000, "one-node-ms/checkpoint")
	b.ReportMetric(float64(two.Microseconds())/float64(b.N)/1000, "two-node-ms/checkpoint")
	b.ReportMetric(two.Seconds()/one.Seconds(), "two/one")
}
