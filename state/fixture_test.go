package state

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/edgedio/edged/keygroup"
)

// fixture is one of every kind of keyed state, with and without
// namespaces and TTLs, and a timer queue: what the snapshot tests fill,
// snapshot, restore and compare.
type fixture struct {
	b      Backend
	kc     KeyContext[string]
	value  Value[int]
	points Value[point]
	slices Value[[]int] // has a slice: the memory snapshot encodes it at once
	ttl    Value[string]
	list   NamespacedList[int, string]
	tlist  List[int]
	mp     NamespacedMap[int, string, int]
	tmap   Map[string, int]
	red    NamespacedReducing[int, int]
	agg    NamespacedAggregating[int, float64, float64]
	timers *TimerQueue[string, int]
}

// fixtureTTL is the TTL of the fixture's TTL states.
const fixtureTTL = time.Minute

// openFixture registers the fixture's states and timer queue with b.
func openFixture(b Backend) (*fixture, error) {
	f := &fixture{b: b, timers: NewTimerQueue[string, int]()}
	var err error
	reg := func(e error) {
		if err == nil {
			err = e
		}
	}
	ttl := TTLConfig{TTL: fixtureTTL}
	var e error
	f.value, e = NewValue(b, &f.kc, ValueDescriptor[int]{Name: "value"})
	reg(e)
	f.points, e = NewValue(b, &f.kc, ValueDescriptor[point]{Name: "points"})
	reg(e)
	f.slices, e = NewValue(b, &f.kc, ValueDescriptor[[]int]{Name: "slices"})
	reg(e)
	f.ttl, e = NewValue(b, &f.kc, ValueDescriptor[string]{Name: "ttl", TTL: ttl})
	reg(e)
	f.list, e = NewNamespacedList[string, int](b, &f.kc, ListDescriptor[string]{Name: "list"})
	reg(e)
	f.tlist, e = NewList(b, &f.kc, ListDescriptor[int]{Name: "tlist", TTL: ttl})
	reg(e)
	f.mp, e = NewNamespacedMap[string, int](b, &f.kc, MapDescriptor[string, int]{Name: "map"})
	reg(e)
	f.tmap, e = NewMap(b, &f.kc, MapDescriptor[string, int]{Name: "tmap", TTL: ttl})
	reg(e)
	f.red, e = NewNamespacedReducing[string, int](b, &f.kc, ReducingDescriptor[int]{Name: "reducing", Reduce: sum})
	reg(e)
	f.agg, e = NewNamespacedAggregating[string, int](b, &f.kc, avgDescriptor("agg", true))
	reg(e)
	reg(RegisterTimerQueue(b, "event", f.timers, nil, nil))
	return f, err
}

