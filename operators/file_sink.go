package operators

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/edgedio/edged/codec"
	"github.com/edgedio/edged/internal/fsutil"
)

// FileTx is a transaction of the transactional file sink: one part file.
type FileTx struct {
	Name string
	// Data is the part file's content, carried in the checkpoint by a
	// sink made with FileSinkOptions.CarryParts once pre-committed (non-nil
	// then, even when empty); nil otherwise. Either kind of sink makes it
	// empty and non-nil for a transaction nothing was written to: no part
	// file exists for it, and committing it writes none.
	Data []byte
}

// fileTxCodec encodes a FileTx as codec.For did before Data existed
// (the name, length-prefixed) when it carries no data, so snapshots of
// either kind of sink restore into both; one with data starts with a 0
// byte (a name is never empty), then the name and the data, each
// length-prefixed.
type fileTxCodec struct{}

func (fileTxCodec) Append(dst []byte, tx FileTx) ([]byte, error) {
	if tx.Name == "" {
		return dst, errors.New("file sink: transaction without a name")
	}
	if tx.Data != nil {
		dst = append(dst, 0)
	}
	dst = binary.AppendUvarint(dst, uint64(len(tx.Name)))
	dst = append(dst, tx.Name...)
	if tx.Data != nil {
		dst = binary.AppendUvarint(dst, uint64(len(tx.Data)))
		dst = append(dst, tx.Data...)
	}
	return dst, nil
}

func (fileTxCodec) Decode(src []byte) (FileTx, int, error) {
	carried := len(src) > 0 && src[0] == 0
	n := 0
	if carried {
		n = 1
	}
	field := func() ([]byte, error) {
		l, k := binary.Uvarint(src[n:])
		if k <= 0 || l > uint64(len(src)-n-k) {
			return nil, fmt.Errorf("file sink: transaction: %w", codec.ErrCorrupt)
		}
		b := src[n+k : n+k+int(l)]
		n += k + int(l)
		return b, nil
	}
	name, err := field()
	if err != nil || len(name) == 0 {
		return FileTx{}, 0, fmt.Errorf("file sink: transaction: %w", codec.ErrCorrupt)
	}
	tx := FileTx{Name: string(name)}
	if carried {
		data, err := field()
		if err != nil {
			return FileTx{}, 0, err
		}
		tx.Data = append(make([]byte, 0, len(data)), data...)
	}
	return tx, n, nil
}

// fileTransactions writes each transaction to its own part file in a
// directory: records go to ".<name>.inprogress", created by the first
// record; pre-commit flushes, fsyncs and renames it to ".<name>.pending";
// commit renames that to "<name>" (the only files readers should take: no
// leading dot). Renames are atomic and followed by an fsync of the
// directory. A transaction nothing was written to has no file at all: a
// sink whose input is quiet (a dead-letter output, most of the time)
// leaves no empty part per checkpoint and does no fsync for it, whether
// or not it carries its parts.
type fileTransactions[T any] struct {
	dir     string
	format  func(T) string
	carry   bool
	subtask int
	par     int
	prefix  string
	seq     int64
	// f is the open transaction's part file, nil until its first record.
	f       *os.File
	w       *bufio.Writer
	current string
}

// NewFileSink returns an exactly-once file sink: a TwoPhaseCommitSink over
// part files in dir, one line format(v) per record. A part file becomes
// visible (its name loses the leading dot) only when the checkpoint that
// covers its records completes, so after any failure and restore the
// visible files hold every record exactly once.
func NewFileSink[T any](dir string, format func(T) string) *TwoPhaseCommitSink[T, FileTx] {
	return NewFileSinkWith(dir, format, FileSinkOptions{})
}

// FileSinkOptions tune NewFileSinkWith.
type FileSinkOptions struct {
	// CarryParts puts each pre-committed part file's content in the
	// checkpoint, so that a subtask restored on another machine, whose
	// dir does not hold the part, commits it there from the checkpoint
	// (a cluster whose nodes each have their own dir). A part the old
	// machine had committed as well is then in both dirs under the same
	// name: read the union taking each part name once. Checkpoints grow
	// by the output of one checkpoint interval per subtask.
	CarryParts bool
}

