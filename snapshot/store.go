package snapshot

import (
	"cmp"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/edgedio/edged/internal/fsutil"
	"github.com/edgedio/edged/keygroup"
)

// The store's directory layout, version 1, is described in doc.go.
const (
	layoutFile     = "LAYOUT"
	layoutContents = "edged snapshot store 1\n"
	checkpointsDir = "checkpoints"
	savepointsDir  = "savepoints"
	metadataFile   = "_metadata"
)

// Store keeps the checkpoints and savepoints of one job in a directory (see
// the layout above). Every method is safe for concurrent use: tasks write
// their state files from their own goroutines while the coordinating actor
// begins, commits and discards snapshots. Methods block on disk I/O.
type Store struct {
	root           string
	job            string
	maxParallelism int
	log            *slog.Logger
	// missingDamaged counts a snapshot with a state file missing as
	// damaged (MissingIsDamage).
	missingDamaged bool

	mu     sync.Mutex      // guards active
	active map[ID]location // snapshots begun and not yet committed or discarded
}

// location is the directory of an active snapshot.
type location struct {
	dir     string
	kind    Kind
	created bool // the store created dir (a user's savepoint path may have existed, empty)
	// link is savepoints/sp-<id>-<timestamp> for a savepoint written to
	// a path of the user's: a symbolic link to it, made before its
	// metadata, so that recovery and the next IDs see it as they see the
	// store's own savepoints.
	link string
}

// OpenStore opens (creating it if needed) the snapshot store of job in dir.
// maxParallelism is the job's number of key groups, which Commit stamps
// into every snapshot with the job's name. log receives a line for every
// snapshot that recovery skips; nil discards them.
func OpenStore(dir, job string, maxParallelism int, log *slog.Logger) (*Store, error) {
	if dir == "" {
		return nil, fmt.Errorf("%w: checkpoint.dir must be set", ErrInvalidConfig)
	}
	if err := keygroup.Validate(1, maxParallelism); err != nil {
		return nil, fmt.Errorf("open snapshot store: %w", err)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Store{root: dir, job: job, maxParallelism: maxParallelism, log: log, active: map[ID]location{}}
	for _, d := range []string{dir, filepath.Join(dir, checkpointsDir), filepath.Join(dir, savepointsDir)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("open snapshot store: %w", err)
		}
	}
	b, err := os.ReadFile(filepath.Join(dir, layoutFile))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if err := writeAtomic(dir, layoutFile, []byte(layoutContents)); err != nil {
			return nil, fmt.Errorf("open snapshot store: %w", err)
		}
	case err != nil:
		return nil, fmt.Errorf("open snapshot store: %w", err)
	case string(b) != layoutContents:
		return nil, fmt.Errorf("%w: %s holds %q, want %q", ErrLayout, filepath.Join(dir, layoutFile), b, layoutContents)
	}
	return s, nil
}

// Dir returns the store's root directory.
func (s *Store) Dir() string { return s.root }

// CheckpointDir returns the directory of checkpoint id.
func (s *Store) CheckpointDir(id ID) string {
	return filepath.Join(s.root, checkpointsDir, "chk-"+strconv.FormatUint(uint64(id), 10))
}

// CheckSavepointOutsideCheckpoints returns an error wrapping ErrName
// when p, an absolute savepoint path, is the checkpoints/ directory of
// the store at root or under it: where the job writes its checkpoints and
// retention deletes them (a savepoint named as a checkpoint to come would
// make that checkpoint fail). A relative p (under savepoints/) is nil.
func CheckSavepointOutsideCheckpoints(root, p string) error {
	if root == "" || !filepath.IsAbs(p) {
		return nil
	}
	dir, err := filepath.Abs(filepath.Join(root, checkpointsDir))
	if err != nil {
		return nil
	}
	p = filepath.Clean(p)
	// Lexically, and as the file system resolves both: a symbolic link
	// on either path names the same directory by another path.
	for _, c := range [][2]string{{dir, p}, {resolvePath(dir), resolvePath(p)}} {
		if rel, err := filepath.Rel(c[0], c[1]); err == nil && (rel == "." || filepath.IsLocal(rel)) {
			return fmt.Errorf("%w: %q is in the job's checkpoints directory %s, where its checkpoints are written and retention deletes them", ErrName, p, dir)
		}
	}
	return nil
}

