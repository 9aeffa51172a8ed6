package cluster

import (
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/edgedio/edged/codec"
)

var faultSeed = flag.Uint64("fault.seed", 0, "base seed of TestFaultScheduleExactlyOnceOrFail (0: from the clock)")

// faultClass names the kinds of fault schedules drawn from a seed.
var faultClass = []string{"none", "duplicates", "everything", "partition"}

// faultsFor draws a fault schedule from seed; the class is seed % 4.
func faultsFor(seed uint64, r *rand.Rand) Faults {
	switch seed % 4 {
	case 0:
		return Faults{}
	case 1:
		return Faults{Duplicate: r.Float64() * 0.3}
	case 2:
		return Faults{
			Drop:      r.Float64() * 0.01,
			Duplicate: r.Float64() * 0.1,
			Delay:     r.Float64() * 0.02,
			MaxDelay:  1 + r.IntN(4),
			Reorder:   r.Float64() * 0.01,
		}
	default:
		from := 1 + r.IntN(60)
		return Faults{
			Duplicate:  r.Float64() * 0.05,
			Partitions: []Partition{{A: "a", B: "b", From: from, Until: from + 1 + r.IntN(20)}},
		}
	}
}

// faultRun is one simulated run: channels from node a to node b and one
// back, records numbered in order on each, a receiving task that lags.
type faultRun struct {
	t        *testing.T
	seed     uint64
	rng      *rand.Rand
	cfg      ChannelConfig
	net      *MemoryNetwork
	eps      map[string]*Endpoint
	outs     []*OutChannel
	ins      []*faultSink
	failures []error
	batches  int // per channel
	perBatch int
	produced map[*OutChannel]int
	enc      *BatchEncoder[int64]
	records  map[*OutChannel]int64 // records produced per channel
	merge    bool                  // batches are sent with Merge
}

// faultSink is the receiving task of one channel: it checks that records
// arrive exactly once, in order.
type faultSink struct {
	ch    *InChannel
	queue []Frame
	next  int64 // next record expected
	eos   bool
	ts    []int64
	items []int64
}

func newFaultRun(t *testing.T, seed uint64) *faultRun {
	r := rand.New(rand.NewPCG(seed, 7))
	cfg := DefaultChannelConfig()
	cfg.Credits = 1 + r.IntN(16) // from 8 on, saturated channels hold batches and acks are coalesced
	cfg.DuplicateWindow = 8
	cfg.AckInterval = 200 * time.Millisecond
	cfg.AckTimeout = time.Second
	fr := &faultRun{
		t: t, seed: seed, rng: r, cfg: cfg,
		net:      NewMemoryNetwork(seed, faultsFor(seed, r)),
		eps:      map[string]*Endpoint{},
		batches:  20 + r.IntN(40),
		perBatch: 1 + r.IntN(20),
		produced: map[*OutChannel]int{},
		records:  map[*OutChannel]int64{},
		enc:      NewBatchEncoder(codec.For[int64](), 1000, 1<<16),
	}
	// Half the runs merge batches (as data channels do): under credit
	// pressure and saturation, several cross in one frame.
	fr.merge = r.IntN(2) == 0
	// A third of the runs bound the bytes in flight below a few batches':
	// a sender over them fails the receiving channel
	// (ErrCreditExceeded), which fails the run.
	if r.IntN(3) == 0 {
		cfg.MaxInFlightBytes = 16 + r.IntN(256)
		fr.cfg = cfg
	}
	for _, node := range []string{"a", "b"} {
		ep := NewEndpoint(cfg, nil, func(id ChannelID, err error) { fr.failures = append(fr.failures, err) })
		ep.Attach(fr.net.Node(node, ep))
		fr.eps[node] = ep
	}
	open := func(id ChannelID, from, to string) {
		fr.outs = append(fr.outs, fr.eps[from].OpenSender(id, to))
		s := &faultSink{}
		s.ch = fr.eps[to].OpenReceiver(id, from, func(f Frame) { s.queue = append(s.queue, f) })
		fr.ins = append(fr.ins, s)
	}
	for e := range 3 { // key-by, rebalance, broadcast: any edge crosses
		open(ChannelID{Job: "j", Epoch: 2, Edge: e, From: 0, To: e}, "a", "b")
	}
	open(ChannelID{Job: "j", Epoch: 2, Edge: 3, From: 1, To: 0}, "b", "a")
	return fr
}

func (fr *faultRun) fatalf(format string, args ...any) {
	fr.t.Helper()
	fr.t.Fatalf("seed %d (%s, %+v): %s", fr.seed, faultClass[fr.seed%4], fr.net.faults, fmt.Sprintf(format, args...))
}

// produce sends what each channel's credit allows.
func (fr *faultRun) produce() {
	for _, c := range fr.outs {
		for c.Ready() && fr.produced[c] <= fr.batches {
			n := fr.produced[c]
			fr.produced[c]++
			var m Send
			switch {
			case n == fr.batches:
				m = Send{Kind: KindEndOfStream}
			case n%7 == 6:
				m = Send{Kind: KindBarrier, Value: int64(n)}
			case n%5 == 4:
				m = Send{Kind: KindWatermark, Value: fr.records[c]}
			default:
				for range fr.perBatch {
					v := fr.records[c]
					fr.records[c]++
					if ok, err := fr.enc.Add(v, v); !ok || err != nil {
						fr.fatalf("encode: %t %v", ok, err)
					}
				}
				m = Send{Kind: KindBatch, Body: fr.enc.Flush(nil), Merge: fr.merge}
			}
			if err := c.Send(fr.t.Context(), m); err != nil {
				return // failed: the run ends on the failure
			}
		}
	}
}

