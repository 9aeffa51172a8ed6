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
//   - Records are batched in offset order: an appended record is held in
//     memory with the others appended since the last group commit, and
//     the leader takes them all, writes them with one write, fsyncs, and
//     only then advances the durable offset to the end of what it took
//     (AppendNoWait returns at once; WaitDurable reports a record durable
//     only after the fsync that covers it has returned). Appends go on
//     into the next batch meanwhile. More than 256 KiB held, a record of
//     that size, a segment roll or Close write what is held at once
//     (without an fsync), so memory stays bounded.
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
//   - Open recovers (see Recovery): it reads every record of every
//     segment, cuts a torn tail off the last one, and fails with a
//     *CorruptError (ErrCorrupt) on damage to records that were
//     acknowledged, or anywhere in an earlier segment.
//   - A write or fsync error stops the log (ErrFailed): after a failed
//     fsync the kernel may have dropped the dirty pages, so only a reopen,
//     which reads what really is on disk, can continue. A write that
//     fails for want of space (ENOSPC, EDQUOT) does not: its records keep
//     their offsets and wait in memory (at most pendFlushBytes; further
//     Appends wait, as for a full log), their Appends do not return, and
//     the group commit writes the same bytes at the same place again
//     every NoSpaceRetry until a write succeeds (Stats.NoSpace,
//     Stats.NoSpaceNow). An Append whose own write finds no space (a
//     record that starts a segment, or one written alone) waits too and
//     writes again every NoSpaceRetry (Stats.NoSpaceRetries) until it
//     succeeds or its ctx is done (then nothing is stored and the error
//     wraps ctx.Err() and ErrNoSpace).
//   - Close cuts the active segment back to its durable size when records
//     could not be made durable, so a reopen does not keep the whole
//     records a short write left of appends that failed (their publishers
//     send them again).
//
// # Recovery
//
// Only the last segment can hold records that were never acknowledged:
// records are written (in batches), then fsynced, and an Append is acknowledged
// (returns) when the fsync covering it returned; a segment is sealed with
// an fsync before the next one is created. A power loss can leave
// anything after the last fsync that returned, since the file system
// writes pages back in any order: a partial record, a hole of zeros
// followed by whole records, garbage. Open applies this rule:
//
//  1. Any damage in a sealed (earlier) segment, or segments that are not
//     contiguous, fails Open with a *CorruptError (ErrCorrupt) naming the
//     segment and offset: that needs a person, not a guess.
//  2. In the last segment, the valid records before the first damaged one
//     (a bad length, partial record, checksum or body, whatever follows
//     it) are kept. If a valid record anywhere after the damage carries a
//     commit mark greater than the damaged record's offset, the damaged
//     record had been fsynced, so it was acknowledged: Open fails with a
//     *CorruptError that says so.
//  3. Otherwise the damaged record and everything after it are a torn
//     tail, since nothing there is proven acknowledged. It is cut off (the
//     file truncated and fsynced) and logged with the bytes dropped
//     (Stats.TornBytes). A last segment whose header never made it to
//     disk (short or all zeros) is removed.
//
// A record carries a commit mark D, "every record before offset D was
// fsynced before this record was written", when the durable offset moved
// since the last mark was written: in the first record written after each
// group commit, at a cost of a uvarint (1-5 bytes) per group commit. The
// first record of a segment carries none (everything before it is sealed).
// Open makes every record it keeps durable, so the first record appended
// after it marks them all. Options.MaxBytes counts the marks.
//
// What holds: an acknowledged record is never dropped silently if a record
// written after its fsync survives, which is so for every acknowledged
// record except those of the last group commit before the crash. Damage to
// that last group commit (a storage fault, not a crash: fsynced data
// survives a power loss on a device that honours fsync) cannot be told
// from a torn write and is cut as torn. Valid records written but never
// fsynced are kept when they come before the first damage; the broker
// redelivers them too, which the mqtt Subscriber's deduplication handles.
// Logs written before commit marks existed carry none, so in their last
// segment any damage counts as torn.
//
// # Files
//
// The directory holds a LOCK file (flock, so one Log per directory), an
// ID file (the log's identity, Log.ID: 16 random bytes drawn at the first
// Open, then their CRC32C), a CHECKPOINTED file (Log.SetCheckpointed) and
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
//	    flags      byte     bits 0-1 QoS (0..2), bit 2 retain, bit 3
//	                        packet id present, bit 4 commit mark
//	                        present, bit 5 dead letter (too large),
//	                        bit 6 redelivery note (Message.Note; only
//	                        with bit 3), bit 7 0
//	    received   varint   receive time, ns since the Unix epoch; 0 unknown
//	    packet id  uvarint  1..65535, if bit 3: the MQTT packet identifier
//	    too large  uvarint  if bit 5: the size of the message that was
//	                        too large to keep (Message.TooLarge), at least
//	                        the payload bytes kept
//	    topic      uvarint length (at most 65535) and bytes
//	    payload    uvarint length (at most MaxPayloadBytes) and bytes
//	    mark       uvarint  if bit 4: the commit mark D, at most the
//	                        record's own offset
//
// A record carries no offset: it is its segment's base plus its index in
// the segment, and the segments must be contiguous. Decoders accept
// exactly the encodings the encoder produces (minimal varints, no
// trailing bytes) and never panic. Bits 3, 4, 5 and 6 were added within
// version 1: records without them are the original format and read as
// before (PacketID 0, no mark); a build that predates them rejects a
// record that has them (ErrRecordBody). Incompatible changes bump the
// version.
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
