package mqtt

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/edgedio/edged/keygroup"
	"github.com/edgedio/edged/mqtt/ingestlog"
	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/snapshot"
)

// Message is one MQTT message as the Source emits it.
type Message struct {
	// Topic is the MQTT topic name it was published to.
	Topic string
	// Payload is the message body; the Message owns it.
	Payload []byte
	// Offset is the message's position in the ingest log: dense,
	// increasing, and the same in every replay.
	Offset uint64
	// TooLarge marks a dead letter: a message of TooLarge bytes (its
	// PUBLISH packet) that was too large to keep
	// (SubscriberConfig.MaxMessageBytes, BrokerConfig.MaxMessageBytes, or
	// an ingest-log record's limit). Payload holds only the first bytes
	// of its payload (at most DeadLetterKeep). 0 for every other message.
	TooLarge int64
}

// Err returns, for a dead letter (TooLarge), why the message is not
// there: an error wrapping ErrMessageTooLarge. nil for every other
// message.
func (m Message) Err() error {
	if m.TooLarge <= 0 {
		return nil
	}
	return fmt.Errorf("%w: %d bytes on topic %q; the payload was discarded, its first %d bytes kept",
		ErrMessageTooLarge, m.TooLarge, m.Topic, len(m.Payload))
}

// Versions of the Source's snapshot (its first byte): 1 holds the offset
// only; 2 also the checkpoint's ID and the offsets of the completed
// checkpoints the Source knew of.
// 3 is 2 followed by the split's identity (a length-prefixed string).
// 4 is 2 followed by the split's identity (empty outside a cluster) and
// the ingest log's (ingestlog.Log.ID), both length-prefixed: an offset
// names a record only in the log it was read from.
const (
	sourceStateV1 = 1
	sourceStateV2 = 2
	sourceStateV3 = 3
	sourceStateV4 = 4
)

// maxKnownCheckpoints bounds the completed checkpoints a Source remembers
// (and stores in its snapshot).
const maxKnownCheckpoints = 64

// Source emits the messages of an ingest log, the replayable copy of what
// the broker (or an MQTT subscriber) received; it implements
// operators.Source[Message], Snapshotter, Restorer and CheckpointListener.
//
// One log is one split: only subtask 0 reads it, and the other subtasks
// report EndOfInput at once (in a cluster, WithSplits: every subtask runs
// on its own node and reads that node's log). A log must feed a single
// Source, since the Source truncates it.
//
// Positions: a fresh Source (nothing restored) starts at the oldest
// record still in the log, that is everything no retained checkpoint has
// covered. SnapshotState stores the offset of the next record to emit,
// with the checkpoint's ID and the offsets of the completed checkpoints
// the Source knows of; RestoreState seeks there, so recovery replays the
// log from the checkpointed offset.
//
// Truncation keeps what every retained checkpoint needs: when a checkpoint
// completes (and after a restore) the log is truncated only below the
// offset of the oldest checkpoint the snapshot store still retains, so
// that a restore from any of them (the fallback when the newest is
// damaged) finds its records. Which checkpoints are retained comes from
// the store (WithCheckpointStore) or, without one, is taken to be the
// newest WithRetain (default 2, as snapshot.Config.Retain) completed
// snapshots the Source was told of. Without a store a savepoint counts
// among them (the Source cannot tell a completed savepoint from a
// checkpoint), so with savepoints give the Source the store. The offsets
// of completed checkpoints travel in the Source's own snapshots, so the
// knowledge survives restarts.
//
// Savepoints are never deleted, so the log is not kept for them: a
// savepoint older than the oldest retained checkpoint may need records
// that are gone. Restoring it fails in RestoreState with an error
// wrapping ingestlog.ErrTruncated that names the savepoint's offset and
// the log's first offset.
//
// All methods are called on the subtask's goroutine; Poll never blocks,
// and Available returns a channel that is closed when new records are
// durable. The caller owns the log: it opens it before the job and closes
// it after the Source.
type Source struct {
	operators.Base
	log    *ingestlog.Log
	retain int
	store  CheckpointStore
	active bool
	// In a cluster (WithSplits) subtask i is the split of node
	// splits[i]: it reads the log only on that node (self), and a snapshot
	// is restored only into the split it was taken of. split is this
	// subtask's node; away marks a split running on another node while
	// its own is down: it reads nothing, reports its stream idle, and
	// keeps its snapshot (carried) for when it is back home.
	splits  []string
	self    string
	split   string
	away    bool
	carried []byte
	idleCtx func(bool)
	never   chan struct{}
	// homeBack (WithSplitHome), for a split away: whether its node is
	// back and about to get it. emitIdle is the subtask's
	// Context.EmitIdle; waiting says the split last said it was active
	// (waiting for its node), not idle; recheck fires when Poll should
	// ask homeBack again.
	homeBack func(node string) bool
	emitIdle func(bool)
	said     bool
	waiting  bool
	recheck  chan struct{}
	timer    *time.Timer
	logger   *slog.Logger      // the subtask's (operators.Context.Logger); may be nil
	logID    string            // the log's identity (ingestlog.Log.ID), set by Open; "" when unknown
	pos      uint64            // next offset to emit while reader is nil
	reader   *ingestlog.Reader // opened at the first Poll
	// cpWarned is set once a failure to record the checkpointed offset
	// was logged, until one succeeds.
	cpWarned bool
	pending  map[int64]uint64 // checkpoint id -> offset it recorded
	// known are completed checkpoints with their offsets, by ascending ID.
	known  []checkpointOffset
	closed chan struct{} // always closed; Available of an idle subtask
}

