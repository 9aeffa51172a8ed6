package operators

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/jonboulle/clockwork"

	"github.com/edgedio/edged/codec"
)

// Publish sends a batch of records to an external system; id gives each
// record its deterministic id (the same for the same record after any
// replay), for consumers that drop duplicates.
type Publish[T any] func(records []T, id func(i int) string) error

// PublishChunks is Publish for records held in chunks: it publishes the
// records of every chunk, in order, as one batch (waiting for the
// acknowledgements once), so that they are never joined into one slice;
// id(c, i) is the deterministic id of record i of chunk c.
type PublishChunks[T any] func(chunks [][]T, id func(c, i int) string) error

// WriteAheadSink holds the records of each checkpoint in its state and
// publishes them only when that checkpoint completes (Flink's
// GenericWriteAheadSink). Records are published once per completed
// checkpoint; after a failure between publishing and the next checkpoint
// they may be published again, with the same ids, so a consumer that drops
// duplicate ids sees each record once.
//
// A record's id is RecordID(uid, identity(record)): a function of the
// sink's UID and the record alone, never of the subtask that holds it or
// of its position, so it is the same after a restore at any parallelism.
// The identity is the record's codec encoding unless WithIdentity sets
// another: two records with the same identity are one result to a
// consumer that drops duplicate ids.
//
// The held records are list-like operator state: restored with another
// parallelism, old subtask j's records go to new subtask j mod n, so each
// is published again by exactly one new subtask.
type WriteAheadSink[T any] struct {
	Base
	publish     Publish[T]
	chunked     PublishChunks[T] // set by WithPublishChunks
	codec       codec.Codec[T]
	identity    func(T) string
	uid         string
	subtask     int
	parallelism int
	// buf holds the records since the last checkpoint in chunks of at
	// most walChunk records: a large firing (every key's window at once)
	// is never copied to grow one slice.
	buf     [][]T
	pending []walBatch[T]
	scratch []byte
	// final: the job takes a final checkpoint after Finish, which
	// publishes what is held.
	final bool
	// background: completed checkpoints' records and restored ones are
	// published by a goroutine (WithBackgroundPublish), through q.
	background bool
	// maxHeld bounds the records held unpublished (WithMaxHeld); 0: none.
	maxHeld int
	// watch tells the background publisher of a lost connection
	// (WithConnectionWatch); nil: none.
	watch ConnectionWatch
	// q is the background publisher's queue, nil until its first batch;
	// held is q for Held, which other goroutines call.
	q    *walQueue[T]
	held atomic.Pointer[walQueue[T]]
	// tell is Context.OutputHeld until the run's first record told it.
	tell func()
	// committed: the restored snapshot was committed by every sink
	// (Context.RestoredCommitted), so its records were all published.
	committed bool
	log       *slog.Logger
	clock     clockwork.Clock // the waits between tries of a failed publish
	done      <-chan struct{} // Context.Done
}

// walQueue is what the background publisher (WithBackgroundPublish) has
// to publish: records of completed checkpoints and restored ones, oldest
// first. A batch leaves the queue only once its publish succeeded, so
// every snapshot taken before that still holds it.
type walQueue[T any] struct {
	mu      sync.Mutex
	batches []walBatch[T]
	// recent: the batches published lately, newest last (keepRecent):
	// published again after a failure, and kept in every snapshot
	// (recentSince), so that a restore publishes them again too.
	recent  []recentBatch[T]
	records atomic.Int64  // records in batches; changed with mu held
	failed  int           // failed publishes so far
	err     error         // the latest failure, nil once a publish succeeds
	fatal   error         // a panic of the publish ended the goroutine
	change  chan struct{} // closed and replaced when batches or failed change
	nudge   chan struct{} // capacity 1: try a failed publish again now
	stop    chan struct{} // closed by Close: give up
	done    chan struct{} // closed when the goroutine returned
}

// retryFirst and retryMax are the background publisher's waits between
// tries of a failed publish: doubling from the first to the most.
const (
	retryFirst = time.Second
	retryMax   = 30 * time.Second
)

