package test

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgedio/edged/internal/mqtttest"
	"github.com/edgedio/edged/internal/testutil"
)

// broker is a Mosquitto process of a test that the test can kill -9,
// restart, stop (SIGSTOP) and continue: its port, config and
// persistence directory stay the same across restarts.
type broker struct {
	t    *testing.T
	bin  string
	conf string
	db   string // the persistence file
	addr string
	cmd  *exec.Cmd
	done chan struct{}
	log  string
}

// startBroker starts a Mosquitto on a free 127.0.0.1 port with
// persistence in a temp dir, saved every second (autosave_interval 1;
// saving after every change instead made Mosquitto too slow to keep
// its clients' keep-alives once it held a few thousand messages), and
// conf appended. user root keeps it from dropping to the mosquitto user,
// who cannot write the temp dir. It is killed when t ends.
func startBroker(t *testing.T, conf string) *broker {
	t.Helper()
	bin := mqtttest.MosquittoBin(t)
	dir := t.TempDir()
	addr := freeAddr(t)
	_, port, _ := net.SplitHostPort(addr)
	b := &broker{t: t, bin: bin, conf: filepath.Join(dir, "mosquitto.conf"), db: filepath.Join(dir, "mosquitto.db"),
		addr: addr, log: filepath.Join(dir, "mosquitto.log")}
	body := fmt.Sprintf("listener %s 127.0.0.1\nallow_anonymous true\npersistence true\npersistence_location %s/\n"+
		"autosave_interval 1\nuser root\nmax_inflight_messages 1000\nmax_queued_messages 0\n%s", port, dir, conf)
	if err := os.WriteFile(b.conf, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if b.cmd != nil {
			b.cmd.Process.Signal(syscall.SIGCONT)
			b.cmd.Process.Kill()
			<-b.done
		}
	})
	b.start()
	return b
}

func (b *broker) url() string { return "tcp://" + b.addr }

// start starts the broker (again) and waits until it listens.
func (b *broker) start() {
	b.t.Helper()
	f, err := os.OpenFile(b.log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		b.t.Fatal(err)
	}
	cmd := exec.Command(b.bin, "-c", b.conf)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		b.t.Fatalf("start mosquitto: %v", err)
	}
	done := make(chan struct{})
	go func() {
		cmd.Wait()
		f.Close()
		close(done)
	}()
	b.cmd, b.done = cmd, done
	testutil.Eventually(b.t, 10*time.Second, "mosquitto listening on "+b.addr, func() bool {
		c, err := net.DialTimeout("tcp", b.addr, time.Second)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
}

// kill SIGKILLs the broker and waits for it to be gone.
func (b *broker) kill() {
	b.t.Helper()
	b.cmd.Process.Kill()
	<-b.done
	b.cmd = nil
}

func (b *broker) sigstop() { b.cmd.Process.Signal(syscall.SIGSTOP) }
func (b *broker) sigcont() { b.cmd.Process.Signal(syscall.SIGCONT) }

// waitSaved waits until the broker has saved its state after everything
// acknowledged so far: it publishes a retained message (a change) and
// waits for the persistence file to be written after it.
func (b *broker) waitSaved() {
	b.t.Helper()
	t0 := time.Now()
	c := connect(b.t, paho.NewClientOptions().AddBroker(b.url()).SetClientID("bf-save").SetAutoReconnect(false))
	defer c.Disconnect(0)
	if tok := c.Publish("bf/_save", 1, true, t0.String()); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		b.t.Fatalf("publish the save marker: %v", tok.Error())
	}
	testutil.Eventually(b.t, 10*time.Second, "mosquitto saving its state", func() bool {
		fi, err := os.Stat(b.db)
		return err == nil && !fi.ModTime().Before(t0)
	})
}

