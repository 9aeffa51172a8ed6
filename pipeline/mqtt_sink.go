package pipeline

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/edgedio/edged/codec"
	"github.com/edgedio/edged/mqtt"
	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/stream"
)

// mqttSink publishes the JSON lines of s to the node's broker. Rows go to
// the sink's topic template, filled from their fields; dead letters go to
// "deadletter/<pipeline>". With checkpoints the results go through a
// write-ahead sink and carry a deterministic "msg_id" (exactly once for a
// consumer that drops duplicate ids); without, they are published as
// they come (at least once). With sc.Batch above 1 both pack the results
// to one topic into JSON-array messages (mqtt.Batch); dead letters still
// go one per message.
//
// A row whose topic is not a valid MQTT topic name (a key such as "#",
// "a+b", invalid UTF-8 or a NUL filled into the template) is sent to the
// dead-letter output by an operator before the sink: it never reaches the
// sink, so it never enters a checkpoint's held results.
func mqttSink[T any](b *builder, name, what string, s *stream.Stream[T], format func(T) string, sc *MQTTSinkConfig) {
	pc := mqtt.DefaultPublisherConfig()
	pc.Broker, pc.ClientID = b.in.Broker, name
	pc.QoS = byte(sc.QoS)
	topic := topicFunc[T](b, what, sc.Topic)
	encode := func(v T) ([]byte, error) { return []byte(format(v)), nil }
	var zero T
	_, isRow := any(zero).(Row)
	batch := mqtt.Batch{} // dead letters, rare, go one per message
	if isRow {
		batch = sc.batch()
		sink := strings.TrimPrefix(name, b.cfg.Name+"/")
		limit := cmp.Or(b.in.BrokerMaxMessageBytes, mqtt.DefaultMaxMessageBytes)
		qos := pc.QoS
		checked := stream.Process(s, name+"/topic", func() operators.ProcessFunction[T, T] {
			return &topicCheck[T]{b: b, sink: sink, topic: topic, format: format, limit: limit, qos: qos}
		})
		b.rejects = append(b.rejects, stream.SideOutput(checked, b.dead))
		s = checked
	}
	if b.cfg.Checkpoint.Interval > 0 {
		s.To(name, func() operators.Sink[T] {
			w := newWALPublisher(pc, topic, format, batch, sc.MaxHeld)
			w.commitWait = b.in.CommitWait
			w.counters, w.sink = b.c, strings.TrimPrefix(name, b.cfg.Name+"/")
			w.reject = sinkReject(b, name, format, &w.logger)
			return w
		}).UID(name).StateSettings(sinkDigest("mqtt"))
		return
	}
	s.To(name, func() operators.Sink[T] {
		sink := &plainPublisher[T]{Sink: mqtt.NewSink(pc, topic, encode)}
		sink.Batch = batch
		sink.Reject = sinkReject(b, name, format, &sink.logger)
		return sink
	}).UID(name).StateSettings(sinkDigest("mqtt"))
}

// batch returns the sink's mqtt.Batch: batch and batch_bytes.
func (m *MQTTSinkConfig) batch() mqtt.Batch {
	return mqtt.Batch{Max: m.Batch, MaxBytes: m.BatchBytes}
}

// sinkReject returns what an MQTT sink does with a record it cannot
// publish although topicCheck let it through (a result held in a
// checkpoint written before topics were checked): count it as a dead
// letter, log it, and go on. The logger is read at the call, after Open.
func sinkReject[T any](b *builder, name string, format func(T) string, logger **slog.Logger) func(T, error) {
	return func(v T, err error) {
		line := format(v)
		b.c.deadLetter(newDeadLetter(b.cfg.Name, name+": "+err.Error(), line))
		if l := *logger; l != nil {
			l.Warn("mqtt sink: result cannot be published; counted as a dead letter",
				"sink", name, "err", err, "result", line)
		}
	}
}

// plainPublisher is the at-least-once MQTT sink, keeping its subtask's
// logger for rejected records.
type plainPublisher[T any] struct {
	*mqtt.Sink[T]
	logger *slog.Logger
}

// Open opens the sink and keeps the logger.
func (p *plainPublisher[T]) Open(ctx *operators.Context) error {
	p.logger = ctx.Logger
	return p.Sink.Open(ctx)
}

// topicCheck passes on the records whose topic can be made and sends the
// others to the dead-letter output, with the reason.
type topicCheck[T any] struct {
	b      *builder
	sink   string
	topic  func(T) (string, error)
	format func(T) string
	limit  int64 // the broker's largest PUBLISH packet
	qos    byte
}

// msgIDBytes bounds what the write-ahead sink adds to a result's line:
// `,"msg_id":"<16 hex digits>"`.
const msgIDBytes = 32

func (f *topicCheck[T]) Open(*operators.Context) error { return nil }

