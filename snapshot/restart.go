package snapshot

import (
	"fmt"
	"time"
)

// RestartStrategy decides whether and when a failed job restarts. It is
// pure: the time of each failure is passed in. Implementations keep the
// failures they have seen, so each run of a job (across its restarts) uses
// one value, created from its configuration; not safe for concurrent use.
type RestartStrategy interface {
	// OnFailure records a failure of the job at now and says whether to
	// restart it, and after how long.
	OnFailure(now time.Time) (restart bool, delay time.Duration)
}

// NoRestart never restarts: the first failure fails the job for good.
type NoRestart struct{}

// OnFailure returns false.
func (NoRestart) OnFailure(time.Time) (bool, time.Duration) { return false, 0 }

// FixedDelay restarts the job Attempts times over its whole life, each
// time after Delay; the failure after that fails it for good. Flink's
// fixedDelayRestart(3, 10000L) is FixedDelay{Attempts: 3, Delay:
// 10 * time.Second}: three restarts, the fourth failure is final.
type FixedDelay struct {
	Attempts int
	Delay    time.Duration

	restarts int
}

// OnFailure restarts after Delay while fewer than Attempts restarts have
// been granted.
func (s *FixedDelay) OnFailure(time.Time) (bool, time.Duration) {
	if s.restarts >= s.Attempts {
		return false, 0
	}
	s.restarts++
	return true, s.Delay
}

// FailureRate restarts the job after Delay as long as at most MaxFailures
// failures (this one included) fall within any Interval: a failure at now
// counts the failures at times t with now-Interval < t <= now. Flink's
// failureRateRestart(3, Time.minutes(10), Time.minutes(1)) is
// FailureRate{MaxFailures: 3, Interval: 10 * time.Minute, Delay:
// time.Minute}: up to three failures in ten minutes restart after a
// minute, a fourth within ten minutes of the first fails the job. (Flink
// itself already gives up on the MaxFailures-th failure of an interval.)
type FailureRate struct {
	MaxFailures int
	Interval    time.Duration
	Delay       time.Duration

	failures []time.Time // within the last Interval, oldest first
}

// OnFailure records the failure at now and restarts after Delay unless
// more than MaxFailures failures fall within the last Interval.
func (s *FailureRate) OnFailure(now time.Time) (bool, time.Duration) {
	keep := s.failures[:0]
	for _, t := range s.failures {
		if now.Sub(t) < s.Interval {
			keep = append(keep, t)
		}
	}
	s.failures = append(keep, now)
	if len(s.failures) > s.MaxFailures {
		return false, 0
	}
	return true, s.Delay
}

// Restart strategy names, as RestartConfig.Strategy spells them.
const (
	RestartNone        = "none"
	RestartFixedDelay  = "fixed_delay"
	RestartFailureRate = "failure_rate"
)

// RestartConfig is the restart section of a job's configuration (YAML key
// "restart"). Start from DefaultRestartConfig.
type RestartConfig struct {
	// Strategy is "none", "fixed_delay" or "failure_rate". Default
	// "failure_rate": an unattended device keeps recovering from sporadic
	// failures but gives up on a crash loop.
	Strategy string `yaml:"strategy"`
	// Attempts is the number of restarts of fixed_delay. Default 3.
	Attempts int `yaml:"attempts"`
	// MaxFailures is the number of failures within Interval that
	// failure_rate tolerates. Default 3.
	MaxFailures int `yaml:"max_failures"`
	// Interval is failure_rate's measuring window. Default 10m.
	Interval time.Duration `yaml:"interval"`
	// Delay is the wait before each restart. Default 10s.
	Delay time.Duration `yaml:"delay"`
}

// DefaultRestartConfig returns failure_rate with at most 3 failures in
// 10 minutes and 10s before each restart (and 3 attempts should the
// strategy be switched to fixed_delay).
func DefaultRestartConfig() RestartConfig {
	return RestartConfig{
		Strategy:    RestartFailureRate,
		Attempts:    3,
		MaxFailures: 3,
		Interval:    10 * time.Minute,
		Delay:       10 * time.Second,
	}
}

// Validate reports every problem of c at once, each naming its YAML key and
// wrapping ErrInvalidConfig. Only the fields of the chosen strategy are
// checked.
func (c RestartConfig) Validate() error {
	var p problems
	switch normalizeName(c.Strategy) {
	case RestartNone:
	case RestartFixedDelay:
		if c.Attempts < 0 {
			p.add("restart.attempts (%d) must not be negative", c.Attempts)
		}
		if c.Delay < 0 {
			p.add("restart.delay (%s) must not be negative", c.Delay)
		}
	case RestartFailureRate:
		if c.MaxFailures < 1 {
			p.add("restart.max_failures (%d) must be at least 1", c.MaxFailures)
		}
		if c.Interval <= 0 {
			p.add("restart.interval (%s) must be positive", c.Interval)
		}
		if c.Delay < 0 {
			p.add("restart.delay (%s) must not be negative", c.Delay)
		}
		if c.Delay >= c.Interval && c.Interval > 0 {
			p.add("restart.interval (%s) must exceed restart.delay (%s)", c.Interval, c.Delay)
		}
	default:
		p.add("restart.strategy (%q) must be none, fixed_delay or failure_rate", c.Strategy)
	}
	return p.err()
}

// New returns a fresh strategy for c, or c.Validate's error.
func (c RestartConfig) New() (RestartStrategy, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	switch normalizeName(c.Strategy) {
	case RestartFixedDelay:
		return &FixedDelay{Attempts: c.Attempts, Delay: c.Delay}, nil
	case RestartFailureRate:
		return &FailureRate{MaxFailures: c.MaxFailures, Interval: c.Interval, Delay: c.Delay}, nil
	}
	return NoRestart{}, nil
}

// String describes c in Flink's terms, for logs.
func (c RestartConfig) String() string {
	switch normalizeName(c.Strategy) {
	case RestartFixedDelay:
		return fmt.Sprintf("fixed_delay(attempts=%d, delay=%s)", c.Attempts, c.Delay)
	case RestartFailureRate:
		return fmt.Sprintf("failure_rate(max_failures=%d, interval=%s, delay=%s)", c.MaxFailures, c.Interval, c.Delay)
	}
	return c.Strategy
}
