package state

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"testing"
)

// opSubtask fills an operator store as old subtask i would have.
func opSubtask(t *testing.T, i int, rules map[string]float64) []byte {
	t.Helper()
	s := NewOperatorStore()
	offsets := must(ListState[int64](s, "offsets"))
	for j := range 3 + i {
		offsets.Add(int64(100*i + j))
	}
	pending := must(UnionListState[string](s, "pending"))
	pending.Add(fmt.Sprint("tx-", i))
	bs := must(BroadcastState[string, float64](s, "rules"))
	for k, v := range rules {
		bs.Put(k, v)
	}
	data, err := SnapshotOperator(s)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func TestOperatorSnapshotRoundTrip(t *testing.T) {
	rules := map[string]float64{"max": 40, "min": -5}
	data := opSubtask(t, 1, rules)
	s, err := RestoreOperator(data)
	if err != nil {
		t.Fatal(err)
	}
	if got := must(ListState[int64](s, "offsets")).Get(); !slices.Equal(got, []int64{100, 101, 102, 103}) {
		t.Fatalf("offsets %v", got)
	}
	if got := must(UnionListState[string](s, "pending")).Get(); !slices.Equal(got, []string{"tx-1"}) {
		t.Fatalf("pending %v", got)
	}
	ro := must(ReadOnlyBroadcastState[string, float64](s, "rules"))
	if got := maps.Collect(ro.All()); !maps.Equal(got, rules) {
		t.Fatalf("rules %v", got)
	}
	// Snapshots are deterministic: the same state encodes the same.
	again, err := SnapshotOperator(s)
	if err != nil {
		t.Fatal(err)
	}
	if string(again) != string(data) {
		t.Fatal("restored state encodes otherwise")
	}
}

// RestoreOperatorStates hands each state out by its kind, as the
// Redistribute functions do with the decoded values.
func TestRestoreOperatorStatesRescale(t *testing.T) {
	rules := map[string]float64{"max": 40}
	for _, sc := range []struct{ oldP, newP int }{{1, 1}, {2, 1}, {1, 2}, {2, 3}, {3, 2}} {
		t.Run(fmt.Sprintf("%d->%d", sc.oldP, sc.newP), func(t *testing.T) {
			old := make([][]byte, sc.oldP)
			var oldOffsets, oldPending [][]int64
			for i := range old {
				old[i] = opSubtask(t, i, rules)
				var o []int64
				for j := range 3 + i {
					o = append(o, int64(100*i+j))
				}
				oldOffsets = append(oldOffsets, o)
				oldPending = append(oldPending, []int64{int64(i)})
			}
			wantLists := RedistributeList(oldOffsets, sc.newP)
			wantUnion := RedistributeUnion(oldPending, sc.newP)
			for j := range sc.newP {
				s, err := RestoreOperatorStates(old, j, sc.newP)
				if err != nil {
					t.Fatal(err)
				}
				if got := must(ListState[int64](s, "offsets")).Get(); !slices.Equal(got, wantLists[j]) {
					t.Fatalf("subtask %d: offsets %v, want %v", j, got, wantLists[j])
				}
				var want []string
				for _, p := range wantUnion[j] {
					want = append(want, fmt.Sprint("tx-", p))
				}
				if got := must(UnionListState[string](s, "pending")).Get(); !slices.Equal(got, want) {
					t.Fatalf("subtask %d: pending %v, want %v", j, got, want)
				}
				bs := must(BroadcastState[string, float64](s, "rules"))
				if got := maps.Collect(bs.All()); !maps.Equal(got, rules) {
					t.Fatalf("subtask %d: rules %v", j, got)
				}
			}
		})
	}
}

func TestRestoreOperatorStatesErrors(t *testing.T) {
	a := opSubtask(t, 0, map[string]float64{"max": 1})
	b := opSubtask(t, 1, map[string]float64{"max": 2})
	if _, err := RestoreOperatorStates([][]byte{a, b}, 0, 1); err == nil {
		t.Fatal("broadcast state that differs between subtasks restored")
	}
	if _, err := RestoreOperatorStates([][]byte{a}, 1, 1); err == nil {
		t.Fatal("subtask out of range")
	}
	// Another type under the same name in another subtask.
	s := NewOperatorStore()
	must(ListState[string](s, "offsets"))
	other, err := SnapshotOperator(s)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := RestoreOperatorStates([][]byte{a, other}, 0, 1); !errors.Is(err, ErrIncompatibleState) {
		t.Fatalf("states that differ between subtasks: %v", err)
	}
	// Registration with another type or kind.
	rs, err := RestoreOperator(a)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ListState[string](rs, "offsets"); !errors.Is(err, ErrIncompatibleState) {
		t.Fatalf("offsets as strings: %v", err)
	}
	if _, err := UnionListState[int64](rs, "offsets"); !errors.Is(err, ErrIncompatibleState) {
		t.Fatalf("offsets as a union list: %v", err)
	}
	// Not registered: carried into the next snapshot.
	again, err := SnapshotOperator(rs)
	if err != nil {
		t.Fatal(err)
	}
	if string(again) != string(a) {
		t.Fatal("unregistered restored state lost")
	}
	// Every flipped byte and every truncation is caught.
	for i := range a {
		bad := slices.Clone(a)
		bad[i] ^= 1
		if _, err := RestoreOperator(bad); !errors.Is(err, ErrCorruptSnapshot) {
			t.Fatalf("byte %d flipped: %v", i, err)
		}
	}
	for n := range len(a) {
		if _, err := RestoreOperator(a[:n]); !errors.Is(err, ErrCorruptSnapshot) {
			t.Fatalf("truncated to %d: %v", n, err)
		}
	}
	// A type without a codec cannot be snapshot.
	s = NewOperatorStore()
	must(ListState[hidden](s, "h"))
	if _, err := SnapshotOperator(s); err == nil {
		t.Fatal("snapshot of state without a codec")
	}
}

// Restored state that is not registered again counts: a snapshot keeps it.
func TestOperatorStoreLenCountsRestored(t *testing.T) {
	rs, err := RestoreOperator(opSubtask(t, 0, nil))
	if err != nil {
		t.Fatal(err)
	}
	if rs.Len() != 3 {
		t.Fatalf("Len = %d, want 3", rs.Len())
	}
	must(ListState[int64](rs, "offsets"))
	if rs.Len() != 3 {
		t.Fatalf("Len after registering one = %d, want 3", rs.Len())
	}
}

// At the same parallelism each subtask takes back its own list (a
// subtask restored alone, by a handover, must not take elements another
// running subtask still holds); union and broadcast states as ever.
func TestRestoreOperatorStatesSameParallelismKeepsOwnList(t *testing.T) {
	const p = 3
	old := make([][]byte, p)
	for i := range old {
		old[i] = opSubtask(t, i, map[string]float64{"max": 40})
	}
	for j := range p {
		s, err := RestoreOperatorStates(old, j, p)
		if err != nil {
			t.Fatal(err)
		}
		var want []int64
		for k := range 3 + j {
			want = append(want, int64(100*j+k))
		}
		if got := must(ListState[int64](s, "offsets")).Get(); !slices.Equal(got, want) {
			t.Fatalf("subtask %d: offsets %v, want its own %v", j, got, want)
		}
		if got := must(UnionListState[string](s, "pending")).Get(); len(got) != p {
			t.Fatalf("subtask %d: pending %v, want every subtask's", j, got)
		}
	}
}
