package test

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/operators/operatorstest"
)

// lateCollector keeps what a consumer that drops repeated msg_ids sees:
// each msg_id's content (the message without its msg_id) once, and every
// msg_id that came with two contents.
type lateCollector struct {
	mu      sync.Mutex
	byID    map[string]string
	bad     []string
	markers map[string]bool
}

func (c *lateCollector) handle(_ paho.Client, m paho.Message) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var obj map[string]any
	if err := json.Unmarshal(m.Payload(), &obj); err != nil {
		c.markers[string(m.Payload())] = true
		return
	}
	id, _ := obj["msg_id"].(string)
	delete(obj, "msg_id")
	b, _ := json.Marshal(obj)
	content := m.Topic() + " " + string(b) // pipelines may have equal results
	if prev, ok := c.byID[id]; ok && prev != string(content) {
		c.bad = append(c.bad, fmt.Sprintf("msg_id %s with two contents: %s and %s", id, prev, content))
	}
	c.byID[id] = content
}

// contents returns the distinct contents, sorted, and fails the test if
// two msg_ids carry one content (a result published twice under two ids).
func (c *lateCollector) contents(t *testing.T) []string {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.bad) > 0 {
		t.Fatalf("%s", strings.Join(c.bad, "\n"))
	}
	seen := map[string]string{}
	for id, v := range c.byID {
		if other, ok := seen[v]; ok {
			t.Errorf("%s under two msg_ids, %s and %s", v, other, id)
		}
		seen[v] = id
	}
	return slices.Sorted(maps.Keys(seen))
}

// TestLateUpdatesExactlyOnceAcrossKillAndSavepoint runs three declared
// pipelines, 10 s tumbling windows, sessions of a 5 s gap and 10 s windows
// sliding by 5 s, each with allowed_lateness 2m: on the embedded broker
// and on Mosquitto at parallelism 1, and on the embedded broker at
// parallelism 2. Readings come in phases, each waiting until the windows'
// watermark is where the next phase needs it, so which reading is on
// time, late within the lateness or later than that is fixed. Late readings within the lateness
// update windows that fired (a new result, a new msg_id); readings past
// the lateness, one from 1970 and one hours ahead of the clock are dead
// letters. edged is SIGKILLed after the first updates and stopped with a
// savepoint and resumed from it later. A consumer that drops repeated
// msg_ids, and the file sink's committed lines, must hold each result and
// each dead letter exactly once, as a plain computation gives them.
func TestLateUpdatesExactlyOnceAcrossKillAndSavepoint(t *testing.T) {
	t.Run("embedded", func(t *testing.T) { lateUpdatesExactlyOnce(t, false, 1, 1) })
	t.Run("mosquitto", func(t *testing.T) { lateUpdatesExactlyOnce(t, true, 1, 1) })
	t.Run("parallelism=2", func(t *testing.T) { lateUpdatesExactlyOnce(t, false, 2, 2) })
}

// TestLateUpdatesExactlyOnceAcrossRescale is
// TestLateUpdatesExactlyOnceAcrossKillAndSavepoint with the pipelines
// resumed from the stop's savepoints at another parallelism (2 to 3, and
// 2 to 1 on the embedded broker; 1 to 2 reading Mosquitto): the late readings after the savepoint update windows that
// fired before it, on a subtask that took the window's key group over;
// a reading for a window still open at the savepoint is on time; those
// past the lateness are dead letters; each once.
func TestLateUpdatesExactlyOnceAcrossRescale(t *testing.T) {
	t.Run("2to3", func(t *testing.T) { lateUpdatesExactlyOnce(t, false, 2, 3) })
	t.Run("2to1", func(t *testing.T) { lateUpdatesExactlyOnce(t, false, 2, 1) })
	t.Run("mosquitto1to2", func(t *testing.T) { lateUpdatesExactlyOnce(t, true, 1, 2) })
}

