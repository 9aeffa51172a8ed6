package state

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"maps"
	"slices"
	"strings"

	"github.com/edgedio/edged/codec"
)

// The operator snapshot, as SnapshotOperator writes it. Integers are
// big-endian unless said to be uvarints; bytes and strings are a uvarint
// length and the bytes.
//
//	"EDGO" | version u16 (1) | reserved u16 (0) | body | CRC32C of all
//	        that comes before u32
//	body    uvarint number of states, then per state, in increasing order
//	        of name: name | kind u8 | types | codecs | uvarint count |
//	        count elements (ListState, UnionListState: each encoded by the
//	        value codec) or count entries (BroadcastState: key, value), in
//	        increasing order of encoded key
//
// Elements are length-prefixed so that a restore with another parallelism
// can split and join lists, and compare broadcast maps, without knowing
// their types. Codecs are canonical, so equal maps encode equally.
const (
	operatorMagic   = "EDGO"
	operatorVersion = 1
)

// opRaw is one operator state, encoded.
type opRaw struct {
	meta stateMeta
	// elems holds the elements of a list; keys and vals the entries of
	// a broadcast map, in increasing order of key.
	elems      [][]byte
	keys, vals [][]byte
}

func (l *opList[V]) raw() (*opRaw, error) {
	c := l.sp.codecs.value.(codec.Codec[V])
	r := &opRaw{meta: metaOf(&l.sp), elems: make([][]byte, len(l.items))}
	for i, v := range l.items {
		b, err := c.Append(nil, v)
		if err != nil {
			return nil, err
		}
		r.elems[i] = b
	}
	return r, nil
}

func (l *opList[V]) load(r *opRaw) error {
	c := l.sp.codecs.value.(codec.Codec[V])
	for _, b := range r.elems {
		v, err := decodeAll(c, b)
		if err != nil {
			return err
		}
		l.items = append(l.items, v)
	}
	return nil
}

func (b *opBroadcast[K, V]) raw() (*opRaw, error) {
	kc := b.sp.codecs.key.(codec.Codec[K])
	vc := b.sp.codecs.value.(codec.Codec[V])
	r := &opRaw{meta: metaOf(&b.sp)}
	type kv struct{ k, v []byte }
	entries := make([]kv, 0, len(b.m))
	for k, v := range b.m {
		kb, err := kc.Append(nil, k)
		if err != nil {
			return nil, err
		}
		vb, err := vc.Append(nil, v)
		if err != nil {
			return nil, err
		}
		entries = append(entries, kv{kb, vb})
	}
	slices.SortFunc(entries, func(a, b kv) int { return bytes.Compare(a.k, b.k) })
	for _, e := range entries {
		r.keys = append(r.keys, e.k)
		r.vals = append(r.vals, e.v)
	}
	return r, nil
}

func (b *opBroadcast[K, V]) load(r *opRaw) error {
	kc := b.sp.codecs.key.(codec.Codec[K])
	vc := b.sp.codecs.value.(codec.Codec[V])
	for i := range r.keys {
		k, err := decodeAll(kc, r.keys[i])
		if err != nil {
			return err
		}
		v, err := decodeAll(vc, r.vals[i])
		if err != nil {
			return err
		}
		b.m[k] = v
	}
	return nil
}

// SnapshotOperator encodes the operator state of s, with the states
// restored into s and not registered since. It fails if a state's type has
// no codec. Call it from the goroutine that owns s; the result shares no
// memory with s.
func SnapshotOperator(s *OperatorStore) ([]byte, error) {
	if s == nil {
		return nil, errors.New("state: nil OperatorStore")
	}
	var raws []*opRaw
	for name, st := range s.states {
		sp := st.spec()
		if sp.codecs.err != nil {
			return nil, fmt.Errorf("state: snapshot of operator state %q: %w", name, sp.codecs.err)
		}
		r, err := st.raw()
		if err != nil {
			return nil, fmt.Errorf("state: snapshot of operator state %q: %w", name, err)
		}
		raws = append(raws, r)
	}
	for _, r := range s.pending {
		raws = append(raws, r)
	}
	slices.SortFunc(raws, func(a, b *opRaw) int { return strings.Compare(a.meta.name, b.meta.name) })
	out := binary.BigEndian.AppendUint16([]byte(operatorMagic), operatorVersion)
	out = binary.BigEndian.AppendUint16(out, 0)
	out = binary.AppendUvarint(out, uint64(len(raws)))
	for _, r := range raws {
		out = appendString(out, r.meta.name)
		out = append(out, byte(r.meta.kind))
		out = appendString(out, r.meta.types)
		out = appendString(out, r.meta.codecs)
		if r.meta.kind == kindBroadcast {
			out = binary.AppendUvarint(out, uint64(len(r.keys)))
			for i := range r.keys {
				out = appendBytes(appendBytes(out, r.keys[i]), r.vals[i])
			}
			continue
		}
		out = binary.AppendUvarint(out, uint64(len(r.elems)))
		for _, e := range r.elems {
			out = appendBytes(out, e)
		}
	}
	return binary.BigEndian.AppendUint32(out, crc32.Checksum(out, castagnoli)), nil
}

