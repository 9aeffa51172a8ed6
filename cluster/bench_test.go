package cluster

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgedio/edged/codec"
	"github.com/edgedio/edged/internal/testutil"
)

// reading is a typical sensor record.
type reading struct {
	ID          string
	Timestamp   int64
	Temperature float64
}

// benchBody returns one encoded batch of n readings.
func benchBody(b *testing.B, n int) []byte {
	e := NewBatchEncoder(codec.For[reading](), n, DefaultChannelConfig().MaxBatchBytes())
	for i := range n {
		r := reading{ID: fmt.Sprintf("sensor-%04d", i%1000), Timestamp: 1_700_000_000_000 + int64(i), Temperature: 20 + float64(i%50)/10}
		if ok, err := e.Add(r.Timestamp, r); !ok || err != nil {
			b.Fatalf("encode: %t %v", ok, err)
		}
	}
	return e.Flush(nil)
}

// BenchmarkChannel sends record batches of 512 and 4096 readings over a
// cross-node channel (sender and receiver machines, acknowledgements as
// credits) on each transport; "encode" is the baseline: encoding the same
// frames and sending nowhere. cpu-ns/record is the process's CPU time per
// record, steadier than the rates on a loaded machine.
func BenchmarkChannel(b *testing.B) {
	for _, records := range []int{512, 4096} {
		for _, transport := range []string{"encode", "memory", "remote"} {
			b.Run(fmt.Sprintf("records=%d/transport=%s", records, transport), func(b *testing.B) {
				benchChannel(b, transport, records)
			})
		}
	}
}

func benchChannel(b *testing.B, transport string, records int) {
	body := benchBody(b, records)
	cfg := DefaultChannelConfig()
	id := ChannelID{Job: "bench", Epoch: 1, Edge: 0, From: 0, To: 0}
	var frameBytes int
	if transport == "encode" {
		f := Frame{Channel: id, Kind: KindBatch, Body: body}
		b.ReportAllocs()
		for b.Loop() {
			f.Seq++
			data, err := AppendFrame(make([]byte, 0, f.EncodedSize()), &f)
			if err != nil {
				b.Fatal(err)
			}
			frameBytes = len(data)
		}
		report(b, frameBytes, records)
		return
	}
	var delivered atomic.Int64
	var in *InChannel
	deliver := func(f Frame) {
		delivered.Add(1)
		in.Processed(f.Seq)
	}
	a, r := NewEndpoint(cfg, nil, nil), NewEndpoint(cfg, nil, nil)
	var peerA, peerR string
	stop := func() {}
	switch transport {
	case "memory":
		net := NewMemoryNetwork(1, Faults{})
		a.Attach(net.Node("a", a))
		r.Attach(net.Node("r", r))
		peerA, peerR = "a", "r"
		var done atomic.Bool
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !done.Load() {
				if net.Step() == 0 {
					runtime.Gosched()
				}
			}
		}()
		stop = func() { done.Store(true); wg.Wait() }
	case "remote":
		ta, tr := NewRemoteTransport(DefaultRemoteConfig(), a), NewRemoteTransport(DefaultRemoteConfig(), r)
		for _, t := range []*RemoteTransport{ta, tr} {
			if err := t.Start(); err != nil {
				b.Fatal(err)
			}
		}
		a.Attach(ta)
		r.Attach(tr)
		peerA, peerR = ta.Addr(), tr.Addr()
		stop = func() {
			ta.Stop(context.Background(), false)
			tr.Stop(context.Background(), false)
		}
	}
	defer stop()
	out := a.OpenSender(id, peerR)
	in = r.OpenReceiver(id, peerA, deliver)
	frameBytes = (&Frame{Channel: id, Seq: 1, Kind: KindBatch, Body: body}).EncodedSize()
	b.SetBytes(int64(frameBytes))
	b.ReportAllocs()
	ctx := context.Background()
	start, cpu := time.Now(), cpuTime(b)
	n := 0
	for b.Loop() {
		if err := out.Send(ctx, Send{Kind: KindBatch, Body: body}); err != nil {
			b.Fatal(err)
		}
		n++
	}
	testutil.Eventually(b, 0, "every batch delivered", func() bool { return delivered.Load() == int64(n) })
	elapsed := time.Since(start)
	b.ReportMetric(float64((cpuTime(b)-cpu).Nanoseconds())/float64(n*records), "cpu-ns/record")
	b.ReportMetric(float64(n)/elapsed.Seconds(), "frames/s")
	b.ReportMetric(float64(n*records)/elapsed.Seconds(), "records/s")
	report(b, frameBytes, records)
}

func report(b *testing.B, frameBytes, records int) {
	b.ReportMetric(float64(frameBytes)/float64(records), "bytes/record")
}
