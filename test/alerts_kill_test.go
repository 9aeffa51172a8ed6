package test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/operators"
)

// The alerts workload: alertSensors sensors send a reading every
// alertStepMS of event time, hot (40) or cold (20) in stretches, with a
// cold reading now and then inside a hot stretch, and gaps longer than
// the silent duration, and now and then two readings of one sensor with
// the same time, one hot and one cold.
const (
	alertSensors = 20
	alertSteps   = 600
	alertStepMS  = 100
	alertForMS   = 2000
	alertSilent  = 3000
	alertOOOMS   = 1000
	alertBatch   = 200 // readings published before waiting for their PUBACKs
)

type alertReading struct {
	id   string
	temp float64
	ts   int64
}

// alertReadings returns the readings in the order they are published:
// event-time order, shuffled within blocks of 3 steps (300 ms, well within
// max_out_of_orderness), then readings of sensor zz far ahead that move
// the watermark past every other reading's alerts.
func alertReadings() []alertReading {
	rng := rand.New(rand.NewPCG(7, 11))
	var rs []alertReading
	for k := range alertSensors {
		id := fmt.Sprintf("s%02d", k)
		hot, gapUntil := false, -1
		for i := range alertSteps {
			if i < gapUntil {
				continue
			}
			if rng.Float64() < 0.004 {
				gapUntil = i + 20 + rng.IntN(40)
				continue
			}
			if rng.Float64() < 0.03 {
				hot = !hot
			}
			temp := 20.0
			if hot {
				temp = 40
				if rng.Float64() < 0.02 {
					temp = 21
				}
			}
			ts := epochMS + int64(i*alertStepMS)
			rs = append(rs, alertReading{id, temp, ts})
			if rng.Float64() < 0.03 {
				// A second reading of the same time, hot if this one
				// is cold and cold if it is hot.
				rs = append(rs, alertReading{id, 60 - temp, ts})
			}
		}
	}
	sort.SliceStable(rs, func(i, j int) bool { return rs[i].ts < rs[j].ts })
	block := 3 * alertSensors
	for at := 0; at < len(rs); at += block {
		b := rs[at:min(at+block, len(rs))]
		rng.Shuffle(len(b), func(i, j int) { b[i], b[j] = b[j], b[i] })
	}
	flush := epochMS + int64(alertSteps*alertStepMS) + 10_000
	for range 4 {
		rs = append(rs, alertReading{"zz", 0, flush})
	}
	return rs
}

// alertReference computes the alerts of rs from the README's semantics:
// per key in event-time order, the readings of one time together; an
// alert fires once `when` (temp > 38) held from since to since+for, a
// silent key once it had no reading for the silent duration; each fires
// when the watermark (the largest time less max_out_of_orderness and
// 1 ms) passes its at.
func alertReference(rs []alertReading) []string {
	byKey := map[string]map[int64][]float64{}
	var maxTS int64
	for _, r := range rs {
		if byKey[r.id] == nil {
			byKey[r.id] = map[int64][]float64{}
		}
		byKey[r.id][r.ts] = append(byKey[r.id][r.ts], r.temp)
		maxTS = max(maxTS, r.ts)
	}
	wm := maxTS - alertOOOMS - 1
	var out []string
	emit := func(id, name string, since, at int64) {
		out = append(out, fmt.Sprintf(`{"id":%q,"alert":%q,"since":%d,"at":%d}`, id, name, since, at))
	}
	for id, groups := range byKey {
		var active, fired, seen, silentFired bool
		var since, last int64
		due := func(now int64) {
			if active && !fired && now >= since+alertForMS {
				emit(id, "hot", since, since+alertForMS)
				fired = true
			}
			if seen && !silentFired && now >= last+alertSilent {
				emit(id, "silent", last, last+alertSilent)
				silentFired = true
			}
		}
		times := make([]int64, 0, len(groups))
		for ts := range groups {
			times = append(times, ts)
		}
		slices.Sort(times)
		for _, ts := range times {
			due(ts)
			allHot, anyCold := true, false
			for _, temp := range groups[ts] {
				allHot = allHot && temp > 38
				anyCold = anyCold || temp <= 38
			}
			switch {
			case anyCold:
				active, fired = false, false
			case allHot && !active:
				active, fired, since = true, false, ts
			}
			last, seen, silentFired = ts, true, false
		}
		due(wm)
	}
	slices.Sort(out)
	return out
}

// alertCollector keeps the alerts a consumer received: each element of a
// batched message, by msg_id.
type alertCollector struct {
	mu       sync.Mutex
	byMsgID  map[string]string // msg_id -> the result without it
	idsOf    map[string]map[string]bool
	elements int
	bad      []string
	markers  map[string]bool
}

