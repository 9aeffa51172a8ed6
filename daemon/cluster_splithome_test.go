package daemon

import (
	"testing"

	"github.com/edgedio/edged/actors"
	"github.com/edgedio/edged/cluster"
	"github.com/edgedio/edged/operators"
)

// A split placed away from its node waits for it only when the node is
// back in a run its placement did not see, runs the same pipelines, is
// not leaving, and its split is not pinned on another node.
func TestBackSincePlaced(t *testing.T) {
	same := func(cluster.Meta) bool { return false }
	other := func(cluster.Meta) bool { return true }
	placed := map[string]string{"a": "a1", "b": "b1", "d": pinnedAway}
	for _, c := range []struct {
		name   string
		m      cluster.Meta
		boots  map[string]string
		differ func(cluster.Meta) bool
		want   bool
	}{
		{"gone at the placement, back", cluster.Meta{ID: "c", Boot: "c2"}, placed, same, true},
		{"restarted since the placement", cluster.Meta{ID: "b", Boot: "b2"}, placed, same, true},
		{"alive at the placement (drained)", cluster.Meta{ID: "b", Boot: "b1"}, placed, same, false},
		{"leaving", cluster.Meta{ID: "c", Boot: "c2", Leaving: true}, placed, same, false},
		{"other pipelines", cluster.Meta{ID: "c", Boot: "c2"}, placed, other, false},
		{"split pinned away", cluster.Meta{ID: "d", Boot: "d2"}, placed, same, false},
		{"placement not recorded", cluster.Meta{ID: "c", Boot: "c2"}, nil, same, false},
	} {
		if got := backSincePlaced(c.m, c.boots, c.differ); got != c.want {
			t.Errorf("%s: backSincePlaced = %v, want %v", c.name, got, c.want)
		}
	}
}

// The nodes whose source split cluster.placement puts on another node
// are marked pinned away; the other sources and operators do not count.
func TestSplitsPinnedAway(t *testing.T) {
	src := func(*operators.Context) (operators.Operator, error) { return nil, nil }
	job := &actors.Job{Vertices: []*actors.Vertex{
		{UID: "p/source", Parallelism: 3, NewSource: src},
		{UID: "p/window", Parallelism: 3},
		{UID: "p/other-source", Parallelism: 1, NewSource: src},
	}}
	ids := []string{"a", "b", "c"}
	placement := map[actors.TaskKey]string{
		{UID: "p/source", Subtask: 0}: "a", {UID: "p/source", Subtask: 1}: "b", {UID: "p/source", Subtask: 2}: "a",
		{UID: "p/window", Subtask: 1}: "a",
	}
	got := splitsPinnedAway(job, ids, placement)
	if len(got) != 1 || got[0] != "c" {
		t.Fatalf("splitsPinnedAway = %v, want [c]", got)
	}
	boots := withPinnedAway(map[string]string{"a": "a1", "c": "c1"}, got)
	if boots["c"] != pinnedAway || boots["a"] != "a1" {
		t.Fatalf("withPinnedAway = %v", boots)
	}
}
