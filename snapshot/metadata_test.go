package snapshot

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
	"reflect"
	"testing"
)

func sampleMetadata() *Metadata {
	return &Metadata{
		Job:            "rising-temperature",
		MaxParallelism: 128,
		Checkpoint:     42,
		Kind:           KindCheckpoint,
		Timestamp:      1714550400123,
		Operators: []Operator{
			{UID: "mqtt-source", Parallelism: 1, Subtasks: []Handle{
				{Sources: []byte{0x01, 0x02}},
			}},
			{UID: "window-avg", Parallelism: 2, Subtasks: []Handle{
				{File: "window-avg.0.state", Size: 4096, Checksum: 0xdeadbeef, KeyGroups: []byte("kg0-63")},
				{File: "window-avg.1.state", Size: 1, Checksum: 7, KeyGroups: []byte("kg64-127"), Pending: []byte("txn-9")},
			}, Settings: "aggregates 3f2a"},
		},
	}
}

// Metadata whose operators declare no settings is written as version 2,
// which the versions before read; with settings, as version 3.
func TestMetadataVersionBySettings(t *testing.T) {
	md := sampleMetadata()
	b, err := EncodeMetadata(md)
	if err != nil {
		t.Fatal(err)
	}
	if v := binary.LittleEndian.Uint16(b[len(metadataMagic):]); v != 3 {
		t.Fatalf("with settings: version %d", v)
	}
	md.Operators[1].Settings = ""
	if b, err = EncodeMetadata(md); err != nil {
		t.Fatal(err)
	}
	if v := binary.LittleEndian.Uint16(b[len(metadataMagic):]); v != 2 {
		t.Fatalf("without settings: version %d", v)
	}
	got, err := DecodeMetadata(b)
	if err != nil || got.Operators[1].Settings != "" || got.Operators[1].UID != "window-avg" {
		t.Fatalf("version 2: %+v, %v", got, err)
	}
}

func TestMetadataRoundTrip(t *testing.T) {
	for _, md := range []*Metadata{
		sampleMetadata(),
		{MaxParallelism: 1, Checkpoint: 1, Kind: KindSavepoint, Timestamp: -5},
		{MaxParallelism: 1, Checkpoint: 9, Kind: KindCheckpoint, Finished: true},
	} {
		b, err := EncodeMetadata(md)
		if err != nil {
			t.Fatal(err)
		}
		got, err := DecodeMetadata(b)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, md) {
			t.Fatalf("round trip:\n got %#v\nwant %#v", got, md)
		}
	}
}

// Metadata of version 1 (before the flags byte) still decodes, as not
// finished.
func TestDecodeMetadataVersion1(t *testing.T) {
	md := sampleMetadata()
	md.Operators[1].Settings = "" // version 1 has none
	md.Finished = true
	b, err := EncodeMetadata(md)
	if err != nil {
		t.Fatal(err)
	}
	body := b[headerLen : len(b)-5] // without the flags byte
	v1 := make([]byte, headerLen, headerLen+len(body)+4)
	copy(v1, metadataMagic)
	binary.LittleEndian.PutUint16(v1[len(metadataMagic):], 1)
	binary.LittleEndian.PutUint32(v1[len(metadataMagic)+2:], uint32(len(body)))
	v1 = append(v1, body...)
	v1 = binary.LittleEndian.AppendUint32(v1, crc32.Checksum(v1, castagnoli))
	got, err := DecodeMetadata(v1)
	if err != nil {
		t.Fatal(err)
	}
	md.Finished = false
	if !reflect.DeepEqual(got, md) {
		t.Fatalf("version 1:\n got %#v\nwant %#v", got, md)
	}
}

