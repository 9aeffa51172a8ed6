package pipeline

import (
	"github.com/edgedio/edged/mqtt/ingestlog"
	"time"

	"github.com/edgedio/edged/snapshot"
)

// Config is a node config: the YAML file edged loads. Only the
// `pipelines:` section exists so far. Load it with Load; Validate checks it
// and compiles every pipeline.
type Config struct {
	// Node holds the settings of the device running the pipelines.
	Node NodeConfig `yaml:"node"`
	// Pipelines are the declared pipelines; at least one.
	Pipelines []PipelineConfig `yaml:"pipelines"`
	// Cluster, when set, runs the pipelines on several nodes.
	Cluster *ClusterConfig `yaml:"cluster"`
}

// NodeConfig is the YAML `node` block.
type NodeConfig struct {
	// DataDir holds the ingest logs of MQTT pipelines (and is where
	// relative checkpoint and state directories are meant to live).
	// Default "edged-data".
	DataDir string `yaml:"data_dir"`
	// Broker is the address the embedded MQTT broker listens on; default
	// 127.0.0.1:1883. It runs when a pipeline reads or writes MQTT.
	Broker string `yaml:"broker"`
	// Listen is the address of the REST API and /metrics; default
	// 127.0.0.1:8081.
	Listen string `yaml:"listen"`
	// Token is the bearer token the REST API and the dashboard require
	// when Listen is not a loopback address; when empty there, the node
	// generates one at start and logs it.
	Token string `yaml:"token"`
	// Simulator, when set, publishes simulated sensor readings to the
	// embedded broker: the demo needs nothing else.
	Simulator *SimulatorConfig `yaml:"simulator"`
	// Memory bounds the memory of the node: the Go runtime's soft limit
	// and the buffers that grow with load. See MemoryConfig.
	Memory MemoryConfig `yaml:"memory"`
}

// SimulatorConfig is the YAML `node.simulator` block: Sensors devices
// publishing JSON readings {"sensor","t","ts"} to Topic (with {id}
// replaced by the sensor id) at Rate readings per second in all.
type SimulatorConfig struct {
	Sensors int     `yaml:"sensors"`
	Rate    float64 `yaml:"rate"`
	Topic   string  `yaml:"topic"`
}

// PipelineConfig declares one pipeline (YAML `pipelines[i]`). Start from
// DefaultPipelineConfig when building one in Go.
type PipelineConfig struct {
	// Name identifies the pipeline; it names the job and prefixes operator
	// UIDs, so it must be unique and should not change. Required.
	Name string `yaml:"name"`
	// Parallelism of the keyed operators and sinks. Default 1.
	Parallelism int `yaml:"parallelism"`
	// Source is where records come from: exactly one of its blocks.
	Source SourceConfig `yaml:"source"`
	// EventTime makes the pipeline run on event time from a field.
	// Without it windows and alerts use processing time.
	EventTime *EventTimeConfig `yaml:"event_time"`
	// Key is the string field the pipeline is keyed by. Required with a
	// window, alerts or silent.
	Key string `yaml:"key"`
	// Filter is a boolean expression; records for which it is false are
	// dropped. Evaluated after decoding and before Compute.
	Filter string `yaml:"filter"`
	// Compute adds fields, in order, each from an expression over the
	// fields before it. Its type is the expression's (float, int, bool or
	// string).
	Compute Exprs `yaml:"compute"`
	// Window aggregates each key's records per window.
	Window *WindowConfig `yaml:"window"`
	// Alerts fire when a condition holds for a key for a duration.
	Alerts []AlertConfig `yaml:"alerts"`
	// Silent fires when a key sends nothing for a duration.
	Silent *SilentConfig `yaml:"silent"`
	// Sinks receive window results, alerts and dead letters. At least
	// one.
	Sinks []SinkConfig `yaml:"sinks"`
	// Checkpoint configures checkpoints (package snapshot); default
	// snapshot.DefaultConfig (off).
	Checkpoint snapshot.Config `yaml:"checkpoint"`
	// Restart configures the restart strategy; default
	// snapshot.DefaultRestartConfig.
	Restart snapshot.RestartConfig `yaml:"restart"`
	// StateBackend is "memory" (default) or "bolt".
	StateBackend string `yaml:"state_backend"`
	// StateDir is the directory of the bolt backend; required with it.
	StateDir string `yaml:"state_dir"`

	plan *plan // set by Validate
}

