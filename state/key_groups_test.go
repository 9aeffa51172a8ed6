package state

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jonboulle/clockwork"

	"github.com/edgedio/edged/keygroup"
)

// moveGroups moves key groups r from the running backend from to the
// running backend to, through the stream RemoveKeyGroups writes.
func moveGroups(t testing.TB, from, to Backend, r keygroup.Range) {
	t.Helper()
	var buf bytes.Buffer
	offs, err := RemoveKeyGroups(from, r, &buf)
	if err != nil {
		t.Fatalf("removing %v: %v", r, err)
	}
	if err := AddKeyGroups(to, r, bytes.NewReader(buf.Bytes()), offs); err != nil {
		t.Fatalf("adding %v: %v", r, err)
	}
}

// checkHolds fails unless f's backend holds key groups r with what ref,
// a backend holding every key group, holds in them: read through f's
// handles and timer queue, and written by a snapshot.
func checkHolds(t testing.TB, what string, ref, f *fixture, keys []string, r keygroup.Range) {
	t.Helper()
	if got := f.b.KeyGroups(); got != r {
		t.Fatalf("%s: the backend holds key groups %v, want %v", what, got, r)
	}
	if d := diff(observeIn(ref, keys, r), f.observe(keys)); d != "" {
		t.Fatalf("%s: reads otherwise: %s", what, d)
	}
	refData, _ := writeSnapshot(t, ref.b)
	got, _ := writeSnapshot(t, f.b)
	if d := diff(dump(t, refData, r), dump(t, got, keygroup.Range{Start: 0, End: fixMaxPar})); d != "" {
		t.Fatalf("%s: its snapshot holds otherwise: %s", what, d)
	}
}

// TestKeyGroupsMoveBetweenRunningBackends moves key groups between two
// running backends whose operators registered every kind of state and a
// timer queue, there and back, down to one backend holding none: each
// holds, reads, writes, expires and snapshots exactly what a backend
// holding every key group holds in its key groups.
func TestKeyGroupsMoveBetweenRunningBackends(t *testing.T) {
	keys := fixtureKeys(120)
	full := keygroup.Range{Start: 0, End: fixMaxPar}
	rg := func(s, e int) keygroup.Range { return keygroup.Range{Start: s, End: e} }
	// Memory and bolt both ways, and bolt committing every three writes
	// (commits in the middle of the moves' writes).
	pairs := [][2]backendKind{
		{backendKinds[0], backendKinds[0]}, {backendKinds[0], backendKinds[1]},
		{backendKinds[1], backendKinds[0]}, {backendKinds[1], backendKinds[1]},
	}
	if !testing.Short() {
		pairs = append(pairs, [2]backendKind{backendKinds[3], backendKinds[3]})
	}
	for _, pair := range pairs {
		from, to := pair[0], pair[1]
		{
			t.Run(from.name+"->"+to.name, func(t *testing.T) {
				clk := clockwork.NewFakeClock()
				ref := mustFixture(t, NewMemoryBackend(full, clk))
				a := mustFixture(t, from.new(t, rg(0, 8), clk))
				b := mustFixture(t, to.new(t, rg(8, 16), clk))
				all := []*fixture{ref, a, b}
				fillAll(all, keys, clk)

				moveGroups(t, a.b, b.b, rg(5, 8))
				checkHolds(t, "a after giving [5,8)", ref, a, keys, rg(0, 5))
				checkHolds(t, "b after taking [5,8)", ref, b, keys, rg(5, 16))

				// Both go on: the handles write the key groups each
				// holds now, and the entries written first expire.
				for _, f := range all {
					f.fillRound(keys, 0)
				}
				// b deletes entries it took over; a must not have kept
				// them (it reads them if it takes their key group back).
				for _, f := range []*fixture{ref, b} {
					for _, k := range keysIn(keys, rg(5, 6)) {
						f.kc.Set(k, groupOfKey(k))
						f.value.Clear()
						f.mp.SetNamespace(0)
						f.mp.Clear()
					}
				}
				clk.Advance(fixtureTTL / 2)
				checkHolds(t, "a written on", ref, a, keys, rg(0, 5))
				checkHolds(t, "b written on", ref, b, keys, rg(5, 16))
				for _, f := range all {
					CleanupExpired(f.b, 1<<20)
				}
				checkHolds(t, "a cleaned up", ref, a, keys, rg(0, 5))
				checkHolds(t, "b cleaned up", ref, b, keys, rg(5, 16))

				// From the other end of b, all of a, and back.
				moveGroups(t, b.b, a.b, rg(5, 6))
				checkHolds(t, "a after taking [5,6) back", ref, a, keys, rg(0, 6))
				moveGroups(t, a.b, b.b, rg(0, 6))
				checkHolds(t, "a after giving all", ref, a, keys, rg(6, 6))
				checkHolds(t, "b holding all", ref, b, keys, full)
				moveGroups(t, b.b, a.b, rg(12, 16))
				checkHolds(t, "a after taking [12,16)", ref, a, keys, rg(12, 16))
				checkHolds(t, "b after giving [12,16)", ref, b, keys, rg(0, 12))

				// The timers fire where their key groups are.
				var fired, want []string
				for _, f := range []*fixture{a, b} {
					f.timers.PopUntil(1003, func(tm Timer[string, int]) { fired = append(fired, fmt.Sprint(tm)) })
				}
				ref.timers.PopUntil(1003, func(tm Timer[string, int]) { want = append(want, fmt.Sprint(tm)) })
				if len(want) == 0 {
					t.Fatal("no timer due at 1003")
				}
				if d := diff(sortedLines(want), sortedLines(fired)); d != "" {
					t.Fatalf("timers fired: %s", d)
				}
			})
		}
	}
}