// NewFileSinkWith is NewFileSink with options.
func NewFileSinkWith[T any](dir string, format func(T) string, o FileSinkOptions) *TwoPhaseCommitSink[T, FileTx] {
	return NewTwoPhaseCommitSink[T, FileTx](&fileTransactions[T]{dir: dir, format: format, carry: o.CarryParts}, fileTxCodec{})
}

func (f *fileTransactions[T]) Open(ctx *Context) error {
	if f.format == nil {
		return errors.New("file sink: the format function is nil: give NewFileSink a func(T) string")
	}
	if err := os.MkdirAll(f.dir, 0o755); err != nil {
		return fmt.Errorf("file sink: %w", err)
	}
	f.subtask, f.par = ctx.Subtask, ctx.Parallelism
	// Part names carry the subtask and the attempt's start time, so no two
	// attempts or subtasks ever use the same name.
	f.prefix = fmt.Sprintf("part-%d-%d-", ctx.Subtask, ctx.Clock.Now().UnixNano())
	// In-progress files of earlier attempts of this subtask were never
	// pre-committed: nothing can commit them; remove them.
	stale, _ := filepath.Glob(filepath.Join(f.dir, fmt.Sprintf(".part-%d-*.inprogress", ctx.Subtask)))
	for _, p := range stale {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("file sink: remove stale %s: %w", p, err)
		}
	}
	return nil
}

