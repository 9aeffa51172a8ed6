package state

import "errors"

// ErrStateType is returned when a state name is reused with another kind
// (Value, List, Map, Reducing, Aggregating, or an operator state kind),
// another key, namespace or value type, or another TTL.
var ErrStateType = errors.New("state: name already registered with another type")

// ErrKeyTooLarge is the cause of the failure of a bolt backend's write of
// an entry whose key (the encoded key and namespace, with the state's
// prefix) is longer than bbolt holds (MaxBoltKeyBytes). The memory
// backend has no such bound.
var ErrKeyTooLarge = errors.New("state: entry key too large")

// ErrNaNUserKey is the cause of the failure of a Map state's Put with a
// user key not equal to itself (a float NaN, or an array or struct holding
// one): the memory backend, whose maps find a user key by ==, could never
// find it again (each Put would add an element that Get, Remove and
// Contains miss), while bbolt, which finds it by its encoding, would; both
// refuse it so that they behave the same.
var ErrNaNUserKey = errors.New("state: map user key is not equal to itself (NaN)")

// ErrNoBackend is returned when keyed state is asked of a subtask that has
// no keyed backend (the stream is not keyed).
var ErrNoBackend = errors.New("state: keyed state is only available on a keyed stream")

// ErrDescriptor is returned for a descriptor that cannot make state: an
// empty name, a negative TTL, or a missing function (Reduce; Create, Add or
// Result).
var ErrDescriptor = errors.New("state: invalid state descriptor")

// ErrNoKeyContext is returned when keyed state is asked for without a
// KeyContext to scope it.
var ErrNoKeyContext = errors.New("state: keyed state needs a KeyContext")

// ErrCorruptSnapshot is wrapped by the errors of Restore, RestoreOperator
// and RestoreOperatorStates, and of the registration of restored state,
// when a snapshot stream is not what Snapshot or SnapshotOperator wrote: a
// bad magic number, a checksum mismatch, a truncated or malformed section,
// or an entry its codecs cannot decode.
var ErrCorruptSnapshot = errors.New("state: corrupt snapshot")

// ErrSnapshotVersion is returned for a snapshot written in a format version
// this build does not read.
var ErrSnapshotVersion = errors.New("state: unsupported snapshot version")

// ErrIncompatibleState is wrapped by the error of a registration (NewValue,
// ListState, RegisterTimerQueue, ...) of restored state whose kind, types,
// TTL or codecs differ from what the snapshot recorded.
var ErrIncompatibleState = errors.New("state: incompatible with the restored state")

// ErrRestoreAfterRegister is returned by Restore on a backend that already
// has registered state or timer queues, or already holds a key group being
// restored: restore first, then register.
var ErrRestoreAfterRegister = errors.New("state: restore into a backend that is in use")

// ErrKeyGroups is returned by AddKeyGroups and RemoveKeyGroups for key
// groups that would not leave the backend holding one range: key groups
// added must be next to the backend's, key groups removed at one end of
// them.
var ErrKeyGroups = errors.New("state: key groups that leave the backend no single range")

// ErrClosed is returned (or, from handles, panicked with) when a closed
// BoltBackend is used.
var ErrClosed = errors.New("state: backend closed")

// ErrNoCurrentKey is the cause of the panic of a keyed state handle used
// while its KeyContext has no key yet: keyed state is scoped to the key of
// the record or timer being processed, so it can be read and written in
// ProcessElement and OnTimer (and a window's functions), not in Open nor
// in a KeyedBroadcastProcessFunction's ProcessBroadcastElement. The panic
// fails the task; before, Open in a subtask that owns key group 0 read and
// wrote the state of the key type's zero value, and ProcessBroadcastElement
// that of the keyed record processed last.
var ErrNoCurrentKey = errors.New("state: keyed state used with no current key")
