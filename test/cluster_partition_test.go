//go:build linux

package test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgedio/edged/internal/testutil"
)

// A network partition needs separate network stacks: this file's test
// runs each edged node in a network namespace of its own (ip netns, as
// root), the only test that leaves 127.0.0.1. The lab:
//
//	namespace <prefix>-sw: a bridge, one port per node (the cluster LAN,
//	  10.77.0.0/24; node i is 10.77.0.<i+1>)
//	namespace <prefix>-<id>: the node, with two links: c0 to its bridge
//	  port (transport, gossip, the peers' REST calls) and m0 to the root
//	  namespace (10.77.<R>.<4i+2>/30, the root side .<4i+1>), over which
//	  the test reaches the node's REST API and embedded broker.
//
// A node is cut off by taking its port off the bridge (its frames go
// nowhere, nothing is refused: a switch that lost the cable) and healed by
// putting it back; the test's own link to the node stays up throughout.
// Everything lives in namespaces the test creates and deletes, whatever
// way the test ends; their names carry the test process's pid, and a
// later run deletes those of a dead process.

// netnsPrefix starts the name of every namespace the partition test
// creates: netnsPrefix<pid>-<hex>-<role>.
const netnsPrefix = "edged-pt-"

// Ports inside each node's namespace: every node has its own stack, so
// they are the same on every node.
const (
	labAPIPort       = 8080
	labBrokerPort    = 1883
	labTransportPort = 7100
	labGossipPort    = 7200
)

// netLab is the namespaces and links of a partition test.
type netLab struct {
	t      *testing.T
	prefix string            // netnsPrefix<pid>-<hex>
	sw     string            // the switch's namespace
	ns     map[string]string // node id -> its namespace
	ctl    map[string]string // node id -> its address on the link to the root namespace
	lan    map[string]string // node id -> its address on the cluster LAN
	port   map[string]string // node id -> its port on the bridge (in sw)
	token  string            // the nodes' API token (node.token)
}

// ipCmd runs ip with args and returns its error with its output.
func ipCmd(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// newNetLab builds the lab for nodes ids (one letter each), or skips the
// test when it cannot: not root, no ip, no permission for namespaces.
func newNetLab(t *testing.T, ids []string) *netLab {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the partition test needs root: it builds network namespaces and veth pairs with `ip netns` (CI runs it as root)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("the partition test needs iproute2's `ip` (apt-get install iproute2): " + err.Error())
	}
	sweepStaleNetns(t)
	r := rand.Uint32()
	lab := &netLab{t: t, prefix: fmt.Sprintf("%s%d-%06x", netnsPrefix, os.Getpid(), r&0xffffff),
		ns: map[string]string{}, ctl: map[string]string{}, lan: map[string]string{}, port: map[string]string{},
		token: fmt.Sprintf("%016x", rand.Uint64())}
	lab.sw = lab.prefix + "-sw"
	if err := ipCmd("netns", "add", lab.sw); err != nil {
		t.Skip("the partition test cannot create a network namespace (a container without CAP_SYS_ADMIN?): " + err.Error())
	}
	// Deleted last (cleanups run in reverse order): after the nodes'
	// processes, registered later, are gone.
	t.Cleanup(lab.remove)
	ctlNet := lab.freeControlNet()
	must := func(args ...string) {
		t.Helper()
		if err := ipCmd(args...); err != nil {
			t.Fatal(err)
		}
	}
	must("-n", lab.sw, "link", "add", "br0", "type", "bridge")
	must("-n", lab.sw, "link", "set", "br0", "up")
	for i, id := range ids {
		ns := lab.prefix + "-" + id
		must("netns", "add", ns)
		lab.ns[id] = ns
		must("-n", ns, "link", "set", "lo", "up")
		// The cluster LAN: c0 in the node's namespace, its peer a port of
		// the bridge. Created inside the namespaces: the root namespace
		// never holds these names.
		lab.port[id] = "p-" + id
		must("link", "add", "name", "c0", "netns", ns, "type", "veth", "peer", "name", lab.port[id], "netns", lab.sw)
		must("-n", lab.sw, "link", "set", lab.port[id], "master", "br0", "up")
		lab.lan[id] = fmt.Sprintf("10.77.0.%d", i+1)
		must("-n", ns, "addr", "add", lab.lan[id]+"/24", "dev", "c0")
		must("-n", ns, "link", "set", "c0", "up")
		// The test's link: one end in the root namespace (a name unique to
		// this run), removed with the node's namespace.
		root := fmt.Sprintf("ep%06x%s", r&0xffffff, id)
		must("link", "add", "name", root, "type", "veth", "peer", "name", "m0", "netns", ns)
		must("addr", "add", fmt.Sprintf("%s.%d/30", ctlNet, 4*i+1), "dev", root)
		must("link", "set", root, "up")
		lab.ctl[id] = fmt.Sprintf("%s.%d", ctlNet, 4*i+2)
		must("-n", ns, "addr", "add", lab.ctl[id]+"/30", "dev", "m0")
		must("-n", ns, "link", "set", "m0", "up")
	}
	t.Logf("network lab %s: cluster LAN 10.77.0.0/24 behind a bridge, test links %s.0/24", lab.prefix, ctlNet)
	return lab
}

// freeControlNet returns a 10.77.<R> prefix no address or route of the
// root namespace uses.
func (lab *netLab) freeControlNet() string {
	lab.t.Helper()
	addrs, err1 := exec.Command("ip", "-4", "-o", "addr", "show").Output()
	routes, err2 := exec.Command("ip", "-4", "route", "show").Output()
	if err := errors.Join(err1, err2); err != nil {
		lab.t.Fatalf("ip addr/route show: %v", err)
	}
	used := string(addrs) + string(routes)
	for range 64 {
		p := fmt.Sprintf("10.77.%d", 1+rand.IntN(254))
		if !strings.Contains(used, p+".") {
			return p
		}
	}
	lab.t.Fatal("no free 10.77.x.0/24 in the root namespace")
	return ""
}

