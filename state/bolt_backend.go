package state

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/jonboulle/clockwork"
	bolt "go.etcd.io/bbolt"

	"github.com/edgedio/edged/internal/fsutil"
	"github.com/edgedio/edged/keygroup"
)

// BoltOptions configures a BoltBackend. The zero value of a field means its
// default.
type BoltOptions struct {
	// Timeout is how long NewBoltBackend waits for the lock on the file
	// when another process holds it. Default 1s; negative is an error.
	Timeout time.Duration
	// InitialMmapSize is the size of the memory map the file is opened
	// with, in bytes. A snapshot holds a read transaction until it is
	// written, and a write that needs a larger map waits for it to end:
	// set it above the size the file reaches. Default 256 MiB on 64-bit
	// targets and 16 MiB on 32-bit ones, whose whole address space is a
	// few GiB (address space, not memory); negative is an error.
	InitialMmapSize int
	// BatchSize is how many writes (puts and deletes of distinct keys)
	// the backend buffers before it commits them in one transaction.
	// Default 4096; negative is an error.
	BatchSize int
}

// DefaultBoltOptions returns the options NewBoltBackend uses for zero
// fields.
func DefaultBoltOptions() BoltOptions {
	return BoltOptions{Timeout: time.Second, InitialMmapSize: defaultMmapSize, BatchSize: 4096}
}

// defaultMmapSize is 256 MiB where int is 64 bits and 16 MiB where it is 32.
const defaultMmapSize = int(16<<20 + (256-16)<<20*(^uint(0)>>63))

// Validate reports every option out of range at once.
func (o BoltOptions) Validate() error {
	var errs []error
	if o.Timeout < 0 {
		errs = append(errs, fmt.Errorf("state: bolt timeout (%v) must not be negative", o.Timeout))
	}
	if o.InitialMmapSize < 0 {
		errs = append(errs, fmt.Errorf("state: bolt initial_mmap_size (%d) must not be negative", o.InitialMmapSize))
	}
	if o.BatchSize < 0 {
		errs = append(errs, fmt.Errorf("state: bolt batch_size (%d) must not be negative", o.BatchSize))
	}
	return errors.Join(errs...)
}

// withDefaults returns o with zero fields set to their defaults.
func (o BoltOptions) withDefaults() BoltOptions {
	d := DefaultBoltOptions()
	if o.Timeout == 0 {
		o.Timeout = d.Timeout
	}
	if o.InitialMmapSize == 0 {
		o.InitialMmapSize = d.InitialMmapSize
	}
	if o.BatchSize == 0 {
		o.BatchSize = d.BatchSize
	}
	return o
}

// BoltBackend keeps keyed state in a bbolt file, for state larger than
// memory. Each state is a bucket; entries are keyed by key group, key and
// namespace (see the package documentation). Writes go to a buffer in
// memory that is committed in one transaction every BatchSize writes, and
// by Flush and Snapshot; reads see the buffer first, so every write is
// visible to the next read.
//
// The file is a working store, not a durable one: durability comes from
// checkpoints, which are copies written by KeyedSnapshot.WriteTo. So
// commits are not fsynced (NoSync), and NewBoltBackend starts a new file:
// what a crash left of the old one is never read (a torn page would
// panic bbolt, a cut file fault its memory map).
//
// Not safe for concurrent use: the subtask that owns it uses it, and every
// handle made from it, from its own goroutine. Handle methods cannot
// return errors: an I/O error of the file, or an entry that does not
// decode, panics with an error, failing the task (the restart restores the
// last checkpoint); the backend then stays failed.
type BoltBackend struct {
	db     *bolt.DB
	path   string
	lock   *os.File // path.lock, held until Close
	groups keygroup.Range
	clock  clockwork.Clock
	opts   BoltOptions
	// tables holds every registered state by name; ttl lists those with a
	// TTL, in registration order.
	tables map[string]*boltTable
	ttl    []*boltTable
	// dirty lists the tables with buffered writes; buffered counts the
	// writes of all of them.
	dirty    []*boltTable
	buffered int
	// rtx is the read transaction committed reads go through, opened on
	// demand and closed before every commit; rgen counts them.
	rtx  *bolt.Tx
	rgen uint64
	// cleanup is where CleanupExpired resumes.
	cleanup boltCleanupCursor
	// registry holds the timer queues and the restored state not yet
	// registered; the records of restored keyed states are in their
	// buckets.
	registry registry
	// err is the first failure; it sticks.
	err    error
	closed bool
}

