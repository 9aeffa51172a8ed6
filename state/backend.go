package state

import (
	"fmt"

	"github.com/edgedio/edged/keygroup"
)

// Backend stores the keyed state of one subtask, organised by key group.
type Backend interface {
	// KeyGroups returns the key groups this backend holds.
	KeyGroups() keygroup.Range
	// table returns the table registered under name, creating it with mk
	// on first use.
	table(name string, mk func() table) (table, error)
}

// table is one named piece of keyed state inside a backend.
type table interface {
	// clearGroup drops every entry of key group g.
	clearGroup(g int)
	// len returns the number of keys with an entry.
	len() int
}

// KeyContext carries the current key of a keyed operator. The operator sets
// it before each record; state handles read it.
type KeyContext[K comparable] struct {
	key   K
	group int
	set   bool
}

// Set makes k, of key group g, the current key.
func (c *KeyContext[K]) Set(k K, g int) {
	c.key, c.group, c.set = k, g, true
}

// Key returns the current key.
func (c *KeyContext[K]) Key() K { return c.key }

// Group returns the current key's key group.
func (c *KeyContext[K]) Group() int { return c.group }

// MemoryBackend keeps state in Go maps, one per key group per state. It is
// the fastest backend; its snapshot is a copy.
type MemoryBackend struct {
	groups keygroup.Range
	tables map[string]table
}

// NewMemoryBackend returns an empty memory backend for key groups r.
func NewMemoryBackend(r keygroup.Range) *MemoryBackend {
	return &MemoryBackend{groups: r, tables: make(map[string]table)}
}

// KeyGroups returns the key groups b holds.
func (b *MemoryBackend) KeyGroups() keygroup.Range { return b.groups }

func (b *MemoryBackend) table(name string, mk func() table) (table, error) {
	if t, ok := b.tables[name]; ok {
		return t, nil
	}
	t := mk()
	b.tables[name] = t
	return t, nil
}

// memTable holds the entries of one state, one map per key group.
type memTable[K comparable, V any] struct {
	first  int
	groups []map[K]V
}

func newMemTable[K comparable, V any](r keygroup.Range) *memTable[K, V] {
	t := &memTable[K, V]{first: r.Start, groups: make([]map[K]V, r.Len())}
	for i := range t.groups {
		t.groups[i] = make(map[K]V)
	}
	return t
}

func (t *memTable[K, V]) group(g int) map[K]V {
	return t.groups[g-t.first]
}

func (t *memTable[K, V]) clearGroup(g int) { clear(t.group(g)) }

func (t *memTable[K, V]) len() int {
	n := 0
	for _, m := range t.groups {
		n += len(m)
	}
	return n
}

// Len returns the number of keys that have an entry in the state named
// name, or 0 when there is no such state.
func Len(b Backend, name string) int {
	t, err := b.table(name, func() table { return nil })
	if err != nil || t == nil {
		return 0
	}
	return t.len()
}

// memTableOf returns the typed memory table behind name in b.
func memTableOf[K comparable, V any](b Backend, name string) (*memTable[K, V], error) {
	t, err := b.table(name, func() table { return newMemTable[K, V](b.KeyGroups()) })
	if err != nil {
		return nil, err
	}
	mt, ok := t.(*memTable[K, V])
	if !ok {
		return nil, fmt.Errorf("%w: %q is registered as %T", ErrStateType, name, t)
	}
	return mt, nil
}
