package pipeline

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestShippedConfigsLoad(t *testing.T) {
	files, err := filepath.Glob("../configs/*.yaml")
	if err != nil || len(files) < 4 {
		t.Fatalf("configs: %v %v", files, err)
	}
	for _, f := range files {
		cfg, err := Load(f)
		if err != nil {
			t.Errorf("%s: %v", f, err)
			continue
		}
		for _, p := range cfg.Pipelines {
			if p.plan == nil {
				t.Errorf("%s: pipeline %s not compiled", f, p.Name)
			}
		}
	}
}

const goodPipeline = `
pipelines:
  - name: p
    source:
      generator: {count: 10}
    event_time: {field: ts}
    key: id
    window:
      type: tumbling
      size: 10s
      aggregates: [{name: n, fn: count}]
    sinks: [{stdout: {}}]
`

func TestBadConfigs(t *testing.T) {
	tests := []struct {
		name string
		edit func(string) string
		want []string // every problem, in order
	}{
		{"bad duration", func(s string) string { return strings.Replace(s, "size: 10s", `size: "1x"`, 1) },
			[]string{`pipelines[0].window.size: "1x" is not a duration`}},
		{"unknown keys", func(s string) string {
			return strings.Replace(strings.Replace(s, "key: id", "key: id\n    colour: red", 1), "type: tumbling", "type: tumbling\n      sise: 1s", 1)
		}, []string{`pipelines[0].colour: unknown key (known here: alerts, checkpoint, compute, event_time, filter, key, name, parallelism, restart, silent, sinks, source, state_backend, state_dir, window)`, `pipelines[0].window.sise: unknown key; did you mean "size"?`}},
		// A misspelt key was named without the key it stands for.
		{"misspelt keys", func(s string) string {
			return strings.Replace(strings.Replace(s, "key: id", "Key: id", 1), "generator: {count: 10}", "generater: {count: 10}", 1)
		}, []string{`pipelines[0].source.generater: unknown key; did you mean "generator"?`, `pipelines[0].Key: unknown key; did you mean "key"?`, `pipelines[0].source: must have exactly one of generator, file, mqtt`, `pipelines[0].key: is required with window, alerts or silent`}},
		{"wrong types", func(s string) string { return strings.Replace(s, "count: 10", "count: ten", 1) },
			[]string{`pipelines[0].source.generator.count: "ten" is not an integer`}},
		{"unknown field and fn", func(s string) string {
			return strings.Replace(s, "{name: n, fn: count}", "{name: n, fn: median, field: temp}, {name: m, fn: avg, field: humidity}", 1)
		}, []string{
			`pipelines[0].window.aggregates[0].fn: "median" must be count, sum, avg, min, max, first or last`,
			`pipelines[0].window.aggregates[1].field: "humidity" is not a field (have id, temp, ts)`,
		}},
		{"key type", func(s string) string { return strings.Replace(s, "key: id", "key: temp", 1) },
			[]string{`pipelines[0].key: field "temp" is a float, want string`}},
		{"bad expression", func(s string) string { return strings.Replace(s, "key: id", "key: id\n    filter: temp +", 1) },
			[]string{`pipelines[0].filter: "temp +": unexpected token EOF (1:6)`}},
		{"filter not bool", func(s string) string { return strings.Replace(s, "key: id", "key: id\n    filter: temp + 1", 1) },
			[]string{`pipelines[0].filter: "temp + 1": expected bool, but got float64`}},
		// The fields of a source that is not valid are not known: they are
		// not named as missing too.
		{"two sources and no sink", func(s string) string {
			return strings.Replace(strings.Replace(s, "generator: {count: 10}", "generator: {count: 10}\n      file: {path: x, format: json, fields: {a: int}}", 1), "sinks: [{stdout: {}}]", "sinks: []", 1)
		}, []string{`pipelines[0].source: must have exactly one of generator, file, mqtt`, `pipelines[0].sinks: at least one sink is required`}},
		{"checkpoint and restart", func(s string) string {
			return s + "    checkpoint: {interval: 5s, min_pause: 10s, mode: twice}\n    restart: {strategy: sometimes}\n    state_backend: bolt\n"
		}, []string{
			`pipelines[0].checkpoint.mode: "twice" must be exactly_once or at_least_once`,
			`pipelines[0].checkpoint.interval: (5s) must exceed checkpoint.min_pause (10s)`,
			`pipelines[0].checkpoint.dir: must be set when checkpoint.interval is set`,
			`pipelines[0].restart.strategy: ("sometimes") must be none, fixed_delay, failure_rate or exponential_delay`,
			`pipelines[0].state_dir: is required with state_backend bolt`,
		}},
		{"restart keys of another strategy", func(s string) string {
			return s + "    restart: {delay: 5s, attempts: 10}\n"
		}, []string{
			`pipelines[0].restart.attempts: is not a setting of restart strategy exponential_delay (the default): set restart.strategy to the strategy it belongs to`,
			`pipelines[0].restart.delay: is not a setting of restart strategy exponential_delay (the default): set restart.strategy to the strategy it belongs to`,
		}},
		{"restart keys of exponential_delay with fixed_delay", func(s string) string {
			return s + "    restart: {strategy: fixed_delay, attempts: 5, max_delay: 5m}\n"
		}, []string{
			`pipelines[0].restart.max_delay: is not a setting of restart strategy fixed_delay: set restart.strategy to the strategy it belongs to`,
		}},
		{"checkpoint semantics", func(s string) string {
			return s + "    checkpoint: {interval: 5s, min_pause: 10s}\n    state_backend: bolt\n"
		}, []string{
			`pipelines[0].checkpoint.interval: (5s) must exceed checkpoint.min_pause (10s)`,
			`pipelines[0].checkpoint.dir: must be set when checkpoint.interval is set`,
			`pipelines[0].state_dir: is required with state_backend bolt`,
		}},
		{"mqtt", func(s string) string {
			return strings.Replace(s, "generator: {count: 10}", "mqtt: {broker: 'http://x', topics: ['a/#/b', 's+/x'], qos: 3, format: json, fields: {id: string, ts: {type: time, column: 2}}}", 1)
		}, []string{
			`pipelines[0].source.mqtt.broker: "http://x" must be a tcp://, mqtt://, ssl://, tls://, mqtts://, tcps://, mqtt+ssl://, unix://, ws:// or wss:// URL`,
			`pipelines[0].source.mqtt.topics[0]: "a/#/b" may have # only as its last level`,
			`pipelines[0].source.mqtt.topics[1]: "s+/x" may have + only as a whole level`,
			`pipelines[0].source.mqtt.qos: (3) must be 1 or 2`,
			`pipelines[0].source.mqtt.fields.ts.column: applies only to format csv`,
		}},
		{"window shape", func(s string) string {
			return strings.Replace(s, "size: 10s", "size: 10s\n      gap: 1s\n      allowed_lateness: -1s", 1)
		}, []string{`pipelines[0].window.gap: does not apply to tumbling windows`, `pipelines[0].window.allowed_lateness: (-1s) must not be negative`}},
		{"lateness under a millisecond", func(s string) string {
			return strings.Replace(s, "size: 10s", "size: 10s\n      allowed_lateness: 1500us", 1)
		}, []string{`pipelines[0].window.allowed_lateness: (1.5ms) must be a whole number of milliseconds (window times are whole milliseconds)`}},
		{"sliding window longer slide", func(s string) string {
			return strings.Replace(s, "type: tumbling\n      size: 10s", "type: sliding\n      size: 10s\n      slide: 20s", 1)
		}, []string{`pipelines[0].window.slide: (20s) must not exceed size (10s)`}},
		{"window under a millisecond", func(s string) string {
			return strings.Replace(s, "type: tumbling\n      size: 10s", "type: sliding\n      size: 500us\n      slide: 1s", 1)
		}, []string{`pipelines[0].window.size: (500µs) must be at least 1ms (window times are whole milliseconds)`}},
		{"session gap not in whole milliseconds", func(s string) string {
			return strings.Replace(s, "type: tumbling\n      size: 10s", "type: session\n      gap: 1500us", 1)
		}, []string{`pipelines[0].window.gap: (1.5ms) must be a whole number of milliseconds (window times are whole milliseconds)`}},
		{"alerts", func(s string) string {
			return s + "    alerts: [{name: a, when: 'temp > 1', for: 0s}, {name: a, when: 'id', for: 1s}]\n"
		}, []string{
			`pipelines[0].alerts[0].for: (0s) must be positive`,
			`pipelines[0].alerts[1].name: "a" is taken`,
			`pipelines[0].alerts[1].when: "id": expected bool, but got string`,
		}},
		// The name is the directory of the pipeline's ingest log: a name
		// longer than a file name may be was refused only at start
		// (mkdir: file name too long), and exit status 1.
		{"name longer than a file name", func(s string) string {
			return strings.Replace(s, "name: p", "name: "+strings.Repeat("p", 256), 1)
		}, []string{`pipelines[0].name: (256 bytes) must be at most 255 bytes: it names the pipeline's directories`}},
		// Both on one port: the node failed at start with the broker's
		// "bind: address already in use", exit status 1.
		{"API and broker on one port", func(s string) string {
			return "node: {broker: '127.0.0.1:1883', listen: '127.0.0.1:1883'}\n" + s
		}, []string{`node.listen: "127.0.0.1:1883" is node.broker's address too ("127.0.0.1:1883"): the REST API and the embedded broker each need their own port`}},
		{"API on every interface and broker on one port", func(s string) string {
			return "node: {broker: '127.0.0.1:1883', listen: ':1883'}\n" + s
		}, []string{`node.listen: ":1883" is node.broker's address too ("127.0.0.1:1883"): the REST API and the embedded broker each need their own port`}},
		// node.broker unset: the embedded broker takes its default port.
		{"API on the embedded broker's default port", func(s string) string {
			s = strings.Replace(s, "sinks: [{stdout: {}}]", `sinks: [{mqtt: {topic: "out/{id}"}}]`, 1)
			return "node: {listen: '0.0.0.0:1883'}\n" + s
		}, []string{`node.listen: "0.0.0.0:1883" is the embedded broker's default address (node.broker unset): the REST API and the embedded broker each need their own port`}},
		{"syntax", func(string) string { return "pipelines: [" }, []string{`line 1: did not find expected node content`}},
		{"empty", func(string) string { return "" }, []string{`pipelines: at least one pipeline is required`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.edit(goodPipeline)))
			var ce *ConfigError
			if !errors.As(err, &ce) {
				t.Fatalf("err = %v, want *ConfigError", err)
			}
			if !errors.Is(err, ErrInvalidConfig) || ce.ExitCode() != 2 {
				t.Errorf("not ErrInvalidConfig with exit code 2")
			}
			var got []string
			for _, p := range ce.Problems {
				got = append(got, p.Error())
			}
			if strings.Join(got, "\n") != strings.Join(tt.want, "\n") {
				t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tt.want, "\n"))
			}
		})
	}
}

