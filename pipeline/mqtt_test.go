package pipeline

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/mqtt"
	"github.com/edgedio/edged/mqtt/ingestlog"
	"github.com/edgedio/edged/stream"
)

const mqttPipeline = `
pipelines:
  - name: devices
    source:
      mqtt:
        topics: [sensors/+/temperature]
        format: json
        fields:
          id: {type: string, path: $.sensor}
          temp: {type: float, path: $.t}
          ts: {type: time, path: $.ts, unit: s}
    event_time: {field: ts, max_out_of_orderness: 1s}
    key: id
    window:
      type: tumbling
      size: 10s
      aggregates: [{name: n, fn: count, field: temp}]
    sinks:
      - mqtt: {topic: "agg/{id}"}
`

// Devices publish JSON readings to the embedded broker; each QoS 1 message
// is in the pipeline's ingest log before its PUBACK; the pipeline counts
// them in 10 s windows and publishes the results to agg/<sensor>, where a
// subscriber gets them. A malformed payload goes to deadletter/devices.
func TestMQTTPipelineEndToEnd(t *testing.T) {
	pc, log, url := startMQTTPipelineBroker(t)

	// The subscriber of the results and of the dead letters.
	var mu sync.Mutex
	got := map[string]map[int64]int64{} // sensor -> window start -> count
	var dead []string
	sub := connectMQTT(t, url, "checker")
	defer sub.Disconnect(100)
	tok := sub.Subscribe("#", 1, func(_ paho.Client, m paho.Message) {
		mu.Lock()
		defer mu.Unlock()
		if bytes.HasPrefix([]byte(m.Topic()), []byte("deadletter/")) {
			dead = append(dead, string(m.Payload()))
			return
		}
		if !bytes.HasPrefix([]byte(m.Topic()), []byte("agg/")) {
			return
		}
		var r struct {
			ID          string `json:"id"`
			WindowStart int64  `json:"window_start"`
			N           int64  `json:"n"`
		}
		if err := json.Unmarshal(m.Payload(), &r); err != nil {
			t.Errorf("result %s: %v", m.Payload(), err)
			return
		}
		if got[r.ID] == nil {
			got[r.ID] = map[int64]int64{}
		}
		got[r.ID][r.WindowStart] = r.N
	})
	if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}

	var out bytes.Buffer
	_, stop := runMQTTJob(t, pc, log, url, 0, &out)
	defer stop()

	// Two sensors, one reading per second for 25 s of event time: windows
	// [0,10) and [10,20) complete once a reading at 21 s or later moves the
	// watermark past 20 s.
	dev := connectMQTT(t, url, "device")
	defer dev.Disconnect(100)
	for s := 0; s < 25; s++ {
		for _, id := range []string{"a", "b"} {
			p := fmt.Sprintf(`{"sensor":%q,"t":%d.5,"ts":%d}`, id, 20+s%5, s)
			if tok := dev.Publish("sensors/"+id+"/temperature", 1, false, p); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
				t.Fatalf("publish: %v", tok.Error())
			}
		}
	}
	// The same malformed payload three times: three dead letters, each
	// naming its message's ingest-log offset, so that they differ (and
	// so do their msg_ids through a write-ahead sink).
	for range 3 {
		if tok := dev.Publish("sensors/a/temperature", 1, false, "not json"); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
			t.Fatalf("publish: %v", tok.Error())
		}
	}
	// Keep time moving until the results are in: readings keep coming
	// (with timestamps far ahead) only to advance the watermark.
	deadline := time.Now().Add(30 * time.Second)
	for {
		mu.Lock()
		done := len(got["a"]) >= 2 && len(got["b"]) >= 2 && len(dead) >= 3
		mu.Unlock()
		if done {
			break
		}
		if time.Now().After(deadline) {
			mu.Lock()
			defer mu.Unlock()
			t.Fatalf("results %v, dead letters %v; stdout %q", got, dead, out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, id := range []string{"a", "b"} {
		if got[id][0] != 10 || got[id][10000] != 10 {
			t.Fatalf("sensor %s: windows %v, want 10 readings in [0,10s) and [10s,20s)", id, got[id])
		}
	}
	distinct := map[string]bool{}
	for _, d := range dead {
		if !bytes.Contains([]byte(d), []byte("topic sensors/a/temperature, ingest-log offset ")) {
			t.Fatalf("dead letter %s does not say where it came from", d)
		}
		distinct[d] = true
	}
	if len(dead) != 3 || len(distinct) != 3 {
		t.Fatalf("dead letters %q, want three different ones", dead)
	}
}

// EnvOptionsOrDie returns the pipeline's environment options.
func EnvOptionsOrDie(t *testing.T, pc PipelineConfig) []stream.Option {
	t.Helper()
	opts, err := EnvOptions(pc)
	if err != nil {
		t.Fatal(err)
	}
	return opts
}

// A result larger than the broker takes is a dead letter: published, the
// broker would refuse it and the job would fail at every restart.
func TestMQTTSinkResultTooLargeIsDeadLetter(t *testing.T) {
	cfg, err := Parse([]byte(`
pipelines:
  - name: rows
    source:
      mqtt:
        topics: [doors/+]
        format: json
        fields:
          id: {type: string, path: $.id}
          note: {type: string, path: $.note}
    sinks:
      - mqtt: {topic: "out/{id}"}
`))
	if err != nil {
		t.Fatal(err)
	}
	pc := cfg.Pipelines[0]
	const limit = 4096
	log, url := startPipelineBroker(t, pc, 1<<20)
	var mu sync.Mutex
	var outs []string
	sub := connectMQTT(t, url, "checker")
	defer sub.Disconnect(100)
	if tok := sub.SubscribeMultiple(map[string]byte{"out/#": 1, "deadletter/#": 1}, func(_ paho.Client, m paho.Message) {
		mu.Lock()
		outs = append(outs, m.Topic())
		mu.Unlock()
	}); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	job, stop := runMQTTJob(t, pc, log, url, limit, io.Discard)
	defer stop()
	dev := connectMQTT(t, url, "device")
	defer dev.Disconnect(100)
	for _, p := range []string{`{"id":"small","note":"x"}`, fmt.Sprintf(`{"id":"big","note":%q}`, bytes.Repeat([]byte("n"), limit)), `{"id":"after","note":"y"}`} {
		if tok := dev.Publish("doors/d", 1, false, p); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
			t.Fatalf("publish: %v", tok.Error())
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		mu.Lock()
		n := len(outs)
		mu.Unlock()
		if n >= 3 && job.DeadLetters() == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("published to %v, %d dead letters", outs, job.DeadLetters())
		}
		time.Sleep(10 * time.Millisecond)
	}
	d := job.RecentDeadLetters()[0]
	if !strings.Contains(d.Err, "result too large") || !strings.Contains(d.Payload, `"id":"big"`) {
		t.Fatalf("dead letter %+v", d)
	}
	mu.Lock()
	defer mu.Unlock()
	want := map[string]bool{"out/small": true, "out/after": true, "deadletter/rows": true}
	for _, topic := range outs {
		if !want[topic] {
			t.Fatalf("published to %v: the big result went out", outs)
		}
	}
}

// startMQTTPipelineBroker parses mqttPipeline and starts the embedded
// broker of its pipeline (startPipelineBroker).
func startMQTTPipelineBroker(t *testing.T) (PipelineConfig, *ingestlog.Log, string) {
	t.Helper()
	cfg, err := Parse([]byte(mqttPipeline))
	if err != nil {
		t.Fatal(err)
	}
	pc := cfg.Pipelines[0]
	log, url := startPipelineBroker(t, pc, 0)
	return pc, log, url
}

// connectMQTT connects a paho client named id to the broker at url.
func connectMQTT(t *testing.T, url, id string) paho.Client {
	t.Helper()
	c := paho.NewClient(paho.NewClientOptions().AddBroker(url).SetClientID(id).
		SetDefaultPublishHandler(func(paho.Client, paho.Message) {}))
	if tok := c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("%s connect: %v", id, tok.Error())
	}
	return c
}

