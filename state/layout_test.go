package state

import (
	"bytes"
	"errors"
	"maps"
	"reflect"
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
