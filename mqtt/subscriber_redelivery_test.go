package mqtt

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"testing"
	"time"

	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/mqtt/ingestlog"
)

// fakeMsg is a paho.Message injected into Subscriber.handle, standing in
// for a broker's (re)delivery.
type fakeMsg struct {
	id      uint16
	topic   string
	payload []byte
	dup     bool
	acked   chan struct{}
}

func newFakeMsg(id uint16, topic, payload string, dup bool) *fakeMsg {
	return &fakeMsg{id: id, topic: topic, payload: []byte(payload), dup: dup, acked: make(chan struct{})}
}

// redelivery is m as the broker resends it: same packet id, DUP set.
func (m *fakeMsg) redelivery() *fakeMsg {
	return newFakeMsg(m.id, m.topic, string(m.payload), true)
}

func (m *fakeMsg) Duplicate() bool   { return m.dup }
func (m *fakeMsg) Qos() byte         { return 1 }
func (m *fakeMsg) Retained() bool    { return false }
func (m *fakeMsg) Topic() string     { return m.topic }
func (m *fakeMsg) MessageID() uint16 { return m.id }
func (m *fakeMsg) Payload() []byte   { return m.payload }
func (m *fakeMsg) Ack()              { close(m.acked) }

func waitAcked(t *testing.T, ms ...*fakeMsg) {
	t.Helper()
	for _, m := range ms {
		select {
		case <-m.acked:
		case <-time.After(waitBound):
			t.Fatalf("message %d %s %s not acknowledged", m.id, m.topic, m.payload)
		}
	}
}

// logged returns "topic payload" of every record of l from offset from,
// sorted (appends are concurrent, so order is not compared).
func logged(t *testing.T, l *ingestlog.Log, from uint64) []string {
	t.Helper()
	r, err := l.Reader(from)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var got []string
	for {
		rec, ok, err := r.TryNext()
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		if rec.Note {
			continue // a redelivery note, no message
		}
		got = append(got, rec.Topic+" "+string(rec.Payload))
	}
	sort.Strings(got)
	return got
}

// restart closes sub and l, as if edged had been killed with the
// messages handled so far appended but their acks lost, reopens the log
// and starts a new subscriber with the same config on it.
func restart(t *testing.T, sub *Subscriber, dir string, l *ingestlog.Log) (*Subscriber, *ingestlog.Log) {
	t.Helper()
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l = openLog(t, dir, ingestlog.DefaultOptions())
	return startSubscriberWith(t, sub.cfg, l), l
}

