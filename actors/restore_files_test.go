package actors

import (
	"fmt"
	"maps"
	"slices"
	"testing"

	"github.com/edgedio/edged/codec"
	"github.com/edgedio/edged/snapshot"
)

// A node adopting one moved subtask fetches only the state files its
// restore reads: of the chain's operators, the old subtasks holding its
// key groups, every file with operator state, and at the same
// parallelism its own raw state; nothing of other operators.
func TestRestoreFilesOfOneSubtask(t *testing.T) {
	handles := func(uid string, p int, sec sections) snapshot.Operator {
		op := snapshot.Operator{UID: uid, Parallelism: p}
		for i := range p {
			kg, err := codec.For[sections]().Append(nil, sec)
			if err != nil {
				t.Fatal(err)
			}
			op.Subtasks = append(op.Subtasks, snapshot.Handle{File: fmt.Sprintf("%s-%d", uid, i), Size: 100, KeyGroups: kg})
		}
		return op
	}
	keyedOnly := sections{RawLen: -1, KeyedLen: 10}
	md := &snapshot.Metadata{MaxParallelism: 128, Operators: []snapshot.Operator{
		handles("other", 4, keyedOnly),                       // not in the chain
		handles("rawop", 4, sections{RawLen: 5}),             // raw state: its own file
		handles("shared", 4, sections{RawLen: -1, OpLen: 3}), // operator state: every file
		handles("window", 4, keyedOnly),                      // keyed: the old subtask with its key groups
	}}
	chain := &Chain{Vertices: []*Vertex{
		{UID: "window", Parallelism: 4, Keyed: true},
		{UID: "rawop", Parallelism: 4},
		{UID: "shared", Parallelism: 4},
	}}
	got, err := restoreFiles(md, chain, 1)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"rawop-1", "shared-0", "shared-1", "shared-2", "shared-3", "window-1"}
	if keys := slices.Sorted(maps.Keys(got)); !slices.Equal(keys, want) {
		t.Fatalf("files: %v, want %v", keys, want)
	}

	// Rescaled (the chain runs at 2 where the snapshot had 4): subtask 1
	// takes the key groups of old subtasks 2 and 3, and every raw state.
	chain = &Chain{Vertices: []*Vertex{{UID: "window", Parallelism: 2, Keyed: true}, {UID: "rawop", Parallelism: 2}}}
	got, err = restoreFiles(md, chain, 1)
	if err != nil {
		t.Fatal(err)
	}
	want = []string{"rawop-0", "rawop-1", "rawop-2", "rawop-3", "window-2", "window-3"}
	if keys := slices.Sorted(maps.Keys(got)); !slices.Equal(keys, want) {
		t.Fatalf("rescaled files: %v, want %v", keys, want)
	}
}