// lateUpdatesExactlyOnce runs TestLateUpdatesExactlyOnceAcrossKillAndSavepoint
// with the embedded broker, or with a Mosquitto that the pipelines read
// from (each with a persistent session) and publish to, at parallelism
// par: the reading that moves the watermark is sent par times in a row,
// so that every decoding subtask (the source deals the messages round
// robin) reads one. After the stop with savepoints the pipelines resume
// at parallelism resume.
func lateUpdatesExactlyOnce(t *testing.T, mosquitto bool, par, resume int) {
	dir := t.TempDir()
	broker, api := freeAddr(t), freeAddr(t)
	nodeBroker := "\n  broker: " + broker
	if mosquitto {
		broker, nodeBroker = startMosquitto(t), ""
	}
	url := "tcp://" + broker
	t0 := (time.Now().Add(-30*time.Minute).UnixMilli() / 10_000) * 10_000
	windows := map[string]string{
		"tumb": "{type: tumbling, size: 10s",
		"sess": "{type: session, gap: 5s",
		"slid": "{type: sliding, size: 10s, slide: 5s",
	}
	cfgPath := filepath.Join(dir, "edged.yaml")
	writeCfg := func(par int) {
		t.Helper()
		cfg := fmt.Sprintf("node:\n  data_dir: %s/data%s\n  listen: %s\npipelines:\n", dir, nodeBroker, api)
		for _, p := range []string{"tumb", "sess", "slid"} {
			src := ""
			if mosquitto {
				src = fmt.Sprintf("broker: %s, client_id: edged-%s, ", url, p)
			}
			cfg += fmt.Sprintf(`  - name: %[1]s
    parallelism: %[5]d
    source:
      mqtt: {%[3]stopics: [%[1]s/+], format: json, fields: {id: string, v: float, ts: {type: time, unit: ms}}}
    event_time: {field: ts, max_out_of_orderness: 1s}
    key: id
    window: %[4]s, allowed_lateness: 2m, aggregates: [{name: n, fn: count}, {name: s, fn: sum, field: v}]}
    sinks: [{mqtt: {topic: "out/%[1]s/{id}"}}, {file: {dir: %[2]s/out-%[1]s}}]
    checkpoint: {dir: %[2]s/ck-%[1]s, interval: 200ms}
`, p, dir, src, windows[p], par)
		}
		if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	writeCfg(par)
	nd := &node{t: t, cfgPath: cfgPath, logPath: filepath.Join(dir, "edged.log"), brokerAddr: broker, apiAddr: api}
	cleanupNode(t, nd)
	nd.start()

	cl := newLateClients(t, url, "late")
	col := cl.col
	disconnect := cl.disconnect
	cl.connect()
	pipelines := []string{"tumb", "sess", "slid"}
	send := func(id string, v float64, ts int64) {
		t.Helper()
		for _, p := range pipelines {
			body := fmt.Sprintf(`{"id":%q,"v":%g,"ts":%d}`, id, v, ts)
			cl.publish(p+"/"+id, body)
		}
	}
	// waitWM waits until both window operators' watermark is wm.
	waitWM := func(wm int64) {
		t.Helper()
		testutil.Eventually(t, 30*time.Second, fmt.Sprintf("watermark %d", wm), func() bool {
			for _, job := range pipelines {
				p, ok := nd.progress(job)
				if !ok || p.eventTime != wm {
					return false
				}
			}
			return true
		})
	}
	// waitFor waits until the consumer has n distinct results and dead letters.
	waitFor := cl.waitFor
	const s = 1000

	// Phase A: on time. a: 1..9 s (v 1..9), b: 2 s; m at 15 s moves the
	// watermark to 13.999 s: the tumbling window [0,10) fires, and the
	// sessions a [1,14), b [2,7), and c's two, [1,6) and [7.5,12.5).
	for i := int64(1); i <= 9; i++ {
		send("a", float64(i), t0+i*s)
	}
	send("b", 50, t0+2*s)
	send("c", 1, t0+1*s)
	send("c", 2, t0+7500)
	for range par {
		send("m", 7, t0+15*s)
	}
	waitWM(t0 + 13_999)
	waitFor(13, "the first results")
	// Phase B: late within the lateness: each updates its window.
	send("a", 100, t0+5*s)
	waitFor(16, "the first update")
	send("a", 100, t0+5*s) // the same reading again: a second update
	waitFor(19, "the second update")

	nd.kill()
	disconnect()
	nd.start()
	cl.connect()
	// Phase C: after the kill, late within the lateness again, and a
	// kill as soon as the broker took it (in the ingest log, its update
	// not yet published): the restarted node reads it again behind the
	// watermark its checkpoint restored, so it updates the window, once.
	send("a", 1000, t0+3*s)
	nd.kill()
	disconnect()
	nd.start()
	cl.connect()
	waitFor(23, "the update after the kill")

	disconnect()
	// Stopping every pipeline with a savepoint stops the node; tumb
	// resumes from its savepoint, the others from their latest one.
	sp := cliStop(t, nd, "tumb")
	cliStop(t, nd, "sess")
	cliStop(t, nd, "slid")
	if code := nd.waitExit(t, 30*time.Second); code != 0 {
		t.Fatalf("edged exited %d after the stops", code)
	}
	writeCfg(resume)
	nd.start("--from-savepoint", sp)
	nd.checkRestoredFrom(t, sp)
	for _, p := range pipelines {
		nd.checkParallelism(t, p, p+"/window", resume)
	}
	cl.connect()
	// Phase D: after the savepoint, b late within the lateness, and a
	// kill as soon as the broker took it, maybe before the resumed job
	// completed a checkpoint: the node restores from the savepoint, or a
	// checkpoint after it, at the new parallelism, and b updates its
	// windows once. Then c late within the lateness, joining c's two
	// sessions into one; m at 12 s on time, in m's windows still open at
	// the savepoint.
	send("b", 60, t0+4*s)
	nd.kill()
	disconnect()
	nd.start()
	cl.connect()
	waitFor(27, "b's update after the savepoint")
	send("c", 4, t0+4*s)
	send("m", 3, t0+12*s)

	// Phase E: m at 140 s moves the watermark to 138.999 s, past every
	// window's lateness (tumbling 9.999+120 s, session a 13.999+120 s):
	// a at 6 s is a dead letter; so are a reading from 1970 and one two
	// hours ahead of the clock.
	for range resume {
		send("m", 8, t0+140*s)
	}
	waitWM(t0 + 138_999)
	send("a", 5, t0+6*s)
	send("a", 6, 1000)
	send("a", 7, time.Now().Add(2*time.Hour).UnixMilli())

	type res struct {
		p, id  string
		st, en int64
		n      int
		sum    float64
	}
	want := []res{
		{"tumb", "a", t0, t0 + 10*s, 9, 45}, {"tumb", "a", t0, t0 + 10*s, 10, 145}, {"tumb", "a", t0, t0 + 10*s, 11, 245}, {"tumb", "a", t0, t0 + 10*s, 12, 1245},
		{"tumb", "b", t0, t0 + 10*s, 1, 50}, {"tumb", "b", t0, t0 + 10*s, 2, 110},
		{"tumb", "c", t0, t0 + 10*s, 2, 3}, {"tumb", "c", t0, t0 + 10*s, 3, 7},
		{"tumb", "m", t0 + 10*s, t0 + 20*s, par + 1, 7*float64(par) + 3},
		{"sess", "a", t0 + 1*s, t0 + 14*s, 9, 45}, {"sess", "a", t0 + 1*s, t0 + 14*s, 10, 145}, {"sess", "a", t0 + 1*s, t0 + 14*s, 11, 245}, {"sess", "a", t0 + 1*s, t0 + 14*s, 12, 1245},
		{"sess", "b", t0 + 2*s, t0 + 7*s, 1, 50}, {"sess", "b", t0 + 2*s, t0 + 9*s, 2, 110},
		{"sess", "c", t0 + 1*s, t0 + 6*s, 1, 1}, {"sess", "c", t0 + 7500, t0 + 12500, 1, 2}, {"sess", "c", t0 + 1*s, t0 + 12500, 3, 7},
		{"sess", "m", t0 + 12*s, t0 + 20*s, par + 1, 7*float64(par) + 3},
		// Sliding: a late reading fires again the windows of its slice
		// that fired; [5,15) fires once, late readings included.
		{"slid", "a", t0 - 5*s, t0 + 5*s, 4, 10}, {"slid", "a", t0 - 5*s, t0 + 5*s, 5, 1010},
		{"slid", "a", t0, t0 + 10*s, 9, 45}, {"slid", "a", t0, t0 + 10*s, 10, 145}, {"slid", "a", t0, t0 + 10*s, 11, 245}, {"slid", "a", t0, t0 + 10*s, 12, 1245},
		{"slid", "a", t0 + 5*s, t0 + 15*s, 7, 235},
		{"slid", "b", t0 - 5*s, t0 + 5*s, 1, 50}, {"slid", "b", t0 - 5*s, t0 + 5*s, 2, 110},
		{"slid", "b", t0, t0 + 10*s, 1, 50}, {"slid", "b", t0, t0 + 10*s, 2, 110},
		{"slid", "c", t0 - 5*s, t0 + 5*s, 1, 1}, {"slid", "c", t0 - 5*s, t0 + 5*s, 2, 5},
		{"slid", "c", t0, t0 + 10*s, 2, 3}, {"slid", "c", t0, t0 + 10*s, 3, 7}, {"slid", "c", t0 + 5*s, t0 + 15*s, 1, 2},
		{"slid", "m", t0 + 5*s, t0 + 15*s, 1, 3},
		{"slid", "m", t0 + 10*s, t0 + 20*s, par + 1, 7*float64(par) + 3}, {"slid", "m", t0 + 15*s, t0 + 25*s, par, 7 * float64(par)},
	}
	var wantLines []string
	wantOf := map[string][]string{}
	for _, r := range want {
		l := fmt.Sprintf(`{"id":%q,"n":%d,"s":%g,"window_end":%d,"window_start":%d}`, r.id, r.n, r.sum, r.en, r.st)
		wantLines = append(wantLines, "out/"+r.p+"/"+r.id+" "+l)
		wantOf[r.p] = append(wantOf[r.p], l)
	}
	// The results and 3 dead letters per pipeline. Then a kill once they
	// are out (a kill before would replay m and a at 6 s with the
	// checkpoint's older watermark, and a would update the windows: in a
	// declared pipeline which readings are late after a restore depends
	// on when the periodic watermarks went out); the restarted node must
	// publish none of them under another msg_id.
	waitFor(len(want)+9, "every result and dead letter")
	// This run read the three (it started from the savepoint before them).
	resp, err := http.Get("http://" + api + "/jobs")
	if err != nil {
		t.Fatal(err)
	}
	var jobs struct {
		Jobs []struct {
			Name        string `json:"name"`
			DeadLetters int64  `json:"dead_letters"`
		} `json:"jobs"`
	}
	err = json.NewDecoder(resp.Body).Decode(&jobs)
	resp.Body.Close()
	if err != nil || len(jobs.Jobs) != 3 {
		t.Fatalf("GET /jobs: %v %+v", err, jobs)
	}
	for _, j := range jobs.Jobs {
		if j.DeadLetters != 3 {
			t.Errorf("GET /jobs: %s counted %d dead letters, want 3", j.Name, j.DeadLetters)
		}
	}
	nd.kill()
	disconnect()
	nd.start()
	cl.connect()
	drainLate(t, url, col)
	got := col.contents(t)
	var gotResults, gotDead []string
	for _, c := range got {
		if strings.Contains(c, `"error"`) {
			gotDead = append(gotDead, c)
		} else {
			gotResults = append(gotResults, c)
		}
	}
	slices.Sort(wantLines)
	if !slices.Equal(gotResults, wantLines) {
		t.Errorf("results over MQTT:\n%s\nwant:\n%s", strings.Join(gotResults, "\n"), strings.Join(wantLines, "\n"))
	}
	if len(gotDead) != 9 {
		t.Errorf("%d dead letters over MQTT, want 9 (3 per pipeline):\n%s", len(gotDead), strings.Join(gotDead, "\n"))
	}
	for _, p := range pipelines {
		lines, err := operatorstest.CommittedLines(filepath.Join(dir, "out-"+p, "windows"))
		if err != nil {
			t.Fatal(err)
		}
		for what, n := range map[string]int{"dead-letter-late": 2, "dead-letter": 1} {
			dl, err := operatorstest.CommittedLines(filepath.Join(dir, "out-"+p, what))
			if err != nil {
				t.Fatal(err)
			}
			if len(dl) != n {
				t.Errorf("%s: the file sink committed %d lines to %s, want %d:\n%s", p, len(dl), what, n, strings.Join(dl, "\n"))
			}
		}
		wantP := slices.Sorted(slices.Values(wantOf[p]))
		if got := normalise(t, lines); !slices.Equal(got, wantP) {
			t.Errorf("%s: file sink committed:\n%s\nwant:\n%s", p, strings.Join(got, "\n"), strings.Join(wantP, "\n"))
		}
	}
}

// normalise re-encodes JSON lines with sorted keys.
func normalise(t *testing.T, lines []string) []string {
	var out []string
	for _, l := range lines {
		var obj map[string]any
		if err := json.Unmarshal([]byte(l), &obj); err != nil {
			t.Fatalf("%q: %v", l, err)
		}
		b, _ := json.Marshal(obj)
		out = append(out, string(b))
	}
	slices.Sort(out)
	return out
}

// drainLate publishes a marker that the consumer's subscription matches
// and waits until it arrives: everything queued for it before is then in.
func drainLate(t *testing.T, url string, col *lateCollector) {
	t.Helper()
	marker := fmt.Sprintf("marker-%d", time.Now().UnixNano())
	c := connect(t, paho.NewClientOptions().AddBroker(url).SetClientID("late-drain").SetAutoReconnect(false))
	defer c.Disconnect(100)
	if tok := c.Publish("out/marker", 1, false, marker); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("publish marker: %v", tok.Error())
	}
	testutil.Eventually(t, 30*time.Second, "the marker", func() bool {
		col.mu.Lock()
		defer col.mu.Unlock()
		return col.markers[marker]
	})
}

