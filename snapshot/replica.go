package snapshot

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/edgedio/edged/internal/fsutil"
)

// A store on a node of a cluster also keeps copies of the snapshots the
// job master on another node completed: the state files the node wrote
// or holds replicas of (ImportReplica), and the metadata of every
// completed snapshot (AddMetadata), in the same layout, so that the node
// can restore the job from its own disk through RecoveryPoint once the
// files it lacks are copied in.

// ImportReplica stores a copy of state file name of checkpoint id that a
// node of the cluster wrote, in the checkpoint's directory (created when
// needed; the store need not have begun it). The size bytes read from r
// are kept only when they match size and checksum (see Import).
func (s *Store) ImportReplica(id ID, name string, size int64, checksum uint32, r io.Reader) error {
	if err := checkImportName(name); err != nil {
		return fmt.Errorf("import replica into snapshot %d: %w", id, err)
	}
	dir := s.CheckpointDir(id)
	_, statErr := os.Stat(dir)
	var err error
	for range 3 {
		if err = os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("import replica %s of snapshot %d: %w", name, id, err)
		}
		err = writeChecked(filepath.Join(dir, name), r, size, checksum)
		if !errors.Is(err, fs.ErrNotExist) {
			break
		}
		// A failed copy of another file removed the directory between
		// MkdirAll and the creation of this file (before anything of r
		// was read): make it again.
	}
	if err != nil {
		if errors.Is(statErr, fs.ErrNotExist) {
			// The directory made for this copy alone goes with it (Remove
			// leaves one that another copy came into meanwhile): retention
			// keeps the directories newer than its newest checkpoint, so
			// one a failed copy left would stay for good.
			_ = os.Remove(dir)
		}
		return fmt.Errorf("import replica %s of snapshot %d: %w", name, id, err)
	}
	return nil
}

func checkImportName(name string) error {
	if name == "" || name != filepath.Base(name) || strings.HasPrefix(name, ".") || name == metadataFile || strings.HasPrefix(name, "_") {
		return fmt.Errorf("%w: %q", ErrName, name)
	}
	return nil
}

// AddMetadata records md, a snapshot the job master completed on another
// node, in the store: its _metadata is written, last and atomically, in
// the directory that holds the state files the store has of it. A
// savepoint's directory then moves to savepoints/sp-<id>-<timestamp>.
// The state files md names that the store lacks may be copied in later
// (ImportReplica); until then Latest and RecoveryPoint skip it. It sets
// md.Dir and returns it; extra, when set, is written beside _metadata
// under its name (which must start with '_').
func (s *Store) AddMetadata(md *Metadata, extraName string, extra []byte) (string, error) {
	if md.Job != s.job {
		return "", fmt.Errorf("add metadata of snapshot %d: %w: job %q, not %q", md.Checkpoint, ErrJobMismatch, md.Job, s.job)
	}
	if err := md.Validate(); err != nil {
		return "", fmt.Errorf("add metadata of snapshot %d: %w", md.Checkpoint, err)
	}
	if extraName != "" && (!strings.HasPrefix(extraName, "_") || extraName != filepath.Base(extraName) || extraName == metadataFile) {
		return "", fmt.Errorf("add metadata of snapshot %d: %w: %q", md.Checkpoint, ErrName, extraName)
	}
	b, err := EncodeMetadata(md)
	if err != nil {
		return "", fmt.Errorf("add metadata of snapshot %d: %w", md.Checkpoint, err)
	}
	dir := s.CheckpointDir(md.Checkpoint)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("add metadata of snapshot %d: %w", md.Checkpoint, err)
	}
	if extraName != "" {
		if err := writeAtomic(dir, extraName, extra); err != nil {
			return "", fmt.Errorf("add metadata of snapshot %d: %w", md.Checkpoint, err)
		}
	}
	if err := writeAtomic(dir, metadataFile, b); err != nil {
		return "", fmt.Errorf("add metadata of snapshot %d: %w", md.Checkpoint, err)
	}
	if md.Kind == KindSavepoint {
		sp := filepath.Join(s.root, savepointsDir, fmt.Sprintf("sp-%d-%d", md.Checkpoint, md.Timestamp))
		if _, err := os.Stat(filepath.Join(sp, metadataFile)); err == nil {
			// The store holds the savepoint already (its own, or a copy
			// added before): what it holds stays, state files included;
			// files only the new directory has join it.
			if err := mergeInto(sp, dir); err != nil {
				return "", fmt.Errorf("add metadata of savepoint %d: %w", md.Checkpoint, err)
			}
			md.Dir = sp
			return sp, nil
		}
		if err := os.RemoveAll(sp); err != nil {
			return "", fmt.Errorf("add metadata of savepoint %d: %w", md.Checkpoint, err)
		}
		if err := os.Rename(dir, sp); err != nil {
			return "", fmt.Errorf("add metadata of savepoint %d: %w", md.Checkpoint, err)
		}
		dir = sp
	}
	if err := fsutil.SyncDir(filepath.Dir(dir)); err != nil {
		return "", fmt.Errorf("add metadata of snapshot %d: %w", md.Checkpoint, err)
	}
	md.Dir = dir
	return dir, nil
}

