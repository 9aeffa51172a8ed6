package state

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"maps"
	"slices"

	bolt "go.etcd.io/bbolt"

	"github.com/edgedio/edged/keygroup"
)

// A running task can give key groups away and take key groups over
// without a restart: RemoveKeyGroups writes what its backend holds in some
// key groups as a snapshot stream and drops them; AddKeyGroups loads such
// a stream into another running backend, next to the key groups it holds.
// The handles an operator made stay valid in both; the key groups a
// backend holds stay one range.

// RemoveKeyGroups takes key groups r out of the running backend b. It
// writes what b holds in them to w as a snapshot stream, in the format
// KeyedSnapshot.WriteTo writes (AddKeyGroups and Restore read it): the
// entries of every state, the timers of every registered timer queue and
// the restored state nobody registered. Then it drops them: b holds the
// rest of its key groups (KeyGroups), and its handles and timer queues
// see nothing of r. It returns where each key group's section lies in
// what it wrote.
//
// r must lie at one end of b's key groups, so that the rest is one range;
// it may be all of them. Otherwise it fails with ErrKeyGroups. When the
// snapshot cannot be taken or written, it fails and b is as it was. Call
// it from the goroutine that owns b.
func RemoveKeyGroups(b Backend, r keygroup.Range, w io.Writer) (KeyGroupOffsets, error) {
	if isNilBackend(b) {
		return nil, ErrNoBackend
	}
	own := b.KeyGroups()
	rest, err := remainder(own, r)
	if err != nil {
		return nil, err
	}
	var s *KeyedSnapshot
	switch b := b.(type) {
	case *MemoryBackend:
		s, err = b.snapshot(r)
	case *BoltBackend:
		s, err = b.snapshot(r)
	default:
		err = unsupportedBackend(b)
	}
	if err != nil {
		return nil, err
	}
	if _, err := s.WriteTo(w); err != nil {
		return nil, err
	}
	offs := s.Offsets()
	if err := dropGroups(b, r, rest); err != nil {
		return nil, err
	}
	return offs, nil
}

// remainder returns what is left of the key groups own once r is taken
// out of them.
func remainder(own, r keygroup.Range) (keygroup.Range, error) {
	switch {
	case r.Len() <= 0 || r.Start < own.Start || r.End > own.End:
		return own, fmt.Errorf("%w: %v is not within the backend's %v", ErrKeyGroups, r, own)
	case r.Start == own.Start:
		return keygroup.Range{Start: r.End, End: own.End}, nil
	case r.End == own.End:
		return keygroup.Range{Start: own.Start, End: r.Start}, nil
	}
	return own, fmt.Errorf("%w: %v is inside the backend's %v, at neither end", ErrKeyGroups, r, own)
}

// union returns the key groups own and r together.
func union(own, r keygroup.Range) (keygroup.Range, error) {
	switch {
	case r.Len() <= 0 || r.Start < 0 || r.End > keygroup.MaxMaxParallelism:
		return own, fmt.Errorf("%w: %v is no range of key groups", ErrKeyGroups, r)
	case own.Len() <= 0:
		return r, nil
	case r.End == own.Start:
		return keygroup.Range{Start: r.Start, End: own.End}, nil
	case r.Start == own.End:
		return keygroup.Range{Start: own.Start, End: r.End}, nil
	}
	return own, fmt.Errorf("%w: %v is not next to the backend's %v", ErrKeyGroups, r, own)
}

// dropGroups drops key groups r from b, whose key groups are rest then.
func dropGroups(b Backend, r, rest keygroup.Range) error {
	switch b := b.(type) {
	case *MemoryBackend:
		b.setGroups(rest)
	case *BoltBackend:
		if err := b.deleteGroups(r); err != nil {
			return err
		}
		b.groups = rest
	}
	b.reg().dropGroups(r)
	return nil
}

// setGroups makes r the key groups of the memory backend b: the entries
// of those it leaves are dropped, those new in r start empty.
func (b *MemoryBackend) setGroups(r keygroup.Range) {
	for _, t := range b.tables {
		t.setGroups(r)
	}
	b.groups = r
	b.cursor = cleanupCursor{}
}

