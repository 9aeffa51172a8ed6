package mqtt

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"math/rand/v2"
	"testing"

	"github.com/mochi-mqtt/server/v2/packets"
)

// chunkReader returns its bytes in reads of 1 to max bytes, by a seeded
// schedule.
type chunkReader struct {
	b   []byte
	rnd *rand.Rand
	max int
}

func (r *chunkReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	n := min(len(p), len(r.b), 1+r.rnd.IntN(r.max))
	copy(p, r.b[:n])
	r.b = r.b[n:]
	return n, nil
}

// readThrough reads all of in through a cutReader with bound max, in
// reads of bufSize bytes from a connection that returns 1 to chunk bytes
// per read.
func readThrough(in []byte, max int64, mark [cutMarkLen]byte, seed uint64, chunk, bufSize int) ([]byte, error) {
	c := newCutReader(&chunkReader{b: in, rnd: rand.New(rand.NewPCG(seed, 1)), max: chunk}, max, mark)
	var out bytes.Buffer
	buf := make([]byte, bufSize)
	for {
		n, err := c.Read(buf)
		out.Write(buf[:n])
		if errors.Is(err, io.EOF) {
			return out.Bytes(), nil
		}
		if err != nil {
			return out.Bytes(), err
		}
	}
}

// A 3.1.1 client's stream passes through unchanged but for the PUBLISH
// over the bound, which becomes a small PUBLISH carrying the mark, the
// original size and retain flag and the first DeadLetterKeep payload
// bytes, whatever the reads' sizes.
func TestCutReaderCutsOnlyThePublishOverTheBound(t *testing.T) {
	mark := newCutMark()
	const max = 1024
	big := bytes.Repeat([]byte("0123456789"), 1000)
	connect := encodeVersion(t, 4, packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Connect},
		Connect: packets.ConnectParams{ClientIdentifier: "dev", Clean: true, Keepalive: 60}})
	small := encodeVersion(t, 4, packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1}, PacketID: 1, TopicName: "s/a", Payload: []byte(`{"v":1}`)})
	huge := encodeVersion(t, 4, packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1, Retain: true, Dup: true}, PacketID: 2, TopicName: "s/big", Payload: big})
	huge0 := encodeVersion(t, 4, packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish}, TopicName: "s/big0", Payload: big[:2000]})
	ping := encodeVersion(t, 4, packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Pingreq}})
	after := encodeVersion(t, 4, packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1}, PacketID: 3, TopicName: "s/a", Payload: []byte(`{"v":3}`)})
	in := bytes.Join([][]byte{connect, small, huge, ping, huge0, after}, nil)

	cutPayload := func(size int, retain byte, kept []byte) []byte {
		p := append([]byte(nil), mark[:]...)
		p = binary.BigEndian.AppendUint64(p, uint64(size))
		return append(append(p, retain), kept...)
	}
	want := bytes.Join([][]byte{connect, small,
		encodeVersion(t, 4, packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1, Dup: true}, PacketID: 2, TopicName: "s/big",
			Payload: cutPayload(len(huge), 1, big[:DeadLetterKeep])}),
		ping,
		encodeVersion(t, 4, packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish}, TopicName: "s/big0",
			Payload: cutPayload(len(huge0), 0, big[:DeadLetterKeep])}),
		after}, nil)
	for seed := range uint64(200) {
		chunk := []int{1, 3, 7, 64, 4096}[seed%5]
		bufSize := []int{4096, 1, 5, 9, 100}[seed/5%5]
		got, err := readThrough(in, max, mark, seed, chunk, bufSize)
		if err != nil {
			t.Fatalf("seed %d (reads of up to %d, buffer %d): %v", seed, chunk, bufSize, err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("seed %d (reads of up to %d, buffer %d): got\n%q\nwant\n%q", seed, chunk, bufSize, got, want)
		}
	}

	// The broker recognises its own mark only.
	b := &Broker{cutMark: mark}
	size, retain, kept, ok := b.uncut(cutPayload(len(huge), 1, big[:DeadLetterKeep]))
	if !ok || size != int64(len(huge)) || !retain || !bytes.Equal(kept, big[:DeadLetterKeep]) {
		t.Fatalf("uncut: %d %v %q %v", size, retain, kept, ok)
	}
	other := newCutMark()
	if _, _, _, ok := (&Broker{cutMark: other}).uncut(cutPayload(len(huge), 1, nil)); ok {
		t.Fatal("another broker's mark was taken")
	}
}

