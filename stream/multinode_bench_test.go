package stream_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"strings"
	"syscall"
	"testing"
	"time"

	cmap "github.com/orcaman/concurrent-map"

	"github.com/edgedio/edged/actors"
	"github.com/edgedio/edged/cluster"
	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/snapshot"
	"github.com/edgedio/edged/stream"
)

func init() {
	// As the edged binary does (cmd/edged shrinkActorRegistry): one shard
	// per map of protoactor's process registry, set before any actor
	// system exists. With the library's default of 32, every actor system
	// (one per node's transport, one per task host of every job run)
	// allocates 32,768 maps, which the benchmarks would count against
	// each run and every collection would scan.
	cmap.SHARD_COUNT = 1
}

// cpuTime returns the process's user and system CPU time.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// allocated returns the bytes the process allocated so far.
func allocated() uint64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.TotalAlloc
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

// keyByEdgeJob is the job of the key-by edge benchmarks: generated sensor
// readings (1000 keys) keyed by sensor at parallelism 2 into a sink that
// discards them.
func keyByEdgeJob(name string, opts ...stream.Option) *stream.Environment {
	env := stream.NewEnvironment(name, append([]stream.Option{stream.WithParallelism(2)}, opts...)...)
	src := stream.FromSource(env, "generator", generator(benchRecords, 1000)).UID("generator")
	stream.KeyBy(src, bySensor).Stream().ForEach("discard", func(operators.SensorReading) error { return nil }).UID("discard")
	return env
}

