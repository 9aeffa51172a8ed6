package actors

import (
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/edgedio/edged/codec"
	"github.com/edgedio/edged/keygroup"
	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/snapshot"
	"github.com/edgedio/edged/state"
	"github.com/edgedio/edged/watermark"
)

// triggerMsg tells a source task (or a finished task) to snapshot
// checkpoint id and, for a running source, to send its barrier.
type triggerMsg struct {
	id   int64
	stop bool
}

// barrierMsg is checkpoint id's barrier on a channel, in order with its
// records.
type barrierMsg struct {
	ch *channel
	id int64
}

func (b *barrierMsg) channel() *channel { return b.ch }

// completeMsg tells a task that checkpoint id completed; with ack (the
// final checkpoint, a stop-with-savepoint) the task tells the runner once
// its operators were notified, so the job ends only after its sinks
// committed.
type completeMsg struct {
	id  int64
	ack bool
}

// abortMsg tells a task that checkpoint id was aborted.
type abortMsg struct{ id int64 }

// fileMagic starts every operator state file.
var fileMagic = []byte("EDGT0001")

// sections says where the parts of an operator state file lie; it is
// stored in the snapshot handle.
type sections struct {
	RawOff, RawLen     int64
	OpOff, OpLen       int64
	KeyedOff, KeyedLen int64
	Groups             []groupExtent
}

type groupExtent struct {
	Group          int
	Offset, Length int64
}

// opSnapshot is the synchronous part of one operator's snapshot.
type opSnapshot struct {
	uid   string
	raw   []byte
	op    []byte
	keyed *state.KeyedSnapshot
	// time is the task's event-time state, kept with the head operator.
	time *taskTime
}

func (s *opSnapshot) empty() bool {
	return s.raw == nil && s.op == nil && s.keyed == nil && s.time == nil
}

// taskTime is a task's event-time state at a checkpoint: its input
// watermark merger (each channel's watermark and idle mark, the task's
// watermark), the watermark it last sent on its outputs and whether its
// output is marked idle. It is saved with the head operator of the chain:
// in the snapshot handle, after the file's section table (a handle
// without it, as older snapshots have, restores nothing); a head operator
// with no state of its own gets a handle without a file for it, which a
// restore does not count as state of the operator. Restoring it
// makes lateness after a restore what it was in the run without the
// failure.
type taskTime struct {
	// Inputs fingerprints the task's input channels (the edges into the
	// chain, their sending vertices and parallelisms): the merger's
	// per-channel state is restored only where it matches.
	Inputs uint64
	// HasMerger is set for a task with input channels.
	HasMerger bool
	Merger    watermark.MergerState
	// Output is the watermark last sent downstream; OutputIdle whether the
	// task told its outputs it is idle.
	Output     int64
	OutputIdle bool
	// Proc is the task's processing time (ms) at the snapshot, written
	// after the rest (appendTaskTime); 0 in snapshots taken before it
	// was kept.
	Proc int64 `codec:"-"`
}

// procTime returns tt.Proc, or 0 for a nil tt.
func (tt *taskTime) procTime() int64 {
	if tt == nil {
		return 0
	}
	return tt.Proc
}

// appendTaskTime appends tt to dst: taskTimeCodec's encoding, then Proc
// as a zig-zag varint unless it is 0.
func appendTaskTime(dst []byte, tt *taskTime) ([]byte, error) {
	dst, err := taskTimeCodec.Append(dst, *tt)
	if err != nil || tt.Proc == 0 {
		return dst, err
	}
	return binary.AppendVarint(dst, tt.Proc), nil
}

// hasStateFile reports whether a subtask of op wrote a state file: an
// operator without one carried only its task's event time, which a job
// without the operator does not miss.
func hasStateFile(op snapshot.Operator) bool {
	for _, h := range op.Subtasks {
		if h.File != "" {
			return true
		}
	}
	return false
}

// inputsFingerprint identifies the input channels of t, in their order.
func (t *task) inputsFingerprint() uint64 {
	var b strings.Builder
	for _, e := range t.chain.In {
		fmt.Fprintf(&b, "%q/%d/%d/%d;", e.From.UID, e.From.Parallelism, e.Partition, e.Input)
	}
	return keygroup.HashString(b.String())
}

