package stream

import (
	"errors"
	"fmt"
	"reflect"
	"sync"

	"github.com/edgedio/edged/actors"
	"github.com/edgedio/edged/codec"
	"github.com/edgedio/edged/operators"
)

// upstream is one producer of a stream and how the next operator connects
// to it.
type upstream struct {
	v    *actors.Vertex
	part actors.Partition
	// keyGroup is the func(T) int of a key-by connection.
	keyGroup any
	// auto is set when part was not chosen by the user: forward if the
	// parallelisms match, rebalance if not.
	auto bool
	// output is the side-output tag the stream leaves v by ("" for main).
	output string
}

// Stream is a stream of records of type T.
type Stream[T any] struct {
	env *Environment
	typ *actors.Type[T]
	ups []upstream
	// v is the vertex that produced the stream, nil for a union.
	v *actors.Vertex
}

// node is what the stream package keeps per vertex besides the graph.
type node struct {
	stateful bool
	uidSet   bool
	// stateless is set for the built-in operators that keep no state
	// (Map, FlatMap, Filter, ForEach): where their uid comes from does
	// not matter to a restore.
	stateless bool
	// settings is what of the operator's own settings shapes its state
	// (a window's assigner): the first part of its StateSettings.
	settings string
	// inherit takes the parallelism of the input unless SetParallelism
	// was called on the operator.
	inherit        bool
	parallelismSet bool
	// sink is set for an operator added by To (and so ForEach).
	sink bool
}

func typeOf[T any]() *actors.Type[T] {
	c, err := codec.Compile[T]()
	return actors.TypeOf(c, err)
}

// keyedState marks v's operator as one with keyed state, of kind: its
// StateSettings name the kind (a restore into an operator of another
// kind is refused), and then entries, the operator's own settings its
// state is shaped by.
func (e *Environment) keyedState(v *actors.Vertex, kind string, entries ...string) {
	n := e.node(v)
	n.stateful = true
	n.settings = actors.OperatorStateSetting(kind)
	for _, s := range entries {
		n.settings = actors.JoinStateSettings(n.settings, s)
	}
	v.StateSettings = n.settings
}

func newStream[T any](env *Environment, v *actors.Vertex) *Stream[T] {
	return &Stream[T]{env: env, typ: v.Out.(*actors.Type[T]), v: v, ups: []upstream{{v: v, auto: true}}}
}

// SetCodec replaces the codec of the stream's records (used on serialised
// edges and by state backends).
func SetCodec[T any](s *Stream[T], c codec.Codec[T]) *Stream[T] {
	s.must("SetCodec")
	t := actors.TypeOf(c, nil)
	if s.v != nil {
		s.v.Out = t
	}
	s.typ = t
	return s
}

// sideOutput returns the upstream of a stream that is a side output of
// one operator, or nil.
func (s *Stream[T]) sideOutput() *upstream {
	if len(s.ups) == 1 && s.ups[0].output != "" {
		return &s.ups[0]
	}
	return nil
}

// noOperator is the error of what setting asks of a stream that no
// operator of its own produced: a union, or a side output, which leaves
// the operator that emits it with that operator's parallelism and uid.
func (s *Stream[T]) noOperator(setting string) error {
	if u := s.sideOutput(); u != nil {
		return fmt.Errorf("stream: %s on side output %q of operator %q: a side output has the parallelism and uid of the operator that emits it; set them on that operator, or on the one that consumes the side output",
			setting, u.output, u.v.Name)
	}
	return fmt.Errorf("stream: %s on a union; set it on each input", setting)
}

// SetParallelism sets the number of subtasks of the operator that produced
// s.
func (s *Stream[T]) SetParallelism(n int) *Stream[T] {
	s.must("SetParallelism")
	if s.v == nil {
		s.env.addError(s.noOperator("SetParallelism"))
		return s
	}
	s.v.Parallelism = n
	s.env.node(s.v).parallelismSet = true
	return s
}

