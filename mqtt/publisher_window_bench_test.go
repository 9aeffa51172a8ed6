package mqtt

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgedio/edged/internal/mqtttest"
	"github.com/edgedio/edged/internal/testutil"
)

// BenchmarkPublisherWindow publishes 100,000 window-result-like JSON
// lines at QoS 1 through Mosquitto to a paho QoS 1 consumer (the restart
// benchmark's path) with the default window (1024 in flight on one
// connection), with larger windows, and over two connections (the
// records split by key, so per-key order holds), alternating in every
// round. It reports each variant's rate end to end and its ratio to the
// default's: whether the sink's window or its one connection bounds the
// publishing phase after a restart.
//
//	go test ./mqtt -run XXX -bench PublisherWindow -benchtime 3x
func BenchmarkPublisherWindow(b *testing.B) {
	addr, _ := mqtttest.StartMosquitto(b, "max_inflight_messages 1000\nmax_queued_messages 2000000\n")
	var received atomic.Int64
	countResults(b, addr, &received)
	const n = 100_000
	recs, id := benchReadings(n)

	newPub := func(name string, window int) Publish {
		cfg := DefaultPublisherConfig()
		cfg.Broker, cfg.ClientID, cfg.MaxInflight = "tcp://"+addr, name, window
		pub, err := NewPublisher(cfg)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { pub.Close() })
		return PublishFunc(pub, readingTopic, encodeReading, nil)
	}
	// split publishes over conns connections of window each, record i on
	// connection i mod conns (a key's records all on one connection).
	split := func(name string, conns, window int) Publish {
		pubs := make([]Publish, conns)
		for c := range pubs {
			pubs[c] = newPub(fmt.Sprintf("%s-%d", name, c), window)
		}
		return func(recs []reading, id func(int) string) error {
			var wg sync.WaitGroup
			errs := make([]error, conns)
			for c := range conns {
				wg.Add(1)
				go func() {
					defer wg.Done()
					var part []reading
					var ids []int
					for i := c; i < len(recs); i += conns {
						part = append(part, recs[i])
						ids = append(ids, i)
					}
					errs[c] = pubs[c](part, func(j int) string { return id(ids[j]) })
				}()
			}
			wg.Wait()
			for _, err := range errs {
				if err != nil {
					return err
				}
			}
			return nil
		}
	}
	variants := []struct {
		name string
		f    Publish
	}{
		{"w1024", newPub("w1024", 1024)},
		{"w4096", newPub("w4096", 4096)},
		{"w8192", newPub("w8192", 8192)},
		{"w16384", newPub("w16384", 16384)},
		{"2conn-w1024", split("c2", 2, 1024)},
	}
	walls := make([]time.Duration, len(variants))
	b.ResetTimer()
	for range b.N {
		for v, x := range variants {
			received.Store(0)
			t0 := time.Now()
			if err := x.f(recs, id); err != nil {
				b.Fatal(err)
			}
			testutil.Eventually(b, waitBound, "every message at the consumer", func() bool { return received.Load() >= n })
			walls[v] += time.Since(t0)
		}
	}
	msgs := float64(n * b.N)
	for v, x := range variants {
		b.ReportMetric(msgs/walls[v].Seconds(), x.name+"-msgs/s")
		if v > 0 {
			b.ReportMetric(walls[0].Seconds()/walls[v].Seconds(), x.name+"-speedup")
		}
	}
}
