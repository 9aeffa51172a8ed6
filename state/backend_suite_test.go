package state

import (
	"path/filepath"
	"testing"

	"github.com/jonboulle/clockwork"

	"github.com/edgedio/edged/keygroup"
)

// backendKind makes test backends of one kind. Every keyed-state test runs
// against each kind (forEachBackend): the memory backend is the model the
// bolt backend must behave like.
type backendKind struct {
	name string
	new  func(t testing.TB, r keygroup.Range, clk clockwork.Clock) Backend
}

// backendKinds are the memory backend and the bolt backend with its
// default batch, with a commit after every write, and with a commit every
// three writes (so commits fall in the middle of operations' sequences).
var backendKinds = []backendKind{
	{"memory", func(_ testing.TB, r keygroup.Range, clk clockwork.Clock) Backend { return NewMemoryBackend(r, clk) }},
	{"bolt", boltKind(0)},
	{"bolt-batch1", boltKind(1)},
	{"bolt-batch3", boltKind(3)},
}

func boltKind(batch int) func(testing.TB, keygroup.Range, clockwork.Clock) Backend {
	return func(t testing.TB, r keygroup.Range, clk clockwork.Clock) Backend {
		return newTestBolt(t, r, clk, batch)
	}
}

// newTestBolt opens a bolt backend in a temporary directory, closed when
// the test ends.
func newTestBolt(t testing.TB, r keygroup.Range, clk clockwork.Clock, batch int) *BoltBackend {
	t.Helper()
	path := filepath.Join(t.TempDir(), "state.db")
	// Many stay open at once: keep their address space small on 32-bit targets.
	b, err := NewBoltBackend(path, r, clk, BoltOptions{BatchSize: batch, InitialMmapSize: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Error(err)
		}
	})
	return b
}

// forEachBackend runs f as a subtest per backend kind. newTestBackend
// returns a new backend of that kind over testGroups and its fake clock;
// the tests name their parameter after the package-level memory-only
// helper, which it shadows.
func forEachBackend(t *testing.T, f func(t *testing.T, newTestBackend func() (Backend, *clockwork.FakeClock))) {
	for _, k := range backendKinds {
		t.Run(k.name, func(t *testing.T) {
			f(t, func() (Backend, *clockwork.FakeClock) {
				clk := clockwork.NewFakeClock()
				return k.new(t, testGroups, clk), clk
			})
		})
	}
}
