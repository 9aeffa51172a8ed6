package daemon

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/pipeline"
	"github.com/edgedio/edged/stream"
)

// The workers' counts are read at most once per peerDeadLettersTTL, and
// a worker that does not answer keeps the count last read from it.
func TestPeerDeadLetterCountsKeptAndReused(t *testing.T) {
	var d deadLetterCounts
	var n atomic.Int64
	down := false
	read := func(_ context.Context, node string) (map[string]workerDeadLetters, error) {
		r := n.Add(1)
		if down && node == "c" {
			return nil, errors.New("unreachable")
		}
		return map[string]workerDeadLetters{"j": {Total: 10 * r}}, nil
	}
	nodes := []string{"b", "c"}
	got := d.peerCounts(context.Background(), nodes, read)
	if n.Load() != 2 || got["b"]["j"].Total == 0 || got["c"]["j"].Total == 0 {
		t.Fatalf("first reading: %d reads, %v", n.Load(), got)
	}
	if again := d.peerCounts(context.Background(), nodes, read); n.Load() != 2 || again["c"]["j"].Total != got["c"]["j"].Total {
		t.Fatalf("a second reading within the TTL read %d times: %v", n.Load(), again)
	}
	d.read = d.read.Add(-peerDeadLettersTTL)
	down = true
	later := d.peerCounts(context.Background(), nodes, read)
	if n.Load() != 4 || later["c"]["j"].Total != got["c"]["j"].Total || later["b"]["j"].Total <= got["b"]["j"].Total {
		t.Fatalf("c down: %d reads, %v (before %v): want c's last count kept, b's new one", n.Load(), later, got)
	}
}

// Concurrent requests share one reading: while it is under way the others
// wait for it, and every caller gets its answers, named by node (run
// with -race: the answers are shared read-only).
func TestPeerDeadLetterCountsConcurrentRequests(t *testing.T) {
	var d deadLetterCounts
	var n atomic.Int64
	release := make(chan struct{})
	read := func(_ context.Context, node string) (map[string]workerDeadLetters, error) {
		n.Add(1)
		<-release
		return map[string]workerDeadLetters{"j": {Total: 7, Recent: []DeadLetterInfo{{Payload: "bad " + node}}}}, nil
	}
	nodes := []string{"b", "c"}
	const callers = 8
	results := make(chan map[string]map[string]workerDeadLetters, callers)
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() { results <- d.peerCounts(context.Background(), nodes, read) })
	}
	testutil.Eventually(t, 5*time.Second, "the first reading started", func() bool { return n.Load() == 2 })
	close(release)
	wg.Wait()
	close(results)
	for got := range results {
		for _, node := range nodes {
			c := got[node]["j"]
			if c.Total != 7 || len(c.Recent) != 1 || c.Recent[0].Node != node || c.Recent[0].Payload != "bad "+node {
				t.Fatalf("node %s: %+v", node, c)
			}
		}
	}
	if n.Load() != 2 {
		t.Fatalf("%d callers read the workers %d times, want one reading (2)", callers, n.Load())
	}
}

// A node that took over lists, beside its job master's dead letters, those
// of the subtasks it hosted as a worker before, named by itself; its own
// newest come first.
func TestClusterDeadLettersListHostedBeforeTakeover(t *testing.T) {
	own := deadLetterJob(t, "own-1\nown-2\n")
	hosted := deadLetterJob(t, "hosted-1\nhosted-2\nhosted-3\n")
	n := &node{cluster: &clusterNode{cfg: &pipeline.ClusterConfig{Node: "a"}}}
	n.deadCounts.keep("csv", hosted)
	by, total, latest := n.clusterDeadLetters(context.Background(), &job{name: "csv", pj: own}, 4)
	if by["a"] != 5 || total != 5 {
		t.Fatalf("by node %v, total %d: want a: 5", by, total)
	}
	var got []string
	for _, d := range latest {
		if d.Node != "a" {
			t.Fatalf("dead letter %+v not named by a", d)
		}
		got = append(got, d.Payload)
	}
	if want := []string{"own-2", "hosted-3", "own-1", "hosted-2"}; !slices.Equal(got, want) {
		t.Fatalf("latest %q, want %q", got, want)
	}
}

// deadLetterJob runs a pipeline named csv over lines, each a dead letter,
// and returns its counters.
func deadLetterJob(t *testing.T, lines string) *pipeline.Job {
	t.Helper()
	path := filepath.Join(t.TempDir(), "in.csv")
	if err := os.WriteFile(path, []byte(lines), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := pipeline.Parse([]byte(`
pipelines:
  - name: csv
    source:
      file:
        path: ` + path + `
        format: csv
        fields: {id: string, ts: {type: time, unit: s}, temp: float}
    sinks: [{stdout: {}}]
`))
	if err != nil {
		t.Fatal(err)
	}
	pc := cfg.Pipelines[0]
	opts, err := pipeline.EnvOptions(pc)
	if err != nil {
		t.Fatal(err)
	}
	env := stream.NewEnvironment(pc.Name, opts...)
	pj, err := pipeline.BuildJob(pc, env, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := env.Execute(ctx); err != nil {
		t.Fatal(err)
	}
	return pj
}
