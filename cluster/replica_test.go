package cluster

import (
	"fmt"
	"slices"
	"syscall"
	"testing"
	"time"
)

// Targets are the same on every node, exclude the node itself, are
// bounded by the cluster's size, and change little when a member joins.
func TestReplicaTargets(t *testing.T) {
	ms := []string{"a", "b", "c", "d", "e"}
	for _, n := range ms {
		got := ReplicaTargets(n, ms, 2)
		if len(got) != 2 || slices.Contains(got, n) {
			t.Fatalf("%s: %v", n, got)
		}
		rev := slices.Clone(ms)
		slices.Reverse(rev)
		if again := ReplicaTargets(n, rev, 2); !slices.Equal(got, again) {
			t.Fatalf("%s: %v then %v", n, got, again)
		}
	}
	if got := ReplicaTargets("a", []string{"a", "b"}, 2); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("two nodes: %v", got)
	}
	if got := ReplicaTargets("a", []string{"a"}, 2); len(got) != 0 {
		t.Fatalf("one node: %v", got)
	}
	changed := 0
	for i := 0; i < 100; i++ {
		n := fmt.Sprintf("n%d", i)
		before := ReplicaTargets(n, append([]string{n}, ms...), 2)
		after := ReplicaTargets(n, append([]string{n, "f"}, ms...), 2)
		for _, p := range before {
			if !slices.Contains(after, p) {
				changed++
			}
		}
	}
	// A sixth other member enters a node's two targets in about 2 of 6
	// cases, displacing one: about 33 of the 200 targets change.
	if changed > 60 {
		t.Fatalf("a join changed %d of 200 replica targets", changed)
	}
	t.Logf("a join moved %d of 200 replica targets (ideal about 33)", changed)
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
