package operators

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/edgedio/edged/codec"
)

// Transactional is an external system a TwoPhaseCommitSink writes to in
// transactions of type TX (a transaction handle: a file name, a batch id).
// TX must have a codec: pending transactions are part of the checkpoint.
// Its methods run on the sink subtask's goroutine.
type Transactional[T, TX any] interface {
	// Begin starts a transaction.
	Begin() (TX, error)
	// Write adds v to tx.
	Write(tx TX, v T) error
	// PreCommit makes tx durable but not yet visible (flush, fsync); it is
	// called at the checkpoint barrier. After it, tx may only be committed
	// or aborted.
	PreCommit(tx TX) error
	// Commit makes a pre-committed tx visible. It must be idempotent: after
	// a recovery it is called again for transactions that may already have
	// been committed.
	Commit(tx TX) error
	// Abort drops tx. It must accept a tx that was already aborted or never
	// written.
	Abort(tx TX) error
}

// TwoPhaseCommitSink gives exactly-once output to a Transactional system,
// like Flink's TwoPhaseCommitSinkFunction: records go into the current
// transaction; at the barrier of checkpoint n the transaction is
// pre-committed, remembered in the checkpoint as pending for n, and a new
// one begins; when checkpoint n completes, every pending transaction up to
// n is committed. On restore, the transactions pending in the restored
// checkpoint (which completed) are committed again — Commit is idempotent —
// and nothing written after it is ever committed. A transaction open when
// a job fails is aborted at Close.
type TwoPhaseCommitSink[T, TX any] struct {
	Base
	sys     Transactional[T, TX]
	codec   codec.Codec[TX]
	current TX
	open    bool
	pending []pendingTx[TX]
	// final: the job takes a final checkpoint after Finish, which
	// pre-commits and commits the last transaction.
	final bool
	// cleaned: what earlier runs left was cleaned up.
	cleaned bool
	// tell is Context.OutputHeld until the run's first record told it.
	tell func()
	// restoredCommitted: the snapshot restored was committed by every
	// sink before the job stopped (Context.RestoredCommitted).
	restoredCommitted bool
}

// StaleCleaner is a Transactional system that can drop what earlier runs
// left uncommitted: transactions never pre-committed, and pre-committed
// ones of checkpoints that never completed (a failure after the barrier
// and before the completion leaves them: the checkpoint restored does
// not name them, so nothing else aborts them).
//
// Each sink subtask calls CleanStale on its own system once per run,
// after its RestoreState committed what the restored checkpoint holds and
// before its first pre-commit, with nothing of its own pending: what this
// subtask wrote then that is not committed is stale. The subtasks do not
// wait for each other, so when one cleans another may have pre-committed
// a transaction of this run already: a system the subtasks share must
// drop only the transactions of the subtask it serves (name each with
// its subtask: an Open(*Context) method of the system gets Subtask and
// Parallelism), and, in subtask 0, those of subtasks at or above the
// parallelism (left by a run at a higher one), as the file sink does. A
// Transactional without it leaves such transactions to itself (a system
// whose uncommitted transactions expire, such as a database's, need
// not implement it).
type StaleCleaner interface {
	CleanStale() error
}

// clean lets the system drop what earlier runs left, once: after the
// restore committed what the restored checkpoint holds, before the first
// pre-commit of this run.
func (s *TwoPhaseCommitSink[T, TX]) clean() error {
	if s.cleaned {
		return nil
	}
	s.cleaned = true
	if c, ok := s.sys.(StaleCleaner); ok {
		if err := c.CleanStale(); err != nil {
			return fmt.Errorf("two-phase commit sink: clean stale transactions: %w", err)
		}
	}
	return nil
}

// txPreCommitter is a Transactional whose pre-commit gives the
// transaction to keep pending in its place (the file sink carrying its
// parts adds their content).
type txPreCommitter[TX any] interface {
	preCommitTx(tx TX) (TX, error)
}

// preCommit pre-commits tx and returns the transaction to keep pending.
func (s *TwoPhaseCommitSink[T, TX]) preCommit(tx TX) (TX, error) {
	if p, ok := s.sys.(txPreCommitter[TX]); ok {
		return p.preCommitTx(tx)
	}
	return tx, s.sys.PreCommit(tx)
}

type pendingTx[TX any] struct {
	checkpoint int64
	tx         TX
}

// NewTwoPhaseCommitSink returns a sink writing to sys, encoding pending
// transactions with c (nil: codec.For[TX]).
func NewTwoPhaseCommitSink[T, TX any](sys Transactional[T, TX], c codec.Codec[TX]) *TwoPhaseCommitSink[T, TX] {
	if c == nil {
		c = codec.For[TX]()
	}
	return &TwoPhaseCommitSink[T, TX]{sys: sys, codec: c}
}

// Open opens the system (when it has an Open(*Context) error method) and
// begins the first transaction.
func (s *TwoPhaseCommitSink[T, TX]) Open(ctx *Context) error {
	if s.sys == nil {
		return errors.New("two-phase commit sink: the Transactional is nil: give NewTwoPhaseCommitSink the system it writes to")
	}
	s.final, s.tell = ctx.FinalCheckpoint, ctx.OutputHeld
	s.restoredCommitted = ctx.RestoredCommitted
	if o, ok := s.sys.(interface{ Open(*Context) error }); ok {
		if err := o.Open(ctx); err != nil {
			return err
		}
	}
	return s.begin()
}

