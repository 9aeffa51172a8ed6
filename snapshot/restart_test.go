package snapshot

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// failure is one call of OnFailure and what it should answer.
type failure struct {
	at      time.Duration // since an arbitrary start
	restart bool
	delay   time.Duration
}

func runFailures(t *testing.T, s RestartStrategy, fs []failure) {
	t.Helper()
	start := time.Date(2024, 5, 1, 8, 0, 0, 0, time.UTC)
	for i, f := range fs {
		restart, delay := s.OnFailure(start.Add(f.at))
		if restart != f.restart || delay != f.delay {
			t.Errorf("failure %d at +%s: OnFailure = (%v, %s), want (%v, %s)", i+1, f.at, restart, delay, f.restart, f.delay)
		}
	}
}

func TestRestartStrategies(t *testing.T) {
	const sec, min = time.Second, time.Minute
	for _, tc := range []struct {
		name     string
		strategy RestartStrategy
		failures []failure
	}{
		{"none", NoRestart{}, []failure{{0, false, 0}, {min, false, 0}}},
		// fixedDelayRestart(3, 10000L): three restarts, then give up,
		// however far apart the failures are.
		{"fixed delay 3x10s", &FixedDelay{Attempts: 3, Delay: 10 * sec}, []failure{
			{0, true, 10 * sec},
			{time.Hour, true, 10 * sec},
			{2 * time.Hour, true, 10 * sec},
			{3 * time.Hour, false, 0},
			{4 * time.Hour, false, 0},
		}},
		{"fixed delay 0 attempts", &FixedDelay{Attempts: 0, Delay: sec}, []failure{{0, false, 0}}},
		// failureRateRestart(3, 10 min, 1 min): a fourth failure within ten
		// minutes of the first gives up.
		{"failure rate 3 in 10m", &FailureRate{MaxFailures: 3, Interval: 10 * min, Delay: min}, []failure{
			{0, true, min},
			{2 * min, true, min},
			{4 * min, true, min},
			{6 * min, false, 0},
		}},
		// Failures spread out keep restarting: the window slides.
		{"failure rate sliding", &FailureRate{MaxFailures: 3, Interval: 10 * min, Delay: min}, []failure{
			{0, true, min},
			{min, true, min},
			{2 * min, true, min},
			{10 * min, true, min},       // window (0, 10m]: 1m, 2m, 10m
			{11 * min, true, min},       // (1m, 11m]: 2m, 10m, 11m
			{11*min + 30*sec, false, 0}, // (1m30s, 11m30s]: 2m, 10m, 11m, 11m30s
			{30 * min, true, min},       // all others have left the window
		}},
		// exponentialDelayRestart: never gives up; the delay doubles up
		// to the maximum, and a run of ResetAfter starts it again.
		{"exponential delay", &ExponentialDelay{InitialDelay: sec, MaxDelay: 10 * sec, Multiplier: 2, ResetAfter: time.Hour}, []failure{
			{0, true, sec},
			{2 * sec, true, 2 * sec},    // ran 1s
			{5 * sec, true, 4 * sec},    // ran 1s
			{10 * sec, true, 8 * sec},   // ran 1s
			{19 * sec, true, 10 * sec},  // 16s capped
			{30 * sec, true, 10 * sec},  // stays at the cap
			{41 * sec, true, 10 * sec},  // ... however many failures
			{time.Hour, true, 10 * sec}, // ran 59m9s: short of an hour
			{3 * time.Hour, true, sec},  // ran well over an hour: back to the start
			{3*time.Hour + 2*sec, true, 2 * sec},
			{4*time.Hour + 4*sec - 1, true, 4 * sec}, // ran 1ns short of ResetAfter (restarted at 3h+4s)
			{5*time.Hour + 8*sec - 1, true, sec},     // ran exactly ResetAfter (restarted at 4h+8s-1ns): back to the start
		}},
		{"exponential delay fractional multiplier", &ExponentialDelay{InitialDelay: 2 * sec, MaxDelay: time.Minute, Multiplier: 1.5, ResetAfter: time.Hour}, []failure{
			{0, true, 2 * sec},
			{3 * sec, true, 3 * sec},
			{7 * sec, true, 4500 * time.Millisecond},
		}},
		// A multiplier so large that the delay overflows stays at the cap.
		{"exponential delay overflow", &ExponentialDelay{InitialDelay: sec, MaxDelay: time.Hour, Multiplier: 1e30, ResetAfter: 2 * time.Hour}, []failure{
			{0, true, sec},
			{2 * sec, true, time.Hour},
			{time.Hour + 3*sec, true, time.Hour},
		}},
		// A failure exactly Interval ago has left the window.
		{"failure rate boundary", &FailureRate{MaxFailures: 1, Interval: 10 * min, Delay: sec}, []failure{
			{0, true, sec},
			{10*min - 1, false, 0},
			{20*min - 1, true, sec},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) { runFailures(t, tc.strategy, tc.failures) })
	}
}

