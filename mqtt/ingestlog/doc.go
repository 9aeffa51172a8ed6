// Package ingestlog owns the durable ingest log of the MQTT source: the
// local, replayable copy of every message edged has received.
//
// MQTT cannot replay, so the source appends each message to the log and
// acknowledges it to the broker (PUBACK/PUBREC, or msg.Ack with paho) only
// when Append has returned, that is when the message is on disk. The
// source's checkpointed state is a log offset (Reader.Offset); on recovery
// it replays the log from the restored offset; when a checkpoint
// completes it calls Truncate with that checkpoint's offset, which
// releases space and deletes the segment files wholly before it. With the
// embedded broker, the broker's OnPublish hook calls Append before the
// publishing device gets its PUBACK, so a full log pushes back on each
// device over TCP.
//
// # Contract
//
//   - Offsets are dense: 0 for the first record ever appended, then +1 per
//     record, monotonic across segments and restarts (Truncate never
//     resets them).
//   - Append returns only when the record and every record before it are
//     fsynced. Concurrent Appends share fsyncs (group commit): the first
//     Append that needs an fsync leads it, waiting out the rest of
//     Options.SyncInterval since the previous fsync started so that more
//     Appends join, and the others wait for it. No other goroutine exists.
//   - Readers see only durable records, so a checkpointed offset never
//     points past what survives a crash.
//   - Options.MaxBytes bounds the bytes of records not yet released by
//     Truncate; a full log blocks Append until Truncate releases space or
//     the Append's context is done (Stats.Blocked, Stats.BlockedTime).
//     Blocked Appends are not served in arrival order: each retries when
//     space is released. A reopened log counts everything on disk as
//     unreleased until the first Truncate. Disk use stays below MaxBytes
//     plus one segment, plus segments Readers still hold open: a Reader
//     keeps its current file open, so a deleted segment's space returns
//     when the Reader moves on or closes.
//   - Open recovers: it reads every record of every segment. A torn tail
//     of the last segment, left by a crash before the fsync that would
//     have acknowledged it, is cut off and logged with the bytes dropped:
//     a partial record at the end, a last record that fails its checksum,
//     or a zero-filled remainder (and a last segment whose header never
//     made it to disk is removed). Any other damage, a bad record in an
//     earlier segment or in the middle of the last one, or segments that
//     are not contiguous, fails Open with a *CorruptError (ErrCorrupt)
//     naming the segment and offset; that needs a person, not a guess.
//   - A write or fsync error stops the log (ErrFailed): after a failed
//     fsync the kernel may have dropped the dirty pages, so only a reopen,
//     which reads what really is on disk, can continue.
//
// # Files
//
// The directory holds a LOCK file (flock, so one Log per directory) and
// segment files named by the offset of their first record, 20 decimal
// digits, "00000000000000001234.seg". A segment is started when the next
// record would take the active one past Options.SegmentBytes; the old one
// is fsynced before the new one is created, so only the last segment can
// have a torn tail. Creating and deleting segments fsyncs the directory.
// Integers are little endian; uvarint and varint are encoding/binary's.
//
//	segment header, 24 bytes:
//	  magic        8 bytes  "EDGDILOG"
//	  version      uint16   1
//	  reserved     uint16   0
//	  base offset  uint64   offset of the first record; equals the name
//	  checksum     uint32   CRC32C (Castagnoli) of the 20 bytes before it
//	records, each:
//	  length       uint32   length of the body, 4..maxBodySize
//	  checksum     uint32   CRC32C of the body
//	  body:
//	    flags      byte     bits 0-1 QoS (0..2), bit 2 retain, others 0
//	    received   varint   receive time, ns since the Unix epoch; 0 unknown
//	    topic      uvarint length (at most 65535) and bytes
//	    payload    uvarint length (at most MaxPayloadBytes) and bytes
//
// A record carries no offset: it is its segment's base plus its index in
// the segment, and the segments must be contiguous. Decoders accept
// exactly the encodings the encoder produces (minimal varints, no
// trailing bytes) and never panic. Later versions bump the version.
//
// # Concurrency
//
// Append, Truncate, Reader, Stats and Close are safe for concurrent use.
// Append blocks on disk I/O and, when the log is full, on Truncate. A
// Reader belongs to one goroutine; it polls with TryNext, which never
// blocks, and waits with Ready (a channel for select) or Next. Each
// Reader reads through its own file handle, so reading does not hold up
// appends. The package starts no goroutines.
package ingestlog