// resolvePath returns the absolute path p with the symbolic links of its
// longest existing part resolved, the rest (not yet created) as it is.
func resolvePath(p string) string {
	rest := ""
	for q := p; ; {
		if r, err := filepath.EvalSymlinks(q); err == nil {
			return filepath.Join(r, rest)
		}
		parent := filepath.Dir(q)
		if parent == q {
			return p
		}
		rest = filepath.Join(filepath.Base(q), rest)
		q = parent
	}
}

// Begin creates the directory of the checkpoint or savepoint t announces
// and returns it. The caller calls it before sending t to the sources;
// from then on Create and StatePath work for t.Checkpoint. A savepoint goes
// to t.Path if set (relative to savepoints/ and staying under it, or
// absolute; it must not exist or be empty), else to
// savepoints/sp-<id>-<timestamp>.
func (s *Store) Begin(t Trigger) (string, error) {
	loc := location{kind: KindCheckpoint, created: true}
	if t.Savepoint {
		loc.kind = KindSavepoint
		switch {
		case t.Path == "":
			loc.dir = filepath.Join(s.root, savepointsDir, fmt.Sprintf("sp-%d-%d", t.Checkpoint, t.Timestamp))
		case CheckSavepointPath(t.Path) != nil:
			return "", fmt.Errorf("begin savepoint %d: %w", t.Checkpoint, CheckSavepointPath(t.Path))
		case filepath.IsAbs(t.Path):
			loc.dir = filepath.Clean(t.Path)
			if err := CheckSavepointOutsideCheckpoints(s.root, t.Path); err != nil {
				return "", fmt.Errorf("begin savepoint %d: %w", t.Checkpoint, err)
			}
		default:
			loc.dir = filepath.Join(s.root, savepointsDir, t.Path)
		}
		if own := filepath.Join(s.root, savepointsDir, fmt.Sprintf("sp-%d-%d", t.Checkpoint, t.Timestamp)); loc.dir != own {
			loc.link = own
		}
	} else {
		loc.dir = s.CheckpointDir(t.Checkpoint)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, dup := s.active[t.Checkpoint]; dup {
		return "", fmt.Errorf("begin %s %d: %w: already begun", loc.kind, t.Checkpoint, ErrExists)
	}
	if t.Savepoint {
		entries, err := os.ReadDir(loc.dir)
		switch {
		case err == nil && len(entries) > 0:
			return "", fmt.Errorf("begin savepoint %d: %w: %s is not empty", t.Checkpoint, ErrExists, loc.dir)
		case err == nil:
			loc.created = false
		case errors.Is(err, fs.ErrNotExist):
			if err := os.MkdirAll(filepath.Dir(loc.dir), 0o755); err != nil {
				return "", fmt.Errorf("begin savepoint %d: %w", t.Checkpoint, err)
			}
		default:
			return "", fmt.Errorf("begin savepoint %d: %w", t.Checkpoint, err)
		}
	}
	if loc.created {
		if err := os.Mkdir(loc.dir, 0o755); errors.Is(err, fs.ErrExist) {
			return "", fmt.Errorf("begin %s %d: %w: %s", loc.kind, t.Checkpoint, ErrExists, loc.dir)
		} else if err != nil {
			return "", fmt.Errorf("begin %s %d: %w", loc.kind, t.Checkpoint, err)
		}
	}
	s.active[t.Checkpoint] = loc
	return loc.dir, nil
}

func (s *Store) location(id ID) (location, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	loc, ok := s.active[id]
	if !ok {
		return location{}, fmt.Errorf("%w: %d was not begun (or is finished)", ErrUnknownCheckpoint, id)
	}
	return loc, nil
}

// StatePath returns the path of the state file of subtask subtask of
// operator uid in snapshot id, for a task that writes the file itself;
// Create is the simpler way.
func (s *Store) StatePath(id ID, uid string, subtask int) (string, error) {
	name, err := stateFileName(uid, subtask)
	if err != nil {
		return "", err
	}
	loc, err := s.location(id)
	if err != nil {
		return "", err
	}
	return filepath.Join(loc.dir, name), nil
}

// Create starts the state file of subtask subtask of operator uid in
// snapshot id. The Writer belongs to the calling task.
func (s *Store) Create(id ID, uid string, subtask int) (*Writer, error) {
	path, err := s.StatePath(id, uid, subtask)
	if err != nil {
		return nil, fmt.Errorf("create state file of %q[%d]: %w", uid, subtask, err)
	}
	return newWriter(path)
}

// Commit makes snapshot md.Checkpoint complete: it stamps md with the
// store's job name and max parallelism, checks that every state file md
// names is there with its size, syncs the directory, then writes _metadata
// atomically (temporary file, fsync, rename, fsync of the directory and of
// its parent). It returns the snapshot's directory, which it also sets as
// md.Dir. On error the snapshot stays incomplete; Discard removes it.
func (s *Store) Commit(md *Metadata) (string, error) {
	loc, err := s.location(md.Checkpoint)
	if err != nil {
		return "", fmt.Errorf("commit: %w", err)
	}
	if md.Kind != loc.kind {
		return "", fmt.Errorf("commit %d: %w: metadata of a %s for a %s", md.Checkpoint, ErrCorrupt, md.Kind, loc.kind)
	}
	md.Job, md.MaxParallelism = s.job, s.maxParallelism
	if err := md.Validate(); err != nil {
		return "", fmt.Errorf("commit %s %d: %w", md.Kind, md.Checkpoint, err)
	}
	if err := checkFiles(loc.dir, md, false); err != nil {
		return "", fmt.Errorf("commit %s %d: %w", md.Kind, md.Checkpoint, err)
	}
	b, err := EncodeMetadata(md)
	if err != nil {
		return "", fmt.Errorf("commit %s %d: %w", md.Kind, md.Checkpoint, err)
	}
	if err := fsutil.SyncDir(loc.dir); err != nil {
		return "", fmt.Errorf("commit %s %d: %w", md.Kind, md.Checkpoint, err)
	}
	if err := s.link(loc); err != nil {
		return "", fmt.Errorf("commit %s %d: %w", md.Kind, md.Checkpoint, err)
	}
	if err := writeAtomic(loc.dir, metadataFile, b); err != nil {
		return "", fmt.Errorf("commit %s %d: %w", md.Kind, md.Checkpoint, err)
	}
	if err := fsutil.SyncDir(filepath.Dir(loc.dir)); err != nil {
		return "", fmt.Errorf("commit %s %d: %w", md.Kind, md.Checkpoint, err)
	}
	s.mu.Lock()
	delete(s.active, md.Checkpoint)
	s.mu.Unlock()
	md.Dir = loc.dir
	if md.Kind == KindCheckpoint {
		s.sweep(md.Checkpoint)
	}
	return loc.dir, nil
}

// sweep removes the directories of the checkpoints that never completed
// (no _metadata), are not in progress here and are older than the oldest
// completed checkpoint the store still holds: a failed checkpoint whose
// Discard met a task still writing its state file into the directory
// (the removal then fails, "directory not empty") left it behind, and on
// a device that fails checkpoints for a while (its sink's broker away)
// they would fill the disk. A completed checkpoint subsumes every older
// pending one, so none of them can complete any more; and below the
// oldest retained one none is a fallback (in a cluster a node may hold
// state files of a completed checkpoint whose metadata it missed: those
// go only once that checkpoint left the retention). Best effort: what it
// cannot remove now goes at a later completion.
func (s *Store) sweep(id ID) {
	es, err := s.scan(checkpointsDir)
	if err != nil {
		return
	}
	oldest := id
	for _, e := range es {
		if _, err := os.Lstat(filepath.Join(e.dir, metadataFile)); err == nil {
			oldest = min(oldest, e.id)
		}
	}
	for _, e := range es {
		if e.id >= oldest {
			continue
		}
		s.mu.Lock()
		_, active := s.active[e.id]
		s.mu.Unlock()
		if active {
			continue
		}
		if _, err := os.Lstat(filepath.Join(e.dir, metadataFile)); !errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err := os.RemoveAll(e.dir); err != nil {
			s.log.Warn("snapshot: cannot remove the directory of a checkpoint that never completed", "job", s.job, "checkpoint_id", uint64(e.id), "dir", e.dir, "err", err)
			continue
		}
		s.log.Info("snapshot: removed the directory of a checkpoint that never completed", "job", s.job, "checkpoint_id", uint64(e.id), "dir", e.dir)
	}
}

// link makes loc.link, if any, a symbolic link to loc.dir (relative when
// loc.dir is under the store) and syncs its directory. Without it, a job
// started again after a savepoint to a path of the user's would resume
// from the checkpoint before it, and commit again what the savepoint's
// completion committed.
func (s *Store) link(loc location) error {
	if loc.link == "" {
		return nil
	}
	target := loc.dir
	if rel, err := filepath.Rel(filepath.Dir(loc.link), loc.dir); err == nil && filepath.IsLocal(rel) {
		target = rel
	}
	if err := os.Symlink(target, loc.link); err != nil {
		return fmt.Errorf("link the savepoint into the store: %w", err)
	}
	return fsutil.SyncDir(filepath.Dir(loc.link))
}

// Discard deletes checkpoint id's directory, or the partial directory of a
// savepoint that was begun and not committed (for a savepoint path that
// existed empty, only what was written into it). It never touches a
// committed savepoint. Discarding what is not there is not an error.
func (s *Store) Discard(id ID) error {
	s.mu.Lock()
	loc, ok := s.active[id]
	delete(s.active, id)
	s.mu.Unlock()
	if !ok {
		loc = location{dir: s.CheckpointDir(id), kind: KindCheckpoint, created: true}
	}
	if loc.link != "" {
		if err := os.Remove(loc.link); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("discard %s %d: %w", loc.kind, id, err)
		}
	}
	if loc.created {
		if err := os.RemoveAll(loc.dir); err != nil {
			return fmt.Errorf("discard %s %d: %w", loc.kind, id, err)
		}
		return nil
	}
	entries, err := os.ReadDir(loc.dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("discard %s %d: %w", loc.kind, id, err)
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(loc.dir, e.Name())); err != nil {
			return fmt.Errorf("discard %s %d: %w", loc.kind, id, err)
		}
	}
	return nil
}

