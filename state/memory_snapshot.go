package state

import (
	"encoding/binary"
	"fmt"
	"maps"
	"slices"

	"github.com/edgedio/edged/codec"
	"github.com/edgedio/edged/keygroup"
)

// snapshot implements Snapshot for the memory backend, of the key groups
// in want (b's, or some of them): every table's entries are copied now,
// key group by key group, and encoded by WriteTo.
func (b *MemoryBackend) snapshot(want keygroup.Range) (*KeyedSnapshot, error) {
	var states []snapState
	for name, t := range b.tables {
		sp := t.spec()
		if sp.codecs.err != nil {
			return nil, fmt.Errorf("state: snapshot of state %q: %w", name, sp.codecs.err)
		}
		src, err := t.capture(want)
		if err != nil {
			return nil, fmt.Errorf("state: snapshot of state %q: %w", name, err)
		}
		states = append(states, snapState{meta: metaOf(sp), src: src})
	}
	timers, err := b.registry.captureTimers(b.groups, want)
	if err != nil {
		return nil, err
	}
	states = append(states, timers...)
	for _, p := range b.registry.pendingStates() {
		states = append(states, snapState{meta: p.meta, src: rawSource(p.groups)})
	}
	return newKeyedSnapshot(want, states, func() error { return nil }), nil
}

// memCapture is a memory table's entries as they were when a snapshot was
// taken: per key group, either copies of the entries (when copies share
// nothing mutable) or their records, encoded at once.
type memCapture[K, N comparable, T any] struct {
	kc    codec.Codec[K]
	nc    codec.Codec[N]
	ec    entryCodec[T]
	ttl   bool
	start int
	// copies and raw are indexed by key group minus start.
	copies [][]entry[K, N, T]
	raw    []rawRecords
}

func (t *memTable[K, N, T]) capture(want keygroup.Range) (recordSource, error) {
	kc, ok1 := t.sp.codecs.key.(codec.Codec[K])
	nc, ok2 := t.sp.codecs.namespace.(codec.Codec[N])
	if !ok1 || !ok2 || t.ec == nil {
		return nil, fmt.Errorf("state %q has no codecs", t.sp.name)
	}
	c := &memCapture[K, N, T]{
		kc: kc, nc: nc, ec: t.ec,
		ttl:   t.sp.ttl.TTL > 0,
		start: t.groups.Start,
	}
	if t.ec.byCopy() {
		c.copies = make([][]entry[K, N, T], len(t.kg))
		for gi := range t.kg {
			if len(t.kg[gi].slots) == 0 || !want.Contains(t.groups.Start+gi) {
				continue
			}
			cp := slices.Clone(t.kg[gi].slots)
			for i := range cp {
				t.ec.freeze(&cp[i].v)
			}
			c.copies[gi] = cp
		}
		return c, nil
	}
	c.raw = make([]rawRecords, len(t.kg))
	var w recordWriter
	for gi := range t.kg {
		if len(t.kg[gi].slots) == 0 || !want.Contains(t.groups.Start+gi) {
			continue
		}
		w.data, w.count = nil, 0
		if err := c.encode(&w, t.kg[gi].slots); err != nil {
			return nil, err
		}
		c.raw[gi] = w.rawRecords
	}
	return c, nil
}

func (c *memCapture[K, N, T]) records(g int, w *recordWriter) error {
	gi := g - c.start
	if c.raw != nil {
		if gi >= 0 && gi < len(c.raw) {
			return rawSource{g: c.raw[gi]}.records(g, w)
		}
		return nil
	}
	if gi < 0 || gi >= len(c.copies) {
		return nil
	}
	return c.encode(w, c.copies[gi])
}

// encode adds the records of entries to w.
func (c *memCapture[K, N, T]) encode(w *recordWriter, entries []entry[K, N, T]) error {
	var key []byte
	for i := range entries {
		e := &entries[i]
		var err error
		if key, err = c.kc.Append(key[:0], e.k.key); err != nil {
			return err
		}
		if key, err = c.nc.Append(key, e.k.ns); err != nil {
			return err
		}
		if err := c.ec.appendRecords(w, key, e.exp, c.ttl, &e.v); err != nil {
			return err
		}
	}
	return nil
}

// load decodes the restored records of p into the table, which is new.
func (t *memTable[K, N, T]) load(p *pendingState) error {
	kc := t.sp.codecs.key.(codec.Codec[K])
	nc := t.sp.codecs.namespace.(codec.Codec[N])
	entryTTL := t.sp.ttl.TTL > 0 && t.sp.kind != kindMap
	for _, g := range slices.Sorted(maps.Keys(p.groups)) {
		grp := t.group(g)
		if n := p.groups[g].count; t.sp.kind != kindMap && grp.index == nil && n > 0 {
			// One record per entry: size the group once instead of
			// growing its map and slice record by record.
			grp.index = make(map[nsKey[K, N]]int, n)
			grp.slots = make([]entry[K, N, T], 0, n)
			t.epoch++
		}
		err := forEachRecord(p.groups[g], func(key, val []byte) error {
			k, n1, err := kc.Decode(key)
			if err != nil {
				return fmt.Errorf("%w: key: %w", ErrCorruptSnapshot, err)
			}
			ns, n2, err := nc.Decode(key[n1:])
			if err != nil {
				return fmt.Errorf("%w: namespace: %w", ErrCorruptSnapshot, err)
			}
			var exp int64
			if p.meta.ttl {
				if len(val) < 8 {
					return fmt.Errorf("%w: value of %d bytes has no expiry time", ErrCorruptSnapshot, len(val))
				}
				exp, val = int64(binary.BigEndian.Uint64(val)), val[8:]
			}
			nk := nsKey[K, N]{k, ns}
			e := t.find(grp, nk)
			fresh := e == nil
			if fresh {
				e = t.insert(grp, nk)
			}
			if entryTTL {
				e.exp = exp
			}
			return t.ec.decodeRecord(&e.v, fresh, key[n1+n2:], exp, val)
		})
		if err != nil {
			return fmt.Errorf("restore: state %q, key group %d: %w", t.sp.name, g, err)
		}
	}
	return nil
}
