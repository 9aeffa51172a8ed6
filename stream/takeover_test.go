package stream_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/edgedio/edged/cluster"
	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/snapshot"
	"github.com/edgedio/edged/stream"
)

// ownFiles records the state files the job master's own node pushes (to
// the peers that keep replicas of them) before its acknowledgements.
type ownFiles struct {
	*masterFiles
	own atomic.Int64
}

func (o *ownFiles) Push(ctx context.Context, master, job string, epoch uint64, id snapshot.ID, path string, h snapshot.Handle) error {
	if master == "node-0" {
		if _, err := os.Stat(path); err != nil {
			return err
		}
		o.own.Add(1)
		return nil
	}
	return o.masterFiles.Push(ctx, master, job, epoch, id, path, h)
}

// A job master that took over from another (actors.Cluster.NextCheckpoint
// set above the ids the other triggered) numbers every checkpoint from
// there; the master's own state files go through Cluster.Files before its
// acknowledgements count; every committed snapshot is published
// (Cluster.Publish) before its completion is announced, and a snapshot
// whose publication fails is aborted and never announced. What the sinks
// committed equals the failure-free run.
func TestMultiProcessTakeoverHooks(t *testing.T) {
	testutil.Burn(t, 1)
	const n, keys = 100_000, 200
	const next = snapshot.ID(1000)
	want := t.TempDir()
	if err := execute(t, eoJob(n, keys, want, nil, stream.WithParallelism(2))); err != nil {
		t.Fatal(err)
	}
	wantLines := committedLines(t, want)

	got := t.TempDir()
	c := memoryCluster(t, 3, 1, cluster.Faults{})
	files := &masterFiles{}
	own := &ownFiles{masterFiles: files}
	var mu sync.Mutex
	var published []snapshot.ID
	var refused atomic.Int64
	var refusedID snapshot.ID
	cfg := checkpointConfig(t, snapshot.ExactlyOnce)
	cfg.TolerableFailures = 100
	opts := func() []stream.Option {
		return []stream.Option{
			stream.WithParallelism(2),
			stream.WithCheckpointing(cfg),
			stream.WithRestartStrategy(&snapshot.FixedDelay{Attempts: 30}),
			stream.WithCluster(c.Cluster)}
	}
	workerCluster(t, c, files, func() *stream.Environment { return eoJob(n, keys, got, nil, opts()...) })
	c.NextCheckpoint = next
	c.Files = own
	c.Publish = func(_ context.Context, epoch uint64, md *snapshot.Metadata) error {
		if _, err := os.Stat(filepath.Join(md.Dir, "_metadata")); err != nil {
			t.Errorf("snapshot %d published before it was committed: %v", md.Checkpoint, err)
		}
		if epoch <= 100 {
			t.Errorf("snapshot %d published in epoch %d, not above the epoch base", md.Checkpoint, epoch)
		}
		mu.Lock()
		if len(published) == 1 && refusedID == 0 {
			// One publication fails: that snapshot must not count.
			refusedID = md.Checkpoint
			mu.Unlock()
			refused.Add(1)
			return errors.New("a node is unreachable")
		}
		published = append(published, md.Checkpoint)
		mu.Unlock()
		return nil
	}
	env := eoJob(n, keys, got, nil, opts()...)
	c.spread(t, env)
	job := runWithFiles(t, env, files)
	checkCommitted(t, got, wantLines)
	mu.Lock()
	defer mu.Unlock()
	if len(published) == 0 || refused.Load() != 1 {
		t.Fatalf("published %v, %d refused: the hook was not reached", published, refused.Load())
	}
	for _, id := range published {
		if id < next {
			t.Fatalf("snapshot %d published: below the first id %d of a master that took over", id, next)
		}
	}
	for _, s := range job.History() {
		if s.Checkpoint < next {
			t.Fatalf("checkpoint %d taken: below %d", s.Checkpoint, next)
		}
		if s.Checkpoint == refusedID && s.Status == snapshot.Completed {
			t.Fatalf("checkpoint %d completed though its publication failed", s.Checkpoint)
		}
	}
	if own.own.Load() == 0 || files.pushed.Load() == 0 {
		t.Fatalf("%d own state files replicated, %d pushed by workers: the master's files skipped Cluster.Files", own.own.Load(), files.pushed.Load())
	}
}