// MissingIsDamage makes Latest, LatestSavepoint and RecoveryPoint count a
// complete snapshot with a state file missing as damaged, as one with a
// file of the wrong size or checksum: when no snapshot is usable they
// return ErrAllDamaged instead of ErrNoCheckpoint. For a job that runs on
// one node, where no replica can bring the file back and starting from
// the beginning would commit the job's output again. Call it before the
// store is used.
func (s *Store) MissingIsDamage() { s.missingDamaged = true }

// Latest returns the newest complete checkpoint of the job, verified: a
// checkpoint directory without valid _metadata, of another job, or with a
// state file missing, of the wrong size or with the wrong checksum is
// skipped with a logged warning saying which and why, and the one before
// it is tried. It returns ErrNoCheckpoint if none is complete. Verifying
// reads every state file once.
func (s *Store) Latest() (*Metadata, error) {
	return s.latest(checkpointsDir, KindCheckpoint)
}

// LatestSavepoint is Latest for the savepoints under the store's
// savepoints/ directory (savepoints written to other paths are not found).
func (s *Store) LatestSavepoint() (*Metadata, error) {
	return s.latest(savepointsDir, KindSavepoint)
}

// RecoveryPoint returns the snapshot to restore after a failure or a
// restart: the newest (by ID) complete snapshot, checkpoint or savepoint,
// that verifies. It returns ErrNoCheckpoint if there is none.
//
// Any complete snapshot (its _metadata written) may have been announced
// complete, and its completion commits side effects (two-phase-commit
// sinks commit, write-ahead sinks publish). Restoring an older snapshot
// would replay and commit that output again, so preferCheckpoint
// (Config.PreferCheckpointForRecovery) never makes recovery go back past a
// newer savepoint: when it would, it is ignored with a logged warning that
// names both snapshots. A damaged snapshot is skipped (logged) as ever, and
// the newest of the rest is restored.
func (s *Store) RecoveryPoint(preferCheckpoint bool) (*Metadata, error) {
	cp, cerr := s.Latest()
	if cerr != nil && !errors.Is(cerr, ErrNoCheckpoint) && !errors.Is(cerr, ErrAllDamaged) {
		return nil, cerr
	}
	sp, serr := s.LatestSavepoint()
	if serr != nil && !errors.Is(serr, ErrNoCheckpoint) && !errors.Is(serr, ErrAllDamaged) {
		return nil, serr
	}
	switch {
	case cp == nil && sp == nil:
		// Complete snapshots that are all damaged are not a fresh
		// start: starting from the beginning would commit every output
		// of the job again.
		if err := cmp.Or(allDamaged(cerr), allDamaged(serr)); err != nil {
			return nil, fmt.Errorf("%w; starting the job from the beginning would commit its output again: remove the job's checkpoint directory to start over, or start from a savepoint", err)
		}
		return nil, ErrNoCheckpoint
	case cp == nil:
		return sp, nil
	case sp == nil || cp.Checkpoint > sp.Checkpoint:
		return cp, nil
	}
	if preferCheckpoint {
		s.log.Warn("snapshot: ignoring checkpoint.prefer_checkpoint_for_recovery: the savepoint is newer than the latest checkpoint and its completion may have committed output; restoring the checkpoint would commit that output twice",
			"job", s.job,
			"checkpoint_id", uint64(cp.Checkpoint), "checkpoint_dir", cp.Dir,
			"savepoint_id", uint64(sp.Checkpoint), "savepoint_dir", sp.Dir)
	}
	return sp, nil
}