func TestDecodeMetadataErrors(t *testing.T) {
	md := sampleMetadata()
	md.Operators[1].Settings = "" // version 2: the flags byte ends the body
	good, err := EncodeMetadata(md)
	if err != nil {
		t.Fatal(err)
	}
	edit := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), good...)) }
	// reseal recomputes the length and checksum after a body edit.
	reseal := func(b []byte) []byte {
		b = b[:len(b)-4]
		binary.LittleEndian.PutUint32(b[len(metadataMagic)+2:], uint32(len(b)-headerLen))
		return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
	}
	for _, tc := range []struct {
		name string
		in   []byte
		want error
	}{
		{"empty", nil, ErrBadMagic},
		{"magic", edit(func(b []byte) []byte { b[0] = 'X'; return b }), ErrBadMagic},
		{"short header", good[:len(metadataMagic)+3], ErrCorrupt},
		{"version", edit(func(b []byte) []byte { b[len(metadataMagic)] = 4; return b }), ErrVersion},
		{"unknown flags", edit(func(b []byte) []byte {
			b[len(b)-5] = 0x80
			return reseal(b)
		}), ErrCorrupt},
		{"truncated", good[:len(good)-1], ErrCorrupt},
		{"trailing", append(append([]byte(nil), good...), 0), ErrCorrupt},
		{"flipped body bit", edit(func(b []byte) []byte { b[headerLen+3] ^= 1; return b }), ErrChecksum},
		{"flipped checksum", edit(func(b []byte) []byte { b[len(b)-1] ^= 1; return b }), ErrChecksum},
		{"body trailing byte", edit(func(b []byte) []byte {
			return reseal(append(b[:len(b)-4], 0, 0, 0, 0, 0))
		}), ErrCorrupt},
		{"bad kind", edit(func(b []byte) []byte {
			// job string (1+18), max parallelism (2), id (1), then kind.
			b[headerLen+1+18+2+1] = 9
			return reseal(b)
		}), ErrCorrupt},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeMetadata(tc.in)
			if !errors.Is(err, tc.want) {
				t.Fatalf("DecodeMetadata = %v, want %v", err, tc.want)
			}
		})
	}
}

func TestEncodeMetadataRefusesInvalid(t *testing.T) {
	for name, edit := range map[string]func(*Metadata){
		"unsorted":       func(m *Metadata) { m.Operators[0], m.Operators[1] = m.Operators[1], m.Operators[0] },
		"duplicate":      func(m *Metadata) { m.Operators[1].UID = m.Operators[0].UID },
		"empty uid":      func(m *Metadata) { m.Operators[0].UID = "" },
		"handles":        func(m *Metadata) { m.Operators[1].Subtasks = m.Operators[1].Subtasks[:1] },
		"parallelism":    func(m *Metadata) { m.MaxParallelism = 1 },
		"no key groups":  func(m *Metadata) { m.MaxParallelism = 0 },
		"kind":           func(m *Metadata) { m.Kind = 0 },
		"traversal":      func(m *Metadata) { m.Operators[1].Subtasks[0].File = "../../etc/passwd" },
		"dot dot":        func(m *Metadata) { m.Operators[1].Subtasks[0].File = ".." },
		"metadata file":  func(m *Metadata) { m.Operators[1].Subtasks[0].File = "_metadata" },
		"size, no file":  func(m *Metadata) { m.Operators[0].Subtasks[0].Size = 3 },
		"negative size":  func(m *Metadata) { m.Operators[1].Subtasks[0].Size = -1 },
		"windows path":   func(m *Metadata) { m.Operators[1].Subtasks[0].File = `a\b` },
		"checksum alone": func(m *Metadata) { m.Operators[0].Subtasks[0].Checksum = 1 },
	} {
		md := sampleMetadata()
		edit(md)
		if _, err := EncodeMetadata(md); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: EncodeMetadata = %v, want ErrCorrupt", name, err)
		}
	}
}

func TestMetadataLookup(t *testing.T) {
	md := sampleMetadata()
	o, ok := md.Operator("window-avg")
	if !ok || o.Parallelism != 2 {
		t.Fatalf("Operator(window-avg) = %v, %v", o, ok)
	}
	if _, ok := md.Operator("nope"); ok {
		t.Fatal("Operator(nope) found")
	}
	if got := md.Size(); got != 4097 {
		t.Fatalf("Size() = %d, want 4097", got)
	}
}

// FuzzDecodeMetadata checks that decoding never panics, and that whatever
// decodes encodes back to something that decodes to the same value.
func FuzzDecodeMetadata(f *testing.F) {
	good, err := EncodeMetadata(sampleMetadata())
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	small, _ := EncodeMetadata(&Metadata{MaxParallelism: 1, Checkpoint: 1, Kind: KindSavepoint})
	f.Add(small)
	f.Add([]byte(metadataMagic))
	f.Add(good[:len(good)/2])
	f.Fuzz(func(t *testing.T, b []byte) {
		md, err := DecodeMetadata(b)
		if err != nil {
			if md != nil {
				t.Fatal("metadata returned with an error")
			}
			return
		}
		again, err := EncodeMetadata(md)
		if err != nil {
			t.Fatalf("re-encode of decoded metadata: %v", err)
		}
		md2, err := DecodeMetadata(again)
		if err != nil {
			t.Fatalf("decode of re-encoded metadata: %v", err)
		}
		if !reflect.DeepEqual(md, md2) {
			t.Fatalf("round trip:\n got %#v\nwant %#v", md2, md)
		}
	})
}

