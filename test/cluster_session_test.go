package test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/edgedio/edged/internal/testutil"
)

// The session workload: readings come in bursts of 1,000 (burst i/1000),
// each burst 1 s of event time followed by 300 ms without readings;
// sensor i%sensors sends every 100 ms of a burst. With a gap of 150 ms
// every sensor has one session of perSensor readings per burst, from its
// first reading of the burst to its last plus the gap. The pause is short
// enough that readings published at most 600 apart (clusterLoad.publish;
// a node's broker logs those of its four device connections in any
// order) are less than max_out_of_orderness (1 s) apart in event time.
const (
	sessionBurst   = 1000
	sessionPauseMS = 300
	sessionGapMS   = 150
	sessionPeriod  = sessionBurst + sessionPauseMS
)

func sessionPayload(i int) (string, []byte) {
	s := sensorOf(i)
	ts := epochMS + int64(i/sessionBurst)*sessionPeriod + int64(i%sessionBurst)
	return "sensors/" + s + "/temperature", []byte(fmt.Sprintf(`{"sensor":%q,"t":%d.5,"ts":%d}`, s, 20+i%15, ts))
}

// sessionOf returns sensor s's session of burst b: its start and end.
func sessionOf(s, b int) (start, end int64) {
	first := epochMS + int64(b)*sessionPeriod + int64(s)
	last := first + sessionBurst - sensors
	return first, last + sessionGapMS
}

// withSessionWindows makes a cluster node's pipeline count per event-time
// session of a 150 ms gap instead of per 1 s tumbling window, and give
// the temperature of each session's first and last reading.
func withSessionWindows(cfg string) string {
	const tumbling = "      type: tumbling\n      size: 1s\n"
	const count = "        - {name: count, fn: count}\n"
	if !strings.Contains(cfg, tumbling) || !strings.Contains(cfg, count) {
		panic("withSessionWindows: unexpected config:\n" + cfg)
	}
	cfg = strings.Replace(cfg, count, count+"        - {name: first, fn: first, field: temp}\n        - {name: last, fn: last, field: temp}\n", 1)
	return strings.Replace(cfg, tumbling, fmt.Sprintf("      type: session\n      gap: %dms\n", sessionGapMS), 1)
}

