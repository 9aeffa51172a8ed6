package actors

import (
	"fmt"
	"reflect"

	"github.com/edgedio/edged/codec"
	"github.com/edgedio/edged/keygroup"
	"github.com/edgedio/edged/operators"
)

// ElemType describes the type of the records on a stream to the runtime.
// Make one with TypeOf.
type ElemType interface {
	// String names the Go type.
	String() string

	newBuffer(ch *channel, size int, wire bool) any
	newRouter(t *task, e *Edge, chans []*channel, crosses bool) router
	newFanout(outs []any) any
	newTracker(t *task, idx int, next any, counted bool) any
	newInput(head any, tt *operators.TaskTime) (input, error)
	newSourceDriver(src operators.Operator, out any) (sourceDriver, error)
	hasCodec() error
}

// Type is the ElemType of records of type T.
type Type[T any] struct {
	name  string
	codec codec.Codec[T]
	err   error
}

// TypeOf returns the ElemType of T with codec c. A nil c with a non-nil err
// records why T has no codec; only serialised edges need one.
func TypeOf[T any](c codec.Codec[T], err error) *Type[T] {
	return &Type[T]{name: reflect.TypeFor[T]().String(), codec: c, err: err}
}

// String names T.
func (t *Type[T]) String() string { return t.name }

// Codec returns T's codec, or nil.
func (t *Type[T]) Codec() codec.Codec[T] { return t.codec }

func (t *Type[T]) hasCodec() error {
	if t.codec == nil {
		if t.err != nil {
			return fmt.Errorf("%w: %s: %v", ErrNoCodec, t.name, t.err)
		}
		return fmt.Errorf("%w: %s", ErrNoCodec, t.name)
	}
	return nil
}

func (t *Type[T]) newBuffer(ch *channel, _ int, wire bool) any {
	if wire {
		return &wireBatch{ch: ch}
	}
	// The buffer's slices grow on first use (up to the batch size, where
	// the sender flushes): a channel that carries nothing holds no record
	// memory, which was most of an idle job's heap (credits × batch size
	// records per channel).
	return &batch[T]{ch: ch}
}

func (t *Type[T]) newFanout(outs []any) any {
	cs := make([]operators.Collector[T], len(outs))
	for i, o := range outs {
		cs[i] = o.(operators.Collector[T])
	}
	return fanout[T](cs)
}

func (t *Type[T]) newTracker(tk *task, idx int, next any, counted bool) any {
	return &tracker[T]{t: tk, idx: int32(idx), next: next.(operators.Collector[T]), counted: counted}
}

func (t *Type[T]) newInput(head any, tt *operators.TaskTime) (input, error) {
	c, ok := head.(operators.Collector[T])
	if !ok {
		return nil, fmt.Errorf("%w: input %T does not take %s", ErrInvalidJob, head, t.name)
	}
	return &typedInput[T]{head: c, codec: t.codec, time: tt}, nil
}

func (t *Type[T]) newSourceDriver(src operators.Operator, out any) (sourceDriver, error) {
	s, ok := src.(operators.Source[T])
	if !ok {
		return nil, fmt.Errorf("%w: source %T does not produce %s", ErrInvalidJob, src, t.name)
	}
	return &typedSource[T]{src: s, out: out.(operators.Collector[T])}, nil
}

// fanout sends every record to several outputs (a tail with several
// outgoing edges).
type fanout[T any] []operators.Collector[T]

func (f fanout[T]) Collect(v T) {
	for _, c := range f {
		c.Collect(v)
	}
}

// tracker sits between two chained operators and records which one is
// running, so a failure names the right operator.
type tracker[T any] struct {
	t    *task
	idx  int32
	next operators.Collector[T]
	// counted: next is the chain's sink, and what reaches it counts as the
	// task's output.
	counted bool
}

func (k *tracker[T]) Collect(v T) {
	if k.counted {
		k.t.live.recordsOut.Add(1)
	}
	k.t.current = k.idx
	k.next.Collect(v)
	k.t.current = k.idx - 1
}

// input feeds the batches of one input gate into the chain's head.
type input interface {
	// process feeds a batch into the head and returns its record count.
	process(m message) int
}

type typedInput[T any] struct {
	head    operators.Collector[T]
	codec   codec.Codec[T]
	dec     *codec.Decoder[T] // decodes wire batches; made for the first
	time    *operators.TaskTime
	scratch []T
	ts      []int64
}

