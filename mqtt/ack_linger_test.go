package mqtt

import (
	"context"
	"testing"
	"time"

	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/mqtt/ingestlog"
)

func TestAckLingerDecisions(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	type step struct {
		at      time.Duration // after t0
		quiet   bool          // the broker was quiet: record the window
		goOn    bool          // a quiet step: the wait goes on
		unacked int64
		half    bool
		want    bool // more (ignored for a quiet step)
		window  int64
	}
	for _, tc := range []struct {
		name  string
		delay time.Duration
		steps []step
	}{
		{"no delay never waits", 0, []step{{unacked: 1, want: false}}},
		{"waits while the window is unknown", time.Millisecond, []step{
			{unacked: 1, want: true}, {unacked: 900, want: true},
		}},
		{"half of its own bounds stops it", time.Millisecond, []step{{unacked: 3, half: true, want: false}}},
		{"a single quiet learns nothing", time.Millisecond, []step{
			{unacked: 20, quiet: true, window: 0},
			{unacked: 15, want: true, window: 0},
			{unacked: 12, quiet: true, window: 0},
		}},
		{"learns the window and stops at its half", time.Millisecond, []step{
			{unacked: 20, quiet: true, window: 0},
			{unacked: 20, quiet: true, window: 20},
			{at: time.Millisecond, unacked: 9, want: true, window: 20},
			{at: time.Millisecond, unacked: 10, want: false, window: 20},
			{at: 2 * time.Millisecond, unacked: 20, want: false, window: 20},
		}},
		{"a window of one never waits", time.Millisecond, []step{
			{unacked: 1, quiet: true, window: 0},
			{unacked: 1, quiet: true, window: 1},
			{unacked: 0, want: true, window: 1},
			{unacked: 1, want: false, window: 1},
		}},
		{"more outstanding than the window forgets it", time.Millisecond, []step{
			{unacked: 20, quiet: true, window: 0},
			{unacked: 20, quiet: true, window: 20},
			{at: time.Millisecond, unacked: 21, want: true, window: 0},
			{at: time.Millisecond, unacked: 15, want: true, window: 0},
		}},
		{"a window expires", time.Millisecond, []step{
			{unacked: 20, quiet: true, window: 0},
			{unacked: 20, quiet: true, window: 20},
			{at: ackWindowTTL - time.Nanosecond, unacked: 10, want: false, window: 20},
			{at: ackWindowTTL, unacked: 10, want: true, window: 0},
		}},
		{"a broker that has shown twice as many outstanding is slow, not full", time.Millisecond, []step{
			{unacked: 40, want: true},
			{unacked: 19, quiet: true, goOn: true, window: 0},
			{unacked: 19, quiet: true, goOn: true, window: 0},
			{unacked: 20, quiet: true, window: 0},
			{unacked: 20, quiet: true, window: 20},
		}},
		{"what was shown expires", time.Millisecond, []step{
			{unacked: 40, want: true},
			{at: ackWindowTTL - time.Nanosecond, unacked: 10, quiet: true, goOn: true},
			{at: ackWindowTTL, unacked: 10, quiet: true},
		}},
		{"shown again keeps it", time.Millisecond, []step{
			{unacked: 40, want: true},
			{at: ackWindowTTL / 2, unacked: 40, want: true},
			{at: ackWindowTTL, unacked: 10, quiet: true, goOn: true},
		}},
		{"quiet with nothing outstanding learns nothing", time.Millisecond, []step{
			{unacked: 0, quiet: true, window: 0},
			{unacked: 5, want: true, window: 0},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := ackLinger{delay: tc.delay}
			for i, s := range tc.steps {
				now := t0.Add(s.at)
				if s.quiet {
					if end := l.quiet(now, s.unacked); end == s.goOn {
						t.Fatalf("step %d: quiet(+%v, %d) ends the wait: %v, want %v", i, s.at, s.unacked, end, !s.goOn)
					}
				} else if got := l.more(now, s.unacked, s.half); got != s.want {
					t.Fatalf("step %d: more(+%v, %d, %v) = %v, want %v", i, s.at, s.unacked, s.half, got, s.want)
				}
				if l.window != s.window {
					t.Fatalf("step %d: window %d, want %d", i, l.window, s.window)
				}
			}
		})
	}
}

