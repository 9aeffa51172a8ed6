package daemon

import (
	"errors"
	"log/slog"
	"testing"

	"github.com/edgedio/edged/pipeline"
)

// A retried restart of a leader's own jobs (takeOver from itself) after
// the node yielded or stepped down starts nothing: it ends with
// errNoLongerLeads, so that a node following another leader never
// masters jobs beside it.
func TestTakeOverOfOwnJobsAfterSteppingDown(t *testing.T) {
	c := &clusterNode{cfg: &pipeline.ClusterConfig{Node: "a"}, log: slog.New(slog.DiscardHandler), dataDir: t.TempDir()}
	// What stepDown("b") leaves: b leads.
	c.lead.stepped, c.lead.took, c.lead.id, c.lead.followed = true, false, "b", true
	n := &node{cluster: c}
	pipelines := []pipeline.PipelineConfig{{Name: "never-started"}}
	if err := n.takeOver("a", pipelines); !errors.Is(err, errNoLongerLeads) {
		t.Fatalf("takeOver of its own jobs after stepping down: %v, want errNoLongerLeads", err)
	}
}

// A retried takeover from a dead leader that finds the node yielded or
// stepped down meanwhile (between the retry's check and its start of the
// jobs) starts nothing either and leaves the worker's tasks, now the new
// leader's, alone.
func TestRetriedTakeoverAfterSteppingDown(t *testing.T) {
	c := &clusterNode{cfg: &pipeline.ClusterConfig{Node: "b"}, log: slog.New(slog.DiscardHandler), dataDir: t.TempDir()}
	// What a yield's stepDown("c") leaves on b, which took over from a.
	c.lead.stepped, c.lead.took, c.lead.id, c.lead.followed = true, false, "c", true
	n := &node{cluster: c}
	pipelines := []pipeline.PipelineConfig{{Name: "never-started"}}
	if err := n.takeOver("a", pipelines); !errors.Is(err, errNoLongerLeads) {
		t.Fatalf("takeOver from the dead leader after stepping down: %v, want errNoLongerLeads", err)
	}
	if c.epochBase != 0 {
		t.Fatalf("takeOver after stepping down began term %d", c.epochBase)
	}
}