// BatchBytes bounds the bytes of the batches the operator that produced s
// sends to the next operators: a batch is sent once the sizes of its
// records, as size gives them, reach limit, before it holds the batch
// size's count of records. The records a channel holds (its credits'
// batches) are then bounded in bytes as well as in count, to about
// credits × (limit + one record), however large the records: for records
// whose size varies a lot, such as the messages of a source whose
// payloads may be large. A limit below 1 is refused when the job is
// built.
func (s *Stream[T]) BatchBytes(size func(T) int, limit int) *Stream[T] {
	s.must("BatchBytes")
	switch {
	case s.v == nil:
		s.env.addError(s.noOperator("BatchBytes"))
	case size == nil || limit < 1:
		s.env.addError(fmt.Errorf("stream: BatchBytes on operator %q: want a size function and a limit of at least 1 byte, got limit %d", s.v.Name, limit))
	default:
		s.v.RecordBytes, s.v.BatchBytes = size, limit
	}
	return s
}

// UID sets the stable identifier of the operator that produced s; state is
// matched to operators by it when a job is restored. Stateful operators
// must have one.
func (s *Stream[T]) UID(uid string) *Stream[T] {
	s.must(fmt.Sprintf("UID(%q)", uid))
	if s.v == nil {
		s.env.addError(s.noOperator("UID"))
		return s
	}
	if uid == "" {
		s.env.emptyUID(s.v.Name)
	}
	s.v.UID = uid
	s.env.node(s.v).uidSet = true
	return s
}

// StateSettings declares a digest of the settings the state of the
// operator that produced s is shaped by (what a window aggregate keeps
// per aggregate, say). Snapshots record it; a restore into an operator
// whose digest differs fails at once (state.ErrIncompatibleState)
// instead of reading the old state under the new settings. Snapshots
// without a digest restore as before. A window operator declares its
// assigner itself (operators.WindowAssigner.StateDigest), beside digest.
func (s *Stream[T]) StateSettings(digest string) *Stream[T] {
	s.must("StateSettings")
	if s.v == nil {
		s.env.addError(s.noOperator("StateSettings"))
		return s
	}
	s.v.StateSettings = actors.JoinStateSettings(s.env.node(s.v).settings, digest)
	return s
}

// KeyStateSetting returns an entry of StateSettings that names what a
// keyed operator's keys are (a declared pipeline's key field). Joined to
// the digest with "; " (KeyStateSetting("id") + "; " + digest), it is
// compared on its own: a restore into another key is refused, and a
// snapshot written before the entry was declared restores when the rest
// matches.
func KeyStateSetting(desc string) string { return actors.KeyStateSetting(desc) }

// DisableChaining keeps the operator that produced s in a task of its own.
func (s *Stream[T]) DisableChaining() *Stream[T] {
	s.must("DisableChaining")
	if s.v == nil {
		s.env.addError(s.noOperator("DisableChaining"))
		return s
	}
	s.v.NoChain = true
	return s
}

func (s *Stream[T]) with(part actors.Partition) *Stream[T] {
	c := *s
	c.ups = make([]upstream, len(s.ups))
	for i, u := range s.ups {
		c.ups[i] = upstream{v: u.v, part: part, output: u.output}
	}
	return &c
}

// Rebalance makes the next operator receive s round robin.
func (s *Stream[T]) Rebalance() *Stream[T] { s.must("Rebalance"); return s.with(actors.Rebalance) }

// Broadcast makes every subtask of the next operator receive every record.
func (s *Stream[T]) Broadcast() *Stream[T] { s.must("Broadcast"); return s.with(actors.Broadcast) }

// Forward makes subtask i of the next operator receive subtask i's records
// (the parallelisms must match). It is the default when they do.
func (s *Stream[T]) Forward() *Stream[T] { s.must("Forward"); return s.with(actors.Forward) }

// Union merges s with streams of the same type. Plan and Execute refuse
// a nil stream among others, or one of another Environment.
func (s *Stream[T]) Union(others ...*Stream[T]) *Stream[T] {
	s.must("Union")
	u := &Stream[T]{env: s.env, typ: s.typ}
	u.ups = append(u.ups, s.ups...)
	for i, o := range others {
		if o == nil {
			s.env.addError(fmt.Errorf("stream: Union: stream %d of the union is nil", i+1))
			continue
		}
		if o.env != s.env {
			s.env.addError(fmt.Errorf("stream: union of streams from different environments"))
			continue
		}
		u.ups = append(u.ups, o.ups...)
	}
	return u
}

