package pipeline

import (
	"strings"
	"testing"
)

// digestBase is the pipeline of configs/cluster-a.yaml.
const digestBase = `
pipelines:
  - name: sensors
    parallelism: 3
    source:
      mqtt:
        topics: [sensors/+/temperature]
        qos: 1
        format: json
        fields:
          id: {type: string, path: $.sensor}
          temp: {type: float, path: $.t}
          ts: {type: time, path: $.ts, unit: ms}
    event_time:
      field: ts
      max_out_of_orderness: 1s
      idle_timeout: 5s
    key: id
    window:
      type: tumbling
      size: 10s
      aggregates:
        - {name: count, fn: count}
        - {name: avg_temp, fn: avg, field: temp}
    sinks:
      - stdout: {}
      - mqtt: {topic: "agg/{id}", qos: 1}
    checkpoint:
      dir: cluster-a-data/checkpoints
      interval: 5s
      mode: exactly_once
    restart:
      strategy: fixed_delay
      attempts: 1000
      delay: 1s
`

func digestOf(t *testing.T, yaml string) string {
	t.Helper()
	cfg, err := Parse([]byte(yaml))
	if err != nil {
		t.Fatalf("%v\n%s", err, yaml)
	}
	if len(cfg.Pipelines) != 1 {
		t.Fatalf("%d pipelines", len(cfg.Pipelines))
	}
	d := cfg.Pipelines[0].SettingsDigest()
	if len(d) != 64 {
		t.Fatalf("digest %q: want 64 hex digits", d)
	}
	if p := PipelinesDigest(cfg.Pipelines); len(p) != 64 {
		t.Fatalf("pipelines digest %q: want 64 hex digits", p)
	}
	return d
}

// edit returns digestBase with old replaced by new, which must be there.
func edit(t *testing.T, old, new string) string {
	t.Helper()
	if !strings.Contains(digestBase, old) {
		t.Fatalf("%q not in the base config", old)
	}
	return strings.Replace(digestBase, old, new, 1)
}

// A setting that shapes results changes the digest; a node-local one
// (a directory, the MQTT subscription's tuning, the restart strategy)
// does not, nor does writing a default out.
func TestSettingsDigest(t *testing.T) {
	base := digestOf(t, digestBase)
	if again := digestOf(t, digestBase); again != base {
		t.Fatalf("the same config: digests %s and %s", base, again)
	}
	for _, c := range []struct{ name, old, new string }{
		{"window size", "size: 10s", "size: 20s"},
		{"window type", "type: tumbling\n      size: 10s", "type: sliding\n      size: 10s\n      slide: 5s"},
		{"aggregate", "fn: avg", "fn: max"},
		{"sink topic", `topic: "agg/{id}"`, `topic: "out/{id}"`},
		{"sink qos", `"agg/{id}", qos: 1`, `"agg/{id}", qos: 2`},
		{"sink batch", `"agg/{id}", qos: 1`, `"agg/{id}", qos: 1, batch: 10`},
		{"sinks", "      - stdout: {}\n", ""},
		{"source topic", "[sensors/+/temperature]", "[sensors/#]"},
		{"field path", "$.t}", "$.temp}"},
		{"max message bytes", "qos: 1\n        format", "qos: 1\n        max_message_bytes: 1024\n        format"},
		{"event time", "max_out_of_orderness: 1s", "max_out_of_orderness: 2s"},
		{"max ahead", "idle_timeout: 5s", "idle_timeout: 5s\n      max_ahead: 2h"},
		{"max ahead off", "idle_timeout: 5s", "idle_timeout: 5s\n      max_ahead: 0s"},
		{"key", "key: id", "key: ts_id"},
		{"filter", "key: id", "key: id\n    filter: temp > 0"},
		{"compute", "key: id", "key: id\n    compute:\n      f: temp * 1.8 + 32"},
		{"alerts", "key: id", "key: id\n    alerts:\n      - {name: hot, when: temp > 30, for: 5s}"},
		{"parallelism", "parallelism: 3", "parallelism: 2"},
		{"name", "name: sensors", "name: other"},
		{"checkpoint interval", "interval: 5s", "interval: 2s"},
		{"checkpoint mode", "exactly_once", "at_least_once"},
	} {
		yaml := edit(t, c.old, c.new)
		if c.name == "key" {
			yaml = strings.Replace(yaml, "id: {type: string", "ts_id: {type: string", 1)
			yaml = strings.Replace(yaml, `"agg/{id}"`, `"agg/{ts_id}"`, 1)
		}
		if d := digestOf(t, yaml); d == base {
			t.Errorf("%s differs: same digest", c.name)
		}
	}
	for _, c := range []struct{ name, old, new string }{
		{"checkpoint dir", "cluster-a-data/checkpoints", "/var/lib/edged/b/checkpoints"},
		{"checkpoint retain", "mode: exactly_once", "mode: exactly_once\n      retain: 5"},
		{"checkpoint timeout", "mode: exactly_once", "mode: exactly_once\n      timeout: 30s"},
		{"restart", "attempts: 1000", "attempts: 10"},
		{"client id", "qos: 1\n        format", "qos: 1\n        client_id: node-b\n        format"},
		{"source qos", "qos: 1\n        format", "qos: 2\n        format"},
		{"state dir", "    restart:", "    state_backend: bolt\n    state_dir: /var/lib/edged/b/state\n    restart:"},
		{"default written out", "qos: 1\n        format", "qos: 1\n        max_message_bytes: 8388608\n        format"},
		{"max ahead written out", "idle_timeout: 5s", "idle_timeout: 5s\n      max_ahead: 1h"},
		{"ingest log bound", "qos: 1\n        format", "qos: 1\n        log_max_bytes: 67108864\n        format"},
	} {
		if d := digestOf(t, edit(t, c.old, c.new)); d != base {
			t.Errorf("%s differs only: digest %s, want %s", c.name, d, base)
		}
	}
}

// The pipelines' digest does not depend on their order in the config.
func TestPipelinesDigestOrder(t *testing.T) {
	two := func(first, second string) string {
		cfg, err := Parse([]byte(`
pipelines:
  - name: ` + first + `
    source: {generator: {count: 10}}
    sinks: [{stdout: {}}]
  - name: ` + second + `
    source: {generator: {count: 10}}
    sinks: [{stdout: {}}]
`))
		if err != nil {
			t.Fatal(err)
		}
		return PipelinesDigest(cfg.Pipelines)
	}
	if two("a", "b") != two("b", "a") {
		t.Fatal("the same pipelines in another order: digests differ")
	}
	if two("a", "b") == two("a", "c") {
		t.Fatal("other pipelines: the same digest")
	}
}