// remove deletes the lab's namespaces (their veths go with them) and
// checks that none is left.
func (lab *netLab) remove() {
	var errs []error
	for _, ns := range lab.ns {
		errs = append(errs, ipCmd("netns", "del", ns))
	}
	errs = append(errs, ipCmd("netns", "del", lab.sw))
	if err := errors.Join(errs...); err != nil {
		lab.t.Errorf("removing the network lab: %v", err)
	}
	out, _ := exec.Command("ip", "netns", "list").Output()
	if strings.Contains(string(out), lab.prefix) {
		lab.t.Errorf("namespaces of %s left after cleanup:\n%s", lab.prefix, out)
	}
}

// sweepStaleNetns deletes the namespaces a partition test left behind
// when its process died (their names carry its pid).
func sweepStaleNetns(t *testing.T) {
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || !strings.HasPrefix(f[0], netnsPrefix) {
			continue
		}
		pidS, _, _ := strings.Cut(strings.TrimPrefix(f[0], netnsPrefix), "-")
		pid, err := strconv.Atoi(pidS)
		if err != nil || pid == os.Getpid() || syscall.Kill(pid, 0) != syscall.ESRCH {
			continue
		}
		if err := ipCmd("netns", "del", f[0]); err == nil {
			t.Logf("deleted namespace %s left by a dead test process", f[0])
		}
	}
}

// cut takes node id's port off the bridge: from then on its frames reach
// no other node and theirs none of it, silently.
func (lab *netLab) cut(id string) {
	lab.t.Helper()
	if err := ipCmd("-n", lab.sw, "link", "set", lab.port[id], "nomaster"); err != nil {
		lab.t.Fatal(err)
	}
}

// heal puts node id's port back on the bridge.
func (lab *netLab) heal(id string) {
	lab.t.Helper()
	if err := ipCmd("-n", lab.sw, "link", "set", lab.port[id], "master", "br0"); err != nil {
		lab.t.Fatal(err)
	}
}

// startIn starts the node's edged in network namespace ns (ip netns exec
// replaces itself with edged: the process is edged's) and waits until it
// is ready. The process is killed if the test process dies.
func (n *node) startIn(ns string) {
	n.t.Helper()
	f, err := os.OpenFile(n.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		n.t.Fatal(err)
	}
	fmt.Fprintf(f, "===== edged run in netns %s at %s =====\n", ns, time.Now().Format(time.RFC3339Nano))
	n.logFile = f
	n.cmd = exec.Command("ip", "netns", "exec", ns, edgedBin, "run", "-c", n.cfgPath)
	n.cmd.Stdout, n.cmd.Stderr = f, f
	n.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := n.cmd.Start(); err != nil {
		n.t.Fatalf("start edged in %s: %v", ns, err)
	}
	n.done = make(chan struct{})
	cmd, done := n.cmd, n.done
	go func() {
		n.waitErr = cmd.Wait()
		close(done)
	}()
	n.waitReady(30 * time.Second)
}

// bearer adds a node token to every request.
type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

// labClient returns an HTTP client for the lab's nodes: their APIs listen
// beyond loopback and require the token.
func (lab *netLab) client() *http.Client {
	return &http.Client{Timeout: time.Second, Transport: bearer{lab.token, http.DefaultTransport}}
}

// startLabCluster starts a three-node cluster with gossip in lab: "a"
// (the job master) and the workers "b" and "c", each in its namespace,
// running the e2e pipeline at parallelism 3.
func startLabCluster(t *testing.T, lab *netLab, ids []string) []*clusterMember {
	t.Helper()
	client := lab.client()
	var members []*clusterMember
	for _, id := range ids {
		dir := filepath.Join(t.TempDir(), id)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		ctl := lab.ctl[id]
		m := &clusterMember{id: id,
			transport: fmt.Sprintf("%s:%d", lab.lan[id], labTransportPort),
			gossip:    fmt.Sprintf("%s:%d", lab.lan[id], labGossipPort),
			node: &node{t: t, brokerAddr: fmt.Sprintf("%s:%d", ctl, labBrokerPort), apiAddr: fmt.Sprintf("%s:%d", ctl, labAPIPort),
				logPath: filepath.Join(dir, "edged.log"), cfgPath: filepath.Join(dir, "edged.yaml")}}
		members = append(members, m)
	}
	for _, m := range members {
		data := filepath.Join(filepath.Dir(m.cfgPath), "data")
		var peers strings.Builder
		for _, p := range members {
			if p != m {
				fmt.Fprintf(&peers, "    - {id: %s, address: %q, api: \"%s:%d\", gossip: %q}\n", p.id, p.transport, lab.lan[p.id], labAPIPort, p.gossip)
			}
		}
		// The API and the broker listen on every address of the node's
		// namespace: the peers call the API over the LAN, the test over
		// its own link.
		cfg := fmt.Sprintf(`node:
  data_dir: %s
  broker: "0.0.0.0:%d"
  listen: "0.0.0.0:%d"
  token: %s
cluster:
  node: %s
  listen: %q
  gossip: %q
  secret_key: %s
  peers:
%s`, data, labBrokerPort, labAPIPort, lab.token, m.id, m.transport, m.gossip, testGossipKey, peers.String()) + sensorsPipeline(data, 3, 100, "200ms")
		if err := os.WriteFile(m.cfgPath, []byte(cfg), 0o644); err != nil {
			t.Fatal(err)
		}
		// The master is ready when its job runs, a worker when it answers
		// GET /cluster/worker; both once their broker accepts.
		m.readyFn = func(*http.Client) bool {
			if m.id != ids[0] {
				_, err := m.hosted(client)
				return err == nil && brokerUp(m.brokerAddr)
			}
			var l struct {
				Jobs []struct {
					Status string `json:"status"`
				} `json:"jobs"`
			}
			return getJSONFrom(client, "http://"+m.apiAddr+"/jobs", &l) == nil && len(l.Jobs) == 1 && l.Jobs[0].Status == "running" && brokerUp(m.brokerAddr)
		}
	}
	killMembersAtCleanup(t, members, keepLog)
	for _, m := range append(slices.Clone(members[1:]), members[0]) {
		m.startIn(lab.ns[m.id])
	}
	return members
}

