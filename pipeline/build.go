package pipeline

import (
	"cmp"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"
	"unsafe"

	"github.com/edgedio/edged/mqtt"
	"github.com/edgedio/edged/mqtt/ingestlog"
	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/stream"
	"github.com/edgedio/edged/watermark"
)

// DeadLetter is a record that could not be processed: a malformed payload
// or a record whose expression failed.
type DeadLetter struct {
	Pipeline string
	Err      string
	Payload  string
}

// MaxDeadLetterPayload is how much of a record's payload its dead letter
// keeps (cut at a rune boundary, followed by "… (N bytes in all)"): a
// dead letter, escaped as JSON (a control byte takes six), must fit in
// a packet of the brokers it is published to, or a malformed message
// of megabytes would make a dead letter no sink can publish, failing
// the job at every restart.
const MaxDeadLetterPayload = 64 << 10

// newDeadLetter returns the dead letter of pipeline's record payload,
// which failed with err, its payload cut to MaxDeadLetterPayload (and
// copied: nothing of the record's buffers stays referenced).
func newDeadLetter(pipeline, err, payload string) DeadLetter {
	return DeadLetter{Pipeline: pipeline, Err: err, Payload: truncated(payload, MaxDeadLetterPayload)}
}

// line formats d as the JSON object the sinks write.
func (d DeadLetter) line() string {
	b := make([]byte, 0, 64+len(d.Payload)+len(d.Err))
	b = append(b, `{"pipeline":`...)
	b = appendJSONString(b, d.Pipeline)
	b = append(b, `,"error":`...)
	b = appendJSONString(b, d.Err)
	b = append(b, `,"payload":`...)
	b = appendJSONString(b, d.Payload)
	return string(append(b, '}'))
}

// perEventWatermarks makes the timestamp assigner emit a watermark after
// every record instead of periodically: tests set it to make lateness
// deterministic.
var perEventWatermarks bool

// lateError is the error of a dead letter for a record that came after
// every window it belongs to had closed: the watermark had reached the
// end of each of its windows plus allowed_lateness, however little its
// event time was behind.
const lateError = "late: its windows had already closed (the watermark had reached the end of each of its windows plus allowed_lateness)"

// DeadLetterPrefix starts every dead-letter line of the stdout sink.
const DeadLetterPrefix = "dead-letter: "

// RecentDeadLetters is how many of the latest dead letters a Job keeps
// (Job.RecentDeadLetters).
const RecentDeadLetters = 16

// counters are the counts a built pipeline keeps; shared by its subtasks.
type counters struct {
	dead atomic.Int64
	// fileResets counts the file source's reads of its file from the
	// start again (operators.FileReset).
	fileResets atomic.Int64

	mu     sync.Mutex // guards recent, next and held
	recent [RecentDeadLetters]DeadLetter
	next   int // count of dead letters recorded in recent
	// held: the open subtasks of the pipeline's MQTT sinks (checkpoints
	// on) on this node, by sink and subtask, for SinkResultsHeld.
	held map[sinkSubtask]heldCounter
}

// sinkSubtask names one subtask of a sink: the sink's name within the
// pipeline ("sink-0-windows") and the subtask.
type sinkSubtask struct {
	sink    string
	subtask int
}

// heldCounter is a sink subtask that holds results for its broker
// (operators.WriteAheadSink.Held).
type heldCounter interface{ Held() int64 }

// addHeld records h as the open subtask k, in place of an earlier
// attempt's.
func (c *counters) addHeld(k sinkSubtask, h heldCounter) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.held == nil {
		c.held = map[sinkSubtask]heldCounter{}
	}
	c.held[k] = h
}

// removeHeld forgets subtask k if it is still h: a new attempt's
// subtask may have opened before the old one closed.
func (c *counters) removeHeld(k sinkSubtask, h heldCounter) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.held[k] == h {
		delete(c.held, k)
	}
}

// RecentPayloadBytes is how much of a dead letter's payload, and of its
// error, a Job keeps among the latest (RecentDeadLetters): the dead-letter
// outputs get the whole payload; the list answers the API and the
// dashboard, and 16 payloads of up to max_message_bytes each must not
// pin the node's memory.
const RecentPayloadBytes = 1024

