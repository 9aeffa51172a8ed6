package pipeline

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/operators/operatorstest"
)

const alertOrderConfig = `
pipelines:
  - name: order
    source: {generator: {count: 1}}
    event_time: {field: ts, max_out_of_orderness: 1s}
    key: id
    alerts: [{name: hot, when: temp > 38, for: 300ms}]
    silent: {for: 2s}
    sinks: [{stdout: {}}]
`

// alertRun feeds the records at positions order of rows to the alerts
// operator, a watermark after every record (the one its source would send
// at that point of an in-order stream, max_out_of_orderness behind), and
// returns the alerts it emitted.
func alertRun(t *testing.T, pl *plan, rows []Row, order []int, lag int64) []string {
	t.Helper()
	tsSlot := pl.ts.Slot
	h, _ := openAlerts(t, pl)
	wm := int64(-1 << 62)
	for n, i := range order {
		r := rows[i]
		h.Process(r, r.Int(tsSlot))
		// The watermark of an in-order stream after n+1 records.
		if w := rows[n].Int(tsSlot) - lag; w > wm {
			wm = w
			if err := h.Watermark(wm); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := h.EndInput(); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range h.Values() {
		got = append(got, string(r.AppendJSON(nil, pl.alertSchema)))
	}
	slices.Sort(got)
	return got
}

// openAlerts opens pl's alerts operator, keyed by the pipeline's key, in
// a test harness with its dead-letter side output, whose tag it returns.
func openAlerts(t *testing.T, pl *plan) (*operatorstest.Harness[Row, Row], operators.OutputTag[DeadLetter]) {
	t.Helper()
	keySlot := pl.key.Slot
	tag := operators.NewOutputTag[DeadLetter]("dead-letter")
	h := operatorstest.New(func(out operators.Collector[Row]) operators.OneInput[Row] {
		fn := &alertFn{pl: pl, name: "order", dead: tag, count: &counters{}}
		return operators.NewKeyedProcess(func(r Row) string { return r.Str(keySlot) }, operators.KeyedProcessFunction[string, Row, Row](fn), out)
	}, operatorstest.Keyed(128), operatorstest.SideOutput[DeadLetter](tag.ID()))
	if err := h.Open(); err != nil {
		t.Fatal(err)
	}
	return h, tag
}

// alertOrderPipeline compiles alertOrderConfig's pipeline.
func alertOrderPipeline(t *testing.T) *plan {
	t.Helper()
	cfg, err := Parse([]byte(alertOrderConfig))
	if err != nil {
		t.Fatal(err)
	}
	var p problems
	pl := cfg.Pipelines[0].compile(&p, "pipelines[0]")
	if len(p) != 0 {
		t.Fatal(p)
	}
	return pl
}

// alertOrderRow is a reading of sensor id at ts with temp, for pl.
func alertOrderRow(pl *plan, id string, ts int64, temp float64) Row {
	var r Row
	r.SetStr(pl.in.Field(0).Slot, id)
	r.SetFloat(pl.in.Field(1).Slot, temp)
	r.SetInt(pl.in.Field(2).Slot, ts)
	return r
}

// With event time the alerts of a key do not depend on the order in which
// its records arrive: at parallelism above 1 they reach the alerts
// operator over one channel per decoding subtask, interleaved differently
// in each run, so a replay after a restore sees another arrival order than
// the run before it. Every shuffle of the records within
// max_out_of_orderness gives the alerts of the in-order stream.
func TestAlertsTakeRecordsInEventTimeOrder(t *testing.T) {
	pl := alertOrderPipeline(t)
	idSlot, tempSlot, tsSlot := pl.in.Field(0).Slot, pl.in.Field(1).Slot, pl.in.Field(2).Slot
	// Two sensors, a reading every 50 ms, hot stretches of 400 ms every
	// 1 s (an alert each), with one cold reading in some of them (no
	// alert), and a 3 s gap (silent).
	var rows []Row
	for i := range 200 {
		ts := int64(1_000_000 + 50*i)
		if i >= 100 && i < 160 {
			continue // the gap
		}
		for k, id := range []string{"a", "b"} {
			temp := 20.0
			if ph := i % 20; ph >= 2 && ph < 10 && !(k == 1 && ph == 5 && i%40 < 20) {
				temp = 40
			}
			var r Row
			r.SetStr(idSlot, id)
			r.SetFloat(tempSlot, temp)
			r.SetInt(tsSlot, ts)
			rows = append(rows, r)
		}
	}
	inOrder := make([]int, len(rows))
	for i := range inOrder {
		inOrder[i] = i
	}
	const lag = 1000
	want := alertRun(t, pl, rows, inOrder, lag)
	if len(want) < 10 {
		t.Fatalf("%d alerts in order: choose other data\n%v", len(want), want)
	}
	for seed := range uint64(20) {
		// Shuffle within windows of 10 records (250 ms of event time,
		// well within max_out_of_orderness), as interleaved channels do.
		rng := rand.New(rand.NewPCG(seed, 1))
		order := slices.Clone(inOrder)
		for at := 0; at < len(order); at += 10 {
			w := order[at:min(at+10, len(order))]
			rng.Shuffle(len(w), func(i, j int) { w[i], w[j] = w[j], w[i] })
		}
		got := alertRun(t, pl, rows, order, lag)
		if !slices.Equal(got, want) {
			t.Fatalf("seed %d: shuffled within the out-of-orderness, the alerts differ:\ngot  %v\nwant %v", seed, got, want)
		}
	}
	t.Logf("%d alerts, the same for 20 shuffles", len(want))
}

// Readings of one key with the same event time (a device stamping in
// whole seconds, two readings within one) may arrive in either order, over
// two decoding subtasks: a hot and a cold reading at one timestamp must
// give the same alerts in both orders, so that a replay after a restore
// fires what the run before it fired.
func TestAlertsSameTimestampWhateverTheOrder(t *testing.T) {
	pl := alertOrderPipeline(t)
	row := func(ts int64, temp float64) Row { return alertOrderRow(pl, "a", ts, temp) }
	// Hot from 1,000,000 on, with a cold reading at 1,000,100 beside a
	// hot one, and hot readings after it until past the 300 ms.
	rows := []Row{row(1_000_000, 40), row(1_000_100, 40), row(1_000_100, 20), row(1_000_200, 40), row(1_000_500, 40)}
	const lag = 1000
	want := alertRun(t, pl, rows, []int{0, 1, 2, 3, 4}, lag)
	got := alertRun(t, pl, rows, []int{0, 2, 1, 3, 4}, lag)
	if !slices.Equal(got, want) {
		t.Fatalf("two readings of one timestamp in the other order give other alerts:\ngot  %v\nwant %v", got, want)
	}
}

// A reading that comes behind the watermark and behind the latest reading
// its key was looked at with cannot be put in its place: the key's alert
// state has moved past it. Looked at with its own time, a late hot reading
// made an alert true since that time, after a cold reading had re-armed
// it, and the alert fired for a condition that was not held. It is a
// dead letter (late) instead, and the alerts are those of the readings in
// order without it.
func TestAlertsLateReadingBehindItsKeyIsDeadLetter(t *testing.T) {
	pl := alertOrderPipeline(t)
	row := func(ts int64, temp float64) Row { return alertOrderRow(pl, "a", ts, temp) }
	tsSlot := pl.in.Field(2).Slot
	h, tag := openAlerts(t, pl)
	step := func(r Row, wm int64) {
		t.Helper()
		h.Process(r, r.Int(tsSlot))
		if err := h.Watermark(wm); err != nil {
			t.Fatal(err)
		}
	}
	// Hot at 1,000,000, cold at 1,000,200 (before the 300 ms), cold at
	// 1,003,000; then a hot reading of 1,000,100 arrives, behind the
	// watermark and behind the key's latest reading.
	step(row(1_000_000, 40), 999_000)
	step(row(1_000_200, 20), 999_500)
	step(row(1_003_000, 20), 1_002_000)
	lateRow := row(1_000_100, 40)
	// Read from MQTT: its dead letter names its message, so that two
	// equal late readings give two dead letters (two msg_ids).
	lateRow.origin = Origin{Topic: "sensors/a", Offset: 42 + 1}
	step(lateRow, 1_002_100)
	step(row(1_003_100, 20), 1_002_200)
	if err := h.EndInput(); err != nil {
		t.Fatal(err)
	}
	for _, r := range h.Values() {
		if r.Str(pl.alName.Slot) == "hot" {
			t.Errorf("alert fired for a condition not held: %s", r.AppendJSON(nil, pl.alertSchema))
		}
	}
	var late int
	for _, d := range h.Side[tag.ID()] {
		dl := d.Value.(DeadLetter)
		if strings.HasPrefix(dl.Err, "late: ") && strings.Contains(dl.Payload, `"ts":1000100`) {
			if !strings.HasSuffix(dl.Err, " (topic sensors/a, ingest-log offset 42)") {
				t.Errorf("late dead letter %q does not name its message", dl.Err)
			}
			late++
		} else {
			t.Errorf("unexpected dead letter %+v", dl)
		}
	}
	if late != 1 {
		t.Errorf("%d late dead letters for the reading behind its key, want 1", late)
	}
}

// An alert fires when its condition was true on every reading of the key
// from since to since+for. A reading on which the condition fails to
// evaluate (here a division by zero) is a dead letter, and the condition
// was not true on it: it re-arms the alert like a false one. Before, the
// alert held across it and fired.
func TestAlertConditionErrorReArms(t *testing.T) {
	cfg, err := Parse([]byte(`
pipelines:
  - name: order
    source: {file: {path: in.csv, format: csv, fields: {id: string, temp: float, n: int, ts: {type: time, unit: ms}}}}
    event_time: {field: ts, max_out_of_orderness: 1s}
    key: id
    alerts: [{name: hot, when: temp / n > 38, for: 300ms}]
    sinks: [{stdout: {}}]
`))
	if err != nil {
		t.Fatal(err)
	}
	var p problems
	pl := cfg.Pipelines[0].compile(&p, "pipelines[0]")
	if len(p) != 0 {
		t.Fatal(p)
	}
	idSlot, tempSlot, nSlot, tsSlot := pl.in.Field(0).Slot, pl.in.Field(1).Slot, pl.in.Field(2).Slot, pl.in.Field(3).Slot
	row := func(ts int64, n int64) Row {
		var r Row
		r.SetStr(idSlot, "a")
		r.SetFloat(tempSlot, 40)
		r.SetInt(nSlot, n)
		r.SetInt(tsSlot, ts)
		return r
	}
	// Hot from 1,000,000; the reading at 1,000,200 cannot be evaluated;
	// hot again from 1,000,300 for more than 300 ms.
	rows := []Row{row(1_000_000, 1), row(1_000_100, 1), row(1_000_200, 0), row(1_000_300, 1), row(1_000_400, 1), row(1_000_700, 1)}
	got := alertRun(t, pl, rows, []int{0, 1, 2, 3, 4, 5}, 1000)
	want := []string{`{"id":"a","alert":"hot","since":1000300,"at":1000600}`}
	if !slices.Equal(got, want) {
		t.Fatalf("alerts %v, want %v: the reading whose condition failed re-arms the alert", got, want)
	}
}
