package test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/edgedio/edged/internal/testutil"
)

// The session workload: readings come in bursts of 1,000 (burst i/1000),
// each burst 1 s of event time followed by 1 s without readings; sensor
// i%sensors sends every 100 ms of a burst. With a gap of 500 ms every
// sensor has one session of perSensor readings per burst, from its first
// reading of the burst to its last plus the gap.
const (
	sessionBurst = 1000
	sessionGapMS = 150
)

func sessionPayload(i int) (string, []byte) {
	s := sensorOf(i)
	ts := epochMS + int64(i/sessionBurst)*2*sessionBurst + int64(i%sessionBurst)
	return "sensors/" + s + "/temperature", []byte(fmt.Sprintf(`{"sensor":%q,"t":%d.5,"ts":%d}`, s, 20+i%15, ts))
}

// sessionOf returns sensor s's session of burst b: its start and end.
func sessionOf(s, b int) (start, end int64) {
	first := epochMS + int64(b)*2*sessionBurst + int64(s)
	last := first + sessionBurst - sensors
	return first, last + sessionGapMS
}

// withSessionWindows makes a cluster node's pipeline count per event-time
// session of a 150 ms gap instead of per 1 s tumbling window.
func withSessionWindows(cfg string) string {
	const tumbling = "      type: tumbling\n      size: 1s\n"
	if !strings.Contains(cfg, tumbling) {
		panic("withSessionWindows: unexpected config:\n" + cfg)
	}
	return strings.Replace(cfg, tumbling, fmt.Sprintf("      type: session\n      gap: %dms\n", sessionGapMS), 1)
}

// checkExactSessions waits until every sensor's session of each of the
// first bursts bursts arrived, then checks that each arrived under one
// msg_id with its exact count and end, and that no other session
// starting before the end of those bursts arrived (a session split in two,
// or a reading in a session of its own).
func checkExactSessions(t *testing.T, col *collector, bursts int, timeout time.Duration) {
	t.Helper()
	complete := func() int {
		col.mu.Lock()
		defer col.mu.Unlock()
		n := 0
		for b := range bursts {
			for s := range sensors {
				start, _ := sessionOf(s, b)
				if len(col.byKey[winKey{sensorOf(s), start}]) > 0 {
					n++
				}
			}
		}
		return n
	}
	if !testutil.Within(timeout, func() bool { return complete() == bursts*sensors }) {
		t.Fatalf("%d of %d sessions after %v", complete(), bursts*sensors, timeout)
	}
	col.mu.Lock()
	defer col.mu.Unlock()
	if len(col.bad) > 0 {
		t.Fatalf("%d bad results, first: %s", len(col.bad), col.bad[0])
	}
	want := map[winKey]int64{}
	for b := range bursts {
		for s := range sensors {
			start, end := sessionOf(s, b)
			want[winKey{sensorOf(s), start}] = end
		}
	}
	limit := epochMS + int64(bursts)*2*sessionBurst
	for k, rs := range col.byKey {
		end, ok := want[k]
		if !ok {
			if k.start < limit {
				t.Errorf("session %v: not a session of the readings (%d results, first %+v)", k, len(rs), rs[0])
			}
			continue
		}
		ids := map[string]bool{}
		for _, r := range rs {
			ids[r.MsgID] = true
		}
		if len(ids) > 1 {
			t.Errorf("session %v: %d results under %d msg_ids: emitted twice", k, len(rs), len(ids))
		}
		if rs[0].Count != perSensor || rs[0].WindowEnd != end {
			t.Errorf("session %v: count %d, end %d; want %d, %d", k, rs[0].Count, rs[0].WindowEnd, perSensor, end)
		}
	}
}

// TestClusterSessionWindowsFailover runs event-time session windows on a
// three-node cluster with gossip: readings in bursts, each sensor's
// session per burst, its readings dealt to the three nodes in turn, so
// that they reach the window out of order and sessions merge. A node (a
// worker, or the leader with the job masters) is SIGKILLed while the job
// still processes the readings the live nodes took (sessions open on
// every node), left down until its key groups run on the live nodes, then
// restarted and given its subtasks (or the leadership) back. Every
// sensor's session of every burst arrives under one msg_id with its exact
// count and end, and no other session does.
func TestClusterSessionWindowsFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with three subprocesses and SIGKILL")
	}
	t.Run("worker", func(t *testing.T) { sessionWindowsFailover(t, 2) })
	t.Run("leader", func(t *testing.T) { sessionWindowsFailover(t, 0) })
}

