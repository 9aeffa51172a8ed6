package ingestlog

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"strings"
	"testing"
	"testing/iotest"
	"time"
)

func TestFrameRoundTrip(t *testing.T) {
	msgs := []Message{
		{},
		{Topic: "a", Payload: []byte{}},
		{Topic: "sensors/1/temp", Payload: []byte(`{"t":21.5}`), QoS: 1},
		{Topic: "x", Payload: []byte("y"), QoS: 2, Retain: true, Received: time.Unix(1_700_000_000, 123)},
		{Topic: strings.Repeat("t", maxTopicBytes), Payload: bytes.Repeat([]byte{0xab}, 100_000)},
		{Topic: "before 1970", Received: time.Unix(-5, 7)},
		{Topic: "sensors/1", Payload: []byte("ON"), QoS: 1, PacketID: 1},
		{Topic: "sensors/1", Payload: []byte("ON"), QoS: 2, PacketID: 65535},
		{Topic: "big", Payload: []byte("{\"v\":"), QoS: 1, PacketID: 7, TooLarge: 300 << 20},
		{Topic: "big", TooLarge: 1},
		{Topic: "sensors/1", Payload: []byte("ON"), QoS: 1, PacketID: 9, Note: true},
		{Topic: "big", Payload: []byte("{"), QoS: 1, PacketID: 8, TooLarge: 9, Note: true},
	}
	for i, m := range msgs {
		frame := appendFrame(nil, &m)
		if int64(len(frame)) != frameSize(&m) {
			t.Errorf("msg %d: frame of %d bytes, frameSize says %d", i, len(frame), frameSize(&m))
		}
		got, n, err := decodeFrame(append(frame, 1, 2, 3))
		if err != nil {
			t.Fatalf("msg %d: decode: %v", i, err)
		}
		if n != int64(len(frame)) {
			t.Errorf("msg %d: decoded %d bytes of %d", i, n, len(frame))
		}
		if !sameMessage(got, m) {
			t.Errorf("msg %d: decoded %+v, want %+v", i, got, m)
		}
		if got.Payload == nil {
			t.Errorf("msg %d: nil payload", i)
		}
		if got.PacketID != m.PacketID || got.TooLarge != m.TooLarge || got.Note != m.Note {
			t.Errorf("msg %d: packet id %d, too large %d, note %v, want %d, %d, %v", i, got.PacketID, got.TooLarge, got.Note, m.PacketID, m.TooLarge, m.Note)
		}
		// The same record with a commit mark.
		for _, d := range []uint64{0, 1, 1 << 40} {
			marked := addMark(appendFrame(nil, &m), d)
			if int64(len(marked)) != frameSize(&m)+markSize(d) {
				t.Errorf("msg %d: marked frame of %d bytes", i, len(marked))
			}
			p, n, err := parseFrame(marked)
			if err != nil || n != int64(len(marked)) || !p.hasMark() || p.mark != d {
				t.Fatalf("msg %d mark %d: parse = %+v, %d, %v", i, d, p, n, err)
			}
			if got := p.message(string(p.topic)); !sameMessage(got, m) || got.PacketID != m.PacketID || got.Note != m.Note {
				t.Errorf("msg %d: decoded %+v with a mark", i, got)
			}
		}
	}
}

// rawFrame frames body with a correct length and checksum.
func rawFrame(body []byte) []byte {
	b := binary.LittleEndian.AppendUint32(nil, uint32(len(body)))
	b = binary.LittleEndian.AppendUint32(b, crc32.Checksum(body, castagnoli))
	return append(b, body...)
}

