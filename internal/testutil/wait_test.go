package testutil

import (
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestWithinSeesCondition(t *testing.T) {
	var n atomic.Int64
	go func() {
		for i := 0; i < 10; i++ {
			n.Add(1)
		}
	}()
	if !Within(5*time.Second, func() bool { return n.Load() == 10 }) {
		t.Fatal("condition that becomes true was not seen")
	}
}

func TestWithinTimesOut(t *testing.T) {
	start := time.Now()
	if Within(20*time.Millisecond, func() bool { return false }) {
		t.Fatal("a condition that never holds was reported as holding")
	}
	if time.Since(start) < 20*time.Millisecond {
		t.Fatal("returned before the timeout")
	}
}

func TestBurnStopsWithTheTest(t *testing.T) {
	t.Run("burn", func(t *testing.T) { Burn(t, 2) })
	// goleak in TestMain fails the package if the burners outlive the test.
}

func TestReceiveReturnsTheValueSent(t *testing.T) {
	ch := make(chan int, 1)
	ch <- 7
	if v := Receive(t, 0, "the value", ch); v != 7 {
		t.Fatalf("Receive returned %d, want 7", v)
	}
}

func TestWaiting(t *testing.T) {
	release := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		blockInWaitingTest(release)
	}()
	Eventually(t, DefaultTimeout, "the goroutine blocks", func() bool {
		return Waiting("testutil.blockInWaitingTest")
	})
	close(release)
	<-done
	if Waiting("testutil.blockInWaitingTest") {
		t.Error("the goroutine returned, its function is still seen waiting")
	}
}

//go:noinline
func blockInWaitingTest(release <-chan struct{}) { <-release }
