package state

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"slices"
	"strconv"
	"testing"

	"github.com/jonboulle/clockwork"

	"github.com/edgedio/edged/keygroup"
)

// snapshotKinds are the backend kinds the snapshot tests combine.
var snapshotKinds = []backendKind{backendKinds[0], backendKinds[1], backendKinds[3]}

// TestSnapshotRoundTrip writes a snapshot of every backend kind and
// restores it into a fresh backend of every kind: the contents, read
// through handles and as the records of a second snapshot, are the same.
func TestSnapshotRoundTrip(t *testing.T) {
	full := keygroup.Range{Start: 0, End: fixMaxPar}
	keys := fixtureKeys(300)
	for _, from := range snapshotKinds {
		for _, to := range snapshotKinds {
			t.Run(from.name+"->"+to.name, func(t *testing.T) {
				clk := clockwork.NewFakeClock()
				src := from.new(t, full, clk)
				f := mustFixture(t, src)
				f.fill(keys, clk)
				data, offs := writeSnapshot(t, src)
				if len(offs) != fixMaxPar {
					t.Fatalf("%d sections, want %d", len(offs), fixMaxPar)
				}
				want := f.observe(keys)

				dst := to.new(t, full, clk)
				if err := Restore(dst, bytes.NewReader(data), offs, full); err != nil {
					t.Fatal(err)
				}
				// State nobody registered is carried into the next
				// snapshot as it was restored.
				again, _ := writeSnapshot(t, dst)
				if d := diff(dump(t, data, full), dump(t, again, full)); d != "" {
					t.Fatalf("unregistered restored state: %s", d)
				}
				g := mustFixture(t, dst)
				// Registered, decoded and encoded again: the same records.
				again, _ = writeSnapshot(t, dst)
				if d := diff(dump(t, data, full), dump(t, again, full)); d != "" {
					t.Fatalf("registered restored state: %s", d)
				}
				if d := diff(want, g.observe(keys)); d != "" {
					t.Fatalf("restored state reads otherwise: %s", d)
				}
				// TTLs are kept: the entries written first expire now.
				clk.Advance(fixtureTTL / 2)
				if d := diff(f.observe(keys), g.observe(keys)); d != "" {
					t.Fatalf("after the TTL: %s", d)
				}
			})
		}
	}
}

// TestSnapshotRescale restores the snapshots of oldP subtasks into newP
// subtasks, each reading its key groups from the old subtasks
// KeyedRestoreSources names: every new subtask holds what a single
// backend holding everything holds in its key groups.
func TestSnapshotRescale(t *testing.T) {
	keys := fixtureKeys(400)
	full := keygroup.Range{Start: 0, End: fixMaxPar}
	for _, sc := range []struct{ oldP, newP int }{{1, 1}, {2, 1}, {1, 2}, {2, 3}, {3, 2}} {
		for _, from := range snapshotKinds[:2] {
			for _, to := range snapshotKinds[:2] {
				name := fmt.Sprintf("%d->%d/%s->%s", sc.oldP, sc.newP, from.name, to.name)
				t.Run(name, func(t *testing.T) {
					clk := clockwork.NewFakeClock()
					ref := mustFixture(t, NewMemoryBackend(full, clk))
					olds := make([]*fixture, sc.oldP)
					for i := range olds {
						olds[i] = mustFixture(t, from.new(t, keygroup.RangeFor(i, sc.oldP, fixMaxPar), clk))
					}
					// Fill them all at the same times, so expiry times agree.
					fillAll(append([]*fixture{ref}, olds...), keys, clk)
					refData, _ := writeSnapshot(t, ref.b)
					data := make([][]byte, sc.oldP)
					offs := make([]KeyGroupOffsets, sc.oldP)
					for i, o := range olds {
						data[i], offs[i] = writeSnapshot(t, o.b)
					}
					sources := KeyedRestoreSources(fixMaxPar, sc.oldP, sc.newP)
					for j := range sc.newP {
						r := keygroup.RangeFor(j, sc.newP, fixMaxPar)
						nb := to.new(t, r, clk)
						for _, i := range sources[j] {
							if err := Restore(nb, bytes.NewReader(data[i]), offs[i], r); err != nil {
								t.Fatal(err)
							}
						}
						got, _ := writeSnapshot(t, nb)
						if d := diff(dump(t, refData, r), dump(t, got, r)); d != "" {
							t.Fatalf("subtask %d of %d: %s", j, sc.newP, d)
						}
						nf := mustFixture(t, nb)
						if d := diff(observeIn(ref, keys, r), nf.observe(keys)); d != "" {
							t.Fatalf("subtask %d of %d reads otherwise: %s", j, sc.newP, d)
						}
					}
				})
			}
		}
	}
}

