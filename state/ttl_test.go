package state

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/edgedio/edged/keygroup"
)

const ttl = 10 * time.Second

func TestValueTTL(t *testing.T) {
	forEachBackend(t, func(t *testing.T, newTestBackend func() (Backend, *clockwork.FakeClock)) {
		for _, onRead := range []bool{false, true} {
			b, clk := newTestBackend()
			var kc KeyContext[string]
			v := must(NewValue(b, &kc, ValueDescriptor[int]{Name: "v", TTL: TTLConfig{TTL: ttl, UpdateOnRead: onRead}}))
			kc.Set("a", 10)
			v.Update(1) // t=0, expires at 10s
			clk.Advance(5 * time.Second)
			if x, ok := v.Get(); !ok || x != 1 { // t=5; renews to 15s if onRead
				t.Fatalf("onRead=%v: live value missing at 5s", onRead)
			}
			clk.Advance(5 * time.Second) // t=10
			x, ok := v.Get()
			if ok != onRead {
				t.Fatalf("onRead=%v: at 10s got %d, %v", onRead, x, ok)
			}
			if !onRead && Len(b, "v") != 0 {
				t.Fatal("expired entry not removed on access")
			}
			// A write renews.
			v.Update(2) // t=10, expires at 20s
			clk.Advance(ttl - 1)
			if x, ok := v.Get(); !ok || x != 2 {
				t.Fatalf("onRead=%v: renewed value missing", onRead)
			}
			clk.Advance(ttl)
			if _, ok := v.Get(); ok {
				t.Fatalf("onRead=%v: value outlived its TTL", onRead)
			}
		}
	})
}

func TestReducingAndAggregatingTTLStartAfresh(t *testing.T) {
	forEachBackend(t, func(t *testing.T, newTestBackend func() (Backend, *clockwork.FakeClock)) {
		b, clk := newTestBackend()
		var kc KeyContext[string]
		r := must(NewReducing(b, &kc, ReducingDescriptor[int]{Name: "r", Reduce: sum, TTL: TTLConfig{TTL: ttl}}))
		d := avgDescriptor("a", false)
		d.TTL = TTLConfig{TTL: ttl}
		a := must(NewAggregating(b, &kc, d))
		kc.Set("k", 10)
		r.Add(5)
		a.Add(100)
		clk.Advance(ttl)
		// The expired entries are still stored: the writes must not fold into them.
		r.Add(1)
		a.Add(2)
		if x, _ := r.Get(); x != 1 {
			t.Fatalf("reducing = %d, want 1", x)
		}
		if x, _ := a.Get(); x != 2 {
			t.Fatalf("aggregating = %v, want 2", x)
		}
	})
}

func TestListTTLPerList(t *testing.T) {
	forEachBackend(t, func(t *testing.T, newTestBackend func() (Backend, *clockwork.FakeClock)) {
		b, clk := newTestBackend()
		var kc KeyContext[string]
		l := must(NewList(b, &kc, ListDescriptor[int]{Name: "l", TTL: TTLConfig{TTL: ttl}}))
		kc.Set("k", 10)
		l.Add(1)
		clk.Advance(5 * time.Second)
		l.Add(2) // renews the whole list to 15s
		clk.Advance(9 * time.Second)
		if got := l.Get(); !slices.Equal(got, []int{1, 2}) {
			t.Fatalf("at 14s: %v", got)
		}
		clk.Advance(time.Second)
		if got := slices.Collect(l.All()); got != nil {
			t.Fatalf("at 15s: %v", got)
		}
		l.Add(3)
		if got := l.Get(); !slices.Equal(got, []int{3}) {
			t.Fatalf("Add after expiry: %v", got)
		}
	})
}

func TestMapTTLPerElement(t *testing.T) {
	forEachBackend(t, func(t *testing.T, newTestBackend func() (Backend, *clockwork.FakeClock)) {
		for _, onRead := range []bool{false, true} {
			b, clk := newTestBackend()
			var kc KeyContext[string]
			m := must(NewMap(b, &kc, MapDescriptor[string, int]{Name: "m", TTL: TTLConfig{TTL: ttl, UpdateOnRead: onRead}}))
			kc.Set("k", 10)
			m.Put("x", 1) // t=0
			clk.Advance(5 * time.Second)
			m.Put("y", 2) // t=5
			clk.Advance(4 * time.Second)
			m.Get("x") // t=9: renews x to 19s if onRead
			clk.Advance(time.Second)
			// t=10: x expired unless read; y lives.
			want := map[string]int{"y": 2}
			if onRead {
				want["x"] = 1
			}
			if got := maps.Collect(m.All()); !maps.Equal(got, want) {
				t.Fatalf("onRead=%v: at 10s All = %v, want %v", onRead, got, want)
			}
			if m.Contains("x") != onRead || m.Len() != len(want) {
				t.Fatalf("onRead=%v: Contains/Len disagree with All", onRead)
			}
			clk.Advance(10 * time.Second) // t=20: everything expired
			if m.Len() != 0 || Len(b, "m") != 0 {
				t.Fatalf("onRead=%v: expired map kept: Len %d, entries %d", onRead, m.Len(), Len(b, "m"))
			}
		}
	})
}

