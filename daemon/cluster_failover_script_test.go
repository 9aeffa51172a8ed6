package daemon

import (
	"slices"
	"testing"
	"time"

	"github.com/edgedio/edged/actors"
	"github.com/edgedio/edged/internal/testutil"
)

// startedPlacement waits until the job master on node id runs a
// deployment above epoch and returns its placement and epoch.
func (fc *foCluster) startedPlacement(id string, above uint64) (map[actors.TaskKey]string, uint64) {
	fc.t.Helper()
	var p map[actors.TaskKey]string
	var epoch uint64
	testutil.Eventually(fc.t, time.Minute, "a deployment above the old epoch runs", func() bool {
		j := fc.job(id)
		if j == nil {
			return false
		}
		r, _ := j.run.Execution().Runner()
		if r == nil {
			return false
		}
		select {
		case <-r.Started():
		default:
			return false
		}
		p, epoch = placement(j)
		return epoch > above
	})
	return p, epoch
}

// onNode returns the subtasks p places on node.
func onNode(p map[actors.TaskKey]string, node string) []actors.TaskKey {
	var out []actors.TaskKey
	for k, n := range p {
		if n == node {
			out = append(out, k)
		}
	}
	slices.SortFunc(out, func(x, y actors.TaskKey) int {
		if x.UID != y.UID {
			if x.UID < y.UID {
				return -1
			}
			return 1
		}
		return x.Subtask - y.Subtask
	})
	return out
}

// Script: a worker dies. a leads; the job runs on a, b and c. After a
// checkpoint completes, c is killed. The leader, seeing it dead, places
// c's subtasks on a and b in a new epoch; they restore from the latest
// checkpoint: b reads c's state from its own replica when it holds one
// (cluster.replicas 2: every peer does), and fetches it from a peer that
// holds one when it does not (cluster.replicas 1: c's copy went to a);
// the sources rewind and the committed window counts are exact.
func TestFailoverScriptWorkerKilled(t *testing.T) {
	for _, tc := range []struct {
		name     string
		replicas int
		// from is where b reads c's state; held whether b holds a
		// replica of it.
		from string
		held bool
	}{
		{name: "own replica", replicas: 2, from: "b", held: true},
		{name: "fetched from a peer", replicas: 1, from: "a", held: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testWorkerKilled(t, tc.replicas, tc.from, tc.held)
		})
	}
}

func testWorkerKilled(t *testing.T, replicas int, wantFrom string, held bool) {
	fc := newFailoverCluster(t, replicas, 0)
	a, b := fc.nodes["a"], fc.nodes["b"]
	before, epoch0 := fc.startedPlacement("a", 0)
	onC := onNode(before, "c")
	if len(onC) == 0 {
		t.Fatalf("nothing placed on c: %v", before)
	}
	cp := fc.waitCheckpoint("a", 0)
	t.Logf("epoch %d, c runs %v; checkpoint %d completed", epoch0, onC, cp)

	fc.kill("c")
	// The membership loop's step on the leader once c is declared dead.
	a.c.live.follow(fc.aliveNow(), a.c.executions)

	after, epoch1 := fc.startedPlacement("a", epoch0)
	if n := onNode(after, "c"); len(n) > 0 {
		t.Fatalf("epoch %d still places %v on the dead node", epoch1, n)
	}
	var toB []actors.TaskKey
	for _, k := range onC {
		if after[k] == "b" {
			toB = append(toB, k)
		}
	}
	t.Logf("epoch %d: c's subtasks on b: %v", epoch1, toB)
	restores := fc.job("a").run.Restores()
	if len(restores) == 0 || restores[len(restores)-1] < cp {
		t.Fatalf("restored %v, want the latest checkpoint (at least %d)", restores, cp)
	}
	restored := restores[len(restores)-1]
	files := stateFiles(a.metadata(t, restored), toB)
	if len(files) == 0 {
		t.Fatalf("none of c's subtasks moved to b (%v) has state in snapshot %d: the restore path was not reached", toB, restored)
	}
	for f, h := range files {
		from := b.c.rep.readFromNode(restored, f)
		if from != wantFrom || b.holds(t, restored, h) != held {
			t.Fatalf("b restored c's %s of snapshot %d from %q, holding a replica %v; want from %q, holding %v",
				f, restored, from, b.holds(t, restored, h), wantFrom, held)
		}
	}
	t.Logf("b restored %d of c's state files of snapshot %d from %q", len(files), restored, wantFrom)
	fc.finish("a")
	fc.checkTotals()
	a.c.live.mu.Lock()
	fos := slices.Clone(a.c.live.failovers)
	a.c.live.mu.Unlock()
	if len(fos) != 1 || fos[0].DeadNode != "c" || fos[0].Epoch != epoch1 {
		t.Fatalf("failovers recorded %+v", fos)
	}
}