func TestDecodeFrameRejects(t *testing.T) {
	good := appendFrame(nil, &Message{Topic: "t", Payload: []byte("p"), QoS: 1})
	badCRC := bytes.Clone(good)
	badCRC[len(badCRC)-1] ^= 1
	tests := []struct {
		name  string
		frame []byte
		want  error
	}{
		{"empty", nil, errShortFrame},
		{"partial header", good[:5], errShortFrame},
		{"partial body", good[:len(good)-1], errShortFrame},
		{"zero length", make([]byte, 12), ErrRecordLength},
		{"huge length", []byte{0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0}, ErrRecordLength},
		{"checksum", badCRC, ErrChecksum},
		{"qos 3", rawFrame([]byte{3, 0, 0, 0}), ErrRecordBody},
		{"unknown flag", rawFrame([]byte{0x80, 0, 0, 0}), ErrRecordBody},
		{"note without a packet id", rawFrame([]byte{0x40, 0, 0, 0}), ErrRecordBody},
		{"too-large size 0", rawFrame([]byte{0x20, 0, 0, 0, 0}), ErrRecordBody},
		{"too-large size below the payload kept", rawFrame([]byte{0x20, 0, 1, 0, 2, 'a', 'b'}), ErrRecordBody},
		{"non-minimal too-large size", rawFrame([]byte{0x20, 0, 0x81, 0x00, 0, 0}), ErrRecordBody},
		{"packet id 0", rawFrame([]byte{0x08, 0, 0, 0, 0}), ErrRecordBody},
		{"packet id too large", rawFrame([]byte{0x08, 0, 0x80, 0x80, 0x04, 0, 0}), ErrRecordBody},
		{"non-minimal packet id", rawFrame([]byte{0x08, 0, 0x81, 0x00, 0, 0}), ErrRecordBody},
		{"missing commit mark", rawFrame([]byte{0x10, 0, 0, 0}), ErrRecordBody},
		{"non-minimal commit mark", rawFrame([]byte{0x10, 0, 0, 0, 0x80, 0x00}), ErrRecordBody},
		{"non-minimal time", rawFrame([]byte{0, 0x80, 0x00, 0, 0}), ErrRecordBody},
		{"non-minimal topic length", rawFrame([]byte{0, 0, 0x81, 0x00, 'a', 0}), ErrRecordBody},
		{"topic past end", rawFrame([]byte{0, 0, 5, 'a', 0}), ErrRecordBody},
		{"payload past end", rawFrame([]byte{0, 0, 0, 3, 'a'}), ErrRecordBody},
		{"trailing bytes", rawFrame([]byte{0, 0, 0, 0, 9}), ErrRecordBody},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := decodeFrame(tt.frame)
			if !errors.Is(err, tt.want) {
				t.Fatalf("decodeFrame = %v, want %v", err, tt.want)
			}
		})
	}
}

func TestMessageValidate(t *testing.T) {
	for _, m := range []Message{
		{QoS: 3},
		{Topic: strings.Repeat("t", maxTopicBytes+1)},
		{Topic: "t", TooLarge: -1},
		{Topic: "t", Payload: []byte("abc"), TooLarge: 2},
		{Topic: "t", QoS: 1, Note: true},
	} {
		if err := m.validate(); !errors.Is(err, ErrInvalidMessage) {
			t.Errorf("validate(%.20q, qos %d) = %v, want ErrInvalidMessage", m.Topic, m.QoS, err)
		}
	}
}

func TestHeader(t *testing.T) {
	h := encodeHeader(1234)
	if base, err := decodeHeader(h); err != nil || base != 1234 {
		t.Fatalf("decodeHeader = %d, %v", base, err)
	}
	mutate := func(f func(b []byte)) []byte {
		b := bytes.Clone(h)
		f(b)
		return b
	}
	reseal := func(b []byte) { binary.LittleEndian.PutUint32(b[20:], crc32.Checksum(b[:20], castagnoli)) }
	tests := []struct {
		name string
		b    []byte
		want error
	}{
		{"short", h[:10], ErrBadMagic},
		{"magic", mutate(func(b []byte) { b[0] = 'X' }), ErrBadMagic},
		{"version", mutate(func(b []byte) { b[8] = 2; reseal(b) }), ErrVersion},
		{"checksum", mutate(func(b []byte) { b[12] ^= 1 }), ErrChecksum},
		{"reserved", mutate(func(b []byte) { b[10] = 1; reseal(b) }), ErrCorrupt},
	}
	for _, tt := range tests {
		if _, err := decodeHeader(tt.b); !errors.Is(err, tt.want) {
			t.Errorf("%s: decodeHeader = %v, want %v", tt.name, err, tt.want)
		}
	}
}