// NewBoltBackend creates the bbolt file at path as an empty backend for key
// groups r; a file already there is removed first, unread. TTLs
// are measured on clock; nil means the real clock. It waits at most
// opts.Timeout for the file's lock. Close it when done.
func NewBoltBackend(path string, r keygroup.Range, clock clockwork.Clock, opts BoltOptions) (*BoltBackend, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if r.Start < 0 || r.End > keygroup.MaxMaxParallelism || r.End < r.Start {
		return nil, fmt.Errorf("state: bolt backend: key groups %v out of range", r)
	}
	opts = opts.withDefaults()
	if clock == nil {
		clock = clockwork.NewRealClock()
	}
	// A file left by an earlier run is never opened: nothing in it is
	// needed (the restore fills the new one from a checkpoint), and a
	// crash without fsync may have left it damaged. path.lock keeps a
	// second backend off a file in use, as bbolt's own lock did.
	lock, err := lockWithin(path+".lock", opts.Timeout)
	if err != nil {
		return nil, fmt.Errorf("state: open bolt backend %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		lock.Close()
		return nil, fmt.Errorf("state: remove the old bolt backend file %s: %w", path, err)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{
		Timeout:         opts.Timeout,
		InitialMmapSize: opts.InitialMmapSize,
		// A working store: see the package documentation.
		NoSync:         true,
		NoGrowSync:     true,
		NoFreelistSync: true,
		FreelistType:   bolt.FreelistMapType,
		NoStatistics:   true,
	})
	if err != nil {
		lock.Close()
		return nil, fmt.Errorf("state: open bolt backend %s: %w", path, err)
	}
	return &BoltBackend{
		db: db, path: path, lock: lock, groups: r, clock: clock, opts: opts,
		tables: make(map[string]*boltTable),
	}, nil
}

// lockWithin takes the lock file at path (fsutil.TryLock), trying again
// every 10 ms (of real time: the holder is a task closing) for at most
// timeout.
func lockWithin(path string, timeout time.Duration) (*os.File, error) {
	deadline := time.Now().Add(timeout)
	for {
		f, err := fsutil.TryLock(path)
		if !errors.Is(err, fsutil.ErrLocked) {
			return f, err
		}
		if !time.Now().Before(deadline) {
			return nil, fmt.Errorf("timeout after %v: %w", timeout, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// KeyGroups returns the key groups b holds.
func (b *BoltBackend) KeyGroups() keygroup.Range { return b.groups }

// Path returns the file's path.
func (b *BoltBackend) Path() string { return b.path }

func (b *BoltBackend) lookup(name string) stateTable {
	if t, ok := b.tables[name]; ok {
		return t
	}
	return nil
}

func (b *BoltBackend) reg() *registry { return &b.registry }

func (b *BoltBackend) inUse() bool { return len(b.tables) > 0 || len(b.registry.timers) > 0 }

// Flush commits the buffered writes in one transaction. Snapshot flushes,
// so a checkpoint needs no Flush. It returns the backend's first failure.
func (b *BoltBackend) Flush() error {
	if b.closed {
		return ErrClosed
	}
	return b.flush()
}

// Close drops the buffered writes, closes the file and removes it: no
// backend ever reads it again (NewBoltBackend starts a new one), so a file
// left in place would only hold disk space, for good once no subtask
// opens that path again (a lower parallelism, another backend, a finished
// job). The lock file stays; it is removed while still held, so a backend
// waiting for the lock starts on a path that is free. Snapshots of b must
// have been written or released before (Close waits for their read
// transactions to end). Closing twice is a no-op.
func (b *BoltBackend) Close() error {
	if b.closed {
		return nil
	}
	b.closed = true
	b.closeRead()
	err := b.db.Close()
	if rerr := os.Remove(b.path); err == nil && rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
		err = rerr
	}
	if lerr := b.lock.Close(); err == nil {
		err = lerr
	}
	if err != nil {
		return fmt.Errorf("state: close bolt backend %s: %w", b.path, err)
	}
	return nil
}

// flush commits the write buffer. Reads through rtx end before: a commit
// may have to grow the memory map, which waits for read transactions.
func (b *BoltBackend) flush() error {
	if b.err != nil {
		return b.err
	}
	if b.buffered == 0 {
		return nil
	}
	b.closeRead()
	err := b.db.Update(func(tx *bolt.Tx) error {
		for _, t := range b.dirty {
			if err := t.apply(tx); err != nil {
				return fmt.Errorf("state %q: %w", t.sp.name, err)
			}
		}
		return nil
	})
	if err != nil {
		b.err = fmt.Errorf("state: bolt backend %s: commit: %w", b.path, err)
		return b.err
	}
	for _, t := range b.dirty {
		t.resetBuffer()
	}
	clear(b.dirty)
	b.dirty = b.dirty[:0]
	b.buffered = 0
	return nil
}

// maybeFlush commits the write buffer once it holds BatchSize writes.
// Handles call it first thing in every method, never in the middle of
// one, so that what a method read from the file stays valid to its end.
func (b *BoltBackend) maybeFlush() {
	if b.closed {
		panic(ErrClosed)
	}
	if b.buffered >= b.opts.BatchSize {
		b.mustFlush()
	}
}

// mustFlush flushes, and panics on failure.
func (b *BoltBackend) mustFlush() {
	if err := b.flush(); err != nil {
		panic(err)
	}
}

// readTx returns the read transaction committed reads go through. The
// slices it returns are valid until the next flush.
func (b *BoltBackend) readTx() *bolt.Tx {
	if b.rtx != nil {
		return b.rtx
	}
	if b.closed {
		panic(ErrClosed)
	}
	if b.err != nil {
		panic(b.err)
	}
	tx, err := b.db.Begin(false)
	if err != nil {
		b.err = fmt.Errorf("state: bolt backend %s: begin read: %w", b.path, err)
		panic(b.err)
	}
	b.rtx = tx
	b.rgen++
	return tx
}

func (b *BoltBackend) closeRead() {
	if b.rtx != nil {
		b.rtx.Rollback()
		b.rtx = nil
	}
}

// fail records err as the backend's failure and panics with it: a handle
// met an entry it cannot decode or encode.
func (b *BoltBackend) fail(err error) {
	if b.err == nil {
		b.err = err
	}
	panic(err)
}

// markDirty records that t has buffered writes; n more of them.
func (b *BoltBackend) markDirty(t *boltTable, n int) {
	if t.bufOps == 0 && n > 0 {
		b.dirty = append(b.dirty, t)
	}
	t.bufOps += n
	b.buffered += n
}

// boltTableFor returns the table registered under s.name, registering a
// new one when there is none. For Map state, prefixLen returns how long
// the entry key (key group, key and namespace) at the front of a stored
// key is. A new table takes over the state restored under its name, if
// any, after check has accepted every restored key and value: handles
// cannot return errors, so restored bytes are checked once, here.
func boltTableFor(b *BoltBackend, s spec, prefixLen func([]byte) (int, error), check func(key, val []byte) error) (*boltTable, error) {
	if b.closed {
		return nil, ErrClosed
	}
	if t, ok := b.tables[s.name]; ok {
		if t.sp.kind != s.kind || t.sp.sig != s.sig {
			return nil, fmt.Errorf("%w: %q is a %s, not a %s", ErrStateType, s.name, t.sp.sig, s.sig)
		}
		if t.sp.ttl != s.ttl {
			return nil, fmt.Errorf("%w: %q has TTL %+v, not %+v", ErrStateType, s.name, t.sp.ttl, s.ttl)
		}
		if t.sp.codecNames() != s.codecNames() {
			return nil, fmt.Errorf("%w: %q is encoded with %s, not %s", ErrStateType, s.name, t.sp.codecNames(), s.codecNames())
		}
		return t, nil
	}
	if s.codecs.err != nil {
		return nil, fmt.Errorf("state %q: the bolt backend needs codecs: %w", s.name, s.codecs.err)
	}
	p, err := b.registry.take(&s)
	if err != nil {
		return nil, err
	}
	t := newBoltTable(b, s, prefixLen)
	t.accept = check
	if p != nil {
		if err := t.check(check); err != nil {
			b.registry.pending[s.name] = p
			return nil, fmt.Errorf("restore: state %q: %w", s.name, err)
		}
	}
	b.tables[s.name] = t
	if s.ttl.TTL > 0 {
		b.ttl = append(b.ttl, t)
	}
	return t, nil
}
