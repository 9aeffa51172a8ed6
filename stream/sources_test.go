package stream_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"

	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/snapshot"
	"github.com/edgedio/edged/stream"
)

// serveLines serves n sensor readings to the first connection and closes
// it; it reports whether anyone connected.
func serveLines(t *testing.T, n int) (addr string, connected func() bool) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	accepted := false
	done := make(chan struct{})
	go func() {
		defer close(done)
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		mu.Lock()
		accepted = true
		mu.Unlock()
		for i := range n {
			r := operators.SensorReading{ID: fmt.Sprintf("s%d", i%3), Timestamp: int64(i), Temperature: 20}
			fmt.Fprintln(conn, r.String())
		}
		conn.Close()
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
	})
	return ln.Addr().String(), func() bool {
		mu.Lock()
		defer mu.Unlock()
		return accepted
	}
}

func socketJob(env *stream.Environment, addr string, sink *operators.CollectSink[operators.SensorReading]) {
	src := stream.FromSource(env, "socket-in", func() operators.Source[operators.SensorReading] {
		return operators.NewSocketSource(addr, operators.ParseSensorReading)
	})
	src.To("collect", sink.Subtask)
}

func checkpointing(t *testing.T) stream.Option {
	cfg := snapshot.DefaultConfig()
	cfg.Dir = t.TempDir()
	return stream.WithCheckpointing(cfg)
}

func TestCheckpointedJobRefusesSourceThatCannotReplay(t *testing.T) {
	addr, connected := serveLines(t, 5)
	env := stream.NewEnvironment("refuse", checkpointing(t))
	socketJob(env, addr, operators.NewCollectSink[operators.SensorReading]())
	err := env.Execute(context.Background())
	if !errors.Is(err, stream.ErrNotReplayable) || !strings.Contains(err.Error(), `"socket-in"`) || !strings.Contains(err.Error(), "AllowAtMostOnceSources") {
		t.Fatalf("Execute = %v, want ErrNotReplayable naming source \"socket-in\" and the opt-in", err)
	}
	if _, err := env.ExecuteAsync(context.Background()); !errors.Is(err, stream.ErrNotReplayable) {
		t.Errorf("ExecuteAsync = %v, want ErrNotReplayable", err)
	}
	if connected() {
		t.Error("the refused job connected to the socket")
	}
}

func TestAtMostOnceSourceOptIn(t *testing.T) {
	addr, connected := serveLines(t, 5)
	var logs testutil.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	sink := operators.NewCollectSink[operators.SensorReading]()
	env := stream.NewEnvironment("opt-in", checkpointing(t), stream.AllowAtMostOnceSources(), stream.WithLogger(logger))
	socketJob(env, addr, sink)
	if err := env.Execute(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !connected() || sink.Len() != 5 {
		t.Errorf("read %d readings (connected %v), want 5", sink.Len(), connected())
	}
	if out := logs.String(); strings.Count(out, "at-most-once") != 1 || !strings.Contains(out, "operator=socket-in") {
		t.Errorf("want one at-most-once warning naming the source; logs:\n%s", out)
	}
}

func TestUncheckpointedJobTakesSocketSource(t *testing.T) {
	addr, _ := serveLines(t, 3)
	sink := operators.NewCollectSink[operators.SensorReading]()
	env := stream.NewEnvironment("plain")
	socketJob(env, addr, sink)
	if err := env.Execute(context.Background()); err != nil || sink.Len() != 3 {
		t.Fatalf("Execute = %v, %d readings; want nil, 3", err, sink.Len())
	}
}

// countingSource is the source a user writes first: it emits 0..n-1 and
// keeps no position (no SnapshotState, no Replayer).
type countingSource struct {
	operators.Base
	n, next int
}

func (s *countingSource) Poll(out operators.Collector[int], max int) (operators.Status, error) {
	for ; max > 0 && s.next < s.n; max-- {
		out.Collect(s.next)
		s.next++
	}
	if s.next == s.n {
		return operators.EndOfInput, nil
	}
	return operators.MoreAvailable, nil
}

func (s *countingSource) Available() <-chan struct{} { return nil }

// replayingCountingSource says that it replays: it starts again from 0 and
// its job does not mind (here: nothing to mind, the job has no failure).
type replayingCountingSource struct{ countingSource }

func (*replayingCountingSource) Replayable() bool { return true }

func countingJob(env *stream.Environment, newSource func() operators.Source[int], sink *operators.CollectSink[int]) {
	stream.FromSource(env, "counter", newSource).To("collect", sink.Subtask)
}

// A source that records no position (it implements neither
// operators.Snapshotter nor operators.Replayer) would start again from its
// beginning after a restart, and a checkpointed job would repeat every
// record it had read before the restored checkpoint, through every
// exactly-once sink, without an error. It is refused like a source that
// says it cannot replay, naming it and the ways to make it fit.
func TestCheckpointedJobRefusesSourceWithoutPosition(t *testing.T) {
	env := stream.NewEnvironment("no-position", checkpointing(t))
	countingJob(env, func() operators.Source[int] { return &countingSource{n: 5} }, operators.NewCollectSink[int]())
	_, planErr := env.Plan()
	err := env.Execute(context.Background())
	for _, e := range []error{planErr, err} {
		if !errors.Is(e, stream.ErrNotReplayable) || !strings.Contains(e.Error(), `"counter"`) ||
			!strings.Contains(e.Error(), "SnapshotState") || !strings.Contains(e.Error(), "Replayable") {
			t.Fatalf("Plan, Execute = %v, %v; want ErrNotReplayable naming source \"counter\", SnapshotState and Replayable", planErr, err)
		}
	}

	// A source that says it replays, and one run at-most-once, are taken;
	// so is the source in a job without checkpoints.
	for name, opts := range map[string][]stream.Option{
		"replayable":     {checkpointing(t)},
		"at-most-once":   {checkpointing(t), stream.AllowAtMostOnceSources()},
		"no checkpoints": nil,
	} {
		newSource := func() operators.Source[int] { return &countingSource{n: 5} }
		if name == "replayable" {
			newSource = func() operators.Source[int] { return &replayingCountingSource{countingSource{n: 5}} }
		}
		sink := operators.NewCollectSink[int]()
		env := stream.NewEnvironment("no-position-"+strings.ReplaceAll(name, " ", "-"), opts...)
		countingJob(env, newSource, sink)
		if err := env.Execute(context.Background()); err != nil || sink.Len() != 5 {
			t.Errorf("%s: Execute = %v with %d records; want nil, 5", name, err, sink.Len())
		}
	}
}