// allDamaged returns err if it is ErrAllDamaged, else nil.
func allDamaged(err error) error {
	if errors.Is(err, ErrAllDamaged) {
		return err
	}
	return nil
}

// Load reads and verifies the snapshot at path: a snapshot directory (a
// savepoint anywhere, possibly moved from another device) or its _metadata
// file. It does not check the job name.
func Load(path string) (*Metadata, error) {
	dir := path
	if filepath.Base(path) == metadataFile {
		dir = filepath.Dir(path)
	}
	if _, err := os.Stat(dir); err != nil {
		// Not there at all (a mistyped path), rather than a snapshot
		// whose metadata is missing.
		return nil, fmt.Errorf("load snapshot: %w", err)
	}
	md, err := verify(dir)
	if err != nil {
		return nil, fmt.Errorf("load snapshot %s: %w", dir, err)
	}
	return md, nil
}

// Progress scans the store for what a new coordinator needs after a crash:
// the checkpoint directories with a _metadata file (Completed; not
// verified) and without (Incomplete), and the next ID, past every
// checkpoint and savepoint in the store.
func (s *Store) Progress() (Progress, error) {
	p := Progress{NextID: 1}
	cps, err := s.scan(checkpointsDir)
	if err != nil {
		return Progress{}, err
	}
	for _, e := range cps {
		p.NextID = max(p.NextID, e.id+1)
		if _, err := os.Stat(filepath.Join(e.dir, metadataFile)); err == nil {
			p.Completed = append(p.Completed, e.id)
		} else if errors.Is(err, fs.ErrNotExist) {
			p.Incomplete = append(p.Incomplete, e.id)
		} else {
			return Progress{}, fmt.Errorf("scan snapshot store: %w", err)
		}
	}
	sps, err := s.scan(savepointsDir)
	if err != nil {
		return Progress{}, err
	}
	for _, e := range sps {
		p.NextID = max(p.NextID, e.id+1)
	}
	slices.Sort(p.Completed)
	slices.Sort(p.Incomplete)
	return p, nil
}

