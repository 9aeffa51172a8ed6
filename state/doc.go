// Package state holds keyed state and its backends.
//
// Keyed state is scoped to the current key: the keyed operator sets the key
// (and its key group) on a KeyContext before it calls user code, and every
// state handle created from that context reads and writes the entry of that
// key. State is organised by key group so that snapshots, rescaling and
// moves between devices handle whole key groups.
//
// A Backend and the handles made from it belong to one subtask and are used
// from that subtask's goroutine only; they are not safe for concurrent use.
// The package knows no actors and no nodes.
package state
