package daemon

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/stream"
)

// stuckJob starts a job whose sink blocks, deaf to cancellation, until
// release is closed: its run does not end when cancelled. With a nil
// release the sink does not block and the job ends when cancelled.
func stuckJob(t *testing.T, name string, release <-chan struct{}) *job {
	t.Helper()
	env := stream.NewEnvironment(name)
	entered := make(chan struct{}, 1)
	stream.FromSource(env, "gen", func() operators.Source[operators.SensorReading] {
		return operators.SensorGenerator(operators.GeneratorConfig{Count: 0, Rate: 100, Keys: 1})
	}).ForEach("stuck", func(operators.SensorReading) error {
		select {
		case entered <- struct{}{}:
		default:
		}
		if release != nil {
			<-release
		}
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	sj, err := env.ExecuteAsync(ctx)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	select {
	case <-entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the job never reached its sink")
	}
	return &job{name: name, run: sj, cancelFn: cancel, status: StatusRunning}
}

// The node's side of a yield whose jobs do not end when cancelled:
// cancelJobs reports them, dropJobs keeps them listed (and reachable by
// name), and recancelJobs forgets each once it ended; a job that ended in
// time is dropped at once.
func TestYieldKeepsJobsThatDidNotEnd(t *testing.T) {
	release := make(chan struct{})
	n := &node{log: slog.New(slog.DiscardHandler), byName: map[string]*job{}}
	stuck := stuckJob(t, "stuck", release)
	free := stuckJob(t, "free", nil)
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
		<-stuck.run.Done()
	})
	n.addJob(stuck)
	n.addJob(free)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	left := n.cancelJobs(ctx)
	cancel()
	if left != 1 || !ended(free) {
		t.Fatalf("%d jobs left running (the free one ended: %v), want the stuck one", left, ended(free))
	}
	n.dropJobs()
	if got := n.jobList(); len(got) != 1 || got[0] != stuck {
		t.Fatalf("%d jobs listed after the drop, want the stuck one still running", len(got))
	}
	if j, err := n.job(context.Background(), "stuck"); err != nil || j != stuck {
		t.Fatalf("the running job is not found by name: %v", err)
	}
	// A takeover meanwhile does not start a second run of it.
	if !n.lingers("stuck") || n.lingers("free") {
		t.Fatalf("lingers: stuck %v, free %v; want only the stuck one", n.lingers("stuck"), n.lingers("free"))
	}
	close(release)
	testutil.Eventually(t, 30*time.Second, "the stuck job ended", func() bool { return ended(stuck) })
	if n.lingers("stuck") {
		t.Fatal("an ended run still keeps a takeover from starting its job")
	}
	ctx, cancel = context.WithTimeout(context.Background(), 200*time.Millisecond)
	left = n.recancelJobs(ctx)
	cancel()
	if left != 0 {
		t.Fatalf("%d jobs left after the stuck one ended", left)
	}
	if _, err := n.job(context.Background(), "stuck"); err == nil || len(n.jobList()) != 0 {
		t.Fatalf("the ended job is still listed (%d jobs)", len(n.jobList()))
	}
}
