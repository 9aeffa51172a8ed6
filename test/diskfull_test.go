package test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgedio/edged/internal/testutil"
)

// TestCardFullBackPressureThenExact runs edged with its data_dir on a
// 16 MiB tmpfs (root only: it mounts one), fills the card while a device
// publishes at QoS 1, and frees it again. While the card is full the
// device gets no PUBACK (back-pressure) and keeps its connection, the
// node keeps running and logs why; once there is space again every
// reading is acknowledged and every (sensor, 1 s window) result comes
// under one msg_id with exactly its readings. Before, the first write
// that found no space stopped the ingest log until the node restarted:
// the job failed at every restart, the node exited once the restart
// strategy gave up, and the readings published meanwhile were never
// acknowledged although space came back.
func TestCardFullBackPressureThenExact(t *testing.T) {
	n, card := startOnCard(t)
	url := "tcp://" + n.brokerAddr
	col := newCollector()
	sub := connect(t, paho.NewClientOptions().AddBroker(url).SetClientID("e2e-results").
		SetCleanSession(true).SetAutoReconnect(false).SetOrderMatters(false).SetDefaultPublishHandler(col.handle))
	if tok := sub.Subscribe("agg/#", 1, col.handle); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	dev := connect(t, paho.NewClientOptions().AddBroker(url).SetClientID("e2e-device").
		SetCleanSession(true).SetAutoReconnect(false).SetWriteTimeout(5*time.Second))
	defer func() {
		dev.Disconnect(100)
		sub.Disconnect(100)
	}()
	publish := func(from, to int) []paho.Token {
		toks := make([]paho.Token, 0, to-from)
		for i := from; i < to; i++ {
			topic, p := payloadOf(i)
			toks = append(toks, dev.Publish(topic, 1, false, p))
		}
		return toks
	}
	acked := func(toks []paho.Token, timeout time.Duration) {
		t.Helper()
		for i, tok := range toks {
			if !tok.WaitTimeout(timeout) || tok.Error() != nil {
				t.Fatalf("publish %d of %d not acknowledged: %v", i, len(toks), tok.Error())
			}
		}
	}
	const before, during, end = 4000, 8000, 11000
	acked(publish(0, before), 30*time.Second)

	filler := fillCard(t, card)
	toks := publish(before, during)
	testutil.Eventually(t, 30*time.Second, "the node to say that the card is full", func() bool {
		return strings.Contains(n.logTail(), "no space left on")
	})
	if toks[len(toks)-1].WaitTimeout(0) {
		t.Fatal("every reading acknowledged while the card is full")
	}
	select {
	case <-n.done:
		t.Fatalf("edged exited while the card was full: %v", n.waitErr)
	default:
	}
	if !dev.IsConnectionOpen() {
		t.Fatal("the device lost its connection while the card was full")
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	acked(toks, 60*time.Second)
	acked(publish(during, end), 30*time.Second)
	windows := during / windowMS
	testutil.Eventually(t, 60*time.Second, "every window's result", func() bool {
		col.mu.Lock()
		defer col.mu.Unlock()
		for i := 0; i < during; i += windowMS / sensors * sensors {
			for s := range sensors {
				if len(col.byKey[keyOf(i+s)]) == 0 {
					return false
				}
			}
		}
		return true
	})
	col.mu.Lock()
	defer col.mu.Unlock()
	if len(col.bad) > 0 {
		t.Fatalf("bad results: %v", col.bad[:min(len(col.bad), 5)])
	}
	for w := range windows {
		for s := range sensors {
			k := keyOf(w*windowMS + s)
			ids := map[string]int64{}
			for _, r := range col.byKey[k] {
				ids[r.MsgID] = r.Count
			}
			if len(ids) != 1 {
				t.Errorf("window %v: %d msg_ids %v, want 1", k, len(ids), ids)
				continue
			}
			for _, c := range ids {
				if c != perSensor {
					t.Errorf("window %v: count %d, want %d", k, c, perSensor)
				}
			}
		}
	}
	t.Logf("%d windows of %d sensors exact after the card was full and freed", windows, sensors)
}

// startOnCard mounts a 16 MiB tmpfs (the test skips without root) and
// starts edged with its data_dir on it: the e2e pipeline with a 4 MiB
// ingest log, checkpoint failures tolerated and restarts without end,
// so that a full card fails no job for good.
func startOnCard(t *testing.T) (*node, string) {
	t.Helper()
	if testing.Short() {
		t.Skip("end-to-end test with a subprocess")
	}
	if os.Geteuid() != 0 {
		t.Skip("mounts a tmpfs: needs root")
	}
	dir := t.TempDir()
	card := filepath.Join(dir, "card")
	if err := os.Mkdir(card, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", card).CombinedOutput(); err != nil {
		t.Skipf("mount a tmpfs: %v: %s", err, out)
	}
	n := &node{t: t, brokerAddr: freeAddr(t), apiAddr: freeAddr(t), logPath: filepath.Join(dir, "edged.log")}
	// Cleanups run last first: the node is stopped (cleanupNode) before
	// the card is unmounted.
	t.Cleanup(func() {
		if out, err := exec.Command("umount", card).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", card, err, out)
		}
	})
	cleanupNode(t, n)
	data := filepath.Join(card, "data")
	cfg := fmt.Sprintf(`node:
  data_dir: %[1]s
  broker: %[2]s
  listen: %[3]s
`, data, n.brokerAddr, n.apiAddr) + sensorsPipeline(data, 1, 1000, "100ms")
	cfg = strings.Replace(cfg, "        qos: 1\n        format: json\n",
		"        qos: 1\n        format: json\n        log_max_bytes: 4194304\n        max_message_bytes: 65536\n", 1)
	cfg = strings.Replace(cfg, "      mode: exactly_once\n", "      mode: exactly_once\n      tolerable_failures: 1000000\n", 1)
	n.cfgPath = filepath.Join(dir, "edged.yaml")
	if err := os.WriteFile(n.cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	n.start()
	return n, card
}

// fillCard fills the card to its last byte and returns the filler file.
func fillCard(t *testing.T, card string) string {
	t.Helper()
	filler := filepath.Join(card, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, 64<<10)
	for {
		if _, err := f.Write(chunk); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("fill the card: %v", err)
			}
			return filler
		}
	}
}

