package ingestlog

import (
	"errors"
	"fmt"
)

// Configuration and use.
var (
	// ErrInvalidOptions is wrapped by every problem Options.Validate reports.
	ErrInvalidOptions = errors.New("ingestlog: invalid options")
	// ErrLocked means another Log (in this or another process) has the
	// directory open.
	ErrLocked = errors.New("ingestlog: directory in use by another log")
	// ErrClosed is returned by every method of a closed Log, by the
	// Readers of a closed Log, and by a closed Reader.
	ErrClosed = errors.New("ingestlog: log closed")

	// ErrShed is returned by an append to a full log that sheds (see
	// Log.ShedWhenFull): nothing was stored, at once.
	ErrShed = errors.New("ingestlog: log full and shedding; record not stored")
	// ErrInvalidMessage means Append was given a message it cannot store: a
	// QoS above 2, a topic longer than 65535 bytes or a payload longer than
	// MaxPayloadBytes.
	ErrInvalidMessage = errors.New("ingestlog: invalid message")
	// ErrTooLarge means the framed record does not fit in one segment
	// (Options.SegmentBytes less the segment header) or exceeds
	// Options.MaxBytes, so it could never be appended.
	ErrTooLarge = errors.New("ingestlog: record too large")
	// ErrOutOfRange means an offset beyond the log's next offset was given
	// to Reader or Truncate.
	ErrOutOfRange = errors.New("ingestlog: offset beyond the end of the log")
	// ErrTruncated means the records asked for were deleted by Truncate: a
	// Reader from an offset before the first one still on disk, or a Reader
	// that fell behind the first offset.
	ErrTruncated = errors.New("ingestlog: records already truncated")
	// ErrFailed wraps the write or fsync error that stopped the log. After
	// a failed fsync the kernel may have dropped the dirty pages, so the
	// log refuses further appends; Close it and Open the directory again,
	// which recovers what really is on disk.
	ErrFailed = errors.New("ingestlog: log failed; reopen it")
	// ErrNoSpace wraps a write that failed for want of space on the
	// device (ENOSPC, EDQUOT). It does not fail the log: records that
	// have their offsets wait in memory and are written again every
	// NoSpaceRetry until a write succeeds. An Append whose own write
	// found no space waits and writes again the same way; one whose ctx
	// ended that wait returns it (with ctx.Err()), its record not stored.
	ErrNoSpace = errors.New("ingestlog: no space left on the device")
	// ErrRecordsGone is returned by Open for a log that ends before the
	// offset a completed checkpoint read it up to (Log.SetCheckpointed):
	// acknowledged records are gone. It wraps ErrCorrupt too.
	ErrRecordsGone = fmt.Errorf("%w: records a completed checkpoint read are gone", ErrCorrupt)
)

// Decoding; each failure has its own error.
var (
	// ErrBadMagic means a segment file does not start with the segment
	// magic.
	ErrBadMagic = errors.New("ingestlog: not a log segment (bad magic)")
	// ErrVersion means a segment has a format version this build cannot
	// read.
	ErrVersion = errors.New("ingestlog: unsupported segment version")
	// ErrChecksum means a CRC32C does not match: of a segment header, or
	// (wrapped in a CorruptError) of a record.
	ErrChecksum = errors.New("ingestlog: checksum mismatch")
	// ErrCorrupt is wrapped by every CorruptError, and by a segment whose
	// header disagrees with its file name.
	ErrCorrupt = errors.New("ingestlog: corrupt log")
	// ErrRecordLength means a record's length field is outside the range a
	// record can have, or the record runs past the end of a segment that
	// is not the last one.
	ErrRecordLength = errors.New("ingestlog: invalid record length")
	// ErrRecordBody means a record's checksum matches but its body is not
	// exactly one valid encoding.
	ErrRecordBody = errors.New("ingestlog: malformed record body")
	// ErrGap means consecutive segments are not contiguous: a segment does
	// not start at the offset after the last record of the one before.
	ErrGap = errors.New("ingestlog: segments not contiguous")
)

// CorruptError reports damage inside a segment that recovery must not
// silently repair: a bad record in a segment that is not the last one, or
// a bad record of the last one that a later record's commit mark proves
// was acknowledged (see Recovery in the package doc). errors.Is matches
// both ErrCorrupt and the
// cause (ErrChecksum, ErrRecordLength, ErrRecordBody, ErrGap).
type CorruptError struct {
	// Segment is the path of the segment file.
	Segment string
	// Offset is the log offset of the damaged record (for ErrGap, the
	// offset the segment should have started at).
	Offset uint64
	// Pos is the byte position of the damaged record in the file.
	Pos int64
	// Err is the cause.
	Err error
}

// Error implements error.
func (e *CorruptError) Error() string {
	return fmt.Sprintf("ingestlog: corrupt segment %s: record at offset %d (byte %d): %v",
		e.Segment, e.Offset, e.Pos, e.Err)
}

// Unwrap returns ErrCorrupt and the cause.
func (e *CorruptError) Unwrap() []error { return []error{ErrCorrupt, e.Err} }