func sortedLines(l []string) []string {
	out := append([]string(nil), l...)
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && out[j] < out[j-1]; j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}

// TestKeyGroupsMoveRestoredState moves key groups of restored state that
// the operator has not registered yet: into a backend that registered it
// (it decodes them at once) and into one that has not (it waits for the
// registration, as after Restore).
func TestKeyGroupsMoveRestoredState(t *testing.T) {
	keys := fixtureKeys(300)
	full := keygroup.Range{Start: 0, End: fixMaxPar}
	rg := func(s, e int) keygroup.Range { return keygroup.Range{Start: s, End: e} }
	for _, k := range snapshotKinds {
		t.Run(k.name, func(t *testing.T) {
			clk := clockwork.NewFakeClock()
			ref := mustFixture(t, NewMemoryBackend(full, clk))
			ref.fill(keys, clk)
			data, offs := writeSnapshot(t, ref.b)

			a := k.new(t, rg(0, 8), clk)
			if err := Restore(a, bytes.NewReader(data), offs, full); err != nil {
				t.Fatal(err)
			}
			// registeredB holds [8,16), with nothing in it.
			registeredB := mustFixture(t, k.new(t, rg(8, 16), clk))
			moveGroups(t, a, registeredB.b, rg(6, 8))
			if d := diff(observeIn(ref, keys, rg(6, 8)), registeredB.observe(keysIn(keys, rg(6, 8)))); d != "" {
				t.Fatalf("registered: %s", d)
			}
			unregistered := k.new(t, rg(4, 4), clk)
			moveGroups(t, a, unregistered, rg(4, 6))
			u := mustFixture(t, unregistered)
			checkHolds(t, "unregistered, then registered", ref, u, keys, rg(4, 6))
			rest := mustFixture(t, a)
			checkHolds(t, "what stayed", ref, rest, keys, rg(0, 4))
		})
	}
}

// keysIn returns the keys of keys in key groups r.
func keysIn(keys []string, r keygroup.Range) []string {
	var out []string
	for _, k := range keys {
		if r.Contains(groupOfKey(k)) {
			out = append(out, k)
		}
	}
	return out
}

