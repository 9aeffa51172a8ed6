package pipeline

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgedio/edged/internal/mqtttest"
	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/mqtt"
	"github.com/edgedio/edged/mqtt/ingestlog"
	"github.com/edgedio/edged/stream"
)

// Flags of BenchmarkMQTTPipeline.
var (
	benchMsgs = flag.Int("mqtt.msgs", 200_000, "BenchmarkMQTTPipeline: readings in the backlog")
	benchKeys = flag.Int("mqtt.keys", 1000, "BenchmarkMQTTPipeline: sensors")
	benchProf = flag.String("mqtt.cpuprofile", "", "BenchmarkMQTTPipeline: write a CPU profile of edged draining the backlog (only) to this file")
	benchHeap = flag.String("mqtt.heapprofile", "", "BenchmarkMQTTPipeline: write a heap profile taken when the backlog is half ingested to this file")
	benchWait = flag.Duration("mqtt.wait", 5*time.Minute, "BenchmarkMQTTPipeline: how long to wait for the results")
)

// cpuTime returns the CPU time (user + system) this process used so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// The readings of BenchmarkMQTTPipeline: reading i has event time
// benchEpoch + i ms; benchTail readings follow the n counted ones, so that
// the watermark (2 s behind) passes the last window that holds one.
const (
	benchEpoch = 1_700_000_000_000
	benchTail  = 4000
)

// benchReading is reading i of the backlog: sensor i%keys, one reading per
// millisecond (as cmd/edged-bench), 46 bytes.
func benchReading(i, keys int, ts int64) (string, []byte) {
	s := fmt.Sprintf("m%04d", i%keys)
	return "plant/" + s + "/temperature", []byte(fmt.Sprintf(`{"sensor":%q,"t":%d.5,"ts":%d}`, s, 20+i%15, ts))
}

// fillBacklog subscribes the persistent sessions ids (QoS 1) and
// disconnects them, then publishes the n readings and a tail of
// benchTail more (which moves the watermark past every window of the
// readings) with QoS 1 over 8 connections: the broker queues every
// message for each session. Reading i has event time epoch + i ms.
func fillBacklog(tb testing.TB, url string, n, keys int, ids ...string) (total int) {
	tb.Helper()
	for _, id := range ids {
		c := paho.NewClient(paho.NewClientOptions().AddBroker(url).SetClientID(id).SetCleanSession(false).
			SetDefaultPublishHandler(func(paho.Client, paho.Message) {}))
		if tok := c.Connect(); !tok.WaitTimeout(waitFor) || tok.Error() != nil {
			tb.Fatalf("connect %s: %v", id, tok.Error())
		}
		if tok := c.Subscribe("plant/+/temperature", 1, nil); !tok.WaitTimeout(waitFor) || tok.Error() != nil {
			tb.Fatalf("subscribe %s: %v", id, tok.Error())
		}
		c.Disconnect(100)
	}
	total = n + benchTail
	// One publishing goroutine over 8 connections with at most 500
	// publishes unacknowledged: the broker receives the readings at most
	// 500 ms of event time out of order, within the pipeline's bound.
	const conns, inflight = 8, 500
	pubs := make([]paho.Client, conns)
	for c := range pubs {
		cl := paho.NewClient(paho.NewClientOptions().AddBroker(url).SetClientID(fmt.Sprintf("bench-pub-%d", c)).
			SetDefaultPublishHandler(func(paho.Client, paho.Message) {}))
		if tok := cl.Connect(); !tok.WaitTimeout(waitFor) || tok.Error() != nil {
			tb.Fatalf("publisher connect: %v", tok.Error())
		}
		defer cl.Disconnect(100)
		pubs[c] = cl
	}
	toks := make([]paho.Token, inflight)
	wait := func(t paho.Token) {
		if t != nil && (!t.WaitTimeout(waitFor) || t.Error() != nil) {
			tb.Fatalf("publish: %v", t.Error())
		}
	}
	for i := range total {
		wait(toks[i%inflight])
		topic, p := benchReading(i, keys, benchEpoch+int64(i))
		toks[i%inflight] = pubs[i%conns].Publish(topic, 1, false, p)
	}
	for _, t := range toks {
		wait(t)
	}
	return total
}