// runMQTTJob builds pc's job on the embedded broker at url, whose ingest
// log is log and whose packets are at most maxMessage bytes (0: the
// default), its stdout sinks writing to out, and starts it; stop cancels
// it and waits for it to end.
func runMQTTJob(t *testing.T, pc PipelineConfig, log *ingestlog.Log, url string, maxMessage int64, out io.Writer) (job *Job, stop func()) {
	t.Helper()
	env := stream.NewEnvironment(pc.Name, EnvOptionsOrDie(t, pc)...)
	job, err := BuildJobWith(pc, env, out, Inputs{
		MQTTLog:               func(string) (*ingestlog.Log, error) { return log, nil },
		Broker:                url,
		BrokerMaxMessageBytes: maxMessage,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	run, err := env.ExecuteAsync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return job, func() {
		cancel()
		run.Wait()
	}
}

// startPipelineBroker starts an embedded broker (packets of at most
// maxMessage bytes; 0 for the default) whose messages on pc's topics go
// to a new ingest log; it returns the log and the broker's URL. Both close
// when the test ends.
func startPipelineBroker(t *testing.T, pc PipelineConfig, maxMessage int64) (*ingestlog.Log, string) {
	t.Helper()
	log, err := ingestlog.Open(t.TempDir(), ingestlog.DefaultOptions(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { log.Close() })
	br, err := mqtt.NewBroker(mqtt.BrokerConfig{Address: "127.0.0.1:0", Filters: []string{"#"}, MaxMessageBytes: maxMessage}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := br.AddRoute(pc.Source.MQTT.Topics, log); err != nil {
		t.Fatal(err)
	}
	if err := br.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { br.Close() })
	return log, "tcp://" + br.Addr()
}

// A device that sends the same reading twice after its window closed
// gives two late dead letters. Like the dead letters of malformed
// payloads, each must name its message's topic and ingest-log offset, so
// that the two differ: a write-ahead sink's msg_id is a function of the
// dead letter's line, and a consumer that drops repeated msg_ids (the
// README's exactly-once consumer) would otherwise see one of them and
// lose the other, though the window would have counted both.
func TestMQTTLateDeadLettersOfEqualReadingsDiffer(t *testing.T) {
	perEventWatermarks = true
	defer func() { perEventWatermarks = false }()
	pc, log, url := startMQTTPipelineBroker(t)

	var mu sync.Mutex
	var dead []string
	results := 0
	sub := connectMQTT(t, url, "checker")
	defer sub.Disconnect(100)
	tok := sub.Subscribe("#", 1, func(_ paho.Client, m paho.Message) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case strings.HasPrefix(m.Topic(), "deadletter/"):
			dead = append(dead, string(m.Payload()))
		case strings.HasPrefix(m.Topic(), "agg/"):
			results++
		}
	})
	if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}

	_, stop := runMQTTJob(t, pc, log, url, 0, io.Discard)
	defer stop()

	dev := connectMQTT(t, url, "device")
	defer dev.Disconnect(100)
	publish := func(p string) {
		t.Helper()
		if tok := dev.Publish("sensors/a/temperature", 1, false, p); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
			t.Fatalf("publish: %v", tok.Error())
		}
	}
	// Readings at 0..12 s: the watermark passes 10 s and [0,10) fires.
	for s := 0; s <= 12; s++ {
		publish(fmt.Sprintf(`{"sensor":"a","t":20.5,"ts":%d}`, s))
	}
	testutil.Eventually(t, 30*time.Second, "the result of window [0,10)", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return results >= 1
	})
	// The same reading of [0,10) twice: both late.
	publish(`{"sensor":"a","t":21.5,"ts":3}`)
	publish(`{"sensor":"a","t":21.5,"ts":3}`)
	testutil.Eventually(t, 30*time.Second, "two late dead letters", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(dead) >= 2
	})
	mu.Lock()
	defer mu.Unlock()
	for _, d := range dead {
		if !strings.Contains(d, "late") {
			t.Fatalf("dead letter %s, want a late one", d)
		}
		if !strings.Contains(d, "topic sensors/a/temperature, ingest-log offset ") {
			t.Errorf("late dead letter %s does not say which message it was", d)
		}
	}
	if dead[0] == dead[1] {
		t.Errorf("the late dead letters of two messages are one line (so one msg_id through a write-ahead sink): %s", dead[0])
	}
}