func (c *alertCollector) handle(_ paho.Client, m paho.Message) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if strings.HasSuffix(m.Topic(), "/_marker") {
		c.markers[string(m.Payload())] = true
		return
	}
	var arr []map[string]any
	if err := json.Unmarshal(m.Payload(), &arr); err != nil {
		c.bad = append(c.bad, fmt.Sprintf("%s: %s: %v", m.Topic(), m.Payload(), err))
		return
	}
	for _, o := range arr {
		c.elements++
		id, _ := o["msg_id"].(string)
		if id == "" {
			c.bad = append(c.bad, fmt.Sprintf("element without msg_id: %v", o))
			continue
		}
		// The result as the file sink writes it: its fields in order.
		res := fmt.Sprintf(`{"id":%q,"alert":%q,"since":%s,"at":%s}`, o["id"], o["alert"],
			strconv.FormatFloat(o["since"].(float64), 'f', -1, 64), strconv.FormatFloat(o["at"].(float64), 'f', -1, 64))
		if prev, ok := c.byMsgID[id]; ok && prev != res {
			c.bad = append(c.bad, fmt.Sprintf("msg_id %s with two results: %s and %s", id, prev, res))
		}
		c.byMsgID[id] = res
		if c.idsOf[res] == nil {
			c.idsOf[res] = map[string]bool{}
		}
		c.idsOf[res][id] = true
	}
}

func (c *alertCollector) results() map[string]bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]bool, len(c.idsOf))
	for r := range c.idsOf {
		out[r] = true
	}
	return out
}

// committedLines returns the lines of the file sink's committed parts.
func committedLines(t *testing.T, dir string) []string {
	t.Helper()
	parts, err := operators.CommittedParts(dir)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var lines []string
	for _, p := range parts {
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			lines = append(lines, sc.Text())
		}
		f.Close()
	}
	return lines
}

