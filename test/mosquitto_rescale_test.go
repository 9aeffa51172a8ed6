package test

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgedio/edged/internal/testutil"
)

// TestMosquittoKillsAndRescalesMixed: devices publish to Mosquitto at QoS
// 1 without pause while edged is taken down six times, each time started
// again at another parallelism: SIGKILL and a plain start (restored from
// its latest checkpoint at the new parallelism), `edged stop` and `edged
// run --from-savepoint`, `edged stop` and a plain start (restored from the
// savepoint). Mosquitto keeps the readings for edged's persistent session
// while it is down and resends what it had not acknowledged. A consumer
// that drops repeated msg_ids must see every window exactly once with its
// exact count.
func TestMosquittoKillsAndRescalesMixed(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with subprocesses")
	}
	const job = "mixed"
	w := newWorkload(t, 100_000)
	type step struct {
		at   int
		kill bool // else edged stop
		par  int  // parallelism of the next run
		sp   bool // next run --from-savepoint
	}
	steps := []step{
		{at: w.n * 15 / 100, kill: true, par: 3},
		{at: w.n * 30 / 100, kill: true, par: 1},
		{at: w.n * 45 / 100, kill: false, par: 2, sp: true},
		{at: w.n * 55 / 100, kill: true, par: 2},
		{at: w.n * 70 / 100, kill: false, par: 3, sp: false},
		{at: w.n * 85 / 100, kill: true, par: 1},
	}
	mq := startMosquitto(t)
	url := "tcp://" + mq
	dir := t.TempDir()
	api := freeAddr(t)
	cfg := func(par int) string {
		return writeExactConfig(t, dir, exactConfig{job: job, api: api, external: url, clientID: "edged-mixed", qos: 1, parallelism: par})
	}
	nd := &node{t: t, cfgPath: cfg(2), logPath: filepath.Join(dir, "edged.log"), brokerAddr: mq, apiAddr: api}
	cleanupNode(t, nd)
	col := newCollector()
	sub := connect(t, paho.NewClientOptions().AddBroker(url).SetClientID("e2e-mixed-results").
		SetCleanSession(false).SetAutoReconnect(false).SetOrderMatters(false).SetDefaultPublishHandler(col.handle))
	defer sub.Disconnect(100)
	if tok := sub.Subscribe("agg/#", 1, col.handle); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	nd.start()
	devs := devices(t, url, "e2e-mixed-devices", conns, false)
	defer disconnectAll(devs, 100)
	l := startLoader(w, devs, 1, 0, w.all())
	for i, s := range steps {
		l.setCap(int64(s.at + 3000))
		testutil.Eventually(t, 120*time.Second, fmt.Sprintf("reading %d published", s.at), func() bool { return l.next.Load() >= int64(s.at) })
		testutil.Eventually(t, 60*time.Second, "results of this run", func() bool { return col.received(i) > 0 })
		sp := ""
		if s.kill {
			nd.kill()
		} else {
			sp = cliStop(t, nd, job)
			if code := nd.waitExit(t, 30*time.Second); code != 0 {
				t.Fatalf("node exited %d after the stop with savepoint, want 0", code)
			}
		}
		t.Logf("step %d (%+v): down at reading %d", i, s, l.next.Load())
		col.setRun(i + 1)
		cfg(s.par)
		if s.sp {
			nd.start("--from-savepoint", sp)
		} else {
			nd.start()
		}
		nd.checkParallelism(t, job, job+"/window", s.par)
	}
	l.liftCap()
	l.wait(t, nd, 120*time.Second)
	waitResults(t, col, w, 90*time.Second)
	if code := nd.terminate(30 * time.Second); code != 0 {
		t.Errorf("edged exited %d after SIGTERM, want 0", code)
	}
	drain(t, url, "agg/_marker", col)
	checkExact(t, col, w)
}
