package watermark

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"testing"
	"time"
)

// A Merger restored from its State at any point behaves as the original
// from then on: same watermarks, same advances, same status changes.
// Random schedules, seed printed.
func TestMergerStateRoundTrip(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	for run := range 200 {
		n := 1 + rng.IntN(4)
		m := NewMerger(n)
		var twin *Merger
		cut := rng.IntN(40)
		for step := range 80 {
			if step == cut {
				var err error
				if twin, err = RestoreMerger(m.State()); err != nil {
					t.Fatalf("run %d: RestoreMerger(%+v): %v", run, m.State(), err)
				}
			}
			ch := rng.IntN(n)
			var op func(*Merger) (int64, bool)
			switch r := rng.IntN(10); {
			case r < 6:
				wm := int64(rng.IntN(100))
				if rng.IntN(30) == 0 {
					wm = MaxWatermark
				}
				op = func(m *Merger) (int64, bool) { return m.Watermark(ch, wm) }
			default:
				idle := r < 8
				op = func(m *Merger) (int64, bool) { return m.SetIdle(ch, idle) }
			}
			wm, adv := op(m)
			idle, changed := m.StatusChanged()
			if twin == nil {
				continue
			}
			twm, tadv := op(twin)
			tidle, tchanged := twin.StatusChanged()
			if wm != twm || adv != tadv || idle != tidle || changed != tchanged {
				t.Fatalf("run %d step %d: original (%d %t %t %t), restored (%d %t %t %t)", run, step, wm, adv, idle, changed, twm, tadv, tidle, tchanged)
			}
		}
	}
}

func TestRestoreMergerRejects(t *testing.T) {
	for _, s := range []MergerState{
		{},
		{Combined: 10, Channels: []ChannelState{{Watermark: 5}}},
	} {
		if _, err := RestoreMerger(s); !errors.Is(err, ErrCorruptState) {
			t.Errorf("RestoreMerger(%+v) = %v, want ErrCorruptState", s, err)
		}
	}
	// An idle channel may lag, an ended one is at the maximum.
	if _, err := RestoreMerger(MergerState{Combined: 10, Channels: []ChannelState{{Watermark: 5, Idle: true}, {Watermark: MaxWatermark}, {Watermark: 10}}}); err != nil {
		t.Fatal(err)
	}
}

func TestNewMergerAt(t *testing.T) {
	m := NewMergerAt(2, 50)
	if m.Current() != 50 || m.Idle() {
		t.Fatalf("NewMergerAt(2, 50): current %d idle %t", m.Current(), m.Idle())
	}
	if _, adv := m.Watermark(0, 40); adv || m.Current() != 50 {
		t.Fatalf("a lower watermark moved it to %d", m.Current())
	}
	if wm, adv := m.Watermark(0, 70); adv || wm != 50 {
		t.Fatalf("one channel at 70, other at 50: %d %t", wm, adv)
	}
	if wm, adv := m.Watermark(1, 60); !adv || wm != 60 {
		t.Fatalf("both past 50: %d %t", wm, adv)
	}
}

// A restored generator emits what the original emits.
func TestGeneratorStateRoundTrip(t *testing.T) {
	g := NewBoundedOutOfOrderness(100 * time.Millisecond).(StatefulGenerator)
	fresh := NewBoundedOutOfOrderness(100 * time.Millisecond).(StatefulGenerator)
	if err := fresh.RestoreState(fresh.AppendState(nil)); err != nil {
		t.Fatal(err)
	}
	for _, ts := range []int64{1000, 3000, 2000} {
		g.OnEvent(ts)
	}
	if wm, ok := g.OnPeriodicEmit(); !ok || wm != 2899 {
		t.Fatalf("emit = %d %t", wm, ok)
	}
	r := NewBoundedOutOfOrderness(100 * time.Millisecond).(StatefulGenerator)
	if err := r.RestoreState(g.AppendState([]byte("x"))[1:]); err != nil {
		t.Fatal(err)
	}
	// Nothing new to emit, and a record behind the largest timestamp
	// does not pull the watermark back.
	if wm, ok := r.OnPeriodicEmit(); ok || wm != 2899 {
		t.Fatalf("restored emit = %d %t", wm, ok)
	}
	r.OnEvent(2500)
	if _, ok := r.OnPeriodicEmit(); ok {
		t.Fatal("restored generator went back to an older maximum")
	}
	r.OnEvent(3500)
	if wm, ok := r.OnPeriodicEmit(); !ok || wm != 3399 {
		t.Fatalf("restored emit after 3500 = %d %t", wm, ok)
	}
	for _, bad := range [][]byte{nil, {1}, {2, 0, 0, 0}, {1, 2, 0, 0}, {1, 0, 0}, {1, 0, 0, 0, 0}, {1, 0, 0x80}} {
		if err := r.RestoreState(bad); !errors.Is(err, ErrCorruptState) {
			t.Errorf("RestoreState(%x) = %v", bad, err)
		}
	}
}

func FuzzGeneratorRestoreState(f *testing.F) {
	g := NewBoundedOutOfOrderness(time.Second).(StatefulGenerator)
	f.Add(g.AppendState(nil))
	g.OnEvent(12345)
	g.OnPeriodicEmit()
	f.Add(g.AppendState(nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		r := NewBoundedOutOfOrderness(time.Second).(StatefulGenerator)
		if err := r.RestoreState(b); err != nil {
			return
		}
		// Varints may be spelled longer than needed; what AppendState
		// writes restores to itself.
		got := r.AppendState(nil)
		r2 := NewBoundedOutOfOrderness(time.Second).(StatefulGenerator)
		if err := r2.RestoreState(got); err != nil {
			t.Fatalf("RestoreState(AppendState(RestoreState(%x))) = %v", b, err)
		}
		if again := r2.AppendState(nil); !bytes.Equal(again, got) {
			t.Fatalf("state %x restored and saved is %x", got, again)
		}
	})
}