// DefaultPipelineConfig returns a PipelineConfig with the defaults: the
// snapshot defaults, parallelism 1, memory state.
func DefaultPipelineConfig() PipelineConfig {
	var p PipelineConfig
	p.setDefaults()
	return p
}

func (p *PipelineConfig) setDefaults() {
	p.Parallelism = 1
	p.Checkpoint = snapshot.DefaultConfig()
	p.Restart = snapshot.DefaultRestartConfig()
	p.StateBackend = "memory"
}

// SourceConfig holds exactly one source block.
type SourceConfig struct {
	Generator *GeneratorSourceConfig `yaml:"generator"`
	File      *FileSourceConfig      `yaml:"file"`
	MQTT      *MQTTSourceConfig      `yaml:"mqtt"`
}

// GeneratorSourceConfig is the deterministic sensor generator
// (operators.SensorGenerator). Its rows have the fields id (string), temp
// (float, in [20, 40)) and ts (time).
type GeneratorSourceConfig struct {
	// Count is the number of records; 0 means unbounded.
	Count int64 `yaml:"count"`
	// Rate is records per second; 0 means as fast as possible.
	Rate float64 `yaml:"rate"`
	// Keys is the number of sensors; default 1000.
	Keys int `yaml:"keys"`
	// Start is the first timestamp in unix seconds; default 1547718199.
	Start int64 `yaml:"start"`
}

// FileSourceConfig reads a file of lines (JSON objects or CSV), once.
type FileSourceConfig struct {
	// Path of the file. Required.
	Path string `yaml:"path"`
	// Format is "json" or "csv". Required.
	Format string `yaml:"format"`
	// Delimiter of csv; default ",". One byte.
	Delimiter string `yaml:"delimiter"`
	// Fields is the schema of the decoded rows. Required.
	Fields Fields `yaml:"fields"`
}

// MQTTSourceConfig reads MQTT messages through the pipeline's durable
// ingest log (replayable: the log offset is checkpointed), which the node
// fills from its embedded broker (Broker empty) or from a persistent
// subscription to the external broker at Broker.
type MQTTSourceConfig struct {
	// Broker URL: tcp://, ssl://, ws:// or wss:// host:port. Empty means
	// the embedded broker.
	Broker string `yaml:"broker"`
	// Topics to subscribe to; + and # wildcards allowed. At least one.
	Topics []string `yaml:"topics"`
	// QoS is 1 (default) or 2: the QoS of the subscription to an external
	// broker. A message is acknowledged to the broker only once the ingest
	// log holds it, so QoS 0 (at most once, nothing to acknowledge) is
	// refused rather than upgraded. The embedded broker's route takes
	// every message whatever its QoS, before the device's PUBACK.
	QoS int `yaml:"qos"`
	// ClientID of the subscription; default the pipeline name.
	ClientID string `yaml:"client_id"`
	// MaxPending bounds the messages received from an external broker but
	// not yet acknowledged; default 1024.
	MaxPending int `yaml:"max_pending"`
	// RedeliveryWindow is how many of the last logged records a DUP
	// redelivery from an external broker is compared with; default 65535;
	// it must exceed twice max_pending and stay below 65536.
	RedeliveryWindow int `yaml:"redelivery_window"`
	// AckDelay is how long the subscriber to an external broker may wait
	// for more messages before it makes those it received durable and
	// acknowledges them, so that they share one fsync (group commit); it
	// does not wait while half of max_pending, or half of the broker's
	// in-flight window, is unacknowledged. Default 5ms; 0s: no wait; at
	// most 1s.
	AckDelay *time.Duration `yaml:"ack_delay"`
	// MaxMessageBytes bounds the size of a message (its whole MQTT
	// PUBLISH packet) the pipeline takes, in bytes. A larger one is not
	// appended to the ingest log: a dead-letter record (topic, size, first
	// 256 bytes of the payload) takes its place and reaches the
	// pipeline's dead-letter output, and the message is acknowledged.
	// Default 8 MiB (mqtt.DefaultMaxMessageBytes); at most what one
	// ingest-log record holds (64 MiB segments: 67108810 bytes). With the
	// embedded broker the largest of its pipelines' values bounds every
	// packet the broker reads.
	MaxMessageBytes int64 `yaml:"max_message_bytes"`
	// LogMaxBytes bounds the pipeline's ingest log: the bytes of records
	// no retained checkpoint has released. A full log holds back the
	// acknowledgements (back-pressure to the devices or the broker).
	// Default 1 GiB; at least 4 MiB, and four times the largest message
	// (max_message_bytes, default 8 MiB), since the log's segments are
	// then a quarter of it (64 MiB at most), so that its files on disk
	// stay within 1.25 times the bound.
	LogMaxBytes int64 `yaml:"log_max_bytes"`
	// Client is what reads an external broker's connection: "direct"
	// (one goroutine reads and decodes the packets and hands them to the
	// ingest log in batches) or "paho" (the paho client). Default direct
	// for tcp://, mqtt://, ssl://, tls://, mqtts:// and unix:// brokers,
	// paho for ws:// and wss:// (which direct does not dial).
	Client string `yaml:"client"`
	// Format is "json" or "csv". Required.
	Format string `yaml:"format"`
	// Delimiter of csv; default ",".
	Delimiter string `yaml:"delimiter"`
	// Fields is the schema of the decoded rows. Required.
	Fields Fields `yaml:"fields"`
}

