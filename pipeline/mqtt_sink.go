package pipeline

import (
	"strconv"

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
// they come (at least once).
func mqttSink[T any](b *builder, name, what string, s *stream.Stream[T], format func(T) string, sc *MQTTSinkConfig) {
	pc := mqtt.DefaultPublisherConfig()
	pc.Broker, pc.ClientID = b.in.Broker, name
	if sc.QoS > 0 {
		pc.QoS = byte(sc.QoS)
	}
	topic := topicFunc[T](b, what, sc.Topic)
	encode := func(v T) ([]byte, error) { return []byte(format(v)), nil }
	if b.cfg.Checkpoint.Interval > 0 {
		s.To(name, func() operators.Sink[T] {
			return newWALPublisher(pc, topic, encode)
		}).UID(name)
		return
	}
	s.To(name, func() operators.Sink[T] { return mqtt.NewSink(pc, topic, encode) }).UID(name)
}

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
// connection, closed with the sink.
type walPublisher[T any] struct {
	*operators.WriteAheadSink[T]
	pub *mqtt.Publisher
}

func newWALPublisher[T any](pc mqtt.PublisherConfig, topic func(T) (string, error), encode func(T) ([]byte, error)) *walPublisher[T] {
	pub, err := mqtt.NewPublisher(pc)
	if err != nil {
		operators.Fail(err)
	}
	c, cerr := codec.Compile[T]()
	if cerr != nil {
		operators.Fail(cerr)
	}
	return &walPublisher[T]{WriteAheadSink: operators.NewWriteAheadSink(mqtt.PublishFunc(pub, topic, encode), c), pub: pub}
}

// Close closes the connection.
func (w *walPublisher[T]) Close() error {
	err := w.WriteAheadSink.Close()
	if cerr := w.pub.Close(); err == nil {
		err = cerr
	}
	return err
}
