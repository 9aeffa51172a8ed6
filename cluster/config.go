package cluster

import (
	"errors"
	"fmt"
	"strconv"
	"time"
)

// ChannelConfig tunes the cross-node channels. Start from
// DefaultChannelConfig. The YAML keys are under cluster.channels.
type ChannelConfig struct {
	// Credits is the number of batches a sender may have unacknowledged on
	// one channel, as actors.Config.Credits bounds them between local
	// subtasks. A blocked sender resumes when half of them are free.
	// Default 128: with small batches a key-by edge between two processes
	// moved more records than with 32 (BENCHMARKS.md, "A byte window
	// under the credits"); MaxInFlightBytes bounds their bytes.
	Credits int
	// MaxInFlightBytes bounds the frame bodies a sender may have
	// unacknowledged on one channel, and a receiver holds unprocessed,
	// in bytes, beside Credits: a batch that would pass it waits, unless
	// nothing is in flight (one frame of any size always crosses). A
	// blocked sender resumes when half of it is free too. Default 2 MiB.
	MaxInFlightBytes int
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

// Shared returns, in readable form, the settings of c that must be the
// same on every node of a cluster: the credits and the in-flight bytes
// (a receiver holds its sender to its own). The others may differ: a
// receiver takes frames up to the transport's message limit whatever its
// own MaxFrameBytes, and the rest are each end's own.
func (c ChannelConfig) Shared() string {
	return "cluster.channels.credits=" + strconv.Itoa(c.Credits) +
		" cluster.channels.max_inflight_bytes=" + strconv.Itoa(c.MaxInFlightBytes)
}

// DefaultChannelConfig returns the default channel configuration.
func DefaultChannelConfig() ChannelConfig {
	return ChannelConfig{
		Credits:          128,
		MaxInFlightBytes: 2 << 20,
		MaxFrameBytes:    256 << 10,
		MaxMergeBytes:    64 << 10,
		DuplicateWindow:  64,
		AckInterval:      time.Second,
		AckTimeout:       10 * time.Second,
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
	if c.MaxInFlightBytes < 1 {
		errs = append(errs, fmt.Errorf("cluster.channels.max_inflight_bytes (%d) must be at least 1", c.MaxInFlightBytes))
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

// LeadershipConfig times the leadership's background work on the
// daemon: the hand-back to a lower node, the check for a second leader,
// the questions a node asks its peers, and the retries of a leader that
// restarts its jobs. Start from DefaultLeadershipConfig. The YAML keys
// are under cluster.leadership.
type LeadershipConfig struct {
	// Settle is how long a lower node must have been seen alive, in one
	// run, before the leader hands the leadership back to it. Default 5s.
	Settle time.Duration
	// MaxSettle caps the settle delay of a node that flaps (it doubles
	// each time the node dies or restarts within Stable). Default 5m.
	MaxSettle time.Duration
	// Stable is how long a node must stay up for its settle delay to
	// fall back to Settle. Default 1m.
	Stable time.Duration
	// MinInterval is the least time between two hand-back attempts; it
	// doubles after each failed attempt up to MaxInterval. Defaults 10s
	// and 5m.
	MinInterval, MaxInterval time.Duration
	// SplitPoll is how often a leader asks its peers whether one of them
	// leads too. Default 2s.
	SplitPoll time.Duration
	// AnswerPoll is how often a leader whose take-over message got no
	// answer asks the lower node which node it follows. Default 2s.
	AnswerPoll time.Duration
	// RestartPoll is how often a leader that restarted asks its peers
	// again whether one of them took over. Default 500ms.
	RestartPoll time.Duration
	// ResumeBackoff is the first wait before a leader retries restarting
	// its jobs (after a failed hand-back) or cancelling the jobs of a
	// yield that did not end; it doubles after each failure up to
	// MaxResumeBackoff. Defaults 1s and 1m.
	ResumeBackoff, MaxResumeBackoff time.Duration
	// DeployRetry is how often a job master that found no deployment to
	// run (its node sees no majority) tries to deploy the job again. The
	// retries do not use up the job's restart strategy. Default 1s.
	DeployRetry time.Duration
}

// DefaultLeadershipConfig returns the default leadership timings.
func DefaultLeadershipConfig() LeadershipConfig {
	return LeadershipConfig{
		Settle:           5 * time.Second,
		MaxSettle:        5 * time.Minute,
		Stable:           time.Minute,
		MinInterval:      10 * time.Second,
		MaxInterval:      5 * time.Minute,
		SplitPoll:        2 * time.Second,
		AnswerPoll:       2 * time.Second,
		RestartPoll:      500 * time.Millisecond,
		ResumeBackoff:    time.Second,
		MaxResumeBackoff: time.Minute,
		DeployRetry:      time.Second,
	}
}

// MinLeadershipPoll is the shortest interval Validate accepts for the
// leadership's repeated work (cluster.leadership.split_poll, answer_poll,
// restart_poll, resume_backoff, deploy_retry and handback_interval): each round asks
// peers over HTTP or restarts jobs, so a shorter one would spin.
const MinLeadershipPoll = 100 * time.Millisecond

// Validate reports every problem of c at once, naming the YAML keys.
func (c LeadershipConfig) Validate() error {
	var errs []error
	positive := func(key string, d time.Duration) {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("cluster.leadership.%s (%s) must be positive", key, d))
		}
	}
	atLeast := func(key string, d time.Duration) {
		if d < MinLeadershipPoll {
			errs = append(errs, fmt.Errorf("cluster.leadership.%s (%s) must be at least %s", key, d, MinLeadershipPoll))
		}
	}
	if c.Settle < 0 {
		errs = append(errs, fmt.Errorf("cluster.leadership.settle (%s) must not be negative", c.Settle))
	}
	positive("stable", c.Stable)
	atLeast("handback_interval", c.MinInterval)
	atLeast("split_poll", c.SplitPoll)
	atLeast("answer_poll", c.AnswerPoll)
	atLeast("restart_poll", c.RestartPoll)
	atLeast("resume_backoff", c.ResumeBackoff)
	atLeast("deploy_retry", c.DeployRetry)
	if c.MaxSettle < c.Settle {
		errs = append(errs, fmt.Errorf("cluster.leadership.max_settle (%s) must be at least cluster.leadership.settle (%s)", c.MaxSettle, c.Settle))
	}
	if c.MaxInterval < c.MinInterval {
		errs = append(errs, fmt.Errorf("cluster.leadership.max_handback_interval (%s) must be at least cluster.leadership.handback_interval (%s)", c.MaxInterval, c.MinInterval))
	}
	if c.MaxResumeBackoff < c.ResumeBackoff {
		errs = append(errs, fmt.Errorf("cluster.leadership.max_resume_backoff (%s) must be at least cluster.leadership.resume_backoff (%s)", c.MaxResumeBackoff, c.ResumeBackoff))
	}
	return errors.Join(errs...)
}