// Completed returns the snapshots of the store with metadata, checkpoints
// and savepoints, newest first, without verifying their state files (Dir
// is set). A directory whose metadata cannot be read is skipped.
func (s *Store) Completed() ([]*Metadata, error) {
	var out []*Metadata
	for _, sub := range []string{checkpointsDir, savepointsDir} {
		es, err := s.scan(sub)
		if err != nil {
			return nil, err
		}
		for _, e := range es {
			b, err := os.ReadFile(filepath.Join(e.dir, metadataFile))
			if err != nil {
				continue
			}
			md, err := DecodeMetadata(b)
			if err != nil || md.Checkpoint != e.id || md.Job != s.job {
				continue
			}
			md.Dir = e.dir
			out = append(out, md)
		}
	}
	sortNewest(out)
	return out, nil
}

func sortNewest(mds []*Metadata) {
	slices.SortStableFunc(mds, func(a, b *Metadata) int { return cmp.Compare(b.Checkpoint, a.Checkpoint) })
}

// Missing returns the handles of md (loaded with its Dir) whose state
// files are not in md.Dir with their size and CRC32C.
func Missing(md *Metadata) []Handle {
	var out []Handle
	seen := map[string]bool{}
	for _, o := range md.Operators {
		for _, h := range o.Subtasks {
			if h.File == "" || seen[h.File] {
				continue
			}
			seen[h.File] = true
			if checkFile(filepath.Join(md.Dir, h.File), h, true) != nil {
				out = append(out, h)
			}
		}
	}
	return out
}

// RetainCompleted keeps the newest keep checkpoints with metadata and
// removes the directory of every older checkpoint, complete or not
// (savepoints are never removed). A store whose coordinator runs here
// retains its own; this is for the copies of another node's.
func (s *Store) RetainCompleted(keep int) error {
	es, err := s.scan(checkpointsDir)
	if err != nil {
		return err
	}
	kept := 0
	var errs []error
	for _, e := range es {
		if kept >= keep {
			errs = append(errs, os.RemoveAll(e.dir))
			continue
		}
		if _, err := os.Stat(filepath.Join(e.dir, metadataFile)); err == nil {
			kept++
		} else if !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// ReadExtra returns the file name (written by AddMetadata) of the
// snapshot in dir.
func ReadExtra(dir, name string) ([]byte, error) {
	if !strings.HasPrefix(name, "_") || name != filepath.Base(name) {
		return nil, fmt.Errorf("%w: %q", ErrName, name)
	}
	return os.ReadFile(filepath.Join(dir, name))
}

// FilePath returns the path of state file name of snapshot id: in the
// directory of the snapshot when it is begun and not yet committed or
// discarded (a savepoint's may be anywhere), else in the checkpoint's
// directory.
func (s *Store) FilePath(id ID, name string) string {
	if loc, err := s.location(id); err == nil {
		return filepath.Join(loc.dir, name)
	}
	return filepath.Join(s.CheckpointDir(id), name)
}

// mergeInto moves the files of dir that dst lacks into dst and removes
// dir.
func mergeInto(dst, dir string) error {
	des, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, de := range des {
		to := filepath.Join(dst, de.Name())
		if _, err := os.Lstat(to); err == nil {
			continue
		}
		if err := os.Rename(filepath.Join(dir, de.Name()), to); err != nil {
			return err
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	return fsutil.SyncDir(dst)
}
