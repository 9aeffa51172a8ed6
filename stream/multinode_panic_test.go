package stream_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/edgedio/edged/actors"
	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/stream"
)

// panicOnAnotherNode panics in a map function on the node that is not the
// job master's.
func panicOnAnotherNode(v int64) (int64, error) {
	if v == 7 {
		panic("seven")
	}
	return v, nil
}

// A task that panics on another node than the job master's reaches the
// master as a TaskError without its stack (the control message carries
// the panic's text only), so its node logs the stack, where the panic
// happened.
func TestMultiNodePanicStackIsLoggedOnItsNode(t *testing.T) {
	c := overMemory(t, 2)
	c.Placement = map[actors.TaskKey]string{
		{UID: "gen", Subtask: 0}: "node-1",
		{UID: "gen", Subtask: 1}: "node-1",
	}
	var logs testutil.Buffer
	env := stream.NewEnvironment("panics", stream.WithParallelism(2), stream.WithCluster(c.Cluster),
		stream.WithLogger(slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))))
	src := stream.FromSource(env, "gen", func() operators.Source[int64] {
		return operators.NewGenerator(operators.GeneratorConfig{Count: 100}, func(i int64) int64 { return i })
	})
	stream.Map(src, "boom", panicOnAnotherNode).Rebalance().ForEach("sink", func(int64) error { return nil })
	err := env.Execute(context.Background())
	var te *actors.TaskError
	if !errors.As(err, &te) || !te.Panic {
		t.Fatalf("want a TaskError of a panic, got %v", err)
	}
	var re *actors.RemoteError
	if !errors.As(err, &re) || re.Node != "node-1" {
		t.Fatalf("want the panic from node-1, got %v", err)
	}
	out := logs.String()
	if !strings.Contains(out, "panicOnAnotherNode") || !strings.Contains(out, `node=node-1`) {
		t.Fatalf("node-1 did not log the panic's stack:\n%s", out)
	}
}
