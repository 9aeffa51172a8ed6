package snapshot

import (
	"fmt"
	"time"
)

// Mode is the consistency a checkpoint gives inside the job.
type Mode uint8

const (
	// ExactlyOnce aligns barriers: a task with several inputs holds back
	// each input whose barrier has arrived until all have, so that on
	// recovery every record is reflected in the state exactly once. It
	// may add latency at tasks with several inputs.
	ExactlyOnce Mode = iota + 1
	// AtLeastOnce does not align: a task snapshots when the last barrier
	// arrives, so after recovery some records may be reflected twice.
	AtLeastOnce
)

// String returns the YAML spelling of m: "exactly_once" or "at_least_once".
func (m Mode) String() string {
	switch m {
	case ExactlyOnce:
		return "exactly_once"
	case AtLeastOnce:
		return "at_least_once"
	}
	return fmt.Sprintf("Mode(%d)", uint8(m))
}

// MarshalText returns the YAML spelling of m.
func (m Mode) MarshalText() ([]byte, error) {
	if m != ExactlyOnce && m != AtLeastOnce {
		return nil, fmt.Errorf("%w: checkpoint.mode: unknown mode %d", ErrInvalidConfig, uint8(m))
	}
	return []byte(m.String()), nil
}

// UnmarshalText parses "exactly_once" or "at_least_once" (also with
// hyphens or in upper case, as Flink spells them: EXACTLY_ONCE).
func (m *Mode) UnmarshalText(b []byte) error {
	switch normalizeName(string(b)) {
	case "exactly_once":
		*m = ExactlyOnce
	case "at_least_once":
		*m = AtLeastOnce
	default:
		return fmt.Errorf("%w: checkpoint.mode (%q) must be exactly_once or at_least_once", ErrInvalidConfig, b)
	}
	return nil
}

// Config is the checkpoint section of a job's configuration (YAML key
// "checkpoint"). Start from DefaultConfig.
type Config struct {
	// Interval is the time between the triggers of periodic checkpoints.
	// A run's first one comes sooner when a sink holds output before it
	// (OutputHeld). Zero disables periodic checkpoints (savepoints still
	// work). When set
	// it must be at least 10ms and exceed MinPause. Default 0 (disabled),
	// as in Flink: a job turns checkpointing on explicitly.
	Interval time.Duration `yaml:"interval"`
	// Mode is ExactlyOnce (aligned barriers) or AtLeastOnce. Savepoints are
	// always taken exactly-once. Default ExactlyOnce.
	Mode Mode `yaml:"mode"`
	// Timeout is how long a checkpoint or savepoint may take from trigger
	// until every task has acknowledged it; past it, it fails with
	// ErrExpired. Default 60s (Flink's 10 minutes is meant for large state
	// on clusters; edge state is small and a stuck checkpoint should be
	// noticed soon).
	Timeout time.Duration `yaml:"timeout"`
	// MaxConcurrent is how many checkpoints (savepoints included) may be
	// pending at once before a periodic one waits. Savepoints are never
	// held back by it. Default 1.
	MaxConcurrent int `yaml:"max_concurrent"`
	// MinPause is the least time between the end of one checkpoint
	// (completed or failed) and the trigger of the next periodic one, so
	// that a slow checkpoint cannot leave the job no time to process
	// records. Default 0.
	MinPause time.Duration `yaml:"min_pause"`
	// TolerableFailures is how many checkpoints newer than the latest
	// completed one may fail (decline, expiry, invalid acknowledgement,
	// metadata write) before the
	// job fails. Savepoints, and checkpoints aborted by a task failure or
	// subsumed by a newer checkpoint, do not count. Default 0: the first
	// failure fails the job, as in Flink.
	TolerableFailures int `yaml:"tolerable_failures"`
	// PreferCheckpointForRecovery asks recovery to use the latest
	// completed checkpoint even when a savepoint is newer. edged never
	// does so: a completed savepoint may have committed output (sinks
	// commit when any snapshot completes), and restoring the older
	// checkpoint would commit that output twice. Recovery always restores
	// the newest complete snapshot, checkpoint or savepoint, and where this
	// setting would have picked an older one it is ignored with a logged
	// warning naming both (see Store.RecoveryPoint). A damaged newest
	// snapshot is still skipped for the one before it. Kept so that
	// configs written for Flink load. Default false.
	PreferCheckpointForRecovery bool `yaml:"prefer_checkpoint_for_recovery"`
	// Retain is how many completed checkpoints to keep on disk; older ones
	// are discarded. Savepoints are never discarded. Default 2: one to
	// fall back to when the newest is damaged (a corrupt SD card, a file
	// lost), at twice the disk of one; Flink keeps 1.
	Retain int `yaml:"retain"`
	// Dir is the root of the snapshot store (see Store). Required when
	// Interval is set. Default "".
	Dir string `yaml:"dir"`
}

// DefaultConfig returns the default checkpoint configuration: periodic
// checkpoints off, exactly-once, 60s timeout, one at a time, no pause, no
// tolerated failure, newest snapshot wins, two retained.
func DefaultConfig() Config {
	return Config{
		Interval:          0,
		Mode:              ExactlyOnce,
		Timeout:           60 * time.Second,
		MaxConcurrent:     1,
		MinPause:          0,
		TolerableFailures: 0,
		Retain:            2,
	}
}

// MinInterval is the shortest checkpoint interval Validate accepts.
const MinInterval = 10 * time.Millisecond

// Validate reports every problem of c at once, each naming its YAML key and
// wrapping ErrInvalidConfig.
func (c Config) Validate() error {
	var p problems
	if c.Interval < 0 {
		p.add("checkpoint.interval (%s) must not be negative (0 disables checkpoints)", c.Interval)
	} else if c.Interval > 0 {
		if c.Interval < MinInterval {
			p.add("checkpoint.interval (%s) must be at least %s", c.Interval, MinInterval)
		}
		if c.MinPause >= c.Interval {
			p.add("checkpoint.interval (%s) must exceed checkpoint.min_pause (%s)", c.Interval, c.MinPause)
		}
		if c.Dir == "" {
			p.add("checkpoint.dir must be set when checkpoint.interval is set")
		}
	}
	if c.Mode != ExactlyOnce && c.Mode != AtLeastOnce {
		p.add("checkpoint.mode (%d) must be exactly_once or at_least_once", uint8(c.Mode))
	}
	if c.Timeout <= 0 {
		p.add("checkpoint.timeout (%s) must be positive", c.Timeout)
	}
	if c.MaxConcurrent < 1 {
		p.add("checkpoint.max_concurrent (%d) must be at least 1", c.MaxConcurrent)
	}
	if c.MinPause < 0 {
		p.add("checkpoint.min_pause (%s) must not be negative", c.MinPause)
	}
	if c.TolerableFailures < 0 {
		p.add("checkpoint.tolerable_failures (%d) must not be negative", c.TolerableFailures)
	}
	if c.Retain < 1 {
		p.add("checkpoint.retain (%d) must be at least 1", c.Retain)
	}
	return p.err()
}
