package pipeline

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/mqtt"
	"github.com/edgedio/edged/mqtt/ingestlog"
	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/stream"
)

// waitFor bounds each wait of the MQTT tests.
const waitFor = 30 * time.Second

// burn runs the write-ahead and dead-letter tests beside busy goroutines
// (go test ./pipeline -run 'WriteAhead|BadRecords' -burn -count=20).
var burn = flag.Bool("burn", false, "run the exactly-once MQTT tests under CPU contention")

// contend burns the CPUs for the rest of the test when -burn is set.
func contend(t *testing.T) {
	if *burn {
		testutil.Burn(t, 0)
	}
}

// published is one message a subscriber of the test broker received.
type published struct {
	topic, payload, id string
}

// mqttHarness is a broker, an ingest log the test fills directly, and a
// subscriber to every topic of the broker.
type mqttHarness struct {
	t   *testing.T
	url string
	log *ingestlog.Log
	mu  sync.Mutex // guards msgs
	got []published

	cancels []jobCancel
	pub     paho.Client // publishes the markers of sync
	markers int
}

// sync publishes a marker and waits until the subscriber has it: what
// the broker acknowledged before has been received too.
func (h *mqttHarness) sync() {
	h.t.Helper()
	h.markers++
	topic := fmt.Sprintf("marker/%d", h.markers)
	if tok := h.pub.Publish(topic, 1, false, "m"); !tok.WaitTimeout(waitFor) || tok.Error() != nil {
		h.t.Fatalf("marker publish: %v", tok.Error())
	}
	testutil.Eventually(h.t, waitFor, "the marker received", func() bool { return len(h.published(topic)) == 1 })
}

type jobCancel struct {
	job    *stream.Job
	cancel context.CancelFunc
}

