package state

import (
	"encoding/binary"
	"fmt"
	"maps"
	"slices"

	"github.com/edgedio/edged/codec"
	"github.com/edgedio/edged/keygroup"
)

// timerReg is a timer queue registered with a backend.
type timerReg interface {
	spec() *spec
	// capture encodes the queue's timers of the key groups in want, by
	// key group; it fails if the queue holds timers outside owned, the
	// backend's key groups.
	capture(owned, want keygroup.Range) (rawSource, error)
	// load registers the restored timers of p into the queue.
	load(p *pendingState) error
	// removeGroups removes the queue's timers of key groups r.
	removeGroups(r keygroup.Range)
}

// timerQueueReg is the registration of a TimerQueue[K, N].
type timerQueueReg[K, N comparable] struct {
	sp spec
	q  *TimerQueue[K, N]
	kc codec.Codec[K]
	nc codec.Codec[N]
}

func (r *timerQueueReg[K, N]) spec() *spec { return &r.sp }

// RegisterTimerQueue makes the timers of q part of b's snapshots, under
// name, in the sections of their key groups: timers are keyed state. Keys
// and namespaces are encoded with kc and nc (nil means codec.Compile of
// the type). If b was restored from a snapshot holding a queue of that
// name, its timers are registered into q, in the order they fire within
// each key group; the registration fails with ErrIncompatibleState if the
// snapshot's key or namespace type, or codecs, differ.
//
// An operator registers each of its queues once, when it opens, from the
// goroutine that owns b. It fails with ErrStateType if name is taken by
// another queue, and ErrDescriptor for an empty name or a nil queue.
func RegisterTimerQueue[K, N comparable](b Backend, name string, q *TimerQueue[K, N], kc codec.Codec[K], nc codec.Codec[N]) error {
	if isNilBackend(b) {
		return ErrNoBackend
	}
	if err := checkName(name); err != nil {
		return err
	}
	if q == nil {
		return fmt.Errorf("%w: timer queue %q is nil", ErrDescriptor, name)
	}
	sp := spec{
		name:  timerPrefix + name,
		kind:  kindTimers,
		types: fmt.Sprintf("timers keyed by %s in namespace %s", typeName[K](), typeName[N]()),
	}
	sp.sig = sp.types
	kc = defaultCodec(kc, &sp.codecs.err)
	nc = defaultCodec(nc, &sp.codecs.err)
	sp.codecs.key, sp.codecs.namespace = kc, nc
	if sp.codecs.err != nil {
		return fmt.Errorf("timer queue %q: %w", name, sp.codecs.err)
	}
	reg := b.reg()
	if old, ok := reg.timers[sp.name]; ok {
		if o, same := old.(*timerQueueReg[K, N]); same && o.q == q {
			return nil
		}
		return fmt.Errorf("%w: timer queue %q is registered already", ErrStateType, name)
	}
	p, err := reg.take(&sp)
	if err != nil {
		return err
	}
	r := &timerQueueReg[K, N]{sp: sp, q: q, kc: kc, nc: nc}
	if p != nil {
		if err := r.load(p); err != nil {
			reg.pending[sp.name] = p
			return err
		}
	}
	if reg.timers == nil {
		reg.timers = make(map[string]timerReg)
	}
	reg.timers[sp.name] = r
	return nil
}

func (r *timerQueueReg[K, N]) capture(owned, want keygroup.Range) (rawSource, error) {
	src := make(rawSource)
	var w recordWriter
	for _, g := range r.q.Groups() {
		if !owned.Contains(g) {
			return nil, fmt.Errorf("state: timer queue %q has timers of key group %d, outside %v", r.sp.name[len(timerPrefix):], g, owned)
		}
		if !want.Contains(g) {
			continue
		}
		w.data, w.count = nil, 0
		for _, t := range r.q.InGroup(g) {
			k, err := r.kc.Append(w.key[:0], t.Key)
			if err == nil {
				k, err = r.nc.Append(k, t.Namespace)
			}
			if err != nil {
				return nil, fmt.Errorf("state: timer queue %q: %w", r.sp.name[len(timerPrefix):], err)
			}
			w.key = k
			w.val = binary.BigEndian.AppendUint64(w.val[:0], uint64(t.Timestamp))
			w.add(k, w.val)
		}
		src[g] = w.rawRecords
	}
	return src, nil
}

func (r *timerQueueReg[K, N]) removeGroups(rg keygroup.Range) { r.q.removeGroups(rg) }

// load registers the restored timers of p into the queue; nothing if
// some fail to decode.
func (r *timerQueueReg[K, N]) load(p *pendingState) error {
	n := 0
	for _, recs := range p.groups {
		n += recs.count
	}
	ts := make([]Timer[K, N], 0, n)
	for _, g := range slices.Sorted(maps.Keys(p.groups)) {
		err := forEachRecord(p.groups[g], func(key, val []byte) error {
			k, n, err := r.kc.Decode(key)
			if err != nil {
				return fmt.Errorf("%w: timer key: %w", ErrCorruptSnapshot, err)
			}
			ns, err := decodeAll(r.nc, key[n:])
			if err != nil {
				return fmt.Errorf("timer namespace: %w", err)
			}
			if len(val) != 8 {
				return fmt.Errorf("%w: timestamp of %d bytes", ErrCorruptSnapshot, len(val))
			}
			ts = append(ts, Timer[K, N]{Timestamp: int64(binary.BigEndian.Uint64(val)), Key: k, Group: g, Namespace: ns})
			return nil
		})
		if err != nil {
			return fmt.Errorf("restore: timer queue %q, key group %d: %w", r.sp.name[len(timerPrefix):], g, err)
		}
	}
	r.q.registerAll(ts)
	return nil
}

// captureTimers encodes the timers of key groups want of every registered
// queue, as of now; owned are the backend's key groups.
func (reg *registry) captureTimers(owned, want keygroup.Range) ([]snapState, error) {
	var out []snapState
	for _, tr := range reg.timers {
		src, err := tr.capture(owned, want)
		if err != nil {
			return nil, err
		}
		out = append(out, snapState{meta: metaOf(tr.spec()), src: src})
	}
	return out, nil
}
