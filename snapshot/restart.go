package snapshot

import (
	"fmt"
	"slices"
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

// ExponentialDelay restarts the job after every failure, after a delay
// that starts at InitialDelay and is multiplied by Multiplier with each
// failure that follows, up to MaxDelay; once the job has run ResetAfter
// without failing, the next failure waits InitialDelay again. It never
// gives up: a job that fails because something outside it is away (the
// broker its results go to, a network link) comes back by itself once
// that returns, however long it was away, and a job that fails at once on
// every start costs one attempt per MaxDelay. Flink's
// exponentialDelayRestart, its default since 1.19, without the jitter
// (one job, so no restarts of many to spread out).
type ExponentialDelay struct {
	InitialDelay time.Duration
	MaxDelay     time.Duration
	Multiplier   float64
	ResetAfter   time.Duration

	last  time.Time     // the previous failure
	delay time.Duration // the delay given at last; 0 before any
}

// OnFailure restarts after the next delay of the backoff.
func (s *ExponentialDelay) OnFailure(now time.Time) (bool, time.Duration) {
	// The job restarted at last+delay and ran until now.
	if s.delay == 0 || now.Sub(s.last.Add(s.delay)) >= s.ResetAfter {
		s.delay = s.InitialDelay
	} else {
		next := time.Duration(float64(s.delay) * s.Multiplier)
		if next < s.delay || next > s.MaxDelay { // < s.delay: overflow
			next = s.MaxDelay
		}
		s.delay = next
	}
	s.last = now
	return true, s.delay
}

// Restart strategy names, as RestartConfig.Strategy spells them.
const (
	RestartNone             = "none"
	RestartFixedDelay       = "fixed_delay"
	RestartFailureRate      = "failure_rate"
	RestartExponentialDelay = "exponential_delay"
)

// RestartConfig is the restart section of a job's configuration (YAML key
// "restart"). Start from DefaultRestartConfig.
type RestartConfig struct {
	// Strategy is "none", "fixed_delay", "failure_rate" or
	// "exponential_delay". Default "exponential_delay": an unattended
	// device comes back by itself after an outage of what its jobs depend
	// on, however long, and a crash loop costs one attempt per max_delay.
	Strategy string `yaml:"strategy"`
	// Attempts is the number of restarts of fixed_delay. Default 3.
	Attempts int `yaml:"attempts"`
	// MaxFailures is the number of failures within Interval that
	// failure_rate tolerates. Default 3.
	MaxFailures int `yaml:"max_failures"`
	// Interval is failure_rate's measuring window. Default 10m.
	Interval time.Duration `yaml:"interval"`
	// Delay is the wait before each restart of fixed_delay and
	// failure_rate. Default 10s.
	Delay time.Duration `yaml:"delay"`
	// InitialDelay is exponential_delay's wait before the first restart
	// (and the first after a run of ResetAfter). Default 1s.
	InitialDelay time.Duration `yaml:"initial_delay"`
	// MaxDelay is the longest wait of exponential_delay. Default 1m.
	MaxDelay time.Duration `yaml:"max_delay"`
	// Multiplier grows exponential_delay's wait after each failure.
	// Default 2.
	Multiplier float64 `yaml:"multiplier"`
	// ResetAfter is how long a run of exponential_delay lasts without a
	// failure before the wait starts again at InitialDelay. Default 1h.
	ResetAfter time.Duration `yaml:"reset_after"`
}

// DefaultRestartConfig returns exponential_delay from 1s, doubling up to
// 1m, back to 1s after an hour without a failure (and, should the
// strategy be switched, 3 attempts for fixed_delay, at most 3 failures in
// 10 minutes for failure_rate, 10s before each of their restarts).
func DefaultRestartConfig() RestartConfig {
	return RestartConfig{
		Strategy:     RestartExponentialDelay,
		Attempts:     3,
		MaxFailures:  3,
		Interval:     10 * time.Minute,
		Delay:        10 * time.Second,
		InitialDelay: time.Second,
		MaxDelay:     time.Minute,
		Multiplier:   2,
		ResetAfter:   time.Hour,
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
	case RestartExponentialDelay:
		if c.InitialDelay <= 0 {
			p.add("restart.initial_delay (%s) must be positive", c.InitialDelay)
		}
		if c.MaxDelay < c.InitialDelay {
			p.add("restart.max_delay (%s) must not be below restart.initial_delay (%s)", c.MaxDelay, c.InitialDelay)
		}
		if !(c.Multiplier >= 1) { // NaN too
			p.add("restart.multiplier (%v) must be at least 1", c.Multiplier)
		}
		if c.ResetAfter <= 0 {
			p.add("restart.reset_after (%s) must be positive", c.ResetAfter)
		}
	default:
		p.add("restart.strategy (%q) must be none, fixed_delay, failure_rate or exponential_delay", c.Strategy)
	}
	return p.err()
}

// UnusedKeys returns the YAML keys of c whose values differ from
// DefaultRestartConfig's but that c's strategy does not read (delay with
// exponential_delay, say): set in a configuration, they would be ignored
// without a word. A configuration loaded over DefaultRestartConfig
// reports them as errors.
func (c RestartConfig) UnusedKeys() []string {
	d := DefaultRestartConfig()
	set := map[string]bool{
		"attempts":      c.Attempts != d.Attempts,
		"max_failures":  c.MaxFailures != d.MaxFailures,
		"interval":      c.Interval != d.Interval,
		"delay":         c.Delay != d.Delay,
		"initial_delay": c.InitialDelay != d.InitialDelay,
		"max_delay":     c.MaxDelay != d.MaxDelay,
		"multiplier":    c.Multiplier != d.Multiplier,
		"reset_after":   c.ResetAfter != d.ResetAfter,
	}
	var used []string
	switch normalizeName(c.Strategy) {
	case RestartFixedDelay:
		used = []string{"attempts", "delay"}
	case RestartFailureRate:
		used = []string{"max_failures", "interval", "delay"}
	case RestartExponentialDelay:
		used = []string{"initial_delay", "max_delay", "multiplier", "reset_after"}
	case RestartNone:
	default:
		return nil // Validate names the strategy
	}
	var out []string
	for _, k := range []string{"attempts", "max_failures", "interval", "delay", "initial_delay", "max_delay", "multiplier", "reset_after"} {
		if set[k] && !slices.Contains(used, k) {
			out = append(out, k)
		}
	}
	return out
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
	case RestartExponentialDelay:
		return &ExponentialDelay{InitialDelay: c.InitialDelay, MaxDelay: c.MaxDelay, Multiplier: c.Multiplier, ResetAfter: c.ResetAfter}, nil
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
	case RestartExponentialDelay:
		return fmt.Sprintf("exponential_delay(initial_delay=%s, max_delay=%s, multiplier=%v, reset_after=%s)", c.InitialDelay, c.MaxDelay, c.Multiplier, c.ResetAfter)
	}
	return c.Strategy
}