func (s *TwoPhaseCommitSink[T, TX]) begin() error {
	tx, err := s.sys.Begin()
	if err != nil {
		return fmt.Errorf("two-phase commit sink: begin: %w", err)
	}
	s.current, s.open = tx, true
	return nil
}

// Collect writes v into the current transaction.
func (s *TwoPhaseCommitSink[T, TX]) Collect(v T) {
	if s.tell != nil {
		s.tell()
		s.tell = nil
	}
	if err := s.sys.Write(s.current, v); err != nil {
		Fail(fmt.Errorf("two-phase commit sink: write: %w", err))
	}
}

// SnapshotState pre-commits the current transaction for checkpoint id,
// begins the next one and returns every pending transaction.
func (s *TwoPhaseCommitSink[T, TX]) SnapshotState(id int64) ([]byte, error) {
	if err := s.clean(); err != nil {
		return nil, err
	}
	if !s.open {
		// Finished without a final checkpoint: nothing more to pre-commit.
		return s.encodePending()
	}
	tx, err := s.preCommit(s.current)
	if err != nil {
		return nil, fmt.Errorf("two-phase commit sink: pre-commit: %w", err)
	}
	s.pending = append(s.pending, pendingTx[TX]{checkpoint: id, tx: tx})
	s.open = false
	if err := s.begin(); err != nil {
		return nil, err
	}
	return s.encodePending()
}

func (s *TwoPhaseCommitSink[T, TX]) encodePending() ([]byte, error) {
	b := binary.AppendUvarint(nil, uint64(len(s.pending)))
	var err error
	for _, p := range s.pending {
		b = binary.AppendVarint(b, p.checkpoint)
		if b, err = s.codec.Append(b, p.tx); err != nil {
			return nil, err
		}
	}
	return b, nil
}

func (s *TwoPhaseCommitSink[T, TX]) decodePending(b []byte) ([]pendingTx[TX], error) {
	n, k := binary.Uvarint(b)
	if k <= 0 || n > uint64(len(b)) {
		return nil, errors.New("two-phase commit sink: corrupt pending transactions")
	}
	b = b[k:]
	out := make([]pendingTx[TX], 0, n)
	for range n {
		id, k := binary.Varint(b)
		if k <= 0 {
			return nil, errors.New("two-phase commit sink: corrupt pending transaction")
		}
		tx, m, err := s.codec.Decode(b[k:])
		if err != nil {
			return nil, fmt.Errorf("two-phase commit sink: %w", err)
		}
		out = append(out, pendingTx[TX]{checkpoint: id, tx: tx})
		b = b[k+m:]
	}
	return out, nil
}

// NotifyCheckpointComplete commits every transaction pending for
// checkpoints up to id.
func (s *TwoPhaseCommitSink[T, TX]) NotifyCheckpointComplete(id int64) error {
	i := 0
	for ; i < len(s.pending) && s.pending[i].checkpoint <= id; i++ {
		if err := s.sys.Commit(s.pending[i].tx); err != nil {
			return fmt.Errorf("two-phase commit sink: commit for checkpoint %d: %w", s.pending[i].checkpoint, err)
		}
	}
	s.pending = slices.Delete(s.pending, 0, i)
	return nil
}

// NotifyCheckpointAborted keeps the transactions pending: a later
// checkpoint's completion commits them (their data is in no other
// transaction).
func (s *TwoPhaseCommitSink[T, TX]) NotifyCheckpointAborted(int64) error { return nil }

// RestoreState commits again the transactions pending in the restored
// checkpoint: it completed, so they must be visible. Any subtask restores
// the pending transactions of every old subtask it is given. A snapshot
// every sink committed before the job stopped (Context.RestoredCommitted:
// a stop-with-savepoint's) has nothing to commit again: its transactions
// are visible where they were written, which need not be where this run
// writes (a job moved to another device, its sink to another directory).
func (s *TwoPhaseCommitSink[T, TX]) RestoreState(states [][]byte, _ int) error {
	if s.restoredCommitted {
		return nil
	}
	for _, st := range states {
		pend, err := s.decodePending(st)
		if err != nil {
			return err
		}
		for _, p := range pend {
			if err := s.sys.Commit(p.tx); err != nil {
				return fmt.Errorf("two-phase commit sink: re-commit after restore: %w", err)
			}
		}
	}
	return nil
}

// Close aborts the open transaction; pending ones stay for a restore to
// commit.
func (s *TwoPhaseCommitSink[T, TX]) Close() error {
	if !s.open {
		return nil
	}
	s.open = false
	return s.sys.Abort(s.current)
}

// Finish ends the input. When the job takes a final checkpoint
// (Context.FinalCheckpoint) it does nothing: that checkpoint pre-commits
// the last transaction at its snapshot and commits it on completion, like
// every other. Without checkpoints it pre-commits and commits the last
// transaction and every pending one: no checkpoint will cover them.
func (s *TwoPhaseCommitSink[T, TX]) Finish() error {
	if !s.open || s.final {
		return nil
	}
	if err := s.clean(); err != nil {
		return err
	}
	tx, err := s.preCommit(s.current)
	if err != nil {
		return err
	}
	for _, p := range s.pending {
		if err := s.sys.Commit(p.tx); err != nil {
			return err
		}
	}
	s.pending = nil
	s.open = false
	return s.sys.Commit(tx)
}