// BenchmarkRemoteKeyByEdge moves records through one key-by edge at
// parallelism 2: in one process (plain, and serialized as
// WithSerializedKeyBy does, the same codec work a remote edge does), and
// with the senders on one node and the
// receivers on another over protoactor remote on loopback, in the same
// run. remote/local is the throughput ratio; cpu-ns/record is the
// process's CPU time per record, and remote-cpu/local-cpu and
// remote-cpu/serialized-cpu the ratios of those (steadier than the rates
// on a loaded machine); wire-bytes/record is the frame bytes
// sent between the nodes per record, and tcp-bytes/record what the nodes
// wrote on their connections (frames, acknowledgements and control
// messages with protoactor's and gRPC's framing: everything above TCP);
// records/batch is the mean batch crossing; alloc-bytes/record is what the
// process allocated per record in the serialized and the remote runs
// (steadier still: no other process changes it). EDGED_BENCH_TRANSPORT=memory
// runs the two nodes over the in-memory transport instead.
func BenchmarkRemoteKeyByEdge(b *testing.B) {
	c := remoteCluster(b, 2)
	if os.Getenv("EDGED_BENCH_TRANSPORT") == "memory" {
		c = memoryCluster(b, 2, 1, cluster.Faults{})
	}
	runs := 0
	job := func(opts ...stream.Option) *stream.Environment {
		// Every run a job of its own name: the nodes stay up from one run
		// to the next, and frames of a finished job still in flight must
		// not reach the next one's channels.
		runs++
		return keyByEdgeJob(fmt.Sprintf("edge-%d", runs), opts...)
	}
	var local, ser, remote, localCPU, serCPU, remoteCPU time.Duration
	var serAlloc, remoteAlloc uint64
	before, tcpBefore := c.sent(), c.wire()
	for b.Loop() {
		env := job()
		start, cpu := time.Now(), cpuTime(b)
		runBench(b, env)
		local += time.Since(start)
		localCPU += cpuTime(b) - cpu

		env = job(stream.WithSerializedKeyBy(true))
		start, cpu, alloc := time.Now(), cpuTime(b), allocated()
		runBench(b, env)
		ser += time.Since(start)
		serCPU += cpuTime(b) - cpu
		serAlloc += allocated() - alloc

		env = job(stream.WithCluster(c.Cluster))
		placeByChain(b, c, env, func(chain int) int { return chain })
		start, cpu, alloc = time.Now(), cpuTime(b), allocated()
		runBench(b, env)
		remote += time.Since(start)
		remoteCPU += cpuTime(b) - cpu
		remoteAlloc += allocated() - alloc
	}
	n := float64(b.N) * benchRecords
	b.ReportMetric(n/local.Seconds(), "local-records/s")
	b.ReportMetric(n/remote.Seconds(), "remote-records/s")
	b.ReportMetric(local.Seconds()/remote.Seconds(), "remote/local")
	b.ReportMetric(ser.Seconds()/remote.Seconds(), "remote/local-serialized")
	b.ReportMetric(float64(localCPU.Nanoseconds())/n, "local-cpu-ns/record")
	b.ReportMetric(float64(serCPU.Nanoseconds())/n, "local-serialized-cpu-ns/record")
	b.ReportMetric(float64(remoteCPU.Nanoseconds())/n, "remote-cpu-ns/record")
	b.ReportMetric(float64(remoteCPU)/float64(localCPU), "remote-cpu/local-cpu")
	b.ReportMetric(float64(remoteCPU)/float64(serCPU), "remote-cpu/serialized-cpu")
	b.ReportMetric(float64(serAlloc)/n, "local-serialized-alloc-bytes/record")
	b.ReportMetric(float64(remoteAlloc)/n, "remote-alloc-bytes/record")
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

// peerEnv, when set, makes TestKeyByEdgePeer run as the second process
// of BenchmarkRemoteKeyByEdgeTwoProcesses.
const peerEnv = "EDGED_BENCH_PEER"

// TestKeyByEdgePeer is the peer process of
// BenchmarkRemoteKeyByEdgeTwoProcesses, which runs the test binary again
// with peerEnv set: node-1 over protoactor remote on loopback, hosting
// the tasks the job master in the benchmark's process places on it. It
// prints its transport and HTTP addresses, serves /peer (the master's
// address), /deploy (a Worker.Deploy) and /stats (its CPU time and what
// it wrote to the master), and stops when its standard input closes.
func TestKeyByEdgePeer(t *testing.T) {
	if os.Getenv(peerEnv) == "" {
		t.Skip("the peer process of BenchmarkRemoteKeyByEdgeTwoProcesses")
	}
	if p := os.Getenv(peerProfileEnv); p != "" {
		f, err := os.Create(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		defer pprof.StopCPUProfile()
	}
	nw := cluster.NewNetwork("node-1", testChannelConfig(), nil)
	tr := cluster.NewRemoteTransport(cluster.DefaultRemoteConfig(), nw.Endpoint())
	if err := tr.Start(); err != nil {
		t.Fatal(err)
	}
	defer tr.Stop(context.Background(), false)
	nw.Attach(tr)
	nw.SetPeer("node-1", tr.Addr())
	nw.Start(20 * time.Millisecond)
	defer nw.Stop()
	w := actors.NewWorker(actors.WorkerConfig{Node: "node-1", Network: nw, Dir: t.TempDir(),
		Jobs: func(name string) (*actors.Job, actors.Config, error) {
			env := keyByEdgeJob(name)
			j, err := env.Graph()
			return j, env.Config(), err
		}})
	defer w.Close()
	mux := http.NewServeMux()
	mux.HandleFunc("POST /peer", func(rw http.ResponseWriter, r *http.Request) {
		nw.SetPeer(r.FormValue("id"), r.FormValue("addr"))
	})
	mux.HandleFunc("POST /deploy", func(rw http.ResponseWriter, r *http.Request) {
		var d actors.Deployment
		if err := json.NewDecoder(r.Body).Decode(&d); err != nil {
			http.Error(rw, err.Error(), http.StatusBadRequest)
			return
		}
		if err := w.Deploy(r.Context(), d); err != nil {
			http.Error(rw, err.Error(), http.StatusInternalServerError)
		}
	})
	mux.HandleFunc("GET /stats", func(rw http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(rw).Encode(peerStats{CPU: processCPU(), Wire: tr.WireStats()})
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: mux}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	fmt.Printf("peer %s %s\n", tr.Addr(), ln.Addr())
	_, _ = io.Copy(io.Discard, os.Stdin)
}

// peerProfileEnv, when set to a file name, makes the peer process of
// BenchmarkRemoteKeyByEdgeTwoProcesses write its CPU profile there, as
// -test.cpuprofile does for the benchmark's process.
const peerProfileEnv = "EDGED_BENCH_PEER_CPUPROFILE"

// peerStats is what the peer process reports on /stats.
type peerStats struct {
	CPU  time.Duration
	Wire cluster.WireStats
}

// peerProcess is the running peer of BenchmarkRemoteKeyByEdgeTwoProcesses.
type peerProcess struct {
	addr, http string
}

func (p *peerProcess) post(ctx context.Context, path string, body io.Reader) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+p.http+path, body)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("peer %s: %s: %s", path, resp.Status, strings.TrimSpace(string(msg)))
	}
	return nil
}

func (p *peerProcess) stats(b *testing.B) peerStats {
	resp, err := http.Get("http://" + p.http + "/stats")
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	var s peerStats
	if err := json.NewDecoder(resp.Body).Decode(&s); err != nil {
		b.Fatal(err)
	}
	return s
}

// startPeer runs the test binary again as TestKeyByEdgePeer and waits for
// its addresses; the peer stops when the benchmark ends.
func startPeer(b *testing.B) *peerProcess {
	var p peerProcess
	startTestProcess(b, "TestKeyByEdgePeer", peerEnv+"=1", "peer process", "peer %s %s", &p.addr, &p.http)
	return &p
}

