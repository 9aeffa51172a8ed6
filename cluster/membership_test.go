package cluster

import (
	"strings"
	"testing"
	"time"

	"github.com/edgedio/edged/internal/testutil"
)

func startNode(t *testing.T, id string, key []byte, peers ...string) *Membership {
	t.Helper()
	m, err := NewMembership(MembershipConfig{
		Meta:     Meta{ID: id, Transport: "127.0.0.1:7000", Capacity: 1, Fingerprint: "fp"},
		BindAddr: "127.0.0.1", Peers: peers, SecretKey: key,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Shutdown() })
	return m
}

func ids(ms []Meta) string {
	var s []string
	for _, m := range ms {
		s = append(s, m.ID)
	}
	return strings.Join(s, ",")
}

// waitEvent drains m's events until one of kind for node arrives.
func waitEvent(t testing.TB, m *Membership, kind EventKind, node string) Event {
	t.Helper()
	deadline := time.After(testutil.DefaultTimeout)
	for {
		for _, ev := range m.Drain() {
			if ev.Kind == kind && ev.Node.ID == node {
				return ev
			}
		}
		select {
		case <-m.Events():
		case <-deadline:
			t.Fatalf("no %v event for %s", kind, node)
		}
	}
}

// Three nodes join through one peer, see each other's metadata; a graceful
// leave is seen as left, a crash as failed, and the time to detect the
// crash is logged (the device profile's figure).
func TestMembershipJoinLeaveFail(t *testing.T) {
	a := startNode(t, "a", nil)
	b := startNode(t, "b", nil, a.Addr())
	c := startNode(t, "c", nil, b.Addr())
	for _, m := range []*Membership{a, b, c} {
		testutil.Eventually(t, 0, "three members", func() bool { return ids(m.Members()) == "a,b,c" })
	}
	for _, meta := range a.Members() {
		if meta.Transport != "127.0.0.1:7000" || meta.Fingerprint != "fp" {
			t.Fatalf("metadata not gossiped: %+v", meta)
		}
	}
	if err := c.Leave(time.Second); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, a, MemberLeft, "c")
	killed := time.Now()
	if err := b.Shutdown(); err != nil { // no leave: a crash
		t.Fatal(err)
	}
	ev := waitEvent(t, a, MemberFailed, "b")
	t.Logf("crash of b detected by a after %v (device profile)", ev.At.Sub(killed).Round(time.Millisecond))
	testutil.Eventually(t, 0, "a alone", func() bool { return ids(a.Members()) == "a" })
}

// Nodes with a gossip key join each other; a node without it cannot join.
func TestMembershipEncryption(t *testing.T) {
	key := []byte("0123456789abcdef")
	a := startNode(t, "a", key)
	b := startNode(t, "b", key, a.Addr())
	for _, n := range []*Membership{a, b} {
		testutil.Eventually(t, 0, "two members", func() bool { return ids(n.Members()) == "a,b" })
	}
	m, err := NewMembership(MembershipConfig{Meta: Meta{ID: "x"}, BindAddr: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(); err != nil {
		t.Fatal(err)
	}
	defer m.Shutdown()
	if n, err := m.Join(a.Addr()); err == nil || n != 0 {
		t.Fatalf("a node without the key joined: %d %v", n, err)
	}
	if got := ids(a.Members()); got != "a,b" {
		t.Fatalf("members after a keyless join: %s", got)
	}
}

func TestMembershipConfigErrors(t *testing.T) {
	_, err := NewMembership(MembershipConfig{
		Meta:      Meta{Fingerprint: strings.Repeat("f", 600)},
		SecretKey: []byte("short"), Profile: "fast", Peers: []string{"nohost"},
	})
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{"node_id", "too large", "secret_key", "profile", "peers"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %s: %v", want, err)
		}
	}
}

func TestMetaRoundTrip(t *testing.T) {
	m := Meta{ID: "node-1", Transport: "127.0.0.1:9000", Capacity: 3, Fingerprint: "abc"}
	b, err := m.Encode()
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeMeta(b)
	if err != nil || got != m {
		t.Fatalf("%+v %v", got, err)
	}
	if _, err := DecodeMeta([]byte("{")); err == nil {
		t.Fatal("bad meta parsed")
	}
}

// BenchmarkFailureDetection measures, per profile, the time from a node's
// crash (gossip stopped without a leave) to a survivor's failed event, on
// loopback with three nodes.
func BenchmarkFailureDetection(b *testing.B) {
	for _, p := range []Profile{ProfileDevice, ProfileLAN} {
		b.Run("profile="+string(p), func(b *testing.B) {
			var total time.Duration
			n := 0
			for b.Loop() {
				start := func(id string, peers ...string) *Membership {
					m, err := NewMembership(MembershipConfig{Meta: Meta{ID: id}, BindAddr: "127.0.0.1", Peers: peers, Profile: p})
					if err != nil {
						b.Fatal(err)
					}
					if err := m.Start(); err != nil {
						b.Fatal(err)
					}
					return m
				}
				x := start("a")
				y := start("b", x.Addr())
				z := start("c", x.Addr(), y.Addr())
				testutil.Eventually(b, 0, "three members", func() bool { return len(x.Members()) == 3 && len(z.Members()) == 3 })
				killed := time.Now()
				_ = z.Shutdown()
				ev := waitEvent(b, x, MemberFailed, "c")
				total += ev.At.Sub(killed)
				n++
				_ = x.Shutdown()
				_ = y.Shutdown()
			}
			b.ReportMetric(float64(total.Milliseconds())/float64(n), "detect-ms")
		})
	}
}

// BenchmarkPlacementMovement reports the fraction of 128 units that move
// when a fourth node joins three, against the ideal quarter.
func BenchmarkPlacementMovement(b *testing.B) {
	us := units([]string{"window"}, 128)
	var moved float64
	for b.Loop() {
		before, _ := Place(members(3), us)
		after, _ := Place(members(4), us)
		moved = float64(len(Moved(before, after))) / float64(len(us))
	}
	b.ReportMetric(moved, "moved-fraction")
	b.ReportMetric(moved/0.25, "moved/ideal")
}