// observeIn is observe of f limited to the keys and timers of key groups r.
func observeIn(f *fixture, keys []string, r keygroup.Range) []string {
	var in []string
	for _, k := range keys {
		if r.Contains(groupOfKey(k)) {
			in = append(in, k)
		}
	}
	var out []string
	for _, l := range f.observe(in) {
		var ts int64
		var k string
		var g, ns int
		if n, _ := fmt.Sscanf(l, "timer {Timestamp:%d Key:%s Group:%d Namespace:%d}", &ts, &k, &g, &ns); n == 4 && !r.Contains(g) {
			continue
		}
		out = append(out, l)
	}
	return out
}

func TestRestoreIncompatibleState(t *testing.T) {
	full := keygroup.Range{Start: 0, End: fixMaxPar}
	for _, k := range snapshotKinds {
		t.Run(k.name, func(t *testing.T) {
			clk := clockwork.NewFakeClock()
			src := k.new(t, full, clk)
			f := mustFixture(t, src)
			f.fill(fixtureKeys(20), clk)
			data, offs := writeSnapshot(t, src)
			restored := func() Backend {
				b := k.new(t, full, clk)
				if err := Restore(b, bytes.NewReader(data), offs, full); err != nil {
					t.Fatal(err)
				}
				return b
			}
			var kc KeyContext[string]
			cases := []struct {
				name string
				reg  func(b Backend) error
				msg  string
			}{
				{"kind", func(b Backend) error {
					return second(NewList(b, &kc, ListDescriptor[int]{Name: "value"}))
				}, `restore: state "value" was Value of int keyed by string, now List of int keyed by string`},
				{"type", func(b Backend) error {
					return second(NewValue(b, &kc, ValueDescriptor[int64]{Name: "value"}))
				}, `restore: state "value" was Value of int keyed by string, now Value of int64 keyed by string`},
				{"key type", func(b Backend) error {
					return second(NewValue(b, &KeyContext[int]{}, ValueDescriptor[int]{Name: "value"}))
				}, `now Value of int keyed by int`},
				{"namespace", func(b Backend) error {
					return second(NewNamespacedList[string, string](b, &kc, ListDescriptor[string]{Name: "list"}))
				}, `in namespace int, now List of string keyed by string in namespace string`},
				{"TTL off", func(b Backend) error {
					return second(NewValue(b, &kc, ValueDescriptor[string]{Name: "ttl"}))
				}, `had a TTL: true, now false`},
				{"codec", func(b Backend) error {
					return second(NewValue(b, &kc, ValueDescriptor[int]{Name: "value", Codec: plainCodec{}}))
				}, `was encoded with codecs`},
				{"timers", func(b Backend) error {
					return RegisterTimerQueue[string, string](b, "event", NewTimerQueue[string, string](), nil, nil)
				}, `was Timers of timers keyed by string in namespace int, now Timers of timers keyed by string in namespace string`},
			}
			for _, c := range cases {
				b := restored()
				err := c.reg(b)
				if !errors.Is(err, ErrIncompatibleState) || !bytes.Contains([]byte(err.Error()), []byte(c.msg)) {
					t.Errorf("%s: got %v, want ErrIncompatibleState saying %q", c.name, err, c.msg)
				}
				// The state stays restored: a compatible registration
				// still gets it.
				if _, err := openFixture(b); err != nil {
					t.Errorf("%s: then the right registration: %v", c.name, err)
				}
			}
		})
	}
}

func TestRestoreOrder(t *testing.T) {
	full := keygroup.Range{Start: 0, End: fixMaxPar}
	for _, k := range snapshotKinds {
		t.Run(k.name, func(t *testing.T) {
			clk := clockwork.NewFakeClock()
			src := k.new(t, full, clk)
			mustFixture(t, src).fill(fixtureKeys(20), clk)
			data, offs := writeSnapshot(t, src)

			b := k.new(t, full, clk)
			half := keygroup.Range{Start: 0, End: fixMaxPar / 2}
			if err := Restore(b, bytes.NewReader(data), offs, half); err != nil {
				t.Fatal(err)
			}
			if err := Restore(b, bytes.NewReader(data), offs, full); !errors.Is(err, ErrRestoreAfterRegister) {
				t.Fatalf("restoring key groups twice: %v", err)
			}
			b = k.new(t, full, clk)
			mustFixture(t, b)
			if err := Restore(b, bytes.NewReader(data), offs, full); !errors.Is(err, ErrRestoreAfterRegister) {
				t.Fatalf("restore after registering: %v", err)
			}
			if err := Restore(nil, bytes.NewReader(data), offs, full); !errors.Is(err, ErrNoBackend) {
				t.Fatalf("restore into nil: %v", err)
			}
		})
	}
}