// drainBare reads total messages of session id with a bare paho
// subscriber (QoS 1, persistent session, paho's automatic acks) and
// returns its rate (first to last received) and CPU time.
func drainBare(tb testing.TB, url, id string, total int) (rate float64, cpu time.Duration) {
	tb.Helper()
	var count, first, last atomic.Int64
	done := make(chan struct{})
	h := func(_ paho.Client, m paho.Message) {
		now := time.Now().UnixNano()
		k := count.Add(1)
		if k == 1 {
			first.Store(now)
		}
		last.Store(now)
		if k == int64(total) {
			close(done)
		}
	}
	cpu0 := cpuTime()
	c := paho.NewClient(paho.NewClientOptions().AddBroker(url).SetClientID(id).SetCleanSession(false).
		SetOrderMatters(false).SetDefaultPublishHandler(h))
	if tok := c.Connect(); !tok.WaitTimeout(waitFor) || tok.Error() != nil {
		tb.Fatalf("bare connect: %v", tok.Error())
	}
	select {
	case <-done:
	case <-time.After(5 * time.Minute):
		tb.Fatalf("bare subscriber received %d of %d", count.Load(), total)
	}
	cpu = cpuTime() - cpu0
	c.Disconnect(100)
	return float64(total) / time.Duration(last.Load()-first.Load()).Seconds(), cpu
}

// resultCounter sums the counts of the window results written to it, one
// JSON object a line.
type resultCounter struct {
	mu     sync.Mutex // guards part
	part   []byte
	before int64 // only windows starting before count
	sum    atomic.Int64
	rows   atomic.Int64
}

func (r *resultCounter) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.part = append(r.part, p...)
	for {
		i := bytes.IndexByte(r.part, '\n')
		if i < 0 {
			break
		}
		r.add(r.part[:i])
		r.part = r.part[i+1:]
	}
	if len(r.part) == 0 {
		r.part = nil
	}
	return len(p), nil
}

func (r *resultCounter) add(line []byte) {
	if jsonInt(line, `"window_start":`) >= r.before {
		return
	}
	r.sum.Add(jsonInt(line, `"count":`))
	r.rows.Add(1)
}

// jsonInt returns the integer after key (and blanks) in line, or 0.
func jsonInt(line []byte, key string) int64 {
	i := bytes.Index(line, []byte(key))
	if i < 0 {
		return 0
	}
	v := bytes.TrimLeft(line[i+len(key):], " \t")
	j := 0
	for j < len(v) && v[j] >= '0' && v[j] <= '9' {
		j++
	}
	n, _ := strconv.ParseInt(string(v[:j]), 10, 64)
	return n
}

// benchPipeline is the pipeline of BenchmarkMQTTPipeline: JSON readings,
// key by sensor, 1 s event-time tumbling count and average, exactly-once
// checkpoints every second; sink is its sinks entry.
func benchPipeline(url, dir, sink string) string {
	return fmt.Sprintf(`
pipelines:
  - name: bench
    source:
      mqtt:
        broker: %s
        client_id: bench-edged
        topics: [plant/+/temperature]
        qos: 1
        format: json
        fields:
          id: {type: string, path: $.sensor}
          temp: {type: float, path: $.t}
          ts: {type: time, path: $.ts, unit: ms}
    event_time: {field: ts, max_out_of_orderness: 2s}
    key: id
    window:
      type: tumbling
      size: 1s
      aggregates: [{name: count, fn: count}, {name: avg, fn: avg, field: temp}]
    sinks:
      - %s
    checkpoint: {dir: %s, interval: 1s, mode: exactly_once}
`, url, sink, dir)
}

