package snapshot

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// CommittedFile is the name of the mark MarkCommitted leaves in a final
// checkpoint's directory once every task of the job has handled the
// notification of its completion: every sink committed (published) what
// it holds.
const CommittedFile = "_committed"

// committedContents is the mark's contents, for a person reading it.
const committedContents = "every sink committed this final checkpoint\n"

// MarkCommitted writes CommittedFile into the snapshot directory dir
// (atomically, fsynced with its directory). The job master calls it when
// the job ended with its final checkpoint committed by every task; a job
// started again on that checkpoint then runs nothing and restores
// nothing, so its sinks do not commit (publish) the checkpoint's output
// a second time. Without the mark (the process died between the metadata
// and the commits) the restore lets the sinks commit again what the
// checkpoint holds.
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