func newMQTTHarness(t *testing.T) *mqttHarness {
	t.Helper()
	log, err := ingestlog.Open(t.TempDir(), ingestlog.DefaultOptions(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { log.Close() })
	br, err := mqtt.NewBroker(mqtt.BrokerConfig{Address: "127.0.0.1:0", Filters: []string{"#"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := br.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { br.Close() })
	h := &mqttHarness{t: t, url: "tcp://" + br.Addr(), log: log}
	h.pub = paho.NewClient(paho.NewClientOptions().AddBroker(h.url).SetClientID("marker").
		SetDefaultPublishHandler(func(paho.Client, paho.Message) {}))
	if tok := h.pub.Connect(); !tok.WaitTimeout(waitFor) || tok.Error() != nil {
		t.Fatalf("marker connect: %v", tok.Error())
	}
	t.Cleanup(func() { h.pub.Disconnect(0) })
	sub := paho.NewClient(paho.NewClientOptions().AddBroker(h.url).SetClientID("checker").
		SetDefaultPublishHandler(func(paho.Client, paho.Message) {}))
	if tok := sub.Connect(); !tok.WaitTimeout(waitFor) || tok.Error() != nil {
		t.Fatalf("subscriber connect: %v", tok.Error())
	}
	t.Cleanup(func() { sub.Disconnect(0) })
	tok := sub.Subscribe("#", 1, func(_ paho.Client, m paho.Message) {
		id, _ := mqtt.ParseMsgID(m.Payload())
		h.mu.Lock()
		h.got = append(h.got, published{m.Topic(), string(m.Payload()), id})
		h.mu.Unlock()
	})
	if !tok.WaitTimeout(waitFor) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	return h
}

// append adds one message to the ingest log.
func (h *mqttHarness) append(payload string) {
	h.t.Helper()
	if _, err := h.log.Append(context.Background(), ingestlog.Message{Topic: "sensors/x/temperature", Payload: []byte(payload), QoS: 1}); err != nil {
		h.t.Fatal(err)
	}
}

// published returns the messages received so far on topics with prefix.
func (h *mqttHarness) published(prefix string) []published {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []published
	for _, p := range h.got {
		if strings.HasPrefix(p.topic, prefix) {
			out = append(out, p)
		}
	}
	return out
}

// reset forgets what was received.
func (h *mqttHarness) reset() {
	h.mu.Lock()
	h.got = nil
	h.mu.Unlock()
}

// start builds and runs pc reading the harness's log and publishing to
// its broker, with extra environment options.
func (h *mqttHarness) start(pc PipelineConfig, extra ...stream.Option) (*stream.Job, *Job, *testutil.Buffer) {
	h.t.Helper()
	env := stream.NewEnvironment(pc.Name, append(EnvOptionsOrDie(h.t, pc), extra...)...)
	out := &testutil.Buffer{}
	pj, err := BuildJobWith(pc, env, out, Inputs{
		MQTTLog: func(string) (*ingestlog.Log, error) { return h.log, nil },
		Broker:  h.url,
	})
	if err != nil {
		h.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	job, err := env.ExecuteAsync(ctx)
	if err != nil {
		cancel()
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() {
		cancel()
		job.Wait()
	})
	h.cancels = append(h.cancels, jobCancel{job, cancel})
	return job, pj, out
}

func parsePipeline(t *testing.T, yml string) PipelineConfig {
	t.Helper()
	cfg, err := Parse([]byte(yml))
	if err != nil {
		t.Fatal(err)
	}
	return cfg.Pipelines[0]
}

// walPipeline counts readings per sensor in 1 s windows and publishes the
// results to agg/<sensor> through the write-ahead MQTT sink; it prints
// them too. No restart: any failure ends the job.
func walPipeline(parallelism int, checkpointDir, interval string) string {
	return fmt.Sprintf(`
pipelines:
  - name: wal
    parallelism: %d
    source:
      mqtt:
        topics: [sensors/+/temperature]
        format: json
        fields:
          id: {type: string, path: $.sensor}
          temp: {type: float, path: $.t}
          ts: {type: time, path: $.ts, unit: ms}
    event_time: {field: ts, max_out_of_orderness: 1ms}
    key: id
    window:
      type: tumbling
      size: 1s
      allowed_lateness: 10s
      aggregates: [{name: n, fn: count, field: temp}]
    sinks:
      - stdout: {}
      - mqtt: {topic: "agg/{id}"}
    checkpoint: {dir: %s, interval: %s}
    restart: {strategy: none}
`, parallelism, checkpointDir, interval)
}

// reading is a JSON reading of sensor id at ts ms.
func reading(id string, ts int64) string {
	return fmt.Sprintf(`{"sensor":%q,"t":21.5,"ts":%d}`, id, ts)
}

// The write-ahead MQTT sink at parallelism 2: each subtask connects with
// its own client id, so they do not take the connection from each other,
// and every result is published with a distinct msg_id.
func TestMQTTWriteAheadSinkParallelism2(t *testing.T) {
	contend(t)
	h := newMQTTHarness(t)
	job, _, _ := h.start(parsePipeline(t, walPipeline(2, t.TempDir(), "20ms")))
	// Two rounds, each published when a later checkpoint completes: a
	// subtask whose connection was taken by the other fails the second.
	const sensors = 8
	for round, seconds := range [][2]int64{{0, 4}, {4, 8}} {
		for s := seconds[0]; s < seconds[1]; s++ {
			for k := range sensors {
				h.append(reading(fmt.Sprintf("s%d", k), s*1000))
			}
		}
		// The watermark (last second - 2ms) closes all but the last two
		// seconds' windows.
		want := sensors * int(seconds[1]-2)
		testutil.Eventually(t, waitFor, fmt.Sprintf("round %d published", round), func() bool {
			return len(h.published("agg/")) >= want || isDone(job)
		})
		if isDone(job) {
			t.Fatalf("round %d: job ended: %v", round, job.Wait())
		}
	}
	if n := job.Attempts(); n != 1 {
		t.Fatalf("%d attempts, want 1", n)
	}
	want := sensors * 6
	h.cancelJob(job)
	h.sync()
	idsOf(t, h.published("agg/"), want)
}

// cancelJob cancels a job the harness started and waits for its end.
func (h *mqttHarness) cancelJob(job *stream.Job) {
	for _, c := range h.cancels {
		if c.job == job {
			c.cancel()
		}
	}
	job.Wait()
}

// sinkRecords returns the records that reached the tasks of chain.
func sinkRecords(j *stream.Job, chain string) int {
	var n int
	for _, m := range j.Metrics() {
		if m.Chain == chain {
			n += int(m.RecordsIn)
		}
	}
	return n
}

func isDone(j *stream.Job) bool {
	select {
	case <-j.Done():
		return true
	default:
		return false
	}
}

// A savepoint taken at parallelism 2 holds results not yet published;
// restored at parallelism 1 and 3 it publishes them again with the ids
// the parallelism-2 run gave them, each once, and two different results
// (including two firings of one window, the second after a late reading)
// never share an id.
func TestMQTTWriteAheadRescaleKeepsIDs(t *testing.T) {
	contend(t)
	h := newMQTTHarness(t)
	dir := t.TempDir()
	pc := parsePipeline(t, walPipeline(2, dir, "1h"))
	job, _, _ := h.start(pc)
	// A savepoint before any result: the run's first checkpoint is then
	// not brought forward by the sink's first result (snapshot.OutputHeld),
	// so every result waits for the savepoint below.
	if _, err := job.TriggerSavepoint(context.Background(), ""); err != nil {
		t.Fatal(err)
	}
	const sensors = 8
	for s := range 4 {
		for k := range sensors {
			h.append(reading(fmt.Sprintf("s%d", k), int64(s)*1000))
		}
	}
	// The watermark (3s-2ms) closes [0,1s) and [1s,2s).
	testutil.Eventually(t, waitFor, "the window results at the sink", func() bool {
		return sinkRecords(job, "wal/sink-1-windows") >= sensors*2 || isDone(job)
	})
	// A late reading of s0 in [0,1s): its window fires again (count 2).
	h.append(reading("s0", 500))
	const want = sensors*2 + 1
	testutil.Eventually(t, waitFor, "the late firing at the sink", func() bool {
		return sinkRecords(job, "wal/sink-1-windows") >= want || isDone(job)
	})
	if isDone(job) {
		t.Fatalf("job ended: %v", job.Wait())
	}
	if n := sinkRecords(job, "wal/sink-1-windows"); n != want {
		t.Fatalf("%d results at the sink, want %d", n, want)
	}
	if got := h.published("agg/"); len(got) != 0 {
		t.Fatalf("published before any checkpoint completed: %v", got)
	}
	sp, err := job.TriggerSavepoint(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	// The savepoint's completion publishes what it holds.
	testutil.Eventually(t, waitFor, "the results published", func() bool { return len(h.published("agg/")) >= want })
	h.cancelJob(job)
	h.sync()
	first := idsOf(t, h.published("agg/"), want)

	for _, p := range []int{1, 3} {
		h.reset()
		rc := pc
		rc.Parallelism = p
		rjob, _, _ := h.start(rc, stream.WithSavepoint(sp, false))
		testutil.Eventually(t, waitFor, fmt.Sprintf("the results re-published at parallelism %d", p), func() bool {
			return len(h.published("agg/")) >= want || isDone(rjob)
		})
		if isDone(rjob) {
			t.Fatalf("parallelism %d: job ended: %v", p, rjob.Wait())
		}
		h.cancelJob(rjob)
		h.sync()
		again := idsOf(t, h.published("agg/"), want)
		for id, payload := range again {
			if first[id] != payload {
				t.Fatalf("parallelism %d: msg_id %s is %q, at parallelism 2 it was %q", p, id, payload, first[id])
			}
		}
	}
}

// idsOf maps each msg_id of msgs to its payload (without the id), failing
// if a payload is repeated or two payloads share an id, or if there are
// not want of them.
func idsOf(t *testing.T, msgs []published, want int) map[string]string {
	t.Helper()
	ids := map[string]string{}
	seen := map[string]bool{}
	for _, p := range msgs {
		body := strings.Replace(p.payload, `,"msg_id":"`+p.id+`"`, "", 1)
		if seen[body] {
			t.Fatalf("result %s published twice", body)
		}
		seen[body] = true
		// The id is the write-ahead sink's: RecordID of the sink's UID
		// and the result's line, in every version.
		if want := operators.RecordID("wal/sink-1-windows", body); p.id != want {
			t.Fatalf("result %s has msg_id %s, want RecordID(sink UID, line) = %s", body, p.id, want)
		}
		if prev, dup := ids[p.id]; dup {
			t.Fatalf("results %s and %s share msg_id %s", prev, body, p.id)
		}
		ids[p.id] = body
	}
	if len(ids) != want {
		t.Fatalf("%d results, want %d: %v", len(ids), want, ids)
	}
	return ids
}
