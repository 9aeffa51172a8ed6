package cluster

import (
	"errors"
	"fmt"
	"time"
)

// ChannelConfig tunes the cross-node channels. Start from
// DefaultChannelConfig. The YAML keys are under cluster.channels.
type ChannelConfig struct {
	// Credits is the number of batches a sender may have unacknowledged on
	// one channel, as actors.Config.Credits bounds them between local
	// subtasks. A blocked sender resumes when half of them are free.
	// Default 16.
	Credits int
	// MaxFrameBytes is the largest frame a channel sends, header included,
	// in bytes; batches are capped at MaxBatchBytes so that they fit.
	// Default 256 KiB.
	MaxFrameBytes int
	// MaxMergeBytes caps the frame body that batches are merged into
	// (Send.Merge) while they wait for credit or the channel is saturated
	// (half its credits or more in flight), in bytes, and never more than
	// MaxBatchBytes: larger frames mean fewer frames and
	// acknowledgements, but more records in flight for a checkpoint
	// barrier to wait behind. 0 turns merging off. Default 64 KiB.
	MaxMergeBytes int
	// DuplicateWindow is how many sequence numbers back a duplicate frame
	// is dropped and counted; an older one fails the channel. Default 64.
	DuplicateWindow int
	// AckInterval is how often a receiver repeats its latest
	// acknowledgement while nothing new is processed, so that a lost
	// acknowledgement is made good. Default 1s.
	AckInterval time.Duration
	// AckTimeout is how long a sender waits for the receiver to report
	// frames it sent as received before it fails the channel: frames lost
	// at the tail of a channel show no gap. Default 10s; at least twice
	// AckInterval.
	AckTimeout time.Duration
}

// DefaultChannelConfig returns the default channel configuration.
func DefaultChannelConfig() ChannelConfig {
	return ChannelConfig{
		Credits:         16,
		MaxFrameBytes:   256 << 10,
		MaxMergeBytes:   64 << 10,
		DuplicateWindow: 64,
		AckInterval:     time.Second,
		AckTimeout:      10 * time.Second,
	}
}

// MaxBatchBytes returns the byte cap of a batch body: the largest frame
// less the largest header.
func (c ChannelConfig) MaxBatchBytes() int { return c.MaxFrameBytes - FrameOverhead }

// mergeBytes returns the byte cap of a body merged from several batches.
func (c ChannelConfig) mergeBytes() int { return min(c.MaxMergeBytes, c.MaxBatchBytes()) }

// Validate reports every problem of c at once, naming the YAML keys.
func (c ChannelConfig) Validate() error {
	var errs []error
	if c.Credits < 1 {
		errs = append(errs, fmt.Errorf("cluster.channels.credits (%d) must be at least 1", c.Credits))
	}
	if c.MaxFrameBytes < 2*FrameOverhead {
		errs = append(errs, fmt.Errorf("cluster.channels.max_frame_bytes (%d) must be at least %d", c.MaxFrameBytes, 2*FrameOverhead))
	}
	if c.MaxMergeBytes < 0 {
		errs = append(errs, fmt.Errorf("cluster.channels.max_merge_bytes (%d) must not be negative", c.MaxMergeBytes))
	}
	if c.DuplicateWindow < 0 {
		errs = append(errs, fmt.Errorf("cluster.channels.duplicate_window (%d) must not be negative", c.DuplicateWindow))
	}
	if c.AckInterval <= 0 {
		errs = append(errs, fmt.Errorf("cluster.channels.ack_interval (%s) must be positive", c.AckInterval))
	}
	if c.AckTimeout < 2*c.AckInterval {
		errs = append(errs, fmt.Errorf("cluster.channels.ack_timeout (%s) must be at least twice cluster.channels.ack_interval (%s)", c.AckTimeout, c.AckInterval))
	}
	if len(errs) == 0 {
		return nil
	}
	return errors.Join(errs...)
}
