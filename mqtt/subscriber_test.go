package mqtt

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgedio/edged/mqtt/ingestlog"
)

func startSubscriber(t *testing.T, addr, id string, l *ingestlog.Log) *Subscriber {
	t.Helper()
	s, err := NewSubscriber(SubscriberConfig{Broker: "tcp://" + addr, ClientID: id, Topics: []string{"sensors/#"}}, l)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	select {
	case <-s.Ready():
	case <-time.After(waitBound):
		t.Fatal("subscriber not subscribed")
	}
	return s
}

// publishSeq publishes QoS 1 messages {"seq":i} for i in [from,
// from+n), with at most 256 unacknowledged.
func publishSeq(t *testing.T, c paho.Client, from, n int) error {
	t.Helper()
	var toks []paho.Token
	wait := func(tok paho.Token) error {
		if !tok.WaitTimeout(waitBound) {
			return fmt.Errorf("publish timed out")
		}
		return tok.Error()
	}
	for i := from; i < from+n; i++ {
		toks = append(toks, c.Publish(fmt.Sprintf("sensors/%d", i%7), 1, false, fmt.Appendf(nil, `{"seq":%d}`, i)))
		if len(toks) == 256 {
			if err := wait(toks[0]); err != nil {
				return err
			}
			toks = toks[1:]
		}
	}
	for _, tok := range toks {
		if err := wait(tok); err != nil {
			return err
		}
	}
	return nil
}

// readSeqs returns how often each seq is in l.
func readSeqs(t *testing.T, l *ingestlog.Log) (map[int]int, int) {
	t.Helper()
	r, err := l.Reader(l.Stats().FirstOffset)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	seen := map[int]int{}
	total := 0
	for {
		rec, ok, err := r.TryNext()
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return seen, total
		}
		var p struct{ Seq int }
		if err := json.Unmarshal(rec.Payload, &p); err != nil {
			t.Fatalf("record %d: %v", rec.Offset, err)
		}
		if rec.QoS != 1 || rec.Topic != fmt.Sprintf("sensors/%d", p.Seq%7) {
			t.Fatalf("record %d: topic %q qos %d", rec.Offset, rec.Topic, rec.QoS)
		}
		seen[p.Seq]++
		total++
	}
}

