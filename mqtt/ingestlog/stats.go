package ingestlog

import "time"

// Stats is a snapshot of a Log's position, size and counters. Counters
// start at zero when the Log is opened.
type Stats struct {
	// FirstOffset is the offset of the oldest record still on disk.
	FirstOffset uint64
	// NextOffset is the offset the next Append gets.
	NextOffset uint64
	// DurableOffset is one past the last fsynced record; Readers see the
	// records below it.
	DurableOffset uint64
	// ReleasedOffset is the highest offset given to Truncate (after Open,
	// FirstOffset).
	ReleasedOffset uint64
	// Segments is the number of segment files.
	Segments int
	// DiskBytes is the size of the segment files, counting the records
	// appended but not yet written (held for the next group commit).
	DiskBytes int64
	// UnreleasedBytes is the size of the records at or after
	// ReleasedOffset: what Options.MaxBytes bounds.
	UnreleasedBytes int64
	// Appends counts the records appended.
	Appends uint64
	// AppendedBytes counts the bytes of the records appended, framing
	// included.
	AppendedBytes uint64
	// Writes counts the write system calls to segment files that
	// appended records: one per group commit, plus one per
	// pendFlushBytes appended between group commits, plus one per record
	// of at least that size.
	Writes uint64
	// Fsyncs counts fsyncs of segment files and of the directory.
	Fsyncs uint64
	// Blocked counts the Appends that had to wait for space.
	Blocked uint64
	// BlockedTime is the total time Appends waited for space.
	BlockedTime time.Duration
	// Waiting is the number of Appends waiting for space now.
	Waiting int
	// Shed counts the records not stored, since the log was full while
	// it shed (Log.ShedWhenFull).
	Shed uint64
	// TornBytes is what Open cut off as a torn tail.
	TornBytes int64
	// NoSpace counts the spells in which writes found no space on the
	// device (ENOSPC, EDQUOT) and appends waited for it.
	NoSpace uint64
	// NoSpaceRetries counts the tries again of appends whose own write
	// found no space (a record written alone, or one that starts a
	// segment): they wait and write again rather than fail.
	NoSpaceRetries uint64
	// NoSpaceNow reports whether records wait for space on the device
	// now.
	NoSpaceNow bool
}

// Stats returns the log's current statistics.
func (l *Log) Stats() Stats {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.stats
	s.FirstOffset = l.segs[0].base
	s.NextOffset = l.next
	s.DurableOffset = l.durable
	s.ReleasedOffset = l.released
	s.Segments = len(l.segs)
	s.DiskBytes = l.diskBytes
	s.UnreleasedBytes = l.unreleased
	s.Waiting = l.waiting
	s.NoSpaceNow = l.noSpace != nil
	return s
}