// captureTime returns the task's event-time state.
func (t *task) captureTime() *taskTime {
	tt := &taskTime{Inputs: t.inputsFingerprint(), Output: t.live.watermark.Load(), OutputIdle: t.idle}
	if t.merger != nil {
		tt.HasMerger, tt.Merger = true, t.merger.State()
	}
	return tt
}

// restoreTime sets the task's event-time state from snapshot md, before
// the task starts: at the same parallelism and with the same input
// channels, the watermarks the task had, every channel and the output
// active (an idle input says so again once it runs); otherwise (rescaled) every input
// channel active at the smallest task watermark of the old subtasks whose
// key groups this subtask takes over (watermark.NewMergerAt), which is
// never later than what any of them had. The operators learn the restored
// watermark when the task starts (replayTime).
func (r *host) restoreTime(md *snapshot.Metadata, t *task) error {
	head := t.chain.Head()
	op, ok := md.Operator(head.UID)
	if !ok {
		return nil
	}
	old := make([]*taskTime, len(op.Subtasks))
	for i, h := range op.Subtasks {
		if len(h.KeyGroups) == 0 {
			continue
		}
		var err error
		if old[i], err = decodeTaskTime(h.KeyGroups); err != nil {
			return fmt.Errorf("operator %q subtask %d: %w", head.UID, i, err)
		}
		if p := old[i].procTime(); p > 0 && p < math.MaxInt64 {
			// Whichever old subtask's state this one takes, its
			// processing time starts after the latest of theirs.
			t.procFloor = max(t.procFloor, p+1)
		}
	}
	if op.Parallelism == head.Parallelism {
		tt := old[t.subtask]
		if tt == nil {
			// The snapshot says nothing of event time: the operators
			// start from the minimum, whatever their state was written
			// at.
			t.setStateWatermark(watermark.MaxWatermark)
			return nil
		}
		if tt.Inputs == t.inputsFingerprint() && tt.HasMerger == (t.merger != nil) {
			if t.merger != nil {
				// Stream status is not restored (MergerState.Activated):
				// idle inputs say so again once they run.
				m, err := watermark.RestoreMerger(tt.Merger.Activated())
				if err != nil {
					return err
				}
				if len(tt.Merger.Channels) != len(t.inChans) {
					return fmt.Errorf("%w: %d input channels, the checkpoint %d", watermark.ErrCorruptState, len(t.inChans), len(tt.Merger.Channels))
				}
				t.merger = m
			}
			t.live.watermark.Store(tt.Output)
			// The output starts active too, so that a task still idle
			// tells its outputs again (their channels restore active).
			t.idle = false
			t.restoredTime = true
			return nil
		}
	}
	if t.merger == nil {
		return nil
	}
	wm, found := watermark.MaxWatermark, false
	stateWM := watermark.MinWatermark
	for _, o := range state.KeyedRestoreSources(r.maxP, op.Parallelism, head.Parallelism)[t.subtask] {
		if tt := old[o]; tt != nil && tt.HasMerger {
			wm, found = min(wm, tt.Merger.Combined), true
			stateWM = max(stateWM, tt.Merger.Combined)
		} else {
			// An old subtask without event-time state: start from the
			// minimum.
			t.setStateWatermark(watermark.MaxWatermark)
			return nil
		}
	}
	if !found || wm == watermark.MaxWatermark {
		return nil
	}
	t.merger = watermark.NewMergerAt(len(t.inChans), wm)
	t.restoredTime = true
	if stateWM > wm {
		t.setStateWatermark(stateWM)
	}
	return nil
}

// setStateWatermark tells the task's operators that their keyed state was
// written at watermarks up to wm, later than the watermark they restore
// (operators.Context.RestoredStateWatermark).
func (t *task) setStateWatermark(wm int64) {
	for _, c := range t.ctxs {
		c.RestoredStateWatermark = &wm
	}
}

