package operators

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// An operator built with a nil function (or writer, or system) fails Open
// with an error naming what is missing. Before, the first record failed
// the task with a nil pointer dereference that named no argument.
func TestOperatorsWithNilArgumentsFailOpen(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "in")
	if err := os.WriteFile(file, []byte("a\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		op   interface{ Open(*Context) error }
		want string
	}{
		{"NewSinkFunc", NewSinkFunc[int](nil), "the function is nil"},
		{"NewFileSink", NewFileSink[int](filepath.Join(dir, "fs"), nil), "file sink: the format function is nil"},
		{"NewLineFileSink", NewLineFileSink[int](filepath.Join(dir, "ls"), nil), "line file sink: the format function is nil"},
		{"NewLineFileSource", NewLineFileSource[int](file, nil), "line file source: the parse function is nil"},
		{"NewPrintSink writer", NewPrintSink(nil, func(int) string { return "" }), "print sink: the writer is nil"},
		{"NewPrintSink format", NewPrintSink[int](os.Stdout, nil), "print sink: the format function is nil"},
		{"NewWriteAheadSink", NewWriteAheadSink[int](nil, nil), "write-ahead sink: the publish function is nil"},
		{"NewTwoPhaseCommitSink", NewTwoPhaseCommitSink[int, FileTx](nil, fileTxCodec{}), "two-phase commit sink: the Transactional is nil"},
	} {
		err := c.op.Open(&Context{Parallelism: 1, UID: "op"})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Open: %v, want %q", c.name, err, c.want)
		}
		if cl, ok := c.op.(interface{ Close() error }); ok {
			if err := cl.Close(); err != nil {
				t.Errorf("%s: Close after a failed Open: %v", c.name, err)
			}
		}
	}
}