func sessionWindowsFailover(t *testing.T, victim int) {
	members := startClusterEdited(t, true, withSessionWindows)
	l := newClusterLoad(t, members)
	l.payload = sessionPayload
	v := members[victim]
	// watcher is a node that stays up: the leader, or b when the leader
	// is the one killed.
	watcher := members[0]
	if victim == 0 {
		watcher = members[1]
	}
	client := &http.Client{Timeout: time.Second}
	testutil.Eventually(t, 30*time.Second, "the leader sees every node alive", func() bool {
		s, err := members[0].status(client)
		return err == nil && s.alive() == 3 && s.keyedOn(v.id) > 0
	})

	const n1, n2, n3, n4 = 15_500, 24_300, 33_700, 45_000
	l.publish(0, n1)
	// Everything the node acknowledged is covered by completed
	// checkpoints before it is killed (see TestClusterWorkerFailover).
	testutil.Eventually(t, 60*time.Second, "node "+v.id+"'s log released all it was sent", func() bool {
		rel, err := v.released(client)
		// The readings i%3 == victim of [0, n1).
		return err == nil && rel >= uint64((n1-victim+2)/3)
	})
	// The node's devices go away; the live nodes take the readings, and
	// the node is killed while the job processes them.
	l.disconnect(victim)
	l.down[victim] = true
	l.publish(n1, n2)
	v.kill()
	t.Logf("killed node %s", v.id)
	start := time.Now()
	testutil.Eventually(t, 60*time.Second, "node "+v.id+"'s subtasks run on the live nodes", func() bool {
		s, err := watcher.status(client)
		if err != nil || s.keyedOn(v.id) != 0 {
			return false
		}
		live := 0
		for _, m := range members {
			if m != v {
				live += s.keyedOn(m.id)
			}
		}
		return live > 0
	})
	t.Logf("failover after %v", time.Since(start).Round(time.Millisecond))
	l.publish(n2, n3)

	// The node comes back and gets its subtasks back, under load.
	l.restart(victim)
	testutil.Eventually(t, 90*time.Second, "node "+v.id+" owns key groups again", func() bool {
		s, err := members[0].status(client)
		return err == nil && s.keyedOn(v.id) > 0
	})
	l.publish(n3, n4)
	l.publish(n4, n4+len(members)*tail)
	checkExactSessions(t, l.col, n4/sessionBurst, 120*time.Second)
	l.col.mu.Lock()
	t.Logf("%d sessions received under %d msg_ids", len(l.col.byKey), len(l.col.byMsgID))
	l.col.mu.Unlock()
}

// TestClusterSessionWindowsWorkerKilledBeforeCheckpoint kills a worker
// right after its devices published to it, while readings it
// acknowledged are above every completed checkpoint, and restarts it
// after the failover. Those readings live only on its disk and are read
// once its split is home, behind the watermark: each is in a session or
// a dead letter, none vanishes, and no session or dead letter comes
// twice.
func TestClusterSessionWindowsWorkerKilledBeforeCheckpoint(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with three subprocesses and SIGKILL")
	}
	members := startClusterEdited(t, true, withSessionWindows)
	l := newClusterLoad(t, members)
	l.payload = sessionPayload
	l.deadLetters = true
	for _, c := range l.subs {
		if tok := c.Subscribe("deadletter/#", 1, l.col.handle); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
			t.Fatalf("subscribe to the dead letters: %v", tok.Error())
		}
	}
	a, c := members[0], members[2]
	client := &http.Client{Timeout: time.Second}
	testutil.Eventually(t, 30*time.Second, "the master sees every node alive", func() bool {
		s, err := a.status(client)
		return err == nil && s.alive() == 3 && s.keyedOn("c") > 0
	})
	const n1, n2, n3, n4 = 15_500, 24_300, 33_700, 45_000
	l.publish(0, n1)
	rel, err := c.released(client)
	if err != nil {
		t.Fatal(err)
	}
	if rel >= n1/3 {
		t.Fatalf("node c's log was released up to %d of %d before the kill: no reading was above the checkpoints", rel, n1/3)
	}
	l.kill(2)
	t.Logf("killed node c with its log released up to %d of %d", rel, n1/3)
	testutil.Eventually(t, 60*time.Second, "the master moved node c's subtasks to live nodes", func() bool {
		s, err := a.status(client)
		return err == nil && s.FailoversTotal >= 1 && s.keyedOn("c") == 0
	})
	l.publish(n1, n2)
	l.restart(2)
	testutil.Eventually(t, 90*time.Second, "node c owns key groups again", func() bool {
		s, err := a.status(client)
		return err == nil && s.keyedOn("c") > 0
	})
	l.publish(n2, n3)
	l.publish(n3, n4)
	l.publish(n4, n4+len(members)*tail)

	// Every reading of the first bursts is counted in a session or is a
	// dead letter.
	limit := epochMS + int64(n4/sessionBurst)*2*sessionBurst
	tally := func() (inSessions, dead int64, dup []string) {
		l.col.mu.Lock()
		defer l.col.mu.Unlock()
		seen := map[winKey]string{}
		for id, content := range l.col.byMsgID {
			var r result
			if err := json.Unmarshal([]byte(content), &r); err != nil {
				t.Fatal(err)
			}
			k := winKey{r.ID, r.WindowStart}
			if other, ok := seen[k]; ok {
				dup = append(dup, fmt.Sprintf("session %v under %s and %s", k, other, id))
			}
			seen[k] = id
			if r.WindowStart < limit {
				inSessions += r.Count
			}
		}
		for _, d := range l.col.dead {
			var dl struct {
				Payload string `json:"payload"`
			}
			var rd struct {
				TS int64 `json:"ts"`
			}
			if json.Unmarshal([]byte(d), &dl) != nil || json.Unmarshal([]byte(dl.Payload), &rd) != nil {
				t.Fatalf("dead letter %s", d)
			}
			if rd.TS < limit {
				dead++
			}
		}
		return inSessions, dead, dup
	}
	ok := testutil.Within(120*time.Second, func() bool {
		s, d, _ := tally()
		return s+d >= n4
	})
	s, d, dup := tally()
	t.Logf("%d readings in sessions, %d dead letters, of %d", s, d, n4)
	if len(dup) > 0 {
		t.Errorf("sessions under two msg_ids:\n%s", strings.Join(dup, "\n"))
	}
	if !ok || s+d != n4 {
		t.Fatalf("%d readings in sessions and %d dead letters, want %d in all", s, d, n4)
	}
}
