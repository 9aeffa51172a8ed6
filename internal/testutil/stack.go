package testutil

import (
	"runtime"
	"strings"
	"testing"
)

// Waiting reports whether the stack of a goroutine holds fn (a function
// as runtime.Stack prints it, "actors.(*Runner).TriggerSavepoint"): a
// test tells that a call it started has reached a wait it cannot observe
// otherwise. The whole dump is read, however many goroutines there are.
func Waiting(fn string) bool {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Contains(string(buf[:n]), fn)
		}
		buf = make([]byte, 2*len(buf))
	}
}

// CallUntilWaiting runs call on another goroutine and returns the channel
// its result comes on once a goroutine's stack holds fn: the call has
// reached the wait the test holds it in. The test fails when fn is
// already waiting before the call (its wait could not be told), when the
// call does not get there within DefaultTimeout, or when it returns
// before.
func CallUntilWaiting[T any](t testing.TB, fn string, call func() T) <-chan T {
	t.Helper()
	if Waiting(fn) {
		t.Fatalf("%s waits before the call: the call's wait cannot be told", fn)
	}
	out := make(chan T, 1)
	go func() { out <- call() }()
	Eventually(t, 0, "the call waits in "+fn, func() bool { return Waiting(fn) })
	select {
	case v := <-out:
		t.Fatalf("the call returned before it waited in %s: %+v", fn, v)
	default:
	}
	return out
}
