package state

import (
	"fmt"
	"io"
	"maps"
	"slices"

	"github.com/edgedio/edged/keygroup"
)

// registry is what both backends keep for snapshots and restores besides
// their tables: the registered timer queues, and the restored state that
// no handle has registered yet.
type registry struct {
	// timers holds the registered timer queues by snapshot name
	// (timerPrefix + queue name).
	timers map[string]timerReg
	// pending holds the restored states (and timer queues) not registered
	// since, by snapshot name. Their records are decoded when they are
	// registered, with the codecs of the registration.
	pending map[string]*pendingState
	// restored holds the key groups restored so far.
	restored map[int]bool
}

// pendingState is a restored state awaiting its registration.
type pendingState struct {
	meta stateMeta
	// groups holds its records by key group; a bolt backend keeps the
	// records of its keyed states in their buckets instead.
	groups map[int]rawRecords
}

// add records meta for a restored state, checking it against what an
// earlier section said about the same name, and returns the entry.
func (r *registry) add(m stateMeta) (*pendingState, error) {
	if r.pending == nil {
		r.pending = make(map[string]*pendingState)
	}
	p := r.pending[m.name]
	if p == nil {
		p = &pendingState{meta: m}
		r.pending[m.name] = p
		return p, nil
	}
	merged, err := mergeSections(p.meta, m)
	if err != nil {
		return nil, err
	}
	p.meta = merged
	return p, nil
}

// mergeSections is mergeMeta of two sections of one state, failing with
// ErrCorruptSnapshot when they disagree.
func mergeSections(a, b stateMeta) (stateMeta, error) {
	merged, ok := mergeMeta(a, b)
	if !ok {
		return a, fmt.Errorf("%w: state %q is %s of %s (codecs %s) in one key group, %s of %s (codecs %s) in another",
			ErrCorruptSnapshot, b.name, a.kind, a.types, a.codecs, b.kind, b.types, b.codecs)
	}
	return merged, nil
}

// mergeMeta returns what the sections of one state that say a and b say
// together, false if they disagree. They agree when they are equal, and
// when they differ only in that one records the layouts of its types and
// the other records none (splitLayouts): a job restored from a snapshot
// written before layouts were recorded writes a state with layouts in the
// subtasks that registered it, and without in those that carried it as
// restored; both hold records of the same codecs. The one with layouts is
// returned, so that its registration is checked against them.
func mergeMeta(a, b stateMeta) (stateMeta, bool) {
	if a == b {
		return a, true
	}
	an, al := splitLayouts(a.codecs)
	bn, bl := splitLayouts(b.codecs)
	if al != "" && bl != "" {
		return a, false
	}
	withLayouts := a
	if al == "" {
		withLayouts = b
	}
	a.codecs, b.codecs = an, bn
	if a != b {
		return a, false
	}
	return withLayouts, true
}

// addRecords keeps the records of a restored state in key group g.
func (r *registry) addRecords(m stateMeta, g int, recs rawRecords) error {
	p, err := r.add(m)
	if err != nil {
		return err
	}
	if p.groups == nil {
		p.groups = make(map[int]rawRecords)
	}
	p.groups[g] = recs
	return nil
}

// take removes and returns the pending state of s's name, after checking
// that s can take it over; it returns nil when nothing of that name was
// restored.
func (r *registry) take(s *spec) (*pendingState, error) {
	p := r.pending[s.name]
	if p == nil {
		return nil, nil
	}
	if err := checkRestored(&p.meta, s); err != nil {
		return nil, err
	}
	if s.codecs.err != nil {
		return nil, fmt.Errorf("restore: state %q: %w", s.name, s.codecs.err)
	}
	delete(r.pending, s.name)
	return p, nil
}

// pendingStates returns the pending states, by name.
func (r *registry) pendingStates() []*pendingState {
	names := slices.Sorted(maps.Keys(r.pending))
	out := make([]*pendingState, len(names))
	for i, n := range names {
		out[i] = r.pending[n]
	}
	return out
}