func TestGoodPipelineParses(t *testing.T) {
	cfg, err := Parse([]byte(goodPipeline))
	if err != nil {
		t.Fatal(err)
	}
	if p := cfg.Pipelines[0]; p.Checkpoint.Retain != 2 || p.Restart.Strategy != "exponential_delay" || p.Parallelism != 1 {
		t.Errorf("defaults not applied: %+v", p)
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(goodPipeline))
	f.Add([]byte("pipelines: [{name: x, source: {file: {path: a, format: csv, fields: {a: int}}}}]"))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := Parse(data)
		if err == nil && cfg == nil {
			t.Fatal("nil config without error")
		}
	})
}

// The shipped configs describe what edged does now: no source or sink is
// "not available" or "future".
func TestShippedConfigsCurrent(t *testing.T) {
	files, _ := filepath.Glob("../configs/*.yaml")
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, stale := range []string{"not available", "future"} {
			if strings.Contains(strings.ToLower(string(data)), stale) {
				t.Errorf("%s says %q", f, stale)
			}
		}
	}
}

// The external broker's URL: every scheme the readers dial, a host and a
// port in [1, 65535] (there is no default port), a socket path for
// unix://; a websocket URL may leave its port to the scheme.
func TestBrokerURLChecked(t *testing.T) {
	for _, c := range []struct{ broker, problem string }{
		{"tcp://127.0.0.1:1883", ""},
		{"mqtt://broker.local:1883", ""},
		{"ssl://127.0.0.1:8883", ""},
		{"tls://127.0.0.1:8883", ""},
		{"mqtts://127.0.0.1:8883", ""},
		{"tcps://127.0.0.1:8883", ""},
		{"mqtt+ssl://127.0.0.1:8883", ""},
		{"tcp://[::1]:1883", ""},
		{"unix:///run/mosquitto.sock", ""},
		{"ws://127.0.0.1/mqtt", ""},
		{"wss://127.0.0.1:443/mqtt", ""},
		{"tcp://127.0.0.1", `"tcp://127.0.0.1" has no port (tcp://127.0.0.1:1883, say)`},
		{"tcp://127.0.0.1:99999", `"tcp://127.0.0.1:99999" has port "99999": it must be in [1, 65535]`},
		{"tcp://127.0.0.1:0", `"tcp://127.0.0.1:0" has port "0": it must be in [1, 65535]`},
		{"tcp://:1883", `"tcp://:1883" has no host`},
		{"unix://", `"unix://" has no socket path (unix:///path/to/socket)`},
		{"http://x:80", `"http://x:80" must be a tcp://, mqtt://, ssl://, tls://, mqtts://, tcps://, mqtt+ssl://, unix://, ws:// or wss:// URL`},
		{"127.0.0.1:1883", `"127.0.0.1:1883" is host:port, not a URL: write tcp://127.0.0.1:1883`},
		{"localhost:1883", `"localhost:1883" is host:port, not a URL: write tcp://localhost:1883`},
		{"[::1]:1883", `"[::1]:1883" is host:port, not a URL: write tcp://[::1]:1883`},
		{"broker.local", `"broker.local" must be a tcp://, mqtt://, ssl://, tls://, mqtts://, tcps://, mqtt+ssl://, unix://, ws:// or wss:// URL`},
		// A problem names the URL without its password.
		{"tcp://edge:s3cret@127.0.0.1", `"tcp://edge:xxxxx@127.0.0.1" has no port (tcp://127.0.0.1:1883, say)`},
		{"tcp://edge:s3cret@127.0.0.1:99999", `"tcp://edge:xxxxx@127.0.0.1:99999" has port "99999": it must be in [1, 65535]`},
		{"http://edge:s3cret@x:80", `"http://edge:xxxxx@x:80" must be a tcp://, mqtt://, ssl://, tls://, mqtts://, tcps://, mqtt+ssl://, unix://, ws:// or wss:// URL`},
		{"tcp://edge:s3cret@127.0.0.1:1883/%zz", `"tcp://edge:xxxxx@127.0.0.1:1883/%zz" is not a URL`},
	} {
		if got := checkBrokerURL(c.broker); got != c.problem {
			t.Errorf("%s: %q, want %q", c.broker, got, c.problem)
		}
	}
}