// truncated returns a copy of s cut to at most max bytes at a rune
// boundary, with how long it was when it was cut: for an s that was cut
// before (a dead letter's payload, cut again for the latest ones), how
// long it was before that first cut.
func truncated(s string, max int) string {
	if len(s) <= max {
		return strings.Clone(s)
	}
	total := len(s)
	if n, ok := cutLength(s); ok {
		total = n
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + fmt.Sprintf(cutSuffix, total)
}

// cutSuffix ends a string truncated cut.
const cutSuffix = "… (%d bytes in all)"

// cutLength returns the length before the cut that s ends with, if it
// ends with one of truncated.
func cutLength(s string) (int, bool) {
	i := strings.LastIndex(s, "… (")
	if i < 0 {
		return 0, false
	}
	var n int
	if _, err := fmt.Sscanf(s[i:], cutSuffix, &n); err != nil || fmt.Sprintf(cutSuffix, n) != s[i:] {
		return 0, false
	}
	return n, true
}

// deadLetter counts d and keeps it among the latest, its payload and
// error cut to RecentPayloadBytes (and copied: nothing of the record's
// buffers stays referenced).
func (c *counters) deadLetter(d DeadLetter) {
	c.dead.Add(1)
	d.Payload, d.Err, d.Pipeline = truncated(d.Payload, RecentPayloadBytes), truncated(d.Err, RecentPayloadBytes), strings.Clone(d.Pipeline)
	c.mu.Lock()
	c.recent[c.next%RecentDeadLetters] = d
	c.next++
	c.mu.Unlock()
}

// Job is what Build made of a pipeline: counters to read while or after
// the environment runs.
type Job struct {
	c        *counters
	fileRead bool // the pipeline's source is a file
}

// DeadLetters returns the number of records sent to the dead-letter
// output so far.
func (j *Job) DeadLetters() int64 { return j.c.dead.Load() }

// ReadsFile reports whether the pipeline's source is a file.
func (j *Job) ReadsFile() bool { return j.fileRead }

// FileSourceResets returns how many times the pipeline's file source read
// its file from the start again because the file at its path was not the
// one its checkpointed offset was taken in (replaced, as by log
// rotation), or was shorter (truncated), or its first bytes had changed
// (operators.FileReset). Safe to call while the job runs.
func (j *Job) FileSourceResets() int64 { return j.c.fileResets.Load() }

// RecentDeadLetters returns the latest dead letters (at most
// RecentDeadLetters), oldest first. Safe to call while the job runs.
func (j *Job) RecentDeadLetters() []DeadLetter {
	c := j.c
	c.mu.Lock()
	defer c.mu.Unlock()
	n := min(c.next, RecentDeadLetters)
	out := make([]DeadLetter, 0, n)
	for i := c.next - n; i < c.next; i++ {
		out = append(out, c.recent[i%RecentDeadLetters])
	}
	return out
}

// SinkHeld is what one subtask of an MQTT sink holds for its broker.
type SinkHeld struct {
	// Sink is the sink's name within the pipeline: sink-<i>-<output>
	// ("sink-0-windows", "sink-0-dead-letter").
	Sink    string
	Subtask int
	// Results are the results of completed checkpoints (and restored
	// ones) that the broker has not yet acknowledged, with those published
	// lately that a failed publish sends again: what max_held bounds.
	Results int64
}

// SinkResultsHeld returns, for every open subtask on this node of the
// pipeline's MQTT sinks with checkpoints on, the results it holds for its
// broker, ordered by sink and subtask. A broker that is down, hung or
// refusing, or a consumer whose persistent session on the embedded
// broker is full, makes them grow up to max_held. Safe to call while the
// job runs.
func (j *Job) SinkResultsHeld() []SinkHeld {
	c := j.c
	c.mu.Lock()
	out := make([]SinkHeld, 0, len(c.held))
	for k, h := range c.held {
		out = append(out, SinkHeld{Sink: k.sink, Subtask: k.subtask, Results: h.Held()})
	}
	c.mu.Unlock()
	slices.SortFunc(out, func(a, b SinkHeld) int {
		return cmp.Or(strings.Compare(a.Sink, b.Sink), cmp.Compare(a.Subtask, b.Subtask))
	})
	return out
}

// EnvOptions returns the stream options a pipeline's environment needs:
// parallelism, the settings digest the plan fingerprint covers
// (SettingsDigest), checkpointing (when checkpoint.dir is set), the
// restart strategy and the state backend.
func EnvOptions(cfg PipelineConfig) ([]stream.Option, error) {
	opts := []stream.Option{stream.WithParallelism(max(cfg.Parallelism, 1)), stream.WithSettingsDigest(cfg.SettingsDigest())}
	if cfg.Checkpoint.Dir != "" {
		opts = append(opts, stream.WithCheckpointing(cfg.Checkpoint))
	}
	rs, err := cfg.Restart.New()
	if err != nil {
		return nil, err
	}
	opts = append(opts, stream.WithRestartStrategy(rs))
	if cfg.StateBackend == "bolt" {
		opts = append(opts, stream.WithBoltStateBackend(cfg.StateDir))
	}
	return opts, nil
}

// Build adds the job of one pipeline to env (create env with EnvOptions)
// and writes the stdout sinks' lines to out, which must be safe for
// concurrent writes if other code writes to it too (Build serialises its
// own sinks). cfg is validated (and compiled) if it was not.
func Build(cfg PipelineConfig, env *stream.Environment, out io.Writer) error {
	_, err := BuildJob(cfg, env, out)
	return err
}

// BuildJob is Build returning the Job for its counters.
func BuildJob(cfg PipelineConfig, env *stream.Environment, out io.Writer) (*Job, error) {
	return BuildJobWith(cfg, env, out, Inputs{})
}

// Inputs is what the node gives the pipelines that use MQTT.
type Inputs struct {
	// MQTTLog returns the ingest log the embedded broker fills for the
	// pipeline named name (nil: MQTT sources are not available).
	MQTTLog func(name string) (*ingestlog.Log, error)
	// Broker is the URL MQTT sinks publish to, for example
	// "tcp://127.0.0.1:1883" ("": MQTT sinks are not available).
	Broker string
	// BrokerMaxMessageBytes is the largest PUBLISH packet Broker takes
	// (the embedded broker's max_message_bytes; 0 means
	// mqtt.DefaultMaxMessageBytes): a result that would make a larger one
	// is a dead letter, not a publish the broker refuses.
	BrokerMaxMessageBytes int64
	// Nodes, in a cluster, are the ids of its nodes in order and Self is
	// this node's: an MQTT source then has one subtask per node, each
	// reading its own node's ingest log (mqtt.WithSplits). Nil on a
	// single node.
	Nodes []string
	Self  string
	// SplitHome, in a cluster with gossip, tells whether the node of a
	// source split that job placed away from it is back and about to get
	// it (mqtt.WithSplitHome): such a split holds the other splits'
	// watermarks back until it is home. Nil: an away split is idle.
	SplitHome func(job, node string) bool
	// Counts, when set, is the Job whose counters the pipeline built
	// adds to, and the Job returned: a cluster's worker builds a
	// pipeline's job again for each deployment and keeps one count of
	// the dead letters of the subtasks it hosts. Nil: new counters.
	Counts *Job
	// CommitWait is how long an MQTT sink of a checkpointed pipeline
	// waits for a broker that does not take the results of the
	// checkpoint that ends the job (a stop-with-savepoint, a bounded
	// job's final checkpoint), trying again, before the stop fails; 0
	// fails it at the first failed publish.
	CommitWait time.Duration
}

// BuildJobWith is BuildJob with the node's MQTT inputs.
func BuildJobWith(cfg PipelineConfig, env *stream.Environment, out io.Writer, in Inputs) (*Job, error) {
	if cfg.plan == nil {
		if err := cfg.Validate(); err != nil {
			return nil, err
		}
	}
	pl := cfg.plan
	if cfg.Source.MQTT != nil && in.MQTTLog == nil {
		// The node fills each MQTT pipeline's ingest log, from its embedded
		// broker or from a subscriber to an external one.
		return nil, fmt.Errorf("pipeline %q: mqtt source: no ingest log given: %w", cfg.Name, ErrNotAvailable)
	}
	for i, s := range cfg.Sinks {
		if s.MQTT != nil && in.Broker == "" {
			return nil, fmt.Errorf("pipeline %q: sinks[%d]: mqtt sink: no broker given: %w", cfg.Name, i, ErrNotAvailable)
		}
		if s.File == nil {
			continue
		}
		// The sink creates its directories when its task opens: a file in
		// the way would fail every attempt of the job, naming an operator.
		if fi, err := os.Stat(s.File.Dir); err == nil && !fi.IsDir() {
			return nil, fmt.Errorf("pipeline %q: sinks[%d].file.dir: %q is a file, not a directory: %w", cfg.Name, i, s.File.Dir, ErrInvalidConfig)
		}
	}
	c := &counters{}
	if in.Counts != nil {
		c = in.Counts.c
	}
	b := &builder{cfg: &cfg, pl: pl, env: env, c: c, out: &lockedWriter{w: out},
		dead: operators.NewOutputTag[DeadLetter]("dead-letter"), in: in}
	var rows *stream.Stream[Row]
	var prep *stream.Stream[Row]
	uid := func(s string) string { return cfg.Name + "/" + s }
	switch src := cfg.Source; {
	case src.Generator != nil:
		g := src.Generator
		gen := stream.FromSource(env, uid("source"), func() operators.Source[Row] {
			return generatorSource(operators.GeneratorConfig{Count: g.Count, Rate: g.Rate, Keys: g.Keys, Start: g.Start})
		}).UID(uid("source"))
		prep = prepare(b, gen, nil, nil, nil, nil)
	case src.File != nil:
		lines := stream.FromSource(env, uid("source"), func() operators.Source[fileLine] {
			return operators.NewLineFileSource(src.File.Path, func(line string) (fileLine, error) { return fileLine{text: line}, nil }).
				WithLongLines(func(prefix string, err error) fileLine { return fileLine{text: prefix, err: err} }).
				WithResets(func(operators.FileReset) { b.c.fileResets.Add(1) }) // the source logs it
		}).UID(uid("source")).SetParallelism(1)
		decode := pl.json.Decode
		if pl.csv != nil {
			decode = pl.csv.Decode
		}
		// A line too long to read whole reaches the job as a dead letter.
		prep = prepare(b, lines, decode, fileLine.raw, fileLine.reject, nil)
	case src.MQTT != nil:
		log, err := in.MQTTLog(cfg.Name)
		if err != nil {
			return nil, fmt.Errorf("pipeline %q: mqtt source: %w", cfg.Name, err)
		}
		// The source keeps in the log what every retained checkpoint
		// needs, asking the job's snapshot store which those are.
		srcOpts := []mqtt.SourceOption{mqtt.WithRetain(cfg.Checkpoint.Retain)}
		splits := 1
		switch {
		case len(in.Nodes) > 0:
			// In a cluster the node's checkpoint directory is not where
			// checkpoints complete: the split keeps what the newest
			// retained ones it was told of need.
			splits = len(in.Nodes)
			srcOpts = append(srcOpts, mqtt.WithSplits(in.Nodes, in.Self))
			if home := in.SplitHome; home != nil {
				job := cfg.Name
				srcOpts = append(srcOpts, mqtt.WithSplitHome(func(node string) bool { return home(job, node) }))
			}
		case cfg.Checkpoint.Dir != "":
			srcOpts = append(srcOpts, mqtt.WithCheckpointDir(cfg.Checkpoint.Dir, cfg.Name))
		}
		msgs := stream.FromSource(env, uid("source"), func() operators.Source[mqtt.Message] {
			return mqtt.NewSource(log, srcOpts...)
		}).UID(uid("source")).SetParallelism(splits).BatchBytes(messageBytes, SourceBatchBytes)
		decode := pl.json.Decode
		if pl.csv != nil {
			decode = pl.csv.Decode
		}
		// A message too large to keep reaches the job as a dead letter.
		prep = prepare(b, msgs, decode, payloadString, mqtt.Message.Err, func(m mqtt.Message, ctx *operators.Context) Origin {
			// The offset in the log of the split's node: the same in
			// every replay, so the dead letter's msg_id is too.
			o := Origin{Topic: m.Topic, Offset: m.Offset + 1}
			if len(in.Nodes) > 0 && ctx.Subtask < len(in.Nodes) {
				o.Node = in.Nodes[ctx.Subtask]
			}
			return o
		})
		if len(in.Nodes) > 0 {
			// One preparation (and so one watermark assigner) per node's
			// split, chained to it, whatever the job's parallelism: a
			// split's readings keep their own watermark, so a node reading
			// a backlog (after a restart, or readings its broker took in
			// while the job was stopped) does not find them late behind
			// another node's newer ones mixed into the same assigner; and
			// a dead letter's origin names the node of its split.
			prep = prep.SetParallelism(splits)
		}
	}
	rows = prep
	if pl.eventTime {
		et := cfg.EventTime
		slot := pl.ts.Slot
		strategy := watermark.ForBoundedOutOfOrderness(et.MaxOutOfOrderness, func(r Row) int64 { return r.Int(slot) }).
			WithIdleness(et.IdleTimeout)
		if perEventWatermarks {
			strategy = strategy.WithPerEventEmit()
		}
		rows = rows.AssignTimestampsAndWatermarks(uid("timestamps"), strategy)
	}
	sinkAll(b, "dead-letter", stream.SideOutput(prep, b.dead), DeadLetter.line, DeadLetterPrefix)

	if !pl.keyed || (!pl.windowed && len(pl.alerts) == 0 && pl.silentMs == 0) {
		s := pl.schema
		sinkAll(b, "rows", rows, func(r Row) string { return string(r.AppendJSON(nil, s)) }, "")
		return b.finish(), nil
	}
	keySlot := pl.key.Slot
	keyed := stream.KeyBy(rows, func(r Row) string { return r.Str(keySlot) })
	if pl.windowed {
		lateTag := operators.NewOutputTag[Row](uid("late"))
		w := stream.Window(keyed, pl.assigner).AllowedLateness(pl.lateness).SideOutputLateData(lateTag)
		res := stream.WindowAggregate(w, uid("window"), windowAgg{pl: pl}).UID(uid("window")).SetParallelism(cfg.Parallelism).
			StateSettings(stream.KeyStateSetting(pl.key.Name) + "; " + aggregatesDigest(cfg.Window.Aggregates))
		// A record later than its windows' allowed lateness is a dead
		// letter, counted and kept like a malformed one, never silently
		// dropped.
		in := pl.schema
		late := stream.Map(stream.SideOutput(res, lateTag), uid("late-rows"), func(r Row) (DeadLetter, error) {
			d := newDeadLetter(cfg.Name, r.withOrigin(lateError), string(r.AppendJSON(nil, in)))
			b.c.deadLetter(d)
			return d, nil
		}).SetParallelism(cfg.Parallelism)
		sinkAll(b, "dead-letter-late", late, DeadLetter.line, DeadLetterPrefix)
		winRows := stream.Map(res, uid("window-rows"), func(r operators.WindowResult[string, WindowAcc]) (Row, error) {
			return pl.windowRow(r), nil
		})
		s := pl.winSchema
		sinkAll(b, "windows", winRows, func(r Row) string { return string(r.AppendJSON(nil, s)) }, "")
	}
	if len(pl.alerts) > 0 || pl.silentMs > 0 {
		alerts := stream.KeyedProcess(keyed, uid("alerts"), func() operators.KeyedProcessFunction[string, Row, Row] {
			return &alertFn{pl: pl, name: cfg.Name, dead: b.dead, count: b.c}
		}).UID(uid("alerts")).SetParallelism(cfg.Parallelism).
			StateSettings(stream.KeyStateSetting(pl.key.Name) + "; " + alertsDigest(cfg.Alerts))
		sinkAll(b, "dead-letter-alerts", stream.SideOutput(alerts, b.dead), DeadLetter.line, DeadLetterPrefix)
		s := pl.alertSchema
		sinkAll(b, "alerts", alerts, func(r Row) string { return string(r.AppendJSON(nil, s)) }, "")
	}
	return b.finish(), nil
}

type builder struct {
	cfg  *PipelineConfig
	pl   *plan
	env  *stream.Environment
	c    *counters
	out  io.Writer
	dead operators.OutputTag[DeadLetter]
	in   Inputs
	// rejects are the dead letters of the checks before the MQTT sinks
	// (results whose topic is invalid), sent to the dead-letter output
	// "dead-letter-sinks" once every sink is built.
	rejects []*stream.Stream[DeadLetter]
}

// finish connects the dead letters of the sinks' checks to every sink.
func (b *builder) finish() *Job {
	if len(b.rejects) > 0 {
		rejects := b.rejects
		b.rejects = nil
		sinkAll(b, "dead-letter-sinks", rejects[0].Union(rejects[1:]...), DeadLetter.line, DeadLetterPrefix)
	}
	return &Job{c: b.c, fileRead: b.cfg.Source.File != nil}
}

// sinkAll connects s to every sink of the pipeline. what names the output
// ("windows", "alerts", "dead-letter", "rows"): the file sink writes it to
// <dir>/<what>.
func sinkAll[T any](b *builder, what string, s *stream.Stream[T], format func(T) string, prefix string) {
	for i, sc := range b.cfg.Sinks {
		name := b.cfg.Name + "/sink-" + strconv.Itoa(i) + "-" + what
		switch {
		case sc.Stdout != nil:
			f := format
			if prefix != "" {
				f = func(v T) string { return prefix + format(v) }
			}
			s.To(name, func() operators.Sink[T] { return operators.NewPrintSink(b.out, f) }).UID(name).StateSettings(sinkDigest("stdout"))
		case sc.File != nil:
			dir := filepath.Join(sc.File.Dir, what)
			// In a cluster each node has its own dir: a subtask restored on
			// another node commits its parts there from the checkpoint.
			opts := operators.FileSinkOptions{CarryParts: len(b.in.Nodes) > 0}
			s.To(name, func() operators.Sink[T] { return operators.NewFileSinkWith(dir, format, opts) }).UID(name).StateSettings(sinkDigest("file"))
		case sc.MQTT != nil:
			mqttSink(b, name, what, s, format, sc.MQTT)
		}
	}
}

// sinkDigest returns the StateSettings of a sink of kind (stdout, file,
// mqtt). A sink's uid is its position in sinks: (<pipeline>/sink-<i>-
// <output>), so a sink added before the others takes the uid, and the
// state, of the one that was there: its kind in the snapshot makes a
// restore refuse another kind's state (a file sink reading the results a
// write-ahead MQTT sink held as its pending parts) with both named.
func sinkDigest(kind string) string { return "sink " + kind }

// lockedWriter serialises the writes of a pipeline's print sinks.
type lockedWriter struct {
	mu sync.Mutex // guards w
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// generatorSource emits the records of operators.SensorGenerator as Rows
// of GeneratorSchema: record i has id "sensor_<i mod keys>", ts
// (start + i/keys) seconds and a temp in [20, 40) hashed from i. The ids
// are built once, so emitting allocates nothing.
func generatorSource(cfg operators.GeneratorConfig) *operators.Generator[Row] {
	if cfg.Keys == 0 {
		cfg.Keys = operators.DefaultGeneratorKeys
	}
	if cfg.Start == 0 {
		cfg.Start = operators.DefaultGeneratorStart
	}
	ids := make([]string, max(cfg.Keys, 1))
	for k := range ids {
		ids[k] = "sensor_" + strconv.Itoa(k)
	}
	keys, start := int64(len(ids)), cfg.Start
	gs := GeneratorSchema()
	id, temp, ts := gs.Field(0).Slot, gs.Field(1).Slot, gs.Field(2).Slot
	return operators.NewGenerator(cfg, func(i int64) Row {
		var r Row
		r.SetStr(id, ids[i%keys])
		r.SetInt(ts, (start+i/keys)*1000)
		r.SetFloat(temp, GeneratorTemp(i))
		return r
	})
}

// GeneratorTemp is the temperature of the generator's record i, the same
// as operators.SensorGenerator's: a SplitMix64 hash of i mapped to [20,
// 40) with two decimals.
func GeneratorTemp(i int64) float64 {
	x := uint64(i) + 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	x ^= x >> 31
	return float64(2000+x%2000) / 100
}

// prepareFn decodes (when decode is set), filters and computes, sending
// what fails to the dead-letter side output.
type prepareFn[T any] struct {
	b      *builder
	decode func(string, *Row) error
	raw    func(T) string
	reject func(T) error // nil, or the reason a record is a dead letter before decoding
	// origin, when not nil, says where a record came from, for its dead
	// letter's error: two dead letters of equal payloads then differ, and
	// so do their msg_ids. The row carries it on, for the dead letters
	// made of it later (late, alerts).
	origin   func(T, *operators.Context) Origin
	ctx      *operators.Context
	cur      Origin // the origin of the record being prepared
	ev       *evaluator
	strs     []int             // slots of the decoded string fields
	interned map[string]string // decoded strings, copied out of their payloads
	row      Row               // the record being prepared
	// aheadLimit is the latest event time taken without reading the
	// clock: the clock, when last read, plus event_time.max_ahead. The
	// clock is read again only for a record past it.
	aheadLimit int64
}

// maxInterned bounds the distinct strings a prepare subtask keeps to
// share between records; past it the table starts again.
const maxInterned = 4096

// fileLine is a line of a file source: its text, or, for a line longer
// than operators.MaxLineSize, its first bytes and the error that makes it
// a dead letter.
type fileLine struct {
	text string
	err  error
}

func (l fileLine) raw() string   { return l.text }
func (l fileLine) reject() error { return l.err }

// payloadString returns m's payload as a string without copying it: the
// Message owns its payload and nothing writes to it. The string does not
// outlive the record's preparation: the decoded string fields are interned
// copies (prepareFn.intern) and a dead letter copies it.
func payloadString(m mqtt.Message) string {
	return unsafe.String(unsafe.SliceData(m.Payload), len(m.Payload))
}

// prepare decodes the records of in into Rows; reject, when not nil,
// names the records that are dead letters before decoding.
func prepare[T any](b *builder, in *stream.Stream[T], decode func(string, *Row) error, raw func(T) string, reject func(T) error,
	origin func(T, *operators.Context) Origin) *stream.Stream[Row] {
	name := b.cfg.Name + "/prepare"
	return stream.Process(in, name, func() operators.ProcessFunction[T, Row] {
		return &prepareFn[T]{b: b, decode: decode, raw: raw, reject: reject, origin: origin}
	})
}

func (f *prepareFn[T]) Open(ctx *operators.Context) error {
	f.ctx = ctx
	f.ev = newEvaluator(f.b.pl.schema)
	for _, fd := range f.b.pl.in.Fields() {
		if fd.Type == String {
			f.strs = append(f.strs, fd.Slot)
		}
	}
	f.interned = make(map[string]string)
	f.aheadLimit = math.MinInt64
	return nil
}

// intern replaces the decoded string fields of r, which share the memory
// of the payload they were decoded from, by copies shared between
// records: a key kept in state must not keep its whole payload alive, and
// a repeated value (a sensor id) costs no allocation.
func (f *prepareFn[T]) intern(r *Row) {
	for _, slot := range f.strs {
		v := r.Str(slot)
		if v == "" {
			continue
		}
		c, ok := f.interned[v]
		if !ok {
			if len(f.interned) >= maxInterned {
				clear(f.interned)
			}
			c = strings.Clone(v)
			f.interned[c] = c
		}
		r.SetStr(slot, c)
	}
}

func (f *prepareFn[T]) fail(ctx *operators.ProcessContext[Row], payload string, err error) {
	// payload may share the memory of a message's payload: keep a copy.
	msg := err.Error()
	if !f.cur.IsZero() {
		msg += " (" + f.cur.String() + ")"
	}
	d := newDeadLetter(f.b.cfg.Name, msg, payload)
	f.b.c.deadLetter(d)
	f.b.dead.Emit(ctx, d)
}

func (f *prepareFn[T]) ProcessElement(v T, ctx *operators.ProcessContext[Row]) error {
	// The row is decoded in place: a local one passed to the decoder
	// through a function value would be allocated for every record.
	f.row = Row{}
	r := &f.row
	if f.origin != nil {
		f.cur = f.origin(v, f.ctx)
	}
	if f.reject != nil {
		if err := f.reject(v); err != nil {
			f.fail(ctx, f.raw(v), err)
			return nil
		}
	}
	if f.decode != nil {
		line := f.raw(v)
		if err := f.decode(line, r); err != nil {
			f.fail(ctx, line, err)
			return nil
		}
		f.intern(r)
		r.origin = f.cur
	} else {
		*r = any(v).(Row)
	}
	pl := f.b.pl
	if pl.filter != nil {
		ok, err := f.ev.test(pl.filter, r)
		if err != nil {
			f.fail(ctx, string(r.AppendJSON(nil, pl.in)), fmt.Errorf("filter: %w", err))
			return nil
		}
		if !ok {
			return nil
		}
	}
	for i := range pl.compute {
		if err := f.ev.compute(&pl.compute[i], r); err != nil {
			f.fail(ctx, string(r.AppendJSON(nil, pl.in)), err)
			return nil
		}
	}
	if pl.keyed {
		if k := r.Str(pl.key.Slot); len(k) > MaxKeyBytes {
			f.fail(ctx, string(r.AppendJSON(nil, pl.schema)), fmt.Errorf("%w: %s is %d bytes, more than %d", ErrKeyTooLong, pl.key.Name, len(k), MaxKeyBytes))
			return nil
		}
	}
	if pl.eventTime {
		if ts := r.Int(pl.ts.Slot); ts < MinEventTime || ts > MaxEventTime {
			f.fail(ctx, string(r.AppendJSON(nil, pl.schema)), fmt.Errorf("%w: %s = %d ms", ErrEventTimeRange, pl.ts.Name, ts))
			return nil
		}
		if pl.maxAhead > 0 {
			if err := f.checkAhead(ctx, r.Int(pl.ts.Slot)); err != nil {
				f.fail(ctx, string(r.AppendJSON(nil, pl.schema)), err)
				return nil
			}
		}
	}
	ctx.Emit(*r)
	return nil
}

// checkAhead returns an ErrEventTimeAhead error when the event time ts is
// ahead of the processing-time clock by more than event_time.max_ahead:
// such a record would move the watermark past every correct reading to
// come (a device whose clock was set to a wrong date), making them all
// late until the clock caught up.
func (f *prepareFn[T]) checkAhead(ctx *operators.ProcessContext[Row], ts int64) error {
	if ts <= f.aheadLimit {
		return nil
	}
	pl := f.b.pl
	now := ctx.CurrentProcessingTime()
	f.aheadLimit = now + pl.maxAhead.Milliseconds()
	if ts <= f.aheadLimit {
		return nil
	}
	// The error says nothing of the clock: a dead letter's msg_id is a
	// function of its text, and a replay at a later time must give the
	// same one.
	return fmt.Errorf("%w: %s = %d ms (%s) is more than event_time.max_ahead (%s) ahead of the clock",
		ErrEventTimeAhead, pl.ts.Name, ts, formatMillis(ts), pl.maxAhead)
}

// formatMillis formats ms since the Unix epoch as RFC 3339 in UTC.
func formatMillis(ms int64) string {
	return time.UnixMilli(ms).UTC().Format(time.RFC3339Nano)
}

// The event times a pipeline accepts, in milliseconds since the Unix
// epoch: ±2^53 ms (about ±285,000 years), the integers a float64 holds
// exactly. A record outside goes to the dead-letter output: its
// watermark, window bounds and timers would overflow int64 or push the
// watermark to the end of time.
const (
	MinEventTime int64 = -1 << 53
	MaxEventTime int64 = 1 << 53
)

// SourceBatchBytes caps the batches of messages an MQTT source sends to
// the decoding subtasks (parallelism above 1) in payload bytes: a channel
// between them then holds at most node.memory.credits × (64 KiB + one
// message), however large the messages, where a batch of batch_size
// messages of 1 MiB each held 256 MiB.
const SourceBatchBytes = 64 << 10

// messageBytes is what an MQTT message weighs in a batch: its payload and
// topic.
func messageBytes(m mqtt.Message) int { return len(m.Payload) + len(m.Topic) }