// ---------------------------------------------------------------- who owns what

// ownObs is one look at what a node runs: the window subtasks (each
// with its key groups) whose tasks it has started, in deployment epoch;
// the node was in that state at some moment between sent and recv.
type ownObs struct {
	sent, recv time.Time
	epoch      uint64
	owned      []int
}

// ownPoller asks every node what it runs, every 100 ms, from a goroutine
// per node, and keeps every answer.
type ownPoller struct {
	client  *http.Client
	members []*clusterMember
	master  string
	job     string
	op      string // the keyed operator: "<job>/window"
	// any, when set, looks at every node's worker and job master alike
	// (lookAny): the leader may change during the test.
	any bool

	mu     sync.Mutex // guards obs and failed
	obs    map[string][]ownObs
	failed map[string]int

	stop chan struct{}
	wg   sync.WaitGroup
}

func startOwnPoller(t *testing.T, client *http.Client, members []*clusterMember, job string) *ownPoller {
	return startOwnPollerOf(t, client, members, job, false)
}

// startOwnPollerOf is startOwnPoller; with any, every look is lookAny.
func startOwnPollerOf(t *testing.T, client *http.Client, members []*clusterMember, job string, any bool) *ownPoller {
	p := &ownPoller{client: client, members: members, master: members[0].id, job: job, op: job + "/window", any: any,
		obs: map[string][]ownObs{}, failed: map[string]int{}, stop: make(chan struct{})}
	for _, m := range members {
		p.wg.Add(1)
		go p.poll(m)
	}
	t.Cleanup(p.close)
	return p
}

func (p *ownPoller) close() {
	select {
	case <-p.stop:
		return
	default:
	}
	close(p.stop)
	p.wg.Wait()
}

func (p *ownPoller) poll(m *clusterMember) {
	defer p.wg.Done()
	client := p.client
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		o, err := p.look(client, m)
		p.mu.Lock()
		if err != nil {
			p.failed[m.id]++
		} else {
			p.obs[m.id] = append(p.obs[m.id], o)
		}
		p.mu.Unlock()
		select {
		case <-p.stop:
			return
		case <-tick.C:
		}
	}
}

// lookWorker reads GET /cluster/worker: the hosted deployment's epoch
// and its started tasks, read together.
func (p *ownPoller) lookWorker(client *http.Client, m *clusterMember) (ownObs, error) {
	o := ownObs{sent: time.Now()}
	var w struct {
		Jobs []struct {
			Epoch uint64 `json:"epoch"`
			Tasks []struct {
				Subtask   int      `json:"Subtask"`
				Operators []string `json:"Operators"`
			} `json:"tasks"`
		} `json:"jobs"`
	}
	if err := getJSONFrom(client, "http://"+m.apiAddr+"/cluster/worker", &w); err != nil {
		return o, err
	}
	o.recv = time.Now()
	if len(w.Jobs) > 1 {
		return o, fmt.Errorf("node %s hosts %d jobs", m.id, len(w.Jobs))
	}
	for _, j := range w.Jobs {
		o.epoch = j.Epoch
		for _, ts := range j.Tasks {
			if slices.Contains(ts.Operators, p.op) {
				o.owned = append(o.owned, ts.Subtask)
			}
		}
	}
	return o, nil
}

// lookMaster reads the job master's node's own started tasks (GET
// /jobs/{job}/operators), between two reads of its epoch (GET /cluster);
// a look across a new deployment counts as failed.
func (p *ownPoller) lookMaster(client *http.Client, m *clusterMember) (ownObs, error) {
	o := ownObs{sent: time.Now()}
	var s1, s2 clusterStatus
	var ops struct {
		Tasks []taskInfo `json:"tasks"`
	}
	if err := errors.Join(getJSONFrom(client, "http://"+m.apiAddr+"/cluster", &s1),
		getJSONFrom(client, "http://"+m.apiAddr+"/jobs/"+p.job+"/operators", &ops),
		getJSONFrom(client, "http://"+m.apiAddr+"/cluster", &s2)); err != nil {
		return o, err
	}
	o.recv = time.Now()
	if s1.Epoch != s2.Epoch {
		return o, fmt.Errorf("node %s: a new deployment during the look (epoch %d, then %d)", m.id, s1.Epoch, s2.Epoch)
	}
	o.epoch = s1.Epoch
	for _, ti := range ops.Tasks {
		if slices.Contains(ti.Operators, p.op) {
			o.owned = append(o.owned, ti.Subtask)
		}
	}
	return o, nil
}

// snapshot returns a copy of the observations so far.
func (p *ownPoller) snapshot() (map[string][]ownObs, map[string]int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	obs := map[string][]ownObs{}
	for id, looks := range p.obs {
		obs[id] = slices.Clone(looks)
	}
	return obs, maps.Clone(p.failed)
}

