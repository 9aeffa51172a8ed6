package snapshot

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// CommittedFile is the name of the mark MarkCommitted leaves in the
// directory of a snapshot that ended its job (a final checkpoint, a
// stop-with-savepoint) once every task of the job has handled the
// notification of its completion: every sink committed (published) what
// it holds.
const CommittedFile = "_committed"

// committedContents is the mark's contents, for a person reading it.
const committedContents = "every sink committed this snapshot\n"

// MarkCommitted writes CommittedFile into the snapshot directory dir
// (atomically, fsynced with its directory). The job master calls it when
// the job ended with its final checkpoint or stop-with-savepoint
// committed by every task. A job started again on a final checkpoint then
// runs nothing and restores nothing, and one resumed from a savepoint
// restores its state but no sink publishes the output it holds again
// (operators.Context.RestoredCommitted). Without the mark (the process
// died between the metadata and the commits) the restore lets the sinks
// commit again what the snapshot holds.
func MarkCommitted(dir string) error {
	if err := writeAtomic(dir, CommittedFile, []byte(committedContents)); err != nil {
		return fmt.Errorf("mark snapshot committed: %w", err)
	}
	return nil
}

// committed reports whether dir holds CommittedFile.
func committed(dir string) (bool, error) {
	_, err := os.Stat(filepath.Join(dir, CommittedFile))
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, fs.ErrNotExist):
		return false, nil
	default:
		return false, err
	}
}
