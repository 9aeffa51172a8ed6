package pipeline

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"net"
	"net/url"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/expr-lang/expr"
	"github.com/expr-lang/expr/ast"
	"github.com/expr-lang/expr/vm"

	"github.com/edgedio/edged/keygroup"
	"github.com/edgedio/edged/mqtt"
	"github.com/edgedio/edged/mqtt/ingestlog"
	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/snapshot"
)

// Limits of a pipeline.
const (
	maxAggregates = 8
	maxAlerts     = 8
)

// Names of the fields of results.
const (
	fieldWindowStart = "window_start"
	fieldWindowEnd   = "window_end"
	fieldAlert       = "alert"
	fieldSince       = "since"
	fieldAt          = "at"
)

var identRe = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
var nameRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]*$`)

// MaxNameLen is the longest pipeline name, in bytes: the name is a
// directory's (the ingest log's, <data_dir>/ingest/<name>), and 255 bytes
// is the longest file name of common file systems (ext4, FAT, btrfs).
const MaxNameLen = 255

// program is an expression compiled against a schema, with the fields it
// reads.
type program struct {
	src   string
	prog  *vm.Program
	reads []Field
}

type computed struct {
	field Field
	typ   Type
	program
}

type aggSpec struct {
	name  string
	fn    string
	field Field
	out   Field
}

type alertSpec struct {
	name  string
	forMs int64
	program
}

// plan is a validated pipeline, resolved against its schema: built once by
// Validate and shared read-only by all subtasks.
type plan struct {
	in        *Schema // rows as decoded or generated
	schema    *Schema // after compute
	json      *JSONDecoder
	csv       *CSVDecoder
	filter    *program
	compute   []computed
	key       Field
	keyed     bool
	ts        Field
	eventTime bool
	// maxAhead is event_time.max_ahead: how far ahead of the clock an
	// event time may be; 0 for no bound.
	maxAhead time.Duration

	windowed  bool
	assigner  operators.WindowAssigner
	lateness  time.Duration
	aggs      []aggSpec
	winSchema *Schema
	winKey    Field
	winStart  Field
	winEnd    Field

	alerts      []alertSpec
	silentMs    int64
	silentName  string
	alertSchema *Schema
	alKey       Field
	alName      Field
	alSince     Field
	alAt        Field
}

// MaxSimulatorRate is the highest node.simulator.rate, in readings per
// second: more than one device's broker takes, and one whose number of
// readings per tick still fits an int.
const MaxSimulatorRate = 1_000_000

// Validate checks every pipeline, reports every problem at once as a
// *ConfigError naming the YAML key paths, and compiles the pipelines
// (schema, decoders, expressions) for Build.
func (c *Config) Validate() error {
	var p problems
	c.validate(&p)
	return p.err("")
}

func (c *Config) validate(p *problems) {
	if sim := c.Node.Simulator; sim != nil {
		if sim.Sensors < 1 {
			p.add("node.simulator.sensors", fmt.Sprintf("(%d) must be at least 1", sim.Sensors))
		}
		if !(sim.Rate > 0 && sim.Rate <= MaxSimulatorRate) { // NaN included
			p.add("node.simulator.rate", fmt.Sprintf("(%v) must be a number above 0 and at most %d readings/s", sim.Rate, MaxSimulatorRate))
		}
		if sim.Topic == "" {
			p.add("node.simulator.topic", "is required")
		} else if err := checkTopicTemplate(sim.Topic); err != "" {
			p.add("node.simulator.topic", fmt.Sprintf("%q %s", sim.Topic, err))
		} else {
			for _, name := range placeholders(sim.Topic) {
				if name != "id" {
					p.add("node.simulator.topic", fmt.Sprintf("%q: the simulator fills only {id}", sim.Topic))
					break
				}
			}
		}
	}
	c.Node.Memory.validate(p)
	checkAddr(p, "node.broker", c.Node.Broker)
	checkAddr(p, "node.listen", c.Node.Listen)
	if broker := c.Node.Broker; broker != "" && sameListenAddr(broker, c.Node.Listen) {
		p.add("node.listen", fmt.Sprintf("%q is node.broker's address too (%q): the REST API and the embedded broker each need their own port", c.Node.Listen, broker))
	} else if broker == "" && c.NeedsEmbeddedBroker() && sameListenAddr(mqtt.DefaultBrokerAddress, c.Node.Listen) {
		p.add("node.listen", fmt.Sprintf("%q is the embedded broker's default address (node.broker unset): the REST API and the embedded broker each need their own port", c.Node.Listen))
	}
	if c.Cluster != nil {
		c.Cluster.validate(p)
	}
	if len(c.Pipelines) == 0 {
		p.add("pipelines", "at least one pipeline is required")
	}
	names := map[string]int{}
	for i := range c.Pipelines {
		pc := &c.Pipelines[i]
		path := fmt.Sprintf("pipelines[%d]", i)
		if j, dup := names[pc.Name]; dup && pc.Name != "" {
			p.add(path+".name", fmt.Sprintf("%q is taken by pipelines[%d]", pc.Name, j))
		}
		names[pc.Name] = i
		pc.plan = pc.compile(p, path)
	}
	if c.Cluster != nil {
		for i, pl := range c.Cluster.Placement {
			name, _, ok := strings.Cut(pl.Operator, "/")
			if _, known := names[name]; pl.Operator != "" && (!ok || !known) {
				p.add(fmt.Sprintf("cluster.placement[%d].operator", i),
					fmt.Sprintf("%q names no pipeline: an operator's uid is \"<pipeline>/<operator>\"", pl.Operator))
			}
		}
	}
	checkSharedDirs(p, c.Pipelines)
	checkBatchBytes(p, c.Pipelines)
	checkTopicRoom(p, c.Pipelines)
	c.checkFeedback(p)
}

// EmbeddedMaxMessageBytes returns the embedded broker's bound on
// packets: the largest source.mqtt.max_message_bytes of the pipelines
// reading it (mqtt.DefaultMaxMessageBytes for those that do not set it,
// and when none reads it).
func (c *Config) EmbeddedMaxMessageBytes() int64 { return embeddedMaxMessage(c.Pipelines) }

func embeddedMaxMessage(pcs []PipelineConfig) int64 {
	var bound int64
	for _, pc := range pcs {
		if src := pc.Source.MQTT; src != nil && src.Broker == "" {
			bound = max(bound, cmp.Or(src.MaxMessageBytes, mqtt.DefaultMaxMessageBytes))
		}
	}
	if bound == 0 {
		return mqtt.DefaultMaxMessageBytes
	}
	return bound
}

// batchTopicRoom is what checkBatchBytes keeps free for a batched
// message's topic (its template filled) and packet header.
const batchTopicRoom = 4 << 10

// checkBatchBytes refuses a batched MQTT sink whose messages may not fit
// the embedded broker's bound on packets (the largest
// source.mqtt.max_message_bytes of the pipelines reading it): the broker
// would close the sink's connection at the first such message, and the
// job would restart and fail again on it.
func checkBatchBytes(p *problems, pcs []PipelineConfig) {
	bound := embeddedMaxMessage(pcs)
	for i, pc := range pcs {
		for j, s := range pc.Sinks {
			if s.MQTT == nil || s.MQTT.Batch <= 1 {
				continue
			}
			bb := int64(cmp.Or(s.MQTT.BatchBytes, mqtt.DefaultBatchBytes))
			if bb+int64(len(s.MQTT.Topic))+batchTopicRoom > bound {
				p.add(fmt.Sprintf("pipelines[%d].sinks[%d].mqtt.batch_bytes", i, j), fmt.Sprintf(
					"(%d) does not fit the embedded broker's packets of at most %d bytes (the largest source.mqtt.max_message_bytes of the pipelines reading it) with %d bytes for the topic: set it to at most %d",
					bb, bound, len(s.MQTT.Topic)+batchTopicRoom, bound-int64(len(s.MQTT.Topic))-batchTopicRoom))
			}
		}
	}
}

// checkTopicRoom refuses a topic filter of a pipeline reading the
// embedded broker whose every topic is too long for a message over the
// broker's bound (the largest source.mqtt.max_message_bytes of the
// pipelines reading it) to be cut to a dead letter: the broker would end
// the connection of a device that sends one, and a device that keeps its
// session would send it again at every reconnect, nothing after it
// getting through.
func checkTopicRoom(p *problems, pcs []PipelineConfig) {
	bound := embeddedMaxMessage(pcs)
	if bound < 64 {
		return // max_message_bytes is reported already
	}
	room := mqtt.LongestCutTopic(bound)
	for i, pc := range pcs {
		src := pc.Source.MQTT
		if src == nil || src.Broker != "" {
			continue
		}
		for j, f := range src.Topics {
			if n := int64(shortestTopic(f)); n > room {
				p.add(fmt.Sprintf("pipelines[%d].source.mqtt.topics[%d]", i, j), fmt.Sprintf(
					"%q matches only topics of at least %d bytes, more than the %d a message over the embedded broker's max_message_bytes (%d, the largest of the pipelines reading it) may have to become a dead letter: the broker would end the connection of a device sending one; raise max_message_bytes to at least %d or shorten the topic",
					f, n, room, bound, bound+n-room))
			}
		}
	}
}

// shortestTopic is the length in bytes of the shortest topic the filter
// f matches: a "+" level matches an empty one, and a trailing "#" its
// parent level too.
func shortestTopic(f string) int {
	if f == "#" {
		return 0
	}
	levels := strings.Split(strings.TrimSuffix(f, "/#"), "/")
	n := len(levels) - 1
	for _, l := range levels {
		if l != "+" {
			n += len(l)
		}
	}
	return n
}

// checkAddr checks a host:port the node listens on; empty means the
// default.
func checkAddr(p *problems, path, addr string) {
	if addr == "" {
		return
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		p.add(path, fmt.Sprintf("%q must be host:port (%v)", addr, err))
		return
	}
	n, err := strconv.ParseUint(port, 10, 64)
	switch {
	case err != nil && errors.Is(err, strconv.ErrRange), err == nil && n > 65535:
		p.add(path, fmt.Sprintf("%q must be host:port with a port in [0, 65535]", addr))
	case err != nil:
		p.add(path, fmt.Sprintf("%q must be host:port with a numeric port", addr))
	}
}

// NeedsEmbeddedBroker reports whether the node runs the embedded broker:
// a pipeline reads it, the simulator publishes to it, or a pipeline that
// does not read an external broker has an MQTT sink.
func (c *Config) NeedsEmbeddedBroker() bool {
	if c.Node.Simulator != nil {
		return true
	}
	for _, pc := range c.Pipelines {
		src := pc.Source.MQTT
		if src != nil && src.Broker == "" {
			return true
		}
		if src != nil {
			continue // its sinks can publish to its external broker
		}
		for _, s := range pc.Sinks {
			if s.MQTT != nil {
				return true
			}
		}
	}
	return false
}

// sameListenAddr reports whether two host:port addresses to listen on
// take the same port on one host: the same port, on the same host or
// where one of them is a wildcard (every interface). Port 0 (any free
// port) is never the same.
func sameListenAddr(a, b string) bool {
	ha, pa, err := net.SplitHostPort(a)
	if err != nil {
		return false
	}
	hb, pb, err := net.SplitHostPort(b)
	if err != nil || pa != pb || pa == "0" {
		return false
	}
	wild := func(h string) bool { return h == "" || h == "0.0.0.0" || h == "::" }
	return ha == hb || wild(ha) || wild(hb)
}

// checkSharedDirs refuses two pipelines with one checkpoint directory: a
// snapshot store belongs to one job, and the retention of one would
// delete the checkpoints of the other.
func checkSharedDirs(p *problems, pcs []PipelineConfig) {
	owner := map[string]int{}
	for i, pc := range pcs {
		if pc.Checkpoint.Dir == "" {
			continue
		}
		key := cleanDir(pc.Checkpoint.Dir)
		if j, ok := owner[key]; ok {
			p.add(fmt.Sprintf("pipelines[%d].checkpoint.dir", i), fmt.Sprintf(
				"%q is also the checkpoint dir of pipelines[%d] (%q): each pipeline needs its own (retention would delete the other's checkpoints)",
				pc.Checkpoint.Dir, j, pcs[j].Name))
			continue
		}
		owner[key] = i
	}
}

// cleanDir is the absolute, cleaned form of dir (cleaned only when the
// working directory is unknown).
func cleanDir(dir string) string {
	if abs, err := filepath.Abs(dir); err == nil {
		return abs
	}
	return filepath.Clean(dir)
}

// Validate checks one pipeline as Config.Validate does, with paths
// starting at `pipeline`.
func (pc *PipelineConfig) Validate() error {
	var p problems
	pc.plan = pc.compile(&p, "pipeline")
	return p.err("")
}

// compile validates pc and returns its plan (nil if there were problems).
func (pc *PipelineConfig) compile(p *problems, path string) *plan {
	before := len(*p)
	at := func(k string) string { return join(path, k) }
	pl := &plan{}

	switch {
	case pc.Name == "":
		p.add(at("name"), "is required")
	case !nameRe.MatchString(pc.Name):
		p.add(at("name"), fmt.Sprintf("%q must start with a letter or digit, followed by letters, digits, '_', '-' or '.'", pc.Name))
	case len(pc.Name) > MaxNameLen:
		p.add(at("name"), fmt.Sprintf("(%d bytes) must be at most %d bytes: it names the pipeline's directories", len(pc.Name), MaxNameLen))
	}
	switch {
	case pc.Parallelism < 1:
		p.add(at("parallelism"), fmt.Sprintf("(%d) must be at least 1", pc.Parallelism))
	case pc.Parallelism > keygroup.DefaultMaxParallelism:
		p.add(at("parallelism"), fmt.Sprintf("(%d) must not exceed the max parallelism (%d, the number of key groups)", pc.Parallelism, keygroup.DefaultMaxParallelism))
	}

	// The sinks' topics are checked against the schemas built from here
	// to the alerts, unless those had errors of their own.
	beforeSchemas := len(*p)
	pl.in = pc.compileSource(p, at("source"), pl)
	schema := pl.in
	if schema == nil || schema.Len() == 0 && len(*p) > beforeSchemas {
		schema = &Schema{unknown: true}
	}

	if et := pc.EventTime; et != nil {
		ep := at("event_time")
		if f, ok := lookup(p, ep+".field", schema, et.Field, Time, Int); ok {
			pl.ts, pl.eventTime = f, true
		}
		if et.MaxOutOfOrderness < 0 {
			p.add(ep+".max_out_of_orderness", fmt.Sprintf("(%s) must not be negative", et.MaxOutOfOrderness))
		}
		if et.IdleTimeout < 0 {
			p.add(ep+".idle_timeout", fmt.Sprintf("(%s) must not be negative", et.IdleTimeout))
		}
		switch {
		case et.MaxAhead == nil && pc.Source.Generator == nil:
			pl.maxAhead = DefaultMaxAhead
		case et.MaxAhead == nil:
		case *et.MaxAhead < 0:
			p.add(ep+".max_ahead", fmt.Sprintf("(%s) must not be negative; 0s means no bound", *et.MaxAhead))
		default:
			pl.maxAhead = *et.MaxAhead
		}
	}

	if pc.Filter != "" {
		if prog, ok := compileExpr(p, at("filter"), schema, pc.Filter, true); ok {
			pl.filter = &prog
		}
	}
	if len(pc.Compute) > 0 {
		schema = schema.clone()
		for _, ne := range pc.Compute {
			cp := at("compute." + ne.Name)
			if !identRe.MatchString(ne.Name) {
				p.add(cp, "is not a valid field name")
				continue
			}
			if schema.Index(ne.Name) >= 0 {
				p.add(cp, "names an existing field")
				continue
			}
			prog, ok := compileExpr(p, cp, schema, ne.Expr, false)
			if !ok {
				continue
			}
			t, ok := typeOfResult(prog.prog.Node().Type())
			if !ok {
				p.add(cp, fmt.Sprintf("cannot tell the type of %q (%v); convert it with float(), int(), string()", ne.Expr, prog.prog.Node().Type()))
				continue
			}
			f, err := schema.add(ne.Name, t)
			if err != nil {
				p.add(cp, err.Error())
				continue
			}
			pl.compute = append(pl.compute, computed{field: f, typ: t, program: prog})
		}
	}
	pl.schema = schema

	needKey := pc.Window != nil || len(pc.Alerts) > 0 || pc.Silent != nil
	if pc.Key != "" {
		if f, ok := lookup(p, at("key"), schema, pc.Key, String); ok {
			pl.key, pl.keyed = f, true
		}
	} else if needKey {
		p.add(at("key"), "is required with window, alerts or silent")
	}

	if w := pc.Window; w != nil {
		pc.compileWindow(p, at("window"), pl)
	}
	pc.compileAlerts(p, path, pl)
	schemasOK := len(*p) == beforeSchemas

	if len(pc.Sinks) == 0 {
		p.add(at("sinks"), "at least one sink is required")
	}
	for i, s := range pc.Sinks {
		sp := fmt.Sprintf("%s[%d]", at("sinks"), i)
		n := 0
		if s.Stdout != nil {
			n++
		}
		if s.File != nil {
			n++
			if s.File.Dir == "" {
				p.add(sp+".file.dir", "is required")
			}
		}
		if s.MQTT != nil {
			n++
			if s.MQTT.Topic == "" {
				p.add(sp+".mqtt.topic", "is required")
			} else if err := checkTopicTemplate(s.MQTT.Topic); err != "" {
				p.add(sp+".mqtt.topic", fmt.Sprintf("%q %s", s.MQTT.Topic, err))
			} else if schemasOK {
				pl.checkTopicFields(p, sp+".mqtt.topic", s.MQTT.Topic)
			}
			if s.MQTT.QoS < 0 || s.MQTT.QoS > 2 {
				p.add(sp+".mqtt.qos", fmt.Sprintf("(%d) must be 0, 1 or 2", s.MQTT.QoS))
			}
			if s.MQTT.Batch < 0 || s.MQTT.Batch > mqtt.MaxBatch {
				p.add(sp+".mqtt.batch", fmt.Sprintf("(%d) must be between 0 and %d results per message", s.MQTT.Batch, mqtt.MaxBatch))
			}
			if s.MQTT.BatchBytes < 0 {
				p.add(sp+".mqtt.batch_bytes", fmt.Sprintf("(%d) must not be negative", s.MQTT.BatchBytes))
			} else if s.MQTT.BatchBytes > 0 && s.MQTT.Batch <= 1 {
				p.add(sp+".mqtt.batch_bytes", fmt.Sprintf("(%d) is set but batch is %d: results go one per message", s.MQTT.BatchBytes, s.MQTT.Batch))
			}
			if s.MQTT.MaxHeld < 0 {
				p.add(sp+".mqtt.max_held", fmt.Sprintf("(%d) must not be negative (0 sets no bound)", s.MQTT.MaxHeld))
			}
		}
		if n != 1 {
			p.add(sp, "must have exactly one of stdout, file, mqtt")
		}
	}

	addSnapshotProblems(p, path, pc.Checkpoint.Validate())
	addSnapshotProblems(p, path, pc.Restart.Validate())
	for _, k := range pc.Restart.UnusedKeys() {
		strategy := pc.Restart.Strategy
		if strategy == snapshot.DefaultRestartConfig().Strategy {
			strategy += " (the default)"
		}
		p.add(at("restart."+k), fmt.Sprintf("is not a setting of restart strategy %s: set restart.strategy to the strategy it belongs to", strategy))
	}
	switch pc.StateBackend {
	case "", "memory":
	case "bolt":
		if pc.StateDir == "" {
			p.add(at("state_dir"), "is required with state_backend bolt")
		}
	default:
		p.add(at("state_backend"), fmt.Sprintf("%q must be memory or bolt", pc.StateBackend))
	}

	if len(*p) > before {
		return nil
	}
	return pl
}

// addSnapshotProblems adds the problems of a snapshot Validate, whose
// messages start with their key path ("checkpoint.interval (...) must
// ..."), under path.
func addSnapshotProblems(p *problems, path string, err error) {
	if err == nil {
		return
	}
	var errs []error
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	} else {
		errs = []error{err}
	}
	for _, e := range errs {
		msg := strings.TrimPrefix(e.Error(), snapshot.ErrInvalidConfig.Error()+": ")
		key, rest, _ := strings.Cut(msg, " ")
		p.add(join(path, key), rest)
	}
}

// compileSource validates the source and returns the schema of its rows.
func (pc *PipelineConfig) compileSource(p *problems, path string, pl *plan) *Schema {
	s := pc.Source
	n := 0
	for _, set := range []bool{s.Generator != nil, s.File != nil, s.MQTT != nil} {
		if set {
			n++
		}
	}
	if n != 1 {
		p.add(path, "must have exactly one of generator, file, mqtt")
		return nil
	}
	switch {
	case s.Generator != nil:
		g := s.Generator
		gp := path + ".generator"
		if g.Count < 0 {
			p.add(gp+".count", fmt.Sprintf("(%d) must not be negative", g.Count))
		}
		if math.IsNaN(g.Rate) || math.IsInf(g.Rate, 0) || g.Rate < 0 {
			p.add(gp+".rate", fmt.Sprintf("(%v) must be a finite number >= 0", g.Rate))
		}
		if g.Keys < 0 {
			p.add(gp+".keys", fmt.Sprintf("(%d) must not be negative", g.Keys))
		}
		return GeneratorSchema()
	case s.File != nil:
		f := s.File
		fp := path + ".file"
		if f.Path == "" {
			p.add(fp+".path", "is required")
		}
		return compileFields(p, fp, f.Format, f.Delimiter, f.Fields, pl)
	default:
		m := s.MQTT
		mp := path + ".mqtt"
		if m.Broker != "" {
			if problem := checkBrokerURL(m.Broker); problem != "" {
				p.add(mp+".broker", problem)
			}
		}
		if len(m.Topics) == 0 {
			p.add(mp+".topics", "at least one topic is required")
		}
		for i, t := range m.Topics {
			if err := checkTopicFilter(t); err != "" {
				p.add(fmt.Sprintf("%s.topics[%d]", mp, i), fmt.Sprintf("%q %s", t, err))
			}
		}
		switch m.QoS {
		case 1, 2:
		case 0:
			p.add(mp+".qos", "(0) is not supported: a message is acknowledged only once the ingest log holds it, which needs QoS 1 or 2")
		default:
			p.add(mp+".qos", fmt.Sprintf("(%d) must be 1 or 2", m.QoS))
		}
		if m.MaxPending < 0 {
			p.add(mp+".max_pending", fmt.Sprintf("(%d) must not be negative", m.MaxPending))
		}
		if d := m.AckDelay; d != nil && (*d < 0 || *d > mqtt.MaxAckDelay) {
			p.add(mp+".ack_delay", fmt.Sprintf("(%v) must be between 0s (no wait) and %v", *d, mqtt.MaxAckDelay))
		}
		switch m.Client {
		case "", mqtt.ClientPaho:
		case mqtt.ClientDirect:
			if u, err := url.Parse(m.Broker); m.Broker != "" && err == nil && (u.Scheme == "ws" || u.Scheme == "wss") {
				p.add(mp+".client", fmt.Sprintf("(direct) does not dial %q (WebSocket): use client: paho", redactedURL(m.Broker)))
			}
		default:
			p.add(mp+".client", fmt.Sprintf("(%q) must be %q or %q", m.Client, mqtt.ClientDirect, mqtt.ClientPaho))
		}
		// A message the pipeline takes must fit in one record of its
		// ingest log.
		if limit := ingestlog.DefaultOptions().MaxMessageBytes(); m.MaxMessageBytes < 0 || m.MaxMessageBytes > limit {
			p.add(mp+".max_message_bytes", fmt.Sprintf("(%d) must not be negative nor exceed what one ingest-log record holds (%d bytes with the %d-byte segments; 0 means the default, %d)",
				m.MaxMessageBytes, limit, ingestlog.DefaultOptions().SegmentBytes, mqtt.DefaultMaxMessageBytes))
		} else if m.MaxMessageBytes > 0 && m.MaxMessageBytes < 64 {
			p.add(mp+".max_message_bytes", fmt.Sprintf("(%d) must be at least 64", m.MaxMessageBytes))
		} else if m.LogMaxBytes != 0 {
			msg := cmp.Or(m.MaxMessageBytes, mqtt.DefaultMaxMessageBytes)
			if m.LogMaxBytes < max(4<<20, 4*msg) {
				p.add(mp+".log_max_bytes", fmt.Sprintf("(%d) must be at least 4 MiB and four times max_message_bytes (%d): %d (0 means the default, 1 GiB)",
					m.LogMaxBytes, msg, max(4<<20, 4*msg)))
			}
		}
		pending, window := m.MaxPending, m.RedeliveryWindow
		if pending == 0 {
			pending = 1024
		}
		if window != 0 && (window <= 2*pending || window >= 1<<16) {
			p.add(mp+".redelivery_window", fmt.Sprintf("(%d) must exceed twice max_pending (%d) and stay below 65536", window, pending))
		}
		return compileFields(p, mp, m.Format, m.Delimiter, m.Fields, pl)
	}
}

// GeneratorSchema is the schema of the generator source: id (string), temp
// (float) and ts (time).
func GeneratorSchema() *Schema {
	s := &Schema{}
	s.add("id", String)
	s.add("temp", Float)
	s.add("ts", Time)
	return s
}

// checkTopicFilter checks an MQTT subscription filter; it returns what is
// wrong or "".
func checkTopicFilter(t string) string {
	if t == "" {
		return "must not be empty"
	}
	levels := strings.Split(t, "/")
	for i, l := range levels {
		switch {
		case l == "#" && i != len(levels)-1:
			return "may have # only as its last level"
		case l != "#" && strings.Contains(l, "#"):
			return "may have # only as a whole level"
		case l != "+" && strings.Contains(l, "+"):
			return "may have + only as a whole level"
		}
	}
	return ""
}

// checkTopicTemplate checks an MQTT publish topic with {field}
// placeholders.
func checkTopicTemplate(t string) string {
	if strings.ContainsAny(t, "+#") {
		return "must not have wildcards"
	}
	if strings.HasPrefix(t, "$") {
		return "must not start with $ (topics of the broker itself)"
	}
	depth := 0
	for _, c := range t {
		switch c {
		case '{':
			depth++
		case '}':
			depth--
		}
		if depth < 0 || depth > 1 {
			return "has unbalanced braces"
		}
	}
	if depth != 0 {
		return "has unbalanced braces"
	}
	for _, name := range placeholders(t) {
		if name == "" {
			return "has an empty placeholder"
		}
	}
	return ""
}

// placeholders returns the names of the {field} placeholders of a topic
// template whose braces checkTopicTemplate has found balanced.
func placeholders(t string) []string {
	var names []string
	for {
		open := strings.IndexByte(t, '{')
		if open < 0 {
			return names
		}
		end := strings.IndexByte(t[open:], '}')
		if end < 0 {
			return names
		}
		names = append(names, t[open+1:open+end])
		t = t[open+end+1:]
	}
}

// checkTopicFields checks that every placeholder of an MQTT sink's topic
// names a field of every result the sink receives: the window results
// and alerts of a keyed pipeline with either, else the rows.
func (pl *plan) checkTopicFields(p *problems, path, topic string) {
	type output struct {
		what   string
		schema *Schema
	}
	var outs []output
	if !pl.keyed || (!pl.windowed && len(pl.alerts) == 0 && pl.silentMs == 0) {
		outs = append(outs, output{"rows", pl.schema})
	} else {
		if pl.windowed {
			outs = append(outs, output{"window results", pl.winSchema})
		}
		if pl.alertSchema != nil {
			outs = append(outs, output{"alerts", pl.alertSchema})
		}
	}
	for _, name := range placeholders(topic) {
		for _, o := range outs {
			if o.schema == nil || o.schema.Index(name) < 0 {
				p.add(path, fmt.Sprintf("%q: {%s} is not a field of the %s (have %s)", topic, name, o.what, fieldNames(o.schema)))
				return
			}
		}
	}
}

// compileFields builds the schema and decoder of a decoded source.
func compileFields(p *problems, path, format, delim string, fields Fields, pl *plan) *Schema {
	switch format {
	case "json", "csv":
	case "":
		p.add(path+".format", "is required (json or csv)")
	default:
		p.add(path+".format", fmt.Sprintf("%q must be json or csv", format))
	}
	if delim != "" && (format != "csv" || len(delim) != 1) {
		p.add(path+".delimiter", fmt.Sprintf("%q must be one byte, with format csv", delim))
	} else if delim == `"` || delim == "\r" || delim == "\n" {
		p.add(path+".delimiter", fmt.Sprintf("%q must not be a quote (it quotes columns) or a line end", delim))
	}
	if len(fields) == 0 {
		p.add(path+".fields", "at least one field is required")
	}
	s := &Schema{}
	specs := make([]FieldSpec, 0, len(fields))
	ok := true
	for i, fc := range fields {
		fp := path + ".fields." + fc.Name
		bad := func(k, msg string) {
			p.add(join(fp, k), msg)
			ok = false
		}
		if !identRe.MatchString(fc.Name) {
			bad("", "is not a valid field name")
			continue
		}
		t, tok := parseType(fc.Type)
		if !tok {
			if fc.Type == "" {
				bad("type", "is required (string, float, int, bool or time)")
			} else {
				bad("type", fmt.Sprintf("%q must be string, float, int, bool or time", fc.Type))
			}
			continue
		}
		spec := FieldSpec{Column: i}
		switch fc.Unit {
		case "", "ms":
		case "s":
			spec.Unit = Seconds
		default:
			bad("unit", fmt.Sprintf("%q must be ms or s", fc.Unit))
		}
		if fc.Unit != "" && t != Time {
			bad("unit", "applies only to time fields")
		}
		if fc.Column != nil {
			if format != "csv" {
				bad("column", "applies only to format csv")
			} else if *fc.Column < 0 || *fc.Column > 1023 {
				bad("column", fmt.Sprintf("(%d) must be in [0, 1023]", *fc.Column))
			} else {
				spec.Column = *fc.Column
			}
		}
		if fc.Path != "" && format != "json" {
			bad("path", "applies only to format json")
		}
		spec.Path = []string{fc.Name}
		if fc.Path != "" {
			rest, found := strings.CutPrefix(fc.Path, "$.")
			parts := strings.Split(rest, ".")
			if !found || slicesContain(parts, "") {
				bad("path", fmt.Sprintf("%q must look like $.key or $.a.b", fc.Path))
			} else {
				spec.Path = parts
			}
		}
		f, err := s.add(fc.Name, t)
		if err != nil {
			bad("", err.Error())
			continue
		}
		spec.Field = f
		specs = append(specs, spec)
	}
	if !ok || len(specs) == 0 {
		return s
	}
	var err error
	switch format {
	case "json":
		pl.json, err = NewJSONDecoder(specs)
	case "csv":
		d := byte(',')
		if len(delim) == 1 {
			d = delim[0]
		}
		if d == '"' || d == '\r' || d == '\n' {
			return s // refused above
		}
		pl.csv, err = NewCSVDecoder(specs, d)
	}
	if err != nil {
		p.add(path+".fields", strings.TrimPrefix(err.Error(), "pipeline: "))
	}
	return s
}

