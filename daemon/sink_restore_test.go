package daemon_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgedio/edged/daemon"
)

// A sink's uid is its position in sinks:, so a sink added in front of
// the others takes the uid, and the snapshot's state, of the sink that
// was there. A restart with a file sink where a write-ahead MQTT sink was
// is refused at once, naming the sink and both kinds, instead of the file
// sink reading the results the MQTT sink held as its pending parts (it
// failed every attempt renaming parts named by those bytes); a sink added
// behind the others resumes.
func TestRestoreRefusesASinkOfAnotherKindAtItsPosition(t *testing.T) {
	tmp := t.TempDir()
	cp, data, out := filepath.Join(tmp, "cp"), filepath.Join(tmp, "data"), filepath.Join(tmp, "out")
	config := func(sinks string) string {
		return `
node:
  data_dir: ` + data + `
  broker: 127.0.0.1:0
pipelines:
  - name: sk
    source:
      generator: {count: 0, rate: 200, keys: 4}
    key: id
    window:
      type: tumbling
      size: 1h
      aggregates: [{name: n, fn: count}]
    sinks: ` + sinks + `
    checkpoint:
      interval: 50ms
      dir: ` + cp + "\n"
	}
	mqttSink := `{mqtt: {topic: "agg/{id}"}}`
	fileSink := `{file: {dir: ` + out + `}}`
	checkpointAndStop(t, config("["+mqttSink+"]"), "sk")

	// A file sink behind the MQTT sink: resumes.
	n := checkpointAndStop(t, config("["+mqttSink+", "+fileSink+"]"), "sk")
	if !strings.Contains(n.logs.String(), "resuming from the latest snapshot") {
		t.Fatalf("a sink added behind the others did not resume:\n%s", n.logs.String())
	}

	// A file sink in front of it: refused at once, not retried.
	n = startNode(t, config("["+fileSink+", "+mqttSink+"]"), daemon.Options{})
	err := n.wait(t)
	for _, want := range []string{`"sk/sink-0-`, `"sink mqtt"`, `"sink file"`, "incompatible"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Run: %v; want it to name %q", err, want)
		}
	}
	if !strings.Contains(n.logs.String(), "attempts=0") {
		t.Errorf("the restore was retried:\n%s", n.logs.String())
	}
}
