package watermark

import "errors"

// ErrInvalidStrategy is wrapped by every problem Strategy.Validate reports.
var ErrInvalidStrategy = errors.New("watermark: invalid strategy")

// ErrCorruptState is wrapped by every error restoring a Merger or a
// Generator from bytes that are not a state they wrote.
var ErrCorruptState = errors.New("watermark: corrupt state")
