package actors

import (
	"slices"
	"testing"

	"github.com/edgedio/edged/snapshot"
)

// mergeHistories keeps both attempts' entries in id order, the newer
// view of an id given twice, and only the newest snapshot.HistorySize.
func TestMergeHistories(t *testing.T) {
	st := func(id snapshot.ID, status snapshot.Status) snapshot.Stats {
		return snapshot.Stats{Checkpoint: id, Status: status}
	}
	prev := []snapshot.Stats{st(1, snapshot.Completed), st(2, snapshot.Completed), st(3, snapshot.InProgress)}
	cur := []snapshot.Stats{st(3, snapshot.Failed), st(5, snapshot.Completed)}
	got := mergeHistories(prev, cur)
	want := []snapshot.Stats{st(1, snapshot.Completed), st(2, snapshot.Completed), st(3, snapshot.Failed), st(5, snapshot.Completed)}
	if !slices.EqualFunc(got, want, func(a, b snapshot.Stats) bool { return a.Checkpoint == b.Checkpoint && a.Status == b.Status }) {
		t.Fatalf("merged %+v, want %+v", got, want)
	}
	if len(prev) != 3 || prev[2].Status != snapshot.InProgress {
		t.Fatalf("prev modified: %+v", prev)
	}
	var long []snapshot.Stats
	for id := range snapshot.ID(snapshot.HistorySize + 10) {
		long = append(long, st(id+1, snapshot.Completed))
	}
	got = mergeHistories(long[:20], long[20:])
	if len(got) != snapshot.HistorySize || got[0].Checkpoint != 11 || got[len(got)-1].Checkpoint != snapshot.HistorySize+10 {
		t.Fatalf("kept %d entries, %d..%d", len(got), got[0].Checkpoint, got[len(got)-1].Checkpoint)
	}
}
