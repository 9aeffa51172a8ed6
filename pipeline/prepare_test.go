package pipeline

import (
	"testing"
	"unsafe"

	"github.com/edgedio/edged/mqtt"
	"github.com/edgedio/edged/operators"
)

// rowsOut collects the rows an operator emits.
type rowsOut struct{ rows []Row }

func (o *rowsOut) Collect(r Row) { o.rows = append(o.rows, r) }

// The rows decoded from MQTT payloads keep no part of their payload: a
// string field is a copy shared by the records with the same value, so a
// key kept in state does not keep its payload alive, and preparing a
// record with a known key allocates nothing (no copy of the payload
// either).
func TestPrepareCopiesDecodedStringsOutOfPayloads(t *testing.T) {
	pc := parsePipeline(t, `
pipelines:
  - name: p
    source:
      mqtt:
        topics: [sensors/#]
        format: json
        fields:
          id: {type: string, path: $.sensor}
          temp: {type: float, path: $.t}
    key: id
    sinks: [{stdout: {}}]
`)
	if pc.plan == nil {
		if err := pc.Validate(); err != nil {
			t.Fatal(err)
		}
	}
	pl := pc.plan
	b := &builder{cfg: &pc, pl: pl, c: &counters{}, dead: operators.NewOutputTag[DeadLetter]("dead-letter")}
	out := &rowsOut{}
	op := operators.NewProcess[mqtt.Message, Row](&prepareFn[mqtt.Message]{b: b, decode: pl.json.Decode, raw: payloadString}, out)
	if err := op.Open(&operators.Context{}); err != nil {
		t.Fatal(err)
	}
	p1 := []byte(`{"sensor":"s-1","t":21.5}`)
	p2 := []byte(`{"sensor":"s-1","t":22.5}`)
	op.Collect(mqtt.Message{Payload: p1})
	op.Collect(mqtt.Message{Payload: p2})
	if len(out.rows) != 2 {
		t.Fatalf("%d rows, want 2", len(out.rows))
	}
	slot := pl.key.Slot
	id1, id2 := out.rows[0].Str(slot), out.rows[1].Str(slot)
	if id1 != "s-1" || id2 != "s-1" {
		t.Fatalf("ids %q, %q", id1, id2)
	}
	for _, p := range [][]byte{p1, p2} {
		start, end := uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(unsafe.Pointer(unsafe.SliceData(p)))+uintptr(len(p))
		if d := uintptr(unsafe.Pointer(unsafe.StringData(id1))); d >= start && d < end {
			t.Error("the decoded id points into its payload")
		}
	}
	if unsafe.StringData(id1) != unsafe.StringData(id2) {
		t.Error("two records with the same id hold two copies of it")
	}
	allocs := testing.AllocsPerRun(200, func() {
		out.rows = out.rows[:0]
		op.Collect(mqtt.Message{Payload: p1})
	})
	if allocs != 0 {
		t.Errorf("%.1f allocations per prepared record, want 0", allocs)
	}
}
