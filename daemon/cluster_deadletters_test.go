package daemon

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
)

// The workers' counts are read at most once per peerDeadLettersTTL, and
// a worker that does not answer keeps the count last read from it.
func TestPeerDeadLetterCountsKeptAndReused(t *testing.T) {
	var d deadLetterCounts
	var n atomic.Int64
	down := false
	read := func(_ context.Context, node string) (map[string]workerDeadLetters, error) {
		r := n.Add(1)
		if down && node == "c" {
			return nil, errors.New("unreachable")
		}
		return map[string]workerDeadLetters{"j": {Total: 10 * r}}, nil
	}
	nodes := []string{"b", "c"}
	got := d.peerCounts(context.Background(), nodes, read)
	if n.Load() != 2 || got["b"]["j"].Total == 0 || got["c"]["j"].Total == 0 {
		t.Fatalf("first reading: %d reads, %v", n.Load(), got)
	}
	if again := d.peerCounts(context.Background(), nodes, read); n.Load() != 2 || again["c"]["j"].Total != got["c"]["j"].Total {
		t.Fatalf("a second reading within the TTL read %d times: %v", n.Load(), again)
	}
	d.read = d.read.Add(-peerDeadLettersTTL)
	down = true
	later := d.peerCounts(context.Background(), nodes, read)
	if n.Load() != 4 || later["c"]["j"].Total != got["c"]["j"].Total || later["b"]["j"].Total <= got["b"]["j"].Total {
		t.Fatalf("c down: %d reads, %v (before %v): want c's last count kept, b's new one", n.Load(), later, got)
	}
}