// brokerFaultConfig is what writeBrokerFaultConfig puts in a node config.
type brokerFaultConfig struct {
	job      string
	api      string
	source   string // tcp:// URL of the broker the job reads
	clientID string
	qos      int
	restart  string // the pipeline's restart: block, "" for the default
	ackDelay string // source.mqtt.ack_delay, "" for the default
	extra    string // pipelines before the job's (the first external one names the sink broker)
}

// writeBrokerFaultConfig writes dir/edged.yaml: the job of the
// exactly-once tests (1 s windows counting each sensor's readings,
// published to agg/<sensor> through the write-ahead sink, checkpoints
// every 200 ms) reading an external broker.
func writeBrokerFaultConfig(t *testing.T, dir string, c brokerFaultConfig) string {
	t.Helper()
	data := filepath.Join(dir, "data")
	restart := ""
	if c.restart != "" {
		restart = "    restart: " + c.restart + "\n"
	}
	ackDelay := ""
	if c.ackDelay != "" {
		ackDelay = "        ack_delay: " + c.ackDelay + "\n"
	}
	cfg := fmt.Sprintf(`node:
  data_dir: %[1]s
  listen: %[2]s
pipelines:
%[9]s  - name: %[3]s
    source:
      mqtt:
        broker: %[4]s
        client_id: %[5]s
%[10]s        topics: [sensors/+/temperature]
        qos: %[6]d
        format: json
        fields:
          id: {type: string, path: $.sensor}
          temp: {type: float, path: $.t}
          ts: {type: time, path: $.ts, unit: ms}
    event_time: {field: ts, max_out_of_orderness: %[7]dms}
    key: id
    window:
      type: tumbling
      size: 1s
      aggregates: [{name: count, fn: count}]
    sinks:
      - mqtt: {topic: "agg/{id}", qos: 1}
    checkpoint: {dir: %[1]s/checkpoints/%[3]s, interval: 200ms, mode: exactly_once}
%[8]s`, data, c.api, c.job, c.source, c.clientID, c.qos, maxOutOfOrderMS, restart, c.extra, ackDelay)
	p := filepath.Join(dir, "edged.yaml")
	if err := os.WriteFile(p, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// brokerFaultRun is what the broker-fault tests share: a Mosquitto with
// persistence, edged reading it through its persistent session and
// publishing its window counts back to it, persistent-session devices
// (QoS 1) and a persistent-session result consumer.
type brokerFaultRun struct {
	t    *testing.T
	w    workload
	b    *broker
	nd   *node
	col  *collector
	sub  paho.Client
	devs []paho.Client
}

// newBrokerFaultRun starts the broker, connects the consumer and the
// devices and writes edged's config; it does not start edged. restart is
// the pipeline's restart: block ("" for the default).
func newBrokerFaultRun(t *testing.T, readings int, restart, ackDelay string) *brokerFaultRun {
	t.Helper()
	r := &brokerFaultRun{t: t, w: newWorkload(t, readings), b: startBroker(t, ""), col: newCollector()}
	dir := t.TempDir()
	api := freeAddr(t)
	cfgPath := writeBrokerFaultConfig(t, dir, brokerFaultConfig{job: "plant", api: api, source: r.b.url(),
		clientID: "edged-brokerfault", qos: 1, restart: restart, ackDelay: ackDelay})
	r.sub = connect(t, paho.NewClientOptions().AddBroker(r.b.url()).SetClientID("brokerfault-results").
		SetCleanSession(false).SetAutoReconnect(false).SetOrderMatters(false).SetDefaultPublishHandler(r.col.handle).
		SetConnectionLostHandler(func(paho.Client, error) {}))
	t.Cleanup(func() { r.sub.Disconnect(100) })
	if tok := r.sub.Subscribe("agg/#", 1, r.col.handle); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	r.devs = devices(t, r.b.url(), "brokerfault-dev", conns, true)
	t.Cleanup(func() { disconnectAll(r.devs, 100) })
	r.nd = &node{t: t, cfgPath: cfgPath, logPath: filepath.Join(dir, "edged.log"), brokerAddr: r.b.addr, apiAddr: api}
	// Ready once the job runs, whether or not the broker is up.
	r.nd.readyFn = func(*http.Client) bool { return jobStatus(t, r.nd, "plant") == "running" }
	cleanupNode(t, r.nd)
	return r
}

// publish publishes readings from..to-1 and waits until the broker
// acknowledged them all.
func (r *brokerFaultRun) publish(from, to int) {
	r.t.Helper()
	l := startLoader(r.w, r.devs, 1, from, to)
	l.wait(r.t, r.nd, 2*time.Minute)
}

// reconnect connects the devices and the consumer again where their
// connection is gone (their sessions are on the broker).
func (r *brokerFaultRun) reconnect() {
	r.t.Helper()
	var gone []paho.Client
	for _, c := range append(slices.Clone(r.devs), r.sub) {
		if !c.IsConnectionOpen() {
			gone = append(gone, c)
		}
	}
	reconnectAll(r.t, gone, "clients")
}

// waitRead waits until edged has read up to lag readings short of
// reading n (its watermark trails what it read by maxOutOfOrderMS+1).
func (r *brokerFaultRun) waitRead(n, lag int) {
	r.t.Helper()
	testutil.Eventually(r.t, 2*time.Minute, fmt.Sprintf("edged reading up to %d readings short of %d", lag, n), func() bool {
		p, ok := r.nd.progress("plant")
		return ok && p.eventTime-epochMS >= int64(n-lag-maxOutOfOrderMS-1)
	})
}

// finish waits for every result, lets them reach the consumer and checks
// them exactly, then stops edged.
func (r *brokerFaultRun) finish() {
	r.t.Helper()
	waitResults(r.t, r.col, r.w, 90*time.Second)
	drain(r.t, r.b.url(), "agg/_marker", r.col)
	checkExact(r.t, r.col, r.w)
	if code := r.nd.terminate(30 * time.Second); code != 0 {
		r.t.Errorf("edged exited %d after SIGTERM, want 0", code)
	}
	// How many redeliveries edged recognised (redeliveries_dropped).
	for _, line := range strings.Split(r.nd.runLog(), "\n") {
		if strings.Contains(line, "mqtt subscriber closed") {
			r.t.Logf("edged: %s", line)
		}
	}
}

// TestMosquittoBrokerKilledExactlyOnce: Mosquitto (persistence saved
// every second) is SIGKILLed and restarted four times while edged reads
// QoS 1 readings through its persistent session, with some of them
// received by edged and not yet acknowledged (ack_delay 1s holds its
// acknowledgements back; the restarted broker resends them with DUP, and
// the closing log line's redeliveries_dropped counts those edged
// recognised), and while the write-ahead sink publishes
// results to it (its lost connection fails the job, which restores and
// publishes again under the same msg_ids). Each kill comes after the
// broker saved what the devices published and what edged had
// acknowledged by then, so that the broker itself loses nothing: a
// broker killed between two saves sends what it delivered since the last
// one again as new messages (see README, External brokers). Every window
// must be exact for a consumer that drops repeated msg_ids.
//
// The pipeline restarts up to 100 times, a second apart: every broker
// kill costs the job a restart (its sink's connection is lost), and the
// default strategy (three failures in ten minutes) would fail it for
// good at the fourth.
func TestMosquittoBrokerKilledExactlyOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with broker kills")
	}
	r := newBrokerFaultRun(t, 40_000, "{strategy: fixed_delay, attempts: 100, delay: 1s}", "1s")
	r.nd.start()
	const kills = 4
	chunk := r.w.all() / (kills + 1)
	for k := 0; k < kills; k++ {
		to := (k + 1) * chunk
		r.publish(k*chunk, to)
		r.waitRead(to, 900)
		r.b.waitSaved()
		r.b.kill()
		t.Logf("broker killed after reading %d", to)
		r.b.start()
		r.reconnect()
	}
	r.publish(kills*chunk, r.w.all())
	r.finish()
}