// walChunk is the most records one chunk of a checkpoint's held records
// holds; the first chunks are smaller (walFirstChunk, doubling), so a
// checkpoint holding a few records allocates little.
const (
	walChunk      = 8192
	walFirstChunk = 64
)

// walBatch is the records of one checkpoint, in chunks.
type walBatch[T any] struct {
	checkpoint int64
	chunks     [][]T
}

// len is the number of records of b.
func (b walBatch[T]) len() int {
	n := 0
	for _, c := range b.chunks {
		n += len(c)
	}
	return n
}

// NewWriteAheadSink returns a write-ahead sink publishing with publish and
// keeping records with c (nil: codec.For[T]).
func NewWriteAheadSink[T any](publish Publish[T], c codec.Codec[T]) *WriteAheadSink[T] {
	if c == nil {
		c = codec.For[T]()
	}
	return &WriteAheadSink[T]{publish: publish, codec: c}
}

// WithIdentity sets the identity of a record, from which its id is made:
// it must tell apart every two results a consumer must see both of, and
// be the same for the same result in every run (for a window result: the
// key, the window and its content). Call before the job runs; it returns
// s.
func (s *WriteAheadSink[T]) WithIdentity(identity func(T) string) *WriteAheadSink[T] {
	s.identity = identity
	return s
}

// WithPublishChunks makes the sink publish a completed checkpoint's
// records with p, in the chunks it holds them in, instead of joining them
// for the Publish given to NewWriteAheadSink (which still re-publishes
// restored records): a checkpoint holding a large firing is published
// without first copying all of it, so its first record goes out sooner
// and the copy never adds to the memory. Call before the job runs; it
// returns s.
func (s *WriteAheadSink[T]) WithPublishChunks(p PublishChunks[T]) *WriteAheadSink[T] {
	s.chunked = p
	return s
}

// WithBackgroundPublish makes the sink publish on a goroutine of its own:
// NotifyCheckpointComplete hands the completed checkpoints' records to it
// and returns, and RestoreState the restored records (they belong to a
// completed checkpoint, so they are committed and need no new one), so
// the subtask goes on processing and taking checkpoints while they go out,
// however slow the external system is. Batches go out in order (restored
// records first; per key, results keep their order), whole chunks of up
// to 65,536 records per call of publish; Close stops the goroutine
// between calls. A batch stays in every snapshot until all of it is
// published. A failed publish is logged and tried again, from the start
// of the batch it was publishing and under the same ids, after a wait doubling from 1 s to 30 s (on the
// Context's clock), for as long as the job runs: the subtask does not
// fail (WithMaxHeld makes it wait instead once too much is held). After a
// failed publish, the latest batch and the batches published in the 2 s
// before it (at most 50,000 records) go out again first: a broker killed and restarted from
// its persistence file has lost what it acknowledged since its last save.
// A panic
// in the publish fails the subtask at its next checkpoint. A checkpoint
// that ends the job (the final one, a stop-with-savepoint) is not
// committed until WaitCommitted saw its records out. publish, the
// identity and the codec are called from that goroutine while the
// subtask runs: they must not share unsynchronised state with the job's
// other operators. Call before the job runs; it returns s.
func (s *WriteAheadSink[T]) WithBackgroundPublish() *WriteAheadSink[T] {
	s.background = true
	return s
}

// ConnectionWatch tells a write-ahead sink publishing in the background
// (WithBackgroundPublish) when the connection its latest publishes went
// over is lost. Both methods are called on the sink's publishing
// goroutine, which owns the publish, and must not block.
type ConnectionWatch interface {
	// Lost returns a channel closed when the current connection is lost;
	// nil while there is none.
	Lost() <-chan struct{}
	// Drop forgets the lost connection: the next publish connects again.
	Drop()
}

