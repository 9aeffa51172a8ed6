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