func slicesContain(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// lookup finds a field of one of the types in want.
func lookup(p *problems, path string, s *Schema, name string, want ...Type) (Field, bool) {
	if name == "" {
		p.add(path, "is required")
		return Field{}, false
	}
	i := s.Index(name)
	if i < 0 && s.unknown {
		return Field{}, false
	}
	if i < 0 {
		p.add(path, fmt.Sprintf("%q is not a field (have %s)", name, fieldNames(s)))
		return Field{}, false
	}
	f := s.Field(i)
	for _, t := range want {
		if f.Type == t {
			return f, true
		}
	}
	ws := make([]string, len(want))
	for i, t := range want {
		ws[i] = t.String()
	}
	p.add(path, fmt.Sprintf("field %q is a %s, want %s", name, f.Type, strings.Join(ws, " or ")))
	return Field{}, false
}

func fieldNames(s *Schema) string {
	if s.Len() == 0 {
		return "none"
	}
	names := make([]string, s.Len())
	for i, f := range s.Fields() {
		names[i] = f.Name
	}
	return strings.Join(names, ", ")
}

// exprEnv returns the type-checking environment of s: each field with a
// value of its Go type.
func exprEnv(s *Schema) map[string]any {
	env := make(map[string]any, s.Len())
	for _, f := range s.Fields() {
		switch f.Type {
		case String:
			env[f.Name] = ""
		case Float:
			env[f.Name] = 0.0
		case Int, Time:
			env[f.Name] = 0
		case Bool:
			env[f.Name] = false
		}
	}
	return env
}

// compileExpr compiles src against s, once.
func compileExpr(p *problems, path string, s *Schema, src string, boolean bool) (program, bool) {
	if strings.TrimSpace(src) == "" {
		p.add(path, "is required")
		return program{}, false
	}
	if s.unknown {
		return program{}, false
	}
	checked, arith := checkedOptions()
	opts := append([]expr.Option{expr.Env(exprEnv(s))}, checked...)
	if boolean {
		opts = append(opts, expr.AsBool())
	}
	prog, err := expr.Compile(src, opts...)
	if err != nil {
		msg, _, _ := strings.Cut(err.Error(), "\n")
		p.add(path, fmt.Sprintf("%q: %s", src, msg))
		return program{}, false
	}
	if arith.err != nil {
		// An operation of constants that no record can make valid.
		p.add(path, fmt.Sprintf("%q: %v", src, arith.err))
		return program{}, false
	}
	var refs identCollector
	node := prog.Node()
	ast.Walk(&node, &refs)
	out := program{src: src, prog: prog}
	for _, f := range s.Fields() {
		if refs[f.Name] {
			out.reads = append(out.reads, f)
		}
	}
	return out, true
}

// identCollector records the identifiers of an expression.
type identCollector map[string]bool

func (c *identCollector) Visit(n *ast.Node) {
	if id, ok := (*n).(*ast.IdentifierNode); ok {
		if *c == nil {
			*c = identCollector{}
		}
		(*c)[id.Value] = true
	}
}

func typeOfResult(t reflect.Type) (Type, bool) {
	if t == nil {
		return 0, false
	}
	switch t.Kind() {
	case reflect.Float64, reflect.Float32:
		return Float, true
	case reflect.Int, reflect.Int64, reflect.Int32, reflect.Int16, reflect.Int8:
		return Int, true
	case reflect.Bool:
		return Bool, true
	case reflect.String:
		return String, true
	}
	return 0, false
}

func (pc *PipelineConfig) compileWindow(p *problems, path string, pl *plan) {
	w := pc.Window
	at := func(k string) string { return path + "." + k }
	positive := func(k string, d time.Duration) bool {
		switch {
		case d <= 0:
			p.add(at(k), fmt.Sprintf("(%s) must be positive", d))
			return false
		case d < time.Millisecond:
			p.add(at(k), fmt.Sprintf("(%s) must be at least 1ms (window times are whole milliseconds)", d))
			return false
		case d%time.Millisecond != 0:
			p.add(at(k), fmt.Sprintf("(%s) must be a whole number of milliseconds (window times are whole milliseconds)", d))
			return false
		}
		return true
	}
	unused := func(k string, d time.Duration) {
		if d != 0 {
			p.add(at(k), fmt.Sprintf("does not apply to %s windows", w.Type))
		}
	}
	et := pl.eventTime || pc.EventTime != nil
	switch w.Type {
	case "tumbling":
		unused("slide", w.Slide)
		unused("gap", w.Gap)
		if positive("size", w.Size) {
			pl.assigner = operators.TumblingProcessingTimeWindows(w.Size)
			if et {
				pl.assigner = operators.TumblingEventTimeWindows(w.Size)
			}
		}
	case "sliding":
		unused("gap", w.Gap)
		okSize, okSlide := positive("size", w.Size), positive("slide", w.Slide)
		if okSize && okSlide && w.Slide > w.Size {
			p.add(at("slide"), fmt.Sprintf("(%s) must not exceed size (%s)", w.Slide, w.Size))
			okSlide = false
		}
		if okSize && okSlide {
			pl.assigner = operators.SlidingProcessingTimeWindows(w.Size, w.Slide)
			if et {
				pl.assigner = operators.SlidingEventTimeWindows(w.Size, w.Slide)
			}
		}
	case "session":
		unused("size", w.Size)
		unused("slide", w.Slide)
		if positive("gap", w.Gap) {
			pl.assigner = operators.ProcessingTimeSessionWindows(w.Gap)
			if et {
				pl.assigner = operators.EventTimeSessionWindows(w.Gap)
			}
		}
	case "":
		p.add(at("type"), "is required (tumbling, sliding or session)")
	default:
		p.add(at("type"), fmt.Sprintf("%q must be tumbling, sliding or session", w.Type))
	}
	if pl.assigner != (operators.WindowAssigner{}) {
		if err := pl.assigner.Validate(); err != nil {
			p.add(path, err.Error())
		}
	}
	switch {
	case w.AllowedLateness < 0:
		p.add(at("allowed_lateness"), fmt.Sprintf("(%s) must not be negative", w.AllowedLateness))
	case w.AllowedLateness%time.Millisecond != 0:
		p.add(at("allowed_lateness"), fmt.Sprintf("(%s) must be a whole number of milliseconds (window times are whole milliseconds)", w.AllowedLateness))
	}
	pl.lateness = w.AllowedLateness
	switch {
	case len(w.Aggregates) == 0:
		p.add(at("aggregates"), "at least one aggregate is required")
	case len(w.Aggregates) > maxAggregates:
		p.add(at("aggregates"), fmt.Sprintf("at most %d aggregates", maxAggregates))
	}
	out := &Schema{}
	var keyName = pc.Key
	if keyName == "" {
		keyName = "key"
	}
	pl.winKey, _ = out.add(keyName, String)
	pl.winStart, _ = out.add(fieldWindowStart, Time)
	pl.winEnd, _ = out.add(fieldWindowEnd, Time)
	for i, a := range w.Aggregates {
		ap := fmt.Sprintf("%s[%d]", at("aggregates"), i)
		spec := aggSpec{name: a.Name, fn: a.Fn}
		okName := true
		if !identRe.MatchString(a.Name) {
			p.add(ap+".name", fmt.Sprintf("%q is not a valid field name", a.Name))
			okName = false
		}
		switch a.Fn {
		case "count":
			if a.Field != "" {
				if _, ok := lookup(p, ap+".field", pl.schema, a.Field, Float, Int, Time, Bool, String); !ok {
					okName = false
				}
			}
		case "sum", "avg", "min", "max", "first", "last":
			f, ok := lookup(p, ap+".field", pl.schema, a.Field, Float, Int, Time, Bool)
			spec.field = f
			okName = okName && ok
		case "":
			p.add(ap+".fn", "is required (count, sum, avg, min, max, first or last)")
			okName = false
		default:
			p.add(ap+".fn", fmt.Sprintf("%q must be count, sum, avg, min, max, first or last", a.Fn))
			okName = false
		}
		if !okName {
			continue
		}
		t := Float
		if a.Fn == "count" {
			t = Int
		}
		f, err := out.add(a.Name, t)
		if err != nil {
			p.add(ap+".name", err.Error())
			continue
		}
		spec.out = f
		pl.aggs = append(pl.aggs, spec)
	}
	pl.windowed = true
	pl.winSchema = out
}

func (pc *PipelineConfig) compileAlerts(p *problems, path string, pl *plan) {
	if len(pc.Alerts) == 0 && pc.Silent == nil {
		return
	}
	if len(pc.Alerts) > maxAlerts {
		p.add(join(path, "alerts"), fmt.Sprintf("at most %d alerts", maxAlerts))
	}
	names := map[string]bool{}
	for i, a := range pc.Alerts {
		ap := fmt.Sprintf("%s[%d]", join(path, "alerts"), i)
		switch {
		case a.Name == "":
			p.add(ap+".name", "is required")
		case names[a.Name]:
			p.add(ap+".name", fmt.Sprintf("%q is taken", a.Name))
		}
		names[a.Name] = true
		if a.For <= 0 {
			p.add(ap+".for", fmt.Sprintf("(%s) must be positive", a.For))
		}
		prog, ok := compileExpr(p, ap+".when", pl.schema, a.When, true)
		if ok {
			pl.alerts = append(pl.alerts, alertSpec{name: a.Name, forMs: msCeil(a.For), program: prog})
		}
	}
	if s := pc.Silent; s != nil {
		if s.For <= 0 {
			p.add(join(path, "silent.for"), fmt.Sprintf("(%s) must be positive", s.For))
		}
		pl.silentMs = msCeil(s.For)
		pl.silentName = s.Name
		if pl.silentName == "" {
			pl.silentName = "silent"
		}
		if names[pl.silentName] {
			p.add(join(path, "silent.name"), fmt.Sprintf("%q is taken by an alert", pl.silentName))
		}
	}
	out := &Schema{}
	keyName := pc.Key
	if keyName == "" {
		keyName = "key"
	}
	pl.alKey, _ = out.add(keyName, String)
	var err error
	if pl.alName, err = out.add(fieldAlert, String); err != nil {
		p.add(join(path, "key"), fmt.Sprintf("%q clashes with the alert fields", keyName))
	}
	pl.alSince, _ = out.add(fieldSince, Time)
	pl.alAt, _ = out.add(fieldAt, Time)
	pl.alertSchema = out
}

// msCeil rounds d up to whole milliseconds.
func msCeil(d time.Duration) int64 {
	ms := d.Milliseconds()
	if time.Duration(ms)*time.Millisecond < d {
		ms++
	}
	return ms
}

// brokerSchemes are the schemes of the external broker URLs the MQTT
// readers dial (the direct reader all but ws and wss, which paho dials).
var brokerSchemes = []string{"tcp", "mqtt", "ssl", "tls", "mqtts", "tcps", "mqtt+ssl", "unix", "ws", "wss"}

// userinfoPassword matches the password of a URL's userinfo, in a URL
// that url.Parse refuses.
var userinfoPassword = regexp.MustCompile(`^([^/@]*://[^/@:]*:)[^/@]*@`)

// redactedURL returns raw with the password of its userinfo, if any,
// replaced by "xxxxx", also when raw does not parse: a problem with a
// broker URL is printed and logged, and must not show its password.
func redactedURL(raw string) string {
	if u, err := url.Parse(raw); err == nil {
		if u.User == nil {
			return raw
		}
		return u.Redacted()
	}
	return userinfoPassword.ReplaceAllString(raw, "${1}xxxxx@")
}

// checkBrokerURL returns what is wrong with broker as the URL of an
// external broker, or "": a known scheme, and a host and a port in
// [1, 65535] (there is no default port; a websocket URL may leave it to
// its scheme), or a socket path for unix://.
func checkBrokerURL(raw string) string {
	broker := redactedURL(raw) // the message names the URL, never its password
	if !strings.Contains(raw, "://") {
		if _, port, err := net.SplitHostPort(broker); err == nil && port != "" && strings.Trim(port, "0123456789") == "" {
			// node.broker's form: the likely mistake.
			return fmt.Sprintf("%q is host:port, not a URL: write tcp://%s", broker, broker)
		}
	}
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Sprintf("%q is not a URL", broker)
	}
	if !slices.Contains(brokerSchemes, u.Scheme) {
		return fmt.Sprintf("%q must be a tcp://, mqtt://, ssl://, tls://, mqtts://, tcps://, mqtt+ssl://, unix://, ws:// or wss:// URL", broker)
	}
	if u.Scheme == "unix" {
		if u.Host == "" && u.Path == "" {
			return fmt.Sprintf("%q has no socket path (unix:///path/to/socket)", broker)
		}
		return ""
	}
	if u.Hostname() == "" {
		return fmt.Sprintf("%q has no host", broker)
	}
	port := u.Port()
	if port == "" {
		if u.Scheme == "ws" || u.Scheme == "wss" {
			return ""
		}
		return fmt.Sprintf("%q has no port (%s://%s:1883, say)", broker, u.Scheme, u.Hostname())
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Sprintf("%q has port %q: it must be in [1, 65535]", broker, port)
	}
	return ""
}
