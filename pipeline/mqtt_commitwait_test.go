package pipeline

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/mqtt"
)

// commitWaitRun runs waitCommitted on a fake clock with a wait that
// fails with the errors of fails in turn (nil once they are used up),
// and returns the clock, the calls of wait so far and the result.
type commitWaitRun struct {
	clock *clockwork.FakeClock
	calls chan int
	done  chan struct{}
	res   chan error
}

func startCommitWait(t *testing.T, bound time.Duration, fails ...error) *commitWaitRun {
	t.Helper()
	r := &commitWaitRun{clock: clockwork.NewFakeClock(), calls: make(chan int, 100), done: make(chan struct{}), res: make(chan error, 1)}
	n := 0
	wait := func() error {
		n++
		r.calls <- n
		if n <= len(fails) {
			return fails[n-1]
		}
		return nil
	}
	go func() { r.res <- waitCommitted(wait, r.clock, r.done, bound, nil, 7) }()
	return r
}

// advance waits until waitCommitted waits on its pause timer and moves
// the clock on by d.
func (r *commitWaitRun) advance(t *testing.T, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.clock.BlockUntilContext(ctx, 1); err != nil {
		t.Fatalf("waitCommitted never paused for its next try: %v", err)
	}
	r.clock.Advance(d)
}

func publishDown(i int) error {
	return fmt.Errorf("write-ahead sink: publish checkpoint %d: mqtt: %w: connect: connection refused", i, mqtt.ErrPublish)
}

// TestCommitWaitOutlastsABrokerOutage: the last checkpoint of a stopping
// job is committed once the broker takes its results again, within the
// bound, after pauses of 1 s, 2 s, 4 s and 5 s; before, the first failed
// publish failed the stop.
func TestCommitWaitOutlastsABrokerOutage(t *testing.T) {
	r := startCommitWait(t, 30*time.Second, publishDown(1), publishDown(2), publishDown(3), publishDown(4))
	testutil.Receive(t, 10*time.Second, "the first try", r.calls)
	for i, pause := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 5 * time.Second} {
		r.advance(t, pause-time.Millisecond)
		select {
		case n := <-r.calls:
			t.Fatalf("try %d came before its pause of %v ended", n, pause)
		case err := <-r.res:
			t.Fatalf("waitCommitted returned %v before try %d", err, i+2)
		default:
		}
		r.clock.Advance(time.Millisecond)
		if n := testutil.Receive(t, 10*time.Second, "the next try", r.calls); n != i+2 {
			t.Fatalf("try %d, want %d", n, i+2)
		}
	}
	if err := testutil.Receive(t, 10*time.Second, "waitCommitted's result", r.res); err != nil {
		t.Fatalf("waitCommitted: %v after the broker took the results, want nil", err)
	}
}

// TestCommitWaitGivesUpAtTheBound: a broker that stays away fails the
// commit once the bound has passed (the last pause cut to it), with the
// publish failure and the bound in the error.
func TestCommitWaitGivesUpAtTheBound(t *testing.T) {
	fails := make([]error, 50)
	for i := range fails {
		fails[i] = publishDown(i)
	}
	r := startCommitWait(t, 10*time.Second, fails...)
	testutil.Receive(t, 10*time.Second, "the first try", r.calls)
	// 1 + 2 + 4 s, then 3 s (the rest of the 10 s).
	for _, pause := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 3 * time.Second} {
		r.advance(t, pause)
		testutil.Receive(t, 10*time.Second, "the next try", r.calls)
	}
	err := testutil.Receive(t, 10*time.Second, "waitCommitted's result", r.res)
	if !errors.Is(err, mqtt.ErrPublish) {
		t.Fatalf("waitCommitted: %v, want the publish failure", err)
	}
	if want := "did not take them within 10s"; !strings.Contains(err.Error(), want) {
		t.Fatalf("waitCommitted: %q does not say %q", err, want)
	}
	if n := len(r.calls); n != 0 {
		t.Fatalf("%d more tries after the bound", n)
	}
}

// TestCommitWaitEndsAtOnce: a failure that is no publish failure, a
// bound of 0, and the subtask's done closed during a pause each end the
// wait with the error, without another try.
func TestCommitWaitEndsAtOnce(t *testing.T) {
	other := errors.New("write-ahead sink: publish panicked")
	r := startCommitWait(t, 30*time.Second, other)
	if err := testutil.Receive(t, 10*time.Second, "waitCommitted's result", r.res); err != other {
		t.Fatalf("waitCommitted: %v, want %v", err, other)
	}
	r = startCommitWait(t, 0, publishDown(1))
	if err := testutil.Receive(t, 10*time.Second, "waitCommitted's result", r.res); !errors.Is(err, mqtt.ErrPublish) {
		t.Fatalf("waitCommitted with no bound: %v, want the publish failure", err)
	}
	r = startCommitWait(t, 30*time.Second, publishDown(1), publishDown(2))
	testutil.Receive(t, 10*time.Second, "the first try", r.calls)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.clock.BlockUntilContext(ctx, 1); err != nil {
		t.Fatal(err)
	}
	close(r.done)
	if err := testutil.Receive(t, 10*time.Second, "waitCommitted's result", r.res); !errors.Is(err, mqtt.ErrPublish) {
		t.Fatalf("waitCommitted after done: %v, want the publish failure", err)
	}
	if n := len(r.calls); n != 0 {
		t.Fatalf("%d more calls of wait after done, want none", n)
	}
}

// TestCommitWaitBoundCountsFromTheFirstTry: the bound runs from the start
// of the wait, so a first try that takes 25 s (a hung broker, until the
// publisher's acknowledgement timeout) leaves 5 s of a 30 s bound: tries
// after 1 s, 2 s and 2 s (the rest), then the stop fails; the stop's
// own bound (twice this one) is not outrun.
func TestCommitWaitBoundCountsFromTheFirstTry(t *testing.T) {
	clk := clockwork.NewFakeClock()
	calls := make(chan int, 100)
	n := 0
	wait := func() error {
		n++
		if n == 1 {
			clk.Advance(25 * time.Second)
		}
		calls <- n
		return publishDown(n)
	}
	res := make(chan error, 1)
	go func() { res <- waitCommitted(wait, clk, nil, 30*time.Second, nil, 7) }()
	r := &commitWaitRun{clock: clk}
	testutil.Receive(t, 10*time.Second, "the first try", calls)
	for _, pause := range []time.Duration{time.Second, 2 * time.Second, 2 * time.Second} {
		r.advance(t, pause)
		testutil.Receive(t, 10*time.Second, "the next try", calls)
	}
	if err := testutil.Receive(t, 10*time.Second, "waitCommitted's result", res); !errors.Is(err, mqtt.ErrPublish) {
		t.Fatalf("waitCommitted: %v, want the publish failure", err)
	}
	if got := len(calls); got != 0 {
		t.Fatalf("%d more tries after the bound", got)
	}
}