// lookAny reads what node m runs as a worker (GET /cluster/worker) and
// as the job master's node (GET /jobs/{job}/operators, absent on a node
// that runs no job master), between two reads of its epoch (GET
// /cluster, the newest of its deployments); a look across a new
// deployment counts as failed.
func (p *ownPoller) lookAny(client *http.Client, m *clusterMember) (ownObs, error) {
	o := ownObs{sent: time.Now()}
	var s1, s2 clusterStatus
	var w struct {
		Jobs []struct {
			Tasks []struct {
				Subtask   int      `json:"Subtask"`
				Operators []string `json:"Operators"`
			} `json:"tasks"`
		} `json:"jobs"`
	}
	if err := errors.Join(getJSONFrom(client, "http://"+m.apiAddr+"/cluster", &s1),
		getJSONFrom(client, "http://"+m.apiAddr+"/cluster/worker", &w)); err != nil {
		return o, err
	}
	var ops struct {
		Tasks []taskInfo `json:"tasks"`
	}
	resp, err := client.Get("http://" + m.apiAddr + "/jobs/" + p.job + "/operators")
	if err != nil {
		return o, err
	}
	switch resp.StatusCode {
	case http.StatusOK:
		err = json.NewDecoder(resp.Body).Decode(&ops)
	case http.StatusNotFound:
	default:
		err = fmt.Errorf("GET /jobs/%s/operators on %s: %s", p.job, m.id, resp.Status)
	}
	resp.Body.Close()
	if err != nil {
		return o, err
	}
	if err := getJSONFrom(client, "http://"+m.apiAddr+"/cluster", &s2); err != nil {
		return o, err
	}
	o.recv = time.Now()
	if s1.Epoch != s2.Epoch {
		return o, fmt.Errorf("node %s: a new deployment during the look (epoch %d, then %d)", m.id, s1.Epoch, s2.Epoch)
	}
	o.epoch = s1.Epoch
	for _, j := range w.Jobs {
		for _, ts := range j.Tasks {
			if slices.Contains(ts.Operators, p.op) {
				o.owned = append(o.owned, ts.Subtask)
			}
		}
	}
	for _, ti := range ops.Tasks {
		if slices.Contains(ti.Operators, p.op) && !slices.Contains(o.owned, ti.Subtask) {
			o.owned = append(o.owned, ti.Subtask)
		}
	}
	return o, nil
}

// look asks node m what it runs now, as the poller does.
func (p *ownPoller) look(client *http.Client, m *clusterMember) (ownObs, error) {
	if p.any {
		return p.lookAny(client, m)
	}
	if m.id == p.master {
		return p.lookMaster(client, m)
	}
	return p.lookWorker(client, m)
}

// ownSpan is a time during which a node certainly ran a subtask: two
// looks found it in the same deployment (a deployment's tasks start once
// and stop once), with every look between them finding it too.
type ownSpan struct {
	node     string
	subtask  int
	epoch    uint64
	from, to time.Time // the first look's answer, the last look's request
	looks    int
}

// spans returns every ownSpan in obs.
func spans(obs map[string][]ownObs) []ownSpan {
	var out []ownSpan
	for id, looks := range obs {
		open := map[int]*ownSpan{}
		closeSpan := func(k int) {
			if s := open[k]; s != nil && s.looks > 1 && s.from.Before(s.to) {
				out = append(out, *s)
			}
			delete(open, k)
		}
		for _, o := range looks {
			for k, s := range open {
				if s.epoch != o.epoch || !slices.Contains(o.owned, k) {
					closeSpan(k)
				}
			}
			for _, k := range o.owned {
				if s := open[k]; s != nil {
					s.to, s.looks = o.sent, s.looks+1
					continue
				}
				open[k] = &ownSpan{node: id, subtask: k, epoch: o.epoch, from: o.recv, to: o.sent, looks: 1}
			}
		}
		for k := range open {
			closeSpan(k)
		}
	}
	return out
}

// overlaps returns the proven double ownerships in obs, one line per span
// and other node: looks at another node found the span's subtask running,
// each entirely within the span, during which the span's node certainly
// ran it.
func overlaps(obs map[string][]ownObs) []string {
	var out []string
	f := func(t time.Time) string { return t.Format("15:04:05.000") }
	for _, s := range spans(obs) {
		for id, looks := range obs {
			if id == s.node {
				continue
			}
			var first, last ownObs
			n := 0
			for _, o := range looks {
				if slices.Contains(o.owned, s.subtask) && !o.sent.Before(s.from) && !s.to.Before(o.recv) {
					if n == 0 {
						first = o
					}
					last, n = o, n+1
				}
			}
			if n > 0 {
				out = append(out, fmt.Sprintf("window subtask %d: node %s ran it in epoch %d from %s to %s (%d looks), and %d looks at node %s found it running there too (epoch %d), from [%s, %s] to [%s, %s]",
					s.subtask, s.node, s.epoch, f(s.from), f(s.to), s.looks, n, id, first.epoch, f(first.sent), f(first.recv), f(last.sent), f(last.recv)))
			}
		}
	}
	slices.Sort(out)
	return out
}

// pollStats describes the looks at each node: how many, how many failed,
// the longest time between two answers.
func pollStats(obs map[string][]ownObs, failed map[string]int) string {
	var parts []string
	for _, id := range []string{"a", "b", "c"} {
		looks := obs[id]
		var gap time.Duration
		for i := 1; i < len(looks); i++ {
			gap = max(gap, looks[i].recv.Sub(looks[i-1].recv))
		}
		parts = append(parts, fmt.Sprintf("%s: %d looks, %d failed, longest gap %v", id, len(looks), failed[id], gap.Round(time.Millisecond)))
	}
	return strings.Join(parts, "; ")
}

// ---------------------------------------------------------------- steady load

// steadyLoad publishes readings to some nodes of a cluster from its own
// goroutine at a steady rate, until asked to stop at the end of a window.
type steadyLoad struct {
	l     *clusterLoad
	nodes []int // the nodes that receive readings, in turn
	rate  int   // readings per second

	next atomic.Int64 // the next reading to publish
	stop atomic.Int64 // publish readings below this only (MaxInt64: not asked to stop)
	done chan struct{}
	err  error // why it stopped early; read after done
}