// replayTime gives the operators the restored task watermark before the
// task handles anything once every task is spawned (it forwards the
// watermark downstream), so before any record: the operators that keep
// timers take it as their current watermark without firing any
// (operators.WatermarkRestorer: a timer at or before it still queued was
// registered after the watermark last advanced, and fires when the next
// watermark arrives, as in the run without the failure), and forward it.
func (t *task) replayTime() {
	if t.merger == nil {
		t.restoredTime = false
		return
	}
	select {
	case <-t.run.started:
	default:
		return // not every task is spawned yet: the next message replays
	}
	t.restoredTime = false
	if wm := t.merger.Current(); wm != watermark.MinWatermark {
		t.replaying = true
		defer func() { t.replaying = false }()
		t.watermark(0, wm)
	}
}

// taskTimeCodec encodes taskTime after the section table of a handle.
var taskTimeCodec = codec.For[taskTime]()

// decodeTaskTime reads the task time that follows the section table in a
// handle's KeyGroups bytes; nil if there is none.
func decodeTaskTime(b []byte) (*taskTime, error) {
	_, n, err := codec.For[sections]().Decode(b)
	if err != nil {
		return nil, fmt.Errorf("sections: %w", err)
	}
	if n == len(b) {
		return nil, nil
	}
	tt, k, err := taskTimeCodec.Decode(b[n:])
	if err != nil {
		return nil, fmt.Errorf("task time: %w", err)
	}
	if rest := b[n+k:]; len(rest) > 0 {
		p, m := binary.Varint(rest)
		if m <= 0 {
			return nil, fmt.Errorf("task time: %w: processing time", watermark.ErrCorruptState)
		}
		tt.Proc = p
		k += m
	}
	if n+k != len(b) {
		return nil, fmt.Errorf("task time: %w: %d bytes left over", watermark.ErrCorruptState, len(b)-n-k)
	}
	return &tt, nil
}

// checkpoint takes the synchronous part of the snapshot of checkpoint id
// on the task's goroutine and writes it out on another goroutine, which
// acknowledges it to the runner.
func (t *task) checkpoint(id int64, alignment time.Duration) {
	t.lastSnap = max(t.lastSnap, id)
	t.triggered = slices.DeleteFunc(t.triggered, func(x int64) bool { return x <= id })
	parts := make([]opSnapshot, 0, len(t.ops))
	for i, op := range t.ops {
		t.current = int32(i)
		p := opSnapshot{uid: t.chain.Vertices[i].UID}
		var err error
		if f, ok := op.(operators.BarrierFlusher); ok {
			if err = f.FlushAtBarrier(id); err != nil {
				t.decline(id, fmt.Errorf("operator %q: %w", p.uid, err), parts)
				return
			}
		}
		if s, ok := op.(operators.Snapshotter); ok {
			if p.raw, err = s.SnapshotState(id); err != nil {
				t.decline(id, fmt.Errorf("operator %q: %w", p.uid, err), parts)
				return
			}
			if p.raw == nil {
				p.raw = []byte{}
			}
		}
		if st := t.ctxs[i].OperatorState; st != nil && st.Len() > 0 {
			if p.op, err = state.SnapshotOperator(st); err != nil {
				t.decline(id, fmt.Errorf("operator %q: %w", p.uid, err), parts)
				return
			}
		}
		if b := t.ctxs[i].State; b != nil {
			if p.keyed, err = state.Snapshot(b); err != nil {
				t.decline(id, fmt.Errorf("operator %q: %w", p.uid, err), parts)
				return
			}
		}
		if i == 0 {
			p.time = t.captureTime()
			p.time.Proc = t.procNow()
		}
		parts = append(parts, p)
	}
	r, sub := t.run, t.subtask
	tid := t.taskID()
	r.snapshots.Add(1)
	go func() {
		defer r.snapshots.Done()
		ts := snapshot.TaskState{Operators: make(map[string]snapshot.Handle)}
		var err error
		for i := range parts {
			p := &parts[i]
			if p.empty() {
				continue
			}
			var h snapshot.Handle
			if h, err = r.writeOperator(snapshot.ID(id), sub, p); err != nil {
				err = fmt.Errorf("operator %q subtask %d: %w", p.uid, sub, err)
				break
			}
			ts.Operators[p.uid] = h
		}
		for i := range parts {
			if parts[i].keyed != nil {
				parts[i].keyed.Release()
			}
		}
		if err != nil {
			r.input(snapshot.Decline{Checkpoint: snapshot.ID(id), Task: tid, Reason: err})
			return
		}
		r.input(snapshot.Ack{Checkpoint: snapshot.ID(id), Task: tid, State: ts, AlignmentTime: alignment})
	}()
}

