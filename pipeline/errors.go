package pipeline

import (
	"errors"
	"strings"
)

// Sentinel errors of package pipeline.
var (
	// ErrMalformed is wrapped by every decoding error: the payload is not
	// what the pipeline's format and fields say.
	ErrMalformed = errors.New("pipeline: malformed payload")
	// ErrNotAvailable is returned by Build for a configured feature that is
	// parsed and validated but not implemented yet (the MQTT source and
	// sink).
	ErrNotAvailable = errors.New("pipeline: not available yet")
	// ErrInvalidConfig is wrapped by ConfigError.
	ErrInvalidConfig = errors.New("pipeline: invalid config")
	// ErrConfigTooLarge is returned by Load for a file over
	// MaxConfigBytes.
	ErrConfigTooLarge = errors.New("config file too large")
	// ErrEventTimeRange is the reason of a dead letter whose event time
	// is outside [MinEventTime, MaxEventTime].
	ErrEventTimeRange = errors.New("pipeline: event time out of range")
	// ErrEventTimeAhead is the reason of a dead letter whose event time
	// is ahead of the node's clock by more than event_time.max_ahead.
	ErrEventTimeAhead = errors.New("pipeline: event time ahead of the clock")
	// ErrKeyTooLong is the reason of a dead letter whose key is longer
	// than MaxKeyBytes.
	ErrKeyTooLong = errors.New("pipeline: key too long")
	// ErrIntOverflow is the reason of a dead letter whose expression's
	// integer arithmetic (+, -, *, unary minus, abs, int() of a float)
	// left int64.
	ErrIntOverflow = errors.New("pipeline: integer overflow")
	// ErrNotFinite is the reason of a dead letter whose expression gave
	// a float that is ±Inf or NaN (a float overflow, a division by zero),
	// and of a window result whose sum or avg is.
	ErrNotFinite = errors.New("pipeline: not a finite number")
)

// MaxKeyBytes is the longest key a keyed pipeline takes, in bytes; a
// record with a longer key goes to the dead-letter output. It keeps a
// key, with what state stores beside it, within what every state backend
// holds (bbolt's keys end at 32 KiB), so that both backends take the
// same records.
const MaxKeyBytes = 16 << 10

// Problem is one finding of Load or Validate: the YAML key path and what is
// wrong there.
type Problem struct {
	// Path is the key path, as `pipelines[0].window.size`.
	Path string
	// Msg says what is wrong.
	Msg string
}

// Error returns "path: msg".
func (p Problem) Error() string {
	if p.Path == "" {
		return p.Msg
	}
	return p.Path + ": " + p.Msg
}

// ConfigError is the error of Load and Validate: every problem found, in
// document order. A CLI exits with status 2 when errors.As finds one.
type ConfigError struct {
	// File is the config file, when known.
	File string
	// Problems holds every problem found; never empty.
	Problems []Problem
}

// Error lists the problems, one per line.
func (e *ConfigError) Error() string {
	var b strings.Builder
	if e.File != "" {
		b.WriteString(e.File)
		b.WriteString(": ")
	}
	b.WriteString("invalid config:")
	for _, p := range e.Problems {
		b.WriteString("\n  ")
		b.WriteString(p.Error())
	}
	return b.String()
}

// Unwrap lets errors.Is match ErrInvalidConfig.
func (e *ConfigError) Unwrap() error { return ErrInvalidConfig }

// ExitCode is the process exit status for a config error: 2.
func (e *ConfigError) ExitCode() int { return 2 }

// problems collects Problems.
type problems []Problem

func (p *problems) add(path, msg string) { *p = append(*p, Problem{Path: path, Msg: msg}) }

func (p problems) err(file string) error {
	if len(p) == 0 {
		return nil
	}
	return &ConfigError{File: file, Problems: p}
}