// lingerSubscriber returns a subscriber that is not started, whose acker's
// linger lingerFor runs by hand, with MaxPending pending.
func lingerSubscriber(t *testing.T, pending int) *Subscriber {
	t.Helper()
	l := openLog(t, t.TempDir(), ingestlog.DefaultOptions())
	s, err := NewSubscriber(SubscriberConfig{Broker: "tcp://127.0.0.1:1", Topics: []string{"x"}, ClientID: "linger", MaxPending: pending}, l)
	if err != nil {
		t.Fatal(err)
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	t.Cleanup(func() { s.cancel() })
	// A delay far beyond the bound of the waits: only the rules can end
	// a linger (the tests that need the quiet rule shorten it).
	s.linger.delay, s.linger.still = time.Hour, time.Hour
	return s
}

// hand gives the acker n batches of one message each, as the reader does.
func hand(s *Subscriber, n int) {
	for range n {
		s.unacked.Add(1)
		s.slots.tryAcquire(1)
		s.pending <- &batch{}
	}
}

// runLinger runs lingerFor with the batches taken so far and returns what
// it took, once it returns.
func runLinger(t *testing.T, s *Subscriber, bs []*batch) []*batch {
	t.Helper()
	done := make(chan []*batch, 1)
	go func() { done <- s.lingerFor(bs, stoppedTimer(), stoppedTimer()) }()
	return testutil.Receive(t, waitBound, "lingerFor to return", done)
}

func TestAckLingerStopsAtHalfOfMaxPending(t *testing.T) {
	s := lingerSubscriber(t, 8)
	hand(s, 3)
	first := <-s.pending
	done := make(chan []*batch, 1)
	go func() { done <- s.lingerFor([]*batch{first}, stoppedTimer(), stoppedTimer()) }()
	// It takes the other two and waits: 3 of 8 outstanding.
	testutil.Eventually(t, waitBound, "the linger to take the batches handed", func() bool { return len(s.pending) == 0 })
	hand(s, 1) // 4 of 8
	bs := testutil.Receive(t, waitBound, "lingerFor to stop at half of max_pending", done)
	if len(bs) != 4 {
		t.Fatalf("took %d batches, want 4", len(bs))
	}
}

// A slow broker's messages each arrive in a batch of their own: the
// group commit still takes them until half of max_pending is outstanding,
// however many batches that is.
func TestAckLingerCountsMessagesNotBatches(t *testing.T) {
	s := lingerSubscriber(t, 1024)
	hand(s, 300)
	first := <-s.pending
	done := make(chan []*batch, 1)
	go func() { done <- s.lingerFor([]*batch{first}, stoppedTimer(), stoppedTimer()) }()
	var ended []*batch
	testutil.Eventually(t, waitBound, "the linger to take the 300 batches handed", func() bool {
		select {
		case ended = <-done:
			return true
		default:
			return len(s.pending) == 0
		}
	})
	if ended != nil {
		t.Fatalf("the wait ended after %d single-message batches, with 300 of max_pending 1024 outstanding", len(ended))
	}
	hand(s, 211)
	testutil.Eventually(t, waitBound, "the linger to take the 211 more", func() bool { return len(s.pending) == 0 })
	hand(s, 1) // 512 of 1024
	bs := testutil.Receive(t, waitBound, "lingerFor to stop at half of max_pending", done)
	if len(bs) != 512 {
		t.Fatalf("took %d batches, want 512", len(bs))
	}
}

func TestAckLingerLearnsTheBrokersWindow(t *testing.T) {
	s := lingerSubscriber(t, 1024)
	s.linger.still = ackQuiet
	// The broker sends 6 and stops, twice: after ackQuiet of nothing
	// each time, the acker takes 6 as its window.
	for round := range 2 {
		s.unacked.Store(0)
		hand(s, 6)
		first := <-s.pending
		if bs := runLinger(t, s, []*batch{first}); len(bs) != 6 {
			t.Fatalf("round %d: took %d batches, want the 6 sent", round, len(bs))
		}
	}
	if s.linger.window != 6 {
		t.Fatalf("window %d, want 6", s.linger.window)
	}
	// Acknowledged; the broker sends the next 6. With 3 outstanding, half
	// of the window, the acker stops waiting at once: the broker has
	// nothing more to send before it sees acknowledgements.
	s.unacked.Store(0)
	hand(s, 3)
	first := <-s.pending
	bs := runLinger(t, s, []*batch{first})
	if len(bs) > 3 {
		t.Fatalf("took %d batches, want at most the 3 sent", len(bs))
	}
	if s.linger.window != 6 {
		t.Fatalf("window %d after the second group, want 6 still", s.linger.window)
	}
}

// A broker that has had many messages outstanding at once and then
// pauses with far fewer is slow, not waiting for acknowledgements: the
// acker waits on through the pauses until its delay ends, so that the
// bursts share one fsync.
func TestAckLingerWaitsThroughTheSlowBrokersPauses(t *testing.T) {
	s := lingerSubscriber(t, 1024)
	s.linger.still = time.Microsecond
	s.linger.see(time.Now(), 100) // it had 100 outstanding
	hand(s, 2)
	first := <-s.pending
	done := make(chan []*batch, 1)
	go func() { done <- s.lingerFor([]*batch{first}, stoppedTimer(), stoppedTimer()) }()
	// Pauses far longer than the quiet bound pass between the bursts.
	testutil.Eventually(t, waitBound, "the linger to take the first burst", func() bool { return len(s.pending) == 0 })
	testutil.Eventually(t, waitBound, "the acker to wait through a pause", func() bool { return s.pauses.Load() > 0 })
	hand(s, 3)
	testutil.Eventually(t, waitBound, "the linger to take the second burst", func() bool { return len(s.pending) == 0 })
	select {
	case bs := <-done:
		t.Fatalf("the wait ended after %d batches on a pause, with 5 of the 100 shown outstanding", len(bs))
	default:
	}
	// Half of what the broker showed: it may be waiting; the wait ends
	// at the next pause (which may come before the acker took them all).
	hand(s, 45)
	bs := testutil.Receive(t, waitBound, "lingerFor to end at half of what the broker showed", done)
	if len(bs) < 5 || len(bs) > 50 {
		t.Fatalf("took %d batches, want the 5 before and at most the 45 sent after", len(bs))
	}
}

// While the direct reader lets messages gather in the socket, the
// connection is not being read: the acker does not take it for quiet
// until the reader has read it for ackQuiet after the pause.
func TestAckLingerCountsNoQuietWhileTheReaderGathers(t *testing.T) {
	s := lingerSubscriber(t, 1024)
	s.linger.still = time.Microsecond
	const pause = 50 * time.Millisecond
	start := time.Now()
	s.gathered.Store(start.Add(pause).UnixNano())
	hand(s, 1)
	first := <-s.pending
	runLinger(t, s, []*batch{first})
	if took := time.Since(start); took < pause {
		t.Fatalf("the wait ended quiet after %v, while the reader gathered until %v", took, pause)
	}
}

func TestReaderGathersOnlyWhileTheAckerLingers(t *testing.T) {
	s := lingerSubscriber(t, 1024)
	s.gatherPause = time.Millisecond
	if p := s.gatherFor(100); p != 0 {
		t.Fatalf("paused %v while the acker did not wait for more", p)
	}
	s.lingering.Store(true)
	for _, c := range []struct {
		last int
		want time.Duration
	}{
		{0, 0},                  // the read brought nothing (a deadline, the first read)
		{100, time.Millisecond}, // a message or two
		{gatherSmall - 1, time.Millisecond},
		{gatherSmall, 0}, // the broker fills reads on its own
		{connReadBuffer, 0},
	} {
		before := time.Now()
		if p := s.gatherFor(c.last); p != c.want {
			t.Fatalf("after a read of %d bytes: pause %v, want %v", c.last, p, c.want)
		}
		if end := time.Unix(0, s.gathered.Load()); c.want > 0 && end.Before(before.Add(c.want)) {
			t.Fatalf("after a read of %d bytes: the pause is recorded to end at %v, before %v", c.last, end, before.Add(c.want))
		}
	}
	s.gatherPause = 0 // ack_delay 0s: no wait, no pause
	if p := s.gatherFor(100); p != 0 {
		t.Fatalf("paused %v with ack_delay 0s", p)
	}
}

func TestAckLingerEndsWhenClosed(t *testing.T) {
	s := lingerSubscriber(t, 1024)
	hand(s, 1)
	first := <-s.pending
	done := make(chan []*batch, 1)
	go func() { done <- s.lingerFor([]*batch{first}, stoppedTimer(), stoppedTimer()) }()
	s.cancel()
	testutil.Receive(t, waitBound, "lingerFor to return once the subscriber closes", done)
}

// Against Mosquitto with its default in-flight setting (20), the
// longest ack_delay does not hold the broker back: 3,000 messages
// acknowledged in groups each held for the whole delay would take longer
// than the bound of the wait.
func TestSubscriberLongAckDelayKeepsUpWithMosquitto(t *testing.T) {
	forEachClient(t, testSubscriberLongAckDelayKeepsUpWithMosquitto)
}

func testSubscriberLongAckDelayKeepsUpWithMosquitto(t *testing.T, client string) {
	const n = 3000
	mq := startMosquitto(t, "max_inflight_messages 20\nmax_queued_messages 100000\n")
	l := openLog(t, t.TempDir(), ingestlog.DefaultOptions())
	sub := startSubscriberWith(t, SubscriberConfig{Broker: "tcp://" + mq, ClientID: "edged-window", Topics: []string{"sensors/#"},
		Client: client, AckDelay: MaxAckDelay}, l)
	pub := connect(t, mq, "publisher")
	if err := publishSeq(t, pub, 0, n); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, waitBound, "every message durable in the log", func() bool { return l.Stats().DurableOffset >= n })
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
}
