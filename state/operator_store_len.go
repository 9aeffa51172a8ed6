package state

// Len returns the number of states registered in s.
func (s *OperatorStore) Len() int { return len(s.states) }