func (in *typedInput[T]) process(m message) int {
	switch b := m.(type) {
	case *batch[T]:
		n := len(b.items)
		for i, v := range b.items {
			in.time.Timestamp = b.ts[i]
			in.head.Collect(v)
		}
		clear(b.items)
		b.items, b.ts = b.items[:0], b.ts[:0]
		return n
	case *wireBatch:
		if in.dec == nil {
			in.dec = codec.NewDecoder(in.codec)
		}
		if b.ch.rxDict == nil {
			b.ch.rxDict = new(codec.DictDecoder)
		}
		var err error
		in.ts, in.scratch, err = decodeWire(in.dec, b.ch.rxDict, in.ts, in.scratch, b.data)
		if err != nil {
			panic(fmt.Errorf("decode batch: %w", err))
		}
		for i, v := range in.scratch {
			in.time.Timestamp = in.ts[i]
			in.head.Collect(v)
		}
		clear(in.scratch)
		return len(in.scratch)
	default:
		panic(fmt.Errorf("unexpected message %T", m))
	}
}

// sourceDriver polls a typed source into the chain.
type sourceDriver interface {
	poll(max int) (operators.Status, error)
	available() <-chan struct{}
}

type typedSource[T any] struct {
	src operators.Source[T]
	out operators.Collector[T]
}

func (s *typedSource[T]) poll(max int) (operators.Status, error) { return s.src.Poll(s.out, max) }
func (s *typedSource[T]) available() <-chan struct{}             { return s.src.Available() }

// router is the erased view of a typed output router.
type router interface {
	// flush sends every open batch.
	flush()
	// opened reports whether a batch is open.
	opened() bool
	// broadcast flushes and then sends m(ch) on every channel: watermarks,
	// stream status and end-of-stream, which must follow the records sent
	// before them.
	broadcast(m func(ch *channel) message)
	// channels returns the router's channels, by target subtask.
	channels() []*channel
	// replace puts ch in place of channel i, with no batch open on it; it
	// fails unless the router serialises its batches.
	replace(i int, ch *channel) error
}

// typedRouter batches the records of one outgoing edge and sends them to
// the target subtasks by the edge's partitioning.
type typedRouter[T any] struct {
	t        *task
	part     Partition
	chans    []*channel
	open     []*batch[T]
	nopen    int
	keyGroup func(T) int
	edge     *Edge
	maxP     int
	next     int // round-robin cursor
	size     int // records per batch within the node
	// limits[i] is the records per batch on channel i: limitOf, or
	// fewer once a batch to another node was over its frame cap.
	limits  []int
	codec   codec.Codec[T]
	wire    bool
	private []*batch[T] // wire channels: the batch being filled
	// sizeOf, when set, sizes the records (Vertex.RecordBytes): a batch
	// is sent once bytes[i], its records' sizes, reach maxBytes.
	sizeOf   func(T) int
	maxBytes int
	bytes    []int
}

func (t *Type[T]) newRouter(tk *task, e *Edge, chans []*channel, crosses bool) router {
	r := &typedRouter[T]{
		t:     tk,
		part:  e.Partition,
		edge:  e,
		chans: chans,
		open:  make([]*batch[T], len(chans)),
		maxP:  tk.run.maxP,
		size:  tk.run.cfg.BatchSize,
		codec: t.codec,
		wire:  tk.run.cfg.SerializeKeyBy && e.Partition == KeyBy || crosses,
	}
	if r.wire {
		r.private = make([]*batch[T], len(chans))
	}
	r.limits = make([]int, len(chans))
	for i, ch := range chans {
		r.limits[i] = r.limitOf(ch)
	}
	if e.Partition == KeyBy {
		r.keyGroup = e.KeyGroup.(func(T) int)
	}
	if f, ok := e.From.RecordBytes.(func(T) int); ok && e.Output == "" && e.From.BatchBytes > 0 {
		r.sizeOf, r.maxBytes = f, e.From.BatchBytes
		r.bytes = make([]int, len(chans))
	}
	// Round robin starts at a different target in every subtask.
	r.next = tk.subtask % len(chans)
	return r
}

// Collect routes v to its target subtask(s).
func (r *typedRouter[T]) Collect(v T) {
	switch r.part {
	case Forward:
		r.add(0, v)
	case Rebalance:
		i := r.next
		r.next++
		if r.next == len(r.chans) {
			r.next = 0
		}
		r.add(i, v)
	case KeyBy:
		// The key function is the user's code: a panic in it names the
		// edge (task.recover).
		r.t.keying = r.edge
		g := r.keyGroup(v)
		r.t.keying = nil
		r.add(keygroup.Subtask(g, len(r.chans), r.maxP), v)
	case Broadcast:
		for i := range r.chans {
			r.add(i, v)
		}
	}
}

