package state

import "errors"

// ErrStateType is returned when a state name is reused with another type.
var ErrStateType = errors.New("state: name already registered with another type")

// ErrNoBackend is returned when keyed state is asked of a subtask that has
// no keyed backend (the stream is not keyed).
var ErrNoBackend = errors.New("state: keyed state is only available on a keyed stream")