// connect adds v as the consumer of s.
func (s *Stream[T]) connect(v *actors.Vertex) {
	v.In = s.typ
	s.env.addVertex(v)
	s.connectInput(v, 0)
}

// connectInput adds the edges from s's producers into input in of v.
func (s *Stream[T]) connectInput(v *actors.Vertex, in int) {
	env := s.env
	for _, u := range s.ups {
		e := &actors.Edge{From: u.v, To: v, Partition: u.part, KeyGroup: u.keyGroup, Output: u.output, Input: in}
		if u.auto {
			e.Partition = actors.Forward
		}
		env.job.Edges = append(env.job.Edges, e)
		env.autoEdges[e] = u.auto
		if u.part == actors.KeyBy {
			v.Keyed = true
		}
	}
}

// nilFunc refuses the job (Plan and Execute return the error) because the
// function what, given for operator name, is nil.
func (e *Environment) nilFunc(name, what string) {
	e.addError(fmt.Errorf("stream: operator %q: %s is nil", name, what))
}

// made returns f, the result of a user factory called for a subtask; a nil
// f fails the subtask with an error instead of a nil dereference later.
func made[F any](f F) F {
	if any(f) == nil {
		operators.Fail(errors.New("stream: the function factory returned nil"))
	}
	return f
}

// instances remembers the function a keyed operator's factory returned
// last to each subtask, so that one instance given to two subtasks is
// refused: its Open keeps the state handles of the subtask that opened
// it last, and the other subtask's records then read and write that
// subtask's state, under that subtask's current key, from another
// goroutine.
type instances struct {
	mu   sync.Mutex
	last map[int]any // subtask -> function, for pointers only
}