// CleanStale removes the part files earlier runs of this subtask left
// uncommitted: in-progress ones, and pending ones of checkpoints that never
// completed (the restore committed those of the restored checkpoint, and
// replay writes the rest again). Subtask 0 also removes those of subtasks
// the job no longer has. The sink calls it once, after the restore and
// before its first pre-commit, when it has no pending transaction of its
// own.
func (f *fileTransactions[T]) CleanStale() error {
	entries, err := os.ReadDir(f.dir)
	if err != nil {
		return fmt.Errorf("file sink: %w", err)
	}
	for _, e := range entries {
		name := e.Name()
		base, ok := strings.CutPrefix(name, ".")
		if !ok || name == "."+f.current+".inprogress" {
			continue
		}
		if b, ok := strings.CutSuffix(base, ".pending"); ok {
			base = b
		} else if b, ok := strings.CutSuffix(base, ".inprogress"); ok {
			base = b
		} else if b, ok := strings.CutSuffix(base, ".restoring"); ok {
			base = b
		} else {
			continue
		}
		rest, ok := strings.CutPrefix(base, "part-")
		if !ok {
			continue
		}
		num, _, ok := strings.Cut(rest, "-")
		sub, err := strconv.Atoi(num)
		if !ok || err != nil || (sub != f.subtask && (f.subtask != 0 || sub < f.par)) {
			continue
		}
		if err := os.Remove(filepath.Join(f.dir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("file sink: remove stale %s: %w", name, err)
		}
	}
	return nil
}

func (f *fileTransactions[T]) path(name, state string) string {
	if state == "" {
		return filepath.Join(f.dir, name)
	}
	return filepath.Join(f.dir, "."+name+"."+state)
}

func (f *fileTransactions[T]) Begin() (FileTx, error) {
	f.seq++
	tx := FileTx{Name: f.prefix + fmt.Sprint(f.seq)}
	f.f, f.current = nil, tx.Name
	return tx, nil
}

// create creates the open transaction's part file, at its first record.
func (f *fileTransactions[T]) create() error {
	file, err := os.OpenFile(f.path(f.current, "inprogress"), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("file sink: %w", err)
	}
	f.f = file
	if f.w == nil {
		f.w = bufio.NewWriterSize(file, 64<<10)
	} else {
		f.w.Reset(file)
	}
	return nil
}

func (f *fileTransactions[T]) Write(tx FileTx, v T) error {
	if tx.Name != f.current || tx.Name == "" {
		return fmt.Errorf("file sink: write to %s, which is not the open transaction", tx.Name)
	}
	if f.f == nil {
		if err := f.create(); err != nil {
			return err
		}
	}
	if _, err := f.w.WriteString(f.format(v)); err != nil {
		return err
	}
	return f.w.WriteByte('\n')
}

func (f *fileTransactions[T]) PreCommit(tx FileTx) error {
	if tx.Name != f.current || tx.Name == "" {
		return fmt.Errorf("file sink: pre-commit of %s, which is not the open transaction", tx.Name)
	}
	if f.f == nil { // nothing written: no part file
		f.current = ""
		return nil
	}
	if err := f.w.Flush(); err != nil {
		return err
	}
	if err := f.f.Sync(); err != nil {
		return err
	}
	if err := f.f.Close(); err != nil {
		return err
	}
	f.f, f.current = nil, ""
	if err := os.Rename(f.path(tx.Name, "inprogress"), f.path(tx.Name, "pending")); err != nil {
		return err
	}
	return fsutil.SyncDir(f.dir)
}

// preCommitTx pre-commits tx and, when the sink carries its parts, puts
// the part's content in the transaction kept pending.
func (f *fileTransactions[T]) preCommitTx(tx FileTx) (FileTx, error) {
	empty := tx.Name == f.current && f.f == nil
	if err := f.PreCommit(tx); err != nil {
		return tx, err
	}
	if empty {
		// Marked in the checkpoint, so that its commit (here, or in a
		// restore) knows there is no file to rename.
		tx.Data = []byte{}
		return tx, nil
	}
	if !f.carry {
		return tx, nil
	}
	data, err := os.ReadFile(f.path(tx.Name, "pending"))
	if err != nil {
		return tx, fmt.Errorf("file sink: %w", err)
	}
	if data == nil {
		data = []byte{}
	}
	tx.Data = data
	return tx, nil
}

func (f *fileTransactions[T]) Commit(tx FileTx) error {
	err := os.Rename(f.path(tx.Name, "pending"), f.path(tx.Name, ""))
	if errors.Is(err, fs.ErrNotExist) {
		if _, statErr := os.Stat(f.path(tx.Name, "")); statErr == nil {
			return nil // committed before
		}
		if tx.Data != nil {
			// Pre-committed on another machine: commit it here from the
			// content the checkpoint carried.
			return f.commitCarried(tx)
		}
		return fmt.Errorf("file sink: commit %s: neither pending nor committed", tx.Name)
	}
	if err != nil {
		return err
	}
	return fsutil.SyncDir(f.dir)
}

// commitCarried writes the part tx carries and commits it: written to
// ".<name>-<random>.restoring", fsynced, renamed to <name>.
// A transaction nothing was written to (empty content) has nothing to
// commit: no part file is written for it.
func (f *fileTransactions[T]) commitCarried(tx FileTx) error {
	if len(tx.Data) == 0 {
		return nil
	}
	// A file of its own: after a restore at another parallelism every
	// new subtask commits every pending transaction, at once.
	file, err := os.CreateTemp(f.dir, "."+tx.Name+"-*.restoring")
	if err != nil {
		return fmt.Errorf("file sink: commit %s from the checkpoint: %w", tx.Name, err)
	}
	tmp := file.Name()
	_, err = file.Write(tx.Data)
	if err == nil {
		err = file.Chmod(0o644)
	}
	if err == nil {
		err = file.Sync()
	}
	if cerr := file.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, f.path(tx.Name, ""))
		if errors.Is(err, fs.ErrNotExist) {
			// The subtask whose part it is removed it as stale: it had
			// committed the part before.
			if _, statErr := os.Stat(f.path(tx.Name, "")); statErr == nil {
				return nil
			}
		}
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("file sink: commit %s from the checkpoint: %w", tx.Name, err)
	}
	return fsutil.SyncDir(f.dir)
}

func (f *fileTransactions[T]) Abort(tx FileTx) error {
	if tx.Name == f.current {
		if f.f != nil {
			f.f.Close()
		}
		f.f, f.current = nil, ""
	}
	for _, state := range []string{"inprogress", "pending"} {
		if err := os.Remove(f.path(tx.Name, state)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}

// CommittedParts returns the paths of the committed part files of a file
// sink directory, in name order.
func CommittedParts(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if !e.IsDir() && strings.HasPrefix(e.Name(), "part-") {
			out = append(out, filepath.Join(dir, e.Name()))
		}
	}
	return out, nil
}