// checkpointOffset is the offset a completed checkpoint recorded.
type checkpointOffset struct {
	id     int64
	offset uint64
}

// CheckpointStore tells which completed checkpoints the snapshot store
// retains: *snapshot.Store implements it. Progress is called on the
// source subtask's goroutine when a checkpoint completes and after a
// restore; it reads a directory.
type CheckpointStore interface {
	Progress() (snapshot.Progress, error)
}

// SourceOption configures a Source.
type SourceOption func(*Source)

// WithRetain tells the Source how many completed checkpoints the job
// retains (snapshot.Config.Retain, default 2), for a Source without a
// CheckpointStore. Values below 1 count as 1.
func WithRetain(n int) SourceOption {
	return func(s *Source) { s.retain = max(n, 1) }
}

// WithSplits makes the Source a cluster's MQTT source with one split per
// node: subtask i is node nodes[i]'s split and reads the log it was given
// only when it runs on that node (self). Its snapshots carry the node's
// id, and a restore takes only the snapshot of its own split, never
// another node's offset; a split with no snapshot of its own starts at
// the oldest record in its log. A split placed on another node while its
// own is down reads nothing and marks its stream idle, so that the
// watermarks of the others advance; it keeps its snapshot for when the
// node is back.
func WithSplits(nodes []string, self string) SourceOption {
	return func(s *Source) { s.splits, s.self = nodes, self }
}

// WithSplitHome makes a split placed away from its node (WithSplits) ask
// back, every AwayRecheck while it is away, whether that node is back: a
// live member that the cluster is about to give its split again (it came
// back after the placement left it out, not a node drained on purpose).
// While back says so, the split says its stream is active though it reads
// nothing, so that the watermarks of the other splits wait for it: the
// readings its node takes in meanwhile are read once the split is home,
// on time, instead of behind a watermark the others moved on. Without
// WithSplitHome (or while back says no) an away split is idle.
func WithSplitHome(back func(node string) bool) SourceOption {
	return func(s *Source) { s.homeBack = back }
}

// AwayRecheck is how often a split away from its node asks WithSplitHome's
// function whether its node is back.
const AwayRecheck = 100 * time.Millisecond

// WithCheckpointStore makes the Source ask store which completed
// checkpoints are retained, so that the log keeps what each of them
// needs whatever savepoints completed in between.
func WithCheckpointStore(store CheckpointStore) SourceOption {
	return func(s *Source) { s.store = store }
}

// WithCheckpointDir is WithCheckpointStore with the snapshot store of job
// in dir (snapshot.Config.Dir), opened when the Source first needs it (a
// checkpoint completed or a restore), so that building a job touches no
// disk.
func WithCheckpointDir(dir, job string) SourceOption {
	return WithCheckpointStore(&lazyStore{dir: dir, job: job})
}

// lazyStore opens a snapshot store at its first Progress. Used by one
// Source subtask only.
type lazyStore struct {
	dir, job string
	store    *snapshot.Store
}

