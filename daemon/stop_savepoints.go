package daemon

import (
	"cmp"
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
// API) are never marked and never deleted.

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
	dir := filepath.Dir(path)
	if filepath.Base(dir) != "savepoints" {
		return
	}
	newest, ok := snapshot.SavepointDirID(filepath.Base(path))
	if !ok {
		return
	}
	if _, err := snapshot.Load(path); err != nil {
		n.log.Warn("stop savepoint does not read back; older ones kept", "job", job, "savepoint", path, "err", err)
		return
	}
	if err := os.WriteFile(filepath.Join(path, stopSavepointMark), nil, 0o644); err != nil {
		n.log.Warn("cannot mark the stop savepoint; it will be kept", "job", job, "savepoint", path, "err", err)
		return
	}
	des, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	type stop struct {
		id   snapshot.ID
		path string
	}
	var stops []stop
	for _, de := range des {
		id, ok := snapshot.SavepointDirID(de.Name())
		if !ok || !de.IsDir() || id > newest {
			continue
		}
		p := filepath.Join(dir, de.Name())
		if _, err := os.Stat(filepath.Join(p, stopSavepointMark)); err == nil {
			stops = append(stops, stop{id, p})
		}
	}
	slices.SortFunc(stops, func(a, b stop) int { return cmp.Compare(b.id, a.id) })
	for _, s := range stops[min(len(stops), keepStopSavepoints):] {
		if err := os.RemoveAll(s.path); err != nil {
			n.log.Warn("cannot delete an old stop savepoint", "job", job, "savepoint", s.path, "err", err)
			continue
		}
		n.log.Info("deleted an old stop savepoint", "job", job, "savepoint", s.path, "kept", keepStopSavepoints)
	}
}