// TestKeyGroupsRefused: key groups that would not leave a backend one
// range, a stream with a registered state of another type, and a damaged
// stream are refused, and the backend holds what it held.
func TestKeyGroupsRefused(t *testing.T) {
	keys := fixtureKeys(200)
	rg := func(s, e int) keygroup.Range { return keygroup.Range{Start: s, End: e} }
	for _, k := range snapshotKinds {
		t.Run(k.name, func(t *testing.T) {
			clk := clockwork.NewFakeClock()
			a := mustFixture(t, k.new(t, rg(0, 8), clk))
			a.fill(keys, clk)
			b := mustFixture(t, k.new(t, rg(8, 16), clk))
			b.fill(keys, clk)
			before := func(f *fixture) []string {
				data, _ := writeSnapshot(t, f.b)
				return dump(t, data, rg(0, fixMaxPar))
			}
			aWas, bWas := before(a), before(b)
			unchanged := func(what string) {
				t.Helper()
				if got := a.b.KeyGroups(); got != rg(0, 8) {
					t.Fatalf("%s: a holds %v", what, got)
				}
				if got := b.b.KeyGroups(); got != rg(8, 16) {
					t.Fatalf("%s: b holds %v", what, got)
				}
				if d := diff(aWas, before(a)); d != "" {
					t.Fatalf("%s: a changed: %s", what, d)
				}
				if d := diff(bWas, before(b)); d != "" {
					t.Fatalf("%s: b changed: %s", what, d)
				}
			}
			var sink bytes.Buffer
			for _, r := range []keygroup.Range{rg(2, 5), rg(6, 9), rg(8, 9), rg(3, 3), rg(5, 4)} {
				if _, err := RemoveKeyGroups(a.b, r, &sink); !errors.Is(err, ErrKeyGroups) {
					t.Errorf("removing %v from [0,8): %v, want ErrKeyGroups", r, err)
				}
			}
			if sink.Len() != 0 {
				t.Errorf("refused removals wrote %d bytes", sink.Len())
			}
			unchanged("refused removals")

			var buf bytes.Buffer
			donor := mustFixture(t, k.new(t, rg(0, 8), clk))
			donor.fill(keys, clk)
			offs, err := RemoveKeyGroups(donor.b, rg(6, 8), &buf)
			if err != nil {
				t.Fatal(err)
			}
			stream := buf.Bytes()
			for _, r := range []keygroup.Range{rg(6, 7), rg(4, 6), rg(17, 18), rg(7, 9), rg(0, 0)} {
				if err := AddKeyGroups(b.b, r, bytes.NewReader(stream), offs); !errors.Is(err, ErrKeyGroups) {
					t.Errorf("adding %v to [8,16): %v, want ErrKeyGroups", r, err)
				}
			}
			unchanged("refused additions")

			// A backend whose "value" is a Value of int64, not of int.
			var kc KeyContext[string]
			other := k.new(t, rg(8, 16), clk)
			if _, err := NewValue(other, &kc, ValueDescriptor[int64]{Name: "value"}); err != nil {
				t.Fatal(err)
			}
			err = AddKeyGroups(other, rg(6, 8), bytes.NewReader(stream), offs)
			if !errors.Is(err, ErrIncompatibleState) || !strings.Contains(err.Error(), `state "value" was Value of int keyed by string, now Value of int64`) {
				t.Errorf("incompatible: %v", err)
			}
			if got := other.KeyGroups(); got != rg(8, 16) {
				t.Errorf("incompatible: holds %v", got)
			}

			// A damaged section.
			bad := bytes.Clone(stream)
			ext := offs[7]
			bad[ext.Offset+ext.Length/2] ^= 0xff
			if err := AddKeyGroups(b.b, rg(6, 8), bytes.NewReader(bad), offs); !errors.Is(err, ErrCorruptSnapshot) {
				t.Errorf("damaged: %v, want ErrCorruptSnapshot", err)
			}
			unchanged("damaged stream")

			// The intact stream goes in.
			if err := AddKeyGroups(b.b, rg(6, 8), bytes.NewReader(stream), offs); err != nil {
				t.Fatal(err)
			}
			if got := b.b.KeyGroups(); got != rg(6, 16) {
				t.Fatalf("b holds %v", got)
			}
		})
	}
}

// TestKeyGroupsUndecodableLeavesBackend: records that pass the stream's
// checksums but that the registered codecs refuse are refused, and the
// backend holds what it held, even when some were loaded already.
func TestKeyGroupsUndecodableLeavesBackend(t *testing.T) {
	full := keygroup.Range{Start: 0, End: fixMaxPar}
	src := NewMemoryBackend(full, nil)
	var skc KeyContext[string]
	sv := must(NewValue(src, &skc, ValueDescriptor[int]{Name: "v"}))
	sm := must(NewMap(src, &skc, MapDescriptor[string, int]{Name: "m"}))
	skc.Set("k", 3)
	sv.Update(1)
	sm.Put("x", 2)
	// Key group 3: "m" decodes, "v" does not (a varint that does not end).
	stream, offs := rewriteSection(t, src, 3, map[string][2]string{
		"m": {"\x01k\x01x", "\x02"},
		"v": {"\x01k", "\x80"},
	})
	for _, k := range snapshotKinds {
		t.Run(k.name, func(t *testing.T) {
			b := k.new(t, keygroup.Range{Start: 4, End: 8}, nil)
			var kc KeyContext[string]
			v := must(NewValue(b, &kc, ValueDescriptor[int]{Name: "v"}))
			m := must(NewMap(b, &kc, MapDescriptor[string, int]{Name: "m"}))
			kc.Set("k", 5)
			v.Update(7)
			m.Put("y", 8)
			was, _ := writeSnapshot(t, b)
			err := AddKeyGroups(b, keygroup.Range{Start: 3, End: 4}, bytes.NewReader(stream), offs)
			if !errors.Is(err, ErrCorruptSnapshot) {
				t.Fatalf("got %v, want ErrCorruptSnapshot", err)
			}
			if got := b.KeyGroups(); got != (keygroup.Range{Start: 4, End: 8}) {
				t.Fatalf("holds %v", got)
			}
			now, _ := writeSnapshot(t, b)
			if d := diff(dump(t, was, full), dump(t, now, full)); d != "" {
				t.Fatalf("changed: %s", d)
			}
			if got, ok := v.Get(); !ok || got != 7 {
				t.Fatalf("value of k: %d %v", got, ok)
			}
		})
	}
}