func (l *lazyStore) Progress() (snapshot.Progress, error) {
	if l.store == nil {
		st, err := snapshot.OpenStore(l.dir, l.job, keygroup.DefaultMaxParallelism, nil)
		if err != nil {
			return snapshot.Progress{}, err
		}
		l.store = st
	}
	return l.store.Progress()
}

var (
	_ operators.Source[Message]    = (*Source)(nil)
	_ operators.Snapshotter        = (*Source)(nil)
	_ operators.Restorer           = (*Source)(nil)
	_ operators.CheckpointListener = (*Source)(nil)
)

// NewSource returns a source reading log. It reads nothing until Poll.
func NewSource(log *ingestlog.Log, opts ...SourceOption) *Source {
	closed := make(chan struct{})
	close(closed)
	s := &Source{log: log, retain: snapshot.DefaultConfig().Retain, pending: make(map[int64]uint64), closed: closed}
	for _, o := range opts {
		o(s)
	}
	return s
}

// Open makes subtask 0 the reader, starting at the oldest record in the
// log unless RestoreState says otherwise.
func (s *Source) Open(ctx *operators.Context) error {
	s.active = ctx.Subtask == 0
	s.logger = ctx.Logger
	s.logID = s.log.ID()
	if s.splits != nil {
		if ctx.Subtask >= len(s.splits) {
			return fmt.Errorf("mqtt source: subtask %d of a source with %d splits", ctx.Subtask, len(s.splits))
		}
		s.split = s.splits[ctx.Subtask]
		s.away = s.split != s.self
		s.active = !s.away
		s.idleCtx = ctx.EmitIdle
		s.emitIdle = ctx.EmitIdle
		s.never = make(chan struct{})
	}
	if s.active {
		s.pos = s.log.Stats().FirstOffset
	}
	return nil
}

// Close releases the log reader; the log stays open.
func (s *Source) Close() error {
	if s.timer != nil {
		s.timer.Stop()
		s.timer = nil
	}
	if s.reader == nil {
		return nil
	}
	err := s.reader.Close()
	s.reader = nil
	return err
}

// Offset returns the offset of the next record Poll emits.
func (s *Source) Offset() uint64 {
	if s.reader != nil {
		return s.reader.Offset()
	}
	return s.pos
}

// Poll emits up to limit durable records without blocking.
func (s *Source) Poll(out operators.Collector[Message], limit int) (operators.Status, error) {
	if s.away {
		s.pollAway()
		return operators.NothingAvailable, nil
	}
	if s.idleCtx != nil {
		// A split back home (a rebalance or failover moved it back) may
		// have been restored idle, as it was while away: downstream
		// tasks restore its channels idle too and would leave its
		// watermark out, making its records late. Say it is active (a
		// no-op for a task that is active already).
		s.idleCtx(false)
		s.idleCtx = nil
	}
	if !s.active {
		return operators.EndOfInput, nil
	}
	if s.reader == nil {
		r, err := s.log.Reader(s.pos)
		if err != nil {
			return operators.NothingAvailable, fmt.Errorf("mqtt source: read log from offset %d: %w", s.pos, err)
		}
		s.reader = r
	}
	for range max(limit, 1) {
		rec, ok, err := s.reader.TryNext()
		if err != nil {
			return operators.NothingAvailable, fmt.Errorf("mqtt source: read log at offset %d: %w", s.reader.Offset(), err)
		}
		if !ok {
			return operators.NothingAvailable, nil
		}
		if rec.Note {
			continue // a redelivery note, no message (see Subscriber)
		}
		out.Collect(Message{Topic: rec.Topic, Payload: rec.Payload, Offset: rec.Offset, TooLarge: rec.TooLarge})
	}
	return operators.MoreAvailable, nil
}

// pollAway says the stream of a split away from its node idle, or
// active while its node is back (WithSplitHome), each time that changes.
func (s *Source) pollAway() {
	s.idleCtx = nil
	wait := s.homeBack != nil && s.homeBack(s.split)
	if s.said && wait == s.waiting {
		return
	}
	if s.logger != nil {
		switch {
		case wait:
			s.logger.Info("mqtt source: this split's node is back; the split holds the watermark until its node reads its log again",
				"split", s.split)
		case s.said:
			s.logger.Info("mqtt source: this split's node is gone again; the split is idle", "split", s.split)
		}
	}
	s.said, s.waiting = true, wait
	if s.emitIdle != nil {
		s.emitIdle(!wait)
	}
}

