package mqtt

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/mqtt/ingestlog"
)

func seqOf(t *testing.T, payload []byte) int {
	t.Helper()
	var v struct{ Seq int }
	if err := json.Unmarshal(payload, &v); err != nil {
		t.Fatalf("payload %q: %v", payload, err)
	}
	return v.Seq
}

// A device publishes 10,000 QoS 1 messages; every one whose PUBACK arrived
// is in the log, in publish order, after a reopen, and the Source reads
// them all.
func TestBrokerIngestsBeforePuback(t *testing.T) {
	const n = 10_000
	dir := t.TempDir()
	opts := ingestlog.DefaultOptions()
	opts.SegmentBytes = 64 << 10
	l := openLog(t, dir, opts)
	b := startBroker(t, l, "sensors/#")
	dev := connect(t, b.Addr(), "device-1")

	acked := make([]bool, n)
	var inflight []paho.Token
	var inflightSeq []int
	wait := func(k int) {
		tok := inflight[k]
		if !tok.WaitTimeout(waitBound) {
			t.Fatalf("no PUBACK for %d", inflightSeq[k])
		}
		if tok.Error() == nil {
			acked[inflightSeq[k]] = true
		}
	}
	for i := range n {
		if len(inflight) == 1000 { // paho has no in-flight bound of its own
			for k := range inflight {
				wait(k)
			}
			inflight, inflightSeq = inflight[:0], inflightSeq[:0]
		}
		inflight = append(inflight, dev.Publish(fmt.Sprintf("sensors/%d", i%10), 1, false, fmt.Appendf(nil, `{"seq":%d}`, i)))
		inflightSeq = append(inflightSeq, i)
	}
	for k := range inflight {
		wait(k)
	}
	// A topic outside the filters is routed but not ingested.
	if tok := dev.Publish("other/x", 1, false, []byte("x")); !tok.WaitTimeout(waitBound) || tok.Error() != nil {
		t.Fatal(tok.Error())
	}
	dev.Disconnect(0)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}

	l2 := openLog(t, dir, opts)
	src := NewSource(l2)
	if err := src.Open(opCtx(0)); err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	got := drain(t, src)
	next := 0
	for k, m := range got {
		if m.Offset != uint64(k) {
			t.Fatalf("message %d has offset %d", k, m.Offset)
		}
		s := seqOf(t, m.Payload)
		if s < next {
			t.Fatalf("message %d: seq %d after %d: out of order", k, s, next-1)
		}
		// An unacknowledged message may be missing; an acknowledged one not.
		for ; next < s; next++ {
			if acked[next] {
				t.Fatalf("acknowledged seq %d missing from the log", next)
			}
		}
		if want := fmt.Sprintf("sensors/%d", s%10); m.Topic != want {
			t.Fatalf("seq %d on topic %q, want %q", s, m.Topic, want)
		}
		next = s + 1
	}
	for ; next < n; next++ {
		if acked[next] {
			t.Fatalf("acknowledged seq %d missing from the log", next)
		}
	}
	ackedCount := 0
	for _, a := range acked {
		if a {
			ackedCount++
		}
	}
	if ackedCount != n || len(got) != n {
		t.Fatalf("%d acknowledged, %d in the log, want %d", ackedCount, len(got), n)
	}
}

// A full log holds back the PUBACK until the source's checkpoint
// completes and truncation makes room.
func TestBrokerBackpressure(t *testing.T) {
	opts := ingestlog.DefaultOptions()
	opts.SegmentBytes = 4096
	opts.MaxBytes = 200
	l := openLog(t, t.TempDir(), opts)
	b := startBroker(t, l)
	dev := connect(t, b.Addr(), "device-bp")

	// Publish one message at a time until one is held in the hook.
	var toks []paho.Token
	deadline := time.Now().Add(waitBound)
	for blocked := false; !blocked; {
		tok := dev.Publish("sensors/a", 1, false, fmt.Appendf(nil, `{"seq":%d,"pad":"0123456789"}`, len(toks)))
		toks = append(toks, tok)
		for { // poll with a deadline: either the PUBACK or a waiting append
			if tok.WaitTimeout(time.Millisecond) {
				if tok.Error() != nil {
					t.Fatal(tok.Error())
				}
				break
			}
			if l.Stats().Waiting == 1 {
				blocked = true
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("neither a PUBACK nor a blocked append")
			}
		}
	}
	last := toks[len(toks)-1]
	select {
	case <-last.Done():
		t.Fatal("PUBACK sent while the append is blocked")
	default:
	}

	src := NewSource(l)
	if err := src.Open(opCtx(0)); err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	got := drain(t, src)
	if _, err := src.SnapshotState(1); err != nil {
		t.Fatal(err)
	}
	if err := src.NotifyCheckpointComplete(1); err != nil {
		t.Fatal(err)
	}
	if !last.WaitTimeout(waitBound) || last.Error() != nil {
		t.Fatalf("PUBACK after truncation: %v", last.Error())
	}
	if len(drain(t, src)) != 1 || len(got) != len(toks)-1 {
		t.Fatalf("read %d then the blocked one; published %d", len(got), len(toks))
	}
	if st := l.Stats(); st.Blocked == 0 {
		t.Fatalf("stats %+v: no blocked append", st)
	}
}

