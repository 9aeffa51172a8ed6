package state

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/jonboulle/clockwork"

	"github.com/edgedio/edged/keygroup"
)

// A snapshot is written on another goroutine while the owner goes on
// writing: what it writes is what the backend held when it was taken.
// Two snapshots are taken back to back; one is written during the writes,
// the other after them: they must hold the same records. Run with -race:
// the snapshot must share no memory the owner writes.
//
// The bolt backend runs with its default batch: the second snapshot's read
// transaction stays open on this goroutine while it writes, and a commit
// that outgrew the memory map would wait for it for ever (see
// BoltOptions.InitialMmapSize); small batches grow the file fastest.
func TestSnapshotWhileWriting(t *testing.T) {
	full := keygroup.Range{Start: 0, End: fixMaxPar}
	for _, k := range snapshotKinds[:2] {
		t.Run(k.name, func(t *testing.T) {
			clk := clockwork.NewFakeClock()
			b := k.new(t, full, clk)
			f := mustFixture(t, b)
			keys := fixtureKeys(500)
			f.fill(keys, clk)

			during, err := Snapshot(b)
			if err != nil {
				t.Fatal(err)
			}
			after, err := Snapshot(b)
			if err != nil {
				t.Fatal(err)
			}
			var buf1 bytes.Buffer
			done := make(chan error, 1)
			go func() {
				_, err := during.WriteTo(&buf1)
				done <- err
			}()
			churn(f, keys, clk)
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			var buf2 bytes.Buffer
			if _, err := after.WriteTo(&buf2); err != nil {
				t.Fatal(err)
			}
			// (Byte for byte but for the order of Map elements, which is
			// Go's map order in the memory backend.)
			if d := diff(dump(t, buf2.Bytes(), full), dump(t, buf1.Bytes(), full)); d != "" {
				t.Fatalf("the snapshot written during the writes differs: %s", d)
			}
			// And the writes did happen.
			now, _ := writeSnapshot(t, b)
			if bytes.Equal(now, buf2.Bytes()) {
				t.Fatal("the writes changed nothing")
			}
		})
	}
}

// churn changes every state of f in every way a handle can: overwrites,
// values changed in place after Get, appends, map puts and removes,
// clears, new keys (slot slices grow) and removals (slots move), merges,
// timers.
func churn(f *fixture, keys []string, clk *clockwork.FakeClock) {
	for round := range 3 {
		for i, k := range keys {
			f.kc.Set(k, groupOfKey(k))
			v, _ := f.value.Get()
			f.value.Update(v + 1)
			if s, ok := f.slices.Get(); ok && len(s) > 0 {
				s[0]++ // in place, as operators do
				f.slices.Update(s)
			}
			p, _ := f.points.Get()
			p.X++
			f.points.Update(p)
			f.list.SetNamespace(0)
			f.list.Add("more")
			f.tlist.Add(round)
			f.mp.SetNamespace(0)
			f.mp.Put("a", -i)
			f.mp.Remove(fmt.Sprint("b", 0))
			f.tmap.Put("late", round)
			f.red.SetNamespace(1)
			f.red.Add(1)
			f.agg.SetNamespace(5)
			f.agg.Add(1)
			f.agg.MergeNamespaces(0, 1, 2, 5)
			f.list.MergeNamespaces(0, 1, 2)
			if i%3 == round {
				f.ttl.Clear()
				f.mp.SetNamespace(1)
				f.mp.Clear()
			}
			f.timers.Register(int64(2000+round), k, groupOfKey(k), round)
			f.timers.Delete(int64(1000+i%7), k, groupOfKey(k), i%2)
		}
		for i := range 200 {
			k := fmt.Sprintf("new-%d-%d", round, i)
			f.kc.Set(k, groupOfKey(k))
			f.value.Update(i)
			f.slices.Update([]int{i})
			f.list.Add(k)
		}
		CleanupExpired(f.b, 100)
		clk.Advance(fixtureTTL / 3)
	}
}
