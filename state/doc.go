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
// a job setting that operators do not see. MemoryBackend keeps, per state
// and key group, a map from (key, namespace) to a slot of a dense slice of
// entries. Handles cache the current entry until the KeyContext moves to
// another key or entries move, so Get followed by Update costs one map
// lookup, and neither allocates nor uses reflection for scalar and struct
// values. The memory backend never encodes; it keeps values as they are.
//
// A disk backend (bbolt) will implement the same handles in this package,
// added as one more case in each constructor. Each state is a bucket; an
// entry's key is the key group as two big-endian bytes, then the stream key
// encoded by its codec, then the namespace encoded by its codec (nothing
// for state without namespace), so that a key group is one contiguous key
// range that a snapshot or a move copies with one cursor, and the codecs'
// canonical encodings make equal keys equal bytes. The value is the
// expiry time (for TTL state) and the value encoded by the descriptor's
// codec; a List is stored as the encoded elements laid end to end (Add
// appends), a Map as one bucket key per element with the user key's
// encoding appended to the entry key. Handles of that backend decode on
// Get and encode on Update, and may keep a small cache of decoded entries
// per key group. The descriptor's codecs are compiled when the state is
// registered; the memory backend records a compile error instead of
// failing, and whatever needs the encoding (a snapshot) will report it.
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
// RedistributeBroadcast deciding the split.
//
// # Timers
//
// A TimerQueue holds the event-time or processing-time timers of a keyed
// operator subtask, at most one per timestamp, key and namespace, fired in
// order of timestamp and then registration, and accessible by key group for
// snapshots.
//
// # Concurrency
//
// A Backend, an OperatorStore, a TimerQueue, a KeyContext and every handle
// made from them belong to one subtask and are used from that subtask's
// goroutine only; they are not safe for concurrent use, and none blocks.
// The package starts no goroutines and reads time only through the clock
// given to NewMemoryBackend. It knows no actors and no nodes.
package state
