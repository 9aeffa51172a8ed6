package daemon_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgedio/edged/daemon"
)

// The windows and the alerts keep their state by the values of the key
// field. A restart keyed by another field is refused at once, naming the
// operator and both fields; before, the windows open at the stop fired
// with the old field's values under the new field's name (a window of
// sensor "s2" published as room "s2"). A restart with the same key
// resumes.
func TestRestoreRefusesAnotherKeyField(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "cp")
	config := func(key string) string {
		return `
pipelines:
  - name: ky
    source:
      generator: {count: 0, rate: 200, keys: 4}
    compute: {zone: 'id + "-zone"'}
    key: ` + key + `
    window:
      type: tumbling
      size: 1h
      aggregates: [{name: n, fn: count}]
    alerts: [{name: hot, when: temp > 38, for: 1h}]
    sinks:
      - stdout: {}
    checkpoint:
      interval: 50ms
      dir: ` + dir + "\n"
	}
	checkpointAndStop(t, config("id"), "ky")
	n := checkpointAndStop(t, config("id"), "ky")
	if !strings.Contains(n.logs.String(), "resuming from the latest snapshot") {
		t.Fatalf("the same key did not resume:\n%s", n.logs.String())
	}
	n = startNode(t, config("zone"), daemon.Options{})
	err := n.wait(t)
	for _, want := range []string{`"ky/`, "key=id", "key=zone", "incompatible"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Run: %v; want it to name %q", err, want)
		}
	}
	if !strings.Contains(n.logs.String(), "attempts=0") {
		t.Errorf("the restore was retried:\n%s", n.logs.String())
	}
	if err != nil && !strings.Contains(err.Error(), "move that directory away or give the pipeline another checkpoint.dir") {
		t.Errorf("Run: %v; want it to say how to start without the snapshot", err)
	}

	// The same snapshot named by --from-savepoint, for a pipeline with
	// another checkpoint.dir: the error says to start without the flag.
	sps, _ := filepath.Glob(filepath.Join(dir, "savepoints", "sp-*"))
	if len(sps) == 0 {
		t.Fatalf("no savepoint under %s", dir)
	}
	dir = filepath.Join(t.TempDir(), "cp2")
	n = startNode(t, config("zone"), daemon.Options{Savepoint: sps[len(sps)-1]})
	err = n.wait(t)
	for _, want := range []string{"key=zone", "incompatible", "start it without --from-savepoint"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Run from the savepoint: %v; want it to name %q", err, want)
		}
	}
}
