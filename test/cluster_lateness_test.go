package test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/edgedio/edged/internal/testutil"
)

// withLateness gives a cluster node's 1 s windows an allowed lateness of
// one minute.
func withLateness(cfg string) string {
	const window = "      type: tumbling\n      size: 1s\n"
	if !strings.Contains(cfg, window) {
		panic("withLateness: unexpected config:\n" + cfg)
	}
	return strings.Replace(cfg, window, window+"      allowed_lateness: 1m\n", 1)
}

// TestClusterLateUpdatesAcrossFailover runs the e2e workload on a
// three-node cluster with gossip, its 1 s windows with an allowed lateness
// of a minute. Late readings within the lateness, for windows that fired
// before a worker was SIGKILLed, come after the failover (on the live
// nodes) and after the worker came back; a reading past the lateness comes
// at the end. Each late reading within the lateness updates its window
// once (a second result, under a new msg_id), the one past it is one dead
// letter, and every other window arrives once with its exact count. At
// the end late readings go to the leader and the worker is killed again
// at once: each of them updates its window once too.
func TestClusterLateUpdatesAcrossFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with three subprocesses and SIGKILL")
	}
	members := startClusterEdited(t, true, withLateness)
	l := newClusterLoad(t, members)
	l.takeDeadLetters()
	a, c := members[0], members[2]
	client := &http.Client{Timeout: time.Second}
	testutil.Eventually(t, 30*time.Second, "the master sees every node alive", func() bool {
		s, err := a.status(client)
		return err == nil && s.alive() == 3 && s.keyedOn("c") > 0
	})
	// late publishes a reading of sensor s in window w to node i's broker.
	late := func(i int, s string, w int) {
		t.Helper()
		p := fmt.Sprintf(`{"sensor":%q,"t":99.5,"ts":%d}`, s, epochMS+int64(w)*windowMS+500)
		if tok := l.pubs[i][0].Publish("sensors/"+s+"/temperature", 1, false, p); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
			t.Fatalf("publish %s: %v", p, tok.Error())
		}
	}
	waitWindows := func(windows int, what string) {
		t.Helper()
		if !testutil.Within(90*time.Second, func() bool { return countWindows(l.col, windows) >= windows*sensors }) {
			t.Fatalf("%d of %d window results %s", countWindows(l.col, windows), windows*sensors, what)
		}
	}

	const n1, n2, n3 = 15_000, 24_000, 90_000
	l.publish(0, n1)
	waitWindows(10, "before the kill")
	testutil.Eventually(t, 60*time.Second, "node c's log released all it was sent", func() bool {
		rel, err := c.released(client)
		return err == nil && rel >= n1/3
	})
	l.kill(2)
	testutil.Eventually(t, 60*time.Second, "the master moved node c's subtasks to live nodes", func() bool {
		s, err := a.status(client)
		return err == nil && s.FailoversTotal >= 1 && s.keyedOn("c") == 0 && s.keyedOn("a")+s.keyedOn("b") > 0
	})
	l.publish(n1, n2)
	waitWindows(20, "after the failover")
	// Within the lateness (the watermark is about 23 s in, the windows
	// end at 6 s and 8 s): each updates its window.
	late(0, "s000", 5)
	late(1, "s001", 7)

	l.restart(2)
	testutil.Eventually(t, 90*time.Second, "node c owns key groups again", func() bool {
		s, err := a.status(client)
		return err == nil && s.keyedOn("c") > 0
	})
	late(2, "s002", 9)
	l.publish(n2, n3)
	waitWindows(80, "after the restart")
	// Past the lateness (the watermark is about 89 s in, window 5 ends at
	// 6 s): a dead letter.
	late(1, "s000", 5)
	l.publish(n3, n3+len(members)*tail)
	windows := n3 / windowMS
	waitWindows(windows, "at the end")

	updated := map[winKey]bool{{"s000", epochMS + 5*windowMS}: true, {"s001", epochMS + 7*windowMS}: true, {"s002", epochMS + 9*windowMS}: true}
	// Late readings within the lateness (window 50 ends at 51 s, the
	// watermark is about 92 s in) of six sensors go to a, and c is killed
	// at once, its log covered by checkpoints (it took readings i%3 == 2
	// of [0, n1) and from n2 on, and one late reading): the window
	// subtasks restored on the live nodes take the late readings from a's
	// log, and each window is updated once.
	cTook := uint64(n1/3 + 1 + (n3-n2)/3 + tail)
	testutil.Eventually(t, 60*time.Second, "node c's log released all it was sent", func() bool {
		rel, err := c.released(client)
		return err == nil && rel >= cTook
	})
	for s := 10; s < 16; s++ {
		late(0, sensorOf(s), 50)
		updated[winKey{sensorOf(s), epochMS + 50*windowMS}] = true
	}
	l.kill(2)
	testutil.Eventually(t, 60*time.Second, "the master moved node c's subtasks to live nodes again", func() bool {
		s, err := a.status(client)
		return err == nil && s.FailoversTotal >= 2 && s.keyedOn("c") == 0 && s.keyedOn("a")+s.keyedOn("b") > 0
	})
	testutil.Within(30*time.Second, func() bool {
		l.col.mu.Lock()
		defer l.col.mu.Unlock()
		for k := range updated {
			if len(l.col.byKey[k]) < 2 {
				return false
			}
		}
		return len(l.col.dead) >= 1
	})
	l.col.mu.Lock()
	defer l.col.mu.Unlock()
	if len(l.col.bad) > 0 {
		t.Fatalf("%d bad results, first: %s", len(l.col.bad), l.col.bad[0])
	}
	for w := range windows {
		for s := range sensors {
			k := winKey{sensorOf(s), epochMS + int64(w)*windowMS}
			counts := map[string]int64{}
			for _, r := range l.col.byKey[k] {
				counts[r.MsgID] = r.Count
			}
			var got []int64
			for _, n := range counts {
				got = append(got, n)
			}
			want := "[10]"
			if updated[k] {
				want = "[10 11]"
				if len(got) == 2 && got[0] > got[1] {
					got[0], got[1] = got[1], got[0]
				}
			}
			if fmt.Sprint(got) != want {
				t.Errorf("window %v: counts by msg_id %v, want %s", k, got, want)
			}
		}
	}
	if len(l.col.dead) != 1 {
		var ds []string
		for _, d := range l.col.dead {
			ds = append(ds, d)
		}
		t.Errorf("%d dead letters, want 1:\n%s", len(l.col.dead), strings.Join(ds, "\n"))
	}
}