// consume processes up to a random number of delivered frames per channel.
func (fr *faultRun) consume() {
	c := codec.For[int64]()
	for _, s := range fr.ins {
		k := fr.rng.IntN(4)
		for ; k > 0 && len(s.queue) > 0; k-- {
			f := s.queue[0]
			s.queue = s.queue[1:]
			if s.eos {
				fr.fatalf("channel %s: %s seq %d after end of stream", s.ch.ID(), f.Kind, f.Seq)
			}
			switch f.Kind {
			case KindBatch:
				var err error
				s.ts, s.items, err = DecodeBatch(c, s.ts, s.items, f.Body)
				if err != nil {
					fr.fatalf("decode: %v", err)
				}
				for _, v := range s.items {
					if v != s.next {
						fr.fatalf("channel %s: record %d where %d was next: a silent loss or duplicate", s.ch.ID(), v, s.next)
					}
					s.next++
				}
				s.ch.Processed(f.Seq)
			case KindWatermark:
				if f.Value != s.next {
					fr.fatalf("channel %s: watermark %d after record %d: out of order", s.ch.ID(), f.Value, s.next-1)
				}
			case KindEndOfStream:
				s.eos = true
			}
		}
	}
}

func (fr *faultRun) done() bool {
	for _, c := range fr.outs {
		if !c.Done() {
			return false
		}
	}
	for _, s := range fr.ins {
		if !s.eos || len(s.queue) > 0 {
			return false
		}
	}
	return true
}

// run returns true if every channel finished, false if one failed.
func (fr *faultRun) run() bool {
	start := time.Unix(1_700_000_000, 0)
	for tick := 1; tick <= 20_000; tick++ {
		fr.produce()
		fr.net.Step()
		fr.consume()
		now := start.Add(time.Duration(tick) * 50 * time.Millisecond)
		for _, ep := range fr.eps {
			ep.Tick(now)
		}
		if len(fr.failures) > 0 {
			for _, err := range fr.failures {
				if !errors.Is(err, ErrChannelFailed) {
					fr.fatalf("failure %v does not wrap ErrChannelFailed", err)
				}
				if errors.Is(err, ErrCreditExceeded) || errors.Is(err, ErrProtocol) {
					fr.fatalf("the protocol broke itself: %v", err)
				}
			}
			return false
		}
		if fr.done() {
			for i, s := range fr.ins {
				if s.next != fr.expectedRecords() {
					fr.fatalf("channel %d: %d records delivered, %d sent, and no failure: a silent loss", i, s.next, fr.expectedRecords())
				}
			}
			for _, c := range fr.outs {
				if st := c.Stats(); st.MaxInFlight > fr.cfg.Credits {
					fr.fatalf("%d batches in flight with %d credits", st.MaxInFlight, fr.cfg.Credits)
				}
			}
			return true
		}
	}
	fr.fatalf("neither finished nor failed after 20000 ticks: a silent stall")
	return false
}

// expectedRecords is how many records each channel carries: perBatch in
// every slot that is not a watermark or a barrier.
func (fr *faultRun) expectedRecords() int64 {
	var n int64
	for i := range fr.batches {
		if i%7 != 6 && i%5 != 4 {
			n++
		}
	}
	return n * int64(fr.perBatch)
}

// Seeded random fault schedules over the in-memory network: every run ends
// either with every record delivered exactly once and in order, or with a
// loud channel failure; never a silent loss, duplicate or stall.
func TestFaultScheduleExactlyOnceOrFail(t *testing.T) {
	base := *faultSeed
	if base == 0 {
		base = uint64(time.Now().UnixNano())
	}
	t.Logf("base seed %d (replay with -fault.seed=%d)", base, base)
	seeds := 400
	if testing.Short() {
		seeds = 80
	}
	outcomes := map[string][2]int{}
	var merged int64    // batches that crossed merged into another's frame
	coalesced := 0      // channels whose receiver acknowledged several batches at once
	var byteWaits int64 // batches that waited for room in the bytes in flight
	for i := range seeds {
		seed := base + uint64(i)
		fr := newFaultRun(t, seed)
		ok := fr.run()
		if ok {
			for _, c := range fr.outs {
				merged += c.Stats().Merged
				byteWaits += c.Stats().ByteWaits
			}
			for _, s := range fr.ins {
				if st := s.ch.Stats(); st.Acks < st.Batches-1 {
					coalesced++
				}
			}
		}
		class := faultClass[seed%4]
		o := outcomes[class]
		if ok {
			o[0]++
		} else {
			o[1]++
			if class == "none" || class == "duplicates" {
				t.Fatalf("seed %d (%s): failed without a fault that loses frames: %v", seed, class, fr.failures)
			}
		}
		outcomes[class] = o
	}
	t.Logf("outcomes (finished, failed) by schedule: %v", outcomes)
	if outcomes["none"][0] == 0 || outcomes["duplicates"][0] == 0 {
		t.Errorf("no clean run finished: %v", outcomes)
	}
	if outcomes["everything"][1]+outcomes["partition"][1] == 0 {
		t.Errorf("no faulty run failed: the failure path was not reached: %v", outcomes)
	}
	if merged == 0 || coalesced == 0 || byteWaits == 0 {
		t.Errorf("%d batches merged, %d channels with coalesced acknowledgements, %d batches waited for bytes in flight: the paths were not reached", merged, coalesced, byteWaits)
	}
	t.Logf("%d batches merged; %d channels with coalesced acknowledgements; %d batches waited for bytes in flight", merged, coalesced, byteWaits)
}
