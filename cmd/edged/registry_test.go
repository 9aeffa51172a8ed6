package main

import (
	"log/slog"
	"runtime"
	"testing"

	"github.com/asynkron/protoactor-go/actor"
)

// TestActorSystemHeap creates a protoactor actor system, as every job start
// does, with the process set up as main sets it up (TestMain), and bounds
// the live heap it holds: with the registry's default 32 shards per map it
// held 2.8 MB, most of an idle node's live heap.
func TestActorSystemHeap(t *testing.T) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slog.New(slog.DiscardHandler)
	}))
	runtime.GC()
	runtime.ReadMemStats(&after)
	if sys.ProcessRegistry == nil || len(sys.ProcessRegistry.LocalPIDs.LocalPIDs) == 0 {
		t.Fatal("the actor system has no process registry: the heap measured is not the registry's")
	}
	sys.Shutdown()
	held := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("an actor system holds %d KB of heap", held>>10)
	if held > 512<<10 {
		t.Errorf("an actor system holds %d KB of heap; want at most 512 KB", held>>10)
	}
}
