package operators

// WriteAheadClosing reports whether Close told s's background publisher
// to stop.
func WriteAheadClosing[T any](s *WriteAheadSink[T]) bool { return s.q != nil && s.q.closed() }
