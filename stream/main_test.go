package stream_test

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// protoactor starts a one-second timer goroutine on an actor
	// system's first dead letter (its log throttle); it ends by itself,
	// sometimes after the last test.
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("github.com/asynkron/protoactor-go/actor.NewDeadLetter.NewThrottle.func4.1"))
}