// WithConnectionWatch makes the background publisher watch w while it has
// nothing to publish: when the connection is lost, it publishes again,
// under the same ids, what a failed publish would (the latest publish and
// those of the republish window before it), at once, before any newer
// record. A broker killed a moment after a publish, before its next save
// of its persistence, lost what it acknowledged, and without a watch the
// sink notices only at its next publish, which a quiet stretch puts off
// (or never comes: a job stopped meanwhile commits its savepoint as
// published, and a job resumed from it publishes nothing again). Call
// before the job runs; it returns s.
func (s *WriteAheadSink[T]) WithConnectionWatch(w ConnectionWatch) *WriteAheadSink[T] {
	s.watch = w
	return s
}

// WithMaxHeld bounds the records a sink publishing in the background
// holds for its publisher: those of completed checkpoints (and restored
// ones) not yet published. When they are n or more, Collect waits until
// the publisher brought them below n (or the subtask stops,
// Context.Done): back-pressure, as a downstream task without credit
// exerts. Records of checkpoints not yet complete do not count: only a
// completion, which needs the subtask to take its barrier, releases
// them. 0, the default, sets no bound. Call before the job runs; it
// returns s.
func (s *WriteAheadSink[T]) WithMaxHeld(n int) *WriteAheadSink[T] {
	s.maxHeld = max(n, 0)
	return s
}

// Held returns the records the background publisher
// (WithBackgroundPublish) holds: those of completed checkpoints and
// restored ones that the external system has not yet taken, with the
// ones published lately that a failed publish sends again first. It is
// what WithMaxHeld bounds (one checkpoint's records join whole, so it can
// pass the bound by that much); records of checkpoints not yet complete
// do not count. 0 before the publisher's first batch, and without
// WithBackgroundPublish. Safe to call from any goroutine while the
// subtask runs.
func (s *WriteAheadSink[T]) Held() int64 {
	if q := s.held.Load(); q != nil {
		return q.records.Load()
	}
	return 0
}

// Open records the sink's UID, for the record ids, and where the subtask
// runs, for a restore at another parallelism.
func (s *WriteAheadSink[T]) Open(ctx *Context) error {
	if s.publish == nil {
		return errors.New("write-ahead sink: the publish function is nil: give NewWriteAheadSink a Publish")
	}
	s.uid, s.subtask, s.parallelism = ctx.UID, ctx.Subtask, max(ctx.Parallelism, 1)
	s.final, s.tell = ctx.FinalCheckpoint, ctx.OutputHeld
	s.committed, s.log = ctx.RestoredCommitted, ctx.Logger
	s.done = ctx.Done
	s.clock = ctx.Clock
	if s.clock == nil {
		s.clock = clockwork.NewRealClock()
	}
	return nil
}

// Collect holds v until its checkpoint completes; with WithMaxHeld it
// first waits for room.
func (s *WriteAheadSink[T]) Collect(v T) {
	if s.maxHeld > 0 && s.q != nil && s.q.records.Load() >= int64(s.maxHeld) {
		s.waitRoom()
	}
	n := len(s.buf)
	if n == 0 || len(s.buf[n-1]) == cap(s.buf[n-1]) {
		if s.tell != nil {
			s.tell()
			s.tell = nil
		}
		size := walChunk
		if n < 8 {
			size = min(walFirstChunk<<n, walChunk)
		}
		s.buf = append(s.buf, make([]T, 0, size))
		n++
	}
	s.buf[n-1] = append(s.buf[n-1], v)
}

// SnapshotState seals the records since the last checkpoint as checkpoint
// id's and returns everything not yet published.
func (s *WriteAheadSink[T]) SnapshotState(id int64) ([]byte, error) {
	s.pending = append(s.pending, walBatch[T]{checkpoint: id, chunks: s.buf})
	s.buf = nil
	if err := s.failure(); err != nil {
		return nil, err
	}
	return s.encode()
}

