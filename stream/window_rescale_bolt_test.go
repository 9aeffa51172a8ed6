package stream_test

import (
	"testing"

	"github.com/edgedio/edged/stream"
)

// The windows and timers of TestWindowsAndTimersAcrossRescaleOneThreeTwo
// on the bolt backend, stopped with a savepoint at parallelism 2, resumed
// at 3, stopped again and resumed at 1: sessions, sliding windows within
// their allowed lateness, their late-data side outputs and event-time
// timers commit what the run without the stops commits.
func TestWindowsAndTimersAcrossRescaleTwoThreeOneOnBolt(t *testing.T) {
	windowsAcrossRescales(t, [3]int{2, 3, 1}, func() stream.Option { return stream.WithBoltStateBackend(t.TempDir()) })
}
