package actors

import (
	"testing"

	"github.com/edgedio/edged/internal/testutil"
)

// ran returns a run that reports on done when it ran.
func ran(done chan<- int, i int) func() {
	return func() { done <- i }
}

func TestDispatcherRunsOnTheGoroutineItKept(t *testing.T) {
	d := newDispatcher()
	defer d.stop()
	done := make(chan int, 1)
	for i := range 20 {
		d.Schedule(ran(done, i))
		if got := testutil.Receive(t, 0, "the run", done); got != i {
			t.Fatalf("run %d reported %d", i, got)
		}
		testutil.Eventually(t, 0, "the goroutine idle again", func() bool { return d.waiting.Load() == 1 })
	}
	if n := d.spawned.Load(); n != 1 {
		t.Fatalf("20 runs one after the other started %d goroutines, want 1", n)
	}
}

func TestDispatcherRunNeverWaitsForAnother(t *testing.T) {
	d := newDispatcher()
	release := make(chan struct{})
	d.Schedule(func() { <-release }) // a task blocked in its mailbox
	done := make(chan int, 1)
	d.Schedule(ran(done, 1))
	testutil.Receive(t, 0, "the second run while the first is blocked", done)
	if n := d.spawned.Load(); n != 2 {
		t.Fatalf("started %d goroutines, want 2", n)
	}
	testutil.Eventually(t, 0, "the second goroutine idle", func() bool { return d.waiting.Load() == 1 })
	d.stop()
	testutil.Eventually(t, 0, "the idle goroutine gone", func() bool { return d.waiting.Load() == 0 })
	d.Schedule(ran(done, 2)) // after stop, on a goroutine of its own
	testutil.Receive(t, 0, "a run scheduled after stop", done)
	close(release)
	// goleak (TestMain) fails the package if a goroutine stays.
}