func (r *typedRouter[T]) add(i int, v T) {
	b := r.open[i]
	if b == nil {
		b = r.take(i)
		r.open[i] = b
		if r.nopen == 0 {
			r.t.noteOpened()
		}
		r.nopen++
	}
	b.items = append(b.items, v)
	b.ts = append(b.ts, r.t.time.Timestamp)
	if r.sizeOf != nil {
		if r.bytes[i] += r.sizeOf(v); r.bytes[i] >= r.maxBytes {
			r.send(i)
			return
		}
	}
	if len(b.items) >= r.limits[i] {
		r.send(i)
	}
}

// take returns an empty batch to fill for channel i: a credit on a plain
// channel; on a wire channel the router's own buffer, the credit being taken
// when the batch is encoded.
func (r *typedRouter[T]) take(i int) *batch[T] {
	ch := r.chans[i]
	if !r.wire {
		return ch.acquire(r.t.run.done).(*batch[T])
	}
	if r.private[i] == nil {
		r.private[i] = &batch[T]{ch: ch, items: make([]T, 0, r.limits[i]), ts: make([]int64, 0, r.limits[i])}
	}
	return r.private[i]
}

func (r *typedRouter[T]) send(i int) {
	b, ch := r.open[i], r.chans[i]
	r.open[i] = nil
	r.nopen--
	if r.bytes != nil {
		r.bytes[i] = 0
	}
	r.t.live.recordsOut.Add(int64(len(b.items)))
	if !r.wire {
		r.t.sendData(ch, b)
		return
	}
	if fit := r.sendWire(ch, b.ts, b.items); fit < len(b.items) && r.limits[i] > r.size {
		// Records this large: batches that fit the frames rather than
		// every one encoded twice, but not fewer records than within
		// the node.
		r.limits[i] = max(r.size, fit)
	}
	clear(b.items)
	b.items, b.ts = b.items[:0], b.ts[:0]
}

// sendWire encodes records into a wire batch and sends it on ch. On a
// channel to another node a batch is capped in bytes as well: one over the
// cap is sent in halves. It returns the records of the smallest batch sent.
func (r *typedRouter[T]) sendWire(ch *channel, ts []int64, items []T) int {
	w := ch.acquire(r.t.run.done).(*wireBatch)
	if ch.txDict == nil {
		ch.txDict = new(codec.DictEncoder)
	}
	mark := ch.txDict.Len()
	var err error
	w.data, err = encodeWire(r.codec, ch.txDict, w.data[:0], ts, items)
	if err != nil {
		panic(fmt.Errorf("encode batch: %w", err))
	}
	if mb := ch.bodyCap(); mb > 0 && len(w.data) > mb && len(items) > 1 {
		// Not sent: the strings it numbered are numbered again by
		// the halves.
		ch.txDict.Rollback(mark)
		ch.release(w)
		ch.halved.Add(1)
		h := len(items) / 2
		return min(r.sendWire(ch, ts[:h], items[:h]), r.sendWire(ch, ts[h:], items[h:]))
	}
	r.t.sendData(ch, w)
	return len(items)
}

// limitOf is the number of records per batch on ch: the wire batch size to
// another node, the batch size within this one.
func (r *typedRouter[T]) limitOf(ch *channel) int {
	if ch.bodyCap() > 0 {
		return r.t.run.cfg.wireBatchSize()
	}
	return r.size
}

func (r *typedRouter[T]) flush() {
	for i, b := range r.open {
		if b != nil {
			r.send(i)
		}
	}
}

func (r *typedRouter[T]) opened() bool { return r.nopen > 0 }

func (r *typedRouter[T]) channels() []*channel { return r.chans }

func (r *typedRouter[T]) replace(i int, ch *channel) error {
	if !r.wire {
		return fmt.Errorf("%w: the edge to %s[%d] is not serialised: its receiver cannot move to another node while it runs", ErrMoveUnsupported, ch.toName, ch.toSub)
	}
	if r.open[i] != nil {
		r.send(i)
	}
	r.chans[i] = ch
	r.private[i] = nil
	r.limits[i] = r.limitOf(ch)
	return nil
}

func (r *typedRouter[T]) broadcast(m func(ch *channel) message) {
	r.flush()
	for _, ch := range r.chans {
		r.t.sendData(ch, m(ch))
	}
}
