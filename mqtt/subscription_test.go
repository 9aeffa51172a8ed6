package mqtt

import (
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/mqtt/ingestlog"
)

func TestSubscriptionPlan(t *testing.T) {
	cfg := SubscriberConfig{Broker: "tcp://user:pw@127.0.0.1:1883", ClientID: "edged", Topics: []string{"a/#", "b/+"}, QoS: 1}
	held := func(filters map[string]byte) subscription {
		return subscription{Broker: "127.0.0.1:1883", ClientID: "edged", Filters: filters}
	}
	for _, tc := range []struct {
		name      string
		rec       subscription
		present   bool
		sub       []string
		unsub     []string
		readyNow  bool // held() > 0 with nothing to subscribe
		topics    []string
		qos       byte
		clientID  string
		brokerURL string
	}{
		{name: "first start", present: false, sub: []string{"a/#", "b/+"}},
		{name: "new session although a record", rec: held(map[string]byte{"a/#": 1, "b/+": 1}), present: false, sub: []string{"a/#", "b/+"}},
		{name: "resumed, all held", rec: held(map[string]byte{"a/#": 1, "b/+": 1}), present: true, readyNow: true},
		{name: "resumed, no record", present: true, sub: []string{"a/#", "b/+"}},
		{name: "resumed, one added", rec: held(map[string]byte{"a/#": 1}), present: true, sub: []string{"b/+"}},
		{name: "resumed, one removed", rec: held(map[string]byte{"a/#": 1, "b/+": 1, "old/#": 1, "c": 0}), present: true,
			unsub: []string{"c", "old/#"}, readyNow: true},
		{name: "resumed, QoS changed", rec: held(map[string]byte{"a/#": 1, "b/+": 1}), present: true, qos: 2, sub: []string{"a/#", "b/+"}},
		{name: "resumed, another client id", rec: held(map[string]byte{"a/#": 1, "b/+": 1}), present: true, clientID: "other", sub: []string{"a/#", "b/+"}},
		{name: "resumed, another broker", rec: held(map[string]byte{"a/#": 1, "b/+": 1}), present: true, brokerURL: "tcp://127.0.0.1:1884", sub: []string{"a/#", "b/+"}},
		{name: "resumed, same broker other scheme and password", rec: held(map[string]byte{"a/#": 1, "b/+": 1}), present: true,
			brokerURL: "mqtt://x:y@127.0.0.1:1883", readyNow: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := cfg
			if tc.qos != 0 {
				c.QoS = tc.qos
			}
			if tc.clientID != "" {
				c.ClientID = tc.clientID
			}
			if tc.brokerURL != "" {
				c.Broker = tc.brokerURL
			}
			s := newSubscriptions("", c, nil)
			s.rec = tc.rec
			p := s.plan(tc.present)
			if !slices.Equal(p.sub, tc.sub) || !slices.Equal(p.unsub, tc.unsub) {
				t.Fatalf("plan %+v, want sub %v unsub %v", p, tc.sub, tc.unsub)
			}
			if got := len(p.sub) == 0 && s.held() > 0; got != tc.readyNow {
				t.Fatalf("ready without a SUBACK: %v, want %v", got, tc.readyNow)
			}
		})
	}
}