// SIGTERM while the card is full and a device's readings wait for space:
// the node stops within its drain bound instead of waiting for the card
// (the broker's acknowledgement gates give up their wait for the
// records held, which fails the log, and the log's Close cuts them), and
// every acknowledged reading is in its log when it starts again on a
// card with space.
func TestCardFullStopDoesNotWaitForSpace(t *testing.T) {
	n, card := startOnCard(t)
	dev := connect(t, paho.NewClientOptions().AddBroker("tcp://"+n.brokerAddr).SetClientID("e2e-device").
		SetCleanSession(true).SetAutoReconnect(false).SetWriteTimeout(5*time.Second))
	defer dev.Disconnect(100)
	for i := range 1000 {
		topic, p := payloadOf(i)
		if tok := dev.Publish(topic, 1, false, p); !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
			t.Fatalf("publish %d: %v", i, tok.Error())
		}
	}
	filler := fillCard(t, card)
	var toks []paho.Token
	for i := 1000; i < 2000; i++ {
		topic, p := payloadOf(i)
		toks = append(toks, dev.Publish(topic, 1, false, p))
	}
	testutil.Eventually(t, 30*time.Second, "the node to say that the card is full", func() bool {
		return strings.Contains(n.logTail(), "no space left on")
	})
	if err := n.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-n.done:
	case <-time.After(30 * time.Second):
		t.Fatal("edged did not stop within 30 s of SIGTERM while its card was full")
	}
	acked := 0
	for _, tok := range toks {
		if tok.WaitTimeout(0) && tok.Error() == nil {
			acked++
		}
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	n.start()
	var ingest struct {
		Pipelines []struct {
			Pipeline   string `json:"pipeline"`
			NextOffset uint64 `json:"next_offset"`
		} `json:"pipelines"`
	}
	resp, err := http.Get("http://" + n.apiAddr + "/ingest")
	if err != nil {
		t.Fatal(err)
	}
	err = json.NewDecoder(resp.Body).Decode(&ingest)
	resp.Body.Close()
	if err != nil || len(ingest.Pipelines) != 1 {
		t.Fatalf("GET /ingest: %+v, %v", ingest, err)
	}
	// Every reading the device got a PUBACK for is in the log. Readings
	// made durable whose PUBACK shared a write with one that was not
	// (the broker's acknowledgement gate sends a connection's PUBACKs
	// for one wait together) are there too without their PUBACK: a QoS 1
	// device with a persistent session would send them again.
	next := ingest.Pipelines[0].NextOffset
	if next < uint64(1000+acked) {
		t.Fatalf("the log holds %d readings after the restart, fewer than the %d acknowledged", next, 1000+acked)
	}
	t.Logf("%d readings acknowledged before the stop, %d in the log after it (%d durable without their PUBACK)",
		1000+acked, next, next-uint64(1000+acked))
}