// Routes append each message to the log of every route it matches.
func TestBrokerRoutes(t *testing.T) {
	a := openLog(t, t.TempDir(), ingestlog.DefaultOptions())
	b := openLog(t, t.TempDir(), ingestlog.DefaultOptions())
	br, err := NewBroker(BrokerConfig{Address: "127.0.0.1:0", Filters: []string{"#"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := br.AddRoute([]string{"sensors/+/temp"}, a); err != nil {
		t.Fatal(err)
	}
	if err := br.AddRoute([]string{"sensors/#"}, b); err != nil {
		t.Fatal(err)
	}
	if err := br.AddRoute([]string{"bad/#/x"}, b); err == nil {
		t.Fatal("invalid filter accepted")
	}
	if err := br.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer br.Close()
	pc := DefaultPublisherConfig()
	pc.Broker, pc.ClientID = "tcp://"+br.Addr(), "routes"
	pub, err := NewPublisher(pc)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	for _, topic := range []string{"sensors/1/temp", "sensors/1/hum", "other"} {
		if err := pub.Publish(topic, []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	if err := pub.Flush(); err != nil {
		t.Fatal(err)
	}
	if got := a.Stats().NextOffset; got != 1 {
		t.Fatalf("route a got %d messages, want 1", got)
	}
	if got := b.Stats().NextOffset; got != 2 {
		t.Fatalf("route b got %d messages, want 2", got)
	}
}

// The embedded broker publishes its $SYS topics every sysTopicInterval
// seconds, not every second (mochi's default): each publication stops the
// world to read the runtime's memory statistics and makes garbage on an
// idle node.
func TestBrokerSysTopicInterval(t *testing.T) {
	b, err := NewBroker(BrokerConfig{Address: "127.0.0.1:0", Filters: []string{"#"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := b.Server().Options.SysTopicResendInterval; got != sysTopicInterval || got < 10 {
		t.Errorf("$SYS topics every %d s, want %d s", got, sysTopicInterval)
	}
}

// While its ingest is paused the broker refuses readings for its logs:
// the connection ends without a PUBACK, nothing is appended, and the
// refusal is counted; other topics are served. Resumed, it takes them
// again.
func TestBrokerPauseIngest(t *testing.T) {
	l := openLog(t, t.TempDir(), ingestlog.DefaultOptions())
	b := startBroker(t, l, "sensors/#")
	b.PauseIngest("node drained")

	dev := connect(t, b.Addr(), "device-1")
	if tok := dev.Publish("other/x", 1, false, []byte("x")); !tok.WaitTimeout(waitBound) || tok.Error() != nil {
		t.Fatalf("a topic no pipeline reads: %v", tok.Error())
	}
	tok := dev.Publish("sensors/1", 1, false, []byte(`{"seq":1}`))
	testutil.Eventually(t, waitBound, "the device's connection ends", func() bool { return !dev.IsConnectionOpen() })
	if tok.WaitTimeout(10*time.Millisecond) && tok.Error() == nil {
		t.Fatal("the refused reading was acknowledged")
	}
	if n := l.Stats().NextOffset; n != 0 || b.IngestRefused() != 1 {
		t.Fatalf("%d appended, %d refused; want 0 and 1", n, b.IngestRefused())
	}

	b.ResumeIngest()
	dev2 := connect(t, b.Addr(), "device-1")
	if tok := dev2.Publish("sensors/1", 1, false, []byte(`{"seq":1}`)); !tok.WaitTimeout(waitBound) || tok.Error() != nil {
		t.Fatalf("after resume: %v", tok.Error())
	}
	if n := l.Stats().NextOffset; n != 1 {
		t.Fatalf("%d appended after resume, want 1", n)
	}
}
