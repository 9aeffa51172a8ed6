package mqtt

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgedio/edged/internal/mqtttest"
	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/operators"
)

// BenchmarkPublisherResults publishes 100,000 window-result-like JSON
// lines with msg_ids through PublishFunc (what a write-ahead sink does
// when a checkpoint with 100,000 results completes) to Mosquitto at QoS
// 1 with 1024 in flight, and the same records through a bare paho client
// with the same window in the same run (the publisher before it spoke
// MQTT itself). It reports both rates, their ratio, and CPU time per
// message of this process (the publisher, and the consumer when there is
// one) and of Mosquitto.
//
// With consumer=qos1 a paho client subscribed at QoS 1 (as the restart
// benchmark's consumer is) must have received every message before a
// round ends: the rate end to end through Mosquitto.
//
//	go test ./mqtt -run XXX -bench PublisherResults -benchtime 3x
func BenchmarkPublisherResults(b *testing.B) {
	for _, consumer := range []bool{false, true} {
		name := "consumer=none"
		if consumer {
			name = "consumer=qos1"
		}
		b.Run(name, func(b *testing.B) { benchPublisherResults(b, consumer) })
	}
}

func benchPublisherResults(b *testing.B, consumer bool) {
	// As edged-bench's: a queue per subscriber that holds every message,
	// so that a consumer behind the publisher loses none.
	addr, mosq := mqtttest.StartMosquitto(b, "max_inflight_messages 1000\nmax_queued_messages 2000000\n")
	var received atomic.Int64
	if consumer {
		countResults(b, addr, &received)
	}
	const n = 100_000
	recs, id := benchReadings(n)

	cfg := DefaultPublisherConfig()
	cfg.Broker, cfg.ClientID = "tcp://"+addr, "bench-pub"
	pub, err := NewPublisher(cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer pub.Close()
	ours := PublishFunc(pub, readingTopic, encodeReading, nil)

	pc := paho.NewClient(paho.NewClientOptions().AddBroker("tcp://" + addr).SetClientID("bench-paho").
		SetAutoReconnect(false).SetOrderMatters(false))
	if tok := pc.Connect(); !tok.WaitTimeout(waitBound) || tok.Error() != nil {
		b.Fatal(tok.Error())
	}
	defer pc.Disconnect(0)
	bare := func(recs []reading, id func(int) string) error {
		toks := make([]paho.Token, 0, n)
		for i, r := range recs {
			if i >= cfg.MaxInflight {
				toks[i-cfg.MaxInflight].Wait()
			}
			topic, _ := readingTopic(r)
			p, _ := encodeReading(r)
			toks = append(toks, pc.Publish(topic, cfg.QoS, false, WithMsgID(p, id(i))))
		}
		for _, t := range toks {
			if !t.WaitTimeout(waitBound) || t.Error() != nil {
				return fmt.Errorf("paho: %v", t.Error())
			}
		}
		return nil
	}

	type totals struct{ wall, cpu, mosq time.Duration }
	run := func(f Publish, into *totals) {
		received.Store(0)
		c0, m0, t0 := processCPU(), procCPU(b, mosq), time.Now()
		if err := f(recs, id); err != nil {
			b.Fatal(err)
		}
		if consumer {
			testutil.Eventually(b, waitBound, "every message at the consumer", func() bool { return received.Load() >= n })
		}
		into.wall += time.Since(t0)
		into.cpu += processCPU() - c0
		into.mosq += procCPU(b, mosq) - m0
	}
	var o, p totals
	b.ResetTimer()
	for range b.N {
		run(ours, &o)
		run(bare, &p)
	}
	msgs := float64(n * b.N)
	b.ReportMetric(msgs/o.wall.Seconds(), "msgs/s")
	b.ReportMetric(msgs/p.wall.Seconds(), "paho-msgs/s")
	b.ReportMetric(p.wall.Seconds()/o.wall.Seconds(), "speedup")
	b.ReportMetric(float64(o.cpu.Microseconds())/msgs, "cpu-us/msg")
	b.ReportMetric(float64(p.cpu.Microseconds())/msgs, "paho-cpu-us/msg")
	b.ReportMetric(float64(o.mosq.Microseconds())/msgs, "mosquitto-cpu-us/msg")
	b.ReportMetric(float64(p.mosq.Microseconds())/msgs, "paho-mosquitto-cpu-us/msg")
}

// Publish is the type of PublishFunc's result for reading records.
type Publish = operators.Publish[reading]

// procCPU is the user and system CPU time of process pid.
func procCPU(b *testing.B, pid int) time.Duration {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	// Fields after the command name, which is in parentheses.
	f := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+1:]))
	u, _ := strconv.ParseInt(f[11], 10, 64)
	s, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u+s) * 10 * time.Millisecond // USER_HZ is 100 on Linux
}

// countResults subscribes a paho client to agg/# at QoS 1 on the broker
// at addr (as the restart benchmark's consumer is) and counts the
// messages it receives in received. It disconnects when b's run ends.
func countResults(b *testing.B, addr string, received *atomic.Int64) {
	b.Helper()
	sub := paho.NewClient(paho.NewClientOptions().AddBroker("tcp://" + addr).SetClientID("bench-consumer").
		SetAutoReconnect(false).SetOrderMatters(false).SetDefaultPublishHandler(func(paho.Client, paho.Message) {}))
	if tok := sub.Connect(); !tok.WaitTimeout(waitBound) || tok.Error() != nil {
		b.Fatal(tok.Error())
	}
	b.Cleanup(func() { sub.Disconnect(0) })
	if tok := sub.Subscribe("agg/#", 1, func(paho.Client, paho.Message) { received.Add(1) }); !tok.WaitTimeout(waitBound) || tok.Error() != nil {
		b.Fatal(tok.Error())
	}
}

// benchReadings returns n window-result-like records, each of its own
// sensor, and their msg_ids by index.
func benchReadings(n int) ([]reading, func(int) string) {
	recs := make([]reading, n)
	for i := range recs {
		recs[i] = reading{Sensor: fmt.Sprintf("r%06d", i), Seq: i}
	}
	return recs, func(i int) string { return operators.RecordID("uid", recs[i].Sensor) }
}
