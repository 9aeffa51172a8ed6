package test

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgedio/edged/internal/testutil"
)

// leaderStatus is what the leader tests read of GET /cluster.
type leaderStatus struct {
	clusterStatus
	Leader    string `json:"leader"`
	Takeovers []struct {
		DeadNode      string  `json:"dead_node"`
		DetectionMS   float64 `json:"detection_ms"`
		RestoreMS     float64 `json:"restore_ms"`
		FirstRecordMS float64 `json:"first_record_ms"`
	} `json:"failovers"`
	Handbacks []struct {
		From        string            `json:"from"`
		To          string            `json:"to"`
		Epoch       uint64            `json:"epoch"`
		Savepoints  map[string]uint64 `json:"savepoints"`
		SavepointMS float64           `json:"savepoint_ms"`
		ReplicateMS float64           `json:"replicate_ms"`
		TakeoverMS  float64           `json:"takeover_ms"`
		RestoreMS   float64           `json:"restore_ms"`
		Outcome     string            `json:"outcome"`
		Error       string            `json:"error"`
	} `json:"handbacks"`
	Replicas []struct {
		Checkpoint int64 `json:"checkpoint"`
		Files      []struct {
			File  string   `json:"file"`
			Nodes []string `json:"nodes"`
		} `json:"files"`
	} `json:"replicas"`
}

func (m *clusterMember) leaderStatus(client *http.Client) (leaderStatus, error) {
	var s leaderStatus
	err := m.get(client, "/cluster", &s)
	return s, err
}

// allFollow reports whether every one of members answers that leader
// leads.
func allFollow(client *http.Client, members []*clusterMember, leader string) bool {
	for _, m := range members {
		s, err := m.leaderStatus(client)
		if err != nil || s.Leader != leader {
			return false
		}
	}
	return true
}

