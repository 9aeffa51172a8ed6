// Package state holds keyed and operator state, their backends, the timer
// queue, and the rules that redistribute state when a job is restored with
// another parallelism.
//
// # Keyed state
//
// Keyed state is scoped to the current key: the keyed operator sets the key
// (and its key group) on a KeyContext before it calls user code, and every
// state handle created with that context reads and writes the entry of that
// key. Window operators scope state further by a namespace (the window):
// the NewNamespaced... constructors return handles with SetNamespace, and
// for List, Reducing and Aggregating state MergeNamespaces (session
// windows). The kinds are Value, List, Map, Reducing and Aggregating; each
// is described by a descriptor that names it, may give a TTL, and carries
// the codec of its values (nil means the default, codec.Compile).
//
// State is organised by key group so that snapshots, rescaling and moves
// between devices handle whole key groups: KeyedRestoreSources says which
// old subtasks a new one restores from.
//
// # Backends
//
// Operators create handles only through the package functions (NewValue,
// NewNamespacedList, ...), which dispatch on the Backend, so the backend is
// a job setting that operators do not see. Both backends behave alike for
// every kind of state, which one test suite checks (see
// backend_suite_test.go), and a random schedule cross-checks.
//
// MemoryBackend keeps, per state and key group, a map from (key,
// namespace) to a slot of a dense slice of entries. Handles cache the
// current entry until the KeyContext moves to another key or entries move,
// so Get followed by Update costs one map lookup, and neither allocates
// nor uses reflection for scalar and struct values. The memory backend
// never encodes per record; it keeps values as they are. The descriptor's
// codecs are compiled when the state is registered; the memory backend
// records a compile error instead of failing, and a snapshot reports it
// (the bolt backend refuses the registration).
//
// BoltBackend keeps state in a bbolt file, for state larger than memory.
// Each state is a bucket; an entry's key is the key group as two
// big-endian bytes, then the stream key encoded by its codec, then the
// namespace encoded by its codec (nothing for state without namespace), so
// that a key group is one contiguous key range that a snapshot copies
// with one cursor, and the codecs' canonical encodings make equal keys
// equal bytes. The value is the expiry time (for TTL state, 8 bytes) and
// the value encoded by the descriptor's codec; a List is stored as its
// encoded elements laid end to end (Add appends bytes), a Map as one bolt
// key per element, the user key's encoding appended to the entry key.
// Handles encode on write and decode on read; they keep the encoded key of
// the current key and namespace. Key, namespace and user-key codecs must be
// self-delimiting, as every codec of package codec is: keys are laid end
// to end.
//
// Writes go to a write buffer in memory, which every read consults first,
// so a write is visible to the next read; the buffer is committed in one
// transaction (keys sorted) every BoltOptions.BatchSize writes, and by
// Flush and Snapshot. Commits are not fsynced (bbolt's NoSync): the file
// is a working store, emptied when the backend opens, never read after a
// crash; durability comes from checkpoints, which are separate copies
// written by KeyedSnapshot.WriteTo. NoSync can corrupt a bbolt file on
// power loss, which is why checkpoint files must be fsynced by whoever
// writes them (the snapshot package), and why a working file is never
// trusted again. Handle methods cannot return errors: an I/O error of the
// file, or a stored entry that does not decode, panics with an error and
// leaves the backend failed; the task fails and restarts from the last
// checkpoint.
//
// # Snapshots and restore
//
// Snapshot takes a consistent view of a backend's keyed state and timers
// quickly, on the owner's goroutine: the memory backend copies its entry
// slices (values that hold pointers, slices or maps, which the operator may
// change in place after Get, are encoded at once instead), the bolt
// backend commits its buffer and opens a read transaction. WriteTo then
// writes the view, possibly on another goroutine while the owner goes on,
// as a self-describing stream: a header (magic "EDGS", format version, the
// key groups, and a catalogue naming every state with its kind, types,
// TTL flag and codecs), then one section per key group holding that
// group's records of every state, each section with a CRC32C. The format
// is the same for both backends (snapshot_format.go describes it), so a
// snapshot of one restores into the other, and the KeyGroupOffsets that
// KeyedSnapshot.Offsets returns after WriteTo let a restore with another
// parallelism read its key groups only (KeyedRestoreSources says from
// which old subtasks).
//
// Restore loads key groups into an empty backend before the operator
// registers anything. Restored state stays encoded until it is registered
// (with the codecs of the registration, which decode it then; the bolt
// backend copies records into its buckets and checks them then), and a
// registration that differs in kind, types, TTL or codecs fails with
// ErrIncompatibleState. State nobody registers is carried into later
// snapshots as it was. Expiry times are kept.
//
// A running backend can also give key groups away and take others over,
// its handles and timer queues staying valid: RemoveKeyGroups writes what
// it holds in key groups at one end of its range as a snapshot stream and
// drops them, and AddKeyGroups loads such a stream into a backend whose
// range it adjoins, registered states and timer queues taking their
// records at once. The key groups a backend holds stay one range.
//
// # TTL
//
// A TTLConfig makes entries expire after a processing-time duration,
// measured on the backend's clock. Expired entries are never returned; they
// are removed when touched and by CleanupExpired, which walks the entries of
// TTL states incrementally under a budget.
//
// # Operator state
//
// An OperatorStore holds per-subtask state that is not keyed: ListState
// (split among the new subtasks on restore), UnionListState (every new
// subtask gets all of it) and BroadcastState (the same map in every
// subtask), with RedistributeList, RedistributeUnion and
// RedistributeBroadcast deciding the split. SnapshotOperator encodes a
// store; RestoreOperatorStates hands the old subtasks' snapshots out to a
// new subtask by each state's kind, without decoding; registration
// decodes, as for keyed state.
//
// # Timers
//
// A TimerQueue holds the event-time or processing-time timers of a keyed
// operator subtask, at most one per timestamp, key and namespace, fired in
// order of timestamp and then registration, and accessible by key group.
// Timers are keyed state: an operator registers each queue by name with
// the backend (RegisterTimerQueue), and snapshots carry its timers in the
// sections of their key groups, restored into the queue when it is
// registered.
//
// # Concurrency
//
// A Backend, an OperatorStore, a TimerQueue, a KeyContext and every handle
// made from them belong to one subtask and are used from that subtask's
// goroutine only; they are not safe for concurrent use. Memory handles
// never block; bolt handles do file I/O. The one exception is a
// KeyedSnapshot: once taken, it may be written on any one goroutine while
// the owner goes on (a bolt commit that must grow the memory map waits
// until the snapshot is written or released). The package starts no
// goroutines and reads time only through the clock given to the backend's
// constructor. It knows no actors and no nodes.
package state
