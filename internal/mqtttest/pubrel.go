// Package mqtttest holds MQTT client helpers the tests share.
package mqtttest

import (
	"net"
	"net/url"
	"strconv"
	"sync"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/eclipse/paho.mqtt.golang/packets"
)

// ReleaseAfterPubrel makes a paho v1.5 client a correct QoS 2 sender
// across reconnects. paho answers a PUBREC with a PUBREL but keeps the
// PUBLISH in its store, so after a reconnect it resends the PUBLISH (with
// DUP) instead of the PUBREL. MQTT forbids that ([MQTT-4.3.3], "MUST NOT
// re-send the PUBLISH once it has sent the corresponding PUBREL"): the
// receiver forgot the packet id at the PUBREL, and takes the resend for a
// new message, a duplicate no broker can tell apart. opts gets its own
// store and a connection that, before a PUBREL goes out, replaces the
// stored PUBLISH of its packet id with the PUBREL, which paho's resume
// then resends instead (and the PUBCOMP deletes).
func ReleaseAfterPubrel(opts *paho.ClientOptions) {
	store := paho.NewMemoryStore()
	opts.SetStore(store).SetCustomOpenConnectionFn(func(uri *url.URL, o paho.ClientOptions) (net.Conn, error) {
		conn, err := net.DialTimeout("tcp", uri.Host, o.ConnectTimeout)
		if err != nil {
			return nil, err
		}
		return &pubrelConn{Conn: conn, store: store}, nil
	})
}

// pubrelConn follows the MQTT packets written to it and stores each
// PUBREL in place of its PUBLISH before writing it.
type pubrelConn struct {
	net.Conn
	store paho.Store

	mu   sync.Mutex // paho writes from its send and keepalive goroutines
	head []byte     // the current packet's fixed header (and packet id of a PUBREL) so far
	left int        // bytes of the current packet still to pass
}

func (c *pubrelConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.scan(p)
	return c.Conn.Write(p)
}

// scan advances through p's packet bytes. c.mu is held.
func (c *pubrelConn) scan(p []byte) {
	for len(p) > 0 {
		if c.left > 0 {
			n := min(c.left, len(p))
			c.left -= n
			p = p[n:]
			continue
		}
		c.head = append(c.head, p[0])
		p = p[1:]
		rem, mult, end := 0, 1, 0
		for i := 1; i < len(c.head) && end == 0; i++ {
			rem += int(c.head[i]&0x7f) * mult
			mult *= 128
			if c.head[i]&0x80 == 0 {
				end = i + 1
			}
		}
		if end == 0 {
			continue // remaining length not complete
		}
		if c.head[0]>>4 != packets.Pubrel || rem < 2 {
			c.left, c.head = rem, c.head[:0]
			continue
		}
		if len(c.head) < end+2 {
			continue // packet id not complete
		}
		rel := packets.NewControlPacket(packets.Pubrel).(*packets.PubrelPacket)
		rel.MessageID = uint16(c.head[end])<<8 | uint16(c.head[end+1])
		c.store.Put("o."+strconv.Itoa(int(rel.MessageID)), rel) // paho's outbound key
		c.left, c.head = rem-2, c.head[:0]
	}
}
