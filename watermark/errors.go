package watermark

import "errors"

// ErrInvalidStrategy is wrapped by every problem Strategy.Validate reports.
var ErrInvalidStrategy = errors.New("watermark: invalid strategy")