// parseOperator decodes an operator snapshot into its states, by name.
// The states' bytes alias data.
func parseOperator(data []byte) (map[string]*opRaw, error) {
	if len(data) < 12 || string(data[:4]) != operatorMagic {
		return nil, fmt.Errorf("%w: not an operator snapshot", ErrCorruptSnapshot)
	}
	body := data[:len(data)-4]
	if crc32.Checksum(body, castagnoli) != binary.BigEndian.Uint32(data[len(body):]) {
		return nil, fmt.Errorf("%w: operator snapshot checksum mismatch", ErrCorruptSnapshot)
	}
	if v := binary.BigEndian.Uint16(data[4:]); v != operatorVersion {
		return nil, fmt.Errorf("%w: operator snapshot version %d, this build reads %d", ErrSnapshotVersion, v, operatorVersion)
	}
	p := parser{b: body[8:]}
	n := p.count()
	out := make(map[string]*opRaw, n)
	for i := 0; i < n && p.err == nil; i++ {
		r := &opRaw{}
		r.meta.name = string(p.bytes())
		r.meta.kind = kind(p.byte())
		r.meta.types = string(p.bytes())
		r.meta.codecs = string(p.bytes())
		m := p.count()
		for j := 0; j < m && p.err == nil; j++ {
			if r.meta.kind == kindBroadcast {
				r.keys = append(r.keys, p.bytes())
				r.vals = append(r.vals, p.bytes())
			} else {
				r.elems = append(r.elems, p.bytes())
			}
		}
		if p.err != nil {
			break
		}
		if r.meta.kind < kindOperatorList || r.meta.kind > kindBroadcast || r.meta.name == "" || out[r.meta.name] != nil {
			return nil, fmt.Errorf("%w: operator state %q of kind %d", ErrCorruptSnapshot, r.meta.name, r.meta.kind)
		}
		out[r.meta.name] = r
	}
	if p.err == nil && len(p.b) != 0 {
		p.err = fmt.Errorf("%d bytes after the last state", len(p.b))
	}
	if p.err != nil {
		return nil, fmt.Errorf("%w: operator snapshot: %v", ErrCorruptSnapshot, p.err)
	}
	return out, nil
}

// RestoreOperator returns an OperatorStore holding the operator state of
// data, a snapshot by SnapshotOperator, for a job restored with the same
// parallelism. See RestoreOperatorStates.
func RestoreOperator(data []byte) (*OperatorStore, error) {
	return RestoreOperatorStates([][]byte{data}, 0, 1)
}

// RestoreOperatorStates returns the operator state of subtask subtask of
// newParallelism, from old, the snapshots (by SnapshotOperator) of every
// old subtask in subtask order. Each state is handed out by its kind:
// ListState by RedistributeList, UnionListState by RedistributeUnion,
// BroadcastState by RedistributeBroadcast (which fails if the old
// subtasks' maps differ; subtasks without the state are not compared). A
// state stays encoded until it is registered (ListState, ...), which
// fails with ErrIncompatibleState if its kind, types or codecs differ from
// the snapshot's. Corrupt snapshots give errors wrapping
// ErrCorruptSnapshot.
func RestoreOperatorStates(old [][]byte, subtask, newParallelism int) (*OperatorStore, error) {
	if newParallelism < 1 || subtask < 0 || subtask >= newParallelism {
		return nil, fmt.Errorf("state: restore operator state of subtask %d of %d", subtask, newParallelism)
	}
	parsed := make([]map[string]*opRaw, len(old))
	names := make(map[string]bool)
	for i, data := range old {
		// The restored states alias what they are parsed from.
		m, err := parseOperator(bytes.Clone(data))
		if err != nil {
			return nil, fmt.Errorf("restore operator state of old subtask %d: %w", i, err)
		}
		parsed[i] = m
		for n := range m {
			names[n] = true
		}
	}
	s := NewOperatorStore()
	s.pending = make(map[string]*opRaw)
	for _, name := range slices.Sorted(maps.Keys(names)) {
		var first *opRaw
		var meta stateMeta // first's, merged with the others' (mergeMeta)
		var lists [][][]byte
		var bcast []map[string]string
		for i, m := range parsed {
			r := m[name]
			if r == nil {
				lists = append(lists, nil)
				continue
			}
			if first == nil {
				first, meta = r, r.meta
			} else if merged, ok := mergeMeta(meta, r.meta); !ok {
				return nil, fmt.Errorf("restore: operator state %q is %s of %s (codecs %s) in one old subtask, %s of %s (codecs %s) in subtask %d: %w",
					name, meta.kind, meta.types, meta.codecs, r.meta.kind, r.meta.types, r.meta.codecs, i, ErrIncompatibleState)
			} else {
				meta = merged
			}
			lists = append(lists, r.elems)
			if r.meta.kind == kindBroadcast {
				bm := make(map[string]string, len(r.keys))
				for j := range r.keys {
					bm[string(r.keys[j])] = string(r.vals[j])
				}
				bcast = append(bcast, bm)
			}
		}
		out := &opRaw{meta: meta}
		switch first.meta.kind {
		case kindOperatorList:
			if len(lists) == newParallelism {
				// Same parallelism: each subtask takes back its own list,
				// so that one subtask restored alone (a handover) takes
				// what it had, and no element another one still holds.
				out.elems = lists[subtask]
				break
			}
			out.elems = RedistributeList(lists, newParallelism)[subtask]
		case kindUnionList:
			out.elems = RedistributeUnion(lists, newParallelism)[subtask]
		case kindBroadcast:
			ms, err := RedistributeBroadcast(bcast, newParallelism)
			if err != nil {
				return nil, fmt.Errorf("restore: operator state %q: %w", name, err)
			}
			for _, k := range slices.Sorted(maps.Keys(ms[subtask])) {
				out.keys = append(out.keys, []byte(k))
				out.vals = append(out.vals, []byte(ms[subtask][k]))
			}
		}
		s.pending[name] = out
	}
	return s, nil
}
