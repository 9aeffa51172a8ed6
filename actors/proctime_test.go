package actors

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
)

// A processing-time timer beyond what a time.Duration holds (at
// math.MaxInt64, "never") arms the task's clock timer for the longest
// delay there is, and one far in the past for at once. Before, the delay
// (at-now)*1e6 wrapped: the one at math.MaxInt64 was armed to fire at
// once, and the task, finding nothing due, armed it again, over and over
// (a job with one such timer spent 3.45 s of CPU in 3 s).
func TestProcessingTimerAtTheInt64ExtremesArmsTheClock(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	now := start.UnixMilli()
	const longest = math.MaxInt64 / int64(time.Millisecond) // ms a time.Duration holds
	cases := []struct {
		at   int64
		wait bool // the clock timer waits: it is not armed to fire at once
	}{
		{math.MaxInt64, true},
		{now + longest, true},
		{now + 1000, true},
		{now, false},
		{now - 1000, false},
		{math.MinInt64, false},
	}
	for _, c := range cases {
		clk := clockwork.NewFakeClockAt(start)
		done := make(chan struct{})
		close(done) // a stopping host: a clock timer that fires sends nothing
		tk := &task{run: &host{cfg: Config{Clock: clk}, done: done}, started: true}
		tk.timers.add(tk, 0, c.at, func(int64) error { return nil })
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		waiting := clk.BlockUntilContext(ctx, 1) == nil
		if waiting != c.wait {
			t.Errorf("timer at %d (now %d): the clock timer waits %t, want %t", c.at, now, waiting, c.wait)
		}
		if c.wait {
			// It is armed no later than its time: one ms before it, the
			// clock timer has not fired.
			if c.at-now <= longest {
				clk.Advance(time.Duration(c.at-now-1) * time.Millisecond)
				if clk.BlockUntilContext(ctx, 1) != nil {
					t.Errorf("timer at %d fired before its time", c.at)
				}
			}
		}
		tk.timers.stop()
	}
}
