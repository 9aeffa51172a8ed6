package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
)

// results keeps the latest count of every (sensor, window) result and
// counts the duplicates: result messages for a (sensor, window) already
// seen (with an at-least-once sink, or a write-ahead sink replaying). A
// message whose payload is a JSON array (sinks[].mqtt.batch) holds one
// result per element, each with its own msg_id.
type results struct {
	mu       sync.Mutex
	last     map[string]int64 // id|window_start -> count
	byWindow map[int64]int64  // window_start -> sum of the latest counts
	msgs     int64
	elems    int64 // results received: a message's, or its array's elements
	dups     int64 // results for a (sensor, window) seen before
	dupIDs   int64 // results whose msg_id was seen before
	ids      map[string]struct{}
	first    time.Time
	lastAt   time.Time
	bad      int
}

func newResults() *results {
	return &results{last: map[string]int64{}, byWindow: map[int64]int64{}, ids: map[string]struct{}{}}
}

// result is one window result as the MQTT sink publishes it.
type result struct {
	ID          string `json:"id"`
	WindowStart int64  `json:"window_start"`
	Count       int64  `json:"count"`
	MsgID       string `json:"msg_id"`
}

func (r *results) handle(_ paho.Client, m paho.Message) {
	var vs []result
	var err error
	if p := bytes.TrimSpace(m.Payload()); len(p) > 0 && p[0] == '[' {
		err = json.Unmarshal(p, &vs)
	} else {
		var v result
		err = json.Unmarshal(p, &v)
		vs = []result{v}
	}
	if err == nil && len(vs) == 1 && vs[0].ID == "probe" {
		return
	}
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.msgs == 0 {
		r.first = now
	}
	r.msgs++
	r.lastAt = now
	if err != nil {
		r.bad++
		return
	}
	for _, v := range vs {
		r.add(v)
	}
}

// add counts one result; r.mu is held. A result whose msg_id was seen
// before is counted as a repeat; the sums keep the latest count of a
// (sensor, window), so a repeat does not add to them.
func (r *results) add(v result) {
	r.elems++
	if v.ID == "" {
		r.bad++
		return
	}
	if v.MsgID != "" {
		if _, ok := r.ids[v.MsgID]; ok {
			r.dupIDs++
		}
		r.ids[v.MsgID] = struct{}{}
	}
	k := v.ID + "|" + strconv.FormatInt(v.WindowStart, 10)
	prev, seen := r.last[k]
	if seen {
		r.dups++
	}
	r.byWindow[v.WindowStart] += v.Count - prev
	r.last[k] = v.Count
}

// sumBefore is the sum of the latest counts of windows starting before end.
func (r *results) sumBefore(end int64) int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	var s int64
	for w, c := range r.byWindow {
		if w < end {
			s += c
		}
	}
	return s
}

type resultStats struct {
	msgs, elems, dups, dupIDs int64
	bad                       int
	first, last               time.Time
}

func (r *results) stats() resultStats {
	r.mu.Lock()
	defer r.mu.Unlock()
	return resultStats{msgs: r.msgs, elems: r.elems, dups: r.dups, dupIDs: r.dupIDs, bad: r.bad, first: r.first, last: r.lastAt}
}

func connect(opts *paho.ClientOptions) (paho.Client, error) {
	c := paho.NewClient(opts)
	tok := c.Connect()
	if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		return nil, fmt.Errorf("connect %s: %v", opts.ClientID, tok.Error())
	}
	return c, nil
}

func subscribeResults(url, id, topic string, r *results) (paho.Client, error) {
	opts := paho.NewClientOptions().AddBroker(url).SetClientID(id).SetCleanSession(true).
		SetDefaultPublishHandler(r.handle)
	c, err := connect(opts)
	if err != nil {
		return nil, err
	}
	if tok := c.Subscribe(topic, 1, r.handle); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		c.Disconnect(100)
		return nil, fmt.Errorf("subscribe %s: %v", topic, tok.Error())
	}
	return c, nil
}

// resultSettle is how long the results may stand still before what
// arrived is taken as all that will: a window fires only once the
// pipeline has worked through the readings before it, which can take
// long after they were read.
func resultSettle() time.Duration { return 6 * *settle }

// waitSum waits until the results of windows starting before end sum to
// n, or have not moved for settle; it returns when they last moved.
func waitSum(r *results, end, n int64, e *edged, settle time.Duration, deadline time.Time) (time.Time, error) {
	var sum int64 = -1
	moved := time.Now()
	for {
		s := r.sumBefore(end)
		if s != sum {
			sum, moved = s, time.Now()
		}
		if s >= n {
			return moved, nil
		}
		if time.Since(moved) > settle {
			return moved, nil
		}
		if !e.alive() {
			return time.Time{}, fmt.Errorf("edged exited: %v\n%s", e.waitErr, e.logTail())
		}
		if time.Now().After(deadline) {
			return time.Time{}, fmt.Errorf("results sum to %d of %d by the deadline\n%s", s, n, e.logTail())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}