func TestSegmentName(t *testing.T) {
	for _, base := range []uint64{0, 1, 1234, 1<<64 - 1} {
		got, ok := parseSegmentName(segmentName(base))
		if !ok || got != base {
			t.Errorf("parseSegmentName(%q) = %d, %v", segmentName(base), got, ok)
		}
	}
	for _, name := range []string{"", "LOCK", "0000000000000000001.seg", "0000000000000000000a.seg",
		"00000000000000000001.sex", "99999999999999999999.seg"} {
		if _, ok := parseSegmentName(name); ok {
			t.Errorf("parseSegmentName(%q) accepted", name)
		}
	}
}

func FuzzDecodeRecord(f *testing.F) {
	f.Add([]byte{})
	f.Add(appendFrame(nil, &Message{}))
	f.Add(appendFrame(nil, &Message{Topic: "sensors/1", Payload: []byte(`{"v":1}`), QoS: 1, Retain: true,
		Received: time.Unix(1_700_000_000, 5)}))
	f.Add(rawFrame([]byte{0, 0x80, 0x00, 0, 0}))
	f.Add(rawFrame([]byte{0, 0, 5, 'a', 0}))
	f.Add(addMark(appendFrame(nil, &Message{Topic: "t", Payload: []byte("ON"), QoS: 1, PacketID: 300}), 1234))
	f.Add(appendFrame(nil, &Message{Topic: "t", Payload: []byte("{"), QoS: 1, PacketID: 9, TooLarge: 1 << 30}))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, n, err := parseFrame(data)
		if err != nil {
			return
		}
		if n < frameHeaderSize+minBodySize || n > int64(len(data)) {
			t.Fatalf("decoded %d bytes of %d", n, len(data))
		}
		// Decode(Encode(x)) == x, and the encoding is the only one.
		m := p.message(string(p.topic))
		again := appendFrame(nil, &m)
		if p.hasMark() {
			again = addMark(again, p.mark)
		}
		if !bytes.Equal(again, data[:n]) {
			t.Fatalf("re-encoded %x, decoded from %x", again, data[:n])
		}
	})
}

// FuzzScanSegment feeds arbitrary bytes to recovery, in both roles: as the
// last segment (torn tails allowed) and as an earlier one.
func FuzzScanSegment(f *testing.F) {
	seg := encodeHeader(7)
	for i := range 3 {
		m := msg(i)
		seg = appendFrame(seg, &m)
	}
	f.Add(seg, true)
	f.Add(seg[:len(seg)-3], true)
	f.Add(seg[:30], false)
	f.Add(append(bytes.Clone(seg), make([]byte, 40)...), true)
	f.Add(make([]byte, 24), true)
	f.Fuzz(func(t *testing.T, data []byte, last bool) {
		res, err := scanSegment(bytes.NewReader(data), int64(len(data)), "fuzz.seg", 7, last)
		// Short reads, as from a file read in pieces, change nothing.
		res2, err2 := scanSegment(iotest.HalfReader(bytes.NewReader(data)), int64(len(data)), "fuzz.seg", 7, last)
		if (err == nil) != (err2 == nil) || res.size != res2.size || res.records != res2.records ||
			res.tornHeader != res2.tornHeader || (res.torn == nil) != (res2.torn == nil) {
			t.Fatalf("scan differs with short reads: %+v %v / %+v %v", res, err, res2, err2)
		}
		if err != nil {
			return
		}
		if res.tornHeader {
			if !last {
				t.Fatal("torn header in a segment that is not the last")
			}
			return
		}
		if res.size < headerSize || res.size > int64(len(data)) {
			t.Fatalf("valid size %d of %d bytes", res.size, len(data))
		}
		if !last && (res.torn != nil || res.size != int64(len(data))) {
			t.Fatalf("earlier segment accepted with a torn tail: %v", res.torn)
		}
		// The valid prefix decodes as exactly res.records records.
		var count uint64
		for pos := int64(headerSize); pos < res.size; count++ {
			_, n, err := decodeFrame(data[pos:res.size])
			if err != nil {
				t.Fatalf("valid prefix fails at byte %d: %v", pos, err)
			}
			pos += n
		}
		if count != res.records {
			t.Fatalf("scan counted %d records, prefix holds %d", res.records, count)
		}
	})
}