// FuzzMetadataBodyRoundTrip builds metadata from fuzzed fields, so the
// fuzzer reaches deep into the body without forging checksums.
func FuzzMetadataBodyRoundTrip(f *testing.F) {
	f.Add("job", uint16(128), uint64(7), true, int64(1), "op", uint8(2), "f.state", int64(10), uint32(3), []byte("kg"), []byte{}, []byte("p"))
	f.Fuzz(func(t *testing.T, job string, maxPar uint16, id uint64, savepoint bool, ts int64,
		uid string, par uint8, file string, size int64, sum uint32, kg, src, pend []byte) {
		md := &Metadata{Job: job, MaxParallelism: int(maxPar), Checkpoint: ID(id), Kind: KindCheckpoint, Timestamp: ts}
		if savepoint {
			md.Kind = KindSavepoint
		}
		if uid != "" {
			o := Operator{UID: uid, Parallelism: int(par), Subtasks: make([]Handle, par)}
			for i := range o.Subtasks {
				o.Subtasks[i] = Handle{File: file, Size: size, Checksum: sum, KeyGroups: nilIfEmpty(kg), Sources: nilIfEmpty(src), Pending: nilIfEmpty(pend)}
			}
			md.Operators = []Operator{o}
		}
		b, err := EncodeMetadata(md)
		if err != nil {
			if md.Validate() == nil {
				t.Fatalf("valid metadata did not encode: %v", err)
			}
			return
		}
		got, err := DecodeMetadata(b)
		if err != nil {
			t.Fatalf("decode: %v", err)
		}
		if !reflect.DeepEqual(got, md) {
			t.Fatalf("round trip:\n got %#v\nwant %#v", got, md)
		}
	})
}

func nilIfEmpty(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	return b
}

// seal wraps a body in a valid header and checksum, so that tests and the
// fuzzer reach the body decoder.
func seal(body []byte) []byte {
	b := make([]byte, headerLen, headerLen+len(body)+4)
	copy(b, metadataMagic)
	binary.LittleEndian.PutUint16(b[len(metadataMagic):], metadataVersion)
	binary.LittleEndian.PutUint32(b[len(metadataMagic)+2:], uint32(len(body)))
	b = append(b, body...)
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

func TestDecodeMetadataRefusesEveryTruncatedBody(t *testing.T) {
	good, err := EncodeMetadata(sampleMetadata())
	if err != nil {
		t.Fatal(err)
	}
	body := good[headerLen : len(good)-4]
	if _, err := DecodeMetadata(seal(body)); err != nil {
		t.Fatalf("seal(body): %v", err)
	}
	for n := range len(body) {
		if _, err := DecodeMetadata(seal(body[:n])); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("body cut at %d of %d: %v, want ErrCorrupt", n, len(body), err)
		}
	}
	// Counts larger than the input are refused before allocating.
	huge := binary.AppendUvarint(nil, 0)      // job ""
	huge = binary.AppendUvarint(huge, 128)    // max parallelism
	huge = binary.AppendUvarint(huge, 1)      // id
	huge = append(huge, byte(KindCheckpoint)) // kind
	huge = binary.AppendVarint(huge, 0)       // timestamp
	huge = binary.AppendUvarint(huge, 1<<40)  // operators
	if _, err := DecodeMetadata(seal(huge)); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("huge operator count: %v", err)
	}
}

// FuzzDecodeMetadataBody decodes fuzzed bodies under a valid header and
// checksum: no panic, and what decodes round-trips.
func FuzzDecodeMetadataBody(f *testing.F) {
	good, err := EncodeMetadata(sampleMetadata())
	if err != nil {
		f.Fatal(err)
	}
	body := good[headerLen : len(good)-4]
	f.Add(body)
	f.Add(body[:len(body)/2])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, body []byte) {
		md, err := DecodeMetadata(seal(body))
		if err != nil {
			return
		}
		again, err := EncodeMetadata(md)
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		md2, err := DecodeMetadata(again)
		if err != nil || !reflect.DeepEqual(md, md2) {
			t.Fatalf("round trip: %v\n got %#v\nwant %#v", err, md2, md)
		}
	})
}
