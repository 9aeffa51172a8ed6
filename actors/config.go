package actors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/edgedio/edged/snapshot"
	"github.com/edgedio/edged/state"
)

// Config tunes the task runtime. Start from DefaultConfig.
type Config struct {
	// BatchSize is the number of records per batch; a batch is sent when
	// full, when its task goes idle, or after Linger. Default 512.
	BatchSize int
	// WireBatchSize is the number of records per batch on an edge whose
	// channels cross nodes, where a batch pays for its frame, its
	// acknowledgement and its delivery on both nodes; 0 is 4 × BatchSize.
	// A batch whose encoding is over its channel's frame cap is sent in
	// halves (halved again while over), and the channel's later batches
	// are cut to the records of the smallest part sent (not below
	// BatchSize).
	WireBatchSize int
	// Linger is how long a partly filled batch may wait while its task is
	// busy. Default 5ms.
	Linger time.Duration
	// Credits is the number of batch buffers per channel: at most that many
	// batches are in flight between two subtasks. Default 16. A blocked
	// sender resumes when half of them are free.
	Credits int
	// SerializeKeyBy sends every key-by edge through the element type's
	// codec, as channels between devices do. Default false.
	SerializeKeyBy bool
	// Logger receives the runtime's logs. Default: discard.
	Logger *slog.Logger
	// Clock gives processing time. Default: the real clock.
	Clock clockwork.Clock
	// Checkpoint configures checkpoints; without a Dir there are neither
	// checkpoints nor savepoints.
	Checkpoint snapshot.Config
	// Restore, when set, is the checkpoint or savepoint the job starts
	// from: state is matched to operators by UID.
	Restore *snapshot.Metadata
	// AllowNonRestoredState lets a restore skip the state of operators the
	// job no longer has; without it such a restore fails.
	AllowNonRestoredState bool
	// StateBackend chooses where keyed state lives. Default: memory.
	StateBackend StateBackendConfig
	// Cluster, when set, places the job's tasks on several nodes; nil
	// runs every task in this process.
	Cluster *Cluster

	// nextCheckpoint, when set, is the lowest id the attempt's
	// checkpoints may take (Execution: past the ended attempts' ids).
	nextCheckpoint snapshot.ID
}

// BackendKind names a keyed state backend.
type BackendKind string

const (
	// MemoryBackend keeps keyed state in Go maps: fastest; state must fit
	// in RAM.
	MemoryBackend BackendKind = "memory"
	// BoltBackend keeps keyed state in a bbolt file per operator subtask:
	// state larger than RAM.
	BoltBackend BackendKind = "bolt"
)

// StateBackendConfig chooses and configures the keyed state backend.
type StateBackendConfig struct {
	Kind BackendKind
	// Dir holds the bolt files (one per keyed operator subtask, under a
	// directory named after the job). Required for bolt.
	Dir  string
	Bolt state.BoltOptions
}

// DefaultConfig returns the default runtime configuration.
func DefaultConfig() Config {
	return Config{
		BatchSize:  512,
		Linger:     5 * time.Millisecond,
		Credits:    16,
		Logger:     slog.New(slog.DiscardHandler),
		Clock:      clockwork.NewRealClock(),
		Checkpoint: snapshot.DefaultConfig(),
	}
}

// wireBatchSize is the number of records per batch on an edge that
// crosses nodes.
func (c Config) wireBatchSize() int {
	if c.WireBatchSize > 0 {
		return c.WireBatchSize
	}
	return 4 * c.BatchSize
}

// Validate reports every problem of c at once.
func (c Config) Validate() error {
	var errs []error
	if c.BatchSize < 1 {
		errs = append(errs, fmt.Errorf("batch_size (%d) must be at least 1", c.BatchSize))
	}
	if c.WireBatchSize < 0 {
		errs = append(errs, fmt.Errorf("wire_batch_size (%d) must not be negative", c.WireBatchSize))
	}
	if c.Linger < 0 {
		errs = append(errs, fmt.Errorf("linger (%s) must not be negative", c.Linger))
	}
	if c.Credits < 1 {
		errs = append(errs, fmt.Errorf("credits (%d) must be at least 1", c.Credits))
	}
	if c.Logger == nil {
		errs = append(errs, errors.New("logger must be set"))
	}
	if c.Clock == nil {
		errs = append(errs, errors.New("clock must be set"))
	}
	switch c.StateBackend.Kind {
	case "", MemoryBackend:
	case BoltBackend:
		if c.StateBackend.Dir == "" {
			errs = append(errs, errors.New("state_backend.dir must be set for the bolt backend"))
		}
		if err := c.StateBackend.Bolt.Validate(); err != nil {
			errs = append(errs, err)
		}
	default:
		errs = append(errs, fmt.Errorf("state_backend.kind (%q) must be memory or bolt", c.StateBackend.Kind))
	}
	if c.Checkpoint.Interval > 0 || c.Checkpoint.Dir != "" {
		if err := c.Checkpoint.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// minLevel is a slog handler passing on records at or above a level, used
// to keep protoactor's own logging to warnings.
type minLevel struct {
	slog.Handler
	level slog.Level
}

func (h minLevel) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.level && h.Handler.Enabled(ctx, l)
}

func (h minLevel) WithAttrs(as []slog.Attr) slog.Handler {
	return minLevel{h.Handler.WithAttrs(as), h.level}
}

func (h minLevel) WithGroup(name string) slog.Handler {
	return minLevel{h.Handler.WithGroup(name), h.level}
}
