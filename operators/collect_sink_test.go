package operators

import (
	"slices"
	"sync"
	"testing"
)

func TestCollectSinkSubtasks(t *testing.T) {
	const p, n = 2, 2000
	store := NewCollectSink[int]()
	var wg sync.WaitGroup
	for s := range p {
		sink := store.Subtask()
		wg.Go(func() {
			if err := sink.Open(subtaskContext(s, p)); err != nil {
				t.Error(err)
				return
			}
			for i := range n {
				sink.Collect(s*n + i)
			}
			if err := sink.Finish(); err != nil {
				t.Error(err)
			}
			if err := sink.Close(); err != nil {
				t.Error(err)
			}
		})
	}
	// A reader while the subtasks write.
	wg.Go(func() {
		for range 100 {
			if l, v := store.Len(), store.Values(); len(v) < l {
				t.Errorf("Values() has %d records after Len() = %d", len(v), l)
				return
			}
		}
	})
	wg.Wait()

	got := store.Values()
	if len(got) != p*n || store.Len() != p*n {
		t.Fatalf("%d values, Len() = %d; want %d", len(got), store.Len(), p*n)
	}
	// Each subtask's records keep their order.
	last := []int{-1, -1}
	for _, v := range got {
		s := v / n
		if v <= last[s] {
			t.Fatalf("subtask %d: %d after %d", s, v, last[s])
		}
		last[s] = v
	}
	slices.Sort(got)
	for i, v := range got {
		if v != i {
			t.Fatalf("sorted values[%d] = %d", i, v)
		}
	}
}

func TestCollectSinkSharedInstance(t *testing.T) {
	sink := NewCollectSink[string]()
	var wg sync.WaitGroup
	for s := range 2 {
		wg.Go(func() {
			var op Sink[string] = sink
			op.Open(subtaskContext(s, 2))
			for range 500 {
				op.Collect("x")
			}
			op.Finish()
			op.Close()
		})
	}
	wg.Wait()
	if sink.Len() != 1000 {
		t.Errorf("Len() = %d, want 1000", sink.Len())
	}
}

func TestCollectSinkValuesIsACopy(t *testing.T) {
	sink := NewCollectSink[int]()
	sink.Collect(1)
	v := sink.Values()
	v[0] = 99
	if got := sink.Values(); got[0] != 1 {
		t.Errorf("changing Values() changed the sink: %v", got)
	}
}
