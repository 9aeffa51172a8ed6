package stream_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgedio/edged/actors"
	"github.com/edgedio/edged/cluster"
	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/snapshot"
	"github.com/edgedio/edged/stream"
)

// workerHandoverRun is the handover job on a 3-node in-memory cluster
// whose nodes but the first (the job master's) run as workers, as nodes
// in other processes do: they talk to the master only over their control
// channels and move state files through masterFiles.
type workerHandoverRun struct {
	c       *testCluster
	job     *stream.Job
	files   *masterFiles
	workers map[string]*actors.Worker
	out     string
	seen    *atomic.Int64
	from    string // the node count-sum[0] runs on
	to      string // the node it moves to
}

// startWorkerHandover starts the run with count-sum[0] on node from and
// count-sum[1] on node other; hook is the cluster's handover hook.
func startWorkerHandover(t *testing.T, n int64, keys int, from, other string, hook func(*workerHandoverRun) func(actors.HandoverStep, string) error, setup func(*workerHandoverRun)) *workerHandoverRun {
	return startWorkerHandoverOn(t, 3, n, keys, from, other, hook, setup)
}

// startWorkerHandoverOn is startWorkerHandover with nodes nodes, of which
// the job is deployed on the first three; the fourth, when there is one,
// is a worker outside the deployment that a move to it invites (the
// cluster's Update then names the nodes of later attempts).
func startWorkerHandoverOn(t *testing.T, nodes int, n int64, keys int, from, other string, hook func(*workerHandoverRun) func(actors.HandoverStep, string) error, setup func(*workerHandoverRun)) *workerHandoverRun {
	t.Helper()
	c := memoryCluster(t, nodes, 1, cluster.Faults{})
	c.ControlTimeout = 3 * time.Second
	hr := &workerHandoverRun{c: c, files: &masterFiles{}, out: t.TempDir(), seen: &atomic.Int64{}, from: from}
	if hook != nil {
		c.HandoverHook = hook(hr)
	}
	cp := handoverCheckpoints(t)
	opts := func() []stream.Option {
		return []stream.Option{
			stream.WithCheckpointing(cp),
			stream.WithRestartStrategy(&snapshot.FixedDelay{Attempts: 5}),
			stream.WithCredits(256),
			stream.WithCluster(c.Cluster)}
	}
	// Every node's graph counts what its own gate subtasks see.
	hr.workers = workerCluster(t, c, hr.files, func() *stream.Environment {
		return handoverJob(n, keys, 100_000, hr.out, hr.seen, nil, opts()...)
	})
	if nodes > 3 {
		c.Nodes = c.Nodes[:3]
		hr.to = "node-3"
	}
	env := handoverJob(n, keys, 100_000, hr.out, hr.seen, nil, opts()...)
	c.spread(t, env)
	c.Placement[actors.TaskKey{UID: "count-sum", Subtask: 0}] = from
	c.Placement[actors.TaskKey{UID: "count-sum", Subtask: 1}] = other
	for _, nd := range c.Nodes {
		if nd.ID != from && nd.ID != other && hr.to == "" {
			hr.to = nd.ID
		}
	}
	if nodes > 3 {
		deployed, placement := slices.Clone(c.Nodes), maps.Clone(c.Placement)
		c.Update = func() ([]actors.Node, map[actors.TaskKey]string, error) { return deployed, placement, nil }
	}
	if setup != nil {
		setup(hr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	job, err := env.ExecuteAsync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	hr.job = job
	hr.files.job.Store(job)
	testutil.Eventually(t, 0, "a quarter of the records read", func() bool { return hr.seen.Load() >= n/4 })
	return hr
}

// recordsInAnywhere returns count-sum[sub]'s records-in counter, from the
// master's hosts or the workers', and whether the subtask runs.
func (hr *workerHandoverRun) recordsInAnywhere(sub int) (int64, bool) {
	if r, _ := hr.job.Execution().Runner(); r != nil {
		if v, ok := recordsIn(r.Metrics(), sub); ok {
			return v, true
		}
	}
	for _, w := range hr.workers {
		for _, j := range w.Jobs() {
			if v, ok := recordsIn(j.Tasks, sub); ok {
				return v, true
			}
		}
	}
	return 0, false
}

func (hr *workerHandoverRun) workerHandovers() int64 {
	var n int64
	for _, w := range hr.workers {
		n += w.Handovers()
	}
	return n
}

func (hr *workerHandoverRun) finish(t *testing.T, want []string) {
	t.Helper()
	finishMoved(t, hr.job, hr.out, want)
}

// A keyed subtask moves between nodes in other processes than the job
// master's (and from the master's node to one): the handover's commands
// cross the control channels, the new node fetches the subtask's state
// files of the savepoint, the job does not restart, the other subtask of
// the operator keeps processing while the moved one is handed over, and
// the committed output equals a run without a move.
func TestHandoverAcrossProcesses(t *testing.T) {
	const n, keys = 300_000, 100
	want := handoverReference(t, n, keys)
	for _, tc := range []struct {
		name, from, other string
		// nodes: 4 when the move is to a node outside the deployment.
		nodes int
		// workerSteps: the subtasks retired or adopted on workers.
		workerSteps int64
	}{
		{"worker_to_worker", "node-1", "node-0", 3, 2},
		{"master_to_worker", "node-0", "node-1", 3, 1},
		{"worker_to_master", "node-2", "node-1", 3, 1},
		{"worker_to_joining_node", "node-1", "node-0", 4, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testutil.Burn(t, 1)
			var during atomic.Int64
			hr := startWorkerHandoverOn(t, tc.nodes, n, keys, tc.from, tc.other, func(hr *workerHandoverRun) func(actors.HandoverStep, string) error {
				return func(step actors.HandoverStep, node string) error {
					if step != actors.HandoverRestore {
						return nil
					}
					before, ok := hr.recordsInAnywhere(1)
					if !ok {
						return errors.New("count-sum[1] is gone")
					}
					if _, ok := hr.recordsInAnywhere(0); ok {
						return errors.New("count-sum[0] still runs after it was retired")
					}
					testutil.Eventually(t, 0, "count-sum[1] processes records while count-sum[0] is handed over", func() bool {
						now, _ := hr.recordsInAnywhere(1)
						during.Store(now - before)
						return now-before >= 1000 || hr.seen.Load() >= n
					})
					return nil
				}
			}, nil)
			fetched := hr.files.fetched.Load()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			res, err := hr.job.Execution().Move(ctx, []actors.Move{{UID: "count-sum", Subtask: 0, To: hr.to}})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("moved %+v; took %v; count-sum[1] processed %d records meanwhile", res.Moved, res.Took, during.Load())
			if len(res.Moved) != 1 || res.Moved[0].From != tc.from || res.Moved[0].To != hr.to || res.Moved[0].Inputs != 2 {
				t.Fatalf("moved %+v, want count-sum[0] from %s to %s with its 2 inputs re-pointed", res.Moved, tc.from, hr.to)
			}
			r, _ := hr.job.Execution().Runner()
			if got := r.NodeOf("count-sum", 0); got != hr.to {
				t.Fatalf("count-sum[0] runs on %q, want %q", got, hr.to)
			}
			if got := hr.workerHandovers(); got != tc.workerSteps {
				t.Fatalf("workers retired or adopted %d subtasks, want %d", got, tc.workerSteps)
			}
			if got := r.Handovers(); got != 2-tc.workerSteps {
				t.Fatalf("the master's node retired or adopted %d subtasks, want %d", got, 2-tc.workerSteps)
			}
			if hr.to != "node-0" && hr.files.fetched.Load() == fetched {
				t.Fatal("the new node fetched no state file of the savepoint")
			}
			if during.Load() < 1000 && hr.seen.Load() < n {
				t.Fatalf("count-sum[1] processed %d records while count-sum[0] was handed over", during.Load())
			}
			hr.finish(t, want)
			if a := hr.job.Attempts(); a != 1 {
				t.Fatalf("%d attempts: the job restarted", a)
			}
			hr.c.checkCrossed(t)
		})
	}
}

// testWorkerHandoverFallback fails a handover between two workers and
// checks that the move fails with ErrHandover and the job restarts with
// the placement from before it, with exactly the output of a run without
// a move.
func testWorkerHandoverFallback(t *testing.T, failed *atomic.Bool, hook func(*workerHandoverRun) func(actors.HandoverStep, string) error, setup func(*workerHandoverRun)) {
	testutil.Burn(t, 1)
	const n, keys = 300_000, 100
	want := handoverReference(t, n, keys)
	hr := startWorkerHandover(t, n, keys, "node-1", "node-0", hook, setup)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := hr.job.Execution().Move(ctx, []actors.Move{{UID: "count-sum", Subtask: 0, To: hr.to}})
	if !errors.Is(err, actors.ErrHandover) {
		t.Fatalf("move: %v, want ErrHandover", err)
	}
	if !failed.Load() {
		t.Fatal("the failure under test was not injected")
	}
	t.Log(err)
	testutil.Eventually(t, 0, "the job restarted", func() bool { return hr.job.Attempts() >= 2 })
	r, changed := hr.job.Execution().Runner()
	for r == nil || r.Epoch() == 101 {
		<-changed
		r, changed = hr.job.Execution().Runner()
	}
	if got := r.NodeOf("count-sum", 0); got != hr.from {
		t.Fatalf("after the fallback count-sum[0] runs on %q, want %q (the placement before the handover)", got, hr.from)
	}
	hr.finish(t, want)
	t.Logf("attempts %d, restores %v", hr.job.Attempts(), hr.job.Restores())
}

// The old owner's process dies after its subtask snapshotted at the
// handover's barrier, before it retires it: the master hears nothing
// more from it, the handover fails with ErrHandover and the whole job
// restarts with the old placement; the output is exact.
func TestHandoverAcrossProcessesOldOwnerDies(t *testing.T) {
	var failed atomic.Bool
	testWorkerHandoverFallback(t, &failed, func(hr *workerHandoverRun) func(actors.HandoverStep, string) error {
		return func(step actors.HandoverStep, node string) error {
			if step == actors.HandoverRetire && node == hr.from && failed.CompareAndSwap(false, true) {
				hr.workers[node].Evict()
			}
			return nil
		}
	}, nil)
}

// The new owner's process dies while it fetches the moved subtask's
// state files (the old owner already retired it): its step fails, the
// handover fails with ErrHandover and the whole job restarts with the
// old placement; the output is exact.
func TestHandoverAcrossProcessesNewOwnerDiesMidRestore(t *testing.T) {
	var failed, moving atomic.Bool
	testWorkerHandoverFallback(t, &failed, func(hr *workerHandoverRun) func(actors.HandoverStep, string) error {
		return func(step actors.HandoverStep, node string) error {
			if step == actors.HandoverRestore && node == hr.to {
				moving.Store(true)
			}
			return nil
		}
	}, func(hr *workerHandoverRun) {
		hr.files.onFetch = func(id snapshot.ID, h snapshot.Handle) error {
			if !moving.Load() || !failed.CompareAndSwap(false, true) {
				return nil
			}
			// The worker's host stops once its step returned.
			go hr.workers[hr.to].Evict()
			return fmt.Errorf("node %s died while fetching %s of savepoint %d", hr.to, h.File, id)
		}
	})
}