func (m *MQTTSourceConfig) setDefaults() { m.QoS = 1 }

// SubscriberAckDelay is AckDelay as mqtt.SubscriberConfig.AckDelay takes
// it: 0 (the default) when unset, negative (no wait) when 0s.
func (m *MQTTSourceConfig) SubscriberAckDelay() time.Duration {
	switch {
	case m.AckDelay == nil:
		return 0
	case *m.AckDelay == 0:
		return -1
	}
	return *m.AckDelay
}

// Fields is the ordered field mapping of a decoded source. In YAML it is a
// mapping from field name to either a type (`temp: float`: JSON key
// `temp`, or the CSV column at the field's position) or a block
// `{type, path, column, unit}`: `path` is a JSON key path like `$.a.b`,
// `column` a 0-based CSV column, `unit` is `ms` (default) or `s` for time
// fields given as numbers (strings are read as RFC 3339).
type Fields []FieldConfig

// FieldConfig is one entry of Fields.
type FieldConfig struct {
	Name   string
	Type   string `yaml:"type"`
	Path   string `yaml:"path"`
	Column *int   `yaml:"column"`
	Unit   string `yaml:"unit"`
}

// EventTimeConfig takes event time from a field.
type EventTimeConfig struct {
	// Field is a time or int (ms) field. Required.
	Field string `yaml:"field"`
	// MaxOutOfOrderness is how late records may arrive; default 0.
	MaxOutOfOrderness time.Duration `yaml:"max_out_of_orderness"`
	// IdleTimeout marks the source idle after this long without
	// records; default 0 (never).
	IdleTimeout time.Duration `yaml:"idle_timeout"`
	// MaxAhead bounds how far a record's event time may be ahead of the
	// node's clock: a record further ahead goes to the dead-letter output
	// and does not move the watermark. Default 1h (DefaultMaxAhead) for
	// file and MQTT sources, none for the generator source (its event
	// times are synthetic); 0s: no bound.
	MaxAhead *time.Duration `yaml:"max_ahead"`
}

// DefaultMaxAhead is event_time.max_ahead when it is not set, for file
// and MQTT sources.
const DefaultMaxAhead = time.Hour

// Exprs is an ordered `name: expression` mapping.
type Exprs []NamedExpr

// NamedExpr is one `name: expression` entry of compute.
type NamedExpr struct {
	Name string
	Expr string
}

// WindowConfig windows each key's records and aggregates them.
type WindowConfig struct {
	// Type is tumbling, sliding or session. Required.
	Type string `yaml:"type"`
	// Size of tumbling and sliding windows.
	Size time.Duration `yaml:"size"`
	// Slide of sliding windows.
	Slide time.Duration `yaml:"slide"`
	// Gap of session windows.
	Gap time.Duration `yaml:"gap"`
	// AllowedLateness keeps windows for late records; default 0.
	AllowedLateness time.Duration `yaml:"allowed_lateness"`
	// Aggregates computed per window; at least one, at most 8.
	Aggregates []AggregateConfig `yaml:"aggregates"`
}

