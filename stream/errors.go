package stream

import "errors"

// ErrNotReplayable is returned by Execute, ExecuteAsync and Plan for a job
// with checkpoints whose source cannot be rewound (operators.Replayer),
// unless AllowAtMostOnceSources was given.
var ErrNotReplayable = errors.New("stream: source cannot replay")

// errSideOutputOfUnion is reported when SideOutput is asked of a union.
var errSideOutputOfUnion = errors.New("stream: side output of a union; take it from each input")
