package pipeline

import (
	"context"
	"encoding/json"
	"fmt"
	"github.com/edgedio/edged/mqtt/ingestlog"
	"strings"
	"testing"

	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/stream"
)

// batchedPipeline is walPipeline with every result on agg/all, the MQTT
// sink packing them batch to a message; interval "" means no checkpoints
// (the at-least-once sink).
func batchedPipeline(parallelism, batch int, checkpointDir, interval string) string {
	yml := strings.Replace(walPipeline(parallelism, checkpointDir, interval),
		`- mqtt: {topic: "agg/{id}"}`, fmt.Sprintf(`- mqtt: {topic: "agg/all", batch: %d}`, batch), 1)
	if interval == "" {
		yml = strings.Replace(yml, fmt.Sprintf("    checkpoint: {dir: %s, interval: }\n", checkpointDir), "", 1)
	}
	return yml
}

// appendSeconds appends one reading of each of sensors sensors at 0 s,
// 1 s, ... up to seconds-1 s.
func (h *mqttHarness) appendSeconds(sensors, seconds int) {
	h.t.Helper()
	for s := range seconds {
		for k := range sensors {
			h.append(reading(fmt.Sprintf("s%d", k), int64(s)*1000))
		}
	}
}

// resultElements returns the results in msgs: the elements of their JSON
// arrays (or the message, when it is not one), each as its line without
// the msg_id and its msg_id ("" for none). It fails on a message of more
// than max elements, and on an element without a msg_id when needID.
func resultElements(t *testing.T, msgs []published, max int, needID bool) (lines, ids []string) {
	t.Helper()
	for _, m := range msgs {
		raws := []json.RawMessage{json.RawMessage(m.payload)}
		if strings.HasPrefix(m.payload, "[") {
			raws = nil
			if err := json.Unmarshal([]byte(m.payload), &raws); err != nil {
				t.Fatalf("payload %q: %v", m.payload, err)
			}
		}
		if len(raws) > max {
			t.Fatalf("a message of %d results, batch is %d: %s", len(raws), max, m.payload)
		}
		for _, raw := range raws {
			var v struct {
				MsgID string `json:"msg_id"`
			}
			if err := json.Unmarshal(raw, &v); err != nil || needID && v.MsgID == "" {
				t.Fatalf("element %s: no msg_id (%v)", raw, err)
			}
			lines = append(lines, strings.Replace(string(raw), `,"msg_id":"`+v.MsgID+`"`, "", 1))
			ids = append(ids, v.MsgID)
		}
	}
	return lines, ids
}

