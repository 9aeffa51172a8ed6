package test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgedio/edged/internal/testutil"
)

// TestIdleWatermarkAcrossSavepoint: a declared pipeline at parallelism 2
// with idle_timeout, whose decoding subtasks went idle at different
// watermarks, so that its windows fired up to the larger one. A reading
// for a window that fired is a late dead letter before a stop with a
// savepoint and after the resume from it (at the same parallelism and at
// another), never a second result of that window.
func TestIdleWatermarkAcrossSavepoint(t *testing.T) {
	for _, resume := range []int{2, 3} {
		t.Run(fmt.Sprintf("resume=%d", resume), func(t *testing.T) { idleWatermarkAcrossSavepoint(t, resume) })
	}
}

func idleWatermarkAcrossSavepoint(t *testing.T, resume int) {
	dir := t.TempDir()
	broker, api := freeAddr(t), freeAddr(t)
	url := "tcp://" + broker
	cfgPath := filepath.Join(dir, "edged.yaml")
	writeCfg := func(par int) {
		cfg := fmt.Sprintf(`node:
  data_dir: %[1]s/data
  broker: %[2]s
  listen: %[3]s
pipelines:
  - name: idle
    parallelism: %[4]d
    source:
      mqtt: {topics: [idle/+], format: json, fields: {id: string, v: float, ts: {type: time, unit: ms}}}
    event_time: {field: ts, max_out_of_orderness: 1s, idle_timeout: 1s}
    key: id
    window: {type: tumbling, size: 1s, aggregates: [{name: n, fn: count}, {name: s, fn: sum, field: v}]}
    sinks: [{mqtt: {topic: "out/{id}"}}]
    checkpoint: {dir: %[1]s/ck, interval: 200ms}
`, dir, broker, api, par)
		if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	writeCfg(2)
	nd := &node{t: t, cfgPath: cfgPath, logPath: filepath.Join(dir, "edged.log"), brokerAddr: broker, apiAddr: api}
	cleanupNode(t, nd)
	nd.start()
	cl := newLateClients(t, url, "idle")
	col := cl.col
	cl.connect()
	send := func(id string, v float64, ts int64) {
		t.Helper()
		body := fmt.Sprintf(`{"id":%q,"v":%g,"ts":%d}`, id, v, ts)
		cl.publish("idle/"+id, body)
	}
	waitFor := cl.waitFor
	wm := func() int64 {
		p, _ := nd.progress("idle")
		return p.eventTime
	}
	t0 := (time.Now().Add(-30*time.Minute).UnixMilli() / 10_000) * 10_000
	// One decoding subtask reads k at 0.1 s, the other m at 10 s: once
	// both are idle the windows are at 8.999 s and k's window [0,1) fires.
	send("k", 1, t0+100)
	send("m", 2, t0+10_000)
	waitFor(1, "k's window")
	t.Logf("watermark %d ms after t0", wm()-t0)
	// k at 0.3 s is late: a dead letter.
	send("k", 3, t0+300)
	waitFor(2, "the first dead letter")
	t.Logf("watermark %d ms after t0", wm()-t0)
	cl.disconnect()
	sp := cliStop(t, nd, "idle")
	if code := nd.waitExit(t, 30*time.Second); code != 0 {
		t.Fatalf("edged exited %d after the stop", code)
	}
	writeCfg(resume)
	nd.start("--from-savepoint", sp)
	cl.connect()
	t.Logf("watermark after the resume %d ms after t0", wm()-t0)
	// k at 0.2 s is as late as before the stop.
	send("k", 5, t0+200)
	waitFor(3, "the second dead letter")
	t.Logf("watermark %d ms after t0", wm()-t0)
	drainLate(t, url, col)
	got := col.contents(t)
	var results, dead []string
	for _, c := range got {
		if strings.Contains(c, `"error"`) {
			dead = append(dead, c)
		} else {
			results = append(results, c)
		}
	}
	want := []string{fmt.Sprintf(`out/k {"id":"k","n":1,"s":1,"window_end":%d,"window_start":%d}`, t0+1000, t0)}
	if !slices.Equal(results, want) || len(dead) != 2 {
		t.Errorf("results:\n%s\nwant:\n%s\ndead letters (want 2):\n%s", strings.Join(results, "\n"), strings.Join(want, "\n"), strings.Join(dead, "\n"))
	}
}

// TestLateUpdateThatChangesNoAggregate: with allowed lateness and only a
// max aggregate, a late reading below the window's max fires the window
// again with the result it had, under the msg_id it had: a consumer that
// drops repeated msg_ids sees no second result; a late reading that moves
// the max is a new result under a new msg_id.
func TestLateUpdateThatChangesNoAggregate(t *testing.T) {
	dir := t.TempDir()
	broker, api := freeAddr(t), freeAddr(t)
	url := "tcp://" + broker
	cfgPath := filepath.Join(dir, "edged.yaml")
	cfg := fmt.Sprintf(`node:
  data_dir: %[1]s/data
  broker: %[2]s
  listen: %[3]s
pipelines:
  - name: mx
    source:
      mqtt: {topics: [mx/+], format: json, fields: {id: string, v: float, ts: {type: time, unit: ms}}}
    event_time: {field: ts, max_out_of_orderness: 1s}
    key: id
    window: {type: tumbling, size: 1s, allowed_lateness: 1m, aggregates: [{name: mx, fn: max, field: v}]}
    sinks: [{mqtt: {topic: "out/{id}"}}]
    checkpoint: {dir: %[1]s/ck, interval: 200ms}
`, dir, broker, api)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	nd := &node{t: t, cfgPath: cfgPath, logPath: filepath.Join(dir, "edged.log"), brokerAddr: broker, apiAddr: api}
	cleanupNode(t, nd)
	nd.start()
	col := &lateCollector{byID: map[string]string{}, markers: map[string]bool{}}
	var mu sync.Mutex
	var raw []string
	handle := func(c paho.Client, m paho.Message) {
		mu.Lock()
		raw = append(raw, string(m.Payload()))
		mu.Unlock()
		col.handle(c, m)
	}
	sub := connect(t, paho.NewClientOptions().AddBroker(url).SetClientID("mx-results").
		SetCleanSession(false).SetAutoReconnect(false).SetOrderMatters(false).SetDefaultPublishHandler(handle))
	defer sub.Disconnect(100)
	if tok := sub.Subscribe("out/#", 1, handle); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	pub := connect(t, paho.NewClientOptions().AddBroker(url).SetClientID("mx-device").SetAutoReconnect(false))
	defer pub.Disconnect(100)
	send := func(id string, v float64, ts int64) {
		t.Helper()
		body := fmt.Sprintf(`{"id":%q,"v":%g,"ts":%d}`, id, v, ts)
		if tok := pub.Publish("mx/"+id, 1, false, body); !tok.WaitTimeout(20*time.Second) || tok.Error() != nil {
			t.Fatalf("publish %s: %v", body, tok.Error())
		}
	}
	rawCount := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(raw)
	}
	t0 := (time.Now().Add(-30*time.Minute).UnixMilli() / 10_000) * 10_000
	send("k", 5, t0+100)
	send("m", 1, t0+5000) // the watermark at 3.999 s: k's window [0,1) fires
	testutil.Eventually(t, 30*time.Second, "k's window", func() bool { return rawCount() >= 1 })
	send("k", 3, t0+200) // late, within the lateness; max stays 5
	send("k", 7, t0+300) // late, within the lateness; max 7
	testutil.Eventually(t, 30*time.Second, "k's window with max 7", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return slices.ContainsFunc(raw, func(s string) bool { return strings.Contains(s, `"mx":7`) })
	})
	drainLate(t, url, col)
	mu.Lock()
	t.Logf("published: %s", strings.Join(raw, " "))
	mu.Unlock()
	got := col.contents(t)
	want := []string{
		fmt.Sprintf(`out/k {"id":"k","mx":5,"window_end":%d,"window_start":%d}`, t0+1000, t0),
		fmt.Sprintf(`out/k {"id":"k","mx":7,"window_end":%d,"window_start":%d}`, t0+1000, t0),
	}
	if !slices.Equal(got, want) {
		t.Errorf("results by msg_id:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestSessionCleanedUpAfterARescale: a session fires, its job is stopped
// with a savepoint before the session's lateness passed and resumed at
// another parallelism; once the watermark passes the session's end plus
// the lateness the restored subtask cleans it up, so a reading within gap
// of its last reading opens a session of its own (README: "A session
// whose lateness has passed is gone") rather than joining the old one.
func TestSessionCleanedUpAfterARescale(t *testing.T) {
	for _, resume := range []int{1, 3} {
		t.Run(fmt.Sprintf("2to%d", resume), func(t *testing.T) { sessionCleanedUpAfterARescale(t, resume) })
	}
}

func sessionCleanedUpAfterARescale(t *testing.T, resume int) {
	dir := t.TempDir()
	broker, api := freeAddr(t), freeAddr(t)
	url := "tcp://" + broker
	cfgPath := filepath.Join(dir, "edged.yaml")
	writeCfg := func(par int) {
		cfg := fmt.Sprintf(`node:
  data_dir: %[1]s/data
  broker: %[2]s
  listen: %[3]s
pipelines:
  - name: ses
    parallelism: %[4]d
    source:
      mqtt: {topics: [ses/+], format: json, fields: {id: string, v: float, ts: {type: time, unit: ms}}}
    event_time: {field: ts, max_out_of_orderness: 1s}
    key: id
    window: {type: session, gap: 5s, allowed_lateness: 10s, aggregates: [{name: n, fn: count}, {name: s, fn: sum, field: v}]}
    sinks: [{mqtt: {topic: "out/{id}"}}]
    checkpoint: {dir: %[1]s/ck, interval: 200ms}
`, dir, broker, api, par)
		if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	writeCfg(2)
	nd := &node{t: t, cfgPath: cfgPath, logPath: filepath.Join(dir, "edged.log"), brokerAddr: broker, apiAddr: api}
	cleanupNode(t, nd)
	nd.start()
	cl := newLateClients(t, url, "ses")
	col := cl.col
	cl.connect()
	send := func(id string, v float64, ts int64) {
		t.Helper()
		body := fmt.Sprintf(`{"id":%q,"v":%g,"ts":%d}`, id, v, ts)
		cl.publish("ses/"+id, body)
	}
	waitWM := func(wm int64) {
		t.Helper()
		testutil.Eventually(t, 30*time.Second, fmt.Sprintf("watermark %d", wm), func() bool {
			p, ok := nd.progress("ses")
			return ok && p.eventTime == wm
		})
	}
	waitFor := cl.waitFor
	const s = 1000
	t0 := (time.Now().Add(-30*time.Minute).UnixMilli() / 10_000) * 10_000
	// a's session [1,7) fires at the watermark 9.999 s; its lateness
	// passes at 16.999 s.
	send("a", 1, t0+1*s)
	send("a", 2, t0+2*s)
	for range 2 {
		send("m", 0, t0+11*s)
	}
	waitWM(t0 + 9_999)
	waitFor(1, "a's session")
	cl.disconnect()
	sp := cliStop(t, nd, "ses")
	if code := nd.waitExit(t, 30*time.Second); code != 0 {
		t.Fatalf("edged exited %d after the stop", code)
	}
	writeCfg(resume)
	nd.start("--from-savepoint", sp)
	nd.checkParallelism(t, "ses", "ses/window", resume)
	cl.connect()
	// The watermark at 19.999 s: a's session is gone.
	for range resume {
		send("m", 0, t0+21*s)
	}
	waitWM(t0 + 19_999)
	// a at 6.5 s is within gap of a's last reading, and its own window
	// [6.5,11.5) is within the lateness: a session of its own, fired at
	// once.
	send("a", 4, t0+6500)
	waitFor(3, "a's new session")
	drainLate(t, url, col)
	got := col.contents(t)
	want := []string{
		fmt.Sprintf(`out/a {"id":"a","n":1,"s":4,"window_end":%d,"window_start":%d}`, t0+11500, t0+6500),
		fmt.Sprintf(`out/a {"id":"a","n":2,"s":3,"window_end":%d,"window_start":%d}`, t0+7*s, t0+1*s),
		fmt.Sprintf(`out/m {"id":"m","n":2,"s":0,"window_end":%d,"window_start":%d}`, t0+16*s, t0+11*s),
	}
	if !slices.Equal(got, want) {
		t.Errorf("results:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestAlertsLateReadingsAfterARescale: alerts at parallelism 2 look at a
// key's readings up to 3 s; the job is stopped with a savepoint and
// resumed at parallelism 3. Readings of the key behind the watermark then
// are looked at on arrival when they come after the latest reading the
// alerts looked at (an alert held from 4 s fires once), and are dead
// letters when they do not (at 2.5 s, and at 3.5 s once 6.5 s was looked
// at), as the README says of late readings to alerts.
func TestAlertsLateReadingsAfterARescale(t *testing.T) {
	dir := t.TempDir()
	broker, api := freeAddr(t), freeAddr(t)
	url := "tcp://" + broker
	cfgPath := filepath.Join(dir, "edged.yaml")
	writeCfg := func(par int) {
		cfg := fmt.Sprintf(`node:
  data_dir: %[1]s/data
  broker: %[2]s
  listen: %[3]s
pipelines:
  - name: al
    parallelism: %[4]d
    source:
      mqtt: {topics: [al/+], format: json, fields: {id: string, temp: float, ts: {type: time, unit: ms}}}
    event_time: {field: ts, max_out_of_orderness: 1s}
    key: id
    alerts: [{name: hot, when: temp > 38, for: 2s}]
    sinks: [{mqtt: {topic: "out/{id}"}}]
    checkpoint: {dir: %[1]s/ck, interval: 200ms}
`, dir, broker, api, par)
		if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	writeCfg(2)
	nd := &node{t: t, cfgPath: cfgPath, logPath: filepath.Join(dir, "edged.log"), brokerAddr: broker, apiAddr: api}
	cleanupNode(t, nd)
	nd.start()
	cl := newLateClients(t, url, "al")
	col := cl.col
	cl.connect()
	send := func(id string, temp float64, ts int64) {
		t.Helper()
		body := fmt.Sprintf(`{"id":%q,"temp":%g,"ts":%d}`, id, temp, ts)
		cl.publish("al/"+id, body)
	}
	// waitWM waits until every subtask of the alerts operator is at wm.
	waitWM := func(wm int64) {
		t.Helper()
		testutil.Eventually(t, 30*time.Second, fmt.Sprintf("the alerts' watermark %d", wm), func() bool {
			ts, err := nd.tasks("al")
			if err != nil {
				return false
			}
			n := 0
			for _, ti := range ts {
				if slices.Contains(ti.Operators, "al/alerts") {
					if ti.Watermark == nil || *ti.Watermark != wm {
						return false
					}
					n++
				}
			}
			return n > 0
		})
	}
	waitFor := cl.waitFor
	const s = 1000
	t0 := (time.Now().Add(-30*time.Minute).UnixMilli() / 10_000) * 10_000
	for i := int64(1); i <= 3; i++ {
		send("a", 20, t0+i*s)
	}
	for range 2 {
		send("m", 20, t0+10*s)
	}
	waitWM(t0 + 8_999)
	cl.disconnect()
	// A checkpoint after the watermark reached 8.999 s holds a's readings
	// looked at: the savepoint does.
	sp := cliStop(t, nd, "al")
	if code := nd.waitExit(t, 30*time.Second); code != 0 {
		t.Fatalf("edged exited %d after the stop", code)
	}
	writeCfg(3)
	nd.start("--from-savepoint", sp)
	nd.checkParallelism(t, "al", "al/alerts", 3)
	cl.connect()
	send("a", 40, t0+2500) // behind a's latest (3 s): a dead letter
	waitFor(1, "the first dead letter")
	send("a", 40, t0+4*s)
	send("a", 40, t0+5*s)
	send("a", 40, t0+6500)
	waitFor(2, "the alert")
	send("a", 20, t0+3500) // behind a's latest (6.5 s): a dead letter
	waitFor(3, "the second dead letter")
	drainLate(t, url, col)
	got := col.contents(t)
	var results, dead []string
	for _, c := range got {
		if strings.Contains(c, `"error"`) {
			dead = append(dead, c)
		} else {
			results = append(results, c)
		}
	}
	want := []string{fmt.Sprintf(`out/a {"alert":"hot","at":%d,"id":"a","since":%d}`, t0+6*s, t0+4*s)}
	if !slices.Equal(results, want) || len(dead) != 2 {
		t.Errorf("results:\n%s\nwant:\n%s\ndead letters (want 2):\n%s", strings.Join(results, "\n"), strings.Join(want, "\n"), strings.Join(dead, "\n"))
	}
	for _, d := range dead {
		if !strings.Contains(d, "late: behind the watermark") {
			t.Errorf("dead letter %s: want the error of a late reading to the alerts", d)
		}
	}
}

// TestSessionGapChangedAtARestore: sessions of a 5 s gap, stopped with a
// savepoint while a's session [1,7) is open and resumed with a gap of
// 1 s. The restored session keeps the end its old gap gave it (the state
// holds the session's bounds, not its last reading): a reading at 6.5 s,
// whose own window [6.5,7.5) of the new gap touches it, joins it, and the
// session fires as [1,7.5) with 3 readings; m's session [4.6,9.6) takes m
// at 7 s the same way.
func TestSessionGapChangedAtARestore(t *testing.T) {
	dir := t.TempDir()
	broker, api := freeAddr(t), freeAddr(t)
	url := "tcp://" + broker
	cfgPath := filepath.Join(dir, "edged.yaml")
	writeCfg := func(gap string) {
		cfg := fmt.Sprintf(`node:
  data_dir: %[1]s/data
  broker: %[2]s
  listen: %[3]s
pipelines:
  - name: ses
    source:
      mqtt: {topics: [ses/+], format: json, fields: {id: string, v: float, ts: {type: time, unit: ms}}}
    event_time: {field: ts, max_out_of_orderness: 1s}
    key: id
    window: {type: session, gap: %[4]s, aggregates: [{name: n, fn: count}]}
    sinks: [{mqtt: {topic: "out/{id}"}}]
    checkpoint: {dir: %[1]s/ck, interval: 200ms}
`, dir, broker, api, gap)
		if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	writeCfg("5s")
	nd := &node{t: t, cfgPath: cfgPath, logPath: filepath.Join(dir, "edged.log"), brokerAddr: broker, apiAddr: api}
	cleanupNode(t, nd)
	nd.start()
	cl := newLateClients(t, url, "gap")
	col := cl.col
	cl.connect()
	send := func(id string, ts int64) {
		t.Helper()
		body := fmt.Sprintf(`{"id":%q,"v":1,"ts":%d}`, id, ts)
		cl.publish("ses/"+id, body)
	}
	waitWM := func(wm int64) {
		t.Helper()
		testutil.Eventually(t, 30*time.Second, fmt.Sprintf("watermark %d", wm), func() bool {
			p, ok := nd.progress("ses")
			return ok && p.eventTime == wm
		})
	}
	t0 := (time.Now().Add(-30*time.Minute).UnixMilli() / 10_000) * 10_000
	send("a", t0+1000)
	send("a", t0+2000)
	send("m", t0+4600)
	waitWM(t0 + 3599)
	cl.disconnect()
	sp := cliStop(t, nd, "ses")
	if code := nd.waitExit(t, 30*time.Second); code != 0 {
		t.Fatalf("edged exited %d after the stop", code)
	}
	writeCfg("1s")
	nd.start("--from-savepoint", sp)
	nd.checkRestoredFrom(t, sp)
	cl.connect()
	send("m", t0+7000)
	waitWM(t0 + 5999)
	send("a", t0+6500)
	send("m", t0+20_000)
	waitWM(t0 + 18_999)
	// The results go out once a checkpoint after their firing completed.
	testutil.Eventually(t, 30*time.Second, "a's and m's sessions", func() bool {
		col.mu.Lock()
		defer col.mu.Unlock()
		return len(col.byID) >= 2
	})
	drainLate(t, url, col)
	got := col.contents(t)
	want := []string{
		fmt.Sprintf(`out/a {"id":"a","n":3,"window_end":%d,"window_start":%d}`, t0+7500, t0+1000),
		fmt.Sprintf(`out/m {"id":"m","n":2,"window_end":%d,"window_start":%d}`, t0+9600, t0+4600),
	}
	if !slices.Equal(got, want) {
		t.Errorf("results:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
