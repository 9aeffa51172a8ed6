package mqtt

import (
	"testing"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/edgedio/edged/mqtt/ingestlog"
)

// TestBrokerStopSendsDisconnectOnlyToMQTT5Clients checks what a graceful
// stop sends each connection before it ends: an MQTT 5 client gets a
// DISCONNECT with reason 0x8B (server shutting down); an MQTT 3.1.1
// client, for which the server sends no DISCONNECT (only clients do, and
// mosquitto_sub exits with "A network protocol error occurred" on one),
// sees its connection end with nothing sent.
func TestBrokerStopSendsDisconnectOnlyToMQTT5Clients(t *testing.T) {
	l := openLog(t, t.TempDir(), ingestlog.DefaultOptions())
	b := startBrokerCfg(t, l, BrokerConfig{}, nil)
	v3, _ := dialRaw(t, b.Addr(), "v3", true)
	v5, _ := dialRaw5(t, b.Addr(), "v5")
	closed := make(chan error, 1)
	go func() { closed <- b.Close() }()
	expectClosed(t, v3, "at the broker's stop")
	v3.conn.Close()
	v5.expectDisconnect(packets.ErrServerShuttingDown.Code)
	v5.conn.Close()
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
}
