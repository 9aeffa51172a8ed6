package actors

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/snapshot"
)

// slowFiles is a SnapshotFiles whose fetches for the epochs in hold wait
// until their channel is closed or their context ends.
type slowFiles struct {
	hold     map[uint64]chan struct{}
	fetching chan uint64
}

func (f *slowFiles) Push(context.Context, string, string, uint64, snapshot.ID, string, snapshot.Handle) error {
	return nil
}

func (f *slowFiles) Fetch(ctx context.Context, _, _ string, epoch uint64, _ snapshot.ID, _ snapshot.Handle, path string) error {
	f.fetching <- epoch
	if c := f.hold[epoch]; c != nil {
		select {
		case <-c:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return os.WriteFile(path, []byte("state"), 0o644)
}

// restoringWorker returns a worker whose state files come from files,
// and the deployment of a job restoring a snapshot on it, by epoch.
func restoringWorker(t *testing.T, files *slowFiles) (*Worker, func(epoch uint64) Deployment) {
	t.Helper()
	var emitted, consumed atomic.Int64
	gate := make(chan struct{})
	close(gate)
	job := twoStageJob(&countingSource{n: 10, emitted: &emitted}, &gateSink{gate: gate, count: &consumed})
	w := NewWorker(WorkerConfig{Node: "w", Network: newLoopNet(), Dir: t.TempDir(), Files: files,
		Jobs: func(string) (*Job, Config, error) { return job, DefaultConfig(), nil }})
	t.Cleanup(w.Close)
	md, err := snapshot.EncodeMetadata(&snapshot.Metadata{Job: job.Name, MaxParallelism: 128, Checkpoint: 7, Kind: snapshot.KindCheckpoint,
		Operators: []snapshot.Operator{{UID: "sink", Parallelism: 1, Subtasks: []snapshot.Handle{{File: "sink-0", Size: 5}}}}})
	if err != nil {
		t.Fatal(err)
	}
	return w, func(epoch uint64) Deployment {
		return Deployment{Job: job.Name, Epoch: epoch, Index: 1, Master: "m", Nodes: []string{"m", "w"},
			Placement:     []PlacedTask{{UID: "src", Subtask: 0, Node: "w"}, {UID: "sink", Subtask: 0, Node: "w"}},
			Checkpointing: true, Mode: snapshot.ExactlyOnce, Restore: md}
	}
}

// A deployment whose state files are slow to come, and a newer one of the
// same job asked for meanwhile (a master that restarted its job while its
// invitation was under way): the newer one is hosted, and the older one
// is refused with ErrStaleDeployment, then and when asked for again. The
// older one hosted last, as before, hid the newer host from the worker:
// its tasks ran on unseen while the older host waited for a master that
// had moved on.
func TestWorkerNewerDeploymentWinsOverASlowerOlderOne(t *testing.T) {
	release := make(chan struct{})
	files := &slowFiles{hold: map[uint64]chan struct{}{301: release}, fetching: make(chan uint64, 4)}
	w, deployment := restoringWorker(t, files)
	ctx := context.Background()
	older := make(chan error, 1)
	go func() { older <- w.Deploy(ctx, deployment(301)) }()
	if e := testutil.Receive(t, 0, "the older deployment to fetch its files", files.fetching); e != 301 {
		t.Fatalf("fetch for epoch %d, want 301", e)
	}
	if err := w.Deploy(ctx, deployment(302)); err != nil {
		t.Fatalf("the newer deployment: %v", err)
	}
	close(release)
	if err := testutil.Receive(t, 0, "the older deployment to return", older); !errors.Is(err, ErrStaleDeployment) {
		t.Fatalf("the older deployment returned %v, want ErrStaleDeployment", err)
	}
	if jobs := w.Jobs(); len(jobs) != 1 || jobs[0].Epoch != 302 {
		t.Fatalf("the worker hosts %+v, want epoch 302", jobs)
	}
	if err := w.Deploy(ctx, deployment(301)); !errors.Is(err, ErrStaleDeployment) {
		t.Fatalf("the older deployment asked for again: %v, want ErrStaleDeployment", err)
	}
	// The same epoch again (a node released from a deployment and invited
	// back into it) is still taken once its host ended.
	w.Evict()
	if err := w.Deploy(ctx, deployment(302)); err != nil {
		t.Fatalf("epoch 302 again after its host ended: %v", err)
	}
}

// A deployment whose state files are slow to come, and the worker evicted
// meanwhile (its node lost the majority): the deployment returns
// ErrEvicted at once and hosts nothing. Before, Evict stopped only the
// hosts it found, and the deployment was hosted once its files came:
// the node ran subtasks it no longer owned.
func TestWorkerEvictEndsADeploymentInProgress(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	files := &slowFiles{hold: map[uint64]chan struct{}{5: release, 6: release}, fetching: make(chan uint64, 4)}
	w, deployment := restoringWorker(t, files)
	for _, c := range []struct {
		epoch uint64
		stop  func()
	}{{5, func() { w.Evict() }}, {6, w.Close}} {
		res := make(chan error, 1)
		go func() { res <- w.Deploy(context.Background(), deployment(c.epoch)) }()
		testutil.Receive(t, 0, "the deployment to fetch its files", files.fetching)
		c.stop()
		err := testutil.Receive(t, 0, "the deployment to return", res)
		if c.epoch == 5 && !errors.Is(err, ErrEvicted) {
			t.Fatalf("epoch %d returned %v, want ErrEvicted", c.epoch, err)
		}
		if err == nil {
			t.Fatalf("epoch %d was hosted after the worker's eviction", c.epoch)
		}
		if jobs := w.Jobs(); len(jobs) != 0 {
			t.Fatalf("the worker hosts %+v after its eviction, want nothing", jobs)
		}
	}
}

// The staging directory holds only what the deployments of the running
// process write: a new worker removes what an earlier run of its node
// left there (a kill -9 or a power loss ends a deployment without its
// teardown). Before, each killed deployment's directory stayed for good,
// with the copies of the state files its restore fetched.
func TestNewWorkerRemovesWhatAnEarlierRunStaged(t *testing.T) {
	dir := t.TempDir()
	for _, p := range []string{"sensors-12884901891/restore/sensors%2Fsource.0.state", "sensors-12884901892/checkpoints/chk-40/sensors%2Fsource.0.state", "other-7/handover-3-w-0/x.state"} {
		path := filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte("state"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	w := NewWorker(WorkerConfig{Node: "w", Network: newLoopNet(), Dir: dir})
	defer w.Close()
	left, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 0 {
		var names []string
		for _, e := range left {
			names = append(names, e.Name())
		}
		t.Fatalf("the staging directory holds %v from an earlier run, want nothing", names)
	}
	// A worker whose staging directory does not exist yet starts too.
	NewWorker(WorkerConfig{Node: "w", Network: newLoopNet(), Dir: filepath.Join(dir, "none")}).Close()
}
