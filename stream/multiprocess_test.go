package stream_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgedio/edged/actors"
	"github.com/edgedio/edged/cluster"
	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/snapshot"
	"github.com/edgedio/edged/stream"
)

// masterFiles moves state files between the workers and the job master
// of this process, as the daemon does over its REST API between
// processes.
type masterFiles struct {
	job             atomic.Pointer[stream.Job]
	pushed, fetched atomic.Int64
	// onFetch, when set, is called before each fetch of a file of
	// snapshot id: an error fails the fetch.
	onFetch func(id snapshot.ID, h snapshot.Handle) error
}

func (m *masterFiles) Push(_ context.Context, _, _ string, epoch uint64, id snapshot.ID, path string, h snapshot.Handle) error {
	j := m.job.Load()
	if j == nil {
		return fmt.Errorf("no job master")
	}
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := j.Execution().ReceiveFile(epoch, id, h.File, h.Size, h.Checksum, f); err != nil {
		return err
	}
	m.pushed.Add(1)
	return nil
}

func (m *masterFiles) Fetch(_ context.Context, _, _ string, epoch uint64, id snapshot.ID, h snapshot.Handle, path string) error {
	if m.onFetch != nil {
		if err := m.onFetch(id, h); err != nil {
			return err
		}
	}
	j := m.job.Load()
	if j == nil {
		return fmt.Errorf("no job master")
	}
	f, _, err := j.Execution().OpenRestoreFile(epoch, h.File)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := snapshot.CopyFile(f, h, path); err != nil {
		return err
	}
	m.fetched.Add(1)
	return nil
}

// workerCluster turns c's nodes but the first into workers: each builds
// the job graph with build, has a checkpoint directory of its own, and is
// invited by the job master, as nodes in other processes are. It returns
// the workers by node id.
func workerCluster(t *testing.T, c *testCluster, files *masterFiles, build func() *stream.Environment) map[string]*actors.Worker {
	t.Helper()
	workers := make(map[string]*actors.Worker)
	for i := 1; i < len(c.Nodes); i++ {
		w := actors.NewWorker(actors.WorkerConfig{
			Node: c.Nodes[i].ID, Network: c.nets[i], Dir: t.TempDir(), Files: files,
			Jobs: func(string) (*actors.Job, actors.Config, error) {
				env := build()
				j, err := env.Graph()
				return j, env.Config(), err
			},
		})
		t.Cleanup(w.Close)
		workers[c.Nodes[i].ID] = w
		c.Nodes[i].Network = nil
	}
	c.Invite = func(ctx context.Context, node string, d actors.Deployment) error {
		return workers[node].Deploy(ctx, d)
	}
	c.EpochBase = 100
	return workers
}

// runWithFiles runs env, whose job master moves state files through
// files, waits up to three minutes for the job to end, and returns it.
func runWithFiles(t *testing.T, env *stream.Environment, files *masterFiles) *stream.Job {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	job, err := env.ExecuteAsync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	files.job.Store(job)
	if err := job.Wait(); err != nil {
		t.Fatal(err)
	}
	return job
}

// checkCommitted fails t unless what the sinks committed in dir equals
// want, the lines of the failure-free run.
func checkCommitted(t *testing.T, dir string, want []string) {
	t.Helper()
	got := committedLines(t, dir)
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("committed output differs from the failure-free run: %d lines vs %d\n%s", len(got), len(want), diffLines(got, want))
	}
}

// Task failures on a job whose nodes run as in separate processes: each
// worker node writes its snapshot files in its own directory and pushes
// them to the job master before acknowledging, and after each failure
// fetches the files it restores from the master. What the sinks committed
// equals the failure-free run in one process.
func TestMultiProcessExactlyOnceUnderFailures(t *testing.T) {
	testutil.Burn(t, 1)
	const n, keys = 400_000, 500
	want := t.TempDir()
	if err := execute(t, eoJob(n, keys, want, nil, stream.WithParallelism(2))); err != nil {
		t.Fatal(err)
	}
	wantLines := committedLines(t, want)

	fail := newFailer(3)
	got := t.TempDir()
	c := memoryCluster(t, 3, 1, cluster.Faults{})
	files := &masterFiles{}
	opts := func() []stream.Option {
		return []stream.Option{
			stream.WithParallelism(2),
			stream.WithCheckpointing(checkpointConfig(t, snapshot.ExactlyOnce)),
			stream.WithRestartStrategy(&snapshot.FixedDelay{Attempts: 30}),
			stream.WithCluster(c.Cluster)}
	}
	gen := pacedGenerator(n, keys, time.Second)
	workerCluster(t, c, files, func() *stream.Environment { return eoJobFrom(gen, got, fail, opts()...) })
	env := eoJobFrom(gen, got, fail, opts()...)
	c.spread(t, env)
	job := runWithFiles(t, env, files)
	c.checkCrossed(t)
	t.Logf("%d task failures; %d attempts; restored checkpoints %v; %d state files pushed, %d fetched",
		fail.fired.Load(), job.Attempts(), job.Restores(), files.pushed.Load(), files.fetched.Load())
	checkCommitted(t, got, wantLines)
	if fail.fired.Load() < 1 || len(job.Restores()) < 1 {
		t.Fatalf("%d failures, restores %v: no failure was followed by a restore", fail.fired.Load(), job.Restores())
	}
	if files.pushed.Load() == 0 {
		t.Fatal("no worker pushed a state file: the workers' snapshots never reached the master")
	}
	restored := false
	for _, id := range job.Restores() {
		restored = restored || id != 0
	}
	if restored && files.fetched.Load() == 0 {
		t.Fatal("a checkpoint was restored and no worker fetched a state file")
	}
}
