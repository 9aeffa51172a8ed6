package ingestlog

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A log whose tail was cut below the offset a completed checkpoint read
// it up to (SetCheckpointed) is refused at Open with ErrRecordsGone:
// those records were acknowledged, and a restore from the checkpoint
// would land on the records that take their offsets next. A cut above
// that offset is a torn tail as before, a damaged guard file is only
// logged, and a lower offset changes nothing. Before, Open cut such a
// tail as torn and went on.
func TestOpenRefusesALogCutBelowTheCheckpointedOffset(t *testing.T) {
	dir := t.TempDir()
	l, err := Open(dir, testOptions(1<<20), nil)
	if err != nil {
		t.Fatal(err)
	}
	appendN(t, l, 0, 10)
	if err := l.SetCheckpointed(6); err != nil {
		t.Fatal(err)
	}
	if err := l.SetCheckpointed(4); err != nil { // lower: changes nothing
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	seg := lastSegment(t, dir)
	cut := func(records int) {
		t.Helper()
		fi, err := os.Stat(seg)
		if err != nil {
			t.Fatal(err)
		}
		pos, err := seekFile(seg, indexEntry{off: 0, pos: headerSize}, uint64(records), fi.Size())
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(seg, pos+3); err != nil { // into the record at offset records
			t.Fatal(err)
		}
	}

	// Cut to 8 records: above the checkpointed 6, a torn tail.
	cut(8)
	l = openLog(t, dir, testOptions(1<<20), nil)
	checkRecords(t, readAll(t, l, 0), 0, 8)
	l.Close()

	// Cut to 5 records: below it, refused.
	cut(5)
	_, err = Open(dir, testOptions(1<<20), nil)
	if !errors.Is(err, ErrRecordsGone) || !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Open of a log cut below the checkpointed offset: %v, want ErrRecordsGone", err)
	}
	if msg := err.Error(); !strings.Contains(msg, "up to offset 6") || !strings.Contains(msg, "ends at offset 5") {
		t.Fatalf("the error %q does not name both offsets", msg)
	}

	// A damaged guard file is logged and not checked.
	if err := os.WriteFile(filepath.Join(dir, checkpointedFile), []byte("garbage"), 0o644); err != nil {
		t.Fatal(err)
	}
	logger, logs := newLogger()
	l = openLog(t, dir, testOptions(1<<20), logger)
	if !strings.Contains(logs.String(), "checkpointed offset's file is damaged") {
		t.Fatalf("damaged guard file not logged:\n%s", logs)
	}
	checkRecords(t, readAll(t, l, 0), 0, 5)
}
