package test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgedio/edged/internal/testutil"
)

// TestCLIRescaleStopResume: a node with the embedded broker counts each
// sensor's readings per 1 s event-time window at parallelism 2 and
// publishes the counts through the write-ahead sink. After a seeded first
// part of the readings `edged stop` takes a savepoint and ends the job (the
// node exits 0); the node comes back with parallelism 3 in its config and
// `edged run --from-savepoint` that savepoint, takes the second part, is
// stopped the same way, and comes back with parallelism 1, resuming by
// itself from the latest savepoint, for the rest. The parts end inside
// windows, so open windows move between subtasks with their key groups.
// Each run's parallelism is read from GET /jobs/{name}/operators and its
// restore point from its log. A consumer that drops repeated msg_ids
// must see every window exactly once with its exact count; the resumed
// runs' logs must say that they publish nothing the stops' savepoints
// held again.
func TestCLIRescaleStopResume(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with subprocesses")
	}
	const job = "rescale"
	w := newWorkload(t, 100_000)
	rng := seededRand(t)
	b1 := w.n/4 + rng.IntN(w.n*3/20)   // in [25%, 40%)
	b2 := w.n*3/5 + rng.IntN(w.n*3/20) // in [60%, 75%)
	if b1%w.winMS == 0 {               // the parts end inside windows
		b1 += w.winMS / 2
	}
	if b2%w.winMS == 0 {
		b2 += w.winMS / 2
	}
	type part struct {
		par      int
		from, to int
	}
	parts := []part{{2, 0, b1}, {3, b1, b2}, {1, b2, w.all()}}
	t.Logf("%d readings (EDGED_E2E_READINGS); parts: %+v", w.n, parts)

	start := time.Now()
	dir := t.TempDir()
	broker, api := freeAddr(t), freeAddr(t)
	url := "tcp://" + broker
	cfg := func(par int) string {
		// Checkpoints 5 s apart: a stop right after a part's last readings
		// almost always finds results of windows fired since the last
		// checkpoint, which its savepoint holds (at 200 ms, a checkpoint
		// between the last window and the stop often left none, and the
		// path below was not reached).
		return writeExactConfig(t, dir, exactConfig{job: job, api: api, broker: broker, qos: 1, parallelism: par, interval: "5s"})
	}
	nd := &node{t: t, cfgPath: cfg(parts[0].par), logPath: filepath.Join(dir, "edged.log"), brokerAddr: broker, apiAddr: api}
	cleanupNode(t, nd)
	savepoints := filepath.Join(dir, "data", "checkpoints", "savepoints") + string(filepath.Separator)

	col := newCollector()
	sub := paho.NewClient(paho.NewClientOptions().AddBroker(url).SetClientID("e2e-rescale-results").
		SetCleanSession(false).SetAutoReconnect(false).SetOrderMatters(false).
		SetDefaultPublishHandler(col.handle).SetConnectionLostHandler(func(paho.Client, error) {}))
	defer sub.Disconnect(100)
	subscribe := func() {
		t.Helper()
		if tok := sub.Subscribe("agg/#", 1, col.handle); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
			t.Fatalf("subscribe: %v", tok.Error())
		}
	}

	sp := ""
	for i, p := range parts {
		cfg(p.par)
		col.setRun(i)
		switch i {
		case 0:
			nd.start()
		case 1:
			nd.start("--from-savepoint", sp)
		default:
			nd.start() // resumes by itself from its latest snapshot: the savepoint
		}
		if sp != "" {
			nd.checkRestoredFrom(t, sp)
		}
		nd.checkParallelism(t, job, job+"/window", p.par)
		if !reconnect(t, sub, "the result consumer") {
			if i > 0 {
				t.Logf("the broker did not keep the result consumer's session across the stop: subscribing again")
			}
			subscribe()
		}

		devs := devices(t, url, fmt.Sprintf("e2e-rescale-devices-%d", i), w.sensors, false)
		l := startLoader(w, devs, 1, p.from, p.to)
		l.wait(t, nd, 90*time.Second)
		disconnectAll(devs, 100)
		t.Logf("part %d: readings %d..%d published at parallelism %d after %v", i+1, p.from, p.to-1, p.par, time.Since(start).Round(time.Millisecond))
		if i == len(parts)-1 {
			break
		}
		// Results of this part came through the sink at this
		// parallelism before the stop.
		testutil.Eventually(t, 60*time.Second, fmt.Sprintf("results of part %d", i+1), func() bool { return col.received(i) > 0 })
		prev := sp
		sp = cliStop(t, nd, job)
		if sp == prev || !strings.HasPrefix(sp, savepoints) {
			t.Fatalf("edged stop printed %q: want a new savepoint under %s (previous %q)", sp, savepoints, prev)
		}
		if code := nd.waitExit(t, 30*time.Second); code != 0 {
			t.Fatalf("node exited %d after the stop with savepoint, want 0", code)
		}
	}

	waitResults(t, col, w, 60*time.Second)
	drain(t, url, "agg/_marker", col)
	if code := nd.terminate(30 * time.Second); code != 0 {
		t.Errorf("edged exited %d after SIGTERM, want 0", code)
	}
	checkExact(t, col, w)
	// Each stop's savepoint is marked committed once the sink published
	// what it held: the resumed runs publish none of it again, and say so.
	logb, err := os.ReadFile(nd.logPath)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(logb, []byte("publishing again the results the restored checkpoint held")) {
		t.Error("a run resumed from a stop's savepoint published the savepoint's held results again")
	}
	if !bytes.Contains(logb, []byte("the results it held are not published again")) {
		t.Error("no resumed run restored held results from a stop's savepoint: the path the test names was not reached")
	}
	t.Logf("done in %v", time.Since(start).Round(time.Millisecond))
}
