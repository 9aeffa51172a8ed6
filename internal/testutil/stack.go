package testutil

import (
	"runtime"
	"strings"
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