// TestMosquittoBrokerHungExactlyOnce: Mosquitto is stopped with SIGSTOP
// for 15 s, then for 35 s, with readings queued for edged and results
// being published, and continued. edged neither hangs nor loses nor
// duplicates: the sink gives the hung broker up after 30 s without an
// acknowledgement (the job restarts from its checkpoint and publishes
// again under the same msg_ids); the subscriber's connection, which gets
// no packet for less than 40 s, stays. The pipeline's default restart
// strategy.
func TestMosquittoBrokerHungExactlyOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with a stopped broker")
	}
	r := newBrokerFaultRun(t, 30_000, "", "")
	r.nd.start()
	pauses := []time.Duration{15 * time.Second, 35 * time.Second}
	chunk := r.w.all() / (len(pauses) + 1)
	for k, d := range pauses {
		r.publish(k*chunk, (k+1)*chunk)
		r.b.sigstop()
		stopped := time.Now()
		// The pause is what the test is about: no condition ends it.
		testutil.Within(d, func() bool { return false })
		r.b.sigcont()
		t.Logf("broker continued after %v stopped", time.Since(stopped).Round(time.Millisecond))
		r.reconnect()
	}
	r.publish(len(pauses)*chunk, r.w.all())
	r.finish()
}

// TestMosquittoBrokerDownWhileEdgedStarts: edged starts while the broker
// is down and reads once it is up; then both are killed (the broker
// first) and edged starts again while the broker is still down; then both
// are killed again and the broker starts before edged. Exact results.
// Readings are published to edged's session only once edged has
// subscribed for the first time: before that the broker has no session
// to queue them for. Before each kill of the broker edged has read what
// was published and the broker has saved its state after that: a broker
// restarted from a file older than edged's acknowledgements sends those
// messages again as new ones (README, External brokers), which no
// subscriber can tell from new readings.
func TestMosquittoBrokerDownWhileEdgedStarts(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with broker and edged kills")
	}
	r := newBrokerFaultRun(t, 30_000, "", "")
	r.b.waitSaved()
	r.b.kill()
	r.nd.start()
	t.Logf("edged started with the broker down")
	r.b.start()
	r.reconnect()
	testutil.Eventually(t, 30*time.Second, "edged subscribed", func() bool {
		return strings.Contains(r.nd.runLog(), "mqtt subscriber subscribed")
	})
	third := r.w.all() / 3
	r.publish(0, third)
	r.waitRead(third, 1)
	r.b.waitSaved()
	r.b.kill()
	r.nd.kill()
	r.nd.start()
	t.Logf("edged killed and started again with the broker down")
	r.b.start()
	r.reconnect()
	r.publish(third, 2*third)
	r.waitRead(2*third, 1)
	r.b.waitSaved()
	r.b.kill()
	r.nd.kill()
	r.b.start()
	r.reconnect()
	r.nd.start()
	t.Logf("broker started again, then edged")
	r.publish(2*third, r.w.all())
	r.finish()
}