// DiscardIncompleteSavepoints removes the savepoints of the store that
// never completed (no _metadata: the process died while it wrote them,
// or a stop's savepoint was cut short by a power loss) and returns their
// paths. A savepoint written to a path of the user's loses only its
// link in savepoints/; the files at the user's path stay. Call it only
// while no savepoint of the store is being written: the job that holds
// the checkpoint directory's lock, at the start of an attempt. Recovery
// skips such a savepoint anyway; without this its files would stay on
// the card, and be logged as skipped at every start, for good.
func (s *Store) DiscardIncompleteSavepoints() ([]string, error) {
	sps, err := s.scan(savepointsDir)
	if err != nil {
		return nil, err
	}
	var removed []string
	var errs []error
	for _, e := range sps {
		s.mu.Lock()
		_, active := s.active[e.id]
		s.mu.Unlock()
		if active {
			continue
		}
		if _, err := os.Stat(filepath.Join(e.dir, metadataFile)); !errors.Is(err, fs.ErrNotExist) {
			continue // complete, or not readable now: left alone
		}
		fi, err := os.Lstat(e.dir)
		if err != nil {
			errs = append(errs, fmt.Errorf("discard incomplete savepoint: %w", err))
			continue
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			err = os.Remove(e.dir)
		} else {
			err = os.RemoveAll(e.dir)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("discard incomplete savepoint: %w", err))
			continue
		}
		removed = append(removed, e.dir)
	}
	return removed, errors.Join(errs...)
}

