package test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgedio/edged/internal/testutil"
)

// TestMosquittoStopWaitsForTheSinkBroker: `edged stop` of a job whose
// sink's broker (a Mosquitto of its own) is down, with results of
// completed checkpoints waiting for it, waits for the broker instead of
// failing at once: the broker comes back while the stop waits, the stop
// exits 0 with its savepoint, every result went out once, and the job
// started again from that savepoint (the node restarted) goes on with
// exact windows for a consumer that drops repeated msg_ids. Before, the
// stop failed at its first failed publish (HTTP 500, `the job failed
// first: ... publish failed`) and the job restarted.
func TestMosquittoStopWaitsForTheSinkBroker(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with a sink broker down during a stop")
	}
	sf := startSinkFault(t, "stopwait", 20_000)
	defer sf.close()
	out, nd, sub, api := sf.out, sf.nd, sf.sub, sf.api
	half := sf.sinkDownAtHalf(t)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	stop := exec.CommandContext(ctx, edgedBin, "stop", "plant", "--addr", api)
	stop.Stdout, stop.Stderr = &stdout, &stderr
	began := time.Now()
	if err := stop.Start(); err != nil {
		t.Fatal(err)
	}
	stopped := make(chan error, 1)
	go func() { stopped <- stop.Wait() }()
	waiting := testutil.Within(20*time.Second, func() bool {
		select {
		case err := <-stopped:
			stopped <- err
			return true
		default:
		}
		return strings.Contains(nd.runLog(), "waiting for it")
	})
	select {
	case err := <-stopped:
		t.Fatalf("edged stop ended (%v) after %v while the sink's broker was down, before waiting for it: stdout %q stderr %q",
			err, time.Since(began).Round(time.Millisecond), stdout.String(), stderr.String())
	default:
	}
	if !waiting {
		t.Fatal("the stop's sink never logged that it waits for its broker")
	}
	out.start()
	reconnectAll(t, []paho.Client{sub}, "consumer")
	err := testutil.Receive(t, 2*time.Minute, "edged stop", stopped)
	if err != nil {
		t.Fatalf("edged stop: %v after %v: stdout %q stderr %q", err, time.Since(began).Round(time.Millisecond), stdout.String(), stderr.String())
	}
	sp := strings.TrimSpace(stdout.String())
	if fi, err := os.Stat(sp); err != nil || !fi.IsDir() {
		t.Fatalf("edged stop printed %q: stat %v", sp, err)
	}
	t.Logf("edged stop exited 0 after %v, the broker back meanwhile: savepoint %s", time.Since(began).Round(time.Millisecond), sp)
	if code := nd.terminate(30 * time.Second); code != 0 {
		t.Fatalf("edged exited %d after SIGTERM, want 0", code)
	}
	nd.start()
	nd.checkRestoredFrom(t, sp)
	sf.finishExact(t, half)
}

// TestMosquittoSIGTERMWhileTheSinkBrokerStaysDown: SIGTERM to a node
// whose sink's broker (a Mosquitto of its own) is down and stays down
// past the stop's wait: the stop savepoint fails, the job is cancelled
// and the node exits 0, as a stop asked for; started again once the
// broker is back, the job goes on from its latest checkpoint and every
// window reaches the consumer, exact. Before, the sink's failed wait
// failed the job (the node's shutdown had stopped its restarts), which
// counted as a job failure: `edged failed`, exit 1.
func TestMosquittoSIGTERMWhileTheSinkBrokerStaysDown(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with a sink broker down during a SIGTERM")
	}
	sf := startSinkFault(t, "termdown", 20_000)
	defer sf.close()
	out, nd, sub := sf.out, sf.nd, sf.sub
	half := sf.sinkDownAtHalf(t)
	began := time.Now()
	code := nd.terminate(90 * time.Second)
	t.Logf("edged exited %d %v after SIGTERM", code, time.Since(began).Round(time.Millisecond))
	if code != 0 {
		t.Fatalf("edged exited %d after SIGTERM with its sink's broker down, want 0:\n%s", code, nd.logTail())
	}
	if !strings.Contains(nd.runLog(), "stop with savepoint failed; cancelling") {
		t.Fatalf("the failed stop savepoint was not logged:\n%s", nd.logTail())
	}
	out.start()
	reconnectAll(t, []paho.Client{sub}, "consumer")
	nd.start()
	sf.finishExact(t, half)
}
