package test

import (
	"bytes"
	"context"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/edgedio/edged/internal/testutil"
)

// A user rescaling a gossip cluster stops the job (edged stop) and then
// the leader first, while the workers run: the next node takes the job
// masters over and resumes every job from its newest snapshot, the
// stopped one included (as a restarted node does). The leader started
// again with --from-savepoint then follows that node: it is refused at
// once with exit 1, naming the leader and the order that works, instead
// of starting as a worker with the savepoint dropped without a word.
func TestClusterFromSavepointOnAFollowerIsRefused(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with three subprocesses")
	}
	members := startCluster(t, true)
	a, b := members[0], members[1]
	l := newClusterLoad(t, members)
	client := &http.Client{Timeout: time.Second}
	waitAllAlive(t, a, 3)
	const n = 15_000
	l.publish(0, n/3)
	// a stays down: what it acknowledged must be covered by a completed
	// checkpoint first, and what its sink published must have reached
	// the subscriber.
	testutil.Eventually(t, 60*time.Second, "node a's log released all it was sent", func() bool {
		rel, err := a.released(client)
		return err == nil && rel >= (n/3+2)/3
	})
	sp := cliStop(t, a.node, "sensors")
	drain(t, "tcp://"+a.brokerAddr, "agg/_marker", l.col)
	l.stop(0)
	testutil.Eventually(t, 30*time.Second, "node b runs the job masters", func() bool {
		m, err := b.jobMasters(client)
		return err == nil && m == 1
	})

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out bytes.Buffer
	run := exec.CommandContext(ctx, edgedBin, "run", "-c", a.cfgPath, "--from-savepoint", sp)
	run.Stdout, run.Stderr = &out, &out
	err := run.Run()
	if ctx.Err() != nil {
		t.Fatalf("edged run --from-savepoint on a follower did not end within 30 s:\n%s", out.String())
	}
	code := run.ProcessState.ExitCode()
	if code != 1 || !strings.Contains(out.String(), `--from-savepoint given to a node that does not run the job masters: node \"a\" follows the leader (b)`) {
		t.Fatalf("edged run --from-savepoint on a follower: exit %d (%v):\n%s", code, err, out.String())
	}
	// The cluster runs on, exact, without a.
	l.publish(n/3, n)
	l.finishChecked(n, 120*time.Second)
}