// lateClients are the consumer and the device of the lateness tests: the
// consumer a persistent session on out/# and deadletter/# that collects
// what it receives into col, the device publishing readings at QoS 1.
type lateClients struct {
	t        *testing.T
	url      string
	id       string // the client ids are id-results and id-device
	col      *lateCollector
	sub, pub paho.Client
}

// newLateClients returns the lateness tests' clients for the broker at
// url, not connected yet.
func newLateClients(t *testing.T, url, id string) *lateClients {
	return &lateClients{t: t, url: url, id: id, col: &lateCollector{byID: map[string]string{}, markers: map[string]bool{}}}
}

// connect connects the consumer (resuming its session) and the device.
func (c *lateClients) connect() {
	c.sub = connect(c.t, paho.NewClientOptions().AddBroker(c.url).SetClientID(c.id+"-results").
		SetCleanSession(false).SetAutoReconnect(false).SetOrderMatters(false).SetDefaultPublishHandler(c.col.handle))
	for _, f := range []string{"out/#", "deadletter/#"} {
		if tok := c.sub.Subscribe(f, 1, c.col.handle); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
			c.t.Fatalf("subscribe: %v", tok.Error())
		}
	}
	c.pub = connect(c.t, paho.NewClientOptions().AddBroker(c.url).SetClientID(c.id+"-device").SetAutoReconnect(false))
}

// disconnect disconnects the device and the consumer.
func (c *lateClients) disconnect() {
	c.pub.Disconnect(100)
	c.sub.Disconnect(100)
}

// publish publishes body to topic from the device and waits for its
// acknowledgement.
func (c *lateClients) publish(topic, body string) {
	c.t.Helper()
	if tok := c.pub.Publish(topic, 1, false, body); !tok.WaitTimeout(20*time.Second) || tok.Error() != nil {
		c.t.Fatalf("publish %s: %v", body, tok.Error())
	}
}

// waitFor waits until the consumer has n distinct results and dead
// letters.
func (c *lateClients) waitFor(n int, what string) {
	c.t.Helper()
	testutil.Eventually(c.t, 30*time.Second, what, func() bool {
		c.col.mu.Lock()
		defer c.col.mu.Unlock()
		return len(c.col.byID) >= n
	})
}