// A message appended by one subscriber (and, as if edged were killed then,
// never acknowledged) and redelivered with the DUP flag and its packet id
// to a new subscriber over the same log (reopened) is acknowledged and
// dropped; a redelivery of a message not in the log, a DUP message whose
// content equals a logged one's under another packet id, and a message
// without DUP, are appended.
func TestSubscriberDropsRedeliveredDuplicates(t *testing.T) {
	testutil.Burn(t, 2)
	br := startBroker(t, nil) // the "external" broker; messages are injected
	dir := t.TempDir()
	l := openLog(t, dir, ingestlog.DefaultOptions())
	// More records before the ones redelivered than the window holds
	// (W = 32), to check the tail is read from the right offset, not only
	// from the start.
	// The oldest has the packet id and content of a redelivery below
	// that must be kept: outside the window, it must not be found.
	const before = 100
	for i := range before {
		m := ingestlog.Message{Topic: "sensors/old", Payload: fmt.Appendf(nil, `{"seq":%d}`, i), QoS: 1, PacketID: uint16(1000 + i)}
		if i == 0 {
			m = ingestlog.Message{Topic: "sensors/4", Payload: []byte(`{"seq":4,"ts":4}`), QoS: 1, PacketID: 14}
		}
		if _, err := l.Append(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
	cfg := SubscriberConfig{Broker: "tcp://" + br.Addr(), ClientID: "edged-dedup", Topics: []string{"sensors/#"},
		MaxPending: 8, RedeliveryWindow: 32}
	sub := startSubscriberWith(t, cfg, l)
	first := []*fakeMsg{
		newFakeMsg(11, "sensors/1", `{"seq":1,"ts":1}`, false),
		newFakeMsg(12, "sensors/2", `{"seq":2,"ts":2}`, false),
		newFakeMsg(13, "sensors/3", `{"seq":3,"ts":3}`, false),
	}
	for _, m := range first {
		sub.handle(nil, m)
	}
	waitAcked(t, first...)
	sub, l = restart(t, sub, dir, l)
	if got := l.Stats().NextOffset; got != before+3 {
		t.Fatalf("log holds %d records, want %d", got, before+3)
	}
	redelivered := []*fakeMsg{
		first[1].redelivery(), // appended, unacked: drop
		first[2].redelivery(), // same
		newFakeMsg(14, "sensors/4", `{"seq":4,"ts":4}`, true),  // never appended: keep
		newFakeMsg(12, "sensors/9", `{"seq":2,"ts":2}`, true),  // other topic: keep
		newFakeMsg(15, "sensors/2", `{"seq":2,"ts":2}`, true),  // same content, other packet id: keep
		newFakeMsg(11, "sensors/1", `{"seq":1,"ts":1}`, false), // no DUP: keep
	}
	for _, m := range redelivered {
		sub.handle(nil, m)
	}
	waitAcked(t, redelivered...)
	if got := sub.Dropped(); got != 2 {
		t.Errorf("dropped %d, want 2", got)
	}
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
	want := []string{
		`sensors/1 {"seq":1,"ts":1}`, `sensors/2 {"seq":2,"ts":2}`, `sensors/3 {"seq":3,"ts":3}`,
		`sensors/4 {"seq":4,"ts":4}`, `sensors/9 {"seq":2,"ts":2}`, `sensors/2 {"seq":2,"ts":2}`,
		`sensors/1 {"seq":1,"ts":1}`,
	}
	sort.Strings(want)
	if got := logged(t, l, before); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("log after the redelivery:\n%q\nwant\n%q", got, want)
	}
}

// A backlog of appended but unacknowledged messages larger than 4,096 is
// redelivered with DUP, out of order, after a restart, interleaved with
// new messages: none is appended twice, and every new one is appended.
func TestSubscriberLargeRedeliveredBacklog(t *testing.T) {
	const backlog, fresh = 6000, 500
	testutil.Burn(t, 2)
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 2))
	br := startBroker(t, nil)
	dir := t.TempDir()
	l := openLog(t, dir, ingestlog.DefaultOptions())
	sub := startSubscriber(t, br.Addr(), "edged-backlog", l)
	var first []*fakeMsg
	for i := range backlog {
		m := newFakeMsg(uint16(1+i), fmt.Sprintf("sensors/%d", i%7), fmt.Sprintf(`{"seq":%d}`, i), false)
		first = append(first, m)
		sub.handle(nil, m)
	}
	waitAcked(t, first...) // acked here, but the acks never reached the broker
	sub, l = restart(t, sub, dir, l)

	var again []*fakeMsg
	for _, m := range first {
		again = append(again, m.redelivery())
	}
	rng.Shuffle(len(again), func(i, j int) { again[i], again[j] = again[j], again[i] })
	for i := range fresh {
		n := backlog + i
		m := newFakeMsg(uint16(1+n), fmt.Sprintf("sensors/%d", n%7), fmt.Sprintf(`{"seq":%d}`, n), false)
		k := rng.IntN(len(again) + 1)
		again = append(again[:k], append([]*fakeMsg{m}, again[k:]...)...)
	}
	for _, m := range again {
		sub.handle(nil, m)
	}
	waitAcked(t, again...)
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
	count := map[string]int{}
	for _, rec := range logged(t, l, 0) {
		count[rec]++
	}
	for n := range backlog + fresh {
		key := fmt.Sprintf(`sensors/%d {"seq":%d}`, n%7, n)
		if count[key] != 1 {
			t.Fatalf("seq %d logged %d times (dropped %d redeliveries of %d)", n, count[key], sub.Dropped(), backlog)
		}
	}
	if got := sub.Dropped(); got != backlog {
		t.Fatalf("dropped %d redeliveries, want %d", got, backlog)
	}
}