// The record follows the broker's answers, survives a restart, and a
// damaged one counts as none.
func TestSubscriptionRecord(t *testing.T) {
	dir := t.TempDir()
	discard := slog.New(slog.DiscardHandler)
	cfg := SubscriberConfig{Broker: "tcp://127.0.0.1:1883", ClientID: "edged", Topics: []string{"a/#", "b/+", "c"}, QoS: 1}
	s := newSubscriptions(dir, cfg, discard)
	p := s.plan(false)
	if n, err := s.subscribed(p.sub, []byte{1, 0x80, 0}); err != nil || n != 2 {
		t.Fatalf("subscribed: %d held (%v), want 2", n, err)
	}
	s = newSubscriptions(dir, cfg, discard)
	if p := s.plan(true); !slices.Equal(p.sub, []string{"b/+"}) || len(p.unsub) != 0 {
		t.Fatalf("after a restart the plan is %+v, want the refused filter only", p)
	}
	cfg.Topics = []string{"b/+"}
	s = newSubscriptions(dir, cfg, discard)
	p = s.plan(true)
	if !slices.Equal(p.sub, []string{"b/+"}) || !slices.Equal(p.unsub, []string{"a/#", "c"}) {
		t.Fatalf("plan %+v", p)
	}
	if err := s.unsubscribed(p.unsub); err != nil {
		t.Fatal(err)
	}
	if s = newSubscriptions(dir, cfg, discard); s.held() != 0 {
		t.Fatalf("%d held after the unsubscription", s.held())
	}
	if err := os.WriteFile(filepath.Join(dir, subscriptionFile), []byte("{not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	var logs strings.Builder
	if p := newSubscriptions(dir, cfg, slog.New(slog.NewTextHandler(&logs, nil))).plan(true); !slices.Equal(p.sub, []string{"b/+"}) {
		t.Fatalf("a damaged record gave the plan %+v", p)
	}
	if !strings.Contains(logs.String(), "unreadable") {
		t.Fatalf("a damaged record was not logged: %s", logs.String())
	}
}

// A retained message is logged once per subscription, not once per
// connection: a subscriber that restarts and resumes its session does not
// subscribe again, so the broker does not resend its retained messages; a
// topic added to the configuration is subscribed to (its retained message
// logged once), and a topic removed is unsubscribed from, so its messages
// stop.
func TestSubscriberRetainedMessageLoggedOnce(t *testing.T) {
	forEachClient(t, func(t *testing.T, client string) {
		testSubscriberRetainedMessageLoggedOnce(t, client, startBroker(t, nil).Addr())
	})
}

// The same against Mosquitto, which resends a filter's retained messages
// on every SUBSCRIBE too.
func TestSubscriberRetainedMessageLoggedOnceMosquitto(t *testing.T) {
	forEachClient(t, func(t *testing.T, client string) {
		testSubscriberRetainedMessageLoggedOnce(t, client, startMosquitto(t, ""))
	})
}

func testSubscriberRetainedMessageLoggedOnce(t *testing.T, client, addr string) {
	pub := connect(t, addr, "publisher")
	publish := func(topic, payload string, retained bool) {
		t.Helper()
		if tok := pub.Publish(topic, 1, retained, payload); !tok.WaitTimeout(waitBound) || tok.Error() != nil {
			t.Fatalf("publish %s: %v", topic, tok.Error())
		}
	}
	publish("sensors/r", "retained-1", true)
	publish("other/r", "retained-2", true)

	dir := t.TempDir()
	run := func(topics []string, marker string, then func()) {
		t.Helper()
		l := openLog(t, dir, ingestlog.DefaultOptions())
		sub := startSubscriberWith(t, SubscriberConfig{Broker: "tcp://" + addr, ClientID: "edged-retained", Topics: topics, QoS: 1, Client: client}, l)
		if then != nil {
			then()
		}
		publish("sensors/m", marker, false)
		testutil.Eventually(t, waitBound, "the marker "+marker+" is logged", func() bool {
			return slices.Contains(payloadsOf(t, l), marker)
		})
		if err := sub.Close(); err != nil {
			t.Fatal(err)
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
	}
	run([]string{"sensors/#"}, "m1", nil)
	run([]string{"sensors/#"}, "m2", nil)
	run([]string{"sensors/#", "other/#"}, "m3", nil)
	run([]string{"sensors/#", "other/#"}, "m4", nil)
	run([]string{"sensors/#"}, "m5", func() { publish("other/x", "unsubscribed", false) })
	l := openLog(t, dir, ingestlog.DefaultOptions())
	got := payloadsOf(t, l)
	want := []string{"retained-1", "m1", "m2", "retained-2", "m3", "m4", "m5"}
	if !slices.Equal(got, want) {
		t.Fatalf("logged %q, want %q", got, want)
	}
}

// payloadsOf returns the payloads of every record of l, in order.
func payloadsOf(t *testing.T, l *ingestlog.Log) []string {
	t.Helper()
	var out []string
	for _, rec := range readAll(t, l) {
		out = append(out, string(rec.Payload))
	}
	return out
}
