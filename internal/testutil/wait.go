package testutil

import (
	"runtime"
	"sync"
	"testing"
	"time"
)

// DefaultTimeout is how long Eventually waits when the caller passes 0: long
// enough for a loaded 2-core CI machine, short enough to fail a hung test.
const DefaultTimeout = 30 * time.Second

// Eventually waits until cond returns true, polling it, and fails the test
// with what if it has not by timeout (DefaultTimeout when 0). It is the one
// bounded wait the tests use; cond must be cheap and safe to call from the
// test goroutine.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Within(timeout, cond) {
		t.Fatalf("timed out after %v waiting for %s", orDefault(timeout), what)
	}
}

// Within polls cond until it returns true or timeout (DefaultTimeout when 0)
// passes, and reports whether it did. For callers that must not fail the test
// from the goroutine they run on.
func Within(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(orDefault(timeout))
	wait := 100 * time.Microsecond
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(wait) // polling interval of a bounded wait, not synchronisation
		if wait < 20*time.Millisecond {
			wait *= 2
		}
	}
	return true
}

func orDefault(d time.Duration) time.Duration {
	if d <= 0 {
		return DefaultTimeout
	}
	return d
}

// Burn keeps n goroutines spinning on the CPU until the test ends, so the
// code under test runs under contention (n <= 0 means runtime.NumCPU()).
// Exactly-once and recovery tests use it: their races show only on a busy
// machine.
func Burn(t testing.TB, n int) {
	t.Helper()
	if n <= 0 {
		n = runtime.NumCPU()
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			x := uint64(i + 1)
			for {
				select {
				case <-stop:
					return
				default:
				}
				for j := 0; j < 1<<16; j++ {
					x ^= x << 13
					x ^= x >> 7
					x ^= x << 17
				}
				runtime.Gosched()
			}
		}()
	}
	t.Cleanup(func() {
		close(stop)
		wg.Wait()
	})
}

// Receive waits up to timeout (DefaultTimeout when 0) for a value on ch
// and returns it; it fails the test, naming what, if none comes.
func Receive[T any](t testing.TB, timeout time.Duration, what string, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(orDefault(timeout)):
		t.Fatalf("timed out after %v waiting for %s", orDefault(timeout), what)
		var zero T
		return zero
	}
}