func (s *WriteAheadSink[T]) encode() ([]byte, error) {
	batches := s.pending
	if q := s.q; q != nil {
		q.mu.Lock()
		batches = append(s.recentSince(q.recent), q.batches...)
		batches = append(batches, s.pending...)
		q.mu.Unlock()
	}
	b := binary.AppendUvarint(nil, uint64(len(batches)))
	var body []byte
	for _, p := range batches {
		b = binary.AppendVarint(b, p.checkpoint)
		var err error
		if body, err = s.appendBatch(body[:0], p); err != nil {
			return nil, err
		}
		b = binary.AppendUvarint(b, uint64(len(body)))
		b = append(b, body...)
	}
	return b, nil
}

// appendBatch appends p's records to dst as codec.AppendBatch does for
// one slice of them: the count, then every record's encoding.
func (s *WriteAheadSink[T]) appendBatch(dst []byte, p walBatch[T]) ([]byte, error) {
	n := p.len()
	out := binary.AppendUvarint(dst, uint64(n))
	body := len(out)
	for _, c := range p.chunks {
		for i := range c {
			var err error
			if out, err = s.codec.Append(out, c[i]); err != nil {
				return dst, fmt.Errorf("write-ahead sink: batch value: %w", err)
			}
		}
	}
	if len(out)-body < n {
		return dst, fmt.Errorf("write-ahead sink: %w: batch of %d values encodes to %d bytes",
			codec.ErrUnsupported, n, len(out)-body)
	}
	return out, nil
}

func (s *WriteAheadSink[T]) decode(b []byte) ([]walBatch[T], error) {
	bad := errors.New("write-ahead sink: corrupt state")
	n, k := binary.Uvarint(b)
	if k <= 0 || n > uint64(len(b)) {
		return nil, bad
	}
	b = b[k:]
	var out []walBatch[T]
	for range n {
		id, k := binary.Varint(b)
		if k <= 0 {
			return nil, bad
		}
		b = b[k:]
		l, k := binary.Uvarint(b)
		if k <= 0 || l > uint64(len(b)-k) {
			return nil, bad
		}
		body := b[k : k+int(l)]
		b = b[k+int(l):]
		var recs []T
		if len(body) > 0 {
			var err error
			if recs, err = codec.DecodeBatch(s.codec, nil, body); err != nil {
				return nil, fmt.Errorf("write-ahead sink: %w", err)
			}
		}
		// In chunks of at most walChunk, as collected ones: the
		// background publisher publishes whole chunks, up to
		// publishGroup records per call, and checks for Close between
		// calls.
		var chunks [][]T
		for len(recs) > 0 {
			n := min(len(recs), walChunk)
			chunks = append(chunks, recs[:n:n])
			recs = recs[n:]
		}
		out = append(out, walBatch[T]{checkpoint: id, chunks: chunks})
	}
	return out, nil
}

// ID returns the deterministic id of v: RecordID of the sink's UID and
// v's identity. Valid after Open.
func (s *WriteAheadSink[T]) ID(v T) string { return s.idWith(&s.scratch, v) }

// idWith is ID with its own encoding buffer.
func (s *WriteAheadSink[T]) idWith(scratch *[]byte, v T) string {
	if s.identity != nil {
		return RecordID(s.uid, s.identity(v))
	}
	b, err := s.codec.Append((*scratch)[:0], v)
	if err != nil {
		// Records that cannot be encoded never enter the state (encode
		// fails the snapshot first); fall back to the type's text form.
		return RecordID(s.uid, fmt.Sprintf("%#v", v))
	}
	*scratch = b
	return RecordID(s.uid, string(b))
}

// publishBatch publishes p's records with their ids in one call of
// publish, which waits for the acknowledgements once for the whole
// checkpoint (a call per chunk would drain the connection's window at
// every chunk): with WithPublishChunks in their chunks, else the chunks
// are joined first, one copy of the records. scratch is the caller's
// buffer for the ids.
func (s *WriteAheadSink[T]) publishBatch(p walBatch[T], scratch *[]byte) error {
	if s.chunked != nil {
		if p.len() == 0 {
			return nil
		}
		return s.chunked(p.chunks, func(c, i int) string { return s.idWith(scratch, p.chunks[c][i]) })
	}
	var records []T
	switch len(p.chunks) {
	case 0:
		return nil
	case 1:
		records = p.chunks[0]
	default:
		records = slices.Concat(p.chunks...)
	}
	if len(records) == 0 {
		return nil
	}
	return s.publish(records, func(j int) string { return s.idWith(scratch, records[j]) })
}

