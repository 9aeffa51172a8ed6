package daemon_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgedio/edged/daemon"
	"github.com/edgedio/edged/pipeline"
)

// A checkpoint.dir that is a file, or lies under one, is refused before
// the pipeline starts with an error naming the key and the file in the
// way; before, the node failed with a bare "open snapshot store: mkdir
// ...: not a directory".
func TestCheckpointDirThatIsAFileRefused(t *testing.T) {
	file := filepath.Join(t.TempDir(), "taken")
	if err := os.WriteFile(file, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{file, filepath.Join(file, "ck")} {
		cfg, err := pipeline.Parse([]byte(tickingConfig("p", dir)))
		if err != nil {
			t.Fatal(err)
		}
		err = daemon.Run(ctxT(t), cfg, daemon.Options{Listen: "127.0.0.1:0"})
		if !errors.Is(err, pipeline.ErrInvalidConfig) || !strings.Contains(err.Error(), "checkpoint.dir") || !strings.Contains(err.Error(), file+" is a file") {
			t.Fatalf("checkpoint.dir %s: Run = %v, want it refused naming checkpoint.dir and the file", dir, err)
		}
	}
}

// So is a node.data_dir that is a file or lies under one, before the
// broker or any ingest log opens; before: "daemon: mqtt: ingest log of
// \"p\": ingestlog: mkdir ...: not a directory".
func TestDataDirThatIsAFileRefused(t *testing.T) {
	file := filepath.Join(t.TempDir(), "taken")
	if err := os.WriteFile(file, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{file, filepath.Join(file, "data")} {
		cfg, err := pipeline.Parse([]byte("node: {data_dir: " + dir + "}\n" + tickingConfig("p", "")))
		if err != nil {
			t.Fatal(err)
		}
		err = daemon.Run(ctxT(t), cfg, daemon.Options{Listen: "127.0.0.1:0"})
		if !errors.Is(err, pipeline.ErrInvalidConfig) || !strings.Contains(err.Error(), "node.data_dir") || !strings.Contains(err.Error(), file+" is a file") {
			t.Fatalf("node.data_dir %s: Run = %v, want it refused naming node.data_dir and the file", dir, err)
		}
	}
}