// linksToDir reports whether de, at path, is a symbolic link to a
// directory (a savepoint written to a path of the user's).
func linksToDir(path string, de fs.DirEntry) bool {
	if de.Type()&fs.ModeSymlink == 0 {
		return false
	}
	fi, err := os.Stat(path)
	return err == nil && fi.IsDir()
}

// CheckSavepointPath returns an error wrapping ErrName for a savepoint
// path Begin refuses: a relative path that leaves savepoints/ ("../x" is
// not a way to write anywhere else; an absolute path is) or names
// savepoints/ itself ("." or "a/.."), whose savepoint would hold every
// later one; and any path no file system takes: one with a NUL byte, a
// name longer than MaxPathNameBytes or a path longer than MaxPathBytes.
// Callers check it before a savepoint begins.
func CheckSavepointPath(p string) error {
	if p == "" {
		return nil
	}
	if strings.IndexByte(p, 0) >= 0 {
		return fmt.Errorf("%w: %q holds a NUL byte", ErrName, p)
	}
	if len(p) > MaxPathBytes {
		return fmt.Errorf("%w: the path is %d bytes long, more than %d", ErrName, len(p), MaxPathBytes)
	}
	for el := range strings.SplitSeq(filepath.ToSlash(p), "/") {
		if len(el) > MaxPathNameBytes {
			return fmt.Errorf("%w: %q has a name of %d bytes, more than %d", ErrName, p, len(el), MaxPathNameBytes)
		}
	}
	switch {
	case filepath.IsAbs(p):
		return nil
	case !filepath.IsLocal(p):
		return fmt.Errorf("%w: %q leaves savepoints/ (give an absolute path to write elsewhere)", ErrName, p)
	case filepath.Clean(p) == ".":
		return fmt.Errorf("%w: %q is savepoints/ itself, not a directory under it", ErrName, p)
	}
	return nil
}

