package state

import (
	"errors"
	"fmt"
	"io"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/edgedio/edged/keygroup"
)

// KeyGroupOffsets says where each key group's section lies in a snapshot
// stream, so that a restore with another parallelism reads only the key
// groups it gets. Key groups without entries or timers have no section.
type KeyGroupOffsets map[int]Extent

// Extent is a run of bytes of a snapshot stream.
type Extent struct {
	// Offset is where the run starts, in bytes from the stream's start.
	Offset int64
	// Length is the run's length in bytes.
	Length int64
}

// KeyedSnapshot is a consistent view of a backend's keyed state and of the
// timer queues registered with it, taken by Snapshot. Writing it out
// (WriteTo) is the slow part of a checkpoint; it may run on another
// goroutine while the backend's owner goes on using the backend, since
// the view shares no mutable memory with it.
//
// WriteTo, Offsets and Release are called from one goroutine, not
// concurrently with each other.
type KeyedSnapshot struct {
	groups keygroup.Range
	// states holds every state and timer queue, in increasing order of
	// name.
	states []snapState
	// release frees what holds the view (a bolt read transaction); nil
	// once called.
	release func() error
	written bool
	offsets KeyGroupOffsets
}

// snapState is one state or timer queue of a snapshot.
type snapState struct {
	meta stateMeta
	src  recordSource
}

// recordSource yields the records of one state, key group by key group.
type recordSource interface {
	// records appends the records of key group g to w.
	records(g int, w *recordWriter) error
}

// rawSource is a recordSource of records already encoded, by key group.
type rawSource map[int]rawRecords

func (s rawSource) records(g int, w *recordWriter) error {
	r := s[g]
	w.data = append(w.data, r.data...)
	w.count += r.count
	return nil
}

// Snapshot takes a consistent view of the keyed state of b, and of the
// timer queues registered with it, for a checkpoint. It is the
// synchronous part of a checkpoint and is quick: the memory backend copies
// the slices of its entries (values with pointers, slices or maps in them,
// which the operator may still change in place, are encoded right away);
// the bolt backend commits its write buffer and opens a read transaction.
// State restored but not registered since is part of the snapshot as it
// was restored.
//
// It fails if a state's codec could not be compiled (the memory backend
// keeps such state, but cannot write it). Call it from the goroutine that
// owns b; then write the snapshot with WriteTo, or drop it with Release,
// from any one goroutine.
//
// A bolt snapshot holds a read transaction until then: pages the owner
// frees meanwhile are not reused (the file grows with the writes), and a
// commit that needs a memory map larger than the current one (see
// BoltOptions.InitialMmapSize) waits until the snapshot is written. So
// write it on another goroutine, or release it, and do not hold it on the
// owner's goroutine while writing: that commit would wait for ever.
func Snapshot(b Backend) (*KeyedSnapshot, error) {
	switch b := b.(type) {
	case *MemoryBackend:
		if b != nil {
			return b.snapshot(b.groups)
		}
	case *BoltBackend:
		if b != nil {
			return b.snapshot(b.groups)
		}
	}
	if isNilBackend(b) {
		return nil, ErrNoBackend
	}
	return nil, unsupportedBackend(b)
}

// newKeyedSnapshot returns a snapshot of states, sorted here by name.
func newKeyedSnapshot(groups keygroup.Range, states []snapState, release func() error) *KeyedSnapshot {
	slices.SortFunc(states, func(a, b snapState) int { return strings.Compare(a.meta.name, b.meta.name) })
	return &KeyedSnapshot{groups: groups, states: states, release: release}
}

// KeyGroups returns the key groups the snapshot covers.
func (s *KeyedSnapshot) KeyGroups() keygroup.Range { return s.groups }

// WriteTo writes the snapshot to w in the format Restore reads (see
// snapshot_format.go) and returns the number of bytes written; Offsets
// then says where each key group's section lies. It implements
// io.WriterTo. It releases the snapshot when done, even on error, and may
// be called once.
func (s *KeyedSnapshot) WriteTo(w io.Writer) (int64, error) {
	if s.written {
		return 0, errors.New("state: snapshot written twice")
	}
	s.written = true
	n, err := s.writeTo(w)
	if rerr := s.Release(); err == nil && rerr != nil {
		err = rerr
	}
	if err != nil {
		s.offsets = nil
	}
	return n, err
}

// snapshotYieldAfter is how long a snapshot's writer runs before it yields
// the processor to the goroutines waiting for it (see writeTo).
const snapshotYieldAfter = time.Millisecond

// Offsets returns where each key group's section lies in the stream
// WriteTo wrote, nil before WriteTo or after it failed.
func (s *KeyedSnapshot) Offsets() KeyGroupOffsets { return s.offsets }

func (s *KeyedSnapshot) writeTo(w io.Writer) (int64, error) {
	if s.release == nil {
		return 0, errors.New("state: snapshot already released")
	}
	off := int64(0)
	put := func(b []byte) error {
		n, err := w.Write(b)
		off += int64(n)
		if err != nil {
			return fmt.Errorf("state: writing snapshot: %w", err)
		}
		return nil
	}
	cat := make([]stateMeta, len(s.states))
	for i := range s.states {
		cat[i] = s.states[i].meta
	}
	if err := put(appendHeader(nil, s.groups, cat)); err != nil {
		return off, err
	}
	s.offsets = make(KeyGroupOffsets)
	var sec sectionWriter
	var recs recordWriter
	ran := time.Now() // since the writer last yielded
	for g := s.groups.Start; g < s.groups.End; g++ {
		sec.reset()
		for i := range s.states {
			st := &s.states[i]
			recs.reset()
			if err := st.src.records(g, &recs); err != nil {
				return off, fmt.Errorf("state: snapshot of state %q, key group %d: %w", st.meta.name, g, err)
			}
			if recs.count > 0 {
				sec.addState(i, &recs.rawRecords)
			}
		}
		if sec.nstates == 0 {
			continue
		}
		b := sec.finish(g)
		if len(b) > maxSectionLen {
			return off, fmt.Errorf("state: snapshot of key group %d is %d bytes, more than the %d a section may hold", g, len(b), maxSectionLen)
		}
		start := off
		if err := put(b); err != nil {
			return off, err
		}
		s.offsets[g] = Extent{Offset: start, Length: int64(len(b))}
		// Snapshots are written beside the tasks, which go on processing
		// (one writer per task and checkpoint). Without a yield, writers of
		// large states held the processors for whole scheduler quanta,
		// and a task that had a batch to handle waited behind them: the
		// subtasks a handover does not move stood still 33-71 ms during
		// its savepoint (100 MB of state, 2 CPUs), 24 and 30 ms with this
		// yield (BenchmarkRebalancePause, others-pause-ms). A yield after
		// every key group did as well there, but slowed the snapshots of
		// small states under CPU load, each yield waiting behind busy
		// goroutines.
		if time.Since(ran) >= snapshotYieldAfter {
			runtime.Gosched()
			ran = time.Now()
		}
	}
	return off, nil
}

// Release frees the snapshot without writing it (a bolt snapshot's read
// transaction keeps the pages it reads from being reused, and keeps the
// backend from growing its memory map past BoltOptions.InitialMmapSize).
// It is safe to call more than once.
func (s *KeyedSnapshot) Release() error {
	if s.release == nil {
		return nil
	}
	rel := s.release
	s.release = nil
	s.states = nil
	return rel()
}
