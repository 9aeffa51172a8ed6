package state

import (
	"github.com/jonboulle/clockwork"

	"github.com/edgedio/edged/keygroup"
)

// testGroups is the key-group range of the test backends.
var testGroups = keygroup.Range{Start: 10, End: 20}

// newTestBackend returns a memory backend over testGroups on a fake clock.
func newTestBackend() (*MemoryBackend, *clockwork.FakeClock) {
	clk := clockwork.NewFakeClock()
	return NewMemoryBackend(testGroups, clk), clk
}

// must returns v, or panics with err: for setting up handles in tests,
// where an error is a bug of the test.
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// window is a namespace type for tests.
type window struct{ Start, End int64 }

// hiddenWindow is a namespace type without a codec: its fields are
// unexported.
type hiddenWindow struct{ start, end int64 }