// CheckSavepointDir returns an error wrapping ErrName for an absolute
// savepoint path the node's file system cannot hold a directory at: the
// path, or a directory on the way to it, is a file (a device like
// /dev/null, a regular file), or cannot be looked at. A relative path, one
// under the job's savepoints/, is left to Begin. Callers check it, after
// CheckSavepointPath, before a savepoint begins.
func CheckSavepointDir(p string) error {
	if !filepath.IsAbs(p) {
		return nil
	}
	for d := filepath.Clean(p); ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		switch {
		case err == nil && fi.IsDir():
			return nil
		case err == nil:
			return fmt.Errorf("%w: %s is not a directory (%s)", ErrName, d, fi.Mode().Type())
		case !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ENOTDIR):
			return fmt.Errorf("%w: %s: %v", ErrName, d, errors.Unwrap(err))
		}
		if d == filepath.Dir(d) {
			return nil
		}
	}
}

// MaxPathNameBytes and MaxPathBytes bound a savepoint path's names and
// the whole path (CheckSavepointPath), as Linux file systems do
// (NAME_MAX, PATH_MAX).
const (
	MaxPathNameBytes = 255
	MaxPathBytes     = 4095
)

// SavepointDirID returns the checkpoint id of a savepoint directory of
// the store's own naming, sp-<id>-<timestamp>.
func SavepointDirID(name string) (ID, bool) {
	rest, ok := strings.CutPrefix(name, "sp-")
	if !ok {
		return 0, false
	}
	idText, _, _ := strings.Cut(rest, "-")
	id, err := strconv.ParseUint(idText, 10, 64)
	return ID(id), err == nil && id > 0
}

// entry is a snapshot directory found by scan.
type entry struct {
	id  ID
	dir string
}

// scan lists the snapshot directories under sub, newest (highest ID)
// first; names that are not chk-<id> or sp-<id>-<ts> are ignored.
func (s *Store) scan(sub string) ([]entry, error) {
	des, err := os.ReadDir(filepath.Join(s.root, sub))
	if err != nil {
		return nil, fmt.Errorf("scan snapshot store: %w", err)
	}
	var out []entry
	for _, de := range des {
		if !de.IsDir() && !linksToDir(filepath.Join(s.root, sub, de.Name()), de) {
			continue
		}
		var id ID
		switch sub {
		case checkpointsDir:
			idText, ok := strings.CutPrefix(de.Name(), "chk-")
			n, err := strconv.ParseUint(idText, 10, 64)
			if !ok || err != nil || n == 0 {
				continue
			}
			id = ID(n)
		default:
			var ok bool
			if id, ok = SavepointDirID(de.Name()); !ok {
				continue
			}
		}
		out = append(out, entry{id: id, dir: filepath.Join(s.root, sub, de.Name())})
	}
	slices.SortFunc(out, func(a, b entry) int { return cmp.Compare(b.id, a.id) })
	return out, nil
}

func (s *Store) latest(sub string, kind Kind) (*Metadata, error) {
	entries, err := s.scan(sub)
	if err != nil {
		return nil, err
	}
	damaged := 0
	for _, e := range entries {
		md, err := verify(e.dir)
		if err == nil && md.Kind != kind {
			err = fmt.Errorf("%w: a %s in %s/", ErrCorrupt, md.Kind, sub)
		}
		if err == nil && md.Checkpoint != e.id {
			err = fmt.Errorf("%w: metadata of %d in the directory of %d", ErrCorrupt, md.Checkpoint, e.id)
		}
		if err == nil && md.Job != s.job {
			err = fmt.Errorf("%w: job %q, not %q", ErrJobMismatch, md.Job, s.job)
		}
		if err != nil {
			s.log.Warn("snapshot: skipping "+kind.String(), "job", s.job, "checkpoint_id", uint64(e.id), "dir", e.dir, "err", err)
			// Damaged: what was written is not what was read back. An
			// incomplete checkpoint never completed; another job's is not
			// this job's; a missing file may still come from a replica,
			// unless there is none (MissingIsDamage).
			if !errors.Is(err, ErrIncomplete) && !errors.Is(err, ErrJobMismatch) && (s.missingDamaged || !errors.Is(err, ErrMissing)) {
				damaged++
			}
			continue
		}
		return md, nil
	}
	if damaged > 0 {
		return nil, fmt.Errorf("%w: %d in %s, none usable", ErrAllDamaged, damaged, filepath.Join(s.root, sub))
	}
	return nil, fmt.Errorf("%w in %s", ErrNoCheckpoint, filepath.Join(s.root, sub))
}