// BenchmarkMQTTPipeline measures the whole MQTT path of a pipeline built
// from YAML as the daemon builds it (subscriber → ingest log → source →
// JSON decode → key by sensor → 1 s tumbling count+avg → sink) draining a
// backlog that Mosquitto holds for its persistent session, against a bare
// paho subscriber draining the same backlog in the same run. The backlog
// is published before either starts, so the figures are the subscribers'
// own: messages/s and CPU-µs per message (process CPU time while
// draining / messages). Run with -benchtime 1x:
//
//	go test ./pipeline -run '^$' -bench MQTTPipeline -benchtime 1x [-mqtt.msgs 1000000]
//
// client= is what reads the broker (source.mqtt.client): the direct
// reader or paho.
func BenchmarkMQTTPipeline(b *testing.B) {
	for _, sink := range []string{"stdout", "mqtt"} {
		for _, client := range []string{mqtt.ClientDirect, mqtt.ClientPaho} {
			b.Run("sink="+sink+"/client="+client, func(b *testing.B) {
				for b.Loop() {
					benchMQTTPipelineOnce(b, sink, client)
				}
			})
		}
	}
}

func benchMQTTPipelineOnce(b *testing.B, sinkKind, client string) {
	b.StopTimer()
	url := "tcp://" + startBenchMosquittoAddr(b)
	n, keys := *benchMsgs, *benchKeys
	total := fillBacklog(b, url, n, keys, "bench-bare", "bench-edged")
	runtime.GC()

	bareRate, bareCPU := drainBare(b, url, "bench-bare", total)
	runtime.GC()

	dir := b.TempDir()
	log, err := ingestlog.Open(filepath.Join(dir, "ingest"), ingestlog.DefaultOptions(), nil)
	if err != nil {
		b.Fatal(err)
	}
	defer log.Close()
	lastEnd := benchEpoch + (int64(n)+999)/1000*1000
	out := &resultCounter{before: lastEnd}
	var res *mqttResults
	sink := "stdout: {}"
	if sinkKind == "mqtt" {
		sink = `mqtt: {topic: "totals/{id}", qos: 1}`
		res = subscribeBenchResults(b, url, lastEnd)
	}
	cfg, err := Parse([]byte(benchPipeline(url, filepath.Join(dir, "checkpoints"), sink)))
	if err != nil {
		b.Fatal(err)
	}
	pc := cfg.Pipelines[0]
	opts, err := EnvOptions(pc)
	if err != nil {
		b.Fatal(err)
	}
	env := stream.NewEnvironment(pc.Name, opts...)
	if _, err := BuildJobWith(pc, env, out, Inputs{
		MQTTLog: func(string) (*ingestlog.Log, error) { return log, nil },
		Broker:  url,
	}); err != nil {
		b.Fatal(err)
	}
	src := pc.Source.MQTT
	sub, err := mqtt.NewSubscriber(mqtt.SubscriberConfig{Broker: url, Pipeline: pc.Name, ClientID: src.ClientID,
		Topics: src.Topics, QoS: byte(src.QoS), Client: client}, log)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	job, err := env.ExecuteAsync(ctx)
	if err != nil {
		b.Fatal(err)
	}
	sum := func() int64 {
		if res != nil {
			return res.sum()
		}
		return out.sum.Load()
	}

	if *benchProf != "" {
		f, err := os.Create(*benchProf)
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			b.Fatal(err)
		}
	}
	var peakRSS atomic.Int64
	stopRSS := sampleRSS(&peakRSS)
	b.StartTimer()
	cpu0, start := cpuTime(), time.Now()
	if err := sub.Start(ctx); err != nil {
		b.Fatal(err)
	}
	var ingested time.Duration
	if !testutil.Within(*benchWait, func() bool {
		next := log.Stats().NextOffset
		if ingested == 0 && next >= uint64(total) {
			ingested = time.Since(start)
		}
		if *benchHeap != "" && next >= uint64(total/2) {
			writeHeap(b, *benchHeap)
			*benchHeap = ""
		}
		return sum() >= int64(n) && next >= uint64(total)
	}) {
		b.Fatalf("the window results sum to %d (%d rows) of %d readings; the ingest log holds %d records of %d",
			sum(), out.rows.Load(), n, log.Stats().NextOffset, total)
	}
	elapsed, cpu := time.Since(start), cpuTime()-cpu0
	b.StopTimer()
	if *benchProf != "" {
		pprof.StopCPUProfile()
	}
	stopRSS()

	if got := log.Stats().NextOffset; got != uint64(total) {
		b.Errorf("ingest log holds %d records, want %d", got, total)
	}
	if ingested == 0 {
		ingested = elapsed
	}
	sub.Close()
	cancel()
	job.Wait()
	if res != nil {
		res.close()
	}
	ingestRate := float64(total) / ingested.Seconds()
	b.ReportMetric(bareRate, "bare-msgs/s")
	b.ReportMetric(float64(bareCPU.Microseconds())/float64(total), "bare-CPU-µs/msg")
	b.ReportMetric(ingestRate, "ingest-msgs/s")
	b.ReportMetric(float64(total)/elapsed.Seconds(), "e2e-msgs/s")
	b.ReportMetric(ingestRate/bareRate, "ingest/bare")
	b.ReportMetric(float64(cpu.Microseconds())/float64(total), "CPU-µs/msg")
	b.ReportMetric(float64(peakRSS.Load())/1024, "peak-RSS-MB")
	b.ReportMetric(float64(log.Stats().Fsyncs)/float64(total), "fsyncs/msg")
	b.StartTimer() // b.Loop checks the timer runs
}

