package daemon

import (
	"log/slog"
	"syscall"

	"github.com/edgedio/edged/mqtt/ingestlog"
)

// warnLogBoundOverDisk logs a warning when the ingest log in dir may grow
// past the size of the file system that holds it: its files stay below
// opts.MaxBytes plus one segment, and a bound the card cannot hold means
// the card fills up before the log's bound holds back the publishers, and
// that a log whose segment is as large as the card frees no space however
// many checkpoints complete (only whole segments are deleted). A file
// system whose size cannot be read is not checked.
func warnLogBoundOverDisk(log *slog.Logger, pipeline, dir string, opts ingestlog.Options) {
	if opts.MaxBytes <= 0 {
		return
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return
	}
	fsBytes := uint64(st.Blocks) * uint64(st.Frsize) // Blocks counts fragments
	files := uint64(opts.MaxBytes) + uint64(opts.SegmentBytes)
	if fsBytes == 0 || files <= fsBytes {
		return
	}
	log.Warn("ingest log: source.mqtt.log_max_bytes does not fit on the file system that holds the log: the card fills up before the bound holds back the publishers, and a log whose segment is as large as the card can free no space; set log_max_bytes so that 1.25 times it fits beside the checkpoints",
		"pipeline", pipeline, "dir", dir, "log_max_bytes", opts.MaxBytes, "segment_bytes", opts.SegmentBytes,
		"log_files_up_to", files, "file_system_bytes", fsBytes)
}
