package state

import (
	"github.com/edgedio/edged/keygroup"
)

// Backend stores the keyed state of one subtask, organised by key group.
// The implementations are MemoryBackend and BoltBackend. Operators never
// call a backend directly: they create handles with the package functions
// (NewValue, NewList, ..., NewNamespacedValue, ...), which dispatch on the
// backend, register their timer queues (RegisterTimerQueue), and use Len
// and CleanupExpired; the runtime takes snapshots (Snapshot) and restores
// them (Restore). So a backend can be swapped by job configuration without
// touching operators.
//
// A backend and every handle made from it belong to one subtask and are
// used from that subtask's goroutine only.
type Backend interface {
	// KeyGroups returns the key groups the backend holds.
	KeyGroups() keygroup.Range
	// lookup returns the state registered under name, or nil.
	lookup(name string) stateTable
	// cleanupExpired implements CleanupExpired.
	cleanupExpired(maxEntries int) int
	// reg returns the backend's timer queues and pending restored state.
	reg() *registry
	// inUse reports whether state or timer queues are registered.
	inUse() bool
	// restoreGroup loads the states of the section of key group g.
	restoreGroup(g int, states []sectionState) error
}

// stateTable is one registered keyed state inside a backend.
type stateTable interface {
	// spec returns what the state was registered as.
	spec() *spec
	// len returns the number of entries (key and namespace pairs).
	len() int
}

// Len returns the number of entries, pairs of a key and a namespace with a
// value, in the keyed state named name of b, or 0 when b is nil or has no
// such state. For state without a namespace it is the number of keys with
// a value. Expired entries not yet removed are counted.
func Len(b Backend, name string) int {
	if isNilBackend(b) {
		return 0
	}
	t := b.lookup(name)
	if t == nil {
		return 0
	}
	return t.len()
}

// isNilBackend reports whether b is nil or a nil pointer.
func isNilBackend(b Backend) bool {
	switch b := b.(type) {
	case nil:
		return true
	case *MemoryBackend:
		return b == nil
	case *BoltBackend:
		return b == nil
	}
	return false
}