// jobMasters returns how many jobs node m runs the job master of.
func (m *clusterMember) jobMasters(client *http.Client) (int, error) {
	resp, err := client.Get("http://" + m.apiAddr + "/jobs")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var l struct {
		Jobs []struct {
			Status string `json:"status"`
		} `json:"jobs"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&l); err != nil {
		return 0, err
	}
	n := 0
	for _, j := range l.Jobs {
		// A job master between attempts is one all the same.
		if j.Status == "running" || j.Status == "restarting" {
			n++
		}
	}
	return n, nil
}

// The leader of a three-node cluster with gossip membership (node a, the
// job masters' node) is SIGKILLed under MQTT load. Node b, the lowest
// live node, takes over: it restores the job from the checkpoint whose
// metadata and files the cluster replicated (a's own state files
// included), places a's subtasks on b and c, and deploys in a newer
// epoch. Every window stays exact, no result id twice. Node a then comes
// back: it follows b at first, and once it has been up for the settle
// delay and caught up, b hands the leadership back to it under load (a
// savepoint, then a restores it in a newer epoch): a runs the job master
// again, b and c none; the windows after are exact too, and no poll of
// any node's GET /cluster ever saw two nodes each say it leads, nor a
// node's epoch go backward.
func TestClusterLeaderKilledExactTotals(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with three subprocesses and SIGKILL")
	}
	members := startCluster(t, true)
	l := newClusterLoad(t, members)
	a, b, c := members[0], members[1], members[2]
	client := &http.Client{Timeout: time.Second}
	testutil.Eventually(t, 30*time.Second, "the leader sees every node alive", func() bool {
		s, err := a.leaderStatus(client)
		if err != nil {
			return false
		}
		return s.alive() == 3 && s.Leader == "a" && s.keyedOn("a") > 0
	})

	const n1, n2, n3 = 15_000, 30_000, 60_000
	l.publish(0, n1)
	// Everything node a acknowledged is covered by completed checkpoints
	// before the kill: the takeover must not need a's disk.
	testutil.Eventually(t, 60*time.Second, "node a's log released all it was sent", func() bool {
		rel, err := a.released(client)
		return err == nil && rel >= n1/3
	})
	// Every live node holds the metadata of the retained checkpoints,
	// each file on its writer and its replicas.
	for _, m := range []*clusterMember{b, c} {
		testutil.Eventually(t, 30*time.Second, "node "+m.id+" lists the replicas of the checkpoints", func() bool {
			s, err := m.leaderStatus(client)
			if err != nil || len(s.Replicas) == 0 || len(s.Replicas[0].Files) == 0 {
				return false
			}
			for _, f := range s.Replicas[0].Files {
				if len(f.Nodes) < 3 {
					return false
				}
			}
			return true
		})
	}
	epochBefore := func() uint64 {
		s, err := b.leaderStatus(client)
		if err != nil {
			t.Fatal(err)
		}
		return s.Epoch
	}()
	// The checkpoint ids a's job master triggered: those it listed just
	// before the kill, and every checkpoint directory its store holds
	// after it (a checkpoint's directory is made before its barriers go
	// out).
	// a is killed while one of its checkpoints is in flight, if one is
	// seen within 10 s: its id is the one a coordinator that numbered
	// from the newest completed checkpoint would take again.
	var aListed []uint64
	var inFlight bool
	l.killWhen(0, 10*time.Second, func() bool {
		ids, status, err := a.checkpointStatus(client)
		if err != nil || len(ids) == 0 {
			return false
		}
		aListed, inFlight = ids, status == "in_progress"
		return inFlight
	})
	start := time.Now()
	if len(aListed) == 0 {
		t.Fatal("node a listed no checkpoint before the kill")
	}
	aTriggered := max(slices.Max(aListed), a.highestCheckpointDir(t))
	t.Logf("node a killed with checkpoint %d in flight: %v; the highest id it triggered: %d", aListed[len(aListed)-1], inFlight, aTriggered)
	testutil.Eventually(t, 60*time.Second, "node b took over and placed a's subtasks on b and c", func() bool {
		s, err := b.leaderStatus(client)
		return err == nil && s.Leader == "b" && s.keyedOn("a") == 0 && s.keyedOn("b")+s.keyedOn("c") > 0 && s.Epoch > epochBefore
	})
	t.Logf("takeover after %v", time.Since(start).Round(time.Millisecond))
	if n, err := c.jobMasters(client); err != nil || n != 0 {
		t.Fatalf("node c runs %d job masters (%v), want none", n, err)
	}
	l.publish(n1, n2)
	l.publish(n2, n2+2*tail)
	windows := n2 / windowMS
	if !testutil.Within(90*time.Second, func() bool { return countWindows(l.col, windows) >= windows*sensors }) {
		t.Fatalf("%d of %d window results after the takeover", countWindows(l.col, windows), windows*sensors)
	}
	checkExactWindows(t, l.col, windows)
	// b's coordinator, recovered from the replicated metadata, reused no
	// checkpoint id of a's: each of its checkpoints is numbered above
	// every one a triggered, completed or not.
	bIDs := checkIDsAbove(t, client, b, aTriggered, "a")

	// Node a comes back: it follows b first (b's job masters move its
	// subtasks back to it), and once it has been up for the settle delay
	// and has caught up, b hands the leadership back to it, under load:
	// b stops the job with a savepoint, a restores it in a newer epoch.
	a.readyFn = func(client *http.Client) bool {
		_, err := a.hosted(client)
		return err == nil && brokerUp(a.brokerAddr)
	}
	restarted := time.Now()
	l.restart(0)
	lp := startLeaderPoller(t, members)
	from := n2 + 2*tail
	const chunk = 300
	handedBack := func() bool {
		if !allFollow(client, members, "a") {
			return false
		}
		sb, err := b.leaderStatus(client)
		if err != nil {
			return false
		}
		for _, h := range sb.Handbacks {
			if h.From == "b" && h.To == "a" && h.Outcome == "done" {
				return true
			}
		}
		return false
	}
	for !handedBack() {
		if time.Since(restarted) > 90*time.Second || from+chunk > n3 {
			t.Fatalf("b did not hand the leadership back to a within 90 s (%d readings published)\n%s", from-n2-2*tail, clusterLines(b.logTail()))
		}
		l.publish(from, from+chunk)
		from += chunk
		testutil.Within(time.Second, handedBack)
	}
	t.Logf("hand-back %v after a's restart, %d readings published meanwhile", time.Since(restarted).Round(time.Millisecond), from-n2-2*tail)
	testutil.Eventually(t, 60*time.Second, "a runs the job master and owns key groups; b and c run none", func() bool {
		s, err := a.leaderStatus(client)
		if err != nil || s.keyedOn("a") == 0 {
			return false
		}
		na, err1 := a.jobMasters(client)
		nb, err2 := b.jobMasters(client)
		nc, err3 := c.jobMasters(client)
		return err1 == nil && err2 == nil && err3 == nil && na == 1 && nb == 0 && nc == 0
	})
	l.publish(from, n3)
	l.finish(n3, 120*time.Second)
	lp.check(t)
	// Nor did a's, after the hand-back: its checkpoints are numbered
	// above every one b triggered while it led, the last of which is the
	// savepoint b stopped the job with (b's disk holds copies of a's
	// files by now: its directories do not tell).
	sb, err := b.leaderStatus(client)
	if err != nil {
		t.Fatal(err)
	}
	bTriggered := slices.Max(bIDs)
	for _, h := range sb.Handbacks {
		if h.From == "b" && h.To == "a" && h.Outcome == "done" {
			bTriggered = max(bTriggered, h.Savepoints["sensors"])
		}
	}
	checkIDsAbove(t, client, a, bTriggered, "b")
	for _, h := range sb.Handbacks {
		t.Logf("hand-back: %+v", h)
	}
	if os.Getenv("EDGED_E2E_KEEP_LOGS") != "" {
		for _, m := range members {
			keepLog(t, m)
		}
	}
	// The takeover's durations are measured: a's last answer to b's
	// probes until b saw it dead, and b restored the job and took records
	// in again.
	testutil.Eventually(t, 30*time.Second, "b's takeover has its detection, restore and first record timed", func() bool {
		s, err := b.leaderStatus(client)
		if err != nil {
			return false
		}
		for _, f := range s.Takeovers {
			if f.DeadNode == "a" && f.DetectionMS > 0 && f.RestoreMS > 0 && f.FirstRecordMS > 0 {
				t.Logf("takeover: %+v", f)
				return true
			}
		}
		return false
	})
}

// checkpointIDs returns the ids of the checkpoints and savepoints the job
// master on node m lists (GET /jobs/sensors/checkpoints), oldest first.
func (m *clusterMember) checkpointIDs(client *http.Client) ([]uint64, error) {
	ids, _, err := m.checkpointStatus(client)
	return ids, err
}

// checkpointStatus returns the ids of the checkpoints and savepoints the
// job master on node m lists, oldest first, and the status of the newest.
func (m *clusterMember) checkpointStatus(client *http.Client) ([]uint64, string, error) {
	var l struct {
		Checkpoints []struct {
			ID     uint64 `json:"id"`
			Status string `json:"status"`
		} `json:"checkpoints"`
	}
	if err := m.get(client, "/jobs/sensors/checkpoints", &l); err != nil {
		return nil, "", err
	}
	var ids []uint64
	var status string
	for _, c := range l.Checkpoints {
		ids, status = append(ids, c.ID), c.Status
	}
	return ids, status, nil
}

// highestCheckpointDir returns the highest checkpoint id with a directory
// (chk-<id>) in node m's snapshot stores: its own checkpoints and the
// copies it keeps of its peers' state files.
func (m *clusterMember) highestCheckpointDir(t *testing.T) uint64 {
	t.Helper()
	var top uint64
	root := filepath.Join(filepath.Dir(m.cfgPath), "data", "checkpoints")
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && strings.HasPrefix(d.Name(), "chk-") {
			if id, err := strconv.ParseUint(strings.TrimPrefix(d.Name(), "chk-"), 10, 64); err == nil {
				top = max(top, id)
			}
			return fs.SkipDir
		}
		return nil
	})
	if err != nil || top == 0 {
		t.Fatalf("checkpoint directories of node %s under %s: highest %d (%v)", m.id, root, top, err)
	}
	return top
}

// checkIDsAbove checks that the job master on node m lists checkpoints,
// each once, every one above the highest id the earlier leader prev
// triggered, and returns them.
func checkIDsAbove(t *testing.T, client *http.Client, m *clusterMember, above uint64, prev string) []uint64 {
	t.Helper()
	ids, err := m.checkpointIDs(client)
	if err != nil || len(ids) == 0 {
		t.Fatalf("node %s lists checkpoints %v (%v): none to check", m.id, ids, err)
	}
	seen := map[uint64]bool{}
	for _, id := range ids {
		if id <= above {
			t.Fatalf("node %s took checkpoint %d: node %s had triggered up to %d (%v)", m.id, id, prev, above, ids)
		}
		if seen[id] {
			t.Fatalf("node %s lists checkpoint %d twice: %v", m.id, id, ids)
		}
		seen[id] = true
	}
	t.Logf("node %s: %d checkpoints, %d to %d, all above %d (the highest node %s triggered)", m.id, len(ids), ids[0], ids[len(ids)-1], above, prev)
	return ids
}

// leaderPoller polls every member's GET /cluster until the test ends:
// the nodes that say they lead in each round (read in id order, so that a
// hand-back to a lower node cannot look like two leaders), and each
// node's epoch.
type leaderPoller struct {
	members []*clusterMember
	stop    chan struct{}
	done    chan struct{}
	mu      sync.Mutex
	rounds  int
	two     []string // rounds with two self-declared leaders
	back    []string // epochs that went backward
}

func startLeaderPoller(t *testing.T, members []*clusterMember) *leaderPoller {
	p := &leaderPoller{members: members, stop: make(chan struct{}), done: make(chan struct{})}
	go p.run()
	t.Cleanup(p.close)
	return p
}

func (p *leaderPoller) close() {
	select {
	case <-p.stop:
	default:
		close(p.stop)
	}
	<-p.done
}

func (p *leaderPoller) run() {
	defer close(p.done)
	client := &http.Client{Timeout: 500 * time.Millisecond}
	epochs := map[string]uint64{}
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		var leading []string
		for _, m := range p.members {
			s, err := m.leaderStatus(client)
			if err != nil {
				continue
			}
			if s.Leader == m.id {
				leading = append(leading, m.id)
			}
			p.mu.Lock()
			if s.Epoch != 0 && s.Epoch < epochs[m.id] {
				p.back = append(p.back, fmt.Sprintf("node %s: epoch %d after %d", m.id, s.Epoch, epochs[m.id]))
			}
			epochs[m.id] = max(epochs[m.id], s.Epoch)
			p.mu.Unlock()
		}
		p.mu.Lock()
		p.rounds++
		if len(leading) > 1 {
			p.two = append(p.two, fmt.Sprintf("%v at %s", leading, time.Now().Format("15:04:05.000")))
		}
		p.mu.Unlock()
		select {
		case <-p.stop:
			return
		case <-tick.C:
		}
	}
}

// check stops the poller and fails the test if it ever saw two leaders
// or an epoch going backward.
func (p *leaderPoller) check(t *testing.T) {
	t.Helper()
	p.close()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.rounds < 10 {
		t.Fatalf("only %d poll rounds", p.rounds)
	}
	if len(p.two) > 0 {
		t.Fatalf("two nodes said they lead at once in %d of %d rounds: %v", len(p.two), p.rounds, p.two)
	}
	if len(p.back) > 0 {
		t.Fatalf("epochs went backward: %v", p.back)
	}
	t.Logf("%d poll rounds of every node: one leader at a time", p.rounds)
}

// startProfileCluster is startCluster with gossip and
// cluster.profile set to profile on every node.
func startProfileCluster(t *testing.T, profile string) []*clusterMember {
	t.Helper()
	return startClusterEdited(t, true, func(cfg string) string {
		edited := strings.Replace(cfg, "  secret_key:", "  profile: "+profile+"\n  secret_key:", 1)
		if edited == cfg {
			t.Fatal("no gossip block in the config")
		}
		return edited
	})
}

// The leader of a three-node cluster with the lan profile (a dead node
// is seen after 5–6 s) is SIGKILLed under MQTT load and restarted at
// once, before its peers could see it die. Its peers still name it
// leader: it asks them again (its own gossip not started) until node b,
// having seen its old run die, took over; it then follows b, and once it
// has been up for the settle delay and caught up, b hands the leadership
// back (b's GET /cluster records the takeover and the hand-back). The cluster ends with a leading and running the job master, b
// and c none; every window is exact with one result id, no poll of any
// node's GET /cluster saw two nodes each say it leads, nor an epoch go
// backward.
func TestClusterLeaderRestartsBeforeDetection(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with three subprocesses and SIGKILL")
	}
	members := startProfileCluster(t, "lan")
	l := newClusterLoad(t, members)
	a, b, c := members[0], members[1], members[2]
	client := &http.Client{Timeout: time.Second}
	testutil.Eventually(t, 30*time.Second, "a leads, every node alive", func() bool {
		s, err := a.leaderStatus(client)
		return err == nil && aliveCount(s.clusterStatus) == 3 && s.Leader == "a" && s.keyedOn("a") > 0
	})
	lp := startLeaderPoller(t, members)
	const n1, n2 = 12_000, 45_000
	l.publish(0, n1)
	testutil.Eventually(t, 60*time.Second, "node a's log released all it was sent", func() bool {
		rel, err := a.released(client)
		return err == nil && rel >= n1/3
	})
	a.readyFn = func(client *http.Client) bool {
		_, err := a.hosted(client)
		return err == nil && brokerUp(a.brokerAddr)
	}
	l.kill(0)
	killed := time.Now()
	l.restart(0)
	t.Logf("a restarted %v after the kill", time.Since(killed).Round(time.Millisecond))
	from := n1
	const chunk = 300
	leadsAgain := func() bool {
		for _, m := range members {
			s, err := m.leaderStatus(client)
			if err != nil || s.Leader != "a" || aliveCount(s.clusterStatus) != 3 {
				return false
			}
		}
		na, err1 := a.jobMasters(client)
		nb, err2 := b.jobMasters(client)
		nc, err3 := c.jobMasters(client)
		return err1 == nil && err2 == nil && err3 == nil && na == 1 && nb == 0 && nc == 0
	}
	for !leadsAgain() || time.Since(killed) < 5*time.Second {
		if from+chunk > n2 {
			t.Fatalf("the cluster did not settle with a leading within %d readings (%v)\n%s", n2-n1, time.Since(killed), clusterLines(b.logTail()))
		}
		l.publish(from, from+chunk)
		from += chunk
		testutil.Within(time.Second, leadsAgain)
	}
	t.Logf("a leads and runs the job master %v after the kill", time.Since(killed).Round(time.Millisecond))
	// It got there through b's takeover and a hand-back, not by leading
	// again beside a takeover.
	sb, err := b.leaderStatus(client)
	if err != nil {
		t.Fatal(err)
	}
	var tookOver, handedBack bool
	for _, f := range sb.Takeovers {
		tookOver = tookOver || f.DeadNode == "a"
	}
	for _, h := range sb.Handbacks {
		handedBack = handedBack || h.From == "b" && h.To == "a" && h.Outcome == "done"
	}
	if !tookOver || !handedBack {
		t.Fatalf("b took over from a: %v; b handed the leadership back to a: %v (%+v)", tookOver, handedBack, sb.Handbacks)
	}
	l.publish(from, n2)
	l.finish(n2, 120*time.Second)
	lp.check(t)
	for _, m := range members {
		s, err := m.leaderStatus(client)
		if err != nil {
			t.Fatal(err)
		}
		for _, h := range s.Handbacks {
			t.Logf("node %s: hand-back %+v", m.id, h)
		}
		for _, f := range s.Takeovers {
			t.Logf("node %s: takeover %+v", m.id, f)
		}
	}
	if os.Getenv("EDGED_E2E_KEEP_LOGS") != "" {
		for _, m := range members {
			keepLog(t, m)
		}
	}
}
