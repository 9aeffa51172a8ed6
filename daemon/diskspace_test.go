package daemon_test

import (
	"strings"
	"syscall"
	"testing"

	"github.com/edgedio/edged/daemon"
)

// An ingest log whose bound (plus one segment) is larger than the file
// system holding it is warned about at start, naming the key and both
// sizes: on a card smaller than the default bound (1 GiB, 64 MiB
// segments) the card fills before the bound holds back the publishers,
// and on one smaller than a segment the log frees nothing. Before, the
// node started without a word and, on an 8 MiB card, stopped taking
// readings for good once it filled. A bound that fits is not warned
// about.
func TestStartWarnsWhenTheIngestLogBoundExceedsItsFileSystem(t *testing.T) {
	dir := t.TempDir()
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Skipf("statfs %s: %v", dir, err)
	}
	fsBytes := uint64(st.Blocks) * uint64(st.Bsize)
	for _, tc := range []struct {
		name  string
		bound string
		warn  bool
	}{
		{"over", "1125899906842624", fsBytes < 1<<50}, // 1 PiB
		{"fits", "33554432", fsBytes < 40<<20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			y := mqttDemo(t)
			y = strings.Replace(y, "        qos: 1\n", "        qos: 1\n        log_max_bytes: "+tc.bound+"\n", 1)
			n := startNode(t, y, daemon.Options{})
			logs := n.logs.String()
			warned := strings.Contains(logs, "source.mqtt.log_max_bytes does not fit on the file system")
			if warned != tc.warn {
				t.Fatalf("warned %v, want %v (file system of %d bytes):\n%s", warned, tc.warn, fsBytes, logs)
			}
			if warned && (!strings.Contains(logs, "level=WARN") || !strings.Contains(logs, "log_max_bytes="+tc.bound) ||
				!strings.Contains(logs, "pipeline=sensors")) {
				t.Fatalf("the warning does not name the pipeline and the bound:\n%s", logs)
			}
		})
	}
}
