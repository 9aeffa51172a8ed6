package state

import (
	"fmt"

	"github.com/jonboulle/clockwork"

	"github.com/edgedio/edged/keygroup"
)

// MemoryBackend keeps keyed state in Go maps, per state and per key group.
// It is the fastest backend; its snapshot is a copy (see Snapshot). It
// encodes nothing per record, so it also holds state whose types have no
// codec (snapshots of such state fail).
//
// Not safe for concurrent use: the subtask that owns it uses it, and every
// handle made from it, from its own goroutine.
type MemoryBackend struct {
	groups keygroup.Range
	clock  clockwork.Clock
	// tables holds every registered state by name.
	tables map[string]memState
	// ttl lists the states that have a TTL, in registration order; cursor
	// is where CleanupExpired resumes among them.
	ttl    []memState
	cursor cleanupCursor
	// registry holds the timer queues and the restored state not yet
	// registered.
	registry registry
	// needCodecs refuses a state without codecs when it is registered
	// (RequireCodecs).
	needCodecs bool
}

// memState is a state table of the memory backend.
type memState interface {
	stateTable
	// groupCount returns the number of key groups of the table.
	groupCount() int
	// expire checks the entries of the gi-th key group from slot from on,
	// at most budget of them, and removes the expired ones. It returns the
	// slot to resume from, or -1 when it reached the end of the group, the
	// number of entries checked and the number of values removed.
	expire(now int64, gi, from, budget int) (next, checked, removed int)
	// capture returns the table's entries of the key groups in want as
	// they are now, sharing no memory that the table or the operator may
	// still write.
	capture(want keygroup.Range) (recordSource, error)
	// load decodes the restored records of p into the table.
	load(p *pendingState) error
	// setGroups makes r the table's key groups: it drops the entries of
	// the key groups outside r and adds empty ones for those new in r.
	setGroups(r keygroup.Range)
}

// cleanupCursor is a position among the entries of the TTL states.
type cleanupCursor struct {
	table, group, slot int
}

// NewMemoryBackend returns an empty memory backend for key groups r. TTLs
// are measured on clock; nil means the real clock.
func NewMemoryBackend(r keygroup.Range, clock clockwork.Clock) *MemoryBackend {
	if clock == nil {
		clock = clockwork.NewRealClock()
	}
	return &MemoryBackend{groups: r, clock: clock, tables: make(map[string]memState)}
}

// RequireCodecs makes b refuse, when it is created, a state whose key,
// namespace or value type has no codec, as the bolt backend does. The
// runtime calls it, before any state is created, for a job that takes
// snapshots (it has a checkpoint directory): such a state could not be in
// a single one, and the job would otherwise run until its first snapshot
// fails. Without it the memory backend keeps values without encoding them.
func (b *MemoryBackend) RequireCodecs() { b.needCodecs = true }

// KeyGroups returns the key groups b holds.
func (b *MemoryBackend) KeyGroups() keygroup.Range { return b.groups }

func (b *MemoryBackend) lookup(name string) stateTable {
	if t, ok := b.tables[name]; ok {
		return t
	}
	return nil
}

// memTableFor returns the table registered under s.name, registering a new
// one, encoded in snapshots by ec, when there is none. init, if not nil,
// prepares a new table. A new table takes over the state restored under
// its name, if any.
func memTableFor[K, N comparable, T any](b *MemoryBackend, s spec, ec entryCodec[T], init func(*memTable[K, N, T])) (*memTable[K, N, T], error) {
	if old, ok := b.tables[s.name]; ok {
		t, ok := old.(*memTable[K, N, T])
		if !ok || t.sp.kind != s.kind || t.sp.sig != s.sig {
			return nil, fmt.Errorf("%w: %q is a %s, not a %s", ErrStateType, s.name, old.spec().sig, s.sig)
		}
		if t.sp.ttl != s.ttl {
			return nil, fmt.Errorf("%w: %q has TTL %+v, not %+v", ErrStateType, s.name, t.sp.ttl, s.ttl)
		}
		return t, nil
	}
	if b.needCodecs && s.codecs.err != nil {
		return nil, fmt.Errorf("state %q: its snapshots need codecs: %w", s.name, s.codecs.err)
	}
	t := newMemTable[K, N, T](b.groups, s)
	t.ec = ec
	if init != nil {
		init(t)
	}
	p, err := b.registry.take(&s)
	if err != nil {
		return nil, err
	}
	if p != nil {
		if err := t.load(p); err != nil {
			// The registration failed: keep the state for another try.
			b.registry.pending[s.name] = p
			return nil, err
		}
	}
	b.tables[s.name] = t
	if s.ttl.TTL > 0 {
		b.ttl = append(b.ttl, t)
	}
	return t, nil
}

func (b *MemoryBackend) reg() *registry { return &b.registry }

func (b *MemoryBackend) inUse() bool { return len(b.tables) > 0 || len(b.registry.timers) > 0 }

func (b *MemoryBackend) restoreGroup(g int, states []sectionState) error {
	for _, st := range states {
		if err := b.registry.addRecords(st.meta, g, st.records); err != nil {
			return err
		}
	}
	return nil
}

func (b *MemoryBackend) cleanupExpired(maxEntries int) int {
	n := b.groups.Len()
	total := 0
	for _, t := range b.ttl {
		total += t.len()
	}
	if total == 0 || n <= 0 {
		return 0
	}
	// Checking no more entries than there are means no entry is checked
	// twice: the cursor would have to go all the way round.
	budget := min(maxEntries, total)
	now := b.clock.Now().UnixNano()
	c := &b.cursor
	removed := 0
	for budget > 0 {
		if c.table >= len(b.ttl) {
			c.table = 0
		}
		next, checked, rm := b.ttl[c.table].expire(now, c.group, c.slot, budget)
		budget -= checked
		removed += rm
		if next >= 0 {
			c.slot = next
			continue
		}
		c.slot = 0
		if c.group++; c.group >= n {
			c.group = 0
			c.table++
		}
	}
	return removed
}

// unsupportedBackend is the error of a constructor given a backend it has
// no handles for.
func unsupportedBackend(b Backend) error {
	return fmt.Errorf("state: unsupported backend %T", b)
}