// Every byte of the stream is covered by a checksum: flipping any of them
// makes Restore fail with ErrCorruptSnapshot; a truncated stream too.
func TestRestoreCorrupt(t *testing.T) {
	full := keygroup.Range{Start: 0, End: fixMaxPar}
	clk := clockwork.NewFakeClock()
	src := NewMemoryBackend(full, clk)
	f := mustFixture(t, src)
	f.fill(fixtureKeys(6), clk)
	data, offs := writeSnapshot(t, src)
	for _, k := range snapshotKinds {
		t.Run(k.name, func(t *testing.T) {
			step := 1
			if k.name != "memory" {
				step = 13
				if strconv.IntSize == 32 {
					step = 97 // each bolt file maps address space until the test ends
				}
			}
			for i := 0; i < len(data); i += step {
				bad := bytes.Clone(data)
				bad[i] ^= 0x20
				err := Restore(k.new(t, full, clk), bytes.NewReader(bad), offs, full)
				if !errors.Is(err, ErrCorruptSnapshot) {
					t.Fatalf("byte %d of %d flipped: %v", i, len(data), err)
				}
			}
			for n := 0; n < len(data); n += step {
				err := Restore(k.new(t, full, clk), bytes.NewReader(data[:n]), offs, full)
				if !errors.Is(err, ErrCorruptSnapshot) {
					t.Fatalf("truncated to %d of %d bytes: %v", n, len(data), err)
				}
			}
		})
	}
	// An unknown version says so.
	bad := bytes.Clone(data)
	binary.BigEndian.PutUint16(bad[4:], 9)
	h, err := readHeader(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	binary.BigEndian.PutUint32(bad[h.len-4:], crc32.Checksum(bad[:h.len-4], castagnoli))
	if err := Restore(NewMemoryBackend(full, clk), bytes.NewReader(bad), offs, full); !errors.Is(err, ErrSnapshotVersion) {
		t.Fatalf("version 9: %v", err)
	}
}

// A memory backend holds state without a codec, but cannot snapshot it.
func TestSnapshotWithoutCodec(t *testing.T) {
	b, _ := newTestBackend()
	var kc KeyContext[string]
	must(NewValue(b, &kc, ValueDescriptor[hidden]{Name: "hidden"}))
	if _, err := Snapshot(b); err == nil || !bytes.Contains([]byte(err.Error()), []byte(`"hidden"`)) {
		t.Fatalf("Snapshot = %v", err)
	}
	if _, err := Snapshot(nil); !errors.Is(err, ErrNoBackend) {
		t.Fatalf("Snapshot(nil) = %v", err)
	}
	bb := newTestBolt(t, testGroups, nil, 0)
	if _, err := NewValue(bb, &kc, ValueDescriptor[hidden]{Name: "hidden"}); err == nil {
		t.Fatal("bolt backend took state without a codec")
	}
}

func TestSnapshotEmptyAndReleased(t *testing.T) {
	for _, k := range snapshotKinds {
		t.Run(k.name, func(t *testing.T) {
			b := k.new(t, testGroups, nil)
			data, offs := writeSnapshot(t, b)
			if len(data) != headerLen+1+headerTailLen || len(offs) != 0 {
				t.Fatalf("empty snapshot: %d bytes, %d sections", len(data), len(offs))
			}
			s, err := Snapshot(b)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Release(); err != nil {
				t.Fatal(err)
			}
			if err := s.Release(); err != nil {
				t.Fatal(err)
			}
			if _, err := s.WriteTo(&bytes.Buffer{}); err == nil {
				t.Fatal("wrote a released snapshot")
			}
			if _, err := s.WriteTo(&bytes.Buffer{}); err == nil {
				t.Fatal("wrote a snapshot twice")
			}
		})
	}
}

// Timers restored per key group keep their order within the group and
// fire as they would have.
func TestTimersRestored(t *testing.T) {
	full := keygroup.Range{Start: 0, End: fixMaxPar}
	for _, k := range snapshotKinds {
		t.Run(k.name, func(t *testing.T) {
			b := k.new(t, full, nil)
			q := NewTimerQueue[string, int]()
			if err := RegisterTimerQueue(b, "proc", q, nil, nil); err != nil {
				t.Fatal(err)
			}
			if err := RegisterTimerQueue(b, "proc", q, nil, nil); err != nil {
				t.Fatalf("registering the same queue again: %v", err)
			}
			if err := RegisterTimerQueue(b, "proc", NewTimerQueue[string, int](), nil, nil); !errors.Is(err, ErrStateType) {
				t.Fatalf("another queue of the same name: %v", err)
			}
			for i := range 50 {
				k := fmt.Sprint("k", i%9)
				q.Register(int64(100-i%4), k, groupOfKey(k), i%3)
			}
			var want []tm
			data, offs := writeSnapshot(t, b)
			q.PopUntil(1000, func(x tm) { want = append(want, x) })

			nb := k.new(t, full, nil)
			if err := Restore(nb, bytes.NewReader(data), offs, full); err != nil {
				t.Fatal(err)
			}
			nq := NewTimerQueue[string, int]()
			if err := RegisterTimerQueue(nb, "proc", nq, nil, nil); err != nil {
				t.Fatal(err)
			}
			var got []tm
			nq.PopUntil(1000, func(x tm) { got = append(got, x) })
			// Within a key group the order is kept.
			byGroup := func(ts []tm) map[int][]tm {
				m := make(map[int][]tm)
				for _, x := range ts {
					m[x.Group] = append(m[x.Group], x)
				}
				return m
			}
			wg, gg := byGroup(want), byGroup(got)
			if len(got) != len(want) || len(wg) != len(gg) {
				t.Fatalf("restored %d timers, want %d", len(got), len(want))
			}
			for g := range wg {
				if !slices.Equal(wg[g], gg[g]) {
					t.Fatalf("group %d: %v, want %v", g, gg[g], wg[g])
				}
			}
		})
	}
}

// Restored bytes that pass the checksums but do not decode fail the
// registration, with either backend: handles never meet them.
func TestRestoreUndecodable(t *testing.T) {
	full := keygroup.Range{Start: 0, End: fixMaxPar}
	src := NewMemoryBackend(full, nil)
	var kc KeyContext[string]
	v := must(NewValue(src, &kc, ValueDescriptor[int]{Name: "v"}))
	m := must(NewMap(src, &kc, MapDescriptor[string, int]{Name: "m"}))
	kc.Set("k", 3)
	v.Update(1)
	m.Put("x", 2)
	// Rewrite the section of key group 3 with the value of "v" and the
	// user key of "m" changed to bytes their codecs refuse.
	stream, offs := rewriteSection(t, src, 3, map[string][2]string{
		"v": {"\x01k", "\x80"},      // a varint that does not end
		"m": {"\x01k\x05x", "\x02"}, // a string longer than its bytes
	})
	for _, k := range snapshotKinds {
		t.Run(k.name, func(t *testing.T) {
			b := k.new(t, full, nil)
			if err := Restore(b, bytes.NewReader(stream), offs, full); err != nil {
				t.Fatal(err)
			}
			var kc KeyContext[string]
			if _, err := NewValue(b, &kc, ValueDescriptor[int]{Name: "v"}); !errors.Is(err, ErrCorruptSnapshot) {
				t.Errorf("value: %v", err)
			}
			if _, err := NewMap(b, &kc, MapDescriptor[string, int]{Name: "m"}); !errors.Is(err, ErrCorruptSnapshot) {
				t.Errorf("map: %v", err)
			}
		})
	}
}

// rewriteSection returns a snapshot stream of src's catalogue holding one
// section, of key group g, in which each state named in recs has one
// record, the key and value given; and the stream's offsets.
func rewriteSection(t testing.TB, src Backend, g int, recs map[string][2]string) ([]byte, KeyGroupOffsets) {
	t.Helper()
	data, _ := writeSnapshot(t, src)
	h, err := readHeader(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	var sec sectionWriter
	for i, m := range h.cat {
		kv, ok := recs[m.name]
		if !ok {
			continue
		}
		var w recordWriter
		w.add([]byte(kv[0]), []byte(kv[1]))
		sec.addState(i, &w.rawRecords)
	}
	body := sec.finish(g)
	return append(bytes.Clone(data[:h.len]), body...), KeyGroupOffsets{g: {Offset: h.len, Length: int64(len(body))}}
}
