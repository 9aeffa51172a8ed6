package state

// Len returns the number of states in s: registered, or restored and not
// registered since. SnapshotOperator writes both, so a store with Len 0
// has nothing to snapshot. Called in Open before any state is registered,
// it tells a restored subtask (Len above 0, also for a subtask whose share
// of a list is empty because there are more new subtasks than elements)
// from a first start (Len 0), as Flink's isRestored does: a source that
// keeps its splits in list state assigns itself splits only on a first
// start, never after a restore, where the splits it gets are all it owns.
func (s *OperatorStore) Len() int { return len(s.states) + len(s.pending) }
