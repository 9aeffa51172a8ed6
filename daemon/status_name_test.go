package daemon

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/edgedio/edged/snapshot"
)

// A savepoint path the snapshot store refuses once the savepoint began
// (one in the job's checkpoints directory) is the caller's mistake: 400,
// as the paths refused before it began, not 500.
func TestSavepointPathRefusedByTheStoreIsABadRequest(t *testing.T) {
	err := fmt.Errorf("savepoint of job %q: savepoint 7: snapshot: checkpoint declined by p/source[0]: begin savepoint 7: %w: in the checkpoints directory", "p", snapshot.ErrName)
	if got := statusOf(err); got != http.StatusBadRequest {
		t.Fatalf("statusOf(%v) = %d, want %d", err, got, http.StatusBadRequest)
	}
}
