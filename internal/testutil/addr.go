package testutil

import (
	"math/rand/v2"
	"net"
	"strconv"
	"testing"
)

// Ports FreeAddr picks from: below Linux's default ephemeral range
// (32768–60999), from which the kernel picks the source port of every
// outgoing connection and the port of every listener on port 0. A port
// freed by a listener on port 0 and handed to a process started later
// can be taken meanwhile by any connection of the machine; one below
// that range only by another test that picked the same port.
const (
	freeLow  = 20000
	freeHigh = 32000
)

// FreeAddr returns a 127.0.0.1 address whose port was free for TCP and
// UDP (a cluster node's gossip takes both) when it looked, for a server
// the test starts later, in its own or another process.
func FreeAddr(t testing.TB) string {
	t.Helper()
	for range 100 {
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(freeLow+rand.IntN(freeHigh-freeLow)))
		l, err := net.Listen("tcp", addr)
		if err != nil {
			continue
		}
		p, err := net.ListenPacket("udp", addr)
		l.Close()
		if err != nil {
			continue
		}
		p.Close()
		return addr
	}
	t.Fatalf("no free port on 127.0.0.1 in [%d, %d) after 100 tries", freeLow, freeHigh)
	return ""
}
