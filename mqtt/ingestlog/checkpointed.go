package ingestlog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"
)

// checkpointedFile holds the highest offset a completed checkpoint
// recorded as its position in the log (SetCheckpointed): 8 bytes, little
// endian, then their CRC32C.
const checkpointedFile = "CHECKPOINTED"

// SetCheckpointed records, in the log's directory, that a completed
// checkpoint read the log up to offset off (its position: every record
// below off was acknowledged and read). Open then refuses a log that
// ends before the highest such offset (ErrRecordsGone): those records
// were acknowledged, so a cut tail that took them (a damaged or
// truncated last segment, which recovery cannot tell from a torn write)
// is damage to acknowledged data, and a restore from that checkpoint
// would land on whatever records take the offsets next. An offset not
// above the recorded one changes nothing. The MQTT source calls it when
// a checkpoint completes.
func (l *Log) SetCheckpointed(off uint64) error {
	l.cpMu.Lock()
	defer l.cpMu.Unlock()
	if off <= l.checkpointed {
		return nil
	}
	b := binary.LittleEndian.AppendUint64(nil, off)
	b = binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
	if err := writeAtomic(l.dir, checkpointedFile, b); err != nil {
		return fmt.Errorf("ingestlog: record the checkpointed offset %d: %w", off, err)
	}
	l.checkpointed = off
	return nil
}

// Checkpointed returns the highest offset SetCheckpointed recorded (read
// from the log's directory at Open, 0 when none is): every record below
// it was read by a checkpoint that completed.
func (l *Log) Checkpointed() uint64 {
	l.cpMu.Lock()
	defer l.cpMu.Unlock()
	return l.checkpointed
}

// readCheckpointed returns the offset recorded by SetCheckpointed, 0 when
// none is, and whether the file was damaged (then 0 too: it only guards,
// and its loss must not stop the log).
func readCheckpointed(dir string) (off uint64, damaged bool, err error) {
	b, err := os.ReadFile(filepath.Join(dir, checkpointedFile))
	if errors.Is(err, fs.ErrNotExist) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("ingestlog: %w", err)
	}
	if len(b) != 12 || crc32.Checksum(b[:8], castagnoli) != binary.LittleEndian.Uint32(b[8:]) {
		return 0, true, nil
	}
	return binary.LittleEndian.Uint64(b[:8]), false, nil
}
