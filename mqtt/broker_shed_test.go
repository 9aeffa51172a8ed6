package mqtt

import (
	"fmt"
	"testing"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/mqtt/ingestlog"
)

// Two pipelines read the same topics; one of them no longer runs and its
// small log is full. Until that log sheds, a device publishing there is
// held back for both (its PUBACK waits); once it sheds, the device's QoS
// 1 and QoS 2 messages are acknowledged and the running pipeline's log
// takes every one, the full log none, counted as shed.
func TestBrokerFullLogThatShedsHoldsNoDeviceBack(t *testing.T) {
	small := ingestlog.DefaultOptions()
	small.SegmentBytes, small.MaxBytes = 4096, 8192
	stopped := openLog(t, t.TempDir(), small)
	running := openLog(t, t.TempDir(), ingestlog.DefaultOptions())
	cfg := DefaultBrokerConfig()
	cfg.DataDir = t.TempDir() // QoS 2 from a persistent session: exactly-once receipts
	b := startBrokerWith(t, stopped, cfg, func(b *Broker) {
		if err := b.AddRoute([]string{"sensors/#"}, running); err != nil {
			t.Fatal(err)
		}
	})
	dev := connect(t, b.Addr(), "device-1", func(o *paho.ClientOptions) { o.SetCleanSession(false) })

	// Fill the stopped pipeline's log until a publish waits for room.
	var held paho.Token
	sent := 0
	for held == nil {
		tok := dev.Publish("sensors/1", 1, false, fmt.Appendf(nil, `{"seq":%d,"pad":"%0200d"}`, sent, 0))
		sent++
		if !testutil.Within(waitBound, func() bool { return done(tok) || stopped.Stats().Waiting > 0 }) {
			t.Fatalf("publish %d neither acknowledged nor waiting for room", sent)
		}
		if !done(tok) {
			held = tok
		}
		if sent > 1000 {
			t.Fatal("the small log never filled")
		}
	}
	before := stopped.Stats().NextOffset
	stopped.ShedWhenFull(true)
	if !held.WaitTimeout(waitBound) || held.Error() != nil {
		t.Fatalf("the held publish once the log sheds: %v", held.Error())
	}
	const more = 200
	var toks []paho.Token
	for i := range more {
		toks = append(toks, dev.Publish("sensors/2", byte(1+i%2), false, fmt.Appendf(nil, `{"seq":%d,"pad":"%0200d"}`, sent+i, 0)))
	}
	for i, tok := range toks {
		if !tok.WaitTimeout(waitBound) || tok.Error() != nil {
			t.Fatalf("publish %d (QoS %d) while the full log sheds: %v", sent+i, 1+i%2, tok.Error())
		}
	}
	total := uint64(sent + more)
	if got := running.Stats().NextOffset; got != total {
		t.Fatalf("the running pipeline's log holds %d messages, want %d", got, total)
	}
	st := stopped.Stats()
	if st.NextOffset != before || st.Shed != total-before {
		t.Fatalf("the full log holds %d (had %d) and shed %d; want %d shed and nothing more stored", st.NextOffset, before, st.Shed, total-before)
	}
}

// done reports whether tok completed.
func done(tok paho.Token) bool {
	select {
	case <-tok.Done():
		return true
	default:
		return false
	}
}
