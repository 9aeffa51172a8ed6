package mqtt

import (
	"net"
	"testing"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/mqtt/ingestlog"
)

// A device's will, which the broker publishes when the device's
// connection ends without DISCONNECT, is appended to the ingest log like
// the device's own readings; a device that disconnects cleanly sends no
// will.
func TestBrokerLogsWillMessages(t *testing.T) {
	l := openLog(t, t.TempDir(), ingestlog.DefaultOptions())
	br := startBroker(t, l, "h/#")
	dial := func(id, will string) *rawClient {
		conn, err := net.Dial("tcp", br.Addr())
		if err != nil {
			t.Fatal(err)
		}
		c := &rawClient{t: t, conn: conn, version: 4}
		c.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Connect}, Connect: packets.ConnectParams{
			ProtocolName: []byte("MQTT"), ClientIdentifier: id, Clean: true, Keepalive: 60,
			WillFlag: true, WillTopic: "h/will/" + id, WillPayload: []byte(will), WillQos: 1}})
		return c
	}
	gone := dial("gone", `{"id":"gone","offline":true}`)
	clean := dial("clean", `{"id":"clean","offline":true}`)
	waitAppends(t, l, 0)
	clean.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Disconnect}})
	clean.conn.Close()
	gone.conn.Close() // no DISCONNECT: the broker publishes the will
	testutil.Eventually(t, waitBound, "the will is in the log", func() bool { return l.Stats().DurableOffset >= 1 })
	recs := readAll(t, l)
	if len(recs) != 1 || recs[0].Topic != "h/will/gone" || string(recs[0].Payload) != `{"id":"gone","offline":true}` {
		var got []string
		for _, r := range recs {
			got = append(got, r.Topic+" "+string(r.Payload))
		}
		t.Fatalf("logged %q, want the will of gone only", got)
	}
}