// A lamp sends "ON" twice (two messages, two packet ids). The second one's
// first delivery is lost with the connection; the broker redelivers it
// with DUP. Both are kept: equal content under another packet id is a
// distinct message. A third "ON", appended but unacknowledged when edged
// dies, is redelivered with DUP and dropped.
func TestSubscriberKeepsEqualReadings(t *testing.T) {
	testutil.Burn(t, 2)
	br := startBroker(t, nil)
	dir := t.TempDir()
	l := openLog(t, dir, ingestlog.DefaultOptions())
	sub := startSubscriber(t, br.Addr(), "edged-lamp", l)
	on1 := newFakeMsg(7, "lamps/1", "ON", false)
	sub.handle(nil, on1)
	waitAcked(t, on1)
	on2 := newFakeMsg(8, "lamps/1", "ON", false) // never reaches edged
	on2dup := on2.redelivery()
	on3 := newFakeMsg(9, "lamps/1", "ON", false)
	sub.handle(nil, on2dup)
	sub.handle(nil, on3)
	waitAcked(t, on2dup, on3) // on3's ack is lost with the kill
	sub, l = restart(t, sub, dir, l)
	on3dup := on3.redelivery()
	sub.handle(nil, on3dup)
	waitAcked(t, on3dup)
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
	if got := logged(t, l, 0); fmt.Sprint(got) != fmt.Sprint([]string{"lamps/1 ON", "lamps/1 ON", "lamps/1 ON"}) {
		t.Fatalf("log holds %q, want three ON", got)
	}
	if got := sub.Dropped(); got != 1 {
		t.Fatalf("dropped %d, want 1 (on3's redelivery)", got)
	}
}

// A redelivery longer than the window (the broker resends more messages
// than W after a kill): the oldest ones are outside the window and are
// appended again, but appending them must not push the newer ones out of
// the window, or every redelivered message after them would be appended
// a second time.
func TestSubscriberLongRedeliveryDoesNotCascade(t *testing.T) {
	testutil.Burn(t, 2)
	br := startBroker(t, nil)
	dir := t.TempDir()
	l := openLog(t, dir, ingestlog.DefaultOptions())
	const window, n = 32, 60
	cfg := SubscriberConfig{Broker: "tcp://" + br.Addr(), ClientID: "edged-long-redelivery", Topics: []string{"sensors/#"},
		MaxPending: 8, RedeliveryWindow: window}
	sub := startSubscriberWith(t, cfg, l)
	var first []*fakeMsg
	for i := range n {
		m := newFakeMsg(uint16(i+1), fmt.Sprintf("sensors/%d", i%7), fmt.Sprintf(`{"seq":%d}`, i), false)
		first = append(first, m)
		sub.handle(nil, m)
	}
	waitAcked(t, first...)
	sub, l = restart(t, sub, dir, l)
	var again []*fakeMsg
	for _, m := range first {
		r := m.redelivery()
		again = append(again, r)
		sub.handle(nil, r)
	}
	waitAcked(t, again...)
	if got, want := sub.Dropped(), uint64(window); got != want {
		t.Errorf("dropped %d redeliveries, want the %d in the window", got, want)
	}
	// Of the ones in the window, those more than window/2 records back
	// (ages 31 down to 17) are noted again.
	if got, want := sub.Notes(), uint64(window-1-window/2); got != want {
		t.Errorf("noted %d redeliveries, want %d", got, want)
	}
	if got, want := l.Stats().NextOffset, uint64(n+n-window)+sub.Notes(); got != want {
		t.Errorf("log holds %d records, want %d (%d appended again from outside the window, %d notes)", got, want, n-window, sub.Notes())
	}
	if got := len(logged(t, l, 0)); got != n+n-window {
		t.Errorf("log holds %d messages, want %d", got, n+n-window)
	}
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
}

