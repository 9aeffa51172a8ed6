// Package snapshot owns checkpoints and savepoints: the coordinator that
// decides when they are taken and when they are complete, the store that
// keeps them on disk with their metadata, retention, and the restart
// strategies that decide what happens when a job fails.
//
// # Checkpoints
//
// A Coordinator drives the aligned-barrier checkpoints of one run of a job
// (Chandy-Lamport, as in Flink):
//
//  1. Tick triggers checkpoint n when it is due (Config.Interval, MinPause,
//     MaxConcurrent); TriggerSavepoint triggers a savepoint at once. The
//     caller calls Store.Begin with the Trigger and sends it to every
//     source task, which records its position and emits barrier n.
//  2. Every task snapshots when barrier n has arrived on its inputs (in
//     ExactlyOnce mode holding back the inputs that delivered it first),
//     writes its state files with Store.Create, and acknowledges (Ack)
//     with their Handles, or Declines.
//  3. When every task has acknowledged, Step returns Complete: the caller
//     writes the metadata with Store.Commit, last and atomically, and
//     reports the result with Persisted. Only then is n complete, and the
//     coordinator returns NotifyComplete (sinks commit, sources trim their
//     logs) and Discards for the checkpoints retention no longer keeps.
//  4. A checkpoint that is declined, expires (Config.Timeout) or whose
//     metadata cannot be written is aborted (Abort, then Discard of its
//     partial files) and counts as a failure; more than
//     Config.TolerableFailures failures since the latest completed
//     checkpoint return FailJob.
//     A TaskFailed aborts everything pending without counting and halts
//     the coordinator; the restarted job gets a new Coordinator that
//     Recovers from this one's Progress (or the Store's, after a crash).
//
// Decisions worth knowing:
//
//   - IDs increase strictly over the job's life; checkpoints and savepoints
//     share them, so "everything up to n" means the same to every sink.
//   - A completed checkpoint n subsumes the older pending checkpoints: they
//     are aborted with ErrSubsumed (not counted as failures), after the
//     NotifyComplete of n, since they could never become the latest. As in
//     Flink; pending savepoints are not subsumed.
//   - The job fails when more than TolerableFailures checkpoints newer than
//     the latest completed one have failed: a completion drops the failures
//     of older checkpoints, not of newer ones still counted (Flink clears
//     them all, which depends on the order events arrive in). Savepoint
//     failures, task failures and subsumption never count.
//   - MinPause is measured from the end of the last checkpoint or savepoint,
//     completed or failed (Flink measures from the last completion), so that
//     a timed-out checkpoint does not start the next one at once.
//   - Savepoints are not held back by the interval, min pause or max
//     concurrent checkpoints, but they count as pending for periodic
//     checkpoints; they are always exactly-once, never discarded, and
//     outside retention and failure counting. While a stop-with-savepoint
//     is pending no periodic checkpoint starts and other savepoint requests
//     are refused (an Abort with a fresh ID); once it completes the
//     coordinator stops.
//
// # Storage
//
// A Store keeps one job's snapshots in a directory whose layout is
// versioned by its LAYOUT file (OpenStore refuses another version):
//
//	<dir>/
//	  LAYOUT                      "edged snapshot store 1\n"
//	  LOCK                        flock of the job running on the directory (stream)
//	  checkpoints/
//	    chk-<id>/                 one periodic checkpoint (id in decimal)
//	      <uid>.<subtask>.state   state file of one operator subtask
//	      _metadata               written last and atomically
//	      _committed              a final checkpoint every sink committed (MarkCommitted)
//	  savepoints/
//	    sp-<id>-<timestamp>/      one savepoint (timestamp in ms); or any
//	      ...                     path the person asked for
//
// Tasks write state files through Store.Create: a temporary file, fsynced
// and renamed when Finish returns its size and CRC32C. Store.Commit then
// syncs the directory and writes _metadata (temporary file, fsync, rename,
// fsync of the directory and its parent), so a snapshot directory with a
// valid _metadata is complete. A snapshot directory is self-contained: the
// metadata names state files relative to it, so a savepoint (or
// checkpoint) can be copied to another device and Load'ed there. In state
// file names the operator UID keeps ASCII letters, digits, '.', '_' and
// '-', every other byte becomes %XX, and a name longer than 200 bytes is
// cut and suffixed with a hash of the UID.
//
// Store.Latest returns the newest checkpoint that verifies (metadata
// decodes, job matches, every state file present with its size and
// checksum), logging and skipping damaged ones; LatestSavepoint does the
// same for savepoints/; RecoveryPoint picks the newer of the two (never an
// older checkpoint over a newer savepoint, whatever
// Config.PreferCheckpointForRecovery says); Load reads a snapshot from any path;
// Progress tells a new coordinator where IDs continue and which
// directories never completed.
//
// # Metadata format
//
// The _metadata file, version 3 (EncodeMetadata, DecodeMetadata). Integers
// are little endian; uvarint and varint are encoding/binary's; a string or
// bytes field is a uvarint length and that many bytes.
//
//	magic        8 bytes  "EDGDMETA"
//	version      uint16   3; 2 when no operator has settings (1 and 2
//	                      are read: 1 has no flags, neither has settings)
//	body length  uint32
//	body:
//	  job              string
//	  max parallelism  uvarint  1..32768
//	  checkpoint ID    uvarint
//	  kind             byte     1 checkpoint, 2 savepoint
//	  timestamp        varint   trigger time, ms since the Unix epoch
//	  operators        uvarint count, then per operator, sorted by UID:
//	    uid            string   non-empty, unique
//	    parallelism    uvarint  1..max parallelism
//	    per subtask (parallelism of them):
//	      file         string   plain file name in the directory, or ""
//	      size         uvarint
//	      checksum     uint32   CRC32C (Castagnoli) of the file
//	      key groups   bytes    opaque: key-group offsets in the file
//	      sources      bytes    opaque: source positions
//	      pending      bytes    opaque: pending 2PC transactions
//	  flags            byte     bit 0: finished (the job's final checkpoint)
//	  settings         version 3: per operator, in the order above, a
//	                   string: the digest of the settings its state was
//	                   shaped by ("" for none)
//	checksum     uint32   CRC32C of everything before it, header included
//
// A reader refuses another magic (ErrBadMagic), an unknown version
// (ErrVersion), a checksum mismatch (ErrChecksum), and any body that is
// not exactly one valid encoding (ErrCorrupt); it never panics. Later
// versions append fields to the body and bump the version.
//
// # Restarts
//
// NoRestart, FixedDelay, FailureRate and ExponentialDelay implement
// RestartStrategy: pure decisions from failure times. RestartConfig builds
// one from YAML; its default is ExponentialDelay, which never gives up.
//
// # Concurrency
//
// The Coordinator and the restart strategies are pure machines: no
// goroutines, no clocks, not safe for concurrent use; the job's
// coordinating actor owns them. A Store is safe for concurrent use and
// blocks on disk I/O; each Writer belongs to one task. Nothing in the
// package starts a goroutine.
package snapshot
