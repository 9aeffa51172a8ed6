package ingestlog

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"
)

// idFile holds the log's identity (ID): 16 random bytes, written when the
// log is opened for the first time, then their CRC32C.
const idFile = "ID"

// idBytes is the length of a log's identity before its hex encoding.
const idBytes = 16

// ID returns the log's identity: 32 hex digits drawn at random when the
// directory's log was first opened, kept in the file ID beside the
// segments. Two logs never share one unless one directory was copied
// from the other (a data_dir moved to another card, say). An offset means
// a record only in the log it was taken from; the MQTT source stores the
// identity with its offset, so that a snapshot restored onto another
// log (another node's, another data_dir's) is told apart. "" when the
// file is damaged or could not be written (a full card): callers then
// cannot check, as before the file existed.
func (l *Log) ID() string { return l.id }

// loadID returns the identity kept in dir, creating it when dir has none.
// A damaged file, or one that cannot be written, gives "" and a warning:
// the identity only guards, and its loss must not stop the log.
func loadID(dir string, logger interface {
	Warn(msg string, args ...any)
}) string {
	path := filepath.Join(dir, idFile)
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		if len(b) != idBytes+4 || crc32.Checksum(b[:idBytes], castagnoli) != binary.LittleEndian.Uint32(b[idBytes:]) {
			logger.Warn("ingest log: its identity's file is damaged; snapshots restored onto it are not checked against it",
				"dir", dir, "file", idFile)
			return ""
		}
		return hex.EncodeToString(b[:idBytes])
	case !errors.Is(err, fs.ErrNotExist):
		logger.Warn("ingest log: cannot read its identity's file; snapshots restored onto it are not checked against it",
			"dir", dir, "file", idFile, "err", err)
		return ""
	}
	id := make([]byte, idBytes)
	if _, err := rand.Read(id); err != nil {
		logger.Warn("ingest log: cannot draw an identity", "dir", dir, "err", err)
		return ""
	}
	b = binary.LittleEndian.AppendUint32(id, crc32.Checksum(id, castagnoli))
	if err := writeAtomic(dir, idFile, b); err != nil {
		logger.Warn("ingest log: cannot write its identity's file (it is written at the next open); snapshots restored onto it meanwhile are not checked against it",
			"dir", dir, "file", idFile, "err", err)
		return ""
	}
	return hex.EncodeToString(id)
}

// writeAtomic writes b to dir/name through a temporary file, fsynced and
// renamed into place, the rename fsynced with dir.
func writeAtomic(dir, name string, b []byte) error {
	path := filepath.Join(dir, name)
	tmp := path + ".tmp"
	err := func() error {
		f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
		if err != nil {
			return err
		}
		if _, err := f.Write(b); err != nil {
			f.Close()
			return err
		}
		if err := f.Sync(); err != nil {
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
		if err := os.Rename(tmp, path); err != nil {
			return err
		}
		return syncDir(dir) // the rename itself survives a power loss
	}()
	if err != nil {
		os.Remove(tmp)
	}
	return err
}
