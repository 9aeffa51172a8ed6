package stream_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/stream"
)

// trickleSource emits its records in the first Poll and then has nothing
// more until the job is cancelled: the stream stays open with far less
// output than a print sink's buffer holds.
type trickleSource struct {
	operators.Base
	records []string
	next    int
	never   chan struct{}
}

func (s *trickleSource) Open(*operators.Context) error {
	s.never = make(chan struct{})
	return nil
}

func (s *trickleSource) Poll(out operators.Collector[string], limit int) (operators.Status, error) {
	for ; s.next < len(s.records) && limit > 0; limit-- {
		out.Collect(s.records[s.next])
		s.next++
	}
	if s.next < len(s.records) {
		return operators.MoreAvailable, nil
	}
	return operators.NothingAvailable, nil
}

func (s *trickleSource) Available() <-chan struct{} { return s.never }

// SnapshotState records the position, so that a checkpointed job may read
// the source.
func (s *trickleSource) SnapshotState(int64) ([]byte, error) { return positionState(s.next), nil }

// RestoreState takes back the position.
func (s *trickleSource) RestoreState(states [][]byte, _ int) error {
	return restorePosition(states, &s.next)
}

// TestPrintSinkWritesWhenInputPauses checks that what a print sink
// buffered is written once the task has no more input waiting, while the
// job still runs: a few lines of a slow stream (dead letters, alerts)
// must not wait for 4 KiB more output or for the job's end. Chained, the
// sink is flushed when its source has nothing more; behind a rebalance
// edge, in a task of its own, when its mailbox is empty.
func TestPrintSinkWritesWhenInputPauses(t *testing.T) {
	for _, chained := range []bool{true, false} {
		t.Run(fmt.Sprintf("chained=%v", chained), func(t *testing.T) {
			var out testutil.Buffer
			records := []string{"first", "second", "third"}
			env := stream.NewEnvironment("trickle", stream.WithParallelism(1))
			src := stream.FromSource(env, "trickle", func() operators.Source[string] {
				return &trickleSource{records: records}
			})
			if !chained {
				src = src.Rebalance()
			}
			upper := stream.Map(src, "upper", func(s string) (string, error) { return strings.ToUpper(s), nil })
			if !chained {
				upper.SetParallelism(2)
			}
			upper.To("print", func() operators.Sink[string] {
				return operators.NewPrintSink(&out, func(s string) string { return s })
			})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			job, err := env.ExecuteAsync(ctx)
			if err != nil {
				t.Fatal(err)
			}
			lines := func() []string {
				l := strings.Fields(strings.NewReplacer("1> ", "", "2> ", "").Replace(out.String()))
				slices.Sort(l)
				return l
			}
			want := []string{"FIRST", "SECOND", "THIRD"}
			testutil.Eventually(t, testutil.DefaultTimeout, fmt.Sprintf("the print sink writes %q while the job runs", want), func() bool {
				return slices.Equal(lines(), want)
			})
			cancel()
			_ = job.Wait()
			if got := lines(); !slices.Equal(got, want) {
				t.Errorf("output after the job ended: %q, want %q", got, want)
			}
		})
	}
}
