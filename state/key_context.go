package state

import "fmt"

// KeyContext carries the current key of a keyed operator. The operator sets
// it before each record (and before each timer it fires); every keyed state
// handle created with the context reads and writes the entries of that key.
// The zero value has no key: using a handle before the first Set (or
// after Unset) panics with ErrNoCurrentKey.
//
// A KeyContext belongs to one subtask and is used from its goroutine only.
type KeyContext[K comparable] struct {
	key   K
	group int
	// has reports that a key is current: Set was called, and Unset not
	// since.
	has bool
	// gen counts calls to Set and Unset. Handles cache the entry of the
	// current key and trust the cache only while gen is unchanged.
	gen uint64
}

// Set makes k, of key group g, the current key.
func (c *KeyContext[K]) Set(k K, g int) {
	c.key, c.group, c.has = k, g, true
	c.gen++
}

// Unset leaves the context without a current key, as before the first
// Set: a handle used then panics with ErrNoCurrentKey. An operator calls
// it before user code that runs for no key (a broadcast record), so that
// the code cannot read or write the state of the key it processed last.
func (c *KeyContext[K]) Unset() {
	var zero K
	c.key, c.group, c.has = zero, 0, false
	c.gen++
}

// Key returns the current key.
func (c *KeyContext[K]) Key() K { return c.key }

// Group returns the current key's key group.
func (c *KeyContext[K]) Group() int { return c.group }

// noCurrentKey is the panic value of state name's handle used before its
// KeyContext had a key.
func noCurrentKey(name string) error {
	return fmt.Errorf("state %q: %w: keyed state belongs to the key of the record or timer being processed; use it in ProcessElement and OnTimer, not in Open or ProcessBroadcastElement", name, ErrNoCurrentKey)
}