// fresh notes f, the function made for subtask sub of operator name,
// failing the subtask if another subtask's latest function is f itself.
func (in *instances) fresh(name string, sub int, f any) {
	v := reflect.ValueOf(f)
	if v.Kind() != reflect.Pointer || v.IsNil() {
		return // a value is copied per subtask
	}
	if v.Elem().Type().Size() == 0 {
		return // pointers to zero-size values may all be equal, and hold nothing to share
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	for s, g := range in.last {
		if s != sub && g == f {
			operators.Fail(fmt.Errorf("stream: operator %q: the function factory returned the same %T to subtasks %d and %d: "+
				"return a new function from each call (a function holds the state handles of the subtask that opened it)", name, f, s, sub))
		}
	}
	if in.last == nil {
		in.last = make(map[int]any)
	}
	in.last[sub] = f
}

// FromSource adds a source; newSource is called once per subtask. A nil
// newSource is refused by Plan and Execute; a newSource that returns nil
// or panics fails the job with an *actors.TaskError naming the source.
func FromSource[T any](env *Environment, name string, newSource func() operators.Source[T]) *Stream[T] {
	env.mustEnv(called("FromSource", name))
	if newSource == nil {
		env.nilFunc(name, "newSource")
	}
	v := env.addVertex(&actors.Vertex{
		Name: name,
		Out:  typeOf[T](),
		NewSource: func(*operators.Context) (operators.Operator, error) {
			if newSource == nil {
				return nil, errors.New("stream: newSource is nil")
			}
			return newSource(), nil
		},
	})
	return newStream[T](env, v)
}

// Transform adds an operator built by newOp for each subtask: newOp gets the
// collector of its output and returns the operator, which consumes T.
// A nil newOp is refused by Plan and Execute; a newOp that returns nil or
// panics fails the job with an *actors.TaskError naming the operator.
func Transform[T, U any](s *Stream[T], name string, newOp func(out operators.Collector[U]) operators.OneInput[T]) *Stream[U] {
	s.must(called("Transform", name))
	if newOp == nil {
		s.env.nilFunc(name, "newOp")
		newOp = func(operators.Collector[U]) operators.OneInput[T] { return nil }
	}
	return transform(s, name, func(_ *operators.Context, out operators.Collector[U]) operators.OneInput[T] { return newOp(out) })
}

// transform is Transform with newOp given the subtask's context as well.
func transform[T, U any](s *Stream[T], name string, newOp func(ctx *operators.Context, out operators.Collector[U]) operators.OneInput[T]) *Stream[U] {
	v := &actors.Vertex{
		Name: name,
		Out:  typeOf[U](),
		NewOperator: func(ctx *operators.Context, out any) (operators.Operator, any, error) {
			op := newOp(ctx, out.(operators.Collector[U]))
			return op, op, nil
		},
	}
	s.connect(v)
	return newStream[U](s.env, v)
}

// Map applies fn to every record; an error from fn fails the job.
func Map[T, U any](s *Stream[T], name string, fn func(T) (U, error)) *Stream[U] {
	s.must(called("Map", name))
	if fn == nil {
		s.env.nilFunc(name, "the map function")
	}
	return statelessOp(Transform(s, name, func(out operators.Collector[U]) operators.OneInput[T] {
		return operators.NewMap(fn, out)
	}))
}

// FlatMap calls fn for every record; fn emits any number of records.
func FlatMap[T, U any](s *Stream[T], name string, fn func(T, operators.Collector[U]) error) *Stream[U] {
	s.must(called("FlatMap", name))
	if fn == nil {
		s.env.nilFunc(name, "the flat-map function")
	}
	return statelessOp(Transform(s, name, func(out operators.Collector[U]) operators.OneInput[T] {
		return operators.NewFlatMap(fn, out)
	}))
}

// Filter keeps the records for which fn holds.
func (s *Stream[T]) Filter(name string, fn func(T) bool) *Stream[T] {
	s.must(called("Filter", name))
	if fn == nil {
		s.env.nilFunc(name, "the filter function")
	}
	return statelessOp(Transform(s, name, func(out operators.Collector[T]) operators.OneInput[T] {
		return operators.NewFilter(fn, out)
	}))
}

// statelessOp marks the operator that produced s as one that keeps no
// state, and returns s.
func statelessOp[T any](s *Stream[T]) *Stream[T] {
	s.env.node(s.v).stateless = true
	return s
}

// Sink is the end of a pipeline.
type Sink struct {
	env *Environment
	v   *actors.Vertex
}

// SetParallelism sets the number of sink subtasks.
func (k *Sink) SetParallelism(n int) *Sink { k.must("SetParallelism"); k.v.Parallelism = n; return k }

// UID sets the sink's stable identifier.
func (k *Sink) UID(uid string) *Sink {
	k.must(fmt.Sprintf("UID(%q)", uid))
	if uid == "" {
		k.env.emptyUID(k.v.Name)
	}
	k.v.UID = uid
	k.env.node(k.v).uidSet = true
	return k
}

// StateSettings declares a digest of what the sink's state is shaped by
// (the kind of sink whose pending transactions or held results it
// keeps), as Stream.StateSettings does for an operator: a restore into a
// sink whose digest differs fails at once (state.ErrIncompatibleState)
// instead of reading one sink's state as another's.
func (k *Sink) StateSettings(digest string) *Sink {
	k.must("StateSettings")
	k.v.StateSettings = actors.JoinStateSettings(k.env.node(k.v).settings, digest)
	return k
}

// To adds a sink; newSink is called once per subtask. A nil newSink is
// refused by Plan and Execute; a newSink that returns nil or panics fails
// the job with an *actors.TaskError naming the sink.
func (s *Stream[T]) To(name string, newSink func() operators.Sink[T]) *Sink {
	s.must(called("To", name))
	if newSink == nil {
		s.env.nilFunc(name, "newSink")
	}
	v := &actors.Vertex{
		Name: name,
		NewOperator: func(*operators.Context, any) (operators.Operator, any, error) {
			if newSink == nil {
				return nil, nil, errors.New("stream: newSink is nil")
			}
			k := newSink()
			return k, k, nil
		},
	}
	s.connect(v)
	s.env.node(v).sink = true
	return &Sink{env: s.env, v: v}
}

// ForEach adds a sink calling fn for every record; an error fails the job.
func (s *Stream[T]) ForEach(name string, fn func(T) error) *Sink {
	s.must(called("ForEach", name))
	if fn == nil {
		s.env.nilFunc(name, "the ForEach function")
	}
	k := s.To(name, func() operators.Sink[T] { return operators.NewSinkFunc(fn) })
	s.env.node(k.v).stateless = true
	return k
}
