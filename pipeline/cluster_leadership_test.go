package pipeline

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/edgedio/edged/cluster"
)

// cluster.leadership: unset keys keep the defaults, set ones are read,
// and bad ones are refused naming the key.
func TestClusterLeadershipKeys(t *testing.T) {
	cfg, err := Parse([]byte(goodPipeline + clusterBlock))
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Cluster.LeadershipConfig(); got != cluster.DefaultLeadershipConfig() {
		t.Fatalf("without a block: %+v", got)
	}
	cfg, err = Parse([]byte(goodPipeline + clusterBlock + "  leadership: {settle: 30s, split_poll: 1s, restart_poll: 250ms, resume_backoff: 2s, handback_interval: 20s}\n"))
	if err != nil {
		t.Fatal(err)
	}
	lc := cfg.Cluster.LeadershipConfig()
	def := cluster.DefaultLeadershipConfig()
	if lc.Settle != 30*time.Second || lc.SplitPoll != time.Second || lc.RestartPoll != 250*time.Millisecond ||
		lc.ResumeBackoff != 2*time.Second || lc.MinInterval != 20*time.Second || lc.MaxSettle != def.MaxSettle || lc.AnswerPoll != def.AnswerPoll {
		t.Fatalf("LeadershipConfig() = %+v", lc)
	}
	// A maximum left unset follows a larger minimum.
	cfg, err = Parse([]byte(goodPipeline + clusterBlock + "  leadership: {settle: 10m, handback_interval: 10m, resume_backoff: 2m}\n"))
	if err != nil {
		t.Fatalf("minimums above the default maximums: %v", err)
	}
	if lc := cfg.Cluster.LeadershipConfig(); lc.MaxSettle != 10*time.Minute || lc.MaxInterval != 10*time.Minute || lc.MaxResumeBackoff != 2*time.Minute {
		t.Fatalf("unset maximums: %+v", lc)
	}
	_, err = Parse([]byte(goodPipeline + clusterBlock + "  leadership: {settle: 10m, max_settle: 5m, split_poll: -1s, answer_poll: 1ns}\n"))
	var ce *ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("err = %v, want *ConfigError", err)
	}
	var got []string
	for _, p := range ce.Problems {
		got = append(got, p.Error())
	}
	want := []string{
		"cluster.leadership.split_poll: (-1s) must be at least 100ms",
		"cluster.leadership.answer_poll: (1ns) must be at least 100ms",
		"cluster.leadership.max_settle: (5m0s) must be at least cluster.leadership.settle (10m0s)",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
