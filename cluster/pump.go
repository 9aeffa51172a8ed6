package cluster

import (
	"sync"
	"time"
)

// Pump runs a MemoryNetwork in real time, for tests of whole jobs over
// it: on its own goroutine it steps the network whenever a frame was
// queued (and at least every interval, so that delayed frames arrive), and
// ticks the given networks every interval. Make one with NewPump; Start
// it, and Stop it after the job.
type Pump struct {
	net      *MemoryNetwork
	nets     []*Network
	interval time.Duration

	mu   sync.Mutex // guards stop
	stop chan struct{}
	wg   sync.WaitGroup
}

// NewPump returns a pump of net ticking nets every interval. It starts
// nothing.
func NewPump(net *MemoryNetwork, interval time.Duration, nets ...*Network) *Pump {
	return &Pump{net: net, nets: nets, interval: interval}
}

// maxSteps is how many Steps a pump takes in a row before it ticks the
// networks again: traffic never starves the ticks.
const maxSteps = 64

// Start starts the pump's goroutine.
func (p *Pump) Start() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stop != nil {
		return
	}
	stop := make(chan struct{})
	p.stop = stop
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		t := time.NewTicker(p.interval)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-p.net.Ready():
			case now := <-t.C:
				for _, n := range p.nets {
					n.Tick(now)
				}
			}
			for i := 0; i < maxSteps && p.net.Step() > 0; i++ {
			}
			p.net.Step() // a tick more, for frames delayed by one
		}
	}()
}

// Stop stops the pump and waits for its goroutine.
func (p *Pump) Stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stop == nil {
		return
	}
	close(p.stop)
	p.wg.Wait()
	p.stop = nil
}