// TestMosquittoSinkBrokerDownResultsKept: the results go to another
// Mosquitto than the readings come from (the node's sink broker is the
// broker of its first pipeline reading an external one), and that broker
// is killed and stays down for 40 s, across many checkpoints, while
// readings keep arriving. The sink holds the results of the completed
// checkpoints and tries their publish again and again (README, MQTT out):
// the job keeps running and checkpointing, never restarts, and once the
// broker is back every result goes out once, under its msg_id, without
// a node restart. Nothing is lost meanwhile: the results stay in the
// checkpoints, the readings in the ingest log. Exact results for a
// consumer that drops repeated msg_ids.
func TestMosquittoSinkBrokerDownResultsKept(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with a sink broker down")
	}
	sf := startSinkFault(t, "brokerfault", 30_000)
	defer sf.close()
	w, out, nd, col, sub, publish := sf.w, sf.out, sf.nd, sf.col, sf.sub, sf.publish
	quarter := w.all() / 4
	publish(0, quarter)
	out.waitSaved()
	out.kill()
	down := time.Now()
	publish(quarter, 2*quarter)
	// The outage is what the test is about: no condition ends it.
	testutil.Within(40*time.Second-time.Since(down), func() bool { return false })
	status, attempts := jobAttempts(t, nd, "plant")
	t.Logf("sink broker down for %v; the job is %s after %d attempts", time.Since(down).Round(time.Millisecond), status, attempts)
	// What waits for the broker shows in /metrics.
	if n := sinkResultsHeld(t, nd, "plant"); n == 0 {
		t.Errorf("edged_sink_results_held of plant is 0 with the sink's broker down for 40 s")
	} else {
		t.Logf("edged_sink_results_held of plant: %d", n)
	}
	out.start()
	reconnectAll(t, []paho.Client{sub}, "consumer")
	publish(2*quarter, w.all())
	if status != "running" || attempts != 1 {
		t.Fatalf("the job is %s after %d attempts while the sink's broker was down, want running in its first attempt", status, attempts)
	}
	if n := strings.Count(nd.runLog(), "publish failed; the results stay held"); n < 2 {
		t.Fatalf("%d failed publishes logged while the sink's broker was down for 40 s: the outage was not reached", n)
	}
	// At most the longest wait between tries (30 s) after the broker's
	// return, plus the publishing.
	waitResults(t, col, w, 2*time.Minute)
	if _, attempts := jobAttempts(t, nd, "plant"); attempts != 1 {
		t.Fatalf("the job restarted (%d attempts) around the sink broker's outage", attempts)
	}
	testutil.Eventually(t, time.Minute, "edged_sink_results_held of plant back to 0", func() bool {
		return sinkResultsHeld(t, nd, "plant") == 0
	})
	drain(t, out.url(), "agg/_marker", col)
	checkExact(t, col, w)
	if code := nd.terminate(30 * time.Second); code != 0 {
		t.Errorf("edged exited %d after SIGTERM, want 0", code)
	}
}