func TestMergeSkipsExpiredSources(t *testing.T) {
	forEachBackend(t, func(t *testing.T, newTestBackend func() (Backend, *clockwork.FakeClock)) {
		b, clk := newTestBackend()
		var kc KeyContext[string]
		l := must(NewNamespacedList[string, int](b, &kc, ListDescriptor[string]{Name: "l", TTL: TTLConfig{TTL: ttl}}))
		kc.Set("k", 10)
		l.SetNamespace(1)
		l.Add("old")
		clk.Advance(ttl)
		l.SetNamespace(2)
		l.Add("new")
		l.MergeNamespaces(3, 1, 2)
		l.SetNamespace(3)
		if got := l.Get(); !slices.Equal(got, []string{"new"}) {
			t.Fatalf("merged %v", got)
		}
		if Len(b, "l") != 1 {
			t.Fatalf("Len = %d, want 1", Len(b, "l"))
		}
	})
}

func TestCleanupExpired(t *testing.T) {
	forEachBackend(t, func(t *testing.T, newTestBackend func() (Backend, *clockwork.FakeClock)) {
		b, clk := newTestBackend()
		var kc KeyContext[int]
		v := must(NewValue(b, &kc, ValueDescriptor[int]{Name: "v", TTL: TTLConfig{TTL: ttl}}))
		m := must(NewMap(b, &kc, MapDescriptor[int, int]{Name: "m", TTL: TTLConfig{TTL: ttl}}))
		keep := must(NewValue(b, &kc, ValueDescriptor[int]{Name: "keep"}))
		if CleanupExpired(b, 100) != 0 {
			t.Fatal("removed from empty state")
		}
		// 100 values and 50 maps of 2 elements written at t=0, 30 values and 10
		// maps written at t=5s.
		for k := range 130 {
			kc.Set(k, groupOf(k))
			v.Update(k)
			keep.Update(k)
			if k%2 == 0 && k < 120 {
				m.Put(1, k)
				m.Put(2, k)
			}
			if k == 99 {
				clk.Advance(5 * time.Second)
			}
		}
		clk.Advance(ttl - time.Second) // t=14: the t=0 writes expired
		if n := CleanupExpired(b, 0); n != 0 {
			t.Fatalf("budget 0 removed %d", n)
		}
		removed, calls := 0, 0
		for {
			n := CleanupExpired(b, 7)
			if n > 7*2 { // a Map entry counts once against the budget, its elements each
				t.Fatalf("call %d removed %d values with a budget of 7", calls, n)
			}
			removed += n
			calls++
			if Len(b, "v") == 30 && Len(b, "m") == 10 {
				break
			}
			if calls > 100 {
				t.Fatalf("cleanup does not progress: v %d, m %d", Len(b, "v"), Len(b, "m"))
			}
		}
		if removed != 100+50*2 {
			t.Fatalf("removed %d values, want 200", removed)
		}
		if calls < (100+50)/7 { // every expired entry is checked once, 7 per call
			t.Fatalf("%d calls checked more than the budget", calls)
		}
		if Len(b, "keep") != 130 {
			t.Fatal("cleanup touched state without TTL")
		}
		// Another pass finds nothing, and checks each entry once per call.
		if n := CleanupExpired(b, 1000); n != 0 {
			t.Fatalf("second pass removed %d", n)
		}
		for k := 100; k < 130; k++ {
			kc.Set(k, groupOf(k))
			if x, ok := v.Get(); !ok || x != k {
				t.Fatalf("live key %d lost", k)
			}
		}
		clk.Advance(time.Hour)
		if n := CleanupExpired(b, 1000); n != 30+10*2 || Len(b, "v") != 0 || Len(b, "m") != 0 {
			t.Fatalf("final pass removed %d, left v %d, m %d", n, Len(b, "v"), Len(b, "m"))
		}
	})
}

// A TTL whose expiry is beyond what an int64 of Unix nanoseconds holds
// (time.Duration(math.MaxInt64), "forever", or 250 years) never expires,
// on every backend and for every kind, read with and without renewal.
// Before, now+TTL wrapped negative and every entry was expired as soon
// as it was written: a Value read back absent, a Map had no elements.
func TestTTLBeyondInt64NeverExpires(t *testing.T) {
	full := keygroup.Range{Start: 0, End: 4}
	for _, k := range backendKinds {
		for _, ttl := range []time.Duration{time.Duration(math.MaxInt64), 250 * 365 * 24 * time.Hour} {
			for _, onRead := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/%v/onRead=%t", k.name, ttl, onRead), func(t *testing.T) {
					clk := clockwork.NewFakeClockAt(time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC))
					b := k.new(t, full, clk)
					cfg := TTLConfig{TTL: ttl, UpdateOnRead: onRead}
					var kc KeyContext[string]
					v, err := NewValue(b, &kc, ValueDescriptor[int]{Name: "v", TTL: cfg})
					if err != nil {
						t.Fatal(err)
					}
					l, err := NewList(b, &kc, ListDescriptor[int]{Name: "l", TTL: cfg})
					if err != nil {
						t.Fatal(err)
					}
					m, err := NewMap(b, &kc, MapDescriptor[string, int]{Name: "m", TTL: cfg})
					if err != nil {
						t.Fatal(err)
					}
					kc.Set("k", 1)
					v.Update(5)
					l.Add(6)
					m.Put("a", 7)
					for range 2 {
						if got, ok := v.Get(); !ok || got != 5 {
							t.Fatalf("Value: %d, %t; want 5", got, ok)
						}
						if got := l.Get(); len(got) != 1 || got[0] != 6 {
							t.Fatalf("List: %v; want [6]", got)
						}
						if got, ok := m.Get("a"); !ok || got != 7 || m.Len() != 1 {
							t.Fatalf("Map: %d, %t, len %d; want 7 and 1 element", got, ok, m.Len())
						}
						if n := CleanupExpired(b, 100); n != 0 {
							t.Fatalf("CleanupExpired removed %d values", n)
						}
						clk.Advance(100 * 365 * 24 * time.Hour)
					}
				})
			}
		}
	}
}
