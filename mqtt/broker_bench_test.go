package mqtt

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/edgedio/edged/mqtt/ingestlog"
)

// benchWindow is the QoS 1 messages each benchmark publisher keeps in
// flight: a device with a send buffer, not one waiting for each PUBACK.
const benchWindow = 256

// BenchmarkBrokerIngest measures durable QoS 1 ingestion through the
// embedded broker: N publishers on raw TCP connections, each with
// benchWindow messages in flight, publish b.N 45-byte readings in all;
// every PUBACK means the message is in the ingest log and fsynced. The
// baseline in the same run is the same broker and load without an ingest
// log (mochi alone). Publishers run in the same process, so CPU-µs/msg
// (process CPU time per message) includes theirs.
//
//	go test ./mqtt -run '^$' -bench BrokerIngest -benchtime 200000x -count 3
func BenchmarkBrokerIngest(b *testing.B) {
	for _, pubs := range []int{1, 4, 16} {
		b.Run(fmt.Sprintf("pubs=%d", pubs), func(b *testing.B) {
			durable := runIngestBench(b, pubs, true, false)
			base := runIngestBench(b, pubs, false, false)
			b.ReportMetric(durable.rate, "msgs/s")
			b.ReportMetric(durable.fsyncsPerMsg, "fsyncs/msg")
			b.ReportMetric(durable.cpuPerMsg, "CPU-µs/msg")
			b.ReportMetric(base.rate, "nolog-msgs/s")
			b.ReportMetric(base.cpuPerMsg, "nolog-CPU-µs/msg")
			b.ReportMetric(durable.rate/base.rate, "ratio")
		})
	}
}

// BenchmarkBrokerIngestSessions measures what the daemon's broker
// configuration adds to durable QoS 1 ingestion: the daemon sets
// BrokerConfig.DataDir (the session journal, its hook on every packet and
// the journal's sync before each append), BenchmarkBrokerIngest does not.
// The baseline in the same run is the same load without DataDir.
//
//	go test ./mqtt -run '^$' -bench BrokerIngestSessions -benchtime 100000x -count 3
func BenchmarkBrokerIngestSessions(b *testing.B) {
	for _, pubs := range []int{4, 16} {
		b.Run(fmt.Sprintf("pubs=%d", pubs), func(b *testing.B) {
			sessions := runIngestBench(b, pubs, true, true)
			base := runIngestBench(b, pubs, true, false)
			b.ReportMetric(sessions.rate, "msgs/s")
			b.ReportMetric(sessions.cpuPerMsg, "CPU-µs/msg")
			b.ReportMetric(base.rate, "nodatadir-msgs/s")
			b.ReportMetric(base.cpuPerMsg, "nodatadir-CPU-µs/msg")
			b.ReportMetric(sessions.rate/base.rate, "ratio")
			b.ReportMetric(sessions.cpuPerMsg/base.cpuPerMsg, "cpu-ratio")
		})
	}
}

// BenchmarkBrokerIngestOfflineSession measures durable QoS 1 ingestion
// while a persistent session subscribed to the readings is offline, so
// that every message is also queued for it (up to 60,000, below the
// per-session bound). The baseline in the same run is the same load with
// the session journal and no persistent session.
//
//	go test ./mqtt -run '^$' -bench BrokerIngestOfflineSession -benchtime 60000x -count 3
func BenchmarkBrokerIngestOfflineSession(b *testing.B) {
	if b.N > 60000 {
		b.Skip("the offline session would queue more than 60,000 messages")
	}
	offline := runIngestBenchWith(b, 4, true, true, true)
	base := runIngestBench(b, 4, true, true)
	b.ReportMetric(offline.rate, "msgs/s")
	b.ReportMetric(offline.cpuPerMsg, "CPU-µs/msg")
	b.ReportMetric(base.rate, "nosession-msgs/s")
	b.ReportMetric(base.cpuPerMsg, "nosession-CPU-µs/msg")
	b.ReportMetric(offline.rate/base.rate, "ratio")
}

type ingestBenchResult struct {
	rate, fsyncsPerMsg, cpuPerMsg float64
}

// runIngestBench starts a broker (with an ingest log on a temp dir if
// durable, with a session journal as the daemon's if sessions),
// publishes b.N messages over pubs connections and returns the rate,
// fsyncs and process CPU per message.
func runIngestBench(b *testing.B, pubs int, durable, sessions bool) ingestBenchResult {
	b.Helper()
	return runIngestBenchWith(b, pubs, durable, sessions, false)
}

