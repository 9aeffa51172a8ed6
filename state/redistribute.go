package state

import (
	"fmt"
	"maps"
	"reflect"
	"slices"

	"github.com/edgedio/edged/keygroup"
)

// The functions of this file decide which state each subtask gets when a
// job is restored with another parallelism. They are pure: the snapshot
// code reads the old subtasks' state, calls them, and installs the result.
// Every returned slice and map is new: no two subtasks share one, and none
// aliases the input. They panic if newParallelism is below 1.

// RedistributeList hands out ListState: the old subtasks' lists are
// concatenated in subtask order and split into newParallelism contiguous
// parts whose sizes differ by at most one (the first parts are the longer
// ones). The order of the elements is kept.
func RedistributeList[V any](old [][]V, newParallelism int) [][]V {
	mustParallelism(newParallelism)
	all := slices.Concat(old...)
	out := make([][]V, newParallelism)
	size, extra := len(all)/newParallelism, len(all)%newParallelism
	at := 0
	for i := range out {
		n := size
		if i < extra {
			n++
		}
		if n > 0 {
			out[i] = slices.Clone(all[at : at+n])
		}
		at += n
	}
	return out
}

// RedistributeUnion hands out UnionListState: every new subtask gets the
// concatenation of the old subtasks' lists, in subtask order.
func RedistributeUnion[V any](old [][]V, newParallelism int) [][]V {
	mustParallelism(newParallelism)
	all := slices.Concat(old...)
	out := make([][]V, newParallelism)
	for i := range out {
		if len(all) > 0 {
			out[i] = slices.Clone(all)
		}
	}
	return out
}

// RedistributeBroadcast hands out BroadcastState: every new subtask gets a
// copy of old[0] (empty maps when old is empty). It returns an error if
// the old subtasks' maps differ, which means the broadcast side did not
// update every subtask alike. Values are compared with reflect.DeepEqual,
// once per restore, not per record.
func RedistributeBroadcast[K comparable, V any](old []map[K]V, newParallelism int) ([]map[K]V, error) {
	mustParallelism(newParallelism)
	var first map[K]V
	if len(old) > 0 {
		first = old[0]
	}
	for i := 1; i < len(old); i++ {
		if len(old[i]) != len(first) {
			return nil, fmt.Errorf("state: broadcast state differs: subtask 0 has %d entries, subtask %d has %d", len(first), i, len(old[i]))
		}
		for k, v := range first {
			w, ok := old[i][k]
			if !ok {
				return nil, fmt.Errorf("state: broadcast state differs: subtask %d lacks key %v of subtask 0", i, k)
			}
			if !reflect.DeepEqual(v, w) {
				return nil, fmt.Errorf("state: broadcast state differs: key %v is %v in subtask 0, %v in subtask %d", k, v, w, i)
			}
		}
	}
	out := make([]map[K]V, newParallelism)
	for i := range out {
		out[i] = maps.Clone(first)
		if out[i] == nil {
			out[i] = make(map[K]V)
		}
	}
	return out, nil
}

// KeyedRestoreSources returns, for each of newParallelism subtasks, the old
// subtasks (of oldParallelism) whose key-group ranges intersect its own,
// in increasing order: the snapshots a new subtask reads its key groups
// from. It panics if either parallelism does not fit maxParallelism (see
// keygroup.Validate).
func KeyedRestoreSources(maxParallelism, oldParallelism, newParallelism int) [][]int {
	for _, p := range []int{oldParallelism, newParallelism} {
		if err := keygroup.Validate(p, maxParallelism); err != nil {
			panic(fmt.Sprintf("state: KeyedRestoreSources: %v", err))
		}
	}
	out := make([][]int, newParallelism)
	for i := range out {
		r := keygroup.RangeFor(i, newParallelism, maxParallelism)
		if r.Len() == 0 {
			continue
		}
		from := keygroup.Subtask(r.Start, oldParallelism, maxParallelism)
		to := keygroup.Subtask(r.End-1, oldParallelism, maxParallelism)
		for j := from; j <= to; j++ {
			out[i] = append(out[i], j)
		}
	}
	return out
}

func mustParallelism(n int) {
	if n < 1 {
		panic(fmt.Sprintf("state: new parallelism %d must be at least 1", n))
	}
}
