package cluster

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/edgedio/edged/keygroup"
)

// A node without a cluster answers {"enabled":false} and nothing else.
func TestStatusDisabledJSON(t *testing.T) {
	for _, s := range []Status{{}, {Node: "n1", Members: []MemberStatus{{ID: "n1"}}}} {
		b, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		if string(b) != `{"enabled":false}` {
			t.Fatalf("disabled status encodes as %s", b)
		}
	}
}

// The JSON names are snake_case, key groups are [first,last], and the
// lists of an enabled status are [] rather than null once normalized.
func TestStatusJSONShape(t *testing.T) {
	at := time.Date(2026, 12, 1, 16, 0, 0, 0, time.UTC)
	s := Status{Enabled: true, Node: "n1", Leader: "n1", Epoch: 4,
		Members: []MemberStatus{
			{ID: "n2", Address: "127.0.0.1:7002", API: "127.0.0.1:8082", State: StateSuspect, Capacity: 1},
			{ID: "n1", Address: "127.0.0.1:7001", API: "127.0.0.1:8081", State: StateAlive, Leader: true, SeesMajority: true, Capacity: 2},
		},
		Placement: []NodePlacement{{Node: "n1", Subtasks: []PlacedSubtask{
			{Operator: "window", UID: "w", Subtask: 1, KeyGroups: KeyGroupsOf(keygroup.RangeFor(1, 2, 128))},
			{Operator: "window", UID: "w", Subtask: 0, KeyGroups: KeyGroupsOf(keygroup.RangeFor(0, 2, 128))},
		}}},
		Failovers:  []Failover{{At: at, DeadNode: "n3", Epoch: 3, DetectionMS: 900, PlacementMS: 20, RestoreMS: 300, FirstRecordMS: 40}},
		Rebalances: []Rebalance{{At: at, Trigger: TriggerDrain, MovedKeyGroups: 64, Outcome: RebalanceRefused, Error: "no room"}},
	}.Normalized()
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"enabled", "node", "leader", "epoch", "members", "placement", "replicas", "failovers", "rebalances", "failovers_total", "rebalances_total"} {
		if _, ok := m[k]; !ok {
			t.Errorf("no %q in %s", k, b)
		}
	}
	if string(mustJSON(t, m["replicas"])) != "[]" {
		t.Errorf("replicas = %s, want []", mustJSON(t, m["replicas"]))
	}
	mem := m["members"].([]any)[0].(map[string]any)
	for _, k := range []string{"id", "address", "api", "state", "leader", "sees_majority", "capacity"} {
		if _, ok := mem[k]; !ok {
			t.Errorf("member lacks %q: %v", k, mem)
		}
	}
	if mem["id"] != "n1" {
		t.Errorf("members not sorted by id: first is %v", mem["id"])
	}
	st := m["placement"].([]any)[0].(map[string]any)["subtasks"].([]any)[0].(map[string]any)
	if got := string(mustJSON(t, st["key_groups"])); got != "[0,63]" || st["subtask"] != 0.0 {
		t.Errorf("first subtask %v, key_groups %s; want subtask 0 with [0,63]", st, got)
	}
	f := m["failovers"].([]any)[0].(map[string]any)
	for _, k := range []string{"at", "dead_node", "epoch", "detection_ms", "placement_ms", "restore_ms", "first_record_ms"} {
		if _, ok := f[k]; !ok {
			t.Errorf("failover lacks %q: %v", k, f)
		}
	}
	r := m["rebalances"].([]any)[0].(map[string]any)
	for _, k := range []string{"at", "trigger", "moved_key_groups", "bytes_shipped", "pause_ms", "outcome", "error"} {
		if _, ok := r[k]; !ok {
			t.Errorf("rebalance lacks %q: %v", k, r)
		}
	}
	if string(mustJSON(t, r["pause_ms"])) != "{}" {
		t.Errorf("pause_ms = %s, want {}", mustJSON(t, r["pause_ms"]))
	}
	var back Status
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if back.Placement[0].Subtasks[1].KeyGroups != (KeyGroups{64, 127}) || back.Failovers[0].TotalMS() != 1260 {
		t.Errorf("round trip: %+v", back)
	}
	if s.FailoversTotal != 1 || s.RebalancesTotal != 1 {
		t.Errorf("totals %d, %d; want at least the listed ones", s.FailoversTotal, s.RebalancesTotal)
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The counts the metrics and the CLI read.
func TestStatusCounts(t *testing.T) {
	s := Status{Enabled: true,
		Members: []MemberStatus{{ID: "a", State: StateAlive}, {ID: "b", State: StateAlive}, {ID: "c", State: StateDead}},
		Placement: []NodePlacement{
			{Node: "a", Subtasks: []PlacedSubtask{{KeyGroups: KeyGroups{0, 42}}, {KeyGroups: KeyGroups{0, 9}}}},
			{Node: "b", Subtasks: []PlacedSubtask{{KeyGroups: KeyGroups{43, 127}}}},
		}}
	if got := s.KeyGroupsOwned(); got["a"] != 53 || got["b"] != 85 || len(got) != 2 {
		t.Errorf("KeyGroupsOwned = %v", got)
	}
	by := s.MembersByState()
	if by[StateAlive] != 2 || by[StateDead] != 1 || by[StateSuspect] != 0 || len(by) != 4 {
		t.Errorf("MembersByState = %v", by)
	}
	if m, ok := s.Member("c"); !ok || m.State != StateDead {
		t.Errorf("Member(c) = %v, %v", m, ok)
	}
	if _, ok := s.Member("z"); ok {
		t.Error("Member(z) found")
	}
	for _, st := range MemberStates {
		if !st.Valid() {
			t.Errorf("%q not valid", st)
		}
	}
	if MemberState("gone").Valid() {
		t.Error(`"gone" valid`)
	}
	r := Rebalance{PauseMS: map[string]float64{"w/1": 30, "w/0": 30, "w/2": 5}}
	if sub, ms := r.MaxPauseMS(); sub != "w/0" || ms != 30 {
		t.Errorf("MaxPauseMS = %s %v, want w/0 30", sub, ms)
	}
	if !strings.HasPrefix(ErrRefused.Error(), "cluster: ") {
		t.Error(ErrRefused)
	}
}

// Hand-backs: [] rather than null, newest first, savepoints {} rather than
// null, and a total at least the history's length.
func TestStatusHandbacksNormalized(t *testing.T) {
	s := Status{Enabled: true}.Normalized()
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"handbacks":[]`) || !strings.Contains(string(b), `"handbacks_total":0`) {
		t.Fatalf("empty status %s", b)
	}
	t0 := time.Unix(100, 0)
	s = Status{Enabled: true, Handbacks: []Handback{{At: t0, From: "b", To: "a", Outcome: "failed"}, {At: t0.Add(time.Second), From: "b", To: "a", Outcome: "done"}}}.Normalized()
	if s.Handbacks[0].Outcome != "done" || s.Handbacks[1].Savepoints == nil || s.HandbacksTotal != 2 {
		t.Fatalf("normalized %+v", s)
	}
}