// runIngestBenchWith is runIngestBench, with a persistent session
// subscribed to every reading and offline during the run if offline.
func runIngestBenchWith(b *testing.B, pubs int, durable, sessions, offline bool) ingestBenchResult {
	b.Helper()
	var l *ingestlog.Log
	if durable {
		var err error
		l, err = ingestlog.Open(b.TempDir(), ingestlog.DefaultOptions(), nil)
		if err != nil {
			b.Fatal(err)
		}
		defer l.Close()
	}
	cfg := DefaultBrokerConfig()
	cfg.Address = "127.0.0.1:0"
	if sessions {
		cfg.DataDir = b.TempDir()
	}
	if offline {
		// 60,000 queued messages cost about 100 MB, past the default bound:
		// the run measures queuing, not back-pressure.
		cfg.SessionMaxBytes = 0
	}
	br, err := NewBroker(cfg, l)
	if err != nil {
		b.Fatal(err)
	}
	if err := br.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	defer br.Close()
	if offline {
		sub := connect(b, br.Addr(), "offline-consumer", func(o *paho.ClientOptions) { o.SetCleanSession(false) })
		if tok := sub.Subscribe("sensors/#", 1, nil); !tok.WaitTimeout(waitBound) || tok.Error() != nil {
			b.Fatalf("subscribe: %v", tok.Error())
		}
		sub.Disconnect(0)
	}

	clients := make([]*benchPublisher, pubs)
	for i := range clients {
		clients[i] = dialBenchPublisher(b, br.Addr(), fmt.Sprintf("bench-%d", i))
		defer clients[i].conn.Close()
	}
	var fsyncs0 uint64
	if l != nil {
		fsyncs0 = l.Stats().Fsyncs
	}
	cpu0 := processCPU()
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, pubs)
	for i, c := range clients {
		n := b.N / pubs
		if i < b.N%pubs {
			n++
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := c.run(n); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	cpu := processCPU() - cpu0
	b.StopTimer()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	res := ingestBenchResult{
		rate:      float64(b.N) / elapsed.Seconds(),
		cpuPerMsg: float64(cpu.Microseconds()) / float64(b.N),
	}
	if l != nil {
		st := l.Stats()
		if st.Appends < uint64(b.N) {
			b.Fatalf("%d appends for %d acknowledged messages", st.Appends, b.N)
		}
		res.fsyncsPerMsg = float64(st.Fsyncs-fsyncs0) / float64(b.N)
	}
	return res
}

// processCPU returns the user and system CPU time of the process so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchPublisher is an MQTT 3.1.1 publisher on a raw connection that
// keeps up to benchWindow QoS 1 messages in flight.
type benchPublisher struct {
	conn net.Conn
	r    *bufio.Reader
}

func dialBenchPublisher(b *testing.B, addr, id string) *benchPublisher {
	b.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		b.Fatal(err)
	}
	var buf bytes.Buffer
	pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Connect}, ProtocolVersion: 4,
		Connect: packets.ConnectParams{ProtocolName: []byte("MQTT"), ClientIdentifier: id, Clean: true, Keepalive: 60}}
	if err := pk.ConnectEncode(&buf); err != nil {
		b.Fatal(err)
	}
	if _, err := conn.Write(buf.Bytes()); err != nil {
		b.Fatal(err)
	}
	c := &benchPublisher{conn: conn, r: bufio.NewReader(conn)}
	var ack [4]byte
	if _, err := io.ReadFull(c.r, ack[:]); err != nil || ack[0]>>4 != packets.Connack || ack[3] != 0 {
		b.Fatalf("connect %s: % x %v", id, ack, err)
	}
	return c
}

// run publishes n messages and returns once each has its PUBACK, in
// order.
func (c *benchPublisher) run(n int) error {
	slots := make(chan uint16, benchWindow)
	for i := range benchWindow {
		slots <- uint16(i + 1)
	}
	inflight := make(chan uint16, benchWindow)
	done := make(chan error, 1)
	go func() { // reads the PUBACKs, which must come in publish order
		var ack [4]byte
		for range n {
			if _, err := io.ReadFull(c.r, ack[:]); err != nil {
				done <- err
				return
			}
			want := <-inflight
			if ack[0]>>4 != packets.Puback || uint16(ack[2])<<8|uint16(ack[3]) != want {
				done <- fmt.Errorf("got % x, want PUBACK %d", ack, want)
				return
			}
			slots <- want
		}
		done <- nil
	}()
	w := bufio.NewWriterSize(c.conn, 64<<10)
	var frame []byte
	for i := range n {
		var pid uint16
		select {
		case pid = <-slots:
		default:
			if err := w.Flush(); err != nil {
				return err
			}
			select {
			case pid = <-slots:
			case err := <-done:
				return fmt.Errorf("publisher ended early: %v", err)
			}
		}
		frame = append(frame[:0], benchFrames[i%len(benchFrames)]...)
		pidAt := 4 + int(frame[3]) // after the fixed header and the topic
		frame[pidAt], frame[pidAt+1] = byte(pid>>8), byte(pid)
		inflight <- pid
		if _, err := w.Write(frame); err != nil {
			return err
		}
	}
	if err := w.Flush(); err != nil {
		return err
	}
	return <-done
}

// benchFrames are the PUBLISH packets of the 1,000 sensors (packet id 0;
// the publisher sets it), built once so that the publishers, which share
// the CPU with the broker, spend little on encoding.
var benchFrames = func() [][]byte {
	out := make([][]byte, 1000)
	for i := range out {
		out[i] = appendBenchPublish(nil, 0, i)
	}
	return out
}()

// appendBenchPublish appends a QoS 1 PUBLISH of a 45-byte reading of one
// of 1,000 sensors.
func appendBenchPublish(dst []byte, pid uint16, i int) []byte {
	topic := fmt.Appendf(nil, "sensors/%03d", i%1000)
	payload := fmt.Appendf(nil, `{"id":"sensor_%03d","ts":1700000000,"v":%5d}`, i%1000, i%100000)
	rem := 2 + len(topic) + 2 + len(payload)
	dst = append(dst, packets.Publish<<4|1<<1, byte(rem)) // rem < 128
	dst = append(dst, byte(len(topic)>>8), byte(len(topic)))
	dst = append(dst, topic...)
	dst = append(dst, byte(pid>>8), byte(pid))
	return append(dst, payload...)
}