// Available returns a channel closed when Poll may have records again.
func (s *Source) Available() <-chan struct{} {
	if s.away {
		return s.awayReady()
	}
	if s.reader == nil {
		return s.closed
	}
	return s.reader.Ready()
}

// awayReady returns the channel Available gives while the split is away:
// one that never fires without WithSplitHome, else one that fires
// AwayRecheck after the last one.
func (s *Source) awayReady() <-chan struct{} {
	if s.homeBack == nil {
		return s.never
	}
	select {
	case <-s.recheck: // fired (a nil recheck is not ready)
		s.recheck = nil
	default:
	}
	if s.recheck == nil {
		ch := make(chan struct{})
		s.recheck = ch
		s.timer = time.AfterFunc(AwayRecheck, func() { close(ch) })
	}
	return s.recheck
}

// SnapshotState returns the offset of the next record to emit, with id
// and the completed checkpoints the Source knows of, and remembers the
// offset as checkpoint id's for NotifyCheckpointComplete.
func (s *Source) SnapshotState(id int64) ([]byte, error) {
	if s.away {
		return s.carried, nil
	}
	if !s.active {
		return nil, nil
	}
	off := s.Offset()
	s.pending[id] = off
	version := byte(sourceStateV2)
	switch {
	case s.logID != "":
		version = sourceStateV4
	case s.splits != nil:
		version = sourceStateV3
	}
	b := binary.AppendUvarint([]byte{version}, off)
	b = binary.AppendVarint(b, id)
	b = binary.AppendUvarint(b, uint64(len(s.known)))
	for _, k := range s.known {
		b = binary.AppendVarint(b, k.id)
		b = binary.AppendUvarint(b, k.offset)
	}
	if version >= sourceStateV3 {
		b = binary.AppendUvarint(b, uint64(len(s.split)))
		b = append(b, s.split...)
	}
	if version == sourceStateV4 {
		b = binary.AppendUvarint(b, uint64(len(s.logID)))
		b = append(b, s.logID...)
	}
	return b, nil
}

// RestoreState seeks subtask 0 to the offset old subtask 0 snapshotted
// (states[0]); whatever the parallelism, only subtask 0 read. The other
// subtasks ignore their state. The restored snapshot counts as completed
// (it is), with the checkpoints it knew of; the log is then truncated
// below what the retained checkpoints need. An offset no longer in the
// log (a savepoint older than the retained checkpoints) fails with an
// error wrapping ingestlog.ErrTruncated.
func (s *Source) RestoreState(states [][]byte, _ int) error {
	if s.splits != nil {
		return s.restoreSplit(states)
	}
	if !s.active || len(states) == 0 || len(states[0]) == 0 {
		return nil
	}
	st, err := decodeSourceState(states[0])
	if err != nil {
		return err
	}
	return s.restore(st)
}

// restoreSplit restores the snapshot of the Source's own split, if states
// hold one; the other splits' snapshots are other logs' offsets.
func (s *Source) restoreSplit(states [][]byte) error {
	for _, b := range states {
		if len(b) == 0 {
			continue
		}
		st, err := decodeSourceState(b)
		if err != nil {
			return err
		}
		if st.split != s.split {
			continue
		}
		if s.away {
			s.carried = b
			return nil
		}
		if st.log != "" && s.logID != "" && st.log != s.logID {
			// The node's log is not the one the checkpoint read: the
			// node came back with a new data_dir, and its new log may
			// already hold more records than the checkpoint's offset,
			// which names other records in it. As below.
			if s.logger != nil {
				s.logger.Warn("mqtt source: this node's ingest log is not the one the checkpoint read (a new data_dir?); the readings its old log held after the checkpoint are lost; reading the new log from its start",
					"split", s.split, "checkpoint_offset", st.offset, "checkpoint_log", st.log, "log", s.logID)
			}
			s.pos = s.log.Stats().FirstOffset
			return nil
		}
		if ls := s.log.Stats(); st.offset > ls.NextOffset {
			// The node's log is behind its own checkpoint: the node came
			// back with a new data_dir (a replaced device or card). What
			// its old log held after the checkpoint is gone with it;
			// failing the restore would fail the whole cluster's job at
			// every attempt. Read the new log from its start.
			if s.logger != nil {
				s.logger.Warn("mqtt source: this node's ingest log is behind the checkpoint (a new data_dir?); the readings its old log held after the checkpoint are lost; reading the new log from its start",
					"split", s.split, "checkpoint_offset", st.offset, "log_next_offset", ls.NextOffset)
			}
			s.pos = ls.FirstOffset
			return nil
		}
		return s.restore(st)
	}
	return nil
}