// A message whose acknowledgement the broker never gets (edged killed
// again and again before it reads the ack) is resent on every session,
// further back each time: each run appends more fresh messages than half
// the window, and the three runs together more than the window. Each
// resend that finds the record past the middle of the window notes it
// again at the log's tail, so the next run, which reloads the tail, still
// knows it: it is logged once. Before the notes, the third resend was
// appended a second time.
func TestSubscriberRedeliveryNotedAcrossRestarts(t *testing.T) {
	testutil.Burn(t, 2)
	br := startBroker(t, nil)
	dir := t.TempDir()
	l := openLog(t, dir, ingestlog.DefaultOptions())
	const window, perRun = 32, 20 // more than window/2, less than window
	cfg := SubscriberConfig{Broker: "tcp://" + br.Addr(), ClientID: "edged-noted-redelivery", Topics: []string{"sensors/#"},
		MaxPending: 8, RedeliveryWindow: window}
	sub := startSubscriberWith(t, cfg, l)
	held := newFakeMsg(1, "sensors/held", `{"seq":-1}`, false)
	sub.handle(nil, held)
	waitAcked(t, held)
	seq := 0
	fresh := func() {
		var ms []*fakeMsg
		for range perRun {
			m := newFakeMsg(uint16(2+seq%1000), fmt.Sprintf("sensors/%d", seq%7), fmt.Sprintf(`{"seq":%d}`, seq), false)
			seq++
			ms = append(ms, m)
			sub.handle(nil, m)
		}
		waitAcked(t, ms...)
	}
	fresh()
	var dropped, notes uint64
	for run := range 3 {
		sub, l = restart(t, sub, dir, l)
		r := held.redelivery()
		sub.handle(nil, r)
		waitAcked(t, r)
		dropped, notes = dropped+sub.Dropped(), notes+sub.Notes()
		if sub.Dropped() != 1 {
			t.Fatalf("run %d: the resend of the held message was not taken for a redelivery (dropped %d)", run, sub.Dropped())
		}
		fresh()
	}
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
	if notes == 0 {
		t.Fatalf("no resend was noted (%d dropped): the test did not reach a record past the middle of the window", dropped)
	}
	n := 0
	for _, m := range logged(t, l, 0) {
		if m == "sensors/held {\"seq\":-1}" {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("the held message is logged %d times, want 1", n)
	}
	t.Logf("%d resends dropped, %d of them noted; %d fresh messages appended", dropped, notes, seq)
}

// A redelivery to note is counted in Notes only once its note is in the
// log: a note whose append fails (here: the log is closed) leaves the
// message unacknowledged, to come back, and is counted among the dropped
// redeliveries but not the noted ones.
func TestSubscriberNoteCountedOnceAppended(t *testing.T) {
	const window = 32
	for _, appended := range []bool{true, false} {
		t.Run(fmt.Sprintf("appended=%v", appended), func(t *testing.T) {
			l := openLog(t, t.TempDir(), ingestlog.DefaultOptions())
			s, err := NewSubscriber(SubscriberConfig{Broker: "tcp://127.0.0.1:1", Topics: []string{"x"}, ClientID: "noted",
				MaxPending: 4, RedeliveryWindow: window}, l)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.loadTail(); err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			// Message 1, then window/2+1 fresh ones after it: its record is
			// past the middle of the window.
			for i := range window/2 + 2 {
				d := delivery{id: uint16(i + 1), qos: 1}
				payload := s.classify(&d, "x", []byte(fmt.Sprint(i)), 0)
				if s.dedup(&d) {
					t.Fatalf("fresh message %d taken for a redelivery", i+1)
				}
				if err := s.appendRecord(ctx, &d, "x", payload, false); err != nil {
					t.Fatal(err)
				}
			}
			d := delivery{id: 1, qos: 1, dup: true}
			payload := s.classify(&d, "x", []byte("0"), 0)
			if s.dedup(&d) || !d.note {
				t.Fatalf("the resend of message 1 is not to be noted (note %v)", d.note)
			}
			if !appended {
				l.Close()
			}
			err = s.appendRecord(ctx, &d, "x", payload, false)
			if appended != (err == nil) {
				t.Fatalf("append of the note: %v", err)
			}
			want := uint64(0)
			if appended {
				want = 1
			}
			if s.Dropped() != 1 || s.Notes() != want {
				t.Fatalf("dropped %d, noted %d; want 1 and %d", s.Dropped(), s.Notes(), want)
			}
		})
	}
}
