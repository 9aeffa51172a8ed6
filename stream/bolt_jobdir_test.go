package stream_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/stream"
)

// TestBoltFilesStayInTheStateDirWhateverTheJobName runs jobs whose names
// are no plain directory name on the bolt backend: each keeps its bbolt
// files in a directory of its own inside the backend's dir. Before, the
// name was joined to the dir as it was, so "../out" wrote (and, at every
// start, removed) the files beside the state dir, ".." in its parent, and
// "" and "." in the state dir itself.
func TestBoltFilesStayInTheStateDirWhateverTheJobName(t *testing.T) {
	root := t.TempDir()
	stateDir := filepath.Join(root, "state")
	names := []string{"../out", "..", ".", "", "a/b", "plain"}
	for _, name := range names {
		env := stream.NewEnvironment(name, stream.WithBoltStateBackend(stateDir))
		src := stream.FromSource(env, "src", generator(200, 5))
		sink := operators.NewCollectSink[countSum]()
		stream.Aggregate(stream.KeyBy(src, bySensor), "count", countSumAgg{}).UID("count").
			To("sink", func() operators.Sink[countSum] { return sink.Subtask() })
		if err := execute(t, env); err != nil {
			t.Fatalf("job %q: %v", name, err)
		}
		if sink.Len() != 200 {
			t.Fatalf("job %q: %d results, want 200", name, sink.Len())
		}
	}
	dirs := map[string]bool{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(stateDir, path)
		if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(os.PathSeparator)) {
			t.Errorf("%s is outside the state dir %s", path, stateDir)
			return nil
		}
		if filepath.Dir(rel) == "." {
			t.Errorf("%s is in the state dir itself, not in a job's directory", path)
		}
		if strings.HasSuffix(rel, ".db.lock") { // the .db is removed at Close
			dirs[filepath.Dir(rel)] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(dirs) != len(names) {
		t.Errorf("the %d jobs kept their files in %d directories, want one each: %v", len(names), len(dirs), dirs)
	}
	for d := range dirs {
		if strings.Contains(d, string(os.PathSeparator)) {
			t.Errorf("job directory %q is nested", d)
		}
	}
}
