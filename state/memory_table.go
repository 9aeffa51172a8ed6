package state

import (
	"fmt"
	"slices"

	"github.com/edgedio/edged/keygroup"
)

// nsKey is the key of an entry: the stream key and the namespace.
type nsKey[K, N comparable] struct {
	key K
	ns  N
}

// entry is one value of a memory table.
type entry[K, N comparable, T any] struct {
	k nsKey[K, N]
	// exp is when the entry expires, in Unix nanoseconds of the backend's
	// clock; 0 when the state has no TTL (or, for Map state, expires per
	// element).
	exp int64
	v   T
}

// memGroup holds the entries of one key group: a dense slice, so that
// cleanup can walk it with a resumable cursor, and a map from key to slot.
type memGroup[K, N comparable, T any] struct {
	index map[nsKey[K, N]]int
	slots []entry[K, N, T]
}

// memTable holds the entries of one keyed state of a memory backend, one
// memGroup per key group. T is what is stored per key and namespace: the
// value, the list, the map or the accumulator.
type memTable[K, N comparable, T any] struct {
	sp     spec
	groups keygroup.Range
	kg     []memGroup[K, N, T]
	// count is the number of entries in all groups.
	count int
	// epoch changes whenever an entry may have moved in memory: on every
	// removal (the last slot moves into the hole) and whenever a slot
	// slice is reallocated. Handles cache an entry pointer and trust it
	// only while epoch is unchanged.
	epoch uint64
	// sweep, if set, removes the expired parts of a value (Map elements)
	// and reports how many it removed and whether the value is now empty.
	// Without it an entry expires as a whole, by exp.
	sweep func(v *T, now int64) (removed int, empty bool)
	// ec encodes entries for snapshots and decodes restored ones.
	ec entryCodec[T]
}

func newMemTable[K, N comparable, T any](r keygroup.Range, s spec) *memTable[K, N, T] {
	return &memTable[K, N, T]{sp: s, groups: r, kg: make([]memGroup[K, N, T], max(r.Len(), 0))}
}

func (t *memTable[K, N, T]) spec() *spec { return &t.sp }

func (t *memTable[K, N, T]) groupCount() int { return len(t.kg) }

func (t *memTable[K, N, T]) len() int { return t.count }

func (t *memTable[K, N, T]) setGroups(r keygroup.Range) {
	kg := make([]memGroup[K, N, T], max(r.Len(), 0))
	for gi := range t.kg {
		g := t.groups.Start + gi
		if r.Contains(g) {
			kg[g-r.Start] = t.kg[gi]
		} else {
			t.count -= len(t.kg[gi].slots)
		}
	}
	t.kg, t.groups = kg, r
	// A handle's cached entry may be of a dropped key group: it must look
	// it up again (and find its key group gone).
	t.epoch++
}

// group returns key group g. It panics if g is outside the backend's
// range, which means the KeyContext was not set or the key was routed to
// the wrong subtask.
func (t *memTable[K, N, T]) group(g int) *memGroup[K, N, T] {
	i := g - t.groups.Start
	if uint(i) >= uint(len(t.kg)) {
		panic(fmt.Sprintf("state %q: key group %d outside the backend's key groups %v (KeyContext not set?)", t.sp.name, g, t.groups))
	}
	return &t.kg[i]
}

// find returns the entry of k in grp, or nil.
func (t *memTable[K, N, T]) find(grp *memGroup[K, N, T], k nsKey[K, N]) *entry[K, N, T] {
	i, ok := grp.index[k]
	if !ok {
		return nil
	}
	return &grp.slots[i]
}

// insert adds an entry for k, which must be absent from grp, holding the
// zero T, and returns it.
func (t *memTable[K, N, T]) insert(grp *memGroup[K, N, T], k nsKey[K, N]) *entry[K, N, T] {
	if grp.index == nil {
		grp.index = make(map[nsKey[K, N]]int)
	}
	if len(grp.slots) == cap(grp.slots) {
		t.epoch++
	}
	grp.slots = append(grp.slots, entry[K, N, T]{k: k})
	t.count++
	i := len(grp.slots) - 1
	grp.index[k] = i
	return &grp.slots[i]
}

// remove removes the entry of k from grp, if any.
func (t *memTable[K, N, T]) remove(grp *memGroup[K, N, T], k nsKey[K, N]) {
	if i, ok := grp.index[k]; ok {
		t.removeAt(grp, i)
	}
}

// removeAt removes the entry in slot i of grp: the last entry moves into
// the hole.
func (t *memTable[K, N, T]) removeAt(grp *memGroup[K, N, T], i int) {
	t.epoch++
	t.count--
	delete(grp.index, grp.slots[i].k)
	last := len(grp.slots) - 1
	if i != last {
		grp.slots[i] = grp.slots[last]
		grp.index[grp.slots[i].k] = i
	}
	grp.slots[last] = entry[K, N, T]{}
	grp.slots = grp.slots[:last]
	// Give memory back after a burst of removals.
	if c := cap(grp.slots); c > 64 && len(grp.slots) < c/4 {
		grp.slots = slices.Clip(slices.Clone(grp.slots))
	}
}

func (t *memTable[K, N, T]) expire(now int64, gi, from, budget int) (next, checked, removed int) {
	if gi >= len(t.kg) {
		return -1, 0, 0
	}
	grp := &t.kg[gi]
	i := from
	for i < len(grp.slots) && checked < budget {
		e := &grp.slots[i]
		checked++
		if t.sweep != nil {
			n, empty := t.sweep(&e.v, now)
			removed += n
			if empty {
				t.removeAt(grp, i)
				continue
			}
		} else if e.exp != 0 && now >= e.exp {
			t.removeAt(grp, i)
			removed++
			continue
		}
		i++
	}
	if i >= len(grp.slots) {
		return -1, checked, removed
	}
	return i, checked, removed
}