// restore seeks to st's offset.
func (s *Source) restore(st sourceState) error {
	if s.reader != nil {
		if err := s.reader.Close(); err != nil {
			return fmt.Errorf("mqtt source: %w", err)
		}
		s.reader = nil
	}
	what := "snapshot"
	if st.id != 0 {
		what = fmt.Sprintf("snapshot %d", st.id)
	}
	if ls := s.log.Stats(); st.offset < ls.FirstOffset || st.offset > ls.NextOffset {
		if st.offset < ls.FirstOffset {
			return fmt.Errorf("mqtt source: restore %s at ingest-log offset %d: %w: the log's first offset is %d (the log keeps only what the retained checkpoints need; an older savepoint cannot be restored)",
				what, st.offset, ingestlog.ErrTruncated, ls.FirstOffset)
		}
		return fmt.Errorf("mqtt source: restore %s at ingest-log offset %d: %w: %w: the log's next offset is %d: records the snapshot read, which were acknowledged, are gone from the log at %s (its last segment cut or damaged, or another ingest log); a restart cannot bring them back",
			what, st.offset, operators.ErrSourcePositionGone, ingestlog.ErrOutOfRange, ls.NextOffset, s.log.Dir())
	}
	if st.log != "" && s.logID != "" && st.log != s.logID {
		return fmt.Errorf("mqtt source: restore %s at ingest-log offset %d: %w: %w: the snapshot read ingest log %s, and %s is log %s (another node's, or another data_dir's): the offset names other records in it",
			what, st.offset, operators.ErrSourcePositionGone, ErrOtherLog, st.log, s.log.Dir(), s.logID)
	}
	s.pos = st.offset
	s.known = st.known
	if st.id != 0 {
		s.addKnown(checkpointOffset{id: st.id, offset: st.offset})
	}
	if err := s.release(); err != nil {
		return fmt.Errorf("mqtt source: after restoring offset %d: %w", st.offset, err)
	}
	return nil
}

// sourceState is a decoded snapshot of the Source.
type sourceState struct {
	offset uint64
	id     int64 // 0 in a version 1 state
	known  []checkpointOffset
	split  string // "" before version 3, and outside a cluster
	log    string // the ingest log's identity; "" before version 4, or unknown
}

func decodeSourceState(b []byte) (sourceState, error) {
	bad := fmt.Errorf("%w: %x", ErrCorruptState, b)
	if len(b) < 2 || b[0] < sourceStateV1 || b[0] > sourceStateV4 {
		return sourceState{}, bad
	}
	d := b[1:]
	uv := func() (uint64, bool) {
		v, n := binary.Uvarint(d)
		if n <= 0 {
			return 0, false
		}
		d = d[n:]
		return v, true
	}
	sv := func() (int64, bool) {
		v, n := binary.Varint(d)
		if n <= 0 {
			return 0, false
		}
		d = d[n:]
		return v, true
	}
	var st sourceState
	var ok bool
	if st.offset, ok = uv(); !ok {
		return sourceState{}, bad
	}
	if b[0] >= sourceStateV2 {
		if st.id, ok = sv(); !ok || st.id <= 0 {
			return sourceState{}, bad
		}
		n, ok := uv()
		if !ok || n > maxKnownCheckpoints {
			return sourceState{}, bad
		}
		for range n {
			var k checkpointOffset
			if k.id, ok = sv(); !ok || k.id <= 0 || (len(st.known) > 0 && k.id <= st.known[len(st.known)-1].id) {
				return sourceState{}, bad
			}
			if k.offset, ok = uv(); !ok {
				return sourceState{}, bad
			}
			st.known = append(st.known, k)
		}
	}
	if b[0] >= sourceStateV3 {
		n, ok := uv()
		if !ok || (n == 0 && b[0] == sourceStateV3) || n > uint64(len(d)) {
			return sourceState{}, bad
		}
		st.split, d = string(d[:n]), d[n:]
	}
	if b[0] == sourceStateV4 {
		n, ok := uv()
		if !ok || n == 0 || n > uint64(len(d)) {
			return sourceState{}, bad
		}
		st.log, d = string(d[:n]), d[n:]
	}
	if len(d) != 0 {
		return sourceState{}, bad
	}
	return st, nil
}

