package pipeline

import (
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"strings"
	"testing"

	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/keygroup"
	"github.com/edgedio/edged/snapshot"
	"github.com/edgedio/edged/stream"
)

// badRecordsPipeline is walPipeline with no restart section: the default
// restart strategy applies.
func badRecordsPipeline(dir string) string {
	return strings.Replace(walPipeline(2, dir, "20ms"), "    restart: {strategy: none}\n", "", 1)
}

// Readings whose key makes an invalid result topic ("#", "a+b", invalid
// UTF-8, a NUL), is longer than MaxKeyBytes, or whose event time is the minimum or maximum int64 go to
// the dead-letter output with the reason, are counted, and never stop the
// job; the good readings' results are exact; and the job restarted from
// its latest checkpoint (a node restart) runs on.
func TestBadRecordsGoToDeadLetters(t *testing.T) {
	for _, backend := range []string{"memory", "bolt"} {
		t.Run("backend="+backend, func(t *testing.T) { testBadRecordsGoToDeadLetters(t, backend) })
	}
}

func testBadRecordsGoToDeadLetters(t *testing.T, backend string) {
	contend(t)
	h := newMQTTHarness(t)
	dir := t.TempDir()
	cfg := badRecordsPipeline(dir)
	if backend == "bolt" {
		cfg = strings.Replace(cfg, "    key: id\n", "    key: id\n    state_backend: bolt\n    state_dir: "+t.TempDir()+"\n", 1)
	}
	pc := parsePipeline(t, cfg)
	if pc.StateBackend != backend && backend != "memory" {
		t.Fatalf("state backend %q, want %q", pc.StateBackend, backend)
	}
	job, pj, _ := h.start(pc)

	const sensors = 4
	good := func(from, to int64) {
		for s := from; s < to; s++ {
			for k := range sensors {
				h.append(reading(fmt.Sprintf("g%d", k), s*1000))
			}
		}
	}
	bad := map[string]string{ // payload -> what its dead letter's error says
		reading("#", 1000):   "has a wildcard",
		reading("a+b", 1000): "has a wildcard",
		// Invalid UTF-8 in a string field is refused by the decoder already.
		"{\"sensor\":\"\xff\xfe\",\"t\":1,\"ts\":1000}": "invalid UTF-8",
		`{"sensor":"x\u0000y","t":1,"ts":1000}`:         "has a NUL",
		reading("g0", math.MinInt64):                    "event time out of range",
		reading("g0", math.MaxInt64):                    "event time out of range",
		// A key bbolt could not hold, nor the memory backend then.
		reading(strings.Repeat("k", MaxKeyBytes+1), 1000): "key too long",
	}
	good(0, 1)
	for p := range bad {
		h.append(p)
	}
	good(1, 4)
	// The watermark (3s-2ms) closes [0,1s) and [1s,2s): 8 good results,
	// and the 4 results of bad keys, which are dead letters.
	testutil.Eventually(t, waitFor, "the results and dead letters published", func() bool {
		return len(h.published("agg/")) >= 2*sensors && len(h.published("deadletter/")) >= len(bad) || isDone(job)
	})
	if isDone(job) {
		t.Fatalf("job ended: %v", job.Wait())
	}
	if n := job.Attempts(); n != 1 {
		t.Fatalf("%d attempts, want 1", n)
	}
	if n := pj.DeadLetters(); n != int64(len(bad)) {
		t.Fatalf("DeadLetters() = %d, want %d", n, len(bad))
	}
	// Every one is among the latest kept (GET /jobs/{name}/deadletters),
	// the sink's result-topic ones as well as the decoder's.
	recent := pj.RecentDeadLetters()
	if len(recent) != len(bad) {
		t.Fatalf("%d recent dead letters %+v, want %d", len(recent), recent, len(bad))
	}
	want := map[string]int{}
	for _, reason := range bad {
		want[reason]++
	}
	got := map[string]int{}
	for _, d := range recent {
		for reason := range want {
			if strings.Contains(d.Err, reason) {
				got[reason]++
			}
		}
	}
	if !maps.Equal(got, want) {
		t.Fatalf("recent dead letters by reason %v, want %v: %+v", got, want, recent)
	}

	// A node restart: the job ends without a savepoint and starts again
	// from its latest checkpoint, then more readings come.
	h.cancelJob(job)
	store, err := snapshot.OpenStore(dir, pc.Name, keygroup.DefaultMaxParallelism, nil)
	if err != nil {
		t.Fatal(err)
	}
	md, err := store.RecoveryPoint(false)
	if err != nil {
		t.Fatal(err)
	}
	job, _, _ = h.start(pc, stream.WithSavepoint(md.Dir, false))
	good(4, 6)
	testutil.Eventually(t, waitFor, "the results after the restart published", func() bool {
		return distinctIDs(h.published("agg/")) >= 4*sensors || isDone(job)
	})
	if isDone(job) {
		t.Fatalf("restarted job ended: %v", job.Wait())
	}
	if n := job.Attempts(); n != 1 {
		t.Fatalf("restarted job: %d attempts, want 1", n)
	}
	h.cancelJob(job)
	h.sync()

	// Exact results: one per good sensor and closed window, each with one
	// reading; repeats after the restart carry the same msg_id.
	results := map[string]string{}
	for _, p := range h.published("agg/") {
		if prev, ok := results[p.id]; ok && prev != p.payload {
			t.Fatalf("msg_id %s: %s and %s", p.id, prev, p.payload)
		}
		results[p.id] = p.payload
	}
	counts := map[string]int64{}
	for _, payload := range results {
		var r struct {
			ID    string `json:"id"`
			Start int64  `json:"window_start"`
			N     int64  `json:"n"`
		}
		if err := json.Unmarshal([]byte(payload), &r); err != nil {
			t.Fatalf("result %q: %v", payload, err)
		}
		counts[fmt.Sprintf("%s@%d", r.ID, r.Start)] += r.N
	}
	if len(counts) != 4*sensors {
		t.Fatalf("results %v, want %d", counts, 4*sensors)
	}
	for k := range sensors {
		for s := range 4 {
			if w := fmt.Sprintf("g%d@%d", k, s*1000); counts[w] != 1 {
				t.Errorf("window %s counted %d, want 1", w, counts[w])
			}
		}
	}
	// Every bad record is a dead letter, with its reason.
	dead := map[string]string{}
	for _, p := range h.published("deadletter/") {
		var d struct {
			Error   string `json:"error"`
			Payload string `json:"payload"`
		}
		if err := json.Unmarshal([]byte(p.payload), &d); err != nil {
			t.Fatalf("dead letter %q: %v", p.payload, err)
		}
		dead[p.id] = d.Error
	}
	if len(dead) != len(bad) {
		t.Fatalf("%d dead letters, want %d: %v", len(dead), len(bad), dead)
	}
	for payload, reason := range bad {
		found := false
		for _, e := range dead {
			found = found || strings.Contains(e, reason)
		}
		if !found {
			t.Errorf("no dead letter says %q (for %q): %v", reason, payload, dead)
		}
	}
}

func distinctIDs(msgs []published) int {
	ids := map[string]bool{}
	for _, m := range msgs {
		ids[m.id] = true
	}
	return len(ids)
}
