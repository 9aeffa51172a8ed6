package state

// Len returns the number of states in s: registered, or restored and not
// registered since. SnapshotOperator writes both, so a store with Len 0
// has nothing to snapshot.
func (s *OperatorStore) Len() int { return len(s.states) + len(s.pending) }