// sinkFault is a node running job "plant", which reads sensor readings
// from the broker src and publishes its windows to another broker, out,
// with a consumer subscribed to them there and publishing devices
// connected to src: what the tests of an outage of the sink's broker
// start from. Its first pipeline, "other", makes out the node's sink
// broker and keeps the node running when plant stops.
type sinkFault struct {
	w        workload
	src, out *broker
	dir, api string
	nd       *node
	col      *collector
	sub      paho.Client
	devs     []paho.Client
}

// startSinkFault starts a sinkFault of readings readings whose clients'
// ids start with name.
func startSinkFault(t *testing.T, name string, readings int) *sinkFault {
	t.Helper()
	f := &sinkFault{w: newWorkload(t, readings), src: startBroker(t, ""), out: startBroker(t, ""), dir: t.TempDir(), api: freeAddr(t)}
	first := fmt.Sprintf(`  - name: other
    source:
      mqtt:
        broker: %s
        client_id: edged-other
        topics: [other/+]
        format: json
        fields:
          id: {type: string, path: $.id}
    sinks: [{file: {dir: %s/other-out}}]
`, f.out.url(), f.dir)
	cfgPath := writeBrokerFaultConfig(t, f.dir, brokerFaultConfig{job: "plant", api: f.api, source: f.src.url(),
		clientID: "edged-" + name, qos: 1, extra: first})
	f.col = newCollector()
	f.sub = connect(t, paho.NewClientOptions().AddBroker(f.out.url()).SetClientID(name+"-results").
		SetCleanSession(false).SetAutoReconnect(false).SetOrderMatters(false).SetDefaultPublishHandler(f.col.handle).
		SetConnectionLostHandler(func(paho.Client, error) {}))
	if tok := f.sub.Subscribe("agg/#", 1, f.col.handle); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		f.sub.Disconnect(100)
		t.Fatalf("subscribe: %v", tok.Error())
	}
	f.nd = &node{t: t, cfgPath: cfgPath, logPath: filepath.Join(f.dir, "edged.log"), brokerAddr: f.src.addr, apiAddr: f.api}
	f.nd.readyFn = func(*http.Client) bool { return jobStatus(t, f.nd, "plant") == "running" }
	cleanupNode(t, f.nd)
	f.nd.start()
	testutil.Eventually(t, 30*time.Second, "both subscribers subscribed", func() bool {
		return strings.Count(f.nd.runLog(), "mqtt subscriber subscribed") >= 2
	})
	f.devs = devices(t, f.src.url(), name+"-dev", conns, true)
	return f
}

