package snapshot

import (
	"fmt"
	"time"
)

// Status is where a checkpoint or savepoint stands.
type Status uint8

const (
	// InProgress means triggered, not yet acknowledged by every task or not yet
	// persisted.
	InProgress Status = iota + 1
	// Completed means the metadata is persisted; the snapshot can be restored.
	Completed
	// Failed means aborted (Stats.Err says why).
	Failed
)

// String returns "in_progress", "completed" or "failed".
func (s Status) String() string {
	switch s {
	case InProgress:
		return "in_progress"
	case Completed:
		return "completed"
	case Failed:
		return "failed"
	}
	return fmt.Sprintf("Status(%d)", uint8(s))
}

// HistorySize is how many checkpoints and savepoints History keeps: the
// most recently triggered ones.
const HistorySize = 100

// Stats describes one checkpoint or savepoint, for the REST API and the
// dashboard.
type Stats struct {
	Checkpoint ID
	Kind       Kind
	Status     Status
	// Stop marks a stop-with-savepoint.
	Stop bool
	// Triggered is when the coordinator triggered it.
	Triggered time.Time
	// Duration is from the trigger to completion or failure; 0 while in
	// progress.
	Duration time.Duration
	// Acked is how many of Tasks tasks have acknowledged.
	Acked, Tasks int
	// Size is the sum of the sizes of the acknowledged state files.
	Size int64
	// Alignment is the longest alignment time of any acknowledging task.
	Alignment time.Duration
	// Path is where the metadata was written, once completed.
	Path string
	// Err says why it failed.
	Err error
}

// history keeps the Stats of the last HistorySize snapshots, oldest first.
type history struct {
	entries []Stats
}

func (h *history) add(s Stats) {
	if len(h.entries) == HistorySize {
		copy(h.entries, h.entries[1:])
		h.entries = h.entries[:HistorySize-1]
	}
	h.entries = append(h.entries, s)
}

// get returns the entry of id, or nil if it has been dropped.
func (h *history) get(id ID) *Stats {
	for i := len(h.entries) - 1; i >= 0; i-- {
		if h.entries[i].Checkpoint == id {
			return &h.entries[i]
		}
	}
	return nil
}

func (h *history) list() []Stats {
	out := make([]Stats, len(h.entries))
	copy(out, h.entries)
	return out
}