// dropGroups forgets the timers and the restored records of key groups r.
func (reg *registry) dropGroups(r keygroup.Range) {
	for _, tr := range reg.timers {
		tr.removeGroups(r)
	}
	for name, p := range reg.pending {
		if p.groups == nil {
			continue // a bolt backend's keyed state: in its bucket
		}
		for g := range p.groups {
			if r.Contains(g) {
				delete(p.groups, g)
			}
		}
		if len(p.groups) == 0 {
			delete(reg.pending, name)
		}
	}
	for g := range reg.restored {
		if r.Contains(g) {
			delete(reg.restored, g)
		}
	}
}

// deleteGroups commits the buffer, then deletes every entry of key groups
// r from the buckets of the keyed states, registered or restored.
func (b *BoltBackend) deleteGroups(r keygroup.Range) error {
	if b.closed {
		return ErrClosed
	}
	if err := b.flush(); err != nil {
		return err
	}
	b.closeRead()
	buckets := make([][]byte, 0, len(b.tables))
	for _, t := range b.tables {
		buckets = append(buckets, t.bucket)
	}
	for _, p := range b.registry.pendingStates() {
		if p.meta.kind != kindTimers {
			buckets = append(buckets, []byte(bucketPrefix+p.meta.name))
		}
	}
	start := binary.BigEndian.AppendUint16(nil, uint16(r.Start))
	err := b.db.Update(func(tx *bolt.Tx) error {
		for _, name := range buckets {
			bk := tx.Bucket(name)
			if bk == nil {
				continue
			}
			c := bk.Cursor()
			// Seek again after every Delete: a cursor's Next after a
			// Delete may skip a key.
			for k, _ := c.Seek(start); k != nil && len(k) >= 2 && int(binary.BigEndian.Uint16(k)) < r.End; k, _ = c.Seek(k) {
				k = bytes.Clone(k)
				if err := c.Delete(); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		err = fmt.Errorf("state: removing key groups %v from %s: %w", r, b.path, err)
		b.fail(err)
		return err
	}
	return nil
}

// addedGroup is a key group AddKeyGroups loads, and its states.
type addedGroup struct {
	g      int
	states []sectionState
}

// AddKeyGroups extends the running backend b by key groups r, which must
// be next to b's own (r ends where b's start, or starts where they end;
// any r when b holds none), and loads what the snapshot stream src holds
// in them: offsets says where each key group's section lies, and key
// groups absent from it hold nothing. The stream is one RemoveKeyGroups
// or KeyedSnapshot.WriteTo wrote; only its sections of r are read.
//
// A state or timer queue registered with b takes its records at once,
// decoded with the codecs of its registration: the operator's handles and
// queues see the new key groups' entries and timers as soon as it
// returns. State nobody registered waits for its registration, as after
// Restore, and is carried into snapshots until then.
//
// It fails with ErrKeyGroups for r not next to b's key groups, with
// ErrIncompatibleState when the stream holds a registered state or timer
// queue of another kind, types, TTL or codecs than its registration, and
// with ErrCorruptSnapshot for a damaged stream; on any error b holds what
// it held before. Call it from the goroutine that owns b.
func AddKeyGroups(b Backend, r keygroup.Range, src io.ReaderAt, offsets KeyGroupOffsets) error {
	if isNilBackend(b) {
		return ErrNoBackend
	}
	own := b.KeyGroups()
	grown, err := union(own, r)
	if err != nil {
		return err
	}
	hdr, err := readHeader(src)
	if err != nil {
		return err
	}
	var added []addedGroup
	for _, g := range slices.Sorted(maps.Keys(offsets)) {
		if !r.Contains(g) {
			continue
		}
		states, err := readSection(src, hdr, g, offsets[g])
		if err != nil {
			return err
		}
		added = append(added, addedGroup{g: g, states: states})
	}
	if err := checkAdded(b, added); err != nil {
		return err
	}
	switch b := b.(type) {
	case *MemoryBackend:
		b.setGroups(grown)
	case *BoltBackend:
		if err := b.putGroups(grown, added); err != nil {
			return err
		}
	default:
		return unsupportedBackend(b)
	}
	if err := loadAdded(b, added); err != nil {
		if derr := dropGroups(b, r, own); derr != nil {
			return fmt.Errorf("%w (and removing the key groups again: %w)", err, derr)
		}
		return err
	}
	reg := b.reg()
	if reg.restored == nil {
		reg.restored = make(map[int]bool)
	}
	for _, a := range added {
		reg.restored[a.g] = true
	}
	return nil
}

// registered returns the spec of the state or timer queue registered with
// b under the snapshot name name, nil if there is none.
func registered(b Backend, name string) *spec {
	if tr := b.reg().timers[name]; tr != nil {
		return tr.spec()
	}
	if t := b.lookup(name); t != nil {
		return t.spec()
	}
	return nil
}

// checkAdded reports whether the states of added can be loaded into b: a
// registered state must be able to take its records, and the sections of
// a state nobody registered must agree with each other and with what b
// keeps of it already.
func checkAdded(b Backend, added []addedGroup) error {
	reg := b.reg()
	metas := make(map[string]stateMeta)
	for _, p := range reg.pending {
		metas[p.meta.name] = p.meta
	}
	for _, a := range added {
		for _, st := range a.states {
			m := st.meta
			if sp := registered(b, m.name); sp != nil {
				if err := checkRestored(&m, sp); err != nil {
					return err
				}
				if sp.codecs.err != nil {
					return fmt.Errorf("restore: state %q: %w", sp.name, sp.codecs.err)
				}
				continue
			}
			if prev, ok := metas[m.name]; ok {
				var err error
				if m, err = mergeSections(prev, m); err != nil {
					return err
				}
			}
			metas[m.name] = m
		}
	}
	return nil
}

// putGroups extends the bolt backend b to key groups grown and writes the
// records of the keyed states of added into their buckets, after
// checking those of registered states as their registration checked the
// restored ones. On error b holds what it held before.
func (b *BoltBackend) putGroups(grown keygroup.Range, added []addedGroup) error {
	if b.closed {
		return ErrClosed
	}
	if err := b.flush(); err != nil {
		return err
	}
	b.closeRead()
	own := b.groups
	b.groups = grown // the checks accept keys of grown
	for _, a := range added {
		for _, st := range a.states {
			t := b.tables[st.meta.name]
			if st.meta.kind == kindTimers || t == nil || t.accept == nil {
				continue
			}
			err := forEachRecord(st.records, func(key, val []byte) error {
				return t.accept(groupKey(a.g, key), val)
			})
			if err != nil {
				b.groups = own
				return fmt.Errorf("restore: state %q, key group %d: %w", st.meta.name, a.g, err)
			}
		}
	}
	err := b.db.Update(func(tx *bolt.Tx) error {
		for _, a := range added {
			for _, st := range a.states {
				if st.meta.kind == kindTimers {
					continue
				}
				if err := putSection(tx, a.g, st); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		b.groups = own
		return fmt.Errorf("state: adding key groups to %s: %w", b.path, err)
	}
	return nil
}

// loadAdded hands the states of added, which b holds the key groups of
// now, to their registrations, or keeps them for later ones. A bolt
// backend has written the records of its keyed states already.
func loadAdded(b Backend, added []addedGroup) error {
	reg := b.reg()
	_, isBolt := b.(*BoltBackend)
	for _, a := range added {
		for _, st := range a.states {
			one := &pendingState{meta: st.meta, groups: map[int]rawRecords{a.g: st.records}}
			if tr := reg.timers[st.meta.name]; tr != nil {
				if err := tr.load(one); err != nil {
					return err
				}
				continue
			}
			if st.meta.kind != kindTimers {
				if t, ok := b.lookup(st.meta.name).(memState); ok {
					if err := t.load(one); err != nil {
						return err
					}
					continue
				}
				if isBolt {
					// Its records are in its bucket: a registered state
					// reads them there, another waits for its registration.
					if b.lookup(st.meta.name) == nil {
						if _, err := reg.add(st.meta); err != nil {
							return err
						}
					}
					continue
				}
			}
			if err := reg.addRecords(st.meta, a.g, st.records); err != nil {
				return err
			}
		}
	}
	return nil
}