// publish publishes readings [from, to) and waits until the node has
// taken them.
func (f *sinkFault) publish(from, to int) {
	f.nd.t.Helper()
	l := startLoader(f.w, f.devs, 1, from, to)
	l.wait(f.nd.t, f.nd, 2*time.Minute)
}

// sinkDownAtHalf publishes the first quarter of the readings, kills the
// sink's broker once it has saved their results, publishes up to half and
// waits until a publish of the sink has failed. It returns that half.
func (f *sinkFault) sinkDownAtHalf(t *testing.T) int {
	t.Helper()
	half := f.w.all() / 2
	f.publish(0, half/2)
	f.out.waitSaved()
	f.out.kill()
	f.publish(half/2, half)
	testutil.Eventually(t, time.Minute, "a publish failing while the sink's broker is down", func() bool {
		return strings.Contains(f.nd.runLog(), "publish failed; the results stay held")
	})
	return half
}

// finishExact publishes the readings from from on, checks that the
// consumer got every window exactly, and stops the node, which must exit 0.
func (f *sinkFault) finishExact(t *testing.T, from int) {
	t.Helper()
	f.publish(from, f.w.all())
	waitResults(t, f.col, f.w, 2*time.Minute)
	drain(t, f.out.url(), "agg/_marker", f.col)
	checkExact(t, f.col, f.w)
	if code := f.nd.terminate(30 * time.Second); code != 0 {
		t.Errorf("edged exited %d after SIGTERM, want 0", code)
	}
}

// close disconnects the devices and the consumer.
func (f *sinkFault) close() {
	disconnectAll(f.devs, 100)
	f.sub.Disconnect(100)
}

// jobStatus returns job's status in GET /jobs, or what kept it from
// reading it.
func jobStatus(t *testing.T, nd *node, job string) string {
	t.Helper()
	status, _ := jobAttempts(t, nd, job)
	return status
}

// jobAttempts returns job's status and attempts in GET /jobs, or what
// kept it from reading them (and 0).
func jobAttempts(t *testing.T, nd *node, job string) (string, int) {
	t.Helper()
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get("http://" + nd.apiAddr + "/jobs")
	if err != nil {
		return "unknown (" + err.Error() + ")", 0
	}
	defer resp.Body.Close()
	var l struct {
		Jobs []struct {
			Name     string `json:"name"`
			Status   string `json:"status"`
			Attempts int    `json:"attempts"`
		} `json:"jobs"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&l); err != nil {
		return "unknown (" + err.Error() + ")", 0
	}
	for _, j := range l.Jobs {
		if j.Name == job {
			return j.Status, j.Attempts
		}
	}
	return "not listed", 0
}

// sinkResultsHeld returns the sum of edged_sink_results_held over the
// MQTT sinks of job on nd.
func sinkResultsHeld(t *testing.T, nd *node, job string) int64 {
	t.Helper()
	resp, err := http.Get("http://" + nd.apiAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var sum int64
	found := false
	for _, l := range strings.Split(string(body), "\n") {
		if !strings.HasPrefix(l, `edged_sink_results_held{job="`+job+`",`) {
			continue
		}
		found = true
		f := strings.Fields(l)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			t.Fatalf("edged_sink_results_held line %q: %v", l, err)
		}
		sum += int64(v)
	}
	if !found {
		t.Fatalf("/metrics has no edged_sink_results_held of job %q", job)
	}
	return sum
}