// NotifyCheckpointComplete publishes the records of every checkpoint up to
// id; with WithBackgroundPublish it hands them to the publishing goroutine,
// after the ones it has already, and returns.
func (s *WriteAheadSink[T]) NotifyCheckpointComplete(id int64) error {
	i := 0
	for i < len(s.pending) && s.pending[i].checkpoint <= id {
		i++
	}
	if s.background {
		s.enqueue(s.pending[:i])
		s.pending = slices.Delete(s.pending, 0, i)
		return s.failure()
	}
	for _, p := range s.pending[:i] {
		if err := s.publishBatch(p, &s.scratch); err != nil {
			return fmt.Errorf("write-ahead sink: publish checkpoint %d: %w", p.checkpoint, err)
		}
	}
	s.pending = slices.Delete(s.pending, 0, i)
	return nil
}

// WaitCommitted waits until every record of a completed checkpoint is
// published, and returns nil, or until a publish fails meanwhile, and
// returns that failure (CommitWaiter). A publish waiting to be tried
// again is tried at once. Without WithBackgroundPublish,
// NotifyCheckpointComplete published them already.
func (s *WriteAheadSink[T]) WaitCommitted(int64) error {
	q := s.q
	if q == nil {
		return nil
	}
	q.mu.Lock()
	failed := q.failed
	q.mu.Unlock()
	select {
	case q.nudge <- struct{}{}:
	default:
	}
	stopped := false
	q.mu.Lock()
	for {
		if q.fatal != nil {
			err := q.fatal
			q.mu.Unlock()
			return err
		}
		if len(q.batches) == 0 {
			q.mu.Unlock()
			return nil
		}
		if q.failed > failed {
			err := q.err
			q.mu.Unlock()
			return fmt.Errorf("write-ahead sink: %w", err)
		}
		if stopped {
			// Closed while this wait ran on another goroutine (a
			// handed-over subtask's bounded wait): what is left was
			// not published.
			q.mu.Unlock()
			return fmt.Errorf("write-ahead sink: wait for the publish: the publisher stopped: %w", ErrClosed)
		}
		ch := q.change
		q.mu.Unlock()
		select {
		case <-ch:
		case <-q.done:
			stopped = true
		case <-s.done:
			return fmt.Errorf("write-ahead sink: wait for the publish: %w", ErrClosed)
		}
		q.mu.Lock()
	}
}

// NotifyCheckpointAborted keeps the records: the next completed checkpoint
// publishes them.
func (s *WriteAheadSink[T]) NotifyCheckpointAborted(int64) error { return nil }

// RestoreState publishes the records the restored (completed) checkpoint
// held: they may not have been published before the failure. A consumer
// dropping duplicate ids sees them once. With another parallelism than
// the checkpoint's, states holds every old subtask's records and this
// subtask publishes those of old subtasks j with j mod parallelism ==
// subtask: each held record is published by exactly one new subtask.
//
// With WithBackgroundPublish it decodes them, hands them to the
// publishing goroutine and returns.
//
// A snapshot every sink committed before the job stopped
// (Context.RestoredCommitted: a stop-with-savepoint's) holds only records
// that were published then: nothing is published again. Either way the
// sink logs how many results the snapshot held, if any.
func (s *WriteAheadSink[T]) RestoreState(states [][]byte, oldParallelism int) error {
	n := max(s.parallelism, 1)
	rescaled := oldParallelism != n || len(states) != 1
	var restored []walBatch[T]
	records := 0
	for j, st := range states {
		if rescaled && j%n != s.subtask {
			continue
		}
		batches, err := s.decode(st)
		if err != nil {
			return err
		}
		for _, p := range batches {
			if l := p.len(); l > 0 {
				restored = append(restored, p)
				records += l
			}
		}
	}
	if records == 0 {
		return nil
	}
	if s.committed {
		s.logf("restored from a snapshot every sink committed; the results it held are not published again", records)
		return nil
	}
	s.logf("publishing again the results the restored checkpoint held", records)
	if !s.background {
		for _, p := range restored {
			if err := s.publishBatch(p, &s.scratch); err != nil {
				return fmt.Errorf("write-ahead sink: re-publish checkpoint %d: %w", p.checkpoint, err)
			}
		}
		return nil
	}
	s.enqueue(restored)
	return nil
}

