package testutil

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"sync"
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

// PortsEnv narrows the ports FreeAddr picks from to "low-high" (high
// excluded), a part of [20000, 32000): test processes run side by side
// (scripts/e2e.sh) each get a part of their own, so one never picks a
// port another picked and has not bound yet.
const PortsEnv = "EDGED_TEST_PORTS"

var portRange = sync.OnceValues(func() ([2]int, error) {
	v := os.Getenv(PortsEnv)
	if v == "" {
		return [2]int{freeLow, freeHigh}, nil
	}
	var lo, hi int
	if n, err := fmt.Sscanf(v, "%d-%d", &lo, &hi); err != nil || n != 2 || lo < freeLow || hi > freeHigh || hi-lo < 100 {
		return [2]int{}, fmt.Errorf("%s=%q: want low-high within [%d, %d] and at least 100 ports apart", PortsEnv, v, freeLow, freeHigh)
	}
	return [2]int{lo, hi}, nil
})

// FreeAddr returns a 127.0.0.1 address whose port was free for TCP and
// UDP (a cluster node's gossip takes both) when it looked, for a server
// the test starts later, in its own or another process.
func FreeAddr(t testing.TB) string {
	t.Helper()
	r, err := portRange()
	if err != nil {
		t.Fatal(err)
	}
	lo, hi := r[0], r[1]
	for range 100 {
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(lo+rand.IntN(hi-lo)))
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
	t.Fatalf("no free port on 127.0.0.1 in [%d, %d) after 100 tries", lo, hi)
	return ""
}