func (f *topicCheck[T]) ProcessElement(v T, ctx *operators.ProcessContext[T]) error {
	t, err := f.topic(v)
	if err == nil {
		if size := mqtt.PublishSize(len(t), len(f.format(v))+msgIDBytes, f.qos); size > f.limit {
			err = fmt.Errorf("%w: a result of %d bytes (as a PUBLISH packet) is larger than the broker takes (max_message_bytes %d)",
				ErrResultTooLarge, size, f.limit)
		}
	}
	if err != nil {
		d := newDeadLetter(f.b.cfg.Name, f.sink+": "+err.Error(), f.format(v))
		f.b.c.deadLetter(d)
		f.b.dead.Emit(ctx, d)
		return nil
	}
	ctx.Emit(v)
	return nil
}

// ErrResultTooLarge is the error of a result an MQTT sink cannot publish
// because it is larger than the broker takes: it is a dead letter.
var ErrResultTooLarge = errors.New("pipeline: result too large to publish")

// topicFunc returns the topic of a record: the template filled from a
// row's fields; dead letters go to deadletter/<pipeline>.
func topicFunc[T any](b *builder, what, tmpl string) func(T) (string, error) {
	dead := "deadletter/" + b.cfg.Name
	t, err := mqtt.ParseTopicTemplate(tmpl)
	schema := b.pl.schema
	switch what {
	case "windows":
		schema = b.pl.winSchema
	case "alerts":
		schema = b.pl.alertSchema
	}
	return func(v T) (string, error) {
		r, ok := any(v).(Row)
		if !ok {
			return dead, nil
		}
		if err != nil {
			return "", err
		}
		return t.Expand(func(field string) string {
			i := schema.Index(field)
			if i < 0 {
				return ""
			}
			f := schema.Field(i)
			switch f.Type {
			case String:
				return r.Str(f.Slot)
			case Float:
				return strconv.FormatFloat(r.Float(f.Slot), 'f', -1, 64)
			default:
				return strconv.FormatInt(r.Int(f.Slot), 10)
			}
		})
	}
}

// walPublisher is a write-ahead sink publishing through its own MQTT
// connection, opened per subtask with the client id
// "<sink name>-<subtask>" and closed with the sink. A result's msg_id is
// RecordID of the sink's UID (pipeline, sink index and output) and the
// result's JSON line (key, window or alert, and the values): the same in
// every run and at every parallelism, and different for two firings of
// one window that differ (allowed lateness). After a restore, the
// results the restored checkpoint held (committed, maybe not yet
// published), and those of every completed checkpoint, go out on a
// goroutine of their own while the job runs, which tries a failed publish
// again (operators.WriteAheadSink.WithBackgroundPublish): the topic and
// format functions are pure and the publisher is that goroutine's alone.
// At most max_held results wait (operators.WriteAheadSink.WithMaxHeld). The payload is the JSON line and so is the identity: the
// publish makes each line once, for both (mqtt.PublishLineFunc). A
// completed checkpoint's results are published in the chunks the sink
// holds them in (mqtt.PublishLineChunksFunc), never copied into one slice.
// With batch on, the results to one topic go out as JSON arrays, each
// element with the msg_id it has without batching (mqtt.Batch).
type walPublisher[T any] struct {
	*operators.WriteAheadSink[T]
	cfg    mqtt.PublisherConfig
	topic  func(T) (string, error)
	format func(T) string
	reject func(T, error)
	pub    *mqtt.Publisher
	logger *slog.Logger
	uid    string // the sink's UID, set in Open
	// commitWait is how long WaitCommitted waits for a broker that does
	// not take the results (Inputs.CommitWait); done and clock are the
	// subtask's, set in Open.
	commitWait time.Duration
	done       <-chan struct{}
	clock      clockwork.Clock
	// counters are the pipeline's, where the open subtask is recorded
	// under sink for Job.SinkResultsHeld (nil: not recorded); held is
	// its key, set in Open.
	counters *counters
	sink     string
	held     *sinkSubtask
}

func newWALPublisher[T any](pc mqtt.PublisherConfig, topic func(T) (string, error), format func(T) string, batch mqtt.Batch, maxHeld int) *walPublisher[T] {
	c, cerr := codec.Compile[T]()
	if cerr != nil {
		operators.Fail(cerr)
	}
	w := &walPublisher[T]{cfg: pc, topic: topic, format: format}
	uid := func() string { return w.uid }
	// A failed publish is tried again whole by the sink: the next try
	// connects again (mqtt.Publisher.Reset).
	reset := func(err error) error {
		if err != nil {
			w.pub.Reset()
		}
		return err
	}
	w.WriteAheadSink = operators.NewWriteAheadSink(func(records []T, id func(int) string) error {
		return reset(mqtt.PublishLineFunc(w.pub, w.topic, w.format, uid, w.reject, batch)(records, id))
	}, c).WithIdentity(format).WithBackgroundPublish().WithMaxHeld(maxHeld).
		WithPublishChunks(func(chunks [][]T, id func(c, i int) string) error {
			return reset(mqtt.PublishLineChunksFunc(w.pub, w.topic, w.format, uid, w.reject, batch)(chunks, id))
		}).WithConnectionWatch(walWatch[T]{w})
	return w
}

