package main

import "testing"

// fakeMessage is a paho.Message with only a payload.
type fakeMessage struct{ payload string }

func (m fakeMessage) Duplicate() bool   { return false }
func (m fakeMessage) Qos() byte         { return 1 }
func (m fakeMessage) Retained() bool    { return false }
func (m fakeMessage) Topic() string     { return "out" }
func (m fakeMessage) MessageID() uint16 { return 0 }
func (m fakeMessage) Payload() []byte   { return []byte(m.payload) }
func (m fakeMessage) Ack()              {}

func TestResultsCountLatestAndDuplicates(t *testing.T) {
	r := newResults()
	for _, p := range []string{
		`{"id":"a","window_start":0,"count":3,"msg_id":"x1"}`,
		`{"id":"b","window_start":0,"count":2,"msg_id":"x2"}`,
		`{"id":"a","window_start":0,"count":3,"msg_id":"x1"}`, // a replayed result
		`{"id":"a","window_start":1000,"count":5}`,
		`{"id":"probe","window_start":0,"count":1}`, // not a reading of the load
		`not json`,
	} {
		r.handle(nil, fakeMessage{p})
	}
	if got := r.sumBefore(1000); got != 5 {
		t.Errorf("sumBefore(1000) = %d, want 5 (a duplicate counted once, the probe not at all)", got)
	}
	if got := r.sumBefore(2000); got != 10 {
		t.Errorf("sumBefore(2000) = %d, want 10", got)
	}
	st := r.stats()
	if st.msgs != 5 || st.dups != 1 || st.dupIDs != 1 || st.bad != 1 {
		t.Errorf("stats = %+v, want 5 messages, 1 duplicate window, 1 duplicate msg_id, 1 bad", st)
	}
}

// A JSON-array payload (sinks[].mqtt.batch) holds one result per element:
// each is counted, and a replayed element is a repeated msg_id.
func TestResultsCountArrayElements(t *testing.T) {
	r := newResults()
	for _, p := range []string{
		`[{"id":"a","window_start":0,"count":3,"msg_id":"x1"},{"id":"b","window_start":0,"count":2,"msg_id":"x2"}]`,
		` [{"id":"b","window_start":0,"count":2,"msg_id":"x2"},{"id":"c","window_start":0,"count":1,"msg_id":"x3"}]`,
		`{"id":"d","window_start":0,"count":4,"msg_id":"x4"}`,
		`[{"id":"e"`,
	} {
		r.handle(nil, fakeMessage{p})
	}
	if got := r.sumBefore(1000); got != 10 {
		t.Errorf("sumBefore(1000) = %d, want 10 (the replayed element counted once)", got)
	}
	st := r.stats()
	if st.msgs != 4 || st.elems != 5 || st.dupIDs != 1 || st.dups != 1 || st.bad != 1 {
		t.Errorf("stats = %+v, want 4 messages, 5 results, 1 repeated msg_id, 1 bad", st)
	}
}
