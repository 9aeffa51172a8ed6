package stream_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/snapshot"
	"github.com/edgedio/edged/stream"
)

// A savepoint that never completed (the process died while it was
// written: a stop's savepoint cut short by a power loss) is removed when
// a job starts on the directory, with its files; one written to a path
// of the user's loses only its link, and complete savepoints stay.
// Before, such a savepoint was skipped at every start, logged each time,
// and its files stayed on the card for good.
func TestIncompleteSavepointsRemovedAtStart(t *testing.T) {
	cfg := snapshot.DefaultConfig()
	cfg.Dir = t.TempDir()
	logs := &testutil.Buffer{}
	build := func() *stream.Environment {
		env := stream.NewEnvironment("incomplete", stream.WithCheckpointing(cfg), stream.WithLogger(slog.New(slog.NewTextHandler(logs, nil))))
		src := stream.FromSource(env, "generator", func() operators.Source[operators.SensorReading] {
			return operators.SensorGenerator(operators.GeneratorConfig{Count: 1_000_000, Keys: 10, Rate: 20_000})
		}).UID("generator")
		src.ForEach("sink", func(operators.SensorReading) error { return nil })
		return env
	}
	job, err := build().ExecuteAsync(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	complete, err := job.StopWithSavepoint(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	if err := job.Wait(); err != nil {
		t.Fatal(err)
	}
	sps := filepath.Join(cfg.Dir, "savepoints")
	cut := filepath.Join(sps, "sp-90-1796414364652")
	if err := os.MkdirAll(cut, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cut, "generator.0.state"), make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	users := filepath.Join(t.TempDir(), "my-savepoint")
	if err := os.MkdirAll(users, 0o755); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(sps, "sp-91-1796414364653")
	if err := os.Symlink(users, link); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	job, err = build().ExecuteAsync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 0, "the incomplete savepoints removed", func() bool {
		_, err1 := os.Lstat(cut)
		_, err2 := os.Lstat(link)
		return os.IsNotExist(err1) && os.IsNotExist(err2)
	})
	cancel()
	job.Wait()
	if _, err := os.Stat(users); err != nil {
		t.Fatalf("the user's savepoint path was removed: %v", err)
	}
	if _, err := os.Stat(filepath.Join(complete, "_metadata")); err != nil {
		t.Fatalf("the complete savepoint was removed: %v", err)
	}
	if got := logs.String(); !strings.Contains(got, "removed a savepoint that never completed") {
		t.Fatalf("removal not logged:\n%s", got)
	}
}