// startSteady publishes readings from `from` on, reading i to
// nodes[i%len(nodes)], rate a second, with at most 600 unacknowledged.
func (l *clusterLoad) startSteady(from int, nodes []int, rate int) *steadyLoad {
	s := &steadyLoad{l: l, nodes: nodes, rate: rate, done: make(chan struct{})}
	s.next.Store(int64(from))
	s.stop.Store(math.MaxInt64)
	go s.run()
	return s
}

func (s *steadyLoad) run() {
	defer close(s.done)
	const inFlight = 600
	var toks []paho.Token
	waitOldest := func() bool {
		tok := toks[0]
		toks = toks[1:]
		if !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
			s.err = fmt.Errorf("publish not acknowledged within 30 s: %v", tok.Error())
			return false
		}
		return true
	}
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	perTick := max(1, s.rate/100)
	for {
		for range perTick {
			i := int(s.next.Load())
			if int64(i) >= s.stop.Load() {
				for len(toks) > 0 {
					if !waitOldest() {
						return
					}
				}
				return
			}
			node := s.nodes[i%len(s.nodes)]
			topic, p := payloadOf(i)
			toks = append(toks, s.l.pubs[node][(i/len(s.nodes))%devicesPerNode].Publish(topic, 1, false, p))
			s.next.Store(int64(i + 1))
			if len(toks) >= inFlight && !waitOldest() {
				return
			}
		}
		<-tick.C
	}
}

// end asks the load to stop at the next window boundary, waits until
// every reading it published is acknowledged and returns the first reading
// it did not publish (a multiple of windowMS).
func (s *steadyLoad) end(t *testing.T) int {
	t.Helper()
	for {
		n := s.next.Load()
		end := (n/windowMS + 1) * windowMS
		s.stop.Store(end)
		if s.next.Load() <= end {
			break // it stops at end
		}
	}
	select {
	case <-s.done:
	case <-time.After(2 * time.Minute):
		t.Fatalf("the steady load did not end within 2 min (next reading %d)", s.next.Load())
	}
	if s.err != nil {
		t.Fatalf("steady load: %v", s.err)
	}
	return int(s.stop.Load())
}

// ---------------------------------------------------------------- the test

// startPartitionLab starts nodes a, b and c, each in a network namespace
// of its own, with MQTT load on each.
func startPartitionLab(t *testing.T) (*netLab, []*clusterMember, *clusterLoad) {
	t.Helper()
	ids := []string{"a", "b", "c"}
	lab := newNetLab(t, ids)
	members := startLabCluster(t, lab, ids)
	return lab, members, newClusterLoad(t, members)
}

// whileRunning returns testutil.Eventually that also fails the test as
// soon as one of members exited by itself.
func whileRunning(t *testing.T, members []*clusterMember) func(timeout time.Duration, what string, cond func() bool) {
	return func(timeout time.Duration, what string, cond func() bool) {
		t.Helper()
		testutil.Eventually(t, timeout, what, func() bool {
			failIfAnyExited(t, members)
			return cond()
		})
	}
}

// startSteadyStopped starts a steady load of 2,000 readings/s from
// reading from on the devices of nodes, stopped when the test ends (a
// failing test leaves it running: it stops before the devices disconnect
// and the nodes are killed).
func startSteadyStopped(t *testing.T, l *clusterLoad, from int, nodes []int) *steadyLoad {
	steady := l.startSteady(from, nodes, 2000)
	t.Cleanup(func() {
		steady.stop.Store(0)
		select {
		case <-steady.done:
		case <-time.After(30 * time.Second):
		}
	})
	return steady
}

// failIfAnyExited fails the test when one of members exited by itself.
func failIfAnyExited(t *testing.T, members []*clusterMember) {
	t.Helper()
	for _, m := range members {
		select {
		case <-m.done:
			t.Fatalf("node %s exited by itself (%v):\n%s", m.id, m.waitErr, m.logTail())
		default:
		}
	}
}