// walWatch is the publisher's connection as the write-ahead sink's
// background publisher watches it (operators.ConnectionWatch): a
// connection lost while no result is being published (the broker killed
// a moment after a publish) has the sink publish its latest results
// again at once, not at its next publish.
type walWatch[T any] struct{ w *walPublisher[T] }

func (v walWatch[T]) Lost() <-chan struct{} { return v.w.pub.Lost() }
func (v walWatch[T]) Drop()                 { v.w.pub.Reset() }

// Open connects the subtask's own publisher: subtasks sharing a client id
// would take the connection from each other.
func (w *walPublisher[T]) Open(ctx *operators.Context) error {
	cfg := w.cfg
	cfg.ClientID = fmt.Sprintf("%s-%d", cfg.ClientID, ctx.Subtask)
	w.logger = ctx.Logger
	w.uid = ctx.UID
	w.done, w.clock = ctx.Done, ctx.Clock
	if w.clock == nil {
		w.clock = clockwork.NewRealClock()
	}
	if cfg.Logger == nil {
		cfg.Logger = ctx.Logger
	}
	pub, err := mqtt.NewPublisher(cfg)
	if err != nil {
		return fmt.Errorf("mqtt sink: %w", err)
	}
	w.pub = pub
	if err := w.WriteAheadSink.Open(ctx); err != nil {
		return err
	}
	if w.counters != nil {
		w.held = &sinkSubtask{sink: w.sink, subtask: ctx.Subtask}
		w.counters.addHeld(*w.held, w.WriteAheadSink)
	}
	return nil
}

// WaitCommitted waits until the results of the checkpoint that ends the
// job (a stop-with-savepoint, a final checkpoint) are published, as
// operators.WriteAheadSink.WaitCommitted, but a publish failure
// (mqtt.ErrPublish: the broker down, hung or refusing) is waited out for
// up to commitWait, trying again, instead of failing the stop at once
// (waitCommitted).
func (w *walPublisher[T]) WaitCommitted(id int64) error {
	return waitCommitted(func() error { return w.WriteAheadSink.WaitCommitted(id) },
		w.clock, w.done, w.commitWait, w.logger, id)
}

// Retry pauses of waitCommitted: the first, doubled after each failed try
// up to the longest.
const (
	commitRetryFirst = time.Second
	commitRetryMax   = 5 * time.Second
)

// waitCommitted calls wait (the sink's wait for checkpoint id's results
// to be published) and returns its result, except that while it fails
// with a publish failure (mqtt.ErrPublish) and bound has not passed since
// the first call, it calls it again after a pause (1 s, doubling up to
// 5 s, the last one cut to the bound): each call tries the held publish
// again at once, under the same msg_ids. A try under way when the bound
// passes is waited for (against a hung broker, up to the publisher's
// acknowledgement timeout). A failure that is no publish
// failure, a bound of 0, or done closed (the job cancelled or failed)
// ends the wait with the error. The results stay held either way: a stop
// that fails leaves them in the checkpoints, and a savepoint not
// committed publishes them again when a job resumes from it. log may be
// nil.
func waitCommitted(wait func() error, clk clockwork.Clock, done <-chan struct{}, bound time.Duration, log *slog.Logger, id int64) error {
	deadline := clk.Now().Add(bound)
	err := wait()
	if err == nil || bound <= 0 || !errors.Is(err, mqtt.ErrPublish) {
		return err
	}
	if log != nil {
		log.Warn("mqtt sink: the broker does not take the results this checkpoint commits (the job's last, or a handover's); waiting for it",
			"checkpoint_id", id, "wait", bound, "err", err)
	}
	pause := commitRetryFirst
	tries := 1
	for {
		left := deadline.Sub(clk.Now())
		if left <= 0 {
			return fmt.Errorf("%w (the broker did not take them within %v: the results stay held in the snapshots)", err, bound)
		}
		t := clk.NewTimer(min(pause, left))
		select {
		case <-t.Chan():
		case <-done:
			t.Stop()
			return err
		}
		pause = min(2*pause, commitRetryMax)
		tries++
		if err = wait(); err == nil {
			if log != nil {
				log.Info("mqtt sink: the broker takes the results again; the checkpoint is committed",
					"checkpoint_id", id, "tries", tries)
			}
			return nil
		}
		if !errors.Is(err, mqtt.ErrPublish) {
			return err
		}
	}
}

// Close closes the connection.
func (w *walPublisher[T]) Close() error {
	if w.held != nil {
		w.counters.removeHeld(*w.held, w.WriteAheadSink)
		w.held = nil
	}
	err := w.WriteAheadSink.Close()
	if w.pub != nil {
		if cerr := w.pub.Close(); err == nil {
			err = cerr
		}
	}
	return err
}
