package state

import (
	"bytes"
	"errors"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/jonboulle/clockwork"

	"github.com/edgedio/edged/codec"
	"github.com/edgedio/edged/keygroup"
)

// withCodecs returns the snapshot data (offsets offs) with the codecs its
// catalogue records for state name replaced by codecs(old), and the
// offsets of its sections, which move with the header's length.
func withCodecs(t *testing.T, data []byte, offs KeyGroupOffsets, name string, codecs func(old string) string) ([]byte, KeyGroupOffsets) {
	t.Helper()
	h, err := readHeader(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for i := range h.cat {
		if h.cat[i].name == name {
			h.cat[i].codecs = codecs(h.cat[i].codecs)
			found = true
		}
	}
	if !found {
		t.Fatalf("the snapshot has no state %q", name)
	}
	out := append(appendHeader(nil, h.groups, h.cat), data[h.len:]...)
	delta := int64(len(out) - len(data))
	moved := maps.Clone(offs)
	for g, e := range moved {
		e.Offset += delta
		moved[g] = e
	}
	return out, moved
}

// A type that keeps its name but changes its fields encodes differently
// (the default codecs write the fields end to end, with no names): a
// restore into it is refused with ErrIncompatibleState naming the state
// and both layouts, on every backend. Before, a program whose List
// element struct gained a field restored 4 old elements as 2 new ones
// made of their halves, without an error, and a Value failed as a
// corrupt snapshot. The types of one program differ by name in a test
// binary (function-local types), so the snapshot is given the codec
// names of the new type, as the recompiled program's are.
func TestRestoreRefusesAChangedTypeLayout(t *testing.T) {
	full := keygroup.Range{Start: 0, End: fixMaxPar}
	type point struct{ X int64 }
	type celsius int64
	for _, k := range snapshotKinds {
		t.Run(k.name, func(t *testing.T) {
			clk := clockwork.NewFakeClock()
			src := k.new(t, full, clk)
			var kc KeyContext[string]
			l, err := NewList(src, &kc, ListDescriptor[point]{Name: "points"})
			if err != nil {
				t.Fatal(err)
			}
			v, err := NewValue(src, &kc, ValueDescriptor[celsius]{Name: "temp"})
			if err != nil {
				t.Fatal(err)
			}
			kc.Set("a", 3)
			l.AddAll([]point{{1}, {2}, {3}, {4}})
			v.Update(-7)
			data, offs := writeSnapshot(t, src)
			restore := func(data []byte, offs KeyGroupOffsets) (Backend, *KeyContext[string]) {
				b := k.new(t, full, clk)
				if err := Restore(b, bytes.NewReader(data), offs, full); err != nil {
					t.Fatal(err)
				}
				kc := new(KeyContext[string])
				kc.Set("a", 3)
				return b, kc
			}
			// newNames returns a codecs rewrite giving the old snapshot
			// the codec names of the state sp, keeping the old layouts.
			newNames := func(sp *spec) func(string) string {
				return func(old string) string {
					_, layouts := splitLayouts(old)
					names, _ := splitLayouts(sp.codecNames())
					return names + layoutSep + layouts
				}
			}

			{
				type point struct{ X, Y int64 }
				sp := newKeyedSpec[string, voidNamespace]("points", kindList, TTLConfig{}, typeName[point]())
				sp.codecs.value = defaultCodec[point](nil, &sp.codecs.err)
				b, kc := restore(withCodecs(t, data, offs, "points", newNames(&sp)))
				_, err := NewList(b, kc, ListDescriptor[point]{Name: "points"})
				want := `restore: state "points" was stored with the type layout ns=struct{} value=struct{X int64}, now ns=struct{} value=struct{X int64; Y int64}`
				if !errors.Is(err, ErrIncompatibleState) || !strings.Contains(err.Error(), want) {
					t.Fatalf("a List of a struct that gained a field: %v, want ErrIncompatibleState saying %q", err, want)
				}
			}
			{
				type celsius float64
				sp := newKeyedSpec[string, voidNamespace]("temp", kindValue, TTLConfig{}, typeName[celsius]())
				sp.codecs.value = defaultCodec[celsius](nil, &sp.codecs.err)
				b, kc := restore(withCodecs(t, data, offs, "temp", newNames(&sp)))
				_, err := NewValue(b, kc, ValueDescriptor[celsius]{Name: "temp"})
				want := `value=int64, now ns=struct{} value=float64`
				if !errors.Is(err, ErrIncompatibleState) || !strings.Contains(err.Error(), want) {
					t.Fatalf("a Value of a named int64 now a float64: %v, want ErrIncompatibleState saying %q", err, want)
				}
			}

			// The same types restore.
			b, kc2 := restore(data, offs)
			pl, err := NewList(b, kc2, ListDescriptor[point]{Name: "points"})
			if err != nil {
				t.Fatal(err)
			}
			pv, err := NewValue(b, kc2, ValueDescriptor[celsius]{Name: "temp"})
			if err != nil {
				t.Fatal(err)
			}
			if got := pl.Get(); !reflect.DeepEqual(got, []point{{1}, {2}, {3}, {4}}) {
				t.Fatalf("restored list %v", got)
			}
			if got, ok := pv.Get(); !ok || got != -7 {
				t.Fatalf("restored value %v %v", got, ok)
			}

			// A codec that describes itself (JSON) or the user's own
			// records no layout: its format is not the fields end to end.
			js := newKeyedSpec[string, voidNamespace]("json", kindValue, TTLConfig{}, typeName[point]())
			js.codecs.value = codec.JSON[point]()
			if _, layouts := splitLayouts(js.codecNames()); strings.Contains(layouts, "value=") {
				t.Fatalf("a JSON codec records the layout %q", layouts)
			}

			// A snapshot written before layouts were recorded names the
			// codecs only: it restores when they match, as before.
			b, kc2 = restore(withCodecs(t, data, offs, "points", func(old string) string {
				names, _ := splitLayouts(old)
				return names
			}))
			pl, err = NewList(b, kc2, ListDescriptor[point]{Name: "points"})
			if err != nil {
				t.Fatalf("a snapshot without layouts: %v", err)
			}
			if got := pl.Get(); !reflect.DeepEqual(got, []point{{1}, {2}, {3}, {4}}) {
				t.Fatalf("restored list without layouts %v", got)
			}
		})
	}
}

// A job restored from a snapshot written before layouts were recorded,
// whose subtasks do not all register a state before their next
// checkpoint, writes that state with layouts where it was registered and
// without where it was carried as restored. Such a checkpoint restores
// with another parallelism, the sections of both kinds merged, on every
// backend. Before, the restore failed with ErrCorruptSnapshot ("state
// "points" is list of … in one key group, list of … in another": the
// same words twice), and no restart could get past it.
func TestRescaleMergesSectionsWithAndWithoutLayouts(t *testing.T) {
	full := keygroup.Range{Start: 0, End: fixMaxPar}
	halves := []keygroup.Range{{Start: 0, End: fixMaxPar / 2}, {Start: fixMaxPar / 2, End: fixMaxPar}}
	type point struct{ X int64 }
	keys := map[string]int{"lo": 3, "hi": 12}
	for _, k := range snapshotKinds {
		t.Run(k.name, func(t *testing.T) {
			clk := clockwork.NewFakeClock()
			src := k.new(t, full, clk)
			var kc KeyContext[string]
			l, err := NewList(src, &kc, ListDescriptor[point]{Name: "points"})
			if err != nil {
				t.Fatal(err)
			}
			for key, g := range keys {
				kc.Set(key, g)
				l.AddAll([]point{{int64(g)}, {int64(g + 1)}})
			}
			data, offs := writeSnapshot(t, src)
			// The snapshot as an older edged wrote it: no layouts.
			old, oldOffs := withCodecs(t, data, offs, "points", func(c string) string {
				names, _ := splitLayouts(c)
				return names
			})

			// Subtask 0 registers the state, subtask 1 carries it.
			var parts [][]byte
			var partOffs []KeyGroupOffsets
			for i, r := range halves {
				b := k.new(t, r, clk)
				if err := Restore(b, bytes.NewReader(old), oldOffs, r); err != nil {
					t.Fatal(err)
				}
				if i == 0 {
					if _, err := NewList(b, new(KeyContext[string]), ListDescriptor[point]{Name: "points"}); err != nil {
						t.Fatal(err)
					}
				}
				d, o := writeSnapshot(t, b)
				parts, partOffs = append(parts, d), append(partOffs, o)
			}

			// Restored with parallelism 1, the old subtasks read in
			// either order.
			for _, order := range [][]int{{0, 1}, {1, 0}} {
				b := k.new(t, full, clk)
				for _, i := range order {
					if err := Restore(b, bytes.NewReader(parts[i]), partOffs[i], full); err != nil {
						t.Fatalf("restore of old subtask %d (order %v): %v", i, order, err)
					}
				}
				var kc2 KeyContext[string]
				l2, err := NewList(b, &kc2, ListDescriptor[point]{Name: "points"})
				if err != nil {
					t.Fatal(err)
				}
				for key, g := range keys {
					kc2.Set(key, g)
					if got, want := l2.Get(), []point{{int64(g)}, {int64(g + 1)}}; !reflect.DeepEqual(got, want) {
						t.Fatalf("key %s: restored %v, want %v", key, got, want)
					}
				}
			}
		})
	}
}

// The operator state alike: a ListState one old subtask registered after
// a restore from a snapshot without layouts, and another carried as
// restored, restores with another parallelism. Before, the restore
// failed with ErrIncompatibleState, and the job was not restarted.
func TestRescaleMergesOperatorStateWithAndWithoutLayouts(t *testing.T) {
	type point struct{ X int64 }
	s := NewOperatorStore()
	l, err := ListState[point](s, "points")
	if err != nil {
		t.Fatal(err)
	}
	l.Add(point{1})
	l.Add(point{2})
	data, err := SnapshotOperator(s)
	if err != nil {
		t.Fatal(err)
	}
	// The snapshot as an older edged wrote it: no layouts.
	raws, err := parseOperator(data)
	if err != nil {
		t.Fatal(err)
	}
	raws["points"].meta.codecs, _ = splitLayouts(raws["points"].meta.codecs)
	oldStore := NewOperatorStore()
	oldStore.pending = raws
	old, err := SnapshotOperator(oldStore)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(old, []byte(layoutSep)) {
		t.Fatal("the old snapshot records layouts")
	}

	// Two subtasks of a job restored from it with parallelism 2: 0
	// registers the state, 1 carries it.
	var parts [][]byte
	for sub := range 2 {
		st, err := RestoreOperatorStates([][]byte{old}, sub, 2)
		if err != nil {
			t.Fatal(err)
		}
		if sub == 0 {
			if _, err := ListState[point](st, "points"); err != nil {
				t.Fatal(err)
			}
		}
		d, err := SnapshotOperator(st)
		if err != nil {
			t.Fatal(err)
		}
		parts = append(parts, d)
	}

	st, err := RestoreOperatorStates(parts, 0, 1)
	if err != nil {
		t.Fatalf("restore with parallelism 1: %v", err)
	}
	got, err := ListState[point](st, "points")
	if err != nil {
		t.Fatal(err)
	}
	elems := got.Get()
	slices.SortFunc(elems, func(a, b point) int { return int(a.X - b.X) })
	if want := []point{{1}, {2}}; !reflect.DeepEqual(elems, want) {
		t.Fatalf("restored %v, want %v", elems, want)
	}
}

// Sections that disagree on anything but whether layouts are recorded
// still disagree: other layouts, other codecs, another kind.
func TestMergeMetaKeepsDisagreements(t *testing.T) {
	m := stateMeta{name: "s", kind: kindList, types: "T", codecs: "key=a value=b"}
	with := func(m stateMeta, l string) stateMeta { m.codecs += layoutSep + l; return m }
	other := m
	other.kind = kindValue
	otherCodecs := m
	otherCodecs.codecs = "key=a value=c"
	for _, c := range []struct {
		a, b stateMeta
		ok   bool
		want stateMeta
	}{
		{m, m, true, m},
		{m, with(m, "value=x"), true, with(m, "value=x")},
		{with(m, "value=x"), m, true, with(m, "value=x")},
		{with(m, "value=x"), with(m, "value=y"), false, stateMeta{}},
		{m, with(otherCodecs, "value=x"), false, stateMeta{}},
		{with(m, "value=x"), other, false, stateMeta{}},
	} {
		got, ok := mergeMeta(c.a, c.b)
		if ok != c.ok || ok && got != c.want {
			t.Errorf("mergeMeta(%+v, %+v) = %+v, %t; want %+v, %t", c.a, c.b, got, ok, c.want, c.ok)
		}
	}
}