// A worker of a three-node cluster with gossip is cut off from the other
// two by a network partition under MQTT load (each node in a network
// namespace of its own; its port taken off the bridge that joins them).
// The cut-off node sees no majority and stops its tasks; the job master
// sees it gone and places its subtasks on the majority, which goes on
// processing every key group. No key group is ever run by two nodes: a
// poller asks every node's REST every 100 ms what it runs, throughout.
// Healed, the node returns and gets its subtasks back; every window of
// every sensor is exact, under a single result id.
func TestClusterPartitionMinorityStopsOwning(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with three subprocesses in network namespaces")
	}
	lab, members, l := startPartitionLab(t)
	a, b, c := members[0], members[1], members[2]
	client := lab.client()
	failIfExited := func() { t.Helper(); failIfAnyExited(t, members) }
	eventually := whileRunning(t, members)
	eventually(30*time.Second, "the master sees every node alive and places subtasks on c", func() bool {
		s, err := a.status(client)
		return err == nil && aliveCount(s) == 3 && s.keyedOn("c") > 0
	})
	poller := startOwnPoller(t, client, members, "sensors")

	// Phase 1: every node ingests its own devices' readings.
	const n1 = 15_000
	l.publish(0, n1)
	// c's devices go quiet (they would be on the far side of the cut);
	// a and b go on under a steady load. What c acknowledged is covered by
	// completed checkpoints before the cut (c's log released it): readings
	// c holds and no checkpoint covers would reach the job only after the
	// heal, behind its event time (see TestClusterWorkerFailover).
	steady := startSteadyStopped(t, l, n1, []int{0, 1})
	eventually(60*time.Second, "node c's log released all it was sent", func() bool {
		rel, err := c.released(client)
		return err == nil && rel >= n1/3
	})
	var before clusterStatus
	eventually(10*time.Second, "the master's placement before the cut", func() bool {
		var err error
		before, err = a.status(client)
		return err == nil && before.keyedOn("c") > 0
	})
	cOwned, err := poller.look(client, c)
	if err != nil || len(cOwned.owned) == 0 {
		t.Fatalf("node c runs no window subtask before the cut: %+v (%v)", cOwned, err)
	}
	t.Logf("before the cut: epoch %d, keyed subtasks a %d, b %d, c %d; c runs window subtasks %v",
		before.Epoch, before.keyedOn("a"), before.keyedOn("b"), before.keyedOn("c"), cOwned.owned)

	// Phase 2: the partition.
	lab.cut("c")
	cutAt := time.Now()
	readingAtCut := int(steady.next.Load())
	t.Logf("cut node c off at reading %d", readingAtCut)
	var cStopped, moved time.Duration
	eventually(60*time.Second, "node c sees no majority and runs nothing", func() bool {
		if sees, err := c.seesMajority(client); err != nil || sees {
			return false
		}
		if o, err := poller.look(client, c); err != nil || len(o.owned) > 0 {
			return false
		}
		jobs, err := c.hosted(client)
		if err != nil || hostedTasks(jobs) > 0 {
			return false
		}
		cStopped = time.Since(cutAt)
		return true
	})
	var after clusterStatus
	eventually(60*time.Second, "the master moved node c's subtasks to a and b", func() bool {
		var err error
		after, err = a.status(client)
		if err != nil || after.FailoversTotal < 1 || after.keyedOn("c") != 0 || after.keyedOn("a")+after.keyedOn("b") != 3 || after.Epoch <= before.Epoch {
			return false
		}
		moved = time.Since(cutAt)
		return true
	})
	// The majority runs every window subtask: a's own and b's.
	eventually(60*time.Second, "a and b run all three window subtasks", func() bool {
		oa, err1 := poller.look(client, a)
		ob, err2 := poller.look(client, b)
		if err1 != nil || err2 != nil {
			return false
		}
		all := append(slices.Clone(oa.owned), ob.owned...)
		slices.Sort(all)
		return slices.Equal(all, []int{0, 1, 2}) && oa.epoch == ob.epoch && oa.epoch >= after.Epoch
	})
	t.Logf("after the cut: node c reported no majority and hosted nothing %v after it; then the master's GET /cluster showed its subtasks on a (%d) and b (%d) in epoch %d, %v after it (the handover below has when each was first and last seen running)",
		cStopped.Round(time.Millisecond), after.keyedOn("a"), after.keyedOn("b"), after.Epoch, moved.Round(time.Millisecond))
	// Every key group is processed by the majority: the windows after
	// the cut fire for every sensor.
	w := readingAtCut/windowMS + 3
	eventually(120*time.Second, fmt.Sprintf("every sensor's windows up to %d while c is cut off", w), func() bool {
		if isDone(steady.done) {
			t.Fatalf("the steady load stopped: %v", steady.err)
		}
		return countWindows(l.col, w) >= w*sensors
	})
	if o, err := poller.look(client, c); err != nil || len(o.owned) > 0 {
		t.Fatalf("node c runs %v while cut off (%v)", o.owned, err)
	}

	// Phase 3: the heal. c comes back and gets its subtasks back.
	lab.heal("c")
	healAt := time.Now()
	t.Logf("healed at reading %d", steady.next.Load())
	eventually(90*time.Second, "node c runs window subtasks again", func() bool {
		s, err := a.status(client)
		if err != nil || s.keyedOn("c") == 0 {
			return false
		}
		o, err := poller.look(client, c)
		return err == nil && len(o.owned) > 0 && o.epoch == s.Epoch
	})
	back, _ := a.status(client)
	t.Logf("after the heal: node c runs window subtasks again %v after it, epoch %d", time.Since(healAt).Round(time.Millisecond), back.Epoch)
	n2 := steady.end(t)
	const extra = 9_000
	n3 := n2 + extra
	l.publish(n2, n3) // every node again
	l.finish(n3, 120*time.Second)
	checkExact(t, l.col, workload{n: n3, sensors: sensors, winMS: windowMS, tail: tail, topic: "sensors/%s/temperature"})
	failIfExited()

	poller.close()
	obs, failed := poller.snapshot()
	t.Logf("REST looks: %s", pollStats(obs, failed))
	// The looks must have seen the whole story: c running before the
	// cut, nothing while cut off, running again after the heal.
	var cBefore, cNone, cAfter bool
	for _, o := range obs["c"] {
		switch {
		case o.recv.Before(cutAt) && len(o.owned) > 0:
			cBefore = true
		case o.sent.After(cutAt) && o.recv.Before(healAt) && len(o.owned) == 0:
			cNone = true
		case o.sent.After(healAt) && len(o.owned) > 0:
			cAfter = true
		}
	}
	if !cBefore || !cNone || !cAfter {
		t.Errorf("the looks at node c missed part of the story: running before the cut %v, nothing while cut off %v, running after the heal %v", cBefore, cNone, cAfter)
	}
	for _, k := range cOwned.owned {
		t.Logf("handover of window subtask %d: %s", k, handover(obs, "c", k, after.Epoch, cutAt, healAt))
	}
	for _, m := range []*clusterMember{a, c} {
		t.Logf("node %s on the partition:\n%s", m.id, clusterLines(m.runLog()))
	}
	if ov := overlaps(obs); len(ov) > 0 {
		for _, o := range ov {
			t.Error(o)
		}
		t.Errorf("a window subtask (and its key groups) was run by two nodes at once")
	}
	t.Logf("%d spans of certain ownership checked against every look of the other nodes: no key group run twice", len(spans(obs)))
}

