package state

import (
	"errors"
	"maps"
	"slices"
	"testing"
)

func TestOperatorLists(t *testing.T) {
	s := NewOperatorStore()
	for _, mk := range []func(*OperatorStore, string) (OperatorList[string], error){ListState[string], UnionListState[string]} {
		l := must(mk(s, "offsets"))
		if l.Get() != nil {
			t.Fatal("fresh list not empty")
		}
		l.Add("a")
		l.Add("b")
		got := l.Get()
		got[0] = "z"
		if !slices.Equal(l.Get(), []string{"a", "b"}) {
			t.Fatalf("Get = %v (must be a copy)", l.Get())
		}
		// The same name gives the same list.
		if again := must(mk(s, "offsets")); !slices.Equal(again.Get(), []string{"a", "b"}) {
			t.Fatal("second handle sees another list")
		}
		in := []string{"c"}
		l.Update(in)
		in[0] = "x"
		if !slices.Equal(l.Get(), []string{"c"}) {
			t.Fatalf("Update = %v", l.Get())
		}
		l.Clear()
		if l.Get() != nil {
			t.Fatal("Clear kept elements")
		}
		s = NewOperatorStore()
	}
}

func TestBroadcastState(t *testing.T) {
	s := NewOperatorStore()
	bs := must(BroadcastState[string, float64](s, "rules"))
	ro := must(ReadOnlyBroadcastState[string, float64](s, "rules"))
	bs.Put("max", 10)
	bs.Put("min", 1)
	if v, ok := ro.Get("max"); !ok || v != 10 || ro.Len() != 2 {
		t.Fatal("read-only view does not see writes")
	}
	if got := maps.Collect(ro.All()); !maps.Equal(got, map[string]float64{"max": 10, "min": 1}) {
		t.Fatalf("All = %v", got)
	}
	if _, ok := ro.(Broadcast[string, float64]); ok {
		t.Fatal("read-only view converts back to Broadcast")
	}
	bs.Remove("min")
	if _, ok := bs.Get("min"); ok || bs.Len() != 1 {
		t.Fatal("Remove")
	}
	bs.Clear()
	if ro.Len() != 0 {
		t.Fatal("Clear")
	}
}

func TestOperatorStateErrors(t *testing.T) {
	s := NewOperatorStore()
	must(ListState[int](s, "l"))
	must(BroadcastState[string, int](s, "b"))
	cases := []struct {
		name string
		err  error
		want error
	}{
		{"list of another type", second(ListState[string](s, "l")), ErrStateType},
		{"union on a list", second(UnionListState[int](s, "l")), ErrStateType},
		{"broadcast on a list", second(BroadcastState[int, int](s, "l")), ErrStateType},
		{"broadcast of other types", second(BroadcastState[string, string](s, "b")), ErrStateType},
		{"read-only of other types", second(ReadOnlyBroadcastState[int, int](s, "b")), ErrStateType},
		{"list on a broadcast", second(ListState[int](s, "b")), ErrStateType},
		{"empty name", second(ListState[int](s, "")), ErrDescriptor},
	}
	for _, c := range cases {
		if !errors.Is(c.err, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, c.err, c.want)
		}
	}
	if _, err := ListState[int](nil, "x"); err == nil {
		t.Error("nil store accepted")
	}
}

// Every subtask restored from a snapshot holding operator state has a
// store with Len above 0 before it registers anything, also one whose
// share of a list is empty (more new subtasks than elements): a source
// that keeps its splits in list state tells a restore, where it must not
// assign itself splits afresh, from a first start by it.
func TestRestoredStoreIsNotEmptyEvenWithAnEmptyShare(t *testing.T) {
	s := NewOperatorStore()
	l := must(ListState[int](s, "splits"))
	l.Add(7)
	snap := must(SnapshotOperator(s))
	for sub := range 3 {
		r := must(RestoreOperatorStates([][]byte{snap}, sub, 3))
		if r.Len() == 0 {
			t.Fatalf("subtask %d of 3: Len 0 after a restore", sub)
		}
		got := must(ListState[int](r, "splits")).Get()
		if want := sub == 0; (len(got) == 1) != want {
			t.Fatalf("subtask %d of 3: list %v", sub, got)
		}
	}
	if NewOperatorStore().Len() != 0 {
		t.Fatal("a new store has Len above 0")
	}
}