// verify reads dir/_metadata and checks every state file it names.
func verify(dir string) (*Metadata, error) {
	b, err := os.ReadFile(filepath.Join(dir, metadataFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, ErrIncomplete
	}
	if err != nil {
		return nil, err
	}
	md, err := DecodeMetadata(b)
	if err != nil {
		return nil, err
	}
	if err := checkFiles(dir, md, true); err != nil {
		return nil, err
	}
	if md.Committed, err = committed(dir); err != nil {
		return nil, err
	}
	md.Dir = dir
	return md, nil
}

// checkFiles checks that the state files of md are in dir with their
// sizes and, if sums, their checksums.
func checkFiles(dir string, md *Metadata, sums bool) error {
	for _, o := range md.Operators {
		for i, h := range o.Subtasks {
			if h.File == "" {
				continue
			}
			if err := checkFile(filepath.Join(dir, h.File), h, sums); err != nil {
				return fmt.Errorf("operator %q subtask %d: %w", o.UID, i, err)
			}
		}
	}
	return nil
}

func checkFile(path string, h Handle, sum bool) error {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w: %s", ErrMissing, h.File)
	}
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if fi.Size() != h.Size {
		return fmt.Errorf("%w: %s has %d bytes, metadata says %d", ErrSize, h.File, fi.Size(), h.Size)
	}
	if !sum {
		return nil
	}
	c := crc32.New(castagnoli)
	if _, err := io.Copy(c, f); err != nil {
		return fmt.Errorf("read %s: %w", h.File, err)
	}
	if got := c.Sum32(); got != h.Checksum {
		return fmt.Errorf("%w: %s has crc32c %08x, metadata says %08x", ErrChecksum, h.File, got, h.Checksum)
	}
	return nil
}

// FilePath returns the path of h's state file: filepath.Join(m.Dir,
// h.File), or "" if h has no file.
func (m *Metadata) FilePath(h Handle) string {
	if h.File == "" {
		return ""
	}
	return filepath.Join(m.Dir, h.File)
}

// stateFileName names the state file of an operator subtask.
func stateFileName(uid string, subtask int) (string, error) {
	if uid == "" {
		return "", fmt.Errorf("%w: empty operator UID", ErrName)
	}
	if subtask < 0 {
		return "", fmt.Errorf("%w: subtask %d", ErrName, subtask)
	}
	return fmt.Sprintf("%s.%d.state", FileName(uid), subtask), nil
}

// FileName is uid as a file name: letters, digits, '.', '_' and '-' as
// they are, every other byte as %XX (a '/' of a declared pipeline's UIDs
// among them), cut to at most 197 bytes with a hash of the whole. It
// names the state files of snapshots and of the bolt state backend.
func FileName(uid string) string {
	var b strings.Builder
	for i := 0; i < len(uid); i++ {
		c := uid[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-' {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	name := b.String()
	if len(name) > 200 {
		name = fmt.Sprintf("%s~%016x", name[:180], keygroup.HashString(uid))
	}
	return name
}

// writeAtomic writes dir/name through a temporary file: write, fsync,
// rename, fsync dir.
func writeAtomic(dir, name string, data []byte) error {
	if err := fsutil.WriteFile(filepath.Join(dir, name), data); err != nil {
		return fmt.Errorf("write %s: %w", filepath.Join(dir, name), err)
	}
	return nil
}