// The write-ahead MQTT sink with batch: the results of several keys on
// one topic arrive as arrays of at most batch results, each element with
// the id an unbatched sink gives the same result (RecordID of the sink's
// UID and the line); a savepoint's results published again after a
// restore, batched otherwise or not at all, carry the same ids. Dead
// letters still go one per message.
func TestMQTTWriteAheadBatched(t *testing.T) {
	contend(t)
	h := newMQTTHarness(t)
	dir := t.TempDir()
	pc := parsePipeline(t, batchedPipeline(2, 3, dir, "1h"))
	if pc.Sinks[1].MQTT.Batch != 3 {
		t.Fatalf("batch %d, want 3", pc.Sinks[1].MQTT.Batch)
	}
	job, _, _ := h.start(pc)
	// A savepoint before any result: the run's first checkpoint is then
	// not brought forward by the sink's first result (snapshot.OutputHeld),
	// so every result waits for the savepoint below.
	if _, err := job.TriggerSavepoint(context.Background(), ""); err != nil {
		t.Fatal(err)
	}
	const sensors = 8
	h.appendSeconds(sensors, 4)
	h.append("not json")
	h.append("nor this")
	// The watermark (3s-2ms) closes [0,1s) and [1s,2s).
	const want = sensors * 2
	testutil.Eventually(t, waitFor, "the window results and dead letters at the sink", func() bool {
		return sinkRecords(job, "wal/sink-1-windows") >= want && sinkRecords(job, "wal/sink-1-dead-letter") >= 2 || isDone(job)
	})
	sp, err := job.TriggerSavepoint(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	countElements := func() int {
		n := 0
		for _, m := range h.published("agg/") {
			if strings.HasPrefix(m.payload, "[") {
				n += strings.Count(m.payload, `"msg_id"`)
			}
		}
		return n
	}
	testutil.Eventually(t, waitFor, "the results and dead letters published", func() bool {
		return countElements() >= want && len(h.published("deadletter/")) >= 2 || isDone(job)
	})
	if isDone(job) {
		t.Fatalf("job ended: %v", job.Wait())
	}
	h.cancelJob(job)
	h.sync()
	for _, d := range h.published("deadletter/") {
		if !strings.HasPrefix(d.payload, "{") || d.id == "" {
			t.Fatalf("dead letter %q: want one object with a msg_id", d.payload)
		}
	}
	msgs := h.published("agg/")
	// Two subtasks, each with its own results: at least ⌈16/3⌉ messages.
	if len(msgs) < (want+2)/3 || len(msgs) >= want {
		t.Fatalf("%d messages for %d results with batch 3", len(msgs), want)
	}
	lines, ids := resultElements(t, msgs, 3, true)
	first := map[string]string{}
	for i, l := range lines {
		if ids[i] != operators.RecordID("wal/sink-1-windows", l) {
			t.Fatalf("result %s has msg_id %s, want the unbatched id RecordID(sink UID, line)", l, ids[i])
		}
		if _, dup := first[ids[i]]; dup {
			t.Fatalf("msg_id %s twice", ids[i])
		}
		first[ids[i]] = l
	}
	if len(first) != want {
		t.Fatalf("%d results, want %d", len(first), want)
	}

	for _, batch := range []int{5, 0} {
		h.reset()
		rc := parsePipeline(t, batchedPipeline(1, batch, dir, "1h"))
		rjob, _, _ := h.start(rc, stream.WithSavepoint(sp, false))
		max := max(batch, 1)
		testutil.Eventually(t, waitFor, fmt.Sprintf("the results re-published with batch %d", batch), func() bool {
			_, ids := resultElements(t, h.published("agg/"), max, true)
			return len(ids) >= want || isDone(rjob)
		})
		if isDone(rjob) {
			t.Fatalf("batch %d: job ended: %v", batch, rjob.Wait())
		}
		h.cancelJob(rjob)
		h.sync()
		lines, ids := resultElements(t, h.published("agg/"), max, true)
		if len(ids) != want {
			t.Fatalf("batch %d: %d results re-published, want %d", batch, len(ids), want)
		}
		for i, id := range ids {
			if first[id] != lines[i] {
				t.Fatalf("batch %d: msg_id %s is %s, in the first run %q", batch, id, lines[i], first[id])
			}
		}
	}
}

// The at-least-once MQTT sink (no checkpoints) with batch: the results
// of a firing go out as arrays once the task is idle, without waiting
// for more results.
func TestMQTTPlainSinkBatched(t *testing.T) {
	h := newMQTTHarness(t)
	pc := parsePipeline(t, batchedPipeline(1, 4, "", ""))
	if pc.Checkpoint.Interval != 0 {
		t.Fatalf("checkpoint interval %v, want none", pc.Checkpoint.Interval)
	}
	job, _, _ := h.start(pc)
	const sensors = 6
	h.appendSeconds(sensors, 3)
	// The watermark (2s-2ms) closes [0,1s): 6 results, in arrays of at
	// most 4; the job then goes idle with no more input.
	testutil.Eventually(t, waitFor, "the results published", func() bool {
		_, ids := resultElements(t, h.published("agg/"), 4, false)
		return len(ids) >= sensors || isDone(job)
	})
	if isDone(job) {
		t.Fatalf("job ended: %v", job.Wait())
	}
	msgs := h.published("agg/")
	if len(msgs) < 2 {
		t.Fatalf("%d messages for %d results with batch 4", len(msgs), sensors)
	}
	for _, m := range msgs {
		if !strings.HasPrefix(m.payload, "[") {
			t.Fatalf("payload %q is not an array", m.payload)
		}
	}
}

// batch, batch_bytes and max_held out of range are refused, naming the
// key.
func TestMQTTSinkBatchValidation(t *testing.T) {
	parse := func(sink string) error { return parseWithSink(`{generator: {count: 10}}`, sink) }
	for _, c := range []struct{ sink, key string }{
		{`{topic: "agg/all", batch: -1}`, "sinks[0].mqtt.batch"},
		{`{topic: "agg/all", batch: 10001}`, "sinks[0].mqtt.batch"},
		{`{topic: "agg/all", batch: 10, batch_bytes: -1}`, "sinks[0].mqtt.batch_bytes"},
		{`{topic: "agg/all", batch_bytes: 4096}`, "sinks[0].mqtt.batch_bytes"},
		{`{topic: "agg/all", max_held: -1}`, "sinks[0].mqtt.max_held: (-1) must not be negative (0 sets no bound)"},
	} {
		if err := parse(c.sink); err == nil || !strings.Contains(err.Error(), c.key) {
			t.Errorf("%s: %v, want an error naming %s", c.sink, err, c.key)
		}
	}
	for _, sink := range []string{`{topic: "agg/all", batch: 10000, batch_bytes: 65536}`, `{topic: "agg/all", batch: 1}`, `{topic: "agg/all", max_held: 0}`} {
		if err := parse(sink); err != nil {
			t.Errorf("%s: %v", sink, err)
		}
	}
}

// A batched sink whose messages may not fit the embedded broker's bound on
// packets is refused when the config is read, naming the largest
// batch_bytes that fits: the broker would close the sink's connection at
// the first full message, and the job would fail on it after every
// restart.
func TestMQTTSinkBatchBytesFitTheEmbeddedBroker(t *testing.T) {
	parse := func(maxMessage, sink string) error {
		return parseWithSink(`{mqtt: {topics: [s/+], format: json, max_message_bytes: `+maxMessage+`, fields: {id: {type: string, path: $.id}}}}`, sink)
	}
	// 64 KiB packets: the default 256 KiB does not fit, 32 KiB does.
	err := parse("65536", `{topic: "agg/all", batch: 500}`)
	if err == nil || !strings.Contains(err.Error(), "sinks[0].mqtt.batch_bytes") || !strings.Contains(err.Error(), "at most 61433") {
		t.Fatalf("default batch_bytes over 64 KiB packets: %v", err)
	}
	if err := parse("65536", `{topic: "agg/all", batch: 500, batch_bytes: 32768}`); err != nil {
		t.Fatal(err)
	}
	// Unbatched sinks are not concerned; the default 8 MiB packets take
	// the default batch_bytes.
	if err := parse("65536", `{topic: "agg/all"}`); err != nil {
		t.Fatal(err)
	}
	if err := parse("0", `{topic: "agg/all", batch: 500}`); err != nil {
		t.Fatal(err)
	}
}

// parseWithSink parses a one-pipeline config counting windows of source
// (a YAML flow mapping) into the MQTT sink sink (another).
func parseWithSink(source, sink string) error {
	_, err := Parse([]byte(`
pipelines:
  - name: v
    source: ` + source + `
    key: id
    window: {type: tumbling, size: 1s, aggregates: [{name: n, fn: count}]}
    sinks:
      - mqtt: ` + sink + `
`))
	return err
}

// source.mqtt.log_max_bytes bounds the ingest log, its segments a quarter
// of it; a bound that would not hold four of the largest messages is
// refused when the config is read.
func TestMQTTSourceLogMaxBytes(t *testing.T) {
	parse := func(src string) (*Config, error) {
		return Parse([]byte(`
pipelines:
  - name: p
    source:
      mqtt: ` + src + `
    sinks: [{stdout: {}}]
`))
	}
	cfg, err := parse(`{topics: [s/+], format: json, log_max_bytes: 67108864, fields: {id: {type: string, path: $.id}}}`)
	if err != nil {
		t.Fatal(err)
	}
	if o := cfg.Pipelines[0].Source.MQTT.LogOptions(); o.MaxBytes != 64<<20 || o.SegmentBytes != 16<<20 {
		t.Fatalf("log options %+v, want a 64 MiB bound in 16 MiB segments", o)
	}
	if o := (&MQTTSourceConfig{}).LogOptions(); o != ingestlog.DefaultOptions() {
		t.Fatalf("default log options %+v", o)
	}
	for _, src := range []string{
		`{topics: [s/+], format: json, log_max_bytes: 1048576, fields: {id: {type: string, path: $.id}}}`,
		`{topics: [s/+], format: json, log_max_bytes: 16777216, fields: {id: {type: string, path: $.id}}}`,
		`{topics: [s/+], format: json, log_max_bytes: -1, fields: {id: {type: string, path: $.id}}}`,
	} {
		if _, err := parse(src); err == nil || !strings.Contains(err.Error(), "log_max_bytes") {
			t.Fatalf("%s: %v, want a log_max_bytes error", src, err)
		}
	}
	if _, err := parse(`{topics: [s/+], format: json, max_message_bytes: 1048576, log_max_bytes: 4194304, fields: {id: {type: string, path: $.id}}}`); err != nil {
		t.Fatal(err)
	}
}
