package daemon

import (
	"cmp"
	"log/slog"
	"os"
	"path/filepath"
	"slices"

	"github.com/edgedio/edged/snapshot"
)

// The savepoints a node takes when it stops (SIGTERM, Ctrl-C) are its
// own, not the user's: a device restarted every day would otherwise keep
// one more full copy of its state per restart until the card is full.
// Each is marked (stopSavepointMark) once complete, and after the next
// one the node keeps the newest keepStopSavepoints of them and deletes
// the older ones. Savepoints asked for (edged savepoint, edged stop, the
// API) are never marked and never deleted. In a cluster the savepoints
// the cluster takes on its own are marked and pruned the same way, on
// every node that keeps a copy (cluster_stop_savepoints.go).

// stopSavepointMark is the file that marks a savepoint the node took at
// its own stop.
const stopSavepointMark = "_node_stop"

// keepStopSavepoints is how many of a job's stop savepoints a node keeps.
const keepStopSavepoints = 2

// pruneStopSavepoints marks path, the savepoint the node just took at
// its stop, and deletes the job's older stop savepoints beyond the newest
// keepStopSavepoints, logging each. Only a savepoint in its store's own
// place (savepoints/sp-<id>-<ts>) is marked or deleted, and only once
// path reads back complete: a newer snapshot that restores must exist
// before an older one goes.
func (n *node) pruneStopSavepoints(job, path string) {
	newest, ok := ownSavepointDir(path)
	if !ok {
		return
	}
	if _, err := snapshot.Load(path); err != nil {
		n.log.Warn("stop savepoint does not read back; older ones kept", "job", job, "savepoint", path, "err", err)
		return
	}
	if !markStopSavepoint(n.log, job, path) {
		return
	}
	pruneStopSavepointsIn(n.log, job, filepath.Dir(path), newest, nil)
}

// ownSavepointDir returns the checkpoint id of path when it is a
// savepoint in its store's own place, savepoints/sp-<id>-<ts>.
func ownSavepointDir(path string) (snapshot.ID, bool) {
	if filepath.Base(filepath.Dir(path)) != "savepoints" {
		return 0, false
	}
	return snapshot.SavepointDirID(filepath.Base(path))
}

// markStopSavepoint writes the mark into the savepoint directory path;
// false (logged) if it could not.
func markStopSavepoint(log *slog.Logger, job, path string) bool {
	if err := os.WriteFile(filepath.Join(path, stopSavepointMark), nil, 0o644); err != nil {
		log.Warn("cannot mark the stop savepoint; it will be kept", "job", job, "savepoint", path, "err", err)
		return false
	}
	return true
}

// stopSavepoint is a marked savepoint found in a savepoints/ directory.
type stopSavepoint struct {
	id   snapshot.ID
	path string
}

// stopSavepointsIn returns the marked savepoints in dir (a store's
// savepoints/ directory) up to id newest, newest first. Symbolic links
// (a savepoint on a path of the user's) are never listed.
func stopSavepointsIn(dir string, newest snapshot.ID) []stopSavepoint {
	des, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var stops []stopSavepoint
	for _, de := range des {
		id, ok := snapshot.SavepointDirID(de.Name())
		if !ok || !de.IsDir() || id > newest {
			continue
		}
		p := filepath.Join(dir, de.Name())
		if _, err := os.Stat(filepath.Join(p, stopSavepointMark)); err == nil {
			stops = append(stops, stopSavepoint{id, p})
		}
	}
	slices.SortFunc(stops, func(a, b stopSavepoint) int { return cmp.Compare(b.id, a.id) })
	return stops
}

// pruneStopSavepointsIn deletes the marked savepoints in dir up to id
// newest beyond the newest keepStopSavepoints of them, logging each;
// keep, when set, spares those it reports true for.
func pruneStopSavepointsIn(log *slog.Logger, job, dir string, newest snapshot.ID, keep func(snapshot.ID) bool) {
	stops := stopSavepointsIn(dir, newest)
	for _, s := range stops[min(len(stops), keepStopSavepoints):] {
		if keep != nil && keep(s.id) {
			continue
		}
		if err := os.RemoveAll(s.path); err != nil {
			log.Warn("cannot delete an old stop savepoint", "job", job, "savepoint", s.path, "err", err)
			continue
		}
		log.Info("deleted an old stop savepoint", "job", job, "savepoint", s.path, "kept", keepStopSavepoints)
	}
}