// logf logs msg at INFO with the number of results, if the sink has a
// logger.
func (s *WriteAheadSink[T]) logf(msg string, results int) {
	if s.log != nil {
		s.log.Info(msg, "results", results)
	}
}

// waitRoom waits until the publisher holds fewer than maxHeld records,
// or the subtask stops, logging the wait when it is long.
func (s *WriteAheadSink[T]) waitRoom() {
	q := s.q
	start := s.clock.Now()
	logged := false
	tick := s.clock.NewTicker(5 * time.Second)
	defer tick.Stop()
	for {
		q.mu.Lock()
		n, ch, last, fatal := q.records.Load(), q.change, q.err, q.fatal
		q.mu.Unlock()
		if fatal != nil {
			Fail(fatal)
		}
		if n < int64(s.maxHeld) {
			if logged && s.log != nil {
				s.log.Info("write-ahead sink: room again; the sink takes results", "waited", s.clock.Since(start).Round(time.Millisecond))
			}
			return
		}
		select {
		case <-ch:
		case <-q.done:
			// Ended by a panic (Close runs on this goroutine).
			if err := s.failure(); err != nil {
				Fail(err)
			}
			return
		case <-s.done:
			return
		case <-tick.Chan():
			if !logged && s.log != nil {
				logged = true
				s.log.Warn("write-ahead sink: max_held results wait for the broker; the sink waits for room, holding the job back",
					"results_held", n, "max_held", s.maxHeld, "last_err", last)
			}
		}
	}
}

