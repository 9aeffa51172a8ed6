package pipeline

import (
	"io"
	"testing"

	"github.com/edgedio/edged/actors"
	"github.com/edgedio/edged/mqtt/ingestlog"
	"github.com/edgedio/edged/stream"
)

// In a cluster, every node's split of the MQTT source has its own
// preparation and watermark assigner, chained to it, whatever the job's
// parallelism. Before, at a parallelism other than the number of nodes,
// the splits' readings were dealt round-robin to the job's parallelism
// of assigners: a node reading a backlog (readings its broker took in
// while the job was stopped, read after a rescale 3 -> 2) shared an
// assigner with a node reading newer ones, and its readings came out
// late; and a dead letter named the node of the assigner's index, not of
// its split.
func TestClusterSplitsKeepTheirOwnWatermarks(t *testing.T) {
	for _, p := range []int{1, 2, 3, 4} {
		cfg, err := Parse([]byte(`
pipelines:
  - name: s
    parallelism: ` + string(rune('0'+p)) + `
    source:
      mqtt:
        topics: [s/#]
        format: json
        fields: {id: {type: string, path: $.id}, ts: {type: time, path: $.ts, unit: ms}}
    event_time: {field: ts, max_out_of_orderness: 1s}
    key: id
    window: {type: tumbling, size: 1s, aggregates: [{name: n, fn: count}]}
    sinks: [{stdout: {}}]
`))
		if err != nil {
			t.Fatal(err)
		}
		nodes := []string{"a", "b", "c"}
		g := jobGraph(t, cfg.Pipelines[0], Inputs{Nodes: nodes, Self: "a"})
		byUID := map[string]*actors.Vertex{}
		for _, v := range g.Vertices {
			byUID[v.UID] = v
		}
		src, prep := byUID["s/source"], byUID["s/prepare"]
		if src == nil || prep == nil {
			t.Fatalf("p=%d: no source or prepare among %v", p, byUID)
		}
		var ts *actors.Vertex
		for _, ed := range g.Edges {
			if ed.From == prep && ed.Output == "" {
				ts = ed.To
			}
		}
		if ts == nil {
			t.Fatalf("p=%d: nothing reads the prepared rows", p)
		}
		for _, v := range []*actors.Vertex{src, prep, ts} {
			if v.Parallelism != len(nodes) {
				t.Errorf("p=%d: %s has parallelism %d, want one per node (%d)", p, v.UID, v.Parallelism, len(nodes))
			}
		}
		for _, ed := range g.Edges {
			if (ed.From == src && ed.To == prep) || (ed.From == prep && ed.To == ts) {
				if ed.Partition != actors.Forward {
					t.Errorf("p=%d: %s -> %s is %v, want forward", p, ed.From.UID, ed.To.UID, ed.Partition)
				}
			}
		}
	}
}

// jobGraph returns the job graph BuildJobWith builds for pipeline pc with
// in, its MQTT source reading no log.
func jobGraph(t *testing.T, pc PipelineConfig, in Inputs) *actors.Job {
	t.Helper()
	env := stream.NewEnvironment(pc.Name, EnvOptionsOrDie(t, pc)...)
	in.MQTTLog = func(string) (*ingestlog.Log, error) { return nil, nil }
	if _, err := BuildJobWith(pc, env, io.Discard, in); err != nil {
		t.Fatal(err)
	}
	g, err := env.Graph()
	if err != nil {
		t.Fatal(err)
	}
	return g
}