// handover describes when the looks last saw node from run subtask k
// before heal and first saw another node run it in epoch, after cut.
func handover(obs map[string][]ownObs, from string, k int, epoch uint64, cut, heal time.Time) string {
	var last, first ownObs
	var firstOn string
	for _, o := range obs[from] {
		if o.recv.Before(heal) && slices.Contains(o.owned, k) {
			last = o
		}
	}
	for id, looks := range obs {
		if id == from {
			continue
		}
		for _, o := range looks {
			if o.sent.After(cut) && o.epoch == epoch && slices.Contains(o.owned, k) && (firstOn == "" || o.sent.Before(first.sent)) {
				first, firstOn = o, id
				break
			}
		}
	}
	if last.sent.IsZero() || firstOn == "" {
		return fmt.Sprintf("not seen (last on %s: %v, first elsewhere: %q)", from, last.sent, firstOn)
	}
	f := func(t time.Time) string { return t.Format("15:04:05.000") }
	return fmt.Sprintf("last seen on %s in [%s, %s] (%v after the cut), first seen on %s in [%s, %s]: at least %v between them",
		from, f(last.sent), f(last.recv), last.recv.Sub(cut).Round(time.Millisecond), firstOn, f(first.sent), f(first.recv),
		first.sent.Sub(last.recv).Round(time.Millisecond))
}

// clusterLines returns a node's log lines about membership, majority and
// failover.
func clusterLines(log string) string {
	var out []string
	for _, line := range strings.Split(log, "\n") {
		for _, k := range []string{"member failed", "membership changed", "no majority", "failing over", "failover done", "takes over", "jobs stopped", "placing the subtasks", "deployment ended", "redeployed"} {
			if strings.Contains(line, k) {
				out = append(out, line)
				break
			}
		}
	}
	return strings.Join(out, "\n")
}

func aliveCount(s clusterStatus) int {
	n := 0
	for _, m := range s.Members {
		if m.State == "alive" {
			n++
		}
	}
	return n
}

// seesMajority returns what node m says of itself in its GET /cluster:
// whether it sees a majority of the cluster.
func (m *clusterMember) seesMajority(client *http.Client) (bool, error) {
	var s struct {
		Members []struct {
			ID           string `json:"id"`
			SeesMajority bool   `json:"sees_majority"`
		} `json:"members"`
	}
	if err := getJSONFrom(client, "http://"+m.apiAddr+"/cluster", &s); err != nil {
		return false, err
	}
	for _, self := range s.Members {
		if self.ID == m.id {
			return self.SeesMajority, nil
		}
	}
	return false, fmt.Errorf("node %s does not list itself in GET /cluster", m.id)
}

func hostedTasks(jobs []workerJob) int {
	n := 0
	for _, j := range jobs {
		n += len(j.Tasks)
	}
	return n
}

