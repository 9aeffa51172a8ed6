package state

// KeyContext carries the current key of a keyed operator. The operator sets
// it before each record (and before each timer it fires); every keyed state
// handle created with the context reads and writes the entries of that key.
// The zero value has no key: using a handle before the first Set panics.
//
// A KeyContext belongs to one subtask and is used from its goroutine only.
type KeyContext[K comparable] struct {
	key   K
	group int
	// gen counts calls to Set. Handles cache the entry of the current key
	// and trust the cache only while gen is unchanged.
	gen uint64
}

// Set makes k, of key group g, the current key.
func (c *KeyContext[K]) Set(k K, g int) {
	c.key, c.group = k, g
	c.gen++
}

// Key returns the current key.
func (c *KeyContext[K]) Key() K { return c.key }

// Group returns the current key's key group.
func (c *KeyContext[K]) Group() int { return c.group }