// waitAppends waits until l holds at least n records.
func waitAppends(t *testing.T, l *ingestlog.Log, n uint64) {
	t.Helper()
	deadline := time.Now().Add(waitBound)
	for l.Stats().DurableOffset < n {
		if time.Now().After(deadline) {
			t.Fatalf("log holds %d records, want %d", l.Stats().DurableOffset, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestSubscriberIngestsEveryMessage(t *testing.T) {
	const n = 5000
	br := startBroker(t, nil) // the "external" broker
	l := openLog(t, t.TempDir(), ingestlog.DefaultOptions())
	sub := startSubscriber(t, br.Addr(), "edged-test", l)
	pub := connect(t, br.Addr(), "publisher")
	if err := publishSeq(t, pub, 0, n); err != nil {
		t.Fatal(err)
	}
	waitAppends(t, l, n)
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
	seen, total := readSeqs(t, l)
	for i := range n {
		if seen[i] == 0 {
			t.Fatalf("seq %d missing (%d records)", i, total)
		}
	}
	if total != n {
		t.Errorf("%d records, want %d (no reconnect, so no duplicates)", total, n)
	}
}

// The subscriber's connection is killed mid-stream (Close, with hundreds
// of messages received but not yet acknowledged), messages keep coming
// while it is offline, and a new subscriber with the same client id
// resumes the persistent session: the broker redelivers what was not
// acknowledged plus what arrived meanwhile, so every message ends up in
// the log (duplicates allowed).
//
// The publisher pauses while the new subscriber connects: mochi (standing
// in for the external broker) loses messages published during a session
// takeover (they go to the old client between inheritClientSession's
// clone of its inflight messages and its ClearInflights), a broker bug
// that is not the subscriber's to test.
func TestSubscriberResumeLosesNothing(t *testing.T) {
	const n = 5000
	br := startBroker(t, nil)
	l := openLog(t, t.TempDir(), ingestlog.DefaultOptions())
	sub := startSubscriber(t, br.Addr(), "edged-resume", l)
	pub := connect(t, br.Addr(), "publisher")

	// Phase 1: the first half while the first subscriber runs, then kill
	// it as soon as it has appended some.
	if err := publishSeq(t, pub, 0, n/2); err != nil {
		t.Fatal(err)
	}
	waitAppends(t, l, 100)
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
	killedAt := l.Stats().NextOffset
	// Phase 2: a quarter while nobody is connected.
	if err := publishSeq(t, pub, n/2, n/4); err != nil {
		t.Fatal(err)
	}
	// Phase 3: resume the session, then the rest.
	sub = startSubscriber(t, br.Addr(), "edged-resume", l)
	if err := publishSeq(t, pub, n/2+n/4, n-n/2-n/4); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(waitBound)
	for {
		seen, total := readSeqs(t, l)
		var miss []int
		for i := range n {
			if seen[i] == 0 {
				miss = append(miss, i)
			}
		}
		if len(miss) == 0 {
			if total < n {
				t.Fatalf("%d records < %d published", total, n)
			}
			t.Logf("%d records for %d messages; first subscriber closed after appending %d", total, n, killedAt)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d seqs never reached the log (%d records), first %d; killed at %d", len(miss), total, miss[0], killedAt)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if killedAt >= n/2 {
		t.Logf("first subscriber had appended all of phase 1 (%d) before Close: nothing was unacknowledged", killedAt)
	}
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestSubscriberConfigValidate(t *testing.T) {
	if err := (SubscriberConfig{Broker: "tcp://x:1", Pipeline: "p", Topics: []string{"a/#"}}).Validate(); err != nil {
		t.Fatal(err)
	}
	if c := (SubscriberConfig{Pipeline: "p"}).withDefaults(); c.ClientID != "edged-p" || c.QoS != 1 {
		t.Fatalf("defaults: %+v", c)
	}
	if err := (SubscriberConfig{Topics: []string{"a/#/b"}, QoS: 3}).Validate(); err == nil {
		t.Fatal("bad config accepted")
	}
}

// fakeMsg is a paho.Message injected into Subscriber.handle, standing in
// for a broker's (re)delivery.
type fakeMsg struct {
	topic   string
	payload []byte
	dup     bool
	acked   chan struct{}
}

func newFakeMsg(topic, payload string, dup bool) *fakeMsg {
	return &fakeMsg{topic: topic, payload: []byte(payload), dup: dup, acked: make(chan struct{})}
}

func (m *fakeMsg) Duplicate() bool   { return m.dup }
func (m *fakeMsg) Qos() byte         { return 1 }
func (m *fakeMsg) Retained() bool    { return false }
func (m *fakeMsg) Topic() string     { return m.topic }
func (m *fakeMsg) MessageID() uint16 { return 1 }
func (m *fakeMsg) Payload() []byte   { return m.payload }
func (m *fakeMsg) Ack()              { close(m.acked) }

func waitAcked(t *testing.T, ms ...*fakeMsg) {
	t.Helper()
	for _, m := range ms {
		select {
		case <-m.acked:
		case <-time.After(waitBound):
			t.Fatalf("message %s %s not acknowledged", m.topic, m.payload)
		}
	}
}

// A message appended by one subscriber (and, as if edged were killed then,
// never acknowledged) and redelivered with the DUP flag to a new
// subscriber over the same log (reopened) is acknowledged and dropped; a
// redelivery of a message not in the log, and a message without DUP, are
// appended.
func TestSubscriberDropsRedeliveredDuplicates(t *testing.T) {
	br := startBroker(t, nil) // the "external" broker; messages are injected
	dir := t.TempDir()
	l, err := ingestlog.Open(dir, ingestlog.DefaultOptions(), nil)
	if err != nil {
		t.Fatal(err)
	}
	// Enough records before the ones redelivered to check the tail is
	// read from the right offset, not only from the start.
	const before = 5000
	for i := range before {
		if _, err := l.Append(context.Background(), ingestlog.Message{Topic: "sensors/old", Payload: fmt.Appendf(nil, `{"seq":%d}`, i), QoS: 1}); err != nil {
			t.Fatal(err)
		}
	}
	sub := startSubscriber(t, br.Addr(), "edged-dedup", l)
	first := []*fakeMsg{
		newFakeMsg("sensors/1", `{"seq":1,"ts":1}`, false),
		newFakeMsg("sensors/2", `{"seq":2,"ts":2}`, false),
		newFakeMsg("sensors/3", `{"seq":3,"ts":3}`, false),
	}
	for _, m := range first {
		sub.handle(nil, m)
	}
	waitAcked(t, first...)
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}

	// "Restart": reopen the log, new subscriber.
	l = openLog(t, dir, ingestlog.DefaultOptions())
	if got := l.Stats().NextOffset; got != before+3 {
		t.Fatalf("log holds %d records, want %d", got, before+3)
	}
	sub = startSubscriber(t, br.Addr(), "edged-dedup", l)
	redelivered := []*fakeMsg{
		newFakeMsg("sensors/2", `{"seq":2,"ts":2}`, true),  // appended, unacked: drop
		newFakeMsg("sensors/3", `{"seq":3,"ts":3}`, true),  // same
		newFakeMsg("sensors/4", `{"seq":4,"ts":4}`, true),  // never appended: keep
		newFakeMsg("sensors/9", `{"seq":2,"ts":2}`, true),  // other topic: keep
		newFakeMsg("sensors/1", `{"seq":1,"ts":1}`, false), // no DUP: keep
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
	r, err := l.Reader(before)
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
		got = append(got, rec.Topic+" "+string(rec.Payload))
	}
	want := []string{
		`sensors/1 {"seq":1,"ts":1}`, `sensors/2 {"seq":2,"ts":2}`, `sensors/3 {"seq":3,"ts":3}`,
		`sensors/4 {"seq":4,"ts":4}`, `sensors/9 {"seq":2,"ts":2}`, `sensors/1 {"seq":1,"ts":1}`,
	}
	// Appends are concurrent: compare as multisets.
	sort.Strings(got)
	sort.Strings(want)
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("log after the redelivery:\n%q\nwant\n%q", got, want)
	}
}

// Only the last K messages are remembered: a redelivery of an older one
// is appended again.
func TestSubscriberDedupWindowIsBounded(t *testing.T) {
	r := newHashRing(3)
	for h := uint64(1); h <= 4; h++ {
		r.add(h)
	}
	if r.has(1) || !r.has(2) || !r.has(4) {
		t.Fatalf("ring: %+v", r)
	}
	r.add(2)
	r.add(2)
	if !r.has(2) || r.has(3) || !r.has(4) {
		t.Fatalf("ring: %+v", r)
	}
	if k := (SubscriberConfig{MaxPending: 2000}).DedupWindow(); k != 8000 {
		t.Fatalf("K = %d", k)
	}
	if k := (SubscriberConfig{}).DedupWindow(); k != 4096 {
		t.Fatalf("K = %d", k)
	}
}