// enqueue hands batches to the publishing goroutine, starting it first.
func (s *WriteAheadSink[T]) enqueue(batches []walBatch[T]) {
	n := 0
	for _, p := range batches {
		n += p.len()
	}
	if n == 0 {
		return
	}
	q := s.q
	if q == nil || q.closed() {
		q = &walQueue[T]{change: make(chan struct{}), nudge: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
		s.q = q
		s.held.Store(q)
		go s.run(q)
	}
	q.mu.Lock()
	for _, p := range batches {
		if p.len() > 0 {
			q.batches = append(q.batches, p)
		}
	}
	q.records.Add(int64(n))
	q.changed()
	q.mu.Unlock()
}

// changed wakes whoever waits on q; mu must be held.
func (q *walQueue[T]) changed() {
	close(q.change)
	q.change = make(chan struct{})
}

// run publishes q's batches in order until Close, whole chunks of up to
// publishGroup records per call of publish, checking for Close between
// calls; a failed publish is tried again after a wait, from the start of
// the batch (its calls that went through are the latest the broker
// acknowledged, which a broker killed before its next save lost). A panic in the
// publish ends the goroutine with q.fatal set, which fails the subtask at
// its next checkpoint, completion or wait.
func (s *WriteAheadSink[T]) run(q *walQueue[T]) {
	defer close(q.done)
	defer func() {
		if r := recover(); r != nil {
			err := fmt.Errorf("write-ahead sink: publish panicked: %v", r)
			if f, ok := r.(*Failure); ok {
				err = fmt.Errorf("write-ahead sink: %w", f.Err)
			}
			q.mu.Lock()
			q.fatal, q.err = err, err
			q.failed++
			q.changed()
			q.mu.Unlock()
		}
	}()
	var scratch []byte
	wait := retryFirst
	next := 0 // the head batch's chunks published so far
	for {
		q.mu.Lock()
		ch := q.change
		var p walBatch[T]
		ok := len(q.batches) > 0
		if ok {
			p = q.batches[0]
		}
		q.mu.Unlock()
		if !ok {
			var lost <-chan struct{}
			if s.watch != nil {
				lost = s.watch.Lost()
			}
			select {
			case <-ch:
			case <-lost:
				s.connectionLost(q)
			case <-q.stop:
				return
			}
			continue
		}
		var err error
		for next < len(p.chunks) {
			select {
			case <-q.stop:
				return
			default:
			}
			// Chunks up to publishGroup records per call: one wait for
			// the acknowledgements per call, and Close waits for one.
			end, n := next+1, len(p.chunks[next])
			for end < len(p.chunks) && n+len(p.chunks[end]) <= publishGroup {
				n += len(p.chunks[end])
				end++
			}
			if err = s.publishBatch(walBatch[T]{checkpoint: p.checkpoint, chunks: p.chunks[next:end]}, &scratch); err != nil {
				break
			}
			next = end
		}
		q.mu.Lock()
		if err == nil {
			next = 0
			q.batches[0] = walBatch[T]{}
			q.batches = q.batches[1:]
			q.records.Add(-int64(p.len()))
			recovered := q.err != nil
			q.err = nil
			q.recent = s.keepRecent(q.recent, p)
			q.changed()
			q.mu.Unlock()
			if recovered {
				s.logf("write-ahead sink: publishing succeeds again; the held results go out", p.len())
			}
			wait = retryFirst
			continue
		}
		q.failed++
		q.err = fmt.Errorf("publish checkpoint %d: %w", p.checkpoint, err)
		if again := s.recentSince(q.recent); len(again) > 0 {
			// A broker restarted from its persistence file has lost what
			// it acknowledged after its last save: the batches published
			// shortly before go out again first, under the same ids.
			n := 0
			for _, b := range again {
				n += b.len()
			}
			q.batches = append(slices.Clip(again), q.batches...)
			q.records.Add(int64(n))
		}
		// The head batch goes out again from its start too: the calls of
		// it that went through are the latest the broker acknowledged.
		next = 0
		q.recent = nil
		held := q.records.Load()
		q.changed()
		q.mu.Unlock()
		if s.log != nil {
			s.log.Warn("write-ahead sink: publish failed; the results stay held and are published again",
				"checkpoint_id", p.checkpoint, "results_held", held, "retry_in", wait, "err", err)
		}
		t := s.clock.NewTimer(wait)
		select {
		case <-t.Chan():
		case <-q.nudge:
			t.Stop()
		case <-q.stop:
			t.Stop()
			return
		}
		wait = min(2*wait, retryMax)
	}
}

// connectionLost puts the batches a failed publish would publish again
// (recentSince) back at the head of q, after the connection they went
// over was lost while the publisher had nothing to publish, and forgets
// that connection.
func (s *WriteAheadSink[T]) connectionLost(q *walQueue[T]) {
	s.watch.Drop()
	q.mu.Lock()
	again := s.recentSince(q.recent)
	n := 0
	for _, b := range again {
		n += b.len()
	}
	if n > 0 {
		q.batches = append(slices.Clip(again), q.batches...)
		q.records.Add(int64(n))
	}
	q.recent = nil
	q.changed()
	q.mu.Unlock()
	if s.log != nil && n > 0 {
		s.log.Warn("write-ahead sink: the connection to the broker was lost; publishing again what went out over it lately",
			"results", n)
	}
}

// publishGroup is the most records (whole chunks, at least one) the
// background publisher hands to one call of publish.
const publishGroup = 65_536

// recentBatch is a batch the background publisher published, and when.
type recentBatch[T any] struct {
	b  walBatch[T]
	at time.Time
}

// republishWindow is how long before the latest publish a published
// batch is published again after a failure (the latest one always): a
// broker killed loses what it acknowledged since its last save
// (Mosquitto's autosave_interval), and the sink sees the lost connection
// only at its next publish.
// recentMax is the most records kept for that. The window is short: the
// batches kept are live heap the collector scans (in edged-bench's memory
// scenario, 10,000 results a second, CPU per reading was 21.7 µs with
// 30 s and 20.8 µs with 5 s kept, 17.2 µs with 2 s, 16.8 µs with the
// latest batch only, 16.6 µs for the synchronous publish before).
const (
	republishWindow = 2 * time.Second
	recentMax       = 50_000
)

// keepRecent adds p, published now, to recent, dropping batches older
// than republishWindow and the oldest past recentMax records.
func (s *WriteAheadSink[T]) keepRecent(recent []recentBatch[T], p walBatch[T]) []recentBatch[T] {
	now := s.clock.Now()
	recent = append(recent, recentBatch[T]{b: p, at: now})
	n := 0
	for _, r := range recent {
		n += r.b.len()
	}
	drop := 0
	for drop < len(recent)-1 && (now.Sub(recent[drop].at) > republishWindow || n > recentMax) {
		n -= recent[drop].b.len()
		recent[drop] = recentBatch[T]{}
		drop++
	}
	return recent[drop:]
}

// recentSince returns the batches of recent published within
// republishWindow before the latest one, and the latest one, oldest
// first: what a failed publish publishes again first, and what every
// snapshot holds beside the unpublished batches, so that a restore
// publishes them again too, under the same ids. The window ends at the
// latest publish, not at the failure or the snapshot: a killed broker
// lost what it acknowledged in its last moments, before the latest
// publish at the latest, and the sink sees the lost connection only at
// its next publish, which may come long after the broker died (no result
// for a while). A snapshot taken in such a quiet stretch still holds
// those batches: edged killed too before its next publish (a power loss
// of a device that runs both, or the two restarted one after the other)
// comes back from a checkpoint that held only what was not yet
// published when it was taken.
func (s *WriteAheadSink[T]) recentSince(recent []recentBatch[T]) []walBatch[T] {
	if len(recent) == 0 {
		return nil
	}
	latest := recent[len(recent)-1].at
	var out []walBatch[T]
	for _, r := range recent {
		if latest.Sub(r.at) <= republishWindow {
			out = append(out, r.b)
		}
	}
	return out
}

// failure returns the failure that ended the publishing goroutine (a
// panic), if any.
func (s *WriteAheadSink[T]) failure() error {
	q := s.q
	if q == nil {
		return nil
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.fatal
}

// closed reports whether Close stopped q's publisher.
func (q *walQueue[T]) closed() bool {
	select {
	case <-q.stop:
		return true
	default:
		return false
	}
}

// Close stops the background publisher and waits for it (at most one
// call of publish in progress, 65,536 records). What it did not publish, the job's
// latest checkpoint holds. It keeps s.q, which a WaitCommitted on another
// goroutine may still read; a wait left running returns ErrClosed.
func (s *WriteAheadSink[T]) Close() error {
	if q := s.q; q != nil && !q.closed() {
		close(q.stop)
		<-q.done
	}
	return nil
}

// Finish publishes what is held: the input ended. When the job takes a
// final checkpoint (Context.FinalCheckpoint) it does nothing: that
// checkpoint seals the last records and its completion publishes them.
func (s *WriteAheadSink[T]) Finish() error {
	if s.final {
		return nil
	}
	if _, err := s.SnapshotState(maxTimestamp); err != nil {
		return err
	}
	if err := s.NotifyCheckpointComplete(maxTimestamp); err != nil {
		return err
	}
	return s.WaitCommitted(maxTimestamp)
}

// RecordID returns a deterministic id made of parts: the same parts give
// the same id in every run, so an idempotent sink (an upsert by id, or a
// consumer dropping duplicate ids) writes each record once.
func RecordID(parts ...string) string {
	h := xxhash.New()
	for _, p := range parts {
		h.WriteString(p)
		h.Write([]byte{0})
	}
	return fmt.Sprintf("%016x", h.Sum64())
}
