package cluster

import (
	"strings"
	"testing"
	"time"
)

// The default leadership timings validate; each bad value is reported,
// all at once, naming its YAML key under cluster.leadership.
func TestLeadershipConfigValidate(t *testing.T) {
	def := DefaultLeadershipConfig()
	if err := def.Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	if def.Settle != 5*time.Second || def.SplitPoll != 2*time.Second || def.RestartPoll != 500*time.Millisecond {
		t.Fatalf("defaults %+v", def)
	}
	bad := def
	bad.Settle = -time.Second
	bad.Stable = 0
	bad.MinInterval = time.Minute
	bad.MaxInterval = time.Second
	bad.SplitPoll = 0
	bad.AnswerPoll = -1
	bad.RestartPoll = 0
	bad.ResumeBackoff = 0
	bad.MaxResumeBackoff = -time.Second
	err := bad.Validate()
	if err == nil {
		t.Fatal("bad config accepted")
	}
	want := []string{
		"cluster.leadership.settle (-1s) must not be negative",
		"cluster.leadership.stable (0s) must be positive",
		"cluster.leadership.split_poll (0s) must be at least 100ms",
		"cluster.leadership.answer_poll (-1ns) must be at least 100ms",
		"cluster.leadership.restart_poll (0s) must be at least 100ms",
		"cluster.leadership.resume_backoff (0s) must be at least 100ms",
		"cluster.leadership.max_handback_interval (1s) must be at least cluster.leadership.handback_interval (1m0s)",
		"cluster.leadership.max_resume_backoff (-1s) must be at least cluster.leadership.resume_backoff (0s)",
	}
	if got := err.Error(); got != strings.Join(want, "\n") {
		t.Fatalf("problems:\n%s\nwant:\n%s", got, strings.Join(want, "\n"))
	}
	// A settle delay of 0 (hand back at once) is allowed; max_settle
	// below it is not.
	ok := def
	ok.Settle = 0
	if err := ok.Validate(); err != nil {
		t.Fatalf("settle 0: %v", err)
	}
	ok.Settle, ok.MaxSettle = time.Minute, time.Second
	if err := ok.Validate(); err == nil || !strings.Contains(err.Error(), "cluster.leadership.max_settle (1s) must be at least cluster.leadership.settle (1m0s)") {
		t.Fatalf("max_settle below settle: %v", err)
	}
}

// The intervals of the leadership's repeated work have a lower bound: a
// nanosecond would make a tight loop of HTTP questions or job restarts.
// Each one below it is reported with its key; the bound itself is
// accepted.
func TestLeadershipConfigPollBounds(t *testing.T) {
	tiny := DefaultLeadershipConfig()
	tiny.MinInterval = time.Nanosecond
	tiny.SplitPoll = time.Nanosecond
	tiny.AnswerPoll = time.Nanosecond
	tiny.RestartPoll = time.Nanosecond
	tiny.ResumeBackoff = 99 * time.Millisecond
	err := tiny.Validate()
	if err == nil {
		t.Fatal("1ns poll intervals accepted")
	}
	want := []string{
		"cluster.leadership.handback_interval (1ns) must be at least 100ms",
		"cluster.leadership.split_poll (1ns) must be at least 100ms",
		"cluster.leadership.answer_poll (1ns) must be at least 100ms",
		"cluster.leadership.restart_poll (1ns) must be at least 100ms",
		"cluster.leadership.resume_backoff (99ms) must be at least 100ms",
	}
	if got := err.Error(); got != strings.Join(want, "\n") {
		t.Fatalf("problems:\n%s\nwant:\n%s", got, strings.Join(want, "\n"))
	}
	edge := DefaultLeadershipConfig()
	edge.MinInterval, edge.SplitPoll, edge.AnswerPoll, edge.RestartPoll, edge.ResumeBackoff =
		MinLeadershipPoll, MinLeadershipPoll, MinLeadershipPoll, MinLeadershipPoll, MinLeadershipPoll
	if err := edge.Validate(); err != nil {
		t.Fatalf("every poll at %s: %v", MinLeadershipPoll, err)
	}
}
