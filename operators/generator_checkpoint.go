package operators

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// ErrRescaleSource is returned when a source is restored with another
// parallelism than it was snapshotted at and cannot redistribute its
// position.
var ErrRescaleSource = errors.New("operators: source cannot be restored with another parallelism")

// SnapshotState returns the generator's position: the next global index
// this subtask emits. Replaying from it gives the same records.
func (g *Generator[T]) SnapshotState(int64) ([]byte, error) {
	return binary.AppendVarint(nil, g.Position()), nil
}

// RestoreState makes the generator go on from its snapshotted position.
// The position is a global index: at another parallelism every new
// subtask is given all old positions, and from parallelism 1 that is one
// position every new subtask goes on from (each from its own next index
// at or after it). From a larger parallelism the old subtasks' positions
// differ and no one of them is right for a new subtask: ErrRescaleSource.
func (g *Generator[T]) RestoreState(states [][]byte, oldParallelism int) error {
	if len(states) != 1 {
		now := "another"
		if g.stride > 0 { // opened: the runtime restores after Open
			now = fmt.Sprintf("parallelism %d", g.stride)
		}
		return fmt.Errorf("%w: generator snapshotted at parallelism %d, restored at %s", ErrRescaleSource, oldParallelism, now)
	}
	pos, n := binary.Varint(states[0])
	if n <= 0 {
		return fmt.Errorf("operators: generator: corrupt position %x", states[0])
	}
	g.SetPosition(pos)
	return nil
}