// sampleRSS records the peak VmRSS of this process every 100 ms into
// peak (kB) until the returned function is called.
func sampleRSS(peak *atomic.Int64) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			if kb := rssKB(); kb > peak.Load() {
				peak.Store(kb)
			}
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	})
	return func() {
		close(done)
		wg.Wait()
	}
}

// rssKB returns this process's VmRSS in kB, or 0.
func rssKB() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	return jsonInt(b, "VmRSS:")
}

// writeHeap writes a heap profile to path.
func writeHeap(tb testing.TB, path string) {
	f, err := os.Create(path)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		tb.Fatal(err)
	}
}

// mqttResults sums the counts of the window results published to
// totals/#.
type mqttResults struct {
	c    paho.Client
	rc   resultCounter
	last sync.Map // topic -> count, so that a republished result counts once
}

func subscribeBenchResults(tb testing.TB, url string, before int64) *mqttResults {
	tb.Helper()
	r := &mqttResults{rc: resultCounter{before: before}}
	h := func(_ paho.Client, m paho.Message) {
		p := m.Payload()
		if i := bytes.Index(p, []byte(`"window_start":`)); i >= 0 {
			// one result per sensor and window; the same result may be
			// published twice (at least once before a commit is seen).
			key := m.Topic() + string(p[i:min(len(p), i+30)])
			if _, dup := r.last.LoadOrStore(key, true); dup {
				return
			}
		}
		r.rc.add(p)
	}
	r.c = paho.NewClient(paho.NewClientOptions().AddBroker(url).SetClientID("bench-totals").
		SetOrderMatters(false).SetDefaultPublishHandler(h))
	if tok := r.c.Connect(); !tok.WaitTimeout(waitFor) || tok.Error() != nil {
		tb.Fatalf("results connect: %v", tok.Error())
	}
	if tok := r.c.Subscribe("totals/#", 1, h); !tok.WaitTimeout(waitFor) || tok.Error() != nil {
		tb.Fatalf("results subscribe: %v", tok.Error())
	}
	return r
}

func (r *mqttResults) sum() int64 { return r.rc.sum.Load() }

func (r *mqttResults) close() { r.c.Disconnect(100) }

// startBenchMosquittoAddr starts a Mosquitto broker with queues large
// enough to hold the whole backlog of a persistent session.
func startBenchMosquittoAddr(tb testing.TB) string {
	addr, _ := mqtttest.StartMosquitto(tb, "max_inflight_messages 1000\nmax_queued_messages 4000000\nmax_queued_bytes 0\n")
	return addr
}