func TestRestartConfig(t *testing.T) {
	def := DefaultRestartConfig()
	if err := def.Validate(); err != nil {
		t.Fatal(err)
	}
	s, err := def.New()
	if err != nil {
		t.Fatal(err)
	}
	if ed, ok := s.(*ExponentialDelay); !ok || ed.InitialDelay != time.Second || ed.MaxDelay != time.Minute || ed.Multiplier != 2 || ed.ResetAfter != time.Hour {
		t.Fatalf("default strategy = %#v", s)
	}
	if got := def.String(); got != "exponential_delay(initial_delay=1s, max_delay=1m0s, multiplier=2, reset_after=1h0m0s)" {
		t.Errorf("default strategy described as %q", got)
	}
	fr := def
	fr.Strategy = "failure_rate"
	if s, err := fr.New(); err != nil {
		t.Fatal(err)
	} else if f, ok := s.(*FailureRate); !ok || f.MaxFailures != 3 || f.Interval != 10*time.Minute || f.Delay != 10*time.Second {
		t.Fatalf("failure rate with the defaults = %#v", s)
	}
	err = (RestartConfig{Strategy: "exponential_delay", MaxDelay: -1, Multiplier: 0.5}).Validate()
	for _, want := range []string{
		"restart.initial_delay (0s) must be positive",
		"restart.max_delay (-1ns) must not be below restart.initial_delay (0s)",
		"restart.multiplier (0.5) must be at least 1",
		"restart.reset_after (0s) must be positive",
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("exponential delay problems: %v, want %q", err, want)
		}
	}

	fd := RestartConfig{Strategy: "FIXED-DELAY", Attempts: 3, Delay: 10 * time.Second}
	if s, err := fd.New(); err != nil {
		t.Fatal(err)
	} else if f, ok := s.(*FixedDelay); !ok || f.Attempts != 3 || f.Delay != 10*time.Second {
		t.Fatalf("fixed delay = %#v", s)
	}
	if s, err := (RestartConfig{Strategy: "none"}).New(); err != nil || s != (NoRestart{}) {
		t.Fatalf("none = %#v, %v", s, err)
	}

	bad := RestartConfig{Strategy: "failure_rate", MaxFailures: 0, Interval: time.Minute, Delay: 2 * time.Minute}
	err = bad.Validate()
	for _, want := range []string{
		"restart.max_failures (0) must be at least 1",
		"restart.interval (1m0s) must exceed restart.delay (2m0s)",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v, want %q", err, want)
		}
	}
	if !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("Validate() = %v, want ErrInvalidConfig", err)
	}
	if _, err := (RestartConfig{Strategy: "exponential"}).New(); err == nil ||
		!strings.Contains(err.Error(), `restart.strategy ("exponential") must be none, fixed_delay, failure_rate or exponential_delay`) {
		t.Errorf("unknown strategy: %v", err)
	}
	if err := (RestartConfig{Strategy: "fixed_delay", Attempts: -1, Delay: -1}).Validate(); err == nil ||
		!strings.Contains(err.Error(), "restart.attempts (-1)") || !strings.Contains(err.Error(), "restart.delay (-1ns)") {
		t.Errorf("fixed delay problems: %v", err)
	}
}