// checkRestored reports whether state registered as s may take over the
// restored state m.
func checkRestored(m *stateMeta, s *spec) error {
	if m.kind != s.kind || m.types != s.types {
		return fmt.Errorf("restore: state %q was %s of %s, now %s of %s: %w", s.name, m.kind, m.types, s.kind, s.types, ErrIncompatibleState)
	}
	if ttl := s.ttl.TTL > 0; m.ttl != ttl {
		return fmt.Errorf("restore: state %q had a TTL: %v, now %v: %w", s.name, m.ttl, ttl, ErrIncompatibleState)
	}
	if c := s.codecNames(); m.codecs != c {
		oldNames, oldLayouts := splitLayouts(m.codecs)
		names, layouts := splitLayouts(c)
		switch {
		case oldNames != names:
			return fmt.Errorf("restore: state %q was encoded with codecs %s, now %s: %w", s.name, oldNames, names, ErrIncompatibleState)
		case oldLayouts == "":
			// A snapshot written before layouts were recorded: the
			// codecs are all it can be checked by.
		default:
			return fmt.Errorf("restore: state %q was stored with the type layout %s, now %s: "+
				"the encoding is the fields end to end, and the old bytes cannot be read as the new type (keep the old type for this state, "+
				"or give the new one another state name): %w", s.name, oldLayouts, layouts, ErrIncompatibleState)
		}
	}
	return nil
}

// Restore loads the key groups of the snapshot stream r (as written by
// KeyedSnapshot.WriteTo, with the offsets KeyedSnapshot.Offsets returned)
// that are both in groups and in b's key groups into b. Key groups absent from offsets
// have no entries. A job restored with another parallelism calls Restore
// once for each old subtask whose key groups overlap b's (see
// KeyedRestoreSources), each time with b's key groups.
//
// Restore must come before any state or timer queue is registered with b,
// and restores each key group at most once; otherwise it fails with
// ErrRestoreAfterRegister. Restored state stays encoded until a handle
// registers it (NewValue, ..., RegisterTimerQueue): that registration
// decodes it with its own codecs, and fails with ErrIncompatibleState if
// its kind, types, TTL (on or off) or codecs differ from the snapshot's.
// Entries keep their expiry times. State nobody registers is carried into
// later snapshots as it is.
//
// It returns an error wrapping ErrCorruptSnapshot for a stream that is not
// a snapshot, fails a checksum, or ends early, and ErrSnapshotVersion for
// one of an unknown version. A failed Restore may have loaded some key
// groups: discard b. Call it from the goroutine that owns b.
func Restore(b Backend, r io.ReaderAt, offsets KeyGroupOffsets, groups keygroup.Range) error {
	if isNilBackend(b) {
		return ErrNoBackend
	}
	if b.inUse() {
		return fmt.Errorf("%w: state or timer queues are registered", ErrRestoreAfterRegister)
	}
	hdr, err := readHeader(r)
	if err != nil {
		return err
	}
	mine := b.KeyGroups()
	reg := b.reg()
	var want []int
	for g := range offsets {
		if groups.Contains(g) && mine.Contains(g) {
			if reg.restored[g] {
				return fmt.Errorf("%w: key group %d restored twice", ErrRestoreAfterRegister, g)
			}
			want = append(want, g)
		}
	}
	slices.Sort(want)
	for _, g := range want {
		states, err := readSection(r, hdr, g, offsets[g])
		if err != nil {
			return err
		}
		if err := b.restoreGroup(g, states); err != nil {
			return err
		}
		if reg.restored == nil {
			reg.restored = make(map[int]bool)
		}
		reg.restored[g] = true
	}
	return nil
}

// readSection reads and checks the section of key group g, which lies at
// ext in the stream r of header hdr, and returns its states.
func readSection(r io.ReaderAt, hdr *header, g int, ext Extent) ([]sectionState, error) {
	if ext.Offset < hdr.len || ext.Length < sectionHeadLen+sectionTailLen || ext.Length > maxSectionLen {
		return nil, fmt.Errorf("%w: key group %d at %+v", ErrCorruptSnapshot, g, ext)
	}
	sec, err := readRun(r, nil, ext.Offset, ext.Length)
	if err != nil {
		return nil, fmt.Errorf("key group %d: %w", g, err)
	}
	return parseSection(sec, g, hdr.cat)
}