// AggregateConfig is one aggregate of a window.
type AggregateConfig struct {
	// Name of the output field. Required.
	Name string `yaml:"name"`
	// Fn is count, sum, avg, min, max, first or last.
	Fn string `yaml:"fn"`
	// Field is the numeric input field; not used by count.
	Field string `yaml:"field"`
}

// AlertConfig fires once when When has held for a key for For (every
// record of the key in that time satisfying it); it may fire again after
// When was false.
type AlertConfig struct {
	Name string        `yaml:"name"`
	When string        `yaml:"when"`
	For  time.Duration `yaml:"for"`
}

// SilentConfig fires when a key sends no record for For.
type SilentConfig struct {
	// Name of the alert; default "silent".
	Name string        `yaml:"name"`
	For  time.Duration `yaml:"for"`
}

// SinkConfig holds exactly one sink block.
type SinkConfig struct {
	Stdout *StdoutSinkConfig `yaml:"stdout"`
	File   *FileSinkConfig   `yaml:"file"`
	MQTT   *MQTTSinkConfig   `yaml:"mqtt"`
}

// StdoutSinkConfig prints JSON lines to the writer given to Build.
type StdoutSinkConfig struct{}

// FileSinkConfig writes JSON lines exactly once (operators.NewFileSink)
// under Dir: windows/, alerts/ and dead-letter/.
type FileSinkConfig struct {
	Dir string `yaml:"dir"`
}

// MQTTSinkConfig publishes results to the node's broker (Inputs.Broker):
// through a write-ahead sink with a deterministic "msg_id" when
// checkpoints are on, else as they come.
type MQTTSinkConfig struct {
	// Topic, with {field} placeholders of result fields.
	Topic string `yaml:"topic"`
	// QoS is 0, 1 or 2; default 1. QoS 0 publishes at most once: a
	// result may be lost on the way to the broker, so consumers of a QoS 0
	// sink are not promised every result.
	QoS int `yaml:"qos"`
	// Batch packs up to this many results to the same topic into one
	// message whose payload is a JSON array of the result objects, each
	// with its own msg_id (mqtt.Batch); 0 or 1 (the default) publishes
	// one message per result. At most mqtt.MaxBatch (10000). It pays off
	// with a topic shared by many keys: a template filled per key
	// ("agg/{id}") gives each key its own topic and its own messages.
	// Dead letters (deadletter/<pipeline>) still go one per message.
	Batch int `yaml:"batch"`
	// BatchBytes bounds the payload of a batched message, in bytes; a
	// single result larger than that goes out alone. Default 262144
	// (256 KiB, mqtt.DefaultBatchBytes); keep it below the broker's
	// maximum packet size. Only with batch above 1.
	BatchBytes int `yaml:"batch_bytes"`
	// MaxHeld bounds the results of completed checkpoints each subtask of
	// the sink holds for the broker with checkpoints on (a slow or
	// unreachable broker: they are published again and again until it
	// takes them, while the job runs on). When that many wait, the sink
	// takes no more results until the broker took some: back-pressure.
	// Default DefaultMaxHeld; 0 sets no bound. Node-local: not in the
	// settings digest.
	MaxHeld int `yaml:"max_held" json:"-"`
}

// DefaultMaxHeld is an MQTT sink's default max_held: a pipeline's row
// takes about 300 bytes of heap restored from a checkpoint and up to
// about 425 as the sink collects it (its chunks' spare room), so some
// 15–21 MB per subtask.
const DefaultMaxHeld = 50_000

func (m *MQTTSinkConfig) setDefaults() { m.QoS, m.MaxHeld = 1, DefaultMaxHeld }

// LogOptions returns the options of the pipeline's ingest log: the
// defaults, bounded by LogMaxBytes when set, with segments a quarter of
// the bound (64 MiB at most).
func (m *MQTTSourceConfig) LogOptions() ingestlog.Options {
	o := ingestlog.DefaultOptions()
	if m.LogMaxBytes > 0 {
		o.MaxBytes = m.LogMaxBytes
		o.SegmentBytes = min(o.SegmentBytes, m.LogMaxBytes/4)
	}
	return o
}
