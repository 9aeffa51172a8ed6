package snapshot

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestDefaultConfigIsValid(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Interval = 30 * time.Second
	cfg.Dir = "/var/lib/edged/snapshots"
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestConfigValidateReportsEveryProblem(t *testing.T) {
	cfg := Config{
		Interval:          5 * time.Second,
		MinPause:          10 * time.Second,
		Timeout:           -time.Second,
		MaxConcurrent:     0,
		TolerableFailures: -1,
		Retain:            0,
	}
	err := cfg.Validate()
	if !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("Validate() = %v, want ErrInvalidConfig", err)
	}
	want := []string{
		"checkpoint.interval (5s) must exceed checkpoint.min_pause (10s)",
		"checkpoint.dir must be set when checkpoint.interval is set",
		"checkpoint.mode (0) must be exactly_once or at_least_once",
		"checkpoint.timeout (-1s) must be positive",
		"checkpoint.max_concurrent (0) must be at least 1",
		"checkpoint.tolerable_failures (-1) must not be negative",
		"checkpoint.retain (0) must be at least 1",
	}
	got := err.(interface{ Unwrap() []error }).Unwrap()
	if len(got) != len(want) {
		t.Fatalf("got %d problems, want %d:\n%v", len(got), len(want), err)
	}
	for i, w := range want {
		if !strings.HasSuffix(got[i].Error(), w) {
			t.Errorf("problem %d = %q, want it to end in %q", i, got[i], w)
		}
	}
}

func TestConfigValidateEdges(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want string // "" for valid
	}{
		{"disabled needs no dir", func(c *Config) { c.Interval = 0; c.Dir = "" }, ""},
		{"negative interval", func(c *Config) { c.Interval = -time.Second }, "checkpoint.interval (-1s) must not be negative"},
		{"too short interval", func(c *Config) { c.Interval = time.Millisecond; c.Dir = "d" }, "checkpoint.interval (1ms) must be at least 10ms"},
		{"negative min pause", func(c *Config) { c.MinPause = -time.Second }, "checkpoint.min_pause (-1s) must not be negative"},
		{"equal pause", func(c *Config) { c.Interval = time.Second; c.MinPause = time.Second; c.Dir = "d" }, "must exceed checkpoint.min_pause"},
		{"at least once", func(c *Config) { c.Mode = AtLeastOnce }, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			tc.edit(&cfg)
			err := cfg.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Validate() = %v, want nil", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("Validate() = %v, want %q", err, tc.want)
			}
		})
	}
}

func TestModeText(t *testing.T) {
	for in, want := range map[string]Mode{
		"exactly_once": ExactlyOnce, "EXACTLY_ONCE": ExactlyOnce, "exactly-once": ExactlyOnce,
		"at_least_once": AtLeastOnce, "AT_LEAST_ONCE": AtLeastOnce,
	} {
		var m Mode
		if err := m.UnmarshalText([]byte(in)); err != nil || m != want {
			t.Errorf("UnmarshalText(%q) = %v, %v; want %v", in, m, err, want)
		}
		b, err := want.MarshalText()
		if err != nil || string(b) != want.String() {
			t.Errorf("MarshalText(%v) = %q, %v", want, b, err)
		}
	}
	var m Mode
	if err := m.UnmarshalText([]byte("at_most_once")); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("UnmarshalText(at_most_once) = %v, want ErrInvalidConfig", err)
	}
	if _, err := Mode(0).MarshalText(); err == nil {
		t.Error("MarshalText(0) succeeded")
	}
}
