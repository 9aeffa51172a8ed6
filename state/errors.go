package state

import "errors"

// ErrStateType is returned when a state name is reused with another kind
// (Value, List, Map, Reducing, Aggregating, or an operator state kind),
// another key, namespace or value type, or another TTL.
var ErrStateType = errors.New("state: name already registered with another type")

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
