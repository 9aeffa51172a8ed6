package stream

import "errors"

// ErrNotReplayable is returned by Execute, ExecuteAsync and Plan for a job
// with checkpoints whose source cannot be rewound (operators.Replayer) or
// records no position (it implements none of operators.Replayer,
// operators.Snapshotter and operators.Restorer), unless
// AllowAtMostOnceSources was given.
var ErrNotReplayable = errors.New("stream: source cannot replay")

// ErrAlreadyRunning is returned by Execute and ExecuteAsync while a job
// the same Environment started is still running: two runs of one job
// would share its checkpoint directory and sinks. Run it again once the
// first has ended (Execute returned, Job.Wait returned).
var ErrAlreadyRunning = errors.New("stream: the environment's job is already running")

// ErrCheckpointDirInUse is returned by Execute and ExecuteAsync for a
// job whose checkpoint directory another running job holds (its LOCK
// file is locked): in another process (the program started twice) or by
// another Environment of this one. Two jobs on one directory would
// restore, write and discard each other's checkpoints, and each
// two-phase-commit sink would remove the other's uncommitted files.
var ErrCheckpointDirInUse = errors.New("stream: the checkpoint directory is in use")

// ErrNaNKey fails the task of a record whose key (KeyBy) is not equal to
// itself: a float NaN, or an array or struct holding one. Keyed state,
// timers and windows find a key again by ==, which never holds for it:
// its state would start afresh at every record and its windows would
// fire nothing. Map NaN to a key of your own before KeyBy.
var ErrNaNKey = errors.New("stream: a key is not equal to itself (NaN); its state and windows could never be found again")

// errEmptyTag is reported for an output tag with an empty id.
var errEmptyTag = errors.New(`the output tag has an empty id (a zero OutputTag?): make it with operators.NewOutputTag[T]("name")`)

// errSideOutputOfUnion is reported when SideOutput is asked of a union.
var errSideOutputOfUnion = errors.New("stream: side output of a union; take it from each input")
