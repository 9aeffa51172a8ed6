package daemon

import (
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/edgedio/edged/actors"
	"github.com/edgedio/edged/pipeline"
	"github.com/edgedio/edged/stream"
)

// pinConfig is a two-node cluster with two pipelines and the given
// cluster.placement rows.
func pinConfig(t *testing.T, rows ...string) *pipeline.Config {
	t.Helper()
	var b strings.Builder
	b.WriteString("cluster:\n  node: a\n  listen: 127.0.0.1:7100\n  peers:\n    - {id: b, address: \"127.0.0.1:7101\", api: \"127.0.0.1:8101\"}\n")
	if len(rows) > 0 {
		b.WriteString("  placement:\n")
		for _, r := range rows {
			fmt.Fprintf(&b, "    - %s\n", r)
		}
	}
	for _, name := range []string{"temps", "hum"} {
		fmt.Fprintf(&b, `pipelines:
  - name: %s
    parallelism: 2
    source: {generator: {count: 10, keys: 4}}
    key: id
    window: {type: tumbling, size: 1s, aggregates: [{name: n, fn: count}]}
    sinks: [{stdout: {}}]
`, name)
	}
	cfg, err := pipeline.Parse([]byte(strings.Replace(b.String(), "pipelines:\n  - name: hum", "  - name: hum", 1)))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// pinEnv builds pipeline name of cfg as the daemon does: on a cluster
// that jobCluster fills in.
func pinEnv(t *testing.T, cfg *pipeline.Config, name string) *stream.Environment {
	t.Helper()
	for _, pc := range cfg.Pipelines {
		if pc.Name != name {
			continue
		}
		opts, err := pipeline.EnvOptions(pc)
		if err != nil {
			t.Fatal(err)
		}
		env := stream.NewEnvironment(pc.Name, append(opts, stream.WithCluster(&actors.Cluster{}))...)
		if err := pipeline.Build(pc, env, io.Discard); err != nil {
			t.Fatal(err)
		}
		return env
	}
	t.Fatalf("no pipeline %q", name)
	return nil
}

// A cluster.placement row pins its operator's whole task: an operator
// chained behind another runs where the chain's first operator is
// placed, so before, a row naming it alone was accepted and not followed
// (the task ran on the first operator's default node). Two rows that pin
// one task on different nodes are refused, naming both; and a row of one
// pipeline no longer keeps the other pipelines from starting (before,
// every job but the one it named was refused: "has no subtask").
func TestJobClusterPinsTheWholeTask(t *testing.T) {
	g, err := pinEnv(t, pinConfig(t), "temps").Graph()
	if err != nil {
		t.Fatal(err)
	}
	plan, err := actors.BuildPlan(g)
	if err != nil {
		t.Fatal(err)
	}
	var chain *actors.Chain
	for _, ch := range plan.Chains {
		if len(ch.Vertices) > 1 {
			chain = ch
			break
		}
	}
	if chain == nil {
		t.Fatal("the pipeline has no chain of two operators or more")
	}
	head, tail := chain.Head().UID, chain.Tail().UID
	t.Logf("chain %s: %s … %s", chain.Name(), head, tail)

	// Subtask 0 defaults to a: the row moves the whole task to b.
	cfg := pinConfig(t, fmt.Sprintf("{operator: %s, subtask: 0, node: b}", tail))
	c := &clusterNode{cfg: cfg.Cluster}
	ac, err := c.jobCluster(pinEnv(t, cfg, "temps"))
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range chain.Vertices {
		if n := ac.Placement[actors.TaskKey{UID: v.UID, Subtask: 0}]; n != "b" {
			t.Errorf("%s/0 placed on %q, want b with the pinned %s", v.UID, n, tail)
		}
	}
	if n := ac.Placement[actors.TaskKey{UID: head, Subtask: 1}]; n != "b" {
		t.Errorf("%s/1 placed on %q, want its default b", head, n)
	}
	if _, err := c.jobCluster(pinEnv(t, cfg, "hum")); err != nil {
		t.Fatalf("the other pipeline: %v", err)
	}

	cfg = pinConfig(t, fmt.Sprintf("{operator: %s, subtask: 1, node: a}", head), fmt.Sprintf("{operator: %s, subtask: 1, node: b}", tail))
	c = &clusterNode{cfg: cfg.Cluster}
	_, err = c.jobCluster(pinEnv(t, cfg, "temps"))
	if err == nil || !strings.Contains(err.Error(), "cluster.placement[1]") || !strings.Contains(err.Error(), "cluster.placement[0] pins on node \"a\"") {
		t.Fatalf("two rows pinning one task on a and b: %v, want an error naming both rows", err)
	}
	t.Log(err)

	cfg = pinConfig(t, "{operator: temps/window, subtask: 5, node: b}")
	c = &clusterNode{cfg: cfg.Cluster}
	if _, err := c.jobCluster(pinEnv(t, cfg, "temps")); err == nil || !strings.Contains(err.Error(), "has no subtask") {
		t.Fatalf("a row of subtask 5 at parallelism 2: %v, want refused", err)
	}
}

// A row whose operator names no pipeline is refused with the config.
func TestPlacementRowNamingNoPipelineRefused(t *testing.T) {
	for _, op := range []string{"tmps/window", "window"} {
		cfg := pinConfig(t)
		cfg.Cluster.Placement = []pipeline.PlacementConfig{{Operator: op, Node: "b"}}
		err := cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), "cluster.placement[0].operator") || !strings.Contains(err.Error(), "names no pipeline") {
			t.Errorf("operator %q: %v, want refused", op, err)
		}
	}
}
