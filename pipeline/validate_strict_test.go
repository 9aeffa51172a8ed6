package pipeline

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// problemsOf parses yaml and returns its problems, one per line.
func problemsOf(t *testing.T, yaml string) []string {
	t.Helper()
	_, err := Parse([]byte(yaml))
	if err == nil {
		return nil
	}
	var ce *ConfigError
	if !errors.As(err, &ce) || ce.ExitCode() != 2 {
		t.Fatalf("err = %v, want a *ConfigError (exit 2)", err)
	}
	var got []string
	for _, p := range ce.Problems {
		got = append(got, p.Error())
	}
	return got
}

func wantProblems(t *testing.T, yaml string, want ...string) {
	t.Helper()
	got := problemsOf(t, yaml)
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestParallelismAboveMaxParallelism(t *testing.T) {
	wantProblems(t, strings.Replace(goodPipeline, "key: id", "key: id\n    parallelism: 129", 1),
		`pipelines[0].parallelism: (129) must not exceed the max parallelism (128, the number of key groups)`)
	wantProblems(t, strings.Replace(goodPipeline, "key: id", "key: id\n    parallelism: 128", 1))
}

const mqttSourcePipeline = `
pipelines:
  - name: p
    source:
      mqtt:
        topics: [s/+]
        format: json
        fields: {id: string, temp: float}
    key: id
    window:
      type: tumbling
      size: 10s
      aggregates: [{name: n, fn: count}, {name: avg_temp, fn: avg, field: temp}]
    sinks: [{mqtt: {topic: "agg/{id}"}}]
`

func TestMQTTSourceQoS(t *testing.T) {
	cfg, err := Parse([]byte(mqttSourcePipeline))
	if err != nil {
		t.Fatal(err)
	}
	if q := cfg.Pipelines[0].Source.MQTT.QoS; q != 1 {
		t.Errorf("default qos = %d, want 1", q)
	}
	cfg, err = Parse([]byte(strings.Replace(mqttSourcePipeline, "format: json", "qos: 2\n        format: json", 1)))
	if err != nil || cfg.Pipelines[0].Source.MQTT.QoS != 2 {
		t.Errorf("qos 2: %v", err)
	}
	// QoS 0 used to become QoS 1 silently; the ingest path acknowledges a
	// message once it is durable, which QoS 0 cannot express.
	wantProblems(t, strings.Replace(mqttSourcePipeline, "format: json", "qos: 0\n        format: json", 1),
		`pipelines[0].source.mqtt.qos: (0) is not supported: a message is acknowledged only once the ingest log holds it, which needs QoS 1 or 2`)
	wantProblems(t, strings.Replace(mqttSourcePipeline, "format: json", "qos: 3\n        format: json", 1),
		`pipelines[0].source.mqtt.qos: (3) must be 1 or 2`)
}

func TestTopicTemplatePlaceholders(t *testing.T) {
	wantProblems(t, strings.Replace(mqttSourcePipeline, "agg/{id}", "out/{nosuch}/{avg_temp}", 1),
		`pipelines[0].sinks[0].mqtt.topic: "out/{nosuch}/{avg_temp}": {nosuch} is not a field of the window results (have id, window_start, window_end, n, avg_temp)`)
	// A pipeline without window or alerts sends its rows.
	rows := strings.Replace(strings.Replace(mqttSourcePipeline, "    key: id\n", "", 1), "    window:\n      type: tumbling\n      size: 10s\n      aggregates: [{name: n, fn: count}, {name: avg_temp, fn: avg, field: temp}]\n", "", 1)
	wantProblems(t, rows)
	wantProblems(t, strings.Replace(rows, "agg/{id}", "agg/{n}", 1),
		`pipelines[0].sinks[0].mqtt.topic: "agg/{n}": {n} is not a field of the rows (have id, temp)`)
	// With alerts too, the placeholder must be a field of both results.
	both := strings.Replace(mqttSourcePipeline, "    sinks:", "    alerts: [{name: hot, when: temp > 1, for: 1s}]\n    sinks:", 1)
	wantProblems(t, both)
	wantProblems(t, strings.Replace(both, "agg/{id}", "agg/{n}", 1),
		`pipelines[0].sinks[0].mqtt.topic: "agg/{n}": {n} is not a field of the alerts (have id, alert, since, at)`)
	wantProblems(t, strings.Replace(mqttSourcePipeline, "agg/{id}", "agg/{}", 1),
		`pipelines[0].sinks[0].mqtt.topic: "agg/{}" has an empty placeholder`)
	// Named with the other errors at once, unless the results' fields had
	// errors of their own.
	wantProblems(t, strings.Replace(strings.Replace(mqttSourcePipeline, "agg/{id}", "out/{nosuch}", 1), "  - name: p\n", "  - name: p\n    parallelism: 200\n", 1),
		`pipelines[0].parallelism: (200) must not exceed the max parallelism (128, the number of key groups)`,
		`pipelines[0].sinks[0].mqtt.topic: "out/{nosuch}": {nosuch} is not a field of the window results (have id, window_start, window_end, n, avg_temp)`)
	// The simulator fills {id} only.
	sim := "node:\n  simulator: {sensors: 2, rate: 1, topic: \"s/{sensor}\"}\n" + mqttSourcePipeline
	wantProblems(t, sim, `node.simulator.topic: "s/{sensor}": the simulator fills only {id}`)
	// A rate that is not a number, or one the simulator cannot keep (it
	// ran at 1,000 readings/s without a word), is refused.
	for _, rate := range []struct{ yaml, shown string }{
		{"0", "0"}, {"-1", "-1"}, {"1e300", "1e+300"}, {"1000001", "1.000001e+06"},
	} {
		sim := "node:\n  simulator: {sensors: 2, rate: " + rate.yaml + ", topic: \"s/{id}\"}\n" + mqttSourcePipeline
		wantProblems(t, sim, "node.simulator.rate: ("+rate.shown+") must be a number above 0 and at most 1000000 readings/s")
	}
	wantProblems(t, "node:\n  simulator: {sensors: 2, rate: 1000000, topic: \"s/{id}\"}\n"+mqttSourcePipeline)
}

func TestNodeAddresses(t *testing.T) {
	wantProblems(t, "node:\n  broker: nohost:notaport:1\n  listen: 127.0.0.1:http-alt\n"+goodPipeline,
		`node.broker: "nohost:notaport:1" must be host:port (address nohost:notaport:1: too many colons in address)`,
		`node.listen: "127.0.0.1:http-alt" must be host:port with a numeric port`)
	wantProblems(t, "node:\n  broker: 127.0.0.1:70000\n"+goodPipeline,
		`node.broker: "127.0.0.1:70000" must be host:port with a port in [0, 65535]`)
	wantProblems(t, "node:\n  broker: :1883\n  listen: '[::1]:0'\n"+goodPipeline)
}

func TestSharedCheckpointDir(t *testing.T) {
	two := `
pipelines:
  - name: a
    source: {generator: {count: 1}}
    sinks: [{stdout: {}}]
    checkpoint: {dir: data/ckp, interval: 1s}
  - name: b
    source: {generator: {count: 1}}
    sinks: [{stdout: {}}]
    checkpoint: {dir: ./data/x/../ckp/, interval: 1s}
`
	wantProblems(t, two,
		`pipelines[1].checkpoint.dir: "./data/x/../ckp/" is also the checkpoint dir of pipelines[0] ("a"): each pipeline needs its own (retention would delete the other's checkpoints)`)
	wantProblems(t, strings.Replace(two, "./data/x/../ckp/", "data/ckp/b", 1))
}

// An MQTT sink's qos 0 is kept (it used to become 1); the subscriber's
// window settings reach the config and are checked against each other.
func TestMQTTSinkQoSAndRedeliverySettings(t *testing.T) {
	cfg, err := Parse([]byte(mqttSourcePipeline))
	if err != nil {
		t.Fatal(err)
	}
	if q := cfg.Pipelines[0].Sinks[0].MQTT.QoS; q != 1 {
		t.Errorf("default sink qos = %d, want 1", q)
	}
	cfg, err = Parse([]byte(strings.Replace(mqttSourcePipeline, `topic: "agg/{id}"`, `topic: "agg/{id}", qos: 0`, 1)))
	if err != nil || cfg.Pipelines[0].Sinks[0].MQTT.QoS != 0 {
		t.Fatalf("sink qos 0: %v", err)
	}
	cfg, err = Parse([]byte(strings.Replace(mqttSourcePipeline, "format: json", "max_pending: 100\n        redelivery_window: 4096\n        format: json", 1)))
	if err != nil || cfg.Pipelines[0].Source.MQTT.MaxPending != 100 || cfg.Pipelines[0].Source.MQTT.RedeliveryWindow != 4096 {
		t.Fatalf("subscriber settings: %v", err)
	}
	wantProblems(t, strings.Replace(mqttSourcePipeline, "format: json", "redelivery_window: 1000\n        format: json", 1),
		`pipelines[0].source.mqtt.redelivery_window: (1000) must exceed twice max_pending (1024) and stay below 65536`)
}

// source.mqtt.ack_delay: unset is the subscriber's default, 0s no wait,
// a duration that wait; negative or above a second is refused.
func TestMQTTSourceAckDelay(t *testing.T) {
	for _, tc := range []struct {
		yaml string
		want time.Duration
	}{
		{"", 0},
		{"ack_delay: 0s\n        ", -1},
		{"ack_delay: 2ms\n        ", 2 * time.Millisecond},
		{"ack_delay: 1s\n        ", time.Second},
	} {
		cfg, err := Parse([]byte(strings.Replace(mqttSourcePipeline, "format: json", tc.yaml+"format: json", 1)))
		if err != nil {
			t.Fatalf("%q: %v", tc.yaml, err)
		}
		if got := cfg.Pipelines[0].Source.MQTT.SubscriberAckDelay(); got != tc.want {
			t.Errorf("%q: subscriber ack delay %v, want %v", tc.yaml, got, tc.want)
		}
	}
	for _, d := range []string{"-1ms", "1500ms"} {
		wantProblems(t, strings.Replace(mqttSourcePipeline, "format: json", "ack_delay: "+d+"\n        format: json", 1),
			`pipelines[0].source.mqtt.ack_delay: (`+mustDuration(t, d).String()+`) must be between 0s (no wait) and 1s`)
	}
}

func mustDuration(t *testing.T, s string) time.Duration {
	t.Helper()
	d, err := time.ParseDuration(s)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// source.mqtt.client chooses what reads an external broker; a value
// other than direct or paho, and direct for a WebSocket broker, are
// refused naming the key.
func TestMQTTSourceClient(t *testing.T) {
	ext := strings.Replace(mqttSourcePipeline, "topics: [s/+]", "broker: tcp://127.0.0.1:1883\n        topics: [s/+]", 1)
	for _, c := range []string{"direct", "paho"} {
		cfg, err := Parse([]byte(strings.Replace(ext, "format: json", "client: "+c+"\n        format: json", 1)))
		if err != nil || cfg.Pipelines[0].Source.MQTT.Client != c {
			t.Fatalf("client %s: %v", c, err)
		}
	}
	wantProblems(t, strings.Replace(ext, "format: json", "client: mosquitto\n        format: json", 1),
		`pipelines[0].source.mqtt.client: ("mosquitto") must be "direct" or "paho"`)
	ws := strings.Replace(ext, "tcp://", "ws://", 1)
	wantProblems(t, strings.Replace(ws, "format: json", "client: direct\n        format: json", 1),
		`pipelines[0].source.mqtt.client: (direct) does not dial "ws://127.0.0.1:1883" (WebSocket): use client: paho`)
	wsUser := strings.Replace(ext, "tcp://", "ws://edge:s3cret@", 1)
	wantProblems(t, strings.Replace(wsUser, "format: json", "client: direct\n        format: json", 1),
		`pipelines[0].source.mqtt.client: (direct) does not dial "ws://edge:xxxxx@127.0.0.1:1883" (WebSocket): use client: paho`)
	if _, err := Parse([]byte(strings.Replace(ws, "format: json", "client: paho\n        format: json", 1))); err != nil {
		t.Fatalf("paho over ws: %v", err)
	}
}

// A sink topic starting with $ would send every result to the dead-letter
// output at run time; it is refused at load.
func TestTopicTemplateDollar(t *testing.T) {
	wantProblems(t, strings.Replace(mqttSourcePipeline, `"agg/{id}"`, `"$SYS/{id}"`, 1),
		`pipelines[0].sinks[0].mqtt.topic: "$SYS/{id}" must not start with $ (topics of the broker itself)`)
}