func (t *task) decline(id int64, err error, parts []opSnapshot) {
	for i := range parts {
		if parts[i].keyed != nil {
			parts[i].keyed.Release()
		}
	}
	t.run.input(snapshot.Decline{Checkpoint: snapshot.ID(id), Task: t.taskID(), Reason: err})
}

func (t *task) taskID() snapshot.TaskID {
	return snapshot.TaskID{Vertex: t.chain.Head().UID, Subtask: t.subtask}
}

// writeOperator writes one operator's snapshot to its state file. An
// operator with nothing but the task's event time gets a handle without a
// file.
func (r *host) writeOperator(id snapshot.ID, subtask int, p *opSnapshot) (snapshot.Handle, error) {
	if p.raw == nil && p.op == nil && p.keyed == nil {
		kg, err := codec.For[sections]().Append(nil, sections{})
		if err == nil {
			kg, err = appendTaskTime(kg, p.time)
		}
		return snapshot.Handle{KeyGroups: kg}, err
	}
	w, err := r.store.Create(id, p.uid, subtask)
	if err != nil {
		return snapshot.Handle{}, err
	}
	// w buffers (snapshot.Writer); a second buffer here was 64 KiB of
	// garbage per state file and checkpoint.
	bw := w
	var sec sections
	off := int64(len(fileMagic))
	bw.Write(fileMagic)
	sec.RawOff, sec.RawLen = off, int64(len(p.raw))
	bw.Write(p.raw)
	off += sec.RawLen
	sec.OpOff, sec.OpLen = off, int64(len(p.op))
	bw.Write(p.op)
	off += sec.OpLen
	sec.KeyedOff = off
	if p.keyed != nil {
		n, err := p.keyed.WriteTo(bw)
		if err != nil {
			w.Abort()
			return snapshot.Handle{}, err
		}
		sec.KeyedLen = n
		for g, e := range p.keyed.Offsets() {
			sec.Groups = append(sec.Groups, groupExtent{Group: g, Offset: e.Offset, Length: e.Length})
		}
	}
	h, err := w.Finish()
	if err != nil {
		return snapshot.Handle{}, err
	}
	if h.KeyGroups, err = codec.For[sections]().Append(nil, sec); err != nil {
		return snapshot.Handle{}, err
	}
	if p.time != nil {
		if h.KeyGroups, err = appendTaskTime(h.KeyGroups, p.time); err != nil {
			return snapshot.Handle{}, err
		}
	}
	return h, nil
}

// restoredOperator is what one old subtask of an operator left in a
// snapshot.
type restoredOperator struct {
	path string
	sec  sections
}

func readSections(md *snapshot.Metadata, h snapshot.Handle) (restoredOperator, error) {
	sec, _, err := codec.For[sections]().Decode(h.KeyGroups)
	if err != nil {
		return restoredOperator{}, fmt.Errorf("state file %s: sections: %w", h.File, err)
	}
	return restoredOperator{path: md.FilePath(h), sec: sec}, nil
}

// readPart reads length bytes at off of the file at path.
func readPart(path string, off, length int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b := make([]byte, length)
	if _, err := f.ReadAt(b, off); err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return b, nil
}

