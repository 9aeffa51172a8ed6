package watermark

import (
	"encoding/binary"
	"fmt"
)

// MergerState is what a Merger knows, as a value: saved with a checkpoint
// and given back to RestoreMerger, so that the task's watermark, the
// watermark of each input channel and the idle statuses after a restore
// are those of the checkpoint, and records are late exactly when they
// were late in a run without the failure.
type MergerState struct {
	// Combined is the task's watermark (Merger.Current).
	Combined int64
	// ReportedIdle is the status StatusChanged last reported.
	ReportedIdle bool
	// Channels holds each input channel's watermark and idle mark, by
	// channel index.
	Channels []ChannelState
}

// ChannelState is what a Merger knows of one input channel.
type ChannelState struct {
	// Watermark is the channel's watermark as held for the minimum.
	Watermark int64
	// Idle is whether the channel is marked idle.
	Idle bool
}

// State returns a copy of the Merger's state.
func (m *Merger) State() MergerState {
	s := MergerState{Combined: m.combined, ReportedIdle: m.reportedIdle, Channels: make([]ChannelState, len(m.chans))}
	for i, c := range m.chans {
		s.Channels[i] = ChannelState{Watermark: c.wm, Idle: c.idle}
	}
	return s
}

// Activated returns s with every idle channel active again, at the
// larger of its watermark and the task's, and the task active: what a
// task restored from s starts from. As in Flink, stream status is not
// carried across a restore: an input that is still idle says so again
// once it runs, while an input that became active while the job was down
// (a source split back on its node, say) holds the task's watermark from
// the start instead of finding it moved on by the other inputs' backlog.
func (s MergerState) Activated() MergerState {
	out := MergerState{Combined: s.Combined, Channels: make([]ChannelState, len(s.Channels))}
	for i, c := range s.Channels {
		if c.Idle {
			c.Idle = false
			c.Watermark = max(c.Watermark, s.Combined)
		}
		out.Channels[i] = c
	}
	return out
}

// RestoreMerger returns a Merger in state s, which must have at least one
// channel, and no channel watermark above s.Combined unless the channel
// could hold it there (a channel's watermark never lies below the task's
// while it is active, and the task's is never above every active
// channel's: State never returns such a state, and RestoreMerger rejects
// it as corrupt).
func RestoreMerger(s MergerState) (*Merger, error) {
	if len(s.Channels) == 0 {
		return nil, fmt.Errorf("%w: merger state without channels", ErrCorruptState)
	}
	m := &Merger{chans: make([]channelState, len(s.Channels)), combined: s.Combined, reportedIdle: s.ReportedIdle}
	for i, c := range s.Channels {
		if !c.Idle && c.Watermark != MaxWatermark && c.Watermark < s.Combined {
			return nil, fmt.Errorf("%w: active channel %d at %d below the task's watermark %d", ErrCorruptState, i, c.Watermark, s.Combined)
		}
		m.chans[i] = channelState{wm: c.Watermark, idle: c.Idle}
	}
	return m, nil
}

// NewMergerAt returns a Merger for channels input channels, all active at
// watermark wm, with the task's watermark at wm. A task restored with
// another parallelism, or with other input channels, than its checkpoint
// starts from it, with wm the smallest watermark of the old subtasks
// whose state it takes over: never later than any of them, so no record
// that was on time for them is late for it (a record late for all of them
// may be on time for it; that is the conservative side).
func NewMergerAt(channels int, wm int64) *Merger {
	m := NewMerger(channels)
	m.combined = wm
	for i := range m.chans {
		m.chans[i].wm = wm
	}
	return m
}

// StatefulGenerator is a Generator whose state (the largest timestamp
// seen, the last watermark emitted) can be saved with a checkpoint and
// restored, so that after a restore it emits the watermarks it would have
// emitted without the failure. The generators of this package implement
// it; a custom Generator that does not starts afresh after a restore
// (its watermarks are then held back by the downstream tasks' restored
// watermarks, which never go back). Called on the owning task's
// goroutine.
type StatefulGenerator interface {
	Generator
	// AppendState appends the generator's state to b.
	AppendState(b []byte) []byte
	// RestoreState sets the generator's state to what AppendState wrote;
	// it returns an error wrapping ErrCorruptState for anything else.
	RestoreState(b []byte) error
}

// generatorStateVersion is the first byte of a bounded out-of-orderness
// generator's state.
const generatorStateVersion = 1

var _ StatefulGenerator = (*boundedOutOfOrderness)(nil)

// AppendState appends version, seen, maxTs and the last emitted
// watermark to b.
func (g *boundedOutOfOrderness) AppendState(b []byte) []byte {
	seen := byte(0)
	if g.seen {
		seen = 1
	}
	b = append(b, generatorStateVersion, seen)
	b = binary.AppendVarint(b, g.maxTs)
	return binary.AppendVarint(b, g.emitted)
}

// RestoreState takes back what AppendState wrote. The delay is the
// generator's own, not the saved one's.
func (g *boundedOutOfOrderness) RestoreState(b []byte) error {
	if len(b) < 2 || b[0] != generatorStateVersion || b[1] > 1 {
		return fmt.Errorf("%w: generator state %x", ErrCorruptState, b)
	}
	maxTs, n := binary.Varint(b[2:])
	if n <= 0 {
		return fmt.Errorf("%w: generator state %x", ErrCorruptState, b)
	}
	emitted, k := binary.Varint(b[2+n:])
	if k <= 0 || 2+n+k != len(b) {
		return fmt.Errorf("%w: generator state %x", ErrCorruptState, b)
	}
	g.seen, g.maxTs, g.emitted = b[1] == 1, maxTs, emitted
	return nil
}