func isDone(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// The leader of a three-node cluster with gossip (node a, the job
// masters' node) is cut off from the two workers by a network partition
// under MQTT load. It reaches no majority and stops its job before its
// peers confirm its death; node b, the lowest of the majority, takes
// over, restores the job from the replicated checkpoint and runs every
// window subtask with c. No key group is ever run by two nodes: a poller
// asks every node's REST every 100 ms what it runs, as a worker and as
// the job master's node alike, throughout. a, still cut off, is then
// killed; every window of every sensor is exact, under a single result
// id.
func TestClusterPartitionLeaderCutOff(t *testing.T) { testPartitionLeaderCutOff(t, false) }

// As TestClusterPartitionLeaderCutOff, but the cut then heals instead of
// a dying: a and b both lead for a moment; a, whose term b's superseded,
// yields (the nodes refuse its epochs) and follows b. Every node then
// names one leader, the job keeps making progress, and every window of
// every sensor is exact, under a single result id, with no key group
// run twice at any moment.
func TestClusterPartitionLeaderCutOffHealed(t *testing.T) { testPartitionLeaderCutOff(t, true) }

func testPartitionLeaderCutOff(t *testing.T, heal bool) {
	if testing.Short() {
		t.Skip("end-to-end test with three subprocesses in network namespaces")
	}
	lab, members, l := startPartitionLab(t)
	a, b, c := members[0], members[1], members[2]
	client := lab.client()
	eventually := whileRunning(t, members)
	eventually(30*time.Second, "the leader sees every node alive and runs a window subtask", func() bool {
		s, err := a.leaderStatus(client)
		return err == nil && aliveCount(s.clusterStatus) == 3 && s.Leader == "a" && s.keyedOn("a") > 0
	})
	poller := startOwnPollerOf(t, client, members, "sensors", true)

	const n1 = 15_000
	l.publish(0, n1)
	// a's devices go quiet (they would be on its side of the cut); b's
	// and c's go on under a steady load. What a acknowledged is covered
	// by completed checkpoints before the cut.
	steady := startSteadyStopped(t, l, n1, []int{1, 2})
	eventually(60*time.Second, "node a's log released all it was sent", func() bool {
		rel, err := a.released(client)
		return err == nil && rel >= n1/3
	})
	before, err := a.leaderStatus(client)
	if err != nil {
		t.Fatal(err)
	}
	aOwned, err := poller.look(client, a)
	if err != nil || len(aOwned.owned) == 0 {
		t.Fatalf("node a runs no window subtask before the cut: %+v (%v)", aOwned, err)
	}

	lab.cut("a")
	cutAt := time.Now()
	readingAtCut := int(steady.next.Load())
	t.Logf("cut the leader a off at reading %d (epoch %d; a runs window subtasks %v)", readingAtCut, before.Epoch, aOwned.owned)
	var aStopped, tookOver time.Duration
	var takeEpoch uint64
	eventually(60*time.Second, "node a sees no majority and runs nothing", func() bool {
		if sees, err := a.seesMajority(client); err != nil || sees {
			return false
		}
		if o, err := poller.look(client, a); err != nil || len(o.owned) > 0 {
			return false
		}
		aStopped = time.Since(cutAt)
		return true
	})
	eventually(60*time.Second, "node b leads and b and c run all three window subtasks", func() bool {
		s, err := b.leaderStatus(client)
		if err != nil || s.Leader != "b" || s.Epoch <= before.Epoch {
			return false
		}
		ob, err1 := poller.look(client, b)
		oc, err2 := poller.look(client, c)
		if err1 != nil || err2 != nil {
			return false
		}
		all := append(slices.Clone(ob.owned), oc.owned...)
		slices.Sort(all)
		if !slices.Equal(all, []int{0, 1, 2}) {
			return false
		}
		tookOver, takeEpoch = time.Since(cutAt), s.Epoch
		return true
	})
	t.Logf("after the cut: a ran nothing %v after it; b led with every window subtask on b and c %v after it",
		aStopped.Round(time.Millisecond), tookOver.Round(time.Millisecond))
	w := readingAtCut/windowMS + 3
	eventually(120*time.Second, fmt.Sprintf("every sensor's windows up to %d while a is cut off", w), func() bool {
		if isDone(steady.done) {
			t.Fatalf("the steady load stopped: %v", steady.err)
		}
		return countWindows(l.col, w) >= w*sensors
	})
	if o, err := poller.look(client, a); err != nil || len(o.owned) > 0 {
		t.Fatalf("node a runs %v while cut off (%v)", o.owned, err)
	}

	var healAt time.Time
	if !heal {
		// a stays cut off until it dies (a device lost on its side of
		// the cut): the majority goes on alone.
		l.kill(0)
		healAt = time.Now()
		t.Logf("killed the cut-off leader a at reading %d", steady.next.Load())
	} else {
		lab.heal("a")
		healAt = time.Now()
		t.Logf("healed the cut at reading %d", steady.next.Load())
		var leader string
		eventually(120*time.Second, "every node names one leader after the heal", func() bool {
			leader = ""
			for _, m := range members {
				s, err := m.leaderStatus(client)
				if err != nil || s.Leader == "" || aliveCount(s.clusterStatus) != 3 || (leader != "" && s.Leader != leader) {
					return false
				}
				leader = s.Leader
			}
			return true
		})
		w := int(steady.next.Load())/windowMS + 3
		// Until a runs its subtasks again, the majority's windows go on.
		// Once the join's rebalance has moved them home (its source split
		// first, its window subtask after), a's silent split holds the
		// windows back, as documented, until its devices publish again
		// below: a loaded machine that names the leader late gets there
		// first, and the exact check at the end covers those windows.
		var aBack bool
		eventually(120*time.Second, fmt.Sprintf("every sensor's windows up to %d after the heal, or a running its subtasks again", w), func() bool {
			if isDone(steady.done) {
				t.Fatalf("the steady load stopped: %v", steady.err)
			}
			if countWindows(l.col, w) >= w*sensors {
				return true
			}
			o, err := poller.look(client, a)
			aBack = err == nil && len(o.owned) > 0
			return aBack
		})
		if aBack {
			t.Logf("after the heal: every node names %s the leader; a ran its subtasks again %v after the heal, before the windows up to %d were complete", leader, time.Since(healAt).Round(time.Millisecond), w)
		} else {
			t.Logf("after the heal: every node names %s the leader; windows up to %d complete %v after the heal", leader, w, time.Since(healAt).Round(time.Millisecond))
		}
		// a's devices publish to it again only once it runs its subtasks
		// (its source split among them) again: what it ingests before is
		// read behind the job's event time (see the README).
		eventually(120*time.Second, "node a runs its window subtask again", func() bool {
			var s leaderStatus
			for _, m := range members {
				if st, err := m.leaderStatus(client); err == nil && st.Leader == m.id {
					s = st
				}
			}
			o, err := poller.look(client, a)
			return s.Leader != "" && s.keyedOn("a") > 0 && err == nil && len(o.owned) > 0
		})
		for _, m := range members {
			if s, err := m.leaderStatus(client); err == nil {
				t.Logf("node %s: leader %s, epoch %d", m.id, s.Leader, s.Epoch)
			}
		}
	}
	n2 := steady.end(t)
	const extra = 9_000
	n3 := n2 + extra
	l.publish(n2, n3)
	l.finish(n3, 120*time.Second)
	checkExact(t, l.col, workload{n: n3, sensors: sensors, winMS: windowMS, tail: tail, topic: "sensors/%s/temperature"})
	live := []*clusterMember{b, c}
	if heal {
		live = members
	}
	for _, m := range live {
		select {
		case <-m.done:
			t.Fatalf("node %s exited by itself (%v):\n%s", m.id, m.waitErr, m.logTail())
		default:
		}
	}

	poller.close()
	obs, failed := poller.snapshot()
	t.Logf("REST looks: %s", pollStats(obs, failed))
	var aBefore, aNone, bDuring bool
	for _, o := range obs["a"] {
		switch {
		case o.recv.Before(cutAt) && len(o.owned) > 0:
			aBefore = true
		case o.sent.After(cutAt) && o.recv.Before(healAt) && len(o.owned) == 0:
			aNone = true
		}
	}
	for _, o := range obs["b"] {
		bDuring = bDuring || o.sent.After(cutAt) && o.recv.Before(healAt) && len(o.owned) > 0
	}
	if !aBefore || !aNone || !bDuring {
		t.Errorf("the looks missed part of the story: a running before the cut %v, a running nothing while cut off %v, b running while a was cut off %v", aBefore, aNone, bDuring)
	}
	for _, k := range aOwned.owned {
		t.Logf("handover of window subtask %d: %s", k, handover(obs, "a", k, takeEpoch, cutAt, healAt))
	}
	for _, m := range []*clusterMember{a, b} {
		t.Logf("node %s on the partition:\n%s", m.id, clusterLines(m.runLog()))
	}
	if ov := overlaps(obs); len(ov) > 0 {
		for _, o := range ov {
			t.Error(o)
		}
		t.Errorf("a window subtask (and its key groups) was run by two nodes at once")
	}
	t.Logf("%d spans of certain ownership checked against every look of the other nodes: no key group run twice", len(spans(obs)))
}
