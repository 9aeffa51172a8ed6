package stream_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/snapshot"
	"github.com/edgedio/edged/stream"
)

// While a job waits out its restart delay after a failed attempt, its
// execution says it is restarting and why the attempt failed; once the
// next attempt runs it no longer restarts, and the failure stays known.
func TestExecutionReportsRestartingAndLastFailure(t *testing.T) {
	clock := clockwork.NewFakeClock()
	var attempt atomic.Int64
	env := stream.NewEnvironment("flaky", stream.WithClock(clock),
		stream.WithRestartStrategy(&snapshot.FixedDelay{Attempts: 1, Delay: time.Minute}))
	stream.FromSource(env, "src", ints(10)).To("sink", func() operators.Sink[int64] {
		return operators.NewSinkFunc(func(int64) error {
			if attempt.Load() == 0 {
				return errors.New("disk full")
			}
			return nil
		})
	})
	job, err := env.ExecuteAsync(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	e := job.Execution()
	testutil.Eventually(t, 0, "the first attempt failed", e.Restarting)
	failure, at := e.LastFailure()
	if failure == nil || !strings.Contains(failure.Error(), "disk full") || !at.Equal(clock.Now()) {
		t.Fatalf("last failure %v at %v, want disk full at %v", failure, at, clock.Now())
	}
	if r, _ := e.Runner(); r != nil {
		t.Fatal("an attempt runs during the restart delay")
	}
	attempt.Store(1)
	if err := clock.BlockUntilContext(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Minute)
	if err := job.Wait(); err != nil {
		t.Fatal(err)
	}
	if e.Restarting() || job.Attempts() != 2 {
		t.Fatalf("after the second attempt: restarting %v, %d attempts", e.Restarting(), job.Attempts())
	}
	if failure, _ := e.LastFailure(); failure == nil {
		t.Fatal("the failure was forgotten")
	}
}
