package daemon_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgedio/edged/daemon"
	"github.com/edgedio/edged/pipeline"
)

// A savepoint given to a node of several pipelines (edged run
// --from-savepoint) starts the pipeline it was taken of; the others resume
// from their own snapshots, as on a plain restart, instead of failing to
// restore another job's operators (or, with --allow-non-restored, starting
// without their state). A savepoint of no pipeline of the config is
// refused before anything starts.
func TestSavepointStartsOnlyItsOwnPipeline(t *testing.T) {
	dir := t.TempDir()
	two := tickingConfig("a", filepath.Join(dir, "a")) +
		strings.TrimPrefix(tickingConfig("b", filepath.Join(dir, "b")), "\npipelines:\n")
	first := startNode(t, two, daemon.Options{})
	first.cancel()
	if err := first.wait(t); err != nil {
		t.Fatalf("Run: %v", err)
	}
	savepoint := func(job string) string {
		sps, err := filepath.Glob(filepath.Join(dir, job, "savepoints", "*"))
		if err != nil || len(sps) != 1 {
			t.Fatalf("savepoints of %s = %v, %v; want one", job, sps, err)
		}
		return sps[0]
	}
	spA, spB := savepoint("a"), savepoint("b")

	for _, allow := range []bool{false, true} {
		n := startNode(t, two, daemon.Options{Savepoint: spA, AllowNonRestored: allow})
		jobs, err := n.client.Jobs(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		for _, j := range jobs {
			if j.Status != daemon.StatusRunning {
				t.Errorf("allow_non_restored=%v: job %s is %s (%s), want running", allow, j.Name, j.Status, j.Error)
			}
		}
		logs := n.logs.String()
		for job, from := range map[string]string{"a": spA, "b": spB} {
			if want := `msg="job started" job=` + job + ` checkpointing=true restored_from=` + from; !strings.Contains(logs, want) {
				t.Errorf("allow_non_restored=%v: logs lack %q:\n%s", allow, want, logs)
			}
		}
		n.cancel()
		if err := n.wait(t); err != nil {
			t.Fatalf("Run: %v", err)
		}
		spA, spB = newest(t, filepath.Join(dir, "a")), newest(t, filepath.Join(dir, "b"))
	}

	cfg, err := pipeline.Parse([]byte(tickingConfig("b", filepath.Join(dir, "b2")) +
		strings.TrimPrefix(tickingConfig("c", filepath.Join(dir, "c")), "\npipelines:\n")))
	if err != nil {
		t.Fatal(err)
	}
	err = daemon.Run(ctxT(t), cfg, daemon.Options{Listen: "127.0.0.1:0", Savepoint: spA})
	if err == nil || !strings.Contains(err.Error(), `of job "a"`) || !strings.Contains(err.Error(), "b, c") {
		t.Fatalf("Run with a savepoint of no pipeline of the config: %v, want an error naming job a and the pipelines b, c", err)
	}
}

// newest returns the newest savepoint under a checkpoint dir.
func newest(t *testing.T, dir string) string {
	t.Helper()
	sps, err := filepath.Glob(filepath.Join(dir, "savepoints", "*"))
	if err != nil || len(sps) == 0 {
		t.Fatalf("savepoints under %s: %v, %v", dir, sps, err)
	}
	best := sps[0]
	for _, sp := range sps[1:] {
		if id(sp) > id(best) {
			best = sp
		}
	}
	return best
}

// id returns the checkpoint id in a savepoint's name, sp-<id>-<time>.
func id(sp string) int {
	var n int
	for _, c := range strings.TrimPrefix(filepath.Base(sp), "sp-") {
		if c < '0' || c > '9' {
			break
		}
		n = n*10 + int(c-'0')
	}
	return n
}