// TestAlertsExactlyOnceAcrossKills runs a pipeline of alerts (a condition
// held for 2 s) and silent keys (3 s) at parallelism 2, its readings a
// little out of order, publishing its results batched to MQTT through the
// write-ahead sink and to a file sink, and SIGKILLs it twice mid-stream
// (alerts half-way through their duration, keys silent), restarting it
// each time, and between the kills stops it with a savepoint (edged stop)
// and resumes from that at parallelism 3. A consumer that drops repeated msg_ids, and the committed
// files, must hold exactly the alerts a plain computation of the README's
// semantics gives.
func TestAlertsExactlyOnceAcrossKills(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with a subprocess")
	}
	dir := t.TempDir()
	data, out := filepath.Join(dir, "data"), filepath.Join(dir, "out")
	n := &node{t: t, brokerAddr: freeAddr(t), apiAddr: freeAddr(t), logPath: filepath.Join(dir, "edged.log")}
	cfg := fmt.Sprintf(`node:
  data_dir: %[1]s
  broker: %[2]s
  listen: %[3]s
pipelines:
  - name: al
    parallelism: 2
    source:
      mqtt:
        topics: [sensors/+/temperature]
        format: json
        fields:
          id: {type: string, path: $.sensor}
          temp: {type: float, path: $.t}
          ts: {type: time, path: $.ts, unit: ms}
    event_time: {field: ts, max_out_of_orderness: %[5]dms}
    key: id
    alerts: [{name: hot, when: temp > 38, for: %[6]dms}]
    silent: {for: %[7]dms}
    sinks:
      - mqtt: {topic: "alerts/all", batch: 5}
      - file: {dir: %[4]s}
    checkpoint: {dir: %[1]s/checkpoints, interval: 300ms}
`, data, n.brokerAddr, n.apiAddr, out, alertOOOMS, alertForMS, alertSilent)
	n.cfgPath = filepath.Join(dir, "edged.yaml")
	if err := os.WriteFile(n.cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	cleanupNode(t, n)

	rs := alertReadings()
	want := alertReference(rs)
	if len(want) < 100 {
		t.Fatalf("only %d alerts in the reference: choose other data", len(want))
	}
	url := "tcp://" + n.brokerAddr
	col := &alertCollector{byMsgID: map[string]string{}, idsOf: map[string]map[string]bool{}, markers: map[string]bool{}}
	consumer := func() paho.Client {
		c := connect(t, paho.NewClientOptions().AddBroker(url).SetClientID("e2e-alerts").
			SetCleanSession(false).SetAutoReconnect(false).SetDefaultPublishHandler(col.handle))
		if tok := c.Subscribe("alerts/#", 1, col.handle); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
			t.Fatalf("subscribe: %v", tok.Error())
		}
		return c
	}
	publisher := func() paho.Client {
		return connect(t, paho.NewClientOptions().AddBroker(url).SetClientID("e2e-alert-devices").
			SetCleanSession(true).SetAutoReconnect(false))
	}

	n.start()
	sub, pub := consumer(), publisher()
	defer func() {
		sub.Disconnect(100)
		pub.Disconnect(100)
	}()
	batches := (len(rs) + alertBatch - 1) / alertBatch
	// After batch b: SIGKILL, or stop with a savepoint and resume from it
	// at parallelism 3.
	action := map[int]string{batches / 4: "kill", batches / 2: "rescale", 3 * batches / 4: "kill"}
	for b := 0; b*alertBatch < len(rs); b++ {
		batch := rs[b*alertBatch : min((b+1)*alertBatch, len(rs))]
		toks := make([]paho.Token, len(batch))
		for i, r := range batch {
			toks[i] = pub.Publish("sensors/"+r.id+"/temperature", 1, false,
				fmt.Sprintf(`{"sensor":%q,"t":%g,"ts":%d}`, r.id, r.temp, r.ts))
		}
		for _, tok := range toks {
			if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
				t.Fatalf("publish: %v", tok.Error())
			}
		}
		if action[b] == "" {
			continue
		}
		// Kill once this run has published results (so a checkpoint of
		// it completed) while the alerts of the readings just sent are
		// pending: every reading is acknowledged, so none is sent twice.
		before := len(col.results())
		testutil.Eventually(t, 60*time.Second, "results published in this run", func() bool { return len(col.results()) > before })
		sub.Disconnect(0)
		pub.Disconnect(0)
		if action[b] == "kill" {
			n.kill()
			t.Logf("killed edged after %d readings, %d alerts received", (b+1)*alertBatch, len(col.results()))
			n.start()
		} else {
			sp := cliStop(t, n, "al")
			if code := n.waitExit(t, 60*time.Second); code != 0 {
				t.Fatalf("edged exited %d after edged stop", code)
			}
			if err := os.WriteFile(n.cfgPath, []byte(strings.Replace(cfg, "parallelism: 2", "parallelism: 3", 1)), 0o644); err != nil {
				t.Fatal(err)
			}
			t.Logf("stopped edged with a savepoint after %d readings, %d alerts received; resuming at parallelism 3", (b+1)*alertBatch, len(col.results()))
			n.start("--from-savepoint", sp)
		}
		sub, pub = consumer(), publisher()
	}

	if !testutil.Within(60*time.Second, func() bool {
		got := col.results()
		for _, w := range want {
			if !got[w] {
				return false
			}
		}
		return len(committedLines(t, filepath.Join(out, "alerts"))) >= len(want)
	}) {
		got := col.results()
		for _, w := range want {
			if !got[w] {
				t.Errorf("alert of the reference not received: %s", w)
			}
		}
		t.Fatalf("after 60 s: %d of the %d alerts of the reference received, %d lines committed",
			len(got), len(want), len(committedLines(t, filepath.Join(out, "alerts"))))
	}
	// A marker behind the alerts: once it is in, every duplicate the
	// broker had queued for the consumer has arrived.
	marker := strconv.FormatInt(time.Now().UnixNano(), 10)
	if tok := pub.Publish("alerts/_marker", 1, false, marker); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("publish marker: %v", tok.Error())
	}
	testutil.Eventually(t, 30*time.Second, "the marker behind the alerts", func() bool {
		col.mu.Lock()
		defer col.mu.Unlock()
		return col.markers[marker]
	})

	col.mu.Lock()
	defer col.mu.Unlock()
	for _, b := range col.bad {
		t.Error(b)
	}
	wantSet := map[string]bool{}
	for _, w := range want {
		wantSet[w] = true
	}
	for r, ids := range col.idsOf {
		if !wantSet[r] {
			t.Errorf("alert not in the reference: %s", r)
		}
		if len(ids) > 1 {
			t.Errorf("alert under %d msg_ids: %s", len(ids), r)
		}
	}
	lines := committedLines(t, filepath.Join(out, "alerts"))
	slices.Sort(lines)
	if !slices.Equal(lines, want) {
		t.Errorf("committed files hold %d lines, want the %d alerts of the reference once each", len(lines), len(want))
		for i, l := range lines {
			if !wantSet[l] || (i > 0 && lines[i-1] == l) {
				t.Errorf("  committed, not in the reference or twice: %s", l)
			}
		}
	}
	t.Logf("%d alerts (%d silent) exact over MQTT (%d elements received) and in the files, across 2 kills and a rescale",
		len(want), strings.Count(strings.Join(want, "\n"), `"silent"`), col.elements)
}