// NotifyCheckpointComplete records the offset checkpoint id recorded and
// truncates the log below what the retained checkpoints still need.
// Pending checkpoints up to id are forgotten.
func (s *Source) NotifyCheckpointComplete(id int64) error {
	off, ok := s.pending[id]
	for cp := range s.pending {
		if cp <= id {
			delete(s.pending, cp)
		}
	}
	if !ok {
		return nil
	}
	s.addKnown(checkpointOffset{id: id, offset: off})
	if err := s.log.SetCheckpointed(off); err != nil {
		// A guard for the next start (see SetCheckpointed), not what the
		// checkpoint needs: a card too full to hold it fails no job.
		if !s.cpWarned && s.logger != nil {
			s.logger.Warn("mqtt source: could not record the checkpointed offset; the next start cannot tell whether acknowledged records went missing from the log's end",
				"checkpoint_id", id, "offset", off, "err", err)
		}
		s.cpWarned = true
	} else {
		s.cpWarned = false
	}
	if err := s.release(); err != nil {
		return fmt.Errorf("mqtt source: checkpoint %d completed: %w", id, err)
	}
	return nil
}

// NotifyCheckpointAborted forgets checkpoint id's offset.
func (s *Source) NotifyCheckpointAborted(id int64) error {
	delete(s.pending, id)
	return nil
}

// addKnown records a completed checkpoint, keeping known sorted by ID.
func (s *Source) addKnown(k checkpointOffset) {
	i, found := slices.BinarySearchFunc(s.known, k.id, func(c checkpointOffset, id int64) int { return cmp.Compare(c.id, id) })
	if found {
		s.known[i] = k
		return
	}
	s.known = slices.Insert(s.known, i, k)
	if len(s.known) > maxKnownCheckpoints {
		s.known = slices.Delete(s.known, 0, len(s.known)-maxKnownCheckpoints)
	}
}

// release truncates the log below the offset the retained checkpoints
// need, and forgets the known checkpoints no bound needs any more.
func (s *Source) release() error {
	var retained []int64
	if s.store != nil {
		p, err := s.store.Progress()
		if err != nil {
			return fmt.Errorf("list retained checkpoints: %w", err)
		}
		for _, id := range p.Completed {
			retained = append(retained, int64(id))
		}
	} else {
		for _, k := range s.known[max(0, len(s.known)-s.retain):] {
			retained = append(retained, k.id)
		}
	}
	before, keepFrom, ok := releasable(s.known, retained)
	s.known = s.known[keepFrom:]
	if !ok {
		return nil
	}
	if err := s.log.Truncate(before); err != nil {
		return fmt.Errorf("truncate log before offset %d: %w", before, err)
	}
	return nil
}

// releasable returns the offset below which no retained checkpoint needs
// the log, given the completed checkpoints known (by ascending ID) and the
// IDs of the retained ones; ok is false when it cannot tell (a retained
// checkpoint older than every known one, or none retained). A retained
// checkpoint the Source does not know (its completion was not reported to
// this Source, or it belongs to an attempt the job went back from) needs
// at least the offset of the newest known checkpoint before it, since a
// checkpoint's offset is never below an earlier one's in its attempt, and
// the attempts share their history up to the checkpoint they restored.
// keepFrom is the index of the first known checkpoint a later call may
// still need.
func releasable(known []checkpointOffset, retained []int64) (before uint64, keepFrom int, ok bool) {
	if len(retained) == 0 {
		return 0, 0, false
	}
	first := true
	oldest := slices.Min(retained)
	for _, id := range retained {
		// The newest known checkpoint at or before id.
		i, found := slices.BinarySearchFunc(known, id, func(c checkpointOffset, id int64) int { return cmp.Compare(c.id, id) })
		if !found {
			i--
		}
		if i < 0 {
			return 0, 0, false
		}
		if first || known[i].offset < before {
			before, first = known[i].offset, false
		}
		if id == oldest {
			keepFrom = i
		}
	}
	return before, keepFrom, true
}