// restoreOperator loads vertex v's state for subtask sub from md into ctx
// (keyed state and operator state, before Open) and returns the raw states
// to give the operator after Open.
func (r *host) restoreOperator(md *snapshot.Metadata, v *Vertex, sub int, ctx *operators.Context) (raw [][]byte, oldP int, err error) {
	op, ok := md.Operator(v.UID)
	if !ok {
		return nil, 0, nil
	}
	oldP = op.Parallelism
	old := make([]restoredOperator, len(op.Subtasks))
	for i, h := range op.Subtasks {
		if h.File == "" {
			continue
		}
		if old[i], err = readSections(md, h); err != nil {
			return nil, 0, err
		}
	}
	// Keyed state: the key groups of this subtask, from the old subtasks
	// whose ranges overlap them.
	if ctx.State != nil {
		for _, o := range state.KeyedRestoreSources(r.maxP, oldP, v.Parallelism)[sub] {
			ro := old[o]
			if ro.path == "" || ro.sec.KeyedLen == 0 {
				continue
			}
			if err := restoreKeyed(ctx, ro); err != nil {
				return nil, 0, err
			}
		}
	}
	// Operator state: redistributed by kind.
	var ops [][]byte
	for _, ro := range old {
		var b []byte
		if ro.path != "" && ro.sec.OpLen > 0 {
			if b, err = readPart(ro.path, ro.sec.OpOff, ro.sec.OpLen); err != nil {
				return nil, 0, err
			}
		}
		ops = append(ops, b)
	}
	if slicesHaveData(ops) {
		st, err := state.RestoreOperatorStates(ops, sub, v.Parallelism)
		if err != nil {
			return nil, 0, err
		}
		if r.cfg.Checkpoint.Dir != "" {
			st.RequireCodecs()
		}
		ctx.OperatorState = st
	}
	// Raw state: this subtask's at the same parallelism, all at another.
	pick := old
	if oldP == v.Parallelism {
		pick = old[sub : sub+1]
	}
	for _, ro := range pick {
		var b []byte
		if ro.path != "" && ro.sec.RawLen >= 0 {
			if b, err = readPart(ro.path, ro.sec.RawOff, ro.sec.RawLen); err != nil {
				return nil, 0, err
			}
		}
		raw = append(raw, b)
	}
	return raw, oldP, nil
}

// restoreFiles returns the state files of snapshot md that restoring
// subtask sub of chain c reads (restoreOperator): of each of the chain's
// operators, the old subtasks' files holding key groups of sub, operator
// state, or raw state for sub. Handles alone say it (their sections); a
// node adopting one moved subtask fetches only these, not the snapshot.
func restoreFiles(md *snapshot.Metadata, c *Chain, sub int) (map[string]bool, error) {
	need := make(map[string]bool)
	for _, v := range c.Vertices {
		op, ok := md.Operator(v.UID)
		if !ok {
			continue
		}
		if err := keygroup.Validate(op.Parallelism, md.MaxParallelism); err != nil {
			return nil, fmt.Errorf("operator %q: %w", v.UID, err)
		}
		keyed := make(map[int]bool)
		for _, o := range state.KeyedRestoreSources(md.MaxParallelism, op.Parallelism, v.Parallelism)[sub] {
			keyed[o] = true
		}
		for i, h := range op.Subtasks {
			if h.File == "" {
				continue
			}
			ro, err := readSections(md, h)
			if err != nil {
				return nil, err
			}
			raw := ro.sec.RawLen >= 0 && (op.Parallelism != v.Parallelism || i == sub)
			if (v.Keyed && keyed[i] && ro.sec.KeyedLen > 0) || ro.sec.OpLen > 0 || raw {
				need[h.File] = true
			}
		}
	}
	return need, nil
}

func restoreKeyed(ctx *operators.Context, ro restoredOperator) error {
	f, err := os.Open(ro.path)
	if err != nil {
		return err
	}
	defer f.Close()
	offsets := make(state.KeyGroupOffsets, len(ro.sec.Groups))
	for _, g := range ro.sec.Groups {
		offsets[g.Group] = state.Extent{Offset: g.Offset, Length: g.Length}
	}
	sr := io.NewSectionReader(f, ro.sec.KeyedOff, ro.sec.KeyedLen)
	return state.Restore(ctx.State, sr, offsets, ctx.KeyGroups)
}

func slicesHaveData(bs [][]byte) bool {
	for _, b := range bs {
		if len(b) > 0 {
			return true
		}
	}
	return false
}