// mustFixture is openFixture for a backend the test expects to accept it.
func mustFixture(t testing.TB, b Backend) *fixture {
	t.Helper()
	f, err := openFixture(b)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// fixMaxPar is the number of key groups of the rescaling tests.
const fixMaxPar = 16

func groupOfKey(k string) int { return keygroup.Of(keygroup.HashString(k), fixMaxPar) }

// fill writes the keys of f's backend's key groups among keys: i in keys
// gets entries in every state, some with several namespaces, some
// elements written a while after others (so TTLs differ), and timers.
func (f *fixture) fill(keys []string, clk *clockwork.FakeClock) {
	fillAll([]*fixture{f}, keys, clk)
}

// fillAll fills every fixture of fs, round by round, advancing clk, the
// clock of their backends, between rounds.
func fillAll(fs []*fixture, keys []string, clk *clockwork.FakeClock) {
	for round := range 2 {
		for _, f := range fs {
			f.fillRound(keys, round)
		}
		clk.Advance(fixtureTTL / 2)
	}
}

// fillRound writes the entries of one round of fill.
func (f *fixture) fillRound(keys []string, round int) {
	r := f.b.KeyGroups()
	{
		for i, k := range keys {
			g := groupOfKey(k)
			if !r.Contains(g) {
				continue
			}
			f.kc.Set(k, g)
			switch round {
			case 0:
				f.value.Update(i)
				f.points.Update(point{X: float64(i), Y: -1, N: int64(i * i)})
				f.slices.Update([]int{i, i + 1})
				f.ttl.Update(fmt.Sprint("t", i))
				for ns := range i%3 + 1 {
					f.list.SetNamespace(ns)
					f.list.AddAll([]string{k, fmt.Sprint(ns)})
					f.mp.SetNamespace(ns)
					f.mp.Put("a", i)
					f.mp.Put(fmt.Sprint("b", ns), ns)
					f.red.SetNamespace(ns)
					f.red.Add(i)
					f.agg.SetNamespace(ns)
					f.agg.Add(float64(i))
				}
				f.tlist.Add(i)
				f.tmap.Put("early", i)
				f.timers.Register(int64(1000+i%7), k, g, i%2)
				f.timers.Register(int64(1000+i%5), k, g, 7)
			case 1:
				if i%4 == 0 {
					f.tmap.Put("late", -i)
					f.tlist.Add(-i)
				}
				if i%5 == 0 {
					f.value.Clear()
				}
			}
		}
	}
}

// observe reads every state of every key of keys in f's backend's key
// groups, through the handles, in a form to compare.
func (f *fixture) observe(keys []string) []string {
	r := f.b.KeyGroups()
	var out []string
	add := func(k, what string, v any, ok bool) {
		out = append(out, fmt.Sprintf("%s %s %v %v", k, what, v, ok))
	}
	for _, k := range keys {
		g := groupOfKey(k)
		if !r.Contains(g) {
			continue
		}
		f.kc.Set(k, g)
		v, ok := f.value.Get()
		add(k, "value", v, ok)
		p, ok := f.points.Get()
		add(k, "points", p, ok)
		s, ok := f.slices.Get()
		add(k, "slices", s, ok)
		t, ok := f.ttl.Get()
		add(k, "ttl", t, ok)
		add(k, "tlist", f.tlist.Get(), true)
		m := maps.Collect(f.tmap.All())
		add(k, "tmap", fmt.Sprint(sortedMap(m)), len(m) > 0)
		for ns := range 4 {
			f.list.SetNamespace(ns)
			add(k, fmt.Sprint("list/", ns), f.list.Get(), true)
			f.mp.SetNamespace(ns)
			add(k, fmt.Sprint("map/", ns), sortedMap(maps.Collect(f.mp.All())), f.mp.Len() > 0)
			f.red.SetNamespace(ns)
			r, ok := f.red.Get()
			add(k, fmt.Sprint("reducing/", ns), r, ok)
			f.agg.SetNamespace(ns)
			a, ok := f.agg.Get()
			add(k, fmt.Sprint("agg/", ns), a, ok)
		}
	}
	for _, g := range f.timers.Groups() {
		for _, t := range f.timers.InGroup(g) {
			out = append(out, fmt.Sprintf("timer %+v", t))
		}
	}
	return out
}

func sortedMap(m map[string]int) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s:%d", k, m[k]))
	}
	return strings.Join(parts, ",")
}

// fixtureKeys returns n keys.
func fixtureKeys(n int) []string {
	ks := make([]string, n)
	for i := range ks {
		ks[i] = fmt.Sprintf("sensor-%d", i)
	}
	return ks
}

// writeSnapshot snapshots b and returns the stream and its offsets.
func writeSnapshot(t testing.TB, b Backend) ([]byte, KeyGroupOffsets) {
	t.Helper()
	s, err := Snapshot(b)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	n, err := s.WriteTo(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if n != int64(buf.Len()) {
		t.Fatalf("WriteTo returned %d, wrote %d bytes", n, buf.Len())
	}
	return buf.Bytes(), s.Offsets()
}

// dump returns the records of a snapshot stream, as "state group key
// value" in hex, sorted, for the key groups in r: the contents of a
// backend, independent of the backend and of the order of entries.
func dump(t testing.TB, data []byte, r keygroup.Range) []string {
	t.Helper()
	offs, err := ReadKeyGroupOffsets(bytes.NewReader(data), int64(len(data)))
	if err != nil {
		t.Fatal(err)
	}
	h, err := readHeader(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for g, ext := range offs {
		if !r.Contains(g) {
			continue
		}
		states, err := parseSection(data[ext.Offset:ext.Offset+ext.Length], g, h.cat)
		if err != nil {
			t.Fatal(err)
		}
		for _, st := range states {
			err := forEachRecord(st.records, func(k, v []byte) error {
				out = append(out, fmt.Sprintf("%s %d %s %s", st.meta.name, g, hex.EncodeToString(k), hex.EncodeToString(v)))
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	slices.Sort(out)
	return out
}

// diff reports the first difference of two sorted lines.
func diff(want, got []string) string {
	for i := range min(len(want), len(got)) {
		if want[i] != got[i] {
			return fmt.Sprintf("line %d: want %q, got %q", i, want[i], got[i])
		}
	}
	if len(want) != len(got) {
		return fmt.Sprintf("want %d lines, got %d", len(want), len(got))
	}
	return ""
}