// An MQTT 5 client is told the bound in CONNACK: its stream passes
// through unchanged (mochi disconnects it with "packet too large").
func TestCutReaderLeavesMQTT5Alone(t *testing.T) {
	mark := newCutMark()
	connect := encodeVersion(t, 5, packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Connect},
		Connect: packets.ConnectParams{ClientIdentifier: "dev5", Clean: true, Keepalive: 60}})
	huge := encodeVersion(t, 5, packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1}, PacketID: 2, TopicName: "s/big",
		Payload: bytes.Repeat([]byte("x"), 5000)})
	in := append(append([]byte(nil), connect...), huge...)
	got, err := readThrough(in, 1024, mark, 1, 7, 4096)
	if err != nil || !bytes.Equal(got, in) {
		t.Fatalf("MQTT 5 stream changed (err %v)", err)
	}
}

// A PUBLISH over the bound whose topic leaves no room for its dead letter
// under the bound ends the connection as mochi would have; one whose
// topic runs past its end is malformed.
func TestCutReaderRefusesWhatItCannotCut(t *testing.T) {
	mark := newCutMark()
	connect := encodeVersion(t, 4, packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Connect},
		Connect: packets.ConnectParams{ClientIdentifier: "dev", Clean: true, Keepalive: 60}})
	long := encodeVersion(t, 4, packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1}, PacketID: 1,
		TopicName: string(bytes.Repeat([]byte("t"), 100)), Payload: bytes.Repeat([]byte("x"), 200)})
	got, err := readThrough(append(append([]byte(nil), connect...), long...), 128, mark, 1, 4096, 4096)
	if !errors.Is(err, packets.ErrPacketTooLarge) || !bytes.Equal(got, connect) {
		t.Fatalf("got %q, %v; want the CONNECT only and ErrPacketTooLarge", got, err)
	}
	// Remaining length 300, topic length 1000.
	bad := append([]byte{0x32, 0xac, 0x02, 0x03, 0xe8}, bytes.Repeat([]byte("t"), 298)...)
	got, err = readThrough(append(append([]byte(nil), connect...), bad...), 128, mark, 1, 4096, 4096)
	if !errors.Is(err, errCutMalformed) || !bytes.Equal(got, connect) {
		t.Fatalf("got %q, %v; want the CONNECT only and errCutMalformed", got, err)
	}
}

// A stream with no packet over the bound, well formed or not, passes
// through unchanged, whatever the sizes of the reads.
func FuzzCutReaderPassesWhatItDoesNotCut(f *testing.F) {
	connect := encodeVersion(f, 4, packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Connect},
		Connect: packets.ConnectParams{ClientIdentifier: "dev", Clean: true, Keepalive: 60}})
	pub := encodeVersion(f, 4, packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1}, PacketID: 1, TopicName: "s/a", Payload: []byte("x")})
	f.Add(append(append([]byte(nil), connect...), pub...), uint64(1), uint8(3))
	f.Add([]byte{0x30, 0xff, 0xff, 0xff, 0xff, 0x7f}, uint64(2), uint8(1))
	f.Add([]byte{0x10}, uint64(3), uint8(1))
	f.Fuzz(func(t *testing.T, in []byte, seed uint64, chunk uint8) {
		mark := newCutMark()
		got, err := readThrough(in, 0, mark, seed, 1+int(chunk%64), 4096) // no bound: nothing is cut
		if err != nil || !bytes.Equal(got, in) {
			t.Fatalf("stream changed (err %v):\n%q\n%q", err, got, in)
		}
	})
}

// LongestCutTopic is exactly the longest topic a QoS 1 PUBLISH over the
// bound can have and still be cut: one byte more ends the connection.
func TestLongestCutTopicIsWhatTheCutReaderTakes(t *testing.T) {
	mark := newCutMark()
	connect := encodeVersion(t, 4, packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Connect},
		Connect: packets.ConnectParams{ClientIdentifier: "dev", Clean: true, Keepalive: 60}})
	for _, bound := range []int64{64, 100, 1024} {
		for _, extra := range []int64{0, 1} {
			topic := string(bytes.Repeat([]byte("t"), int(LongestCutTopic(bound)+extra)))
			pub := encodeVersion(t, 4, packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1}, PacketID: 1,
				TopicName: topic, Payload: bytes.Repeat([]byte("x"), int(bound))})
			_, err := readThrough(append(append([]byte(nil), connect...), pub...), bound, mark, 1, 4096, 4096)
			if tooLarge := errors.Is(err, packets.ErrPacketTooLarge); tooLarge != (extra == 1) || (extra == 0 && err != nil) {
				t.Errorf("bound %d, topic of %d bytes: %v; want cut: %v", bound, len(topic), err, extra == 0)
			}
		}
	}
}
