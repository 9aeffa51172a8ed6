package daemon

import (
	"context"
	"errors"
	"testing"

	"github.com/edgedio/edged/actors"
	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/stream"
)

// A wait for a job's next attempt ends when the execution ended for good
// (here: it finished its input) instead of running out its context: a
// drain whose job ended during its handover releases the node at once.
func TestWaitNewRunnerEndsWithTheExecution(t *testing.T) {
	env := stream.NewEnvironment("ended")
	stream.FromSource(env, "gen", func() operators.Source[operators.SensorReading] {
		return operators.SensorGenerator(operators.GeneratorConfig{Count: 10, Keys: 1})
	}).To("collect", func() operators.Sink[operators.SensorReading] {
		return operators.NewCollectSink[operators.SensorReading]()
	})
	job, err := env.ExecuteAsync(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := job.Wait(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), testutil.DefaultTimeout)
	defer cancel()
	err = waitNewRunner(ctx, job.Execution(), nil)
	if !errors.Is(err, actors.ErrJobEnded) {
		t.Fatalf("got %v, want ErrJobEnded", err)
	}
}