// startTestProcess runs this test binary again as test run, with env
// added to the environment, until the benchmark ends (it closes the
// process's stdin then, and waits for it), and waits for the line in
// which it prints its addresses in format (scanned into addrs).
func startTestProcess(b *testing.B, run, env, what, format string, addrs ...any) {
	cmd := exec.Command(os.Args[0], "-test.run=^"+run+"$", "-test.count=1", "-test.v=false")
	cmd.Env = append(os.Environ(), env)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		stdin.Close()
		if err := cmd.Wait(); err != nil {
			b.Errorf("%s: %v", what, err)
		}
	})
	lines := bufio.NewScanner(stdout)
	for lines.Scan() {
		if _, err := fmt.Sscanf(lines.Text(), format, addrs...); err == nil {
			go func() { _, _ = io.Copy(io.Discard, stdout) }()
			return
		}
	}
	b.Fatalf("%s printed no addresses: %v", what, lines.Err())
}

// BenchmarkRemoteKeyByEdgeTwoProcesses is BenchmarkRemoteKeyByEdge with
// its second node in a process of its own (this test binary run again):
// the generators here, the key-by edge's receivers there, over protoactor
// remote on loopback; against the same edge within this process, in the
// same run. cpu-ns/record adds up both processes' CPU time;
// wire-bytes/record is the frame bytes sent to the peer per record, and
// tcp-bytes/record what both processes wrote on their connections.
func BenchmarkRemoteKeyByEdgeTwoProcesses(b *testing.B) {
	peer := startPeer(b)
	nw := cluster.NewNetwork("node-0", testChannelConfig(), nil)
	tr := cluster.NewRemoteTransport(cluster.DefaultRemoteConfig(), nw.Endpoint())
	if err := tr.Start(); err != nil {
		b.Fatal(err)
	}
	nw.Attach(tr)
	nw.Start(20 * time.Millisecond)
	b.Cleanup(func() {
		nw.Stop()
		tr.Stop(context.Background(), false)
	})
	nw.SetPeer("node-0", tr.Addr())
	nw.SetPeer("node-1", peer.addr)
	if err := peer.post(context.Background(), "/peer?"+url.Values{"id": {"node-0"}, "addr": {tr.Addr()}}.Encode(), nil); err != nil {
		b.Fatal(err)
	}
	c := &actors.Cluster{
		Nodes: []actors.Node{{ID: "node-0", Network: nw}, {ID: "node-1"}},
		Invite: func(ctx context.Context, _ string, d actors.Deployment) error {
			body, err := json.Marshal(d)
			if err != nil {
				return err
			}
			return peer.post(ctx, "/deploy", bytes.NewReader(body))
		},
	}
	runs := 0
	var local, remote, localCPU, remoteCPU time.Duration
	before, tcpBefore, peerBefore := nw.Sent(), tr.WireStats(), peer.stats(b)
	for b.Loop() {
		runs++
		env := keyByEdgeJob(fmt.Sprintf("local-%d", runs))
		start, cpu := time.Now(), processCPU()
		runBench(b, env)
		local += time.Since(start)
		localCPU += processCPU() - cpu

		env = keyByEdgeJob(fmt.Sprintf("edge-%d", runs), stream.WithCluster(c))
		plan, err := env.Plan()
		if err != nil {
			b.Fatal(err)
		}
		c.Placement = make(map[actors.TaskKey]string)
		for i, ch := range plan.Chains {
			for sub := range ch.Head().Parallelism {
				c.Placement[actors.TaskKey{UID: ch.Head().UID, Subtask: sub}] = c.Nodes[i%2].ID
			}
		}
		start, cpu, peerCPU := time.Now(), processCPU(), peer.stats(b).CPU
		runBench(b, env)
		remote += time.Since(start)
		remoteCPU += processCPU() - cpu + peer.stats(b).CPU - peerCPU
	}
	n := float64(b.N) * benchRecords
	b.ReportMetric(n/local.Seconds(), "local-records/s")
	b.ReportMetric(n/remote.Seconds(), "remote-records/s")
	b.ReportMetric(local.Seconds()/remote.Seconds(), "remote/local")
	b.ReportMetric(float64(localCPU.Nanoseconds())/n, "local-cpu-ns/record")
	b.ReportMetric(float64(remoteCPU.Nanoseconds())/n, "remote-cpu-ns/record")
	b.ReportMetric(float64(remoteCPU)/float64(localCPU), "remote-cpu/local-cpu")
	sent := nw.Sent()
	if sent.Batches == before.Batches {
		b.Fatal("no batch crossed to the peer process")
	}
	b.ReportMetric(float64(sent.Bytes-before.Bytes)/n, "wire-bytes/record")
	b.ReportMetric(n/float64(sent.Batches-before.Batches), "records/batch")
	tcp := tr.WireStats().Bytes - tcpBefore.Bytes + peer.stats(b).Wire.Bytes - peerBefore.Wire.Bytes
	b.ReportMetric(float64(tcp)/n, "tcp-bytes/record")
}
