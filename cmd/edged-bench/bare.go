package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
)

// The baseline subscriber runs in a process of its own (edged-bench
// bare-sub), so that its CPU time and RSS are its own, not the
// publishers'. It is paho as an application would use it: persistent
// session, QoS 1 subscription, in-order handler that counts.

// bareReport is what the bare subscriber prints, one JSON line every
// 100 ms while its count moves, and once more when stdin closes.
type bareReport struct {
	Ready   bool  `json:"ready,omitempty"`
	Count   int64 `json:"count"`
	FirstNS int64 `json:"first_ns"`
	LastNS  int64 `json:"last_ns"`
	Final   bool  `json:"final,omitempty"`
}

// bareSubMain is the child: edged-bench bare-sub -url u -topic t -id c.
func bareSubMain(args []string) int {
	fs := flag.NewFlagSet("bare-sub", flag.ContinueOnError)
	url := fs.String("url", "", "broker URL")
	topic := fs.String("topic", "", "topic filter")
	id := fs.String("id", "bench-bare", "client id")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	var count, firstNS, lastNS atomic.Int64
	handler := func(_ paho.Client, m paho.Message) {
		now := time.Now().UnixNano()
		if count.Add(1) == 1 {
			firstNS.Store(now)
		}
		lastNS.Store(now)
	}
	opts := paho.NewClientOptions().AddBroker(*url).SetClientID(*id).SetCleanSession(false).
		SetAutoReconnect(false).SetDefaultPublishHandler(handler)
	c, err := connect(opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bare-sub:", err)
		return 1
	}
	if tok := c.Subscribe(*topic, 1, handler); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		fmt.Fprintln(os.Stderr, "bare-sub: subscribe:", tok.Error())
		return 1
	}
	out := json.NewEncoder(os.Stdout)
	out.Encode(bareReport{Ready: true})
	eof := make(chan struct{})
	go func() {
		io.Copy(io.Discard, os.Stdin)
		close(eof)
	}()
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	var sent int64 = -1
	for {
		select {
		case <-eof:
			out.Encode(bareReport{Count: count.Load(), FirstNS: firstNS.Load(), LastNS: lastNS.Load(), Final: true})
			// Leave no session behind to queue later runs' messages.
			c.Unsubscribe(*topic).WaitTimeout(5 * time.Second)
			c.Disconnect(100)
			return 0
		case <-t.C:
			if n := count.Load(); n != sent {
				sent = n
				out.Encode(bareReport{Count: n, FirstNS: firstNS.Load(), LastNS: lastNS.Load()})
			}
		}
	}
}

// bareSub is the parent's handle on a bare subscriber process.
type bareSub struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	mu    sync.Mutex
	last  bareReport
	ready chan struct{}
	done  chan struct{} // closed when its stdout ends
}

func startBareSub(url, topic, id string) (*bareSub, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, "bare-sub", "-url", url, "-topic", topic, "-id", id)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := startChild(cmd); err != nil {
		return nil, err
	}
	b := &bareSub{cmd: cmd, stdin: stdin, ready: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(b.done)
		sc := bufio.NewScanner(stdout)
		ready := false
		for sc.Scan() {
			var r bareReport
			if json.Unmarshal(sc.Bytes(), &r) != nil {
				continue
			}
			if r.Ready && !ready {
				ready = true
				close(b.ready)
				continue
			}
			b.mu.Lock()
			b.last = r
			b.mu.Unlock()
		}
	}()
	select {
	case <-b.ready:
		return b, nil
	case <-b.done:
		b.wait()
		return nil, fmt.Errorf("bare subscriber exited before subscribing")
	case <-time.After(15 * time.Second):
		b.stop()
		return nil, fmt.Errorf("bare subscriber not subscribed after 15 s")
	}
}

func (b *bareSub) pid() int { return b.cmd.Process.Pid }

func (b *bareSub) report() bareReport {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.last
}

// waitCount waits until the subscriber has n messages, or its count has
// not moved for settle once pubDone is closed, or the deadline.
func (b *bareSub) waitCount(n int64, pubDone <-chan struct{}, settle time.Duration, deadline time.Time) bareReport {
	var c int64 = -1
	moved := time.Now()
	published := false
	for {
		r := b.report()
		now := time.Now()
		if r.Count != c {
			c, moved = r.Count, now
		}
		if r.Count >= n {
			return r
		}
		if !published {
			select {
			case <-pubDone:
				published, moved = true, now
			default:
			}
		}
		if (published && now.Sub(moved) > settle) || now.After(deadline) {
			return r
		}
		select {
		case <-b.done:
			return r
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// stop closes its stdin and returns its final report.
func (b *bareSub) stop() bareReport {
	b.stdin.Close()
	select {
	case <-b.done:
	case <-time.After(10 * time.Second):
		b.cmd.Process.Kill()
		<-b.done
	}
	b.wait()
	return b.report()
}

func (b *bareSub) wait() {
	b.cmd.Wait()
	forgetChild(b.cmd)
}