// sessionTemps returns the temperatures of sensor s's first and last
// readings of burst b (sessionPayload).
func sessionTemps(s, b int) (first, last float64) {
	temp := func(i int) float64 { return float64(20+i%15) + 0.5 }
	return temp(b*sessionBurst + s), temp(b*sessionBurst + sessionBurst - sensors + s)
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
	type session struct {
		end         int64
		first, last float64
	}
	want := map[winKey]session{}
	for b := range bursts {
		for s := range sensors {
			start, end := sessionOf(s, b)
			first, last := sessionTemps(s, b)
			want[winKey{sensorOf(s), start}] = session{end, first, last}
		}
	}
	limit := epochMS + int64(bursts)*sessionPeriod
	for k, rs := range col.byKey {
		w, ok := want[k]
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
		if r := rs[0]; r.Count != perSensor || r.WindowEnd != w.end || r.First != w.first || r.Last != w.last {
			t.Errorf("session %v: count %d, end %d, first %g, last %g; want %d, %d, %g, %g", k, r.Count, r.WindowEnd, r.First, r.Last, perSensor, w.end, w.first, w.last)
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
	t.Run("worker", func(t *testing.T) { sessionWindowsFailover(t, withSessionWindows, 2, false) })
	t.Run("leader", func(t *testing.T) { sessionWindowsFailover(t, withSessionWindows, 0, false) })
	t.Run("worker killed again in its handover back", func(t *testing.T) { sessionWindowsFailover(t, withSessionWindows, 2, true) })
	// With a lateness, every fired session keeps its state and a cleanup
	// timer until the watermark passes its end plus the lateness.
	t.Run("worker with allowed lateness", func(t *testing.T) {
		sessionWindowsFailover(t, func(cfg string) string {
			return strings.Replace(withSessionWindows(cfg), "      gap: ", "      allowed_lateness: 5s\n      gap: ", 1)
		}, 2, false)
	})
}

// sessionWindowsFailover runs TestClusterSessionWindowsFailover with the
// cluster's configs passed through edit, killing members[victim]; with rekill the victim, started again without its
// devices, is killed again as soon as the leader starts handing its
// subtasks back to it, and started once more after the second failover.
func sessionWindowsFailover(t *testing.T, edit func(string) string, victim int, rekill bool) {
	members := startClusterEdited(t, true, edit)
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

	if rekill {
		handovers := func() int {
			b, err := os.ReadFile(members[0].logPath)
			if err != nil {
				t.Fatal(err)
			}
			return strings.Count(string(b), `msg="handover starting"`)
		}
		before := handovers()
		v.start()
		started := testutil.Within(30*time.Second, func() bool { return handovers() > before })
		v.kill()
		t.Logf("killed node %s again (a handover back to it had started: %v)", v.id, started)
		testutil.Eventually(t, 60*time.Second, "node "+v.id+"'s subtasks run on the live nodes again", func() bool {
			s, err := watcher.status(client)
			return err == nil && s.keyedOn(v.id) == 0 && s.alive() == 2
		})
		l.publish(n3, n3+3_000)
	}

	// The node comes back and gets its subtasks back, under load.
	l.restart(victim)
	testutil.Eventually(t, 90*time.Second, "node "+v.id+" owns key groups again", func() bool {
		s, err := members[0].status(client)
		return err == nil && s.keyedOn(v.id) > 0
	})
	if rekill {
		l.publish(n3+3_000, n4)
	} else {
		l.publish(n3, n4)
	}
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
	l.takeDeadLetters()
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
	limit := epochMS + int64(n4/sessionBurst)*sessionPeriod
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
	// The master's GET /jobs counts the cluster's dead letters: at least
	// those the consumer got (no node restarted after they were made; a
	// replay may count one again).
	l.col.mu.Lock()
	got := int64(len(l.col.dead))
	l.col.mu.Unlock()
	var total int64
	var byNode map[string]int64
	counted := testutil.Within(30*time.Second, func() bool {
		var jl struct {
			Jobs []struct {
				DeadLetters int64            `json:"dead_letters"`
				ByNode      map[string]int64 `json:"dead_letters_by_node"`
			} `json:"jobs"`
		}
		if err := a.get(client, "/jobs", &jl); err != nil || len(jl.Jobs) != 1 {
			return false
		}
		total, byNode = jl.Jobs[0].DeadLetters, jl.Jobs[0].ByNode
		return total >= got
	})
	t.Logf("GET /jobs: %d dead letters, by node %v; the consumer got %d", total, byNode, got)
	if !counted {
		t.Errorf("GET /jobs on the master counts %d dead letters (by node %v), the consumer got %d", total, byNode, got)
	}
}

// TestClusterSessionLateUpdatesAcrossRescale runs event-time sessions
// with an allowed lateness of a minute on a three-node cluster at
// parallelism 3, stops the job with a savepoint through the CLI while
// sessions are open, and resumes it from the savepoint at parallelism 2,
// and at 5 (more window subtasks than nodes): every node stopped, its
// config changed, the leader started first with --from-savepoint. Late readings for sessions that fired before the
// savepoint then update them, each once: one within a session, one that
// extends a session's end; a reading past the lateness is one dead
// letter; every other session arrives once, exact.
func TestClusterSessionLateUpdatesAcrossRescale(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with three subprocesses")
	}
	t.Run("3to2", func(t *testing.T) { clusterSessionLateUpdatesAcrossRescale(t, 2) })
	t.Run("3to5", func(t *testing.T) { clusterSessionLateUpdatesAcrossRescale(t, 5) })
}

func clusterSessionLateUpdatesAcrossRescale(t *testing.T, to int) {
	members := startClusterEdited(t, true, func(cfg string) string {
		return strings.Replace(withSessionWindows(cfg), "      gap: ", "      allowed_lateness: 1m\n      gap: ", 1)
	})
	a := members[0]
	l := newClusterLoad(t, members)
	l.payload = sessionPayload
	l.takeDeadLetters()
	client := &http.Client{Timeout: time.Second}
	// late publishes a reading of sensor s at event time ts to node i.
	late := func(i, s int, ts int64) {
		t.Helper()
		p := fmt.Sprintf(`{"sensor":%q,"t":99.5,"ts":%d}`, sensorOf(s), ts)
		if tok := l.pubs[i][0].Publish("sensors/"+sensorOf(s)+"/temperature", 1, false, p); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
			t.Fatalf("publish %s: %v", p, tok.Error())
		}
	}
	sessionsIn := func(bursts int) int {
		l.col.mu.Lock()
		defer l.col.mu.Unlock()
		n := 0
		for b := range bursts {
			for s := range sensors {
				start, _ := sessionOf(s, b)
				if len(l.col.byKey[winKey{sensorOf(s), start}]) > 0 {
					n++
				}
			}
		}
		return n
	}

	const n1, n2 = 15_500, 100_000
	l.publish(0, n1)
	testutil.Eventually(t, 60*time.Second, "the sessions of the first 12 bursts", func() bool { return sessionsIn(12) == 12*sensors })
	sp := cliStop(t, a.node, "sensors")
	for _, i := range []int{1, 2, 0} {
		l.stop(i)
	}
	for _, m := range members {
		setParallelism(t, m, 3, to)
	}
	a.readyFn = a.hostsAndServes
	a.start("--from-savepoint", sp)
	delete(l.down, 0)
	l.connect(0)
	for _, i := range []int{1, 2} {
		l.restart(i)
	}
	testutil.Eventually(t, 30*time.Second, "the job runs on the three nodes", func() bool {
		return allHostTasks(client, members[1:])
	})
	a.checkRestoredFrom(t, sp)
	testutil.Eventually(t, 30*time.Second, fmt.Sprintf("%d window subtasks placed", to), func() bool {
		w, err := windowSubtasks(client, a)
		total := 0
		for _, c := range w {
			total += c
		}
		return err == nil && total == to
	})
	// Within the lateness: s000's session of burst 3 gets a reading
	// inside it, s001's of burst 4 one 100 ms after its last, which moves
	// its end on.
	start3, end3 := sessionOf(0, 3)
	start4, end4 := sessionOf(1, 4)
	late(0, 0, start3+450)
	late(1, 1, end4-sessionGapMS+100)
	l.publish(n1, n2)
	// Past the lateness (the watermark is about 129 s in): a dead letter.
	late(2, 0, start3+550)
	l.publish(n2, n2+len(members)*tail)
	bursts := n2 / sessionBurst
	testutil.Eventually(t, 120*time.Second, "every session", func() bool { return sessionsIn(bursts) == bursts*sensors })

	type res struct{ count, end int64 }
	updated := map[winKey][]res{
		{sensorOf(0), start3}: {{perSensor, end3}, {perSensor + 1, end3}},
		{sensorOf(1), start4}: {{perSensor, end4}, {perSensor + 1, end4 + 100}},
	}
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
	for b := range bursts {
		for s := range sensors {
			start, end := sessionOf(s, b)
			k := winKey{sensorOf(s), start}
			byID := map[string]res{}
			for _, r := range l.col.byKey[k] {
				byID[r.MsgID] = res{r.Count, r.WindowEnd}
			}
			var got []res
			for _, r := range byID {
				got = append(got, r)
			}
			slices.SortFunc(got, func(x, y res) int { return int(x.count - y.count) })
			want, ok := updated[k]
			if !ok {
				want = []res{{perSensor, end}}
			}
			if !slices.Equal(got, want) {
				t.Errorf("session %v: %+v by msg_id, want %+v", k, got, want)
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

// withSlidingWindows makes a cluster node's pipeline count per 1 s window
// sliding by 500 ms instead of per 1 s tumbling window.
func withSlidingWindows(cfg string) string {
	const tumbling = "      type: tumbling\n      size: 1s\n"
	if !strings.Contains(cfg, tumbling) {
		panic("withSlidingWindows: unexpected config:\n" + cfg)
	}
	return strings.Replace(cfg, tumbling, "      type: sliding\n      size: 1s\n      slide: 500ms\n", 1)
}

// TestClusterSlidingWindowsFailover runs the e2e workload through 1 s
// windows sliding by 500 ms on a three-node cluster with gossip; a worker
// is SIGKILLed while the job processes what the live nodes took, and
// restarted after the failover. Every window of every sensor arrives
// under one msg_id with its exact count.
func TestClusterSlidingWindowsFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with three subprocesses and SIGKILL")
	}
	members := startClusterEdited(t, true, withSlidingWindows)
	l := newClusterLoad(t, members)
	a, c := members[0], members[2]
	client := &http.Client{Timeout: time.Second}
	testutil.Eventually(t, 30*time.Second, "the master sees every node alive", func() bool {
		s, err := a.status(client)
		return err == nil && s.alive() == 3 && s.keyedOn("c") > 0
	})
	const n1, n2, n3, n4 = 15_250, 24_300, 33_700, 45_000
	l.publish(0, n1)
	testutil.Eventually(t, 60*time.Second, "node c's log released all it was sent", func() bool {
		rel, err := c.released(client)
		return err == nil && rel >= n1/3
	})
	l.disconnect(2)
	l.down[2] = true
	l.publish(n1, n2)
	c.kill()
	testutil.Eventually(t, 60*time.Second, "the master moved node c's subtasks to live nodes", func() bool {
		s, err := a.status(client)
		return err == nil && s.FailoversTotal >= 1 && s.keyedOn("c") == 0 && s.keyedOn("a")+s.keyedOn("b") > 0
	})
	l.publish(n2, n3)
	l.restart(2)
	testutil.Eventually(t, 90*time.Second, "node c owns key groups again", func() bool {
		s, err := a.status(client)
		return err == nil && s.keyedOn("c") > 0
	})
	l.publish(n3, n4)
	l.publish(n4, n4+len(members)*tail)
	// The windows starting at -0.5 s, 0 s, 0.5 s, … up to n4 readings.
	starts := 2*n4/windowMS - 1
	count := func() int {
		l.col.mu.Lock()
		defer l.col.mu.Unlock()
		n := 0
		for k := range starts {
			for s := range sensors {
				if len(l.col.byKey[winKey{sensorOf(s), epochMS + int64(k-1)*windowMS/2}]) > 0 {
					n++
				}
			}
		}
		return n
	}
	if !testutil.Within(120*time.Second, func() bool { return count() == starts*sensors }) {
		t.Fatalf("%d of %d windows", count(), starts*sensors)
	}
	l.col.mu.Lock()
	defer l.col.mu.Unlock()
	if len(l.col.bad) > 0 {
		t.Fatalf("%d bad results, first: %s", len(l.col.bad), l.col.bad[0])
	}
	for k := range starts {
		for s := range sensors {
			key := winKey{sensorOf(s), epochMS + int64(k-1)*windowMS/2}
			want := int64(perSensor)
			if k == 0 {
				want = perSensor / 2
			}
			ids := map[string]int64{}
			for _, r := range l.col.byKey[key] {
				ids[r.MsgID] = r.Count
			}
			if len(ids) != 1 || l.col.byKey[key][0].Count != want {
				t.Errorf("window %v: counts by msg_id %v, want one of %d", key, ids, want)
			}
		}
	}
}

// TestClusterSessionWindowsPowerLoss: the three nodes of a cluster running
// event-time sessions are SIGKILLed at once while the job processes
// readings that no checkpoint covers yet (a whole-site power loss), and
// all three start again. Every node's ingest log is back, so the job
// restored from the checkpoint the cluster replicated reads them again:
// every sensor's session of every burst arrives under one msg_id, exact,
// and no other session does.
func TestClusterSessionWindowsPowerLoss(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with three subprocesses and SIGKILL")
	}
	members := startClusterEdited(t, true, withSessionWindows)
	l := newClusterLoad(t, members)
	l.payload = sessionPayload
	a := members[0]
	client := &http.Client{Timeout: time.Second}
	testutil.Eventually(t, 30*time.Second, "a leads, every node alive", func() bool {
		s, err := a.leaderStatus(client)
		return err == nil && s.alive() == 3 && s.Leader == "a" && s.keyedOn("a") > 0
	})
	const n1, n2 = 20_500, 45_000
	l.publish(0, n1)
	for i, m := range members {
		m.kill()
		l.down[i] = true
	}
	for i := range members {
		l.disconnect(i)
	}
	t.Logf("power loss: a, b and c SIGKILLed")
	for _, m := range members {
		m.readyFn = func(*http.Client) bool { return brokerUp(m.brokerAddr) }
	}
	for _, i := range []int{1, 2, 0} {
		l.restart(i)
	}
	testutil.Eventually(t, 90*time.Second, "the job runs again, a leading, on the three nodes", func() bool {
		s, err := a.leaderStatus(client)
		return err == nil && s.Leader == "a" && s.alive() == 3 && s.keyedOn("a") > 0 && allHostTasks(client, members[1:])
	})
	l.publish(n1, n2)
	l.publish(n2, n2+len(members)*tail)
	checkExactSessions(t, l.col, n2/sessionBurst, 120*time.Second)
}

// TestClusterSessionRescaleWithoutADeadNode: sessions at parallelism 3 on
// a three-node cluster; once node c's log is covered by checkpoints, the
// job is stopped with a savepoint through the CLI while sessions are open,
// every node is stopped, and only a and b (a majority) start again, at
// parallelism 2, the leader with --from-savepoint; c's device is lost.
// The job runs on a and b, c's source split idle there, and every session
// arrives once, exact.
func TestClusterSessionRescaleWithoutADeadNode(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with three subprocesses")
	}
	members := startClusterEdited(t, true, withSessionWindows)
	a, c := members[0], members[2]
	l := newClusterLoad(t, members)
	l.payload = sessionPayload
	client := &http.Client{Timeout: time.Second}
	const n1, n2 = 15_500, 40_000
	l.publish(0, n1)
	testutil.Eventually(t, 60*time.Second, "node c's log released all it was sent", func() bool {
		rel, err := c.released(client)
		return err == nil && rel >= n1/3
	})
	sp := cliStop(t, a.node, "sensors")
	for _, i := range []int{1, 2, 0} {
		l.stop(i)
	}
	for _, m := range members {
		setParallelism(t, m, 3, 2)
	}
	a.readyFn = a.hostsAndServes
	a.start("--from-savepoint", sp)
	delete(l.down, 0)
	l.connect(0)
	l.restart(1)
	testutil.Eventually(t, 60*time.Second, "the job runs on b too", func() bool {
		return allHostTasks(client, members[1:2])
	})
	a.checkRestoredFrom(t, sp)
	testutil.Eventually(t, 30*time.Second, "two window subtasks placed on a and b", func() bool {
		w, err := windowSubtasks(client, a)
		return err == nil && w["a"]+w["b"] == 2 && w["c"] == 0
	})
	l.publish(n1, n2)
	l.publish(n2, n2+len(members)*tail)
	checkExactSessions(t, l.col, n2/sessionBurst, 120*time.Second)
}
